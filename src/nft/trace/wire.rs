//! nf_tables trace events as the kernel sends them to `NFNLGRP_NFTRACE`: one message per rule
//! that decided something, per chain that returned and per base chain policy taken, for
//! every packet whose trace bit is set (`meta nftrace set 1`).

use crate::nft::nftnl::reply::{self, NFNL_HDRLEN, NFNL_SUBSYS_NFTABLES, NLMSG_HDRLEN};

uapi!(pub u32:
    /// The multicast group of trace events.
    NFNLGRP_NFTRACE,
);
uapi!(u16: NFT_MSG_TRACE);
/// The family is nfgenmsg's first byte.
const FAMILY_AT: usize = NLMSG_HDRLEN;

// enum nft_trace_attributes
const TABLE: u16 = 1;
const CHAIN: u16 = 2;
const RULE_HANDLE: u16 = 3;
const TYPE: u16 = 4;
const VERDICT: u16 = 5;
const ID: u16 = 6;
const NETWORK_HEADER: u16 = 8;
const TRANSPORT_HEADER: u16 = 9;
const IIF: u16 = 10;
const OIF: u16 = 12;
const MARK: u16 = 14;
const POLICY: u16 = 16;
// enum nft_verdict_attributes
const VERDICT_CODE: u16 = 1;
const VERDICT_CHAIN: u16 = 2;

/// What a trace event reports (`enum nft_trace_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceKind {
    /// A rule whose expressions all matched, with its verdict (`continue` when it went on).
    Rule,
    /// A chain ran out of rules: back to the caller (a base chain's policy follows).
    Return,
    /// The end of a base chain: its policy.
    Policy,
}

/// A verdict as the kernel encodes it (`NF_DROP` 0, `NF_ACCEPT` 1, `NFT_CONTINUE` -1,
/// `NFT_BREAK` -2, `NFT_JUMP` -3, `NFT_GOTO` -4, `NFT_RETURN` -5), with the target chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelVerdict {
    pub code: i32,
    pub chain: Option<String>,
}

impl KernelVerdict {
    /// As `nft monitor trace` prints it: `accept`, `jump fw-x`, `continue`.
    pub fn text(&self) -> String {
        let target = |verb: &str| match &self.chain {
            Some(c) => format!("{verb} {c}"),
            None => verb.to_string(),
        };
        match self.code {
            0 => "drop".into(),
            1 => "accept".into(),
            2 => "stolen".into(),
            3 => "queue".into(),
            -1 => "continue".into(),
            -2 => "break".into(),
            -3 => target("jump"),
            -4 => target("goto"),
            -5 => "return".into(),
            n => format!("verdict {n}"),
        }
    }

    /// Whether the packet's walk through nf_tables ends here (accept ends only its hook).
    pub fn is_drop(&self) -> bool {
        self.code == 0
    }
}

/// One trace event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEvent {
    /// The packet's trace id: every event of one packet (across hooks) carries it.
    pub id: u32,
    /// The table's family (`NFPROTO_INET` 1, `NFPROTO_BRIDGE` 7).
    pub family: u8,
    pub table: String,
    pub chain: String,
    /// The rule's handle (`Rule` events).
    pub handle: Option<u64>,
    pub kind: TraceKind,
    pub verdict: Option<KernelVerdict>,
    /// The packet's network and transport headers as the hook saw them (the first event
    /// of each hook a packet meets carries them).
    pub network: Option<Vec<u8>>,
    pub transport: Option<Vec<u8>>,
    pub iif: Option<u32>,
    pub oif: Option<u32>,
    pub mark: Option<u32>,
    /// The base chain's policy (`Policy` events): `NF_DROP` 0 or `NF_ACCEPT` 1.
    pub policy: Option<u32>,
}

fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

fn be64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.get(..8)?.try_into().ok()?))
}

fn string(v: &[u8]) -> String {
    let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// The trace events of one datagram (other messages are skipped).
pub fn parse_datagram(buf: &[u8]) -> impl Iterator<Item = TraceEvent> + '_ {
    reply::messages(buf).filter_map(|(kind, _, _, msg)| {
        (kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_TRACE)
            .then(|| parse(msg))
            .flatten()
    })
}

/// One `NFT_MSG_TRACE` message; `None` if it lacks the id, table, chain or type.
pub fn parse(msg: &[u8]) -> Option<TraceEvent> {
    let family = *msg.get(FAMILY_AT)?;
    let body = msg.get(NFNL_HDRLEN..)?;
    let (mut id, mut table, mut chain, mut kind) = (None, None, None, None);
    let mut ev = TraceEvent {
        id: 0,
        family,
        table: String::new(),
        chain: String::new(),
        handle: None,
        kind: TraceKind::Rule,
        verdict: None,
        network: None,
        transport: None,
        iif: None,
        oif: None,
        mark: None,
        policy: None,
    };
    for (attr, v, _) in reply::attrs(body, NFNL_HDRLEN) {
        match attr {
            TABLE => table = Some(string(v)),
            CHAIN => chain = Some(string(v)),
            RULE_HANDLE => ev.handle = be64(v),
            TYPE => {
                kind = match be32(v)? {
                    1 => Some(TraceKind::Policy),
                    2 => Some(TraceKind::Return),
                    3 => Some(TraceKind::Rule),
                    _ => None,
                }
            }
            VERDICT => ev.verdict = verdict(v),
            ID => id = be32(v),
            NETWORK_HEADER => ev.network = Some(v.to_vec()),
            TRANSPORT_HEADER => ev.transport = Some(v.to_vec()),
            IIF => ev.iif = be32(v),
            OIF => ev.oif = be32(v),
            MARK => ev.mark = be32(v),
            POLICY => ev.policy = be32(v),
            _ => {}
        }
    }
    ev.id = id?;
    ev.table = table?;
    ev.chain = chain?;
    ev.kind = kind?;
    Some(ev)
}

fn verdict(nested: &[u8]) -> Option<KernelVerdict> {
    let mut code = None;
    let mut chain = None;
    for (attr, v, _) in reply::attrs(nested, 0) {
        match attr {
            VERDICT_CODE => code = be32(v).map(|c| c as i32),
            VERDICT_CHAIN => chain = Some(string(v)),
            _ => {}
        }
    }
    Some(KernelVerdict { code: code?, chain })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn attr(kind: u16, v: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(v);
        a.resize((a.len() + 3) & !3, 0);
        a
    }

    /// A trace message as the kernel builds it (`nf_tables_trace.c`).
    pub(crate) fn message(family: u8, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let body: Vec<u8> = attrs.iter().flat_map(|(k, v)| attr(*k, v)).collect();
        let len = (NFNL_HDRLEN + body.len()) as u32;
        let mut m = Vec::new();
        m.extend_from_slice(&len.to_ne_bytes());
        m.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_TRACE).to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&[family, 0, 0, 0]);
        m.extend(body);
        m
    }

    fn cstr(s: &str) -> Vec<u8> {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        v
    }

    #[test]
    fn a_rule_event_with_a_jump_is_read_whole() {
        let mut nested = attr(VERDICT_CODE, &(-3i32 as u32).to_be_bytes());
        nested.extend(attr(VERDICT_CHAIN, &cstr("fw-ns1")));
        let msg = message(
            1,
            &[
                (TABLE, cstr("nodeplane")),
                (CHAIN, cstr("filter-forward")),
                (RULE_HANDLE, 42u64.to_be_bytes().to_vec()),
                (TYPE, 3u32.to_be_bytes().to_vec()),
                (VERDICT | 0x8000, nested),
                (ID, 0xdead_beefu32.to_be_bytes().to_vec()),
                (IIF, 7u32.to_be_bytes().to_vec()),
                (NETWORK_HEADER, vec![0x45; 20]),
            ],
        );
        let ev = parse(&msg).expect("a trace event");
        assert_eq!(
            (ev.id, ev.family, ev.table.as_str(), ev.chain.as_str()),
            (0xdead_beef, 1, "nodeplane", "filter-forward")
        );
        assert_eq!(
            (ev.handle, ev.kind, ev.iif),
            (Some(42), TraceKind::Rule, Some(7))
        );
        let v = ev.verdict.expect("verdict");
        assert_eq!(v.text(), "jump fw-ns1");
        assert_eq!(ev.network.as_deref(), Some(&[0x45; 20][..]));
    }

    #[test]
    fn events_without_id_or_type_and_other_messages_are_skipped() {
        let no_id = message(
            1,
            &[
                (TABLE, cstr("t")),
                (CHAIN, cstr("c")),
                (TYPE, 1u32.to_be_bytes().to_vec()),
            ],
        );
        assert_eq!(parse(&no_id), None);
        let policy = message(
            7,
            &[
                (TABLE, cstr("t")),
                (CHAIN, cstr("c")),
                (TYPE, 1u32.to_be_bytes().to_vec()),
                (ID, 1u32.to_be_bytes().to_vec()),
            ],
        );
        let mut datagram = no_id.clone();
        datagram.extend(&policy);
        let all: Vec<_> = parse_datagram(&datagram).collect();
        assert_eq!(all.len(), 1);
        assert_eq!((all[0].kind, all[0].family), (TraceKind::Policy, 7));
        // A truncated message is not read past its end.
        assert_eq!(parse(&policy[..policy.len() - 3]).map(|e| e.id), None);
    }
}
