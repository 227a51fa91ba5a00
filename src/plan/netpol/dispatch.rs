//! Which policies govern each local pod, per direction, and what that makes of the table:
//! the pod's dispatch element (`goto` the chain of its policy set), the policy-set parts
//! (`np-set/<in|eg>/<chain>`: `jump` each policy's chain, then drop) and the hairpin part
//! (`np-self`). Kept up to date from the policies planned again, not rebuilt from all of
//! them: a label change that re-plans ten policies of a thousand touches the pods those ten
//! select or selected, and the policy sets those pods leave or join.

use super::memo::{Planned, PolicySet};
use super::rules::Direction;
use super::{EGRESS_V4, EGRESS_V6, INGRESS_V4, INGRESS_V6, PREFIX, SELF_PART, SELF_V4, SELF_V6};
use crate::nft::ir::*;
use crate::nft::names::object_name;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

/// A policy set: a direction and the chains of the policies selecting a pod, in policy
/// order (the order of their keys).
type Group = (Direction, Vec<Arc<str>>);

/// The policies governing one pod in one direction: policy key -> that policy's chain.
type Governing = Arc<BTreeMap<String, Arc<str>>>;

/// The member key of a namespace's logged deny chain (ACL logging): after every policy key
/// (no string starts with a larger character), so the policy set jumps it last, just
/// before its drop, and it logs only what no policy accepted.
const DENY_KEY: &str = "\u{10FFFF}acl-deny";

/// The dispatch state of last plan.
#[derive(Debug, Clone, Default)]
pub struct Dispatch {
    /// (direction, local pod address) -> the policies governing it, for each pod some
    /// policy isolates.
    members: imbl::OrdMap<(Direction, IpAddr), Governing>,
    /// Each policy set in use and its part.
    sets: imbl::OrdMap<Group, PolicySet>,
}

impl Dispatch {
    /// The addresses of the local pods a policy isolates (either direction).
    pub fn isolated(&self) -> BTreeSet<IpAddr> {
        self.members.keys().map(|(_, ip)| *ip).collect()
    }

    /// Starts the update of one plan.
    pub fn update(&self) -> Update<'_> {
        Update {
            before: self,
            next: self.clone(),
            affected: BTreeSet::new(),
        }
    }

    fn chains(&self, at: &(Direction, IpAddr)) -> Option<Vec<Arc<str>>> {
        self.members.get(at).map(|m| m.values().cloned().collect())
    }

    fn is_isolated(&self, ip: IpAddr) -> bool {
        [Direction::Ingress, Direction::Egress]
            .into_iter()
            .any(|d| self.members.contains_key(&(d, ip)))
    }
}

/// One plan's changes to a [`Dispatch`]: policies removed ([`Update::remove`]) and added
/// ([`Update::add`]), then [`Update::finish`].
pub struct Update<'a> {
    before: &'a Dispatch,
    next: Dispatch,
    /// The (direction, pod) whose policies changed.
    affected: BTreeSet<(Direction, IpAddr)>,
}

impl Update<'_> {
    /// The policy `key` as `planned` no longer governs its pods.
    pub fn remove(&mut self, key: &str, planned: &Planned) {
        for (direction, _) in &planned.chains {
            for ip in &planned.selected {
                let at = (*direction, *ip);
                if let Some(members) = self.next.members.get_mut(&at) {
                    Arc::make_mut(members).remove(key);
                    if members.keys().all(|k| k == DENY_KEY) {
                        self.next.members.remove(&at);
                    }
                }
                self.affected.insert(at);
            }
        }
    }

    /// The policy `key` as `planned` governs its pods.
    pub fn add(&mut self, key: &str, planned: &Planned) {
        for (direction, chain) in &planned.chains {
            for ip in &planned.selected {
                let at = (*direction, *ip);
                let members = Arc::make_mut(self.next.members.entry(at).or_default());
                members.insert(key.to_string(), chain.clone());
                let deny = planned.deny.iter().find(|(d, _)| d == direction);
                match deny {
                    Some((_, chain)) => members.insert(DENY_KEY.into(), chain.clone()),
                    None => members.remove(DENY_KEY),
                };
                self.affected.insert(at);
            }
        }
    }

    /// Moves each affected pod from its old policy set to its new one, rebuilds the parts
    /// of the sets whose pods changed (a set without pods goes) and the hairpin part when
    /// the isolated pods changed, into `parts`.
    pub fn finish(mut self, parts: &mut Parts) -> Dispatch {
        let mut regrouped: BTreeMap<Group, Vec<IpAddr>> = BTreeMap::new();
        let mut isolation_changed = false;
        for at in &self.affected {
            let (direction, ip) = *at;
            isolation_changed |= self.before.is_isolated(ip) != self.next.is_isolated(ip);
            let (old, new) = (self.before.chains(at), self.next.chains(at));
            if old == new {
                continue;
            }
            if let Some(chains) = old {
                ips_of(&mut regrouped, &self.next.sets, (direction, chains)).retain(|i| *i != ip);
            }
            if let Some(chains) = new {
                let ips = ips_of(&mut regrouped, &self.next.sets, (direction, chains));
                if let Err(i) = ips.binary_search(&ip) {
                    ips.insert(i, ip);
                }
            }
        }
        for (group, ips) in regrouped {
            if let Some(old) = self.next.sets.remove(&group) {
                // A group's key is derived from the group: the same key, replaced below.
                parts.remove(&old.key);
            }
            if !ips.is_empty() {
                let planned = policy_set_part(group.0, &group.1, ips);
                parts.insert(planned.key.clone(), planned.part.clone());
                self.next.sets.insert(group, planned);
            }
        }
        if isolation_changed {
            match self_part(&self.next.isolated()) {
                None => parts.remove(SELF_PART),
                Some(part) => parts.insert(SELF_PART.into(), Arc::new(part)),
            };
        }
        self.next
    }
}

/// The pods of `group` as regrouped so far (its pods of last plan at first).
fn ips_of<'r>(
    regrouped: &'r mut BTreeMap<Group, Vec<IpAddr>>,
    sets: &imbl::OrdMap<Group, PolicySet>,
    group: Group,
) -> &'r mut Vec<IpAddr> {
    regrouped
        .entry(group)
        .or_insert_with_key(|group| sets.get(group).map(|s| s.ips.clone()).unwrap_or_default())
}

/// The part of one policy set: its chain (`jump` each policy's chain, then drop) and the
/// dispatch elements of the pods it governs.
fn policy_set_part(direction: Direction, chains: &[Arc<str>], ips: Vec<IpAddr>) -> PolicySet {
    let (v4, v6) = match direction {
        Direction::Ingress => (INGRESS_V4, INGRESS_V6),
        Direction::Egress => (EGRESS_V4, EGRESS_V6),
    };
    let joined: Vec<&str> = chains.iter().map(|c| &**c).collect();
    let name = object_name(
        &format!("{PREFIX}-{}", direction.suffix()),
        &joined.join(","),
    );
    let mut chain = Chain::regular(&name);
    for policy_chain in chains {
        chain.push(Rule::new(vec![Stmt::Verdict(Verdict::Jump(
            policy_chain.to_string(),
        ))]));
    }
    chain.push(Rule::new(vec![Stmt::Counter, Stmt::Verdict(Verdict::Drop)]));
    let mut part = Part::default();
    part.add_chain(chain);
    for ip in &ips {
        let map = if ip.is_ipv4() { v4 } else { v6 };
        let goto = ElemData::Verdict(Verdict::Goto(name.clone()));
        part.add_mapping(map, vec![Value::ip(*ip).into()], goto);
    }
    part.shrink_to_fit();
    PolicySet {
        key: format!("{PREFIX}-set/{}/{name}", direction.suffix()),
        ips,
        part: Arc::new(part),
    }
}

/// `ip . ip` of each isolated local pod into `np-self-v4/v6` (`None` when there is none).
fn self_part(isolated: &BTreeSet<IpAddr>) -> Option<Part> {
    if isolated.is_empty() {
        return None;
    }
    let mut part = Part::default();
    for ip in isolated {
        let set = if ip.is_ipv4() { SELF_V4 } else { SELF_V6 };
        part.add_element(set, vec![Value::ip(*ip).into(), Value::ip(*ip).into()]);
    }
    part.shrink_to_fit();
    Some(part)
}
