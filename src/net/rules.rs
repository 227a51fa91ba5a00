//! Policy rules (`ip rule`): validation, diff, and netlink messages.

use std::collections::BTreeSet;

use ipnet::IpNet;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::route::{RouteHeader, RouteProtocol};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};

use super::{Family, KernelRule, KernelState, NetChanges, NetConfig, NetError, RuleSpec};
use super::{outside, proto_name};

fn invalid(rule: &RuleSpec, reason: impl Into<String>) -> NetError {
    NetError::Invalid {
        object: format!("rule {rule}"),
        reason: reason.into(),
    }
}

/// The form the kernel reports a rule in: `from 0.0.0.0/0` is `from all`.
pub fn canonical(rule: &RuleSpec) -> RuleSpec {
    let mut out = *rule;
    if out.from.is_some_and(|n| n.prefix_len() == 0) {
        out.from = None;
    }
    out
}

pub(crate) fn validate(rule: &RuleSpec, cfg: &NetConfig) -> Result<(), NetError> {
    if let Some(priorities) = outside(&cfg.rule_priorities, rule.priority) {
        return Err(invalid(
            rule,
            format!("priority outside the agent's rule priorities {priorities}"),
        ));
    }
    if rule.table == 0 {
        return Err(invalid(rule, "table 0 is not a routing table"));
    }
    if let Some(from) = rule.from {
        if Family::of(&from.addr()) != rule.family {
            return Err(invalid(rule, format!("from {from} is not {}", rule.family)));
        }
        if from.trunc() != from {
            return Err(invalid(
                rule,
                format!(
                    "from {from} has host bits set (the network is {})",
                    from.trunc()
                ),
            ));
        }
    }
    if let Some((mark, mask)) = rule.fwmark {
        if mask == 0 {
            return Err(invalid(rule, "fwmark mask 0 matches every packet"));
        }
        if mark & !mask != 0 {
            return Err(invalid(
                rule,
                format!("fwmark {mark:#x} has bits outside its mask {mask:#x}"),
            ));
        }
        // The kernel does not report this pair back, so it could never be found again.
        if mark == 0 && mask == u32::MAX {
            return Err(invalid(rule, "fwmark 0/0xffffffff cannot be read back"));
        }
    }
    Ok(())
}

pub(crate) fn plan(
    state: &KernelState,
    desired: &BTreeSet<RuleSpec>,
    cfg: &NetConfig,
    changes: &mut NetChanges,
) -> Result<(), NetError> {
    let mut want = BTreeSet::new();
    for rule in desired {
        validate(rule, cfg)?;
        want.insert(canonical(rule));
    }
    let mut have: Vec<RuleSpec> = state
        .rules
        .iter()
        .filter(|r| r.proto == cfg.protocol && cfg.rule_priorities.contains(&r.spec.priority))
        .map(|r| canonical(&r.spec))
        .collect();
    have.sort();
    // The kernel allows duplicates when added without NLM_F_EXCL; each delete removes one.
    let mut kept = BTreeSet::new();
    for rule in have {
        if !(want.contains(&rule) && kept.insert(rule)) {
            changes.rules_del.push(rule);
        }
    }
    changes.rules_add.extend(want.difference(&kept).copied());
    Ok(())
}

/// `rule add priority 7000 from all fwmark 0x1/0xff lookup 7000 protocol nodeplane`
/// (`-6 rule ...` for IPv6).
pub fn describe(verb: &str, rule: &RuleSpec, proto: u8) -> String {
    let family = match rule.family {
        Family::V4 => "",
        Family::V6 => "-6 ",
    };
    let from = rule
        .from
        .map_or_else(|| "all".to_string(), |n| n.to_string());
    let fwmark = rule
        .fwmark
        .map_or_else(String::new, |(m, k)| format!(" fwmark {m:#x}/{k:#x}"));
    format!(
        "{family}rule {verb} priority {} from {from}{fwmark} lookup {} protocol {}",
        rule.priority,
        rule.table,
        proto_name(proto)
    )
}

/// The full rule with the agent's protocol: used both to add and to delete (the kernel deletes
/// the first rule equal in every given field, so only a marked rule can match).
pub(crate) fn message(rule: &RuleSpec, proto: u8) -> RuleMessage {
    let mut msg = RuleMessage::default();
    msg.header.family = match rule.family {
        Family::V4 => AddressFamily::Inet,
        Family::V6 => AddressFamily::Inet6,
    };
    msg.header.action = RuleAction::ToTable;
    msg.header.table = u8::try_from(rule.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
    msg.attributes.push(RuleAttribute::Priority(rule.priority));
    msg.attributes.push(RuleAttribute::Table(rule.table));
    msg.attributes
        .push(RuleAttribute::Protocol(RouteProtocol::from(proto)));
    if let Some((mark, mask)) = rule.fwmark {
        msg.attributes.push(RuleAttribute::FwMark(mark));
        msg.attributes.push(RuleAttribute::FwMask(mask));
    }
    if let Some(from) = rule.from {
        msg.header.src_len = from.prefix_len();
        msg.attributes.push(RuleAttribute::Source(from.addr()));
    }
    msg
}

/// The kernel's rule as a [`KernelRule`]; `None` for rules a [`RuleSpec`] cannot express
/// (other actions, or selectors such as `iif`, `to`, `tos`, `uidrange`, `ipproto`, ports):
/// the agent never creates those, and never touches them.
pub(crate) fn parse(msg: &RuleMessage) -> Option<KernelRule> {
    let family = match msg.header.family {
        AddressFamily::Inet => Family::V4,
        AddressFamily::Inet6 => Family::V6,
        _ => return None,
    };
    if msg.header.action != RuleAction::ToTable || msg.header.dst_len != 0 || msg.header.tos != 0 {
        return None;
    }
    let mut spec = RuleSpec {
        priority: 0,
        fwmark: None,
        from: None,
        table: u32::from(msg.header.table),
        family,
    };
    let (mut mark, mut mask, mut proto) = (None, None, 0);
    for attr in &msg.attributes {
        match attr {
            RuleAttribute::Priority(p) => spec.priority = *p,
            RuleAttribute::Table(t) => spec.table = *t,
            RuleAttribute::FwMark(m) => mark = Some(*m),
            RuleAttribute::FwMask(m) => mask = Some(*m),
            RuleAttribute::Protocol(p) => proto = u8::from(*p),
            RuleAttribute::Source(ip) => {
                spec.from = Some(IpNet::new(*ip, msg.header.src_len).ok()?);
            }
            // The kernel always reports these two; u32::MAX (-1) means "not set".
            RuleAttribute::SuppressIfGroup(v) | RuleAttribute::SuppressPrefixLen(v)
                if *v == u32::MAX => {}
            RuleAttribute::L3MDev(false) => {}
            RuleAttribute::Destination(_)
            | RuleAttribute::Iifname(_)
            | RuleAttribute::Oifname(_)
            | RuleAttribute::Goto(_)
            | RuleAttribute::TunId(_)
            | RuleAttribute::SuppressIfGroup(_)
            | RuleAttribute::SuppressPrefixLen(_)
            | RuleAttribute::L3MDev(_)
            | RuleAttribute::UidRange(_)
            | RuleAttribute::IpProtocol(_)
            | RuleAttribute::SourcePortRange(_)
            | RuleAttribute::DestinationPortRange(_) => return None,
            _ => {}
        }
    }
    // The kernel omits FRA_FWMASK for a full mask, and FRA_FWMARK for mark 0.
    spec.fwmark = match (mark, mask) {
        (None, None) => None,
        (m, k) => Some((m.unwrap_or(0), k.unwrap_or(u32::MAX))),
    };
    Some(KernelRule { spec, proto })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(priority: u32, fwmark: Option<(u32, u32)>, from: Option<&str>) -> RuleSpec {
        RuleSpec {
            priority,
            fwmark,
            from: from.map(|f| f.parse().unwrap()),
            table: 7000,
            family: Family::V4,
        }
    }

    #[test]
    fn message_round_trips_with_marker() {
        let r = rule(7000, Some((0x10, 0xff)), Some("10.0.0.0/24"));
        let mut msg = message(&r, 0x6e);
        // What the kernel adds to every rule it reports.
        msg.attributes
            .push(RuleAttribute::SuppressPrefixLen(u32::MAX));
        let parsed = parse(&msg).unwrap();
        assert_eq!(
            parsed,
            KernelRule {
                spec: r,
                proto: 0x6e
            }
        );
    }

    #[test]
    fn foreign_selectors_are_not_ours_to_touch() {
        let mut msg = message(&rule(7000, None, None), 0x6e);
        msg.attributes.push(RuleAttribute::Iifname("eth0".into()));
        assert_eq!(parse(&msg), None);
    }

    #[test]
    fn validation_and_description() {
        let cfg = NetConfig::default();
        let err = validate(&rule(100, None, None), &cfg).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rule ipv4 priority 100: priority outside the agent's rule priorities 7000-7999"
        );
        let err = validate(&rule(7000, Some((0x100, 0xff)), None), &cfg).unwrap_err();
        assert!(err.to_string().contains("outside its mask"));
        let err = validate(&rule(7000, None, Some("2001:db8::/64")), &cfg).unwrap_err();
        assert!(err.to_string().contains("is not ipv4"));
        assert_eq!(
            describe(
                "add",
                &rule(7001, Some((1, 0xff)), Some("10.0.0.0/24")),
                0x6e
            ),
            "rule add priority 7001 from 10.0.0.0/24 fwmark 0x1/0xff lookup 7000 protocol nodeplane"
        );
        assert_eq!(
            canonical(&rule(7000, None, Some("0.0.0.0/0"))),
            rule(7000, None, None)
        );
    }
}
