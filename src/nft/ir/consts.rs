//! Protocol and flag constants the planners match on: IP protocol numbers, TCP header flag
//! bits and conntrack state bits.

/// IP protocol numbers (`meta l4proto`).
pub mod proto {
    pub const ICMP: u8 = libc::IPPROTO_ICMP as u8;
    pub const TCP: u8 = libc::IPPROTO_TCP as u8;
    pub const UDP: u8 = libc::IPPROTO_UDP as u8;
    pub const ICMPV6: u8 = libc::IPPROTO_ICMPV6 as u8;
    pub const SCTP: u8 = libc::IPPROTO_SCTP as u8;
}

/// TCP header flag bits.
pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
    pub const ECN: u8 = 0x40;
    pub const CWR: u8 = 0x80;
}

/// `ct state` bits (kernel NF_CT_STATE_*).
pub mod ct_state {
    pub const INVALID: u32 = 1;
    pub const ESTABLISHED: u32 = 2;
    pub const RELATED: u32 = 4;
    pub const NEW: u32 = 8;
    pub const UNTRACKED: u32 = 64;
}
