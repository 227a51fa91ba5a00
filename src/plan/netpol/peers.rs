//! Peer sets shared by every policy rule that names the same peers.
//!
//! What a rule's peer set holds depends only on its peers (the pod and namespace selectors,
//! the namespace a peer without `namespaceSelector` means, the ipBlocks) and on the cluster's
//! pods and namespaces, not on the policy. So the set is keyed by the canonical peer list
//! ([`PeerKey`]) and every rule with an equal key looks up the same named sets
//! (`np-peers-<hash>-v4/v6`, part `np-peers/<name>`): 500 policies that allow the monitoring
//! namespace hold one set of its pods, not 500 copies. A set is counted by the policies whose
//! chains look it up ([`Shared::users`]) and leaves the table with its last user; a pod
//! change rewrites each set it is a member of once, however many policies use it.
//!
//! Names come from a hash of the key's canonical text; two keys that would get the same name
//! (a hash collision) never share it: the second gets the next candidate ([`PeerSets`] knows
//! which key holds which name).

use super::pods::{LazyIndex, PodIndex, peer_matches};
use crate::api::Pod;
use crate::api::network_policy::{NamespaceScope, Peer};
use crate::nft::ir::*;
use crate::snapshot::Snapshot;
use data_encoding::BASE32_NOPAD;
use ipnet::IpNet;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::fmt::Write;
use std::sync::Arc;

/// Prefix of the shared peer sets' names and parts.
const PREFIX: &str = "np-peers";

/// A rule's peers in canonical form: equal keys stand for the same addresses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerKey {
    /// The policy's namespace, when a peer without `namespaceSelector` (the policy's own
    /// namespace) needs it; `None` otherwise: namespace selectors and ipBlocks mean the same
    /// from every namespace, so such keys are shared across namespaces.
    namespace: Option<String>,
    /// Sorted, without duplicates; each ipBlock's excepts sorted.
    peers: Vec<Peer>,
}

impl PeerKey {
    /// The key of a rule of a policy in `namespace` with these peers.
    pub fn of(namespace: &str, peers: &[Peer]) -> PeerKey {
        let mut peers: Vec<Peer> = peers
            .iter()
            .map(|peer| match peer {
                Peer::Block { cidr, except } => {
                    let mut except = except.clone();
                    except.sort();
                    except.dedup();
                    Peer::Block {
                        cidr: *cidr,
                        except,
                    }
                }
                pods => pods.clone(),
            })
            .collect();
        peers.sort();
        peers.dedup();
        let own = peers.iter().any(|p| {
            matches!(
                p,
                Peer::Pods {
                    namespaces: NamespaceScope::Own,
                    ..
                }
            )
        });
        PeerKey {
            namespace: own.then(|| namespace.to_string()),
            peers,
        }
    }

    /// The text the name is hashed from: one line per peer, fields separated by characters
    /// no label, namespace name or address contains, so distinct keys have distinct texts.
    fn canonical(&self) -> String {
        let mut text = String::new();
        if let Some(ns) = &self.namespace {
            let _ = writeln!(text, "namespace {ns}");
        }
        for peer in &self.peers {
            let _ = match peer {
                Peer::Pods {
                    namespaces: NamespaceScope::Own,
                    pods,
                } => writeln!(text, "pods;{pods}"),
                Peer::Pods {
                    namespaces: NamespaceScope::Matching(ns),
                    pods,
                } => writeln!(text, "pods;{pods};in;{ns}"),
                Peer::Block { cidr, except } => {
                    let except: Vec<String> = except.iter().map(ToString::to_string).collect();
                    writeln!(text, "block;{cidr};except;{}", except.join(","))
                }
            };
        }
        text
    }

    /// Whether `pod` (one version of a changed pod) is one of these peers: the set must be
    /// computed again.
    pub fn touches(&self, snapshot: &Snapshot, pod: &Pod) -> bool {
        let namespace = self.namespace.as_deref().unwrap_or_default();
        self.peers
            .iter()
            .any(|peer| peer_matches(namespace, peer, snapshot, pod))
    }

    /// The addresses of `family` these peers stand for, as disjoint prefixes (interval sets
    /// reject overlapping elements): pod addresses and ipBlocks minus their excepts.
    fn nets(&self, index: &PodIndex, family: IpFamily) -> Vec<IpNet> {
        let namespace = self.namespace.as_deref().unwrap_or_default();
        let mut nets: Vec<IpNet> = Vec::new();
        for peer in &self.peers {
            match peer {
                Peer::Block { cidr, except } => {
                    if IpFamily::of(cidr.addr()) == family {
                        nets.extend(subtract(*cidr, except));
                    }
                }
                Peer::Pods { .. } => nets.extend(
                    index
                        .peers(namespace, peer)
                        .flat_map(|p| &p.ips)
                        .filter(|ip| IpFamily::of(**ip) == family)
                        .map(|ip| IpNet::from(*ip)),
                ),
            }
        }
        IpNet::aggregate(&nets)
    }
}

/// `net` without the `holes`, as prefixes.
pub fn subtract(net: IpNet, holes: &[IpNet]) -> Vec<IpNet> {
    if holes.iter().any(|h| h.contains(&net)) {
        return Vec::new();
    }
    if !holes.iter().any(|h| net.contains(h)) {
        return vec![net];
    }
    let halves = net
        .subnets(net.prefix_len() + 1)
        .expect("a hole inside makes net splittable");
    halves.flat_map(|half| subtract(half, holes)).collect()
}

/// One shared peer set as planned.
#[derive(Debug, Clone)]
pub struct Shared {
    /// The sets are `<name>-v4` and `<name>-v6`.
    name: Arc<str>,
    /// The sets of the families that have addresses (a rule looks up only those: a family
    /// without peers allows nothing).
    part: Arc<Part>,
    /// How many policies' chains look it up (each policy counts once).
    users: usize,
}

/// What a rule needs of its shared peer set.
pub struct Lookup {
    pub key: Arc<PeerKey>,
    name: Arc<str>,
    families: [bool; 2],
}

impl Lookup {
    /// The set of `family`, if the peers have addresses of it.
    pub fn set(&self, family: IpFamily) -> Option<String> {
        self.families[family_index(family)].then(|| set_name(&self.name, family))
    }
}

fn family_index(family: IpFamily) -> usize {
    match family {
        IpFamily::V4 => 0,
        IpFamily::V6 => 1,
    }
}

fn set_name(name: &str, family: IpFamily) -> String {
    format!("{name}-{}", suffix(family))
}

fn part_key(name: &str) -> String {
    format!("{PREFIX}/{name}")
}

/// Every shared peer set in use, by key. Persistent maps: the memory is cloned per plan.
#[derive(Debug, Clone, Default)]
pub struct PeerSets {
    sets: imbl::OrdMap<Arc<PeerKey>, Shared>,
    /// Name -> the key it was given to.
    names: imbl::OrdMap<Arc<str>, Arc<PeerKey>>,
    /// Keys created or released during this plan: [`PeerSets::finish`] drops those left
    /// without users.
    touched: Vec<Arc<PeerKey>>,
}

impl PeerSets {
    /// Computes again the sets a changed pod (before, after) is or was a member of, every
    /// set when `everything` changed (a namespace), into `parts`; returns the keys whose
    /// families changed (a family appeared or went): their users' chains change.
    pub fn refresh(
        &mut self,
        everything: bool,
        changed: &[(Option<&Pod>, Option<&Pod>)],
        snapshot: &Snapshot,
        index: &mut LazyIndex,
        parts: &mut Parts,
    ) -> BTreeSet<Arc<PeerKey>> {
        let stale: Vec<Arc<PeerKey>> = self
            .sets
            .keys()
            .filter(|key| {
                everything
                    || changed.iter().any(|(before, after)| {
                        [before, after]
                            .into_iter()
                            .flatten()
                            .any(|pod| key.touches(snapshot, pod))
                    })
            })
            .cloned()
            .collect();
        let mut flipped = BTreeSet::new();
        for key in stale {
            let index = index.get();
            let shared = self.sets.get_mut(&key).expect("a stale key is a key");
            let part = set_part(&shared.name, &key, index);
            if part == *shared.part {
                continue;
            }
            if families(&shared.name, &part) != families(&shared.name, &shared.part) {
                flipped.insert(key.clone());
            }
            shared.part = Arc::new(part);
            parts.insert(part_key(&shared.name), shared.part.clone());
        }
        flipped
    }

    /// The shared set of `key`, created (into `parts`) if no policy uses it yet. Not counted
    /// as used until [`PeerSets::acquire`].
    pub fn lookup(&mut self, key: PeerKey, index: &PodIndex, parts: &mut Parts) -> Lookup {
        let (key, shared) = match self.sets.get_key_value(&key) {
            Some((key, shared)) => (key.clone(), shared.clone()),
            None => {
                let key = Arc::new(key);
                let name = self.name_for(&key);
                let part = Arc::new(set_part(&name, &key, index));
                parts.insert(part_key(&name), part.clone());
                let shared = Shared {
                    name: name.clone(),
                    part,
                    users: 0,
                };
                self.names.insert(name, key.clone());
                self.sets.insert(key.clone(), shared.clone());
                self.touched.push(key.clone());
                (key, shared)
            }
        };
        Lookup {
            families: families(&shared.name, &shared.part),
            name: shared.name,
            key,
        }
    }

    /// One more policy uses each of `keys` (distinct keys).
    pub fn acquire(&mut self, keys: &[Arc<PeerKey>]) {
        for key in keys {
            if let Some(shared) = self.sets.get_mut(key) {
                shared.users += 1;
            }
        }
    }

    /// One policy fewer uses each of `keys`; a set left without users goes at
    /// [`PeerSets::finish`].
    pub fn release(&mut self, keys: &[Arc<PeerKey>]) {
        for key in keys {
            if let Some(shared) = self.sets.get_mut(key) {
                shared.users = shared.users.saturating_sub(1);
                self.touched.push(key.clone());
            }
        }
    }

    /// Drops the sets this plan left without users, and their parts.
    pub fn finish(&mut self, parts: &mut Parts) {
        for key in std::mem::take(&mut self.touched) {
            if let Some(shared) = self.sets.get(&key).filter(|s| s.users == 0) {
                parts.remove(&part_key(&shared.name));
                self.names.remove(&shared.name);
                self.sets.remove(&key);
            }
        }
    }

    /// How many policies use the set of `key` (`None`: no such set).
    #[cfg(test)]
    pub fn users(&self, key: &PeerKey) -> Option<usize> {
        self.sets.get(key).map(|s| s.users)
    }

    /// The name of the shared set of `key`, if planned.
    #[cfg(test)]
    pub fn name(&self, key: &PeerKey) -> Option<&str> {
        self.sets.get(key).map(|s| &*s.name)
    }

    /// Number of shared sets.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.sets.len()
    }

    /// A name for a new key: the first candidate no other key holds.
    fn name_for(&self, key: &PeerKey) -> Arc<str> {
        let text = key.canonical();
        (0u32..)
            .map(|attempt| Arc::<str>::from(candidate(&text, attempt)))
            .find(|name| !self.names.contains_key(name))
            .expect("some candidate is free")
    }

    #[cfg(test)]
    pub(super) fn reserve_for_test(&mut self, name: &str, key: PeerKey) {
        self.names.insert(name.into(), Arc::new(key));
    }
}

/// `np-peers-<16 base32 characters of sha256(text)>`, or of `text` and the attempt number
/// after the first: 80 bits, so a collision is a freak, and handled when it happens.
pub fn candidate(text: &str, attempt: u32) -> String {
    let mut hasher = Sha256::new();
    hasher.update(text.as_bytes());
    if attempt > 0 {
        hasher.update(format!("\n#{attempt}").as_bytes());
    }
    let digest = hasher.finalize();
    format!("{PREFIX}-{}", BASE32_NOPAD.encode(&digest[..10]))
}

pub fn suffix(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "v4",
        IpFamily::V6 => "v6",
    }
}

/// Which families the part has a set of.
fn families(name: &str, part: &Part) -> [bool; 2] {
    [IpFamily::V4, IpFamily::V6].map(|f| part.sets.contains_key(&set_name(name, f)))
}

/// The part of a shared set: one interval set per family that has addresses.
fn set_part(name: &str, key: &PeerKey, index: &PodIndex) -> Part {
    let mut part = Part::default();
    for family in [IpFamily::V4, IpFamily::V6] {
        let nets = key.nets(index, family);
        if nets.is_empty() {
            continue;
        }
        let mut set = Set::new(
            set_name(name, family),
            vec![DataType::addr(family)],
            SetKind::Set,
        )
        .with_flags(SetFlags {
            interval: true,
            ..Default::default()
        });
        for net in nets {
            set.insert(vec![KeyPart::Prefix(net)]);
        }
        part.add_set(set);
    }
    part
}

#[cfg(test)]
mod tests;
