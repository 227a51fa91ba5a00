//! The kernel expressions rules are made of, with nft's register numbering. The values
//! are pure Rust; `ffi.rs` copies them into libnftnl expressions.

/// One kernel expression, with nft's register numbers already translated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Meta {
        key: u32,
        dreg: u32,
    },
    MetaSet {
        key: u32,
        sreg: u32,
    },
    Payload {
        base: u32,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    /// Payload write; `csum` = (type, offset) for the IPv4 header checksum.
    PayloadSet {
        base: u32,
        offset: u32,
        len: u32,
        sreg: u32,
        csum: Option<(u32, u32)>,
    },
    Ct {
        key: u32,
        dreg: u32,
    },
    Fib {
        flags: u32,
        result: u32,
        dreg: u32,
    },
    Numgen {
        modulus: u32,
        dreg: u32,
    },
    /// An IPv6 extension header load (op ipv6, no flags): `len` bytes at `offset` of the
    /// header numbered `kind`.
    Exthdr {
        kind: u8,
        offset: u32,
        len: u32,
        dreg: u32,
    },
    Cmp {
        op: u32,
        sreg: u32,
        data: Vec<u8>,
    },
    /// `with_op`: nft sets `NFTA_BITWISE_OP` (boolean) explicitly for payload statements.
    Bitwise {
        reg: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
        with_op: bool,
    },
    /// `byteorder reg = hton(reg, size, len)`.
    Hton {
        reg: u32,
        len: u32,
    },
    Lookup {
        sreg: u32,
        dreg: Option<u32>,
        set: String,
        set_id: Option<u32>,
        invert: bool,
    },
    DynsetUpdate {
        sreg: u32,
        set: String,
        set_id: Option<u32>,
        /// The element's own timeout (`NFTA_DYNSET_TIMEOUT`), if not the set's.
        timeout_ms: Option<u64>,
    },
    /// `dynset update` with a `limit` expression per element: `rate` packets per `unit`
    /// seconds, `burst` packets, `NFT_LIMIT_F_INV` in `flags` for `over`.
    DynsetLimit {
        sreg: u32,
        set: String,
        set_id: Option<u32>,
        rate: u64,
        unit: u64,
        burst: u32,
        flags: u32,
    },
    Immediate {
        dreg: u32,
        data: Vec<u8>,
    },
    Verdict {
        code: i32,
        chain: Option<String>,
    },
    Counter,
    Log {
        prefix: String,
        /// NFLOG group; `None`: the kernel log.
        group: Option<u16>,
    },
    Nat {
        kind: u32,
        family: u32,
        reg_addr: u32,
        reg_proto: Option<u32>,
        /// `NF_NAT_RANGE_*` flags sent explicitly (nft sends PROTO_SPECIFIED for a fixed
        /// port only; the kernel infers it from the proto register anyway).
        flags: u32,
    },
    /// `NF_NAT_RANGE_*` flags (`fully-random`), none when 0.
    Masq {
        flags: u32,
    },
    /// `tproxy` to a port only (the address is the packet's destination).
    Tproxy {
        family: u32,
        reg_port: u32,
    },
    Reject {
        kind: u32,
        code: u8,
    },
}

impl Expr {
    /// The kernel's name of the expression (`nft --debug=netlink` shows it too).
    pub fn name(&self) -> &'static str {
        match self {
            Expr::Meta { .. } | Expr::MetaSet { .. } => "meta",
            Expr::Payload { .. } | Expr::PayloadSet { .. } => "payload",
            Expr::Ct { .. } => "ct",
            Expr::Fib { .. } => "fib",
            Expr::Numgen { .. } => "numgen",
            Expr::Exthdr { .. } => "exthdr",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Hton { .. } => "byteorder",
            Expr::Lookup { .. } => "lookup",
            Expr::DynsetUpdate { .. } | Expr::DynsetLimit { .. } => "dynset",
            Expr::Immediate { .. } | Expr::Verdict { .. } => "immediate",
            Expr::Counter => "counter",
            Expr::Log { .. } => "log",
            Expr::Nat { .. } => "nat",
            Expr::Masq { .. } => "masq",
            Expr::Tproxy { .. } => "tproxy",
            Expr::Reject { .. } => "reject",
        }
    }
}

impl Expr {
    /// The expression with what the kernel does not keep or adds on its own normalised
    /// away, for comparing a read-back rule with a lowered one: set ids (the kernel keeps
    /// the name), the bitwise op (dumped always, sent only where nft sends it) and the NAT
    /// range flags the kernel derives from the registers.
    pub fn canonical(mut self) -> Expr {
        match &mut self {
            Expr::Lookup { set_id, .. }
            | Expr::DynsetUpdate { set_id, .. }
            | Expr::DynsetLimit { set_id, .. } => *set_id = None,
            Expr::Bitwise { with_op, .. } => *with_op = false,
            Expr::Nat { flags, .. } => {
                *flags &= !(NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED)
            }
            _ => {}
        }
        self
    }

    /// [`Expr::canonical`] without the looked-up set's name (an anonymous set's name is
    /// the kernel's choice).
    pub fn canonical_without_set(self) -> Expr {
        let mut e = self.canonical();
        if let Expr::Lookup { set, .. } = &mut e {
            *set = String::new();
        }
        e
    }
}

uapi!(pub u32:
    /// A limit counted in packets.
    NFT_LIMIT_PKTS,
    /// `limit rate over` (match beyond the rate).
    NFT_LIMIT_F_INV,
    NFT_CMP_EQ,
    NFT_CMP_NEQ,
    NFT_CMP_LTE,
    NFT_CMP_GTE,
    NFT_REG_VERDICT,
    NFT_REG_1,
    NFT_PAYLOAD_CSUM_INET,
    NFT_NAT_SNAT,
    NFT_NAT_DNAT,
    NFT_REJECT_ICMP_UNREACH,
    NFT_REJECT_TCP_RST,
    NFT_REJECT_ICMPX_UNREACH,
);
uapi!(u32: NFT_REG32_00);
uapi!(pub u8: NFT_REJECT_ICMPX_PORT_UNREACH, NFT_REJECT_ICMPX_ADMIN_PROHIBITED);
pub const NF_NAT_RANGE_MAP_IPS: u32 = 1;
pub const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
pub const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 16;
pub const ICMP_PORT_UNREACH: u8 = 3;
pub const ICMPV6_PORT_UNREACH: u8 = 4;

/// nft numbers registers in 32-bit slots from `NFT_REG_1`; the kernel gets the legacy
/// 128-bit number when a slot starts one (`netlink_put_register`).
pub fn kernel_reg(slot: u32) -> u32 {
    let r = slot - NFT_REG_1;
    if r.is_multiple_of(4) {
        NFT_REG_1 + r / 4
    } else {
        NFT_REG32_00 + r
    }
}
