//! IR -> nft text (`nft -f` syntax). This is the `--dry-run` output and the text the
//! benchmarks feed to `nft -f`; it must compile to the bytecode `nftnl.rs` emits.

use super::ir::*;
use super::transaction::{Op, Transaction};
use std::fmt::Write;

/// Text that atomically replaces the whole table: what a full sync does.
pub fn render_full(table: &Table) -> String {
    let mut out = String::new();
    let t = (table.family.keyword(), &table.name);
    let _ = writeln!(out, "table {} {}", t.0, t.1);
    let _ = writeln!(out, "delete table {} {}", t.0, t.1);
    out.push_str(&render_table(table));
    out
}

/// The table as one block, the way `nft list table` shows it.
pub fn render_table(table: &Table) -> String {
    if !table.parts.is_empty() {
        return render_table(&table.flatten());
    }
    let mut out = String::new();
    let _ = writeln!(out, "table {} {} {{", table.family.keyword(), table.name);
    for set in table.sets.values() {
        render_set_block(&mut out, set);
    }
    for chain in table.chains.values() {
        let _ = writeln!(out, "\tchain {} {{", chain.name);
        if let Some(base) = &chain.base {
            let _ = writeln!(out, "\t\t{}", base_chain(base));
        }
        for rule in &chain.rules {
            let _ = writeln!(out, "\t\t{}", rule_text(rule));
        }
        out.push_str("\t}\n");
    }
    out.push_str("}\n");
    out
}

/// A transaction as `nft -f` commands, one per line (elements batched per set).
pub fn render_transaction(tx: &Transaction) -> String {
    // `<family> <name>`: every command names the table this way.
    let t = &format!("{} {}", tx.family.keyword(), tx.table);
    let mut out = String::new();
    for op in &tx.ops {
        let _ = match op {
            Op::AddTable => writeln!(out, "add table {t}"),
            Op::AddOwnedTable => writeln!(out, "add table {t} {{ flags owner; }}"),
            Op::DeleteTable => writeln!(out, "delete table {t}"),
            Op::AddChain { name, base } => match base {
                Some(b) => writeln!(out, "add chain {t} {name} {{ {} }}", base_chain(b)),
                None => writeln!(out, "add chain {t} {name}"),
            },
            Op::FlushChain(name) => writeln!(out, "flush chain {t} {name}"),
            Op::DeleteChain(name) => writeln!(out, "delete chain {t} {name}"),
            Op::AddRule { chain, rule } => {
                writeln!(out, "add rule {t} {chain} {}", rule_text(rule))
            }
            Op::AddSet(set) | Op::AddSetWithParts { set, .. } => {
                let kw = set_keyword(set);
                let _ = write!(out, "add {kw} {t} {} {{ ", set.name);
                out.push_str(&set_declaration(set, "; "));
                writeln!(out, "}}").and_then(|_| element_command(&mut out, "add", t, op))
            }
            Op::DeleteSet(name) => writeln!(out, "delete set {t} {name}"),
            Op::FlushSet(set) => {
                let kind = if matches!(set.kind, SetKind::Set) {
                    "set"
                } else {
                    "map"
                };
                writeln!(out, "flush {kind} {t} {}", set.name)
            }
            Op::AddElements(_) => element_command(&mut out, "add", t, op),
            Op::DeleteElements(_) => element_command(&mut out, "delete", t, op),
        };
    }
    out
}

/// `add|delete element` with every element `op` writes (see [`Op::elements`]).
fn element_command(out: &mut String, verb: &str, table: &str, op: &Op) -> std::fmt::Result {
    let Some(set) = op.set() else {
        return Ok(());
    };
    let mut elements = op.elements().peekable();
    if elements.peek().is_none() {
        return Ok(());
    }
    write!(out, "{verb} element {table} {} {{ ", set.name)?;
    let deleting = verb == "delete";
    for (i, (key, value)) in elements.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        if deleting {
            out.push_str(&elem_key(key));
        } else {
            out.push_str(&element(key, value));
        }
    }
    writeln!(out, " }}")
}

fn set_keyword(set: &Set) -> &'static str {
    match set.kind {
        SetKind::Set => "set",
        SetKind::Map(_) | SetKind::VerdictMap => "map",
    }
}

fn render_set_block(out: &mut String, set: &Set) {
    let _ = writeln!(out, "\t{} {} {{", set_keyword(set), set.name);
    out.push_str("\t\t");
    out.push_str(&set_declaration(set, "\n\t\t"));
    if !set.elements.is_empty() {
        out.push_str("elements = {\n");
        let last = set.elements.len() - 1;
        for (i, (key, value)) in set.elements.iter().enumerate() {
            let sep = if i == last { "" } else { "," };
            let _ = writeln!(out, "\t\t\t{}{sep}", element(key, value));
        }
        out.push_str("\t\t}\n");
    } else {
        // Trim the trailing indentation left by the declaration separator.
        while out.ends_with('\t') {
            out.pop();
        }
    }
    out.push_str("\t}\n");
}

/// `type ...; flags ...; timeout ...;` with a caller-chosen separator after each part.
fn set_declaration(set: &Set, sep: &str) -> String {
    let mut s = match &set.typeof_decl {
        Some(t) if t.data.is_empty() => format!("typeof {}", fields(&t.key)),
        Some(t) => format!("typeof {} : {}", fields(&t.key), fields(&t.data)),
        None => format!("type {}", concat_types(&set.key)),
    };
    match (&set.kind, &set.typeof_decl) {
        (_, Some(_)) | (SetKind::Set, None) => {}
        (SetKind::Map(data), None) => {
            let _ = write!(s, " : {}", concat_types(data));
        }
        (SetKind::VerdictMap, None) => s.push_str(" : verdict"),
    }
    s.push_str(sep);
    let mut flags = Vec::new();
    if set.flags.interval {
        flags.push("interval");
    }
    if set.flags.timeout {
        flags.push("timeout");
    }
    if set.flags.dynamic {
        flags.push("dynamic");
    }
    if !flags.is_empty() {
        let _ = write!(s, "flags {}{sep}", flags.join(","));
    }
    if let Some(t) = set.timeout {
        let _ = write!(s, "timeout {t}s{sep}");
    }
    if let Some(n) = set.size {
        let _ = write!(s, "size {n}{sep}");
    }
    if set.flags.counter {
        let _ = write!(s, "counter{sep}");
    }
    s
}

fn concat_types(types: &[DataType]) -> String {
    types
        .iter()
        .map(|t| data_type_name(*t))
        .collect::<Vec<_>>()
        .join(" . ")
}

pub fn data_type_name(t: DataType) -> &'static str {
    match t {
        DataType::Ipv4Addr => "ipv4_addr",
        DataType::Ipv6Addr => "ipv6_addr",
        DataType::InetProto => "inet_proto",
        DataType::InetService => "inet_service",
        DataType::Mark => "mark",
        DataType::IfName => "ifname",
        DataType::NfProto => "nf_proto",
        DataType::EtherType => "ether_type",
        DataType::CtState => "ct_state",
        DataType::CtDir => "ct_dir",
        DataType::AddrType => "fib_addrtype",
        DataType::Boolean => "boolean",
        DataType::TcpFlag => "tcp_flag",
        DataType::Integer => "integer",
        DataType::Verdict => "verdict",
    }
}

fn element(key: &ElemKey, value: &ElemValue) -> String {
    let mut s = elem_key(key);
    if let Some(t) = value.timeout {
        let _ = write!(s, " timeout {t}s");
    }
    if let Some(c) = &value.comment {
        let _ = write!(s, " comment {}", quoted(c));
    }
    match &value.data {
        None => {}
        Some(ElemData::Verdict(v)) => {
            let _ = write!(s, " : {}", verdict(v));
        }
        Some(ElemData::Values(vals)) => {
            let _ = write!(s, " : {}", values(vals));
        }
    }
    s
}

/// An element key as nft prints it (`172.30.0.10 . tcp . 80`), for messages.
pub fn elem_key_text(key: &ElemKey) -> String {
    elem_key(key)
}

fn elem_key(key: &ElemKey) -> String {
    key.iter().map(key_part).collect::<Vec<_>>().join(" . ")
}

fn key_part(part: &KeyPart) -> String {
    match part {
        KeyPart::Value(v) => value(v),
        KeyPart::Prefix(net) => net.to_string(),
        KeyPart::Range(a, b) => format!("{}-{}", value(a), value(b)),
    }
}

fn base_chain(b: &BaseChain) -> String {
    let kind = match b.kind {
        ChainType::Filter => "filter",
        ChainType::Nat => "nat",
        ChainType::Route => "route",
    };
    let hook = b.hook.keyword();
    let policy = match b.policy {
        Policy::Accept => "accept",
        Policy::Drop => "drop",
    };
    format!(
        "type {kind} hook {hook} priority {}; policy {policy};",
        b.priority
    )
}

pub fn rule_text(rule: &Rule) -> String {
    let mut parts: Vec<String> = rule.stmts.iter().map(stmt).collect();
    if let Some(c) = &rule.comment {
        parts.push(format!("comment {}", quoted(c)));
    }
    parts.join(" ")
}

fn stmt(s: &Stmt) -> String {
    match s {
        Stmt::Match(m) => match_text(m),
        Stmt::Counter => "counter".into(),
        Stmt::Log { prefix, group } => match group {
            Some(g) => format!("log prefix {} group {g}", quoted(prefix)),
            None => format!("log prefix {}", quoted(prefix)),
        },
        Stmt::Vmap { key, map } => format!("{} vmap {}", fields(key), map_ref(map)),
        Stmt::Nat(nat) => nat_text(nat),
        Stmt::Masquerade { fully_random } => if *fully_random {
            "masquerade fully-random"
        } else {
            "masquerade"
        }
        .into(),
        Stmt::DscpSet { family, dscp } => format!("{} dscp set {dscp}", family_kw(*family)),
        Stmt::MarkSet(m) => format!("meta mark set {m:#010x}"),
        Stmt::Tproxy { family, port } => match family {
            IpFamily::V4 => format!("tproxy ip to :{port}"),
            IpFamily::V6 => format!("tproxy ip6 to :{port}"),
        },
        Stmt::MarkOr(m) => format!("meta mark set meta mark or {m:#010x}"),
        Stmt::Trace => "meta nftrace set 1".into(),
        Stmt::MarkAnd(m) => format!("meta mark set meta mark and {m:#010x}"),
        Stmt::SetUpdate {
            set,
            key,
            timeout: None,
        } => format!("update @{set} {{ {} }}", fields(key)),
        Stmt::SetUpdate {
            set,
            key,
            timeout: Some(t),
        } => format!("update @{set} {{ {} timeout {t}s }}", fields(key)),
        Stmt::SetLimit { set, key, limit } => format!(
            "update @{set} {{ {} limit rate over {}/second burst {} packets }}",
            fields(key),
            limit.per_second,
            limit.burst
        ),
        Stmt::Reject(r) => match r {
            Reject::PortUnreachable => "reject".into(),
            Reject::TcpReset => "reject with tcp reset".into(),
            Reject::AdminProhibited => "reject with icmpx admin-prohibited".into(),
        },
        Stmt::Verdict(v) => verdict(v),
    }
}

fn match_text(m: &Match) -> String {
    let key = fields(&m.key);
    match &m.op {
        MatchOp::Eq(v) => format!("{key} {}", values(v)),
        MatchOp::Ne(v) => format!("{key} != {}", values(v)),
        MatchOp::InSet(s) => format!("{key} @{s}"),
        MatchOp::NotInSet(s) => format!("{key} != @{s}"),
        MatchOp::InAnon(elems) => {
            let items: Vec<String> = elems.iter().map(elem_key).collect();
            format!("{key} {{ {} }}", items.join(", "))
        }
        MatchOp::AnyFlag(bits) if m.key == [Field::CtState] => {
            format!("{key} {}", ct_state_names(*bits))
        }
        MatchOp::AnyFlag(bits) => format!("{key} & {bits:#010x} != 0"),
        MatchOp::Masked { mask, value: v, eq } => {
            let op = if *eq { "==" } else { "!=" };
            format!("{key} & {} {op} {}", value(mask), value(v))
        }
    }
}

/// `syn`, or `(syn | ack)` for several flags.
fn tcp_flag_names(bits: u8) -> String {
    use crate::nft::ir::tcp_flags::*;
    const NAMES: [(u8, &str); 8] = [
        (FIN, "fin"),
        (SYN, "syn"),
        (RST, "rst"),
        (PSH, "psh"),
        (ACK, "ack"),
        (URG, "urg"),
        (ECN, "ecn"),
        (CWR, "cwr"),
    ];
    let names: Vec<&str> = NAMES
        .iter()
        .filter(|(bit, _)| bits & bit != 0)
        .map(|(_, name)| *name)
        .collect();
    match names.as_slice() {
        [] => "0x0".into(),
        [one] => (*one).into(),
        many => format!("({})", many.join(" | ")),
    }
}

fn ct_state_names(bits: u32) -> String {
    const NAMES: [(u32, &str); 5] = [
        (ct_state::INVALID, "invalid"),
        (ct_state::ESTABLISHED, "established"),
        (ct_state::RELATED, "related"),
        (ct_state::NEW, "new"),
        (ct_state::UNTRACKED, "untracked"),
    ];
    NAMES
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(",")
}

fn nat_text(nat: &Nat) -> String {
    let kind = match nat.kind {
        NatKind::Snat => "snat",
        NatKind::Dnat => "dnat",
    };
    let fam = family_kw(nat.family);
    match &nat.addr {
        NatAddr::Fixed(addr, None) => format!("{kind} {fam} to {addr}"),
        NatAddr::Fixed(std::net::IpAddr::V4(a), Some(p)) => format!("{kind} {fam} to {a}:{p}"),
        NatAddr::Fixed(std::net::IpAddr::V6(a), Some(p)) => {
            format!("{kind} {fam} to [{a}]:{p}")
        }
        NatAddr::Map { key, map } => format!("{kind} {fam} to {} map @{map}", fields(key)),
    }
}

fn family_kw(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

fn map_ref(m: &MapRef) -> String {
    match m {
        MapRef::Named(n) => format!("@{n}"),
        MapRef::Anon(entries) => {
            let items: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{} : {}", elem_key(k), verdict(v)))
                .collect();
            format!("{{ {} }}", items.join(", "))
        }
    }
}

fn fields(key: &[Field]) -> String {
    key.iter()
        .map(|f| field(*f))
        .collect::<Vec<_>>()
        .join(" . ")
}

pub fn field(f: Field) -> String {
    match f {
        Field::NfProto => "meta nfproto".into(),
        Field::EtherType => "meta protocol".into(),
        Field::L4Proto => "meta l4proto".into(),
        Field::Ip4Saddr => "ip saddr".into(),
        Field::Ip4Daddr => "ip daddr".into(),
        Field::Ip6Saddr => "ip6 saddr".into(),
        Field::Ip6Daddr => "ip6 daddr".into(),
        Field::ThSport => "th sport".into(),
        Field::ThDport => "th dport".into(),
        Field::Mark => "meta mark".into(),
        Field::IifName => "iifname".into(),
        Field::OifName => "oifname".into(),
        Field::CtState => "ct state".into(),
        Field::CtMark => "ct mark".into(),
        Field::CtDirection => "ct direction".into(),
        Field::FibDaddrType => "fib daddr type".into(),
        Field::FibSaddrType => "fib saddr type".into(),
        Field::FibSaddrIifOif => "fib saddr . iif oif".into(),
        Field::TcpFlags => "tcp flags".into(),
        Field::Ip4FragOff => "ip frag-off".into(),
        Field::Ip6FragOff => "frag frag-off".into(),
        Field::NumgenRandom(n) => format!("numgen random mod {n}"),
        Field::Ip4DaddrLowNibble => "ip daddr & 0.0.0.15".into(),
        Field::Ip6DaddrLowNibble => "ip6 daddr & ::f".into(),
    }
}

fn values(vals: &[Value]) -> String {
    vals.iter().map(value).collect::<Vec<_>>().join(" . ")
}

pub fn value(v: &Value) -> String {
    match v {
        Value::Ipv4(a) => a.to_string(),
        Value::Ipv6(a) => a.to_string(),
        Value::Proto(p) => match *p {
            proto::TCP => "tcp".into(),
            proto::UDP => "udp".into(),
            proto::SCTP => "sctp".into(),
            proto::ICMP => "icmp".into(),
            proto::ICMPV6 => "ipv6-icmp".into(),
            n => n.to_string(),
        },
        Value::Port(p) => p.to_string(),
        Value::Mark(m) => format!("{m:#010x}"),
        Value::IfName(n) => quoted(n),
        Value::NfProto(IpFamily::V4) => "ipv4".into(),
        Value::NfProto(IpFamily::V6) => "ipv6".into(),
        Value::AddrType(AddrType::Local) => "local".into(),
        Value::CtDir(CtDir::Original) => "original".into(),
        Value::CtDir(CtDir::Reply) => "reply".into(),
        Value::Integer(i) => i.to_string(),
        Value::Exists(true) => "exists".into(),
        Value::Exists(false) => "missing".into(),
        Value::TcpFlags(bits) => tcp_flag_names(*bits),
    }
}

pub fn verdict(v: &Verdict) -> String {
    match v {
        Verdict::Accept => "accept".into(),
        Verdict::Drop => "drop".into(),
        Verdict::Return => "return".into(),
        Verdict::Continue => "continue".into(),
        Verdict::Jump(c) => format!("jump {c}"),
        Verdict::Goto(c) => format!("goto {c}"),
    }
}

/// A double-quoted nft string. nft strings have no escapes, so characters that could end
/// the string or the statement are replaced; the text is also capped at nft's comment length.
pub fn quoted(s: &str) -> String {
    format!("\"{}\"", sanitize_text(s))
}

/// The exact text stored for a comment/prefix: shared with the netlink encoder so the
/// kernel holds the same bytes whichever path wrote them. Inside nft's quotes, so quotes,
/// backslashes, `;`, `#` and every [`crate::text::breaks_line`] character become `_`
/// (the `#` lines around the table use [`crate::text::one_line`] instead).
pub fn sanitize_text(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len().min(SANITIZED_MAX));
    sanitize_into(s, &mut out);
    String::from_utf8(out).expect("whole characters of a str")
}

/// Longest text [`sanitize_text`] keeps, in bytes (nft's comment limit minus its NUL).
pub const SANITIZED_MAX: usize = 127;

/// [`sanitize_text`] appended to `out` without allocating (the element encoder writes
/// comments straight into the batch).
pub fn sanitize_into(s: &str, out: &mut Vec<u8>) {
    let mut len = 0;
    for c in s.chars() {
        let c = match c {
            '"' | '\\' | ';' | '#' => '_',
            c if crate::text::breaks_line(c) => '_',
            c => c,
        };
        if len + c.len_utf8() > SANITIZED_MAX {
            break;
        }
        let mut buf = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        len += c.len_utf8();
    }
}
