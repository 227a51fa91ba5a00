//! Node health probes of the EgressIP assigner: ICMP echo to each candidate's InternalIPs,
//! sent by the leader itself, never through the API server.
//!
//! **Why ICMP echo.** The node's *kernel* answers an echo request, not the agent: the egress
//! addresses, SNAT and steering live in the kernel and keep working while the agent restarts,
//! so a restart (~0.5 s) must not look like a failure, and it does not: the replies keep
//! coming while no agent runs. Echo replies are also exempt from the kernel's ICMP rate
//! limits (`net.ipv4.icmp_ratemask` covers destination unreachable, source quench, time
//! exceeded and parameter problem; `net.ipv6.icmp.ratemask` the ICMPv6 errors), so they are
//! neither limited per peer (`icmp_ratelimit`) nor globally (`icmp_msgs_per_sec`). A UDP
//! datagram to a closed port is answered by port-unreachable, which *is* limited: 6 of 200
//! datagrams sent within 0.4 s were answered in a netns with the default sysctls, while 200
//! of 200 echo requests at the same rate were. A TCP SYN answered by RST depends on the
//! port being closed and on the host firewall as much as ICMP does, and would show up as
//! scans in connection logs.
//!
//! **Sockets.** Raw ICMP and ICMPv6 sockets (`CAP_NET_RAW`, which the DaemonSet grants: the
//! unprivileged ping sockets need `net.ipv4.ping_group_range` to include the agent's group,
//! and its default, `1 0`, includes nobody, root neither). One socket per probed address,
//! *connected* to it: the kernel hands a connected raw socket only the packets from that
//! address, so an ICMP flood at the prober's node (from a pod, or from anywhere that is not a
//! probed address) never reaches the probe sockets and cannot crowd the replies out of their
//! receive buffers. (One unconnected socket sees every ICMP message the node receives: a
//! flood of ~100 000 packets/s from a pod made a healthy node dead within a second.) Each
//! socket has a reader task that forwards matching replies into one bounded queue; sockets
//! follow the targets (open or close per changed address). Replies are matched by identifier
//! (random per prober), source address and a sequence number of the last `misses` rounds.
//!
//! **Payload.** Each echo carries a payload signed for its target with the cluster's probe
//! key ([`super::probe_auth`]): the probed node's fence takes only such probes for the
//! assigner's word. Without a key the payload is unsigned (the magic and zeros): the probes
//! still judge node health (the kernel echoes any payload), and prove nothing to the fence.
//! A standby (a candidate that does not lead, probing to see the leader's node die) sends
//! zeros without the magic while `sign` is false: the fences do not even look at them, so a
//! standby never keeps a cut-off node's fence quiet.
//!
//! **Verdicts.** [`Probes`] is the pure, clock-explicit state machine: every `interval` a
//! round sends one echo to every address of every target node; a round with a matching reply
//! from any of a node's addresses is a hit, one without a miss. A node is dead after `misses`
//! consecutive misses and alive again after `rises` consecutive hits (hysteresis: a flapping
//! link does not move IPs back and forth every round). A node is alive until proven dead
//! (a new leader must not move every IP before its first rounds), so a node that dies is
//! declared dead at most `interval × (misses + 1)` after its last reply.
//!
//! **Failure modes.**
//! - A host firewall dropping ICMP echo to the node makes it dead to the probes: its IPs move
//!   away and none come back. Allow echo requests from the nodes (nodeplane's own rules never
//!   drop them), or turn the probes off (`--egress-ip-probe-misses=0`: every node is healthy,
//!   failures are seen only when the Node turns NotReady, ~40 s).
//! - A node whose kernel answers but whose dataplane is broken (agent crash-looping with a
//!   stale ruleset, broken uplink on a second NIC) stays alive: the probe sees the kernel on
//!   the node network, nothing more. Node Ready and the other assignment rules still apply.
//! - The leader's own network failing makes every other node look dead. When more than half
//!   of two or more probed nodes are dead at once, the prober trusts itself less than the
//!   cluster and publishes every node alive ([`Probes::verdicts`]), with a warning: a real
//!   outage of most egress nodes is then handled by Node Ready only.
//! - Without `CAP_NET_RAW` the sockets cannot be opened: a warning, and every node stays
//!   healthy (the assignment works as without probes).
//! - A node without an InternalIP cannot be probed and is taken for alive.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;

use nix::sys::socket::{self, AddressFamily, SockFlag, SockProtocol, SockType};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::probe_auth::{self, PAYLOAD_LEN, ProbeKey, Stamp};
use crate::net::announce::inet_checksum;

pub use crate::config::probes::{DEFAULT_INTERVAL, DEFAULT_MISSES, RISES, Settings};

/// Node name → its probe addresses.
pub type Targets = BTreeMap<String, Vec<IpAddr>>;
/// Node name → alive.
pub type Verdicts = BTreeMap<String, bool>;

/// One node's verdict with hysteresis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeHealth {
    alive: bool,
    /// Consecutive misses (alive) or hits (dead).
    streak: u32,
    /// A reply arrived during the current round.
    answered: bool,
}

impl Default for NodeHealth {
    fn default() -> NodeHealth {
        NodeHealth {
            alive: true,
            streak: 0,
            answered: false,
        }
    }
}

impl NodeHealth {
    pub fn alive(&self) -> bool {
        self.alive
    }

    /// A matching reply arrived.
    pub fn answer(&mut self) {
        self.answered = true;
    }

    /// Closes a round; true when the verdict changed.
    pub fn end_round(&mut self, misses: u32, rises: u32) -> bool {
        let hit = std::mem::take(&mut self.answered);
        if self.alive == hit {
            self.streak = 0;
            return false;
        }
        self.streak += 1;
        let needed = if self.alive { misses } else { rises };
        if self.streak >= needed.max(1) {
            self.alive = !self.alive;
            self.streak = 0;
            return true;
        }
        false
    }
}

/// One echo request to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Echo {
    pub to: IpAddr,
    pub seq: u16,
}

/// The probes of a target set: rounds on an explicit clock, replies, verdicts.
#[derive(Debug)]
pub struct Probes {
    settings: Settings,
    nodes: BTreeMap<String, NodeHealth>,
    /// Address → node.
    owners: HashMap<IpAddr, String>,
    /// Sequence number of the current round.
    seq: u16,
    /// When the next round starts.
    next: Instant,
    /// The round in progress was started (replies before the first round are stray).
    started: bool,
}

impl Probes {
    pub fn new(settings: Settings, now: Instant) -> Probes {
        Probes {
            settings,
            nodes: BTreeMap::new(),
            owners: HashMap::new(),
            seq: 0,
            next: now,
            started: false,
        }
    }

    /// Replaces the target set: nodes that stay keep their state, new ones start alive.
    pub fn set_targets(&mut self, targets: &Targets) {
        self.nodes.retain(|n, _| targets.contains_key(n));
        self.owners.clear();
        for (name, addrs) in targets {
            self.nodes.entry(name.clone()).or_default();
            for a in addrs {
                self.owners.insert(*a, name.clone());
            }
        }
    }

    /// When [`Probes::poll`] has work next.
    pub fn next_due(&self) -> Instant {
        self.next
    }

    /// At or after [`Probes::next_due`]: closes the round in progress (verdicts) and starts the
    /// next one, returning the echoes to send and the nodes whose verdict changed. Before it:
    /// nothing. A late call starts one round, not the ones it missed, and that round lasts a
    /// full interval.
    pub fn poll(&mut self, now: Instant) -> (Vec<Echo>, Vec<(String, bool)>) {
        if now < self.next {
            return (Vec::new(), Vec::new());
        }
        let mut changed = Vec::new();
        if self.started {
            let probed: BTreeSet<&String> = self.owners.values().collect();
            for (name, h) in &mut self.nodes {
                // Nodes without an address are never probed: alive.
                if !probed.contains(name) {
                    continue;
                }
                if h.end_round(self.settings.misses, self.settings.rises) {
                    changed.push((name.clone(), h.alive));
                }
            }
        }
        self.started = true;
        self.seq = self.seq.wrapping_add(1);
        self.next += self.settings.interval;
        if self.next <= now {
            // Late (a stalled runtime): this round still lasts a full interval.
            self.next = now + self.settings.interval;
        }
        let mut echoes: Vec<Echo> = self
            .owners
            .keys()
            .map(|&to| Echo { to, seq: self.seq })
            .collect();
        echoes.sort_by_key(|e| e.to);
        (echoes, changed)
    }

    /// An echo reply from `from` to sequence number `seq`: counts for the round in progress
    /// when it answers one of the last `misses` rounds. Returns the node it counted for.
    pub fn reply(&mut self, from: IpAddr, seq: u16) -> Option<&str> {
        let age = self.seq.wrapping_sub(seq);
        if !self.started || u32::from(age) >= self.settings.misses.max(1) {
            return None;
        }
        let node = self.owners.get(&from)?;
        self.nodes.get_mut(node)?.answer();
        Some(node)
    }

    /// The raw verdict of a node (`None`: not a target).
    pub fn alive(&self, node: &str) -> Option<bool> {
        self.nodes.get(node).map(|h| h.alive)
    }

    /// Whether the dead are too many to be believed: more than half of two or more probed
    /// nodes (the prober's own network, or a flood at its node drowning the replies, is the
    /// likelier failure; with two, both dead leaves nowhere to move their IPs anyway).
    pub fn self_suspect(&self) -> bool {
        let owners: BTreeSet<&String> = self.owners.values().collect();
        let probed: Vec<&NodeHealth> = self
            .nodes
            .iter()
            .filter(|(n, _)| owners.contains(n))
            .map(|(_, h)| h)
            .collect();
        let dead = probed.iter().filter(|h| !h.alive).count();
        probed.len() >= 2 && dead * 2 > probed.len()
    }

    /// The verdicts to publish: every target, all alive while [`Probes::self_suspect`].
    pub fn verdicts(&self) -> Verdicts {
        let suspect = self.self_suspect();
        self.nodes
            .iter()
            .map(|(n, h)| (n.clone(), suspect || h.alive))
            .collect()
    }
}

/// Runs the probes of the targets it is given and publishes the verdicts on `verdicts` until
/// `targets` closes or every verdict receiver is gone. Disabled settings publish nothing
/// (every node healthy).
pub async fn run(
    settings: Settings,
    key: Option<ProbeKey>,
    mut targets: watch::Receiver<Targets>,
    verdicts: watch::Sender<Verdicts>,
    sign: watch::Receiver<bool>,
) {
    if !settings.enabled() {
        info!("EgressIP node probes are off: nodes are judged by Node Ready only");
        let _ = targets.wait_for(|_| false).await;
        return;
    }
    let mut sockets = match Sockets::open(key, sign) {
        Ok(s) => s,
        Err(e) => {
            warn!(
                "EgressIP node probes: cannot open ICMP sockets ({e}; CAP_NET_RAW?): \
                 nodes are judged by Node Ready only"
            );
            let _ = targets.wait_for(|_| false).await;
            return;
        }
    };
    let mut probes = Probes::new(settings, Instant::now());
    {
        let t = targets.borrow_and_update();
        probes.set_targets(&t);
        sockets.set_targets(&t);
    }
    let mut suspect = false;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(probes.next_due()) => {
                let (echoes, changed) = probes.poll(Instant::now());
                for e in &echoes {
                    if let Err(err) = sockets.send(e.to, e.seq) {
                        debug!("EgressIP probe to {}: {err}", e.to);
                    }
                }
                for (node, alive) in &changed {
                    if *alive {
                        info!("EgressIP probe: node {node} answers again: alive");
                    } else {
                        warn!(
                            "EgressIP probe: node {node} did not answer {} rounds of {:?}: dead",
                            settings.misses, settings.interval
                        );
                    }
                }
                let now_suspect = probes.self_suspect();
                if now_suspect != suspect {
                    suspect = now_suspect;
                    if suspect {
                        warn!("EgressIP probe: most nodes do not answer; this node's network is \
                               suspect: every node is taken for alive");
                    } else {
                        info!("EgressIP probe: most nodes answer again");
                    }
                }
                super::publish(&verdicts, probes.verdicts());
                if verdicts.is_closed() {
                    return;
                }
            }
            Some((from, seq)) = sockets.replies.recv() => {
                probes.reply(from, seq);
            }
            changed = targets.changed() => {
                if changed.is_err() {
                    return;
                }
                let t = targets.borrow_and_update();
                probes.set_targets(&t);
                sockets.set_targets(&t);
            }
        }
    }
}

/// The probe sockets: one connected raw socket per probed address.
struct Sockets {
    conns: HashMap<IpAddr, Conn>,
    /// Matching replies of every socket, `(source, sequence)`.
    replies: mpsc::Receiver<(IpAddr, u16)>,
    replies_tx: mpsc::Sender<(IpAddr, u16)>,
    ident: u16,
    key: Option<ProbeKey>,
    /// The assigner's probes (leading): signed; a standby's: no magic.
    sign: watch::Receiver<bool>,
    /// Random per prober run: the probed nodes count replays per session.
    session: u64,
    counter: std::sync::atomic::AtomicU64,
}

pub(super) const ICMP_ECHO_REPLY: u8 = 0;
pub(super) const ICMP_ECHO: u8 = 8;
pub(super) const ICMP6_ECHO: u8 = 128;
pub(super) const ICMP6_ECHO_REPLY: u8 = 129;

impl Sockets {
    fn open(key: Option<ProbeKey>, sign: watch::Receiver<bool>) -> std::io::Result<Sockets> {
        // The probe sockets are opened per address later; one of each family now tells
        // whether raw sockets can be opened at all (CAP_NET_RAW).
        let v4 = raw(AddressFamily::Inet, SockProtocol::Icmp);
        let v6 = raw(AddressFamily::Inet6, SockProtocol::IcmpV6);
        if let (Err(e), Err(_)) = (v4, v6) {
            return Err(e);
        }
        // Distinguishes this prober's replies from other pings' to the same address.
        let ident = (std::process::id() as u16)
            ^ (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos() as u16)
                .unwrap_or(0));
        let (replies_tx, replies) = mpsc::channel(REPLY_QUEUE);
        Ok(Sockets {
            conns: HashMap::new(),
            replies,
            replies_tx,
            ident,
            key,
            sign,
            session: random_session(),
            counter: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Opens a socket for each new address of `targets`, closes those of the addresses gone.
    fn set_targets(&mut self, targets: &Targets) {
        let want: BTreeSet<IpAddr> = targets.values().flatten().copied().collect();
        self.conns.retain(|a, _| want.contains(a));
        for &to in &want {
            if self.conns.contains_key(&to) {
                continue;
            }
            match Conn::open(to, self.ident, self.replies_tx.clone()) {
                Ok(c) => {
                    self.conns.insert(to, c);
                }
                // The address stays without a socket (retried on the next targets): its echoes
                // fail and its node misses, which is warned when it turns dead. Debug only: a
                // host without IPv6 given IPv6 InternalIPs would warn on every snapshot.
                Err(e) => debug!("EgressIP probe: cannot open an ICMP socket to {to}: {e}"),
            }
        }
    }

    /// The payload of the next echo to `to`: signed when there is a key.
    fn payload(&self, to: IpAddr) -> [u8; PAYLOAD_LEN] {
        if !*self.sign.borrow() {
            return [0u8; PAYLOAD_LEN];
        }
        let Some(key) = &self.key else {
            let mut p = [0u8; PAYLOAD_LEN];
            p[..8].copy_from_slice(probe_auth::MAGIC);
            return p;
        };
        let counter = self
            .counter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let stamp = Stamp {
            session: self.session,
            counter,
            unix_ms: probe_auth::unix_ms_now(),
        };
        probe_auth::sign(key, stamp, to)
    }

    fn send(&self, to: IpAddr, seq: u16) -> std::io::Result<()> {
        let conn = self
            .conns
            .get(&to)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotConnected))?;
        // The kernel computes the ICMPv6 checksum, not the ICMP one.
        let pkt = match to {
            IpAddr::V4(_) => echo(ICMP_ECHO, self.ident, seq, &self.payload(to), true),
            IpAddr::V6(_) => echo(ICMP6_ECHO, self.ident, seq, &self.payload(to), false),
        };
        conn.sock.try_send(&pkt)?;
        Ok(())
    }
}

/// Replies waiting for the prober: a few per round at most get through the connected sockets
/// (only the probed addresses' packets); more are dropped, never buffered without bound.
const REPLY_QUEUE: usize = 1024;

/// A raw ICMP socket connected to one probed address and its reader task (stopped on drop).
struct Conn {
    sock: std::sync::Arc<UdpSocket>,
    reader: tokio::task::JoinHandle<()>,
}

impl Conn {
    fn open(to: IpAddr, ident: u16, replies: mpsc::Sender<(IpAddr, u16)>) -> std::io::Result<Conn> {
        let (family, proto) = match to {
            IpAddr::V4(_) => (AddressFamily::Inet, SockProtocol::Icmp),
            IpAddr::V6(_) => (AddressFamily::Inet6, SockProtocol::IcmpV6),
        };
        let std_sock = std::net::UdpSocket::from(raw(family, proto)?);
        // connect() on a raw socket makes the kernel deliver only packets from `to` to it
        // (the port is ignored).
        std_sock.connect(SocketAddr::new(to, 0))?;
        let sock = std::sync::Arc::new(UdpSocket::from_std(std_sock)?);
        let reader = tokio::spawn(read_replies(sock.clone(), to, ident, replies));
        Ok(Conn { sock, reader })
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Forwards the echo replies to this prober that arrive on `sock` (connected to `from`).
async fn read_replies(
    sock: std::sync::Arc<UdpSocket>,
    from: IpAddr,
    ident: u16,
    replies: mpsc::Sender<(IpAddr, u16)>,
) {
    let mut buf = vec![0u8; 2048];
    loop {
        match sock.recv(&mut buf).await {
            Ok(n) => {
                if let Some(r) = parse_reply(from.is_ipv4(), &buf[..n], Some(from), ident) {
                    // Full: the prober is far behind; a dropped reply is a miss at worst.
                    let _ = replies.try_send(r);
                }
            }
            Err(e) => {
                // ICMP errors queued on the socket (e.g. unreachable) come back as errors.
                debug!("EgressIP probe: receive from {from}: {e}");
            }
        }
    }
}

/// A session id no other prober run picks (replays are counted per session): from the
/// kernel's random source, or from the clock and the pid if it cannot answer.
fn random_session() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        (nanos as u64) ^ (u64::from(std::process::id()) << 32)
    })
}

/// A raw socket in tokio's reactor. It is handed to tokio as a `UdpSocket`: a raw ICMP socket
/// is a datagram socket, and `UdpSocket` only calls `sendto`/`recvfrom` on it (the port of the
/// address is ignored for raw sockets). Tokio's own wrappers for arbitrary descriptors are
/// `unsafe` (`AsyncFd::register`) or deprecated as unsound (`AsyncFd::new`).
pub(super) fn datagram(fd: OwnedFd) -> std::io::Result<UdpSocket> {
    UdpSocket::from_std(std::net::UdpSocket::from(fd))
}

pub(super) fn raw(family: AddressFamily, proto: SockProtocol) -> std::io::Result<OwnedFd> {
    Ok(socket::socket(
        family,
        SockType::Raw,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        proto,
    )?)
}

/// An echo request: type, code 0, checksum, identifier, sequence, the probe payload.
pub(super) fn echo(
    type_: u8,
    ident: u16,
    seq: u16,
    payload: &[u8; PAYLOAD_LEN],
    checksum: bool,
) -> [u8; 8 + PAYLOAD_LEN] {
    let mut p = [0u8; 8 + PAYLOAD_LEN];
    p[0] = type_;
    p[4..6].copy_from_slice(&ident.to_be_bytes());
    p[6..8].copy_from_slice(&seq.to_be_bytes());
    p[8..].copy_from_slice(payload);
    if checksum {
        let sum = inet_checksum(&p);
        p[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    p
}

/// An echo reply with identifier `ident`: IPv4 raw packets start with the IP header, IPv6
/// ones with the ICMPv6 header.
fn parse_reply(v4: bool, pkt: &[u8], from: Option<IpAddr>, ident: u16) -> Option<(IpAddr, u16)> {
    let (icmp, want, src) = if v4 {
        let ihl = usize::from(*pkt.first()? & 0x0f) * 4;
        let src = Ipv4Addr::from(<[u8; 4]>::try_from(pkt.get(12..16)?).ok()?);
        (pkt.get(ihl..)?, ICMP_ECHO_REPLY, IpAddr::V4(src))
    } else {
        let IpAddr::V6(src) = from? else {
            return None;
        };
        (pkt, ICMP6_ECHO_REPLY, IpAddr::V6(src))
    };
    if icmp.len() < 8 || icmp[0] != want || icmp[1] != 0 {
        return None;
    }
    if u16::from_be_bytes([icmp[4], icmp[5]]) != ident {
        return None;
    }
    Some((src, u16::from_be_bytes([icmp[6], icmp[7]])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::egress_ip::ip;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    fn targets(nodes: &[(&str, &[&str])]) -> Targets {
        nodes
            .iter()
            .map(|(n, a)| (n.to_string(), a.iter().map(|s| ip(s)).collect()))
            .collect()
    }

    /// Runs one round at `t`: returns its echoes and verdict changes.
    fn round(p: &mut Probes, t: Instant) -> (Vec<Echo>, Vec<(String, bool)>) {
        assert!(p.next_due() <= t, "round due at {:?}", p.next_due());
        p.poll(t)
    }

    #[test]
    fn node_health_hysteresis() {
        let mut h = NodeHealth::default();
        assert!(h.alive());
        // Two misses, an answer: the streak restarts.
        assert!(!h.end_round(3, 2));
        assert!(!h.end_round(3, 2));
        h.answer();
        assert!(!h.end_round(3, 2));
        assert!(!h.end_round(3, 2));
        assert!(!h.end_round(3, 2));
        assert!(h.end_round(3, 2));
        assert!(!h.alive());
        // One answer is not enough to come back, and a miss restarts the count.
        h.answer();
        assert!(!h.end_round(3, 2));
        assert!(!h.end_round(3, 2));
        h.answer();
        assert!(!h.end_round(3, 2));
        h.answer();
        assert!(h.end_round(3, 2));
        assert!(h.alive());
    }

    /// Probes from `t0` every 100 ms, dead after `misses`, alive again after `rises`.
    fn every_100ms(t0: Instant, misses: u32, rises: u32) -> Probes {
        let settings = Settings {
            interval: 100 * MS,
            misses,
            rises,
        };
        Probes::new(settings, t0)
    }

    #[test]
    fn rounds_on_an_explicit_clock_declare_dead_and_alive() {
        let t0 = Instant::now();
        let mut p = every_100ms(t0, 3, 2);
        p.set_targets(&targets(&[
            ("a", &["10.0.0.1", "fd00::1"]),
            ("b", &["10.0.0.2"]),
            ("noaddr", &[]),
        ]));
        // Before the first round every target is alive.
        assert_eq!(p.verdicts().values().filter(|a| **a).count(), 3);
        let (echoes, changed) = round(&mut p, t0);
        assert_eq!(echoes.len(), 3);
        assert!(changed.is_empty());
        let seq = echoes[0].seq;
        assert!(echoes.iter().all(|e| e.seq == seq));
        // Not due yet: nothing.
        assert_eq!(p.poll(t0 + 50 * MS), (vec![], vec![]));

        // a answers on its IPv6 address only, b never; unknown addresses do not count.
        let mut t = t0;
        for i in 1..=3 {
            assert_eq!(p.reply(ip("fd00::1"), p.seq), Some("a"));
            assert_eq!(p.reply(ip("10.0.0.9"), p.seq), None);
            t += 100 * MS;
            let (_, changed) = round(&mut p, t);
            if i < 3 {
                assert!(changed.is_empty(), "round {i}: {changed:?}");
            } else {
                // Dead 300 ms after the round whose echo it never answered started.
                assert_eq!(changed, vec![("b".to_string(), false)]);
            }
        }
        assert_eq!(p.alive("a"), Some(true));
        assert_eq!(p.alive("b"), Some(false));
        assert!(p.verdicts()["noaddr"]);

        // b answers a stale round (older than `misses`): not counted. Then two rounds: alive.
        assert_eq!(p.reply(ip("10.0.0.2"), p.seq.wrapping_sub(3)), None);
        for i in 1..=2 {
            p.reply(ip("10.0.0.1"), p.seq);
            // A late reply to the previous round counts.
            assert_eq!(p.reply(ip("10.0.0.2"), p.seq.wrapping_sub(1)), Some("b"));
            t += 100 * MS;
            let (_, changed) = round(&mut p, t);
            assert_eq!(
                changed,
                if i == 2 {
                    vec![("b".to_string(), true)]
                } else {
                    vec![]
                }
            );
        }

        // A late poll runs one round and schedules the next from now.
        t += 1000 * MS;
        let (echoes, _) = round(&mut p, t);
        assert_eq!(echoes.len(), 3);
        assert_eq!(p.next_due(), t + 100 * MS);
        assert_eq!(p.poll(t + 99 * MS), (vec![], vec![]));

        // Targets change: b keeps its state, a goes, c starts alive.
        p.set_targets(&targets(&[("b", &["10.0.0.2"]), ("c", &["10.0.0.3"])]));
        assert_eq!(p.alive("a"), None);
        assert_eq!(p.alive("c"), Some(true));
        assert_eq!(p.reply(ip("10.0.0.1"), p.seq), None);
    }

    #[test]
    fn most_nodes_dead_suspects_the_prober() {
        let t0 = Instant::now();
        let mut p = every_100ms(t0, 1, 1);
        p.set_targets(&targets(&[
            ("a", &["10.0.0.1"]),
            ("b", &["10.0.0.2"]),
            ("c", &["10.0.0.3"]),
        ]));
        p.poll(t0);
        // One of three dead: believed.
        p.reply(ip("10.0.0.1"), p.seq);
        p.reply(ip("10.0.0.2"), p.seq);
        p.poll(t0 + 100 * MS);
        assert!(!p.self_suspect());
        assert!(!p.verdicts()["c"]);
        // Two of three: every node published alive, the raw verdicts kept.
        p.reply(ip("10.0.0.1"), p.seq);
        p.poll(t0 + 200 * MS);
        assert!(p.self_suspect());
        assert!(p.verdicts().values().all(|a| *a));
        assert_eq!(p.alive("b"), Some(false));
    }

    /// Exactly two probed nodes (two egress-assignable nodes): one dead is believed (the
    /// other can take its IPs); both dead at once is the prober's own trouble (its network, or
    /// a flood of ICMP at its node drowning the replies) far likelier than two failures, and
    /// there would be nowhere to move the IPs anyway.
    #[test]
    fn two_probed_nodes_both_dead_suspects_the_prober() {
        let t0 = Instant::now();
        let mut p = every_100ms(t0, 1, 1);
        p.set_targets(&targets(&[("a", &["10.0.0.1"]), ("b", &["10.0.0.2"])]));
        p.poll(t0);
        p.reply(ip("10.0.0.1"), p.seq);
        p.poll(t0 + 100 * MS);
        assert!(!p.self_suspect());
        assert!(!p.verdicts()["b"]);
        p.poll(t0 + 200 * MS);
        assert!(p.self_suspect());
        assert!(p.verdicts().values().all(|a| *a));
        // One probed node: its verdict is all there is.
        p.set_targets(&targets(&[("a", &["10.0.0.1"])]));
        assert!(!p.self_suspect());
    }

    use probe_auth::NO_KEY;

    #[test]
    fn with_a_key_each_echo_is_signed_for_its_target_with_a_new_counter() {
        let key = ProbeKey::new(&[3; 32]).unwrap();
        let (replies_tx, replies) = mpsc::channel(1);
        let s = Sockets {
            conns: HashMap::new(),
            replies,
            replies_tx,
            ident: 1,
            key: Some(key.clone()),
            sign: watch::channel(true).1,
            session: 42,
            counter: std::sync::atomic::AtomicU64::new(0),
        };
        let to = ip("10.0.0.2");
        let (a, b) = (s.payload(to), s.payload(to));
        let mut v = probe_auth::Verifier::new(key);
        let now = probe_auth::unix_ms_now();
        let got = v.accept(&a, &[to], now).unwrap();
        assert_eq!((got.session, got.counter), (42, 1));
        assert_eq!(v.accept(&b, &[to], now).unwrap().counter, 2);
        assert_eq!(v.accept(&b, &[to], now), Err(probe_auth::Refused::Replay));
        let unsigned = Sockets { key: None, ..s };
        assert_eq!(unsigned.payload(to), NO_KEY);
        // A standby's probes (not leading) carry no magic: no fence looks at them.
        let standby = Sockets {
            sign: watch::channel(false).1,
            ..unsigned
        };
        assert_eq!(standby.payload(to), [0; PAYLOAD_LEN]);
        let v6 = echo(ICMP6_ECHO, 1, 1, &standby.payload(to), false);
        let parse = super::super::probe_listener::parse_request;
        assert_eq!(parse(false, &v6, Some(ip("fd00::9")), 2), None);
    }

    #[test]
    fn echo_packets_and_replies() {
        let p = echo(ICMP_ECHO, 0x1234, 7, &NO_KEY, true);
        assert_eq!(&p[..8], &[8, 0, p[2], p[3], 0x12, 0x34, 0, 7]);
        // A correct checksum sums to zero.
        assert_eq!(inet_checksum(&p), 0);
        // An IPv4 reply: a 20-byte header from 10.0.0.2, then the ICMP echo reply.
        let mut pkt = vec![
            0x45, 0, 0, 36, 0, 0, 0, 0, 64, 1, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1,
        ];
        let mut r = echo(ICMP_ECHO_REPLY, 0x1234, 7, &NO_KEY, true).to_vec();
        pkt.append(&mut r);
        assert_eq!(
            parse_reply(true, &pkt, None, 0x1234),
            Some((ip("10.0.0.2"), 7))
        );
        // Another prober's reply, a request, a truncated packet.
        assert_eq!(parse_reply(true, &pkt, None, 0x1235), None);
        pkt[20] = ICMP_ECHO;
        assert_eq!(parse_reply(true, &pkt, None, 0x1234), None);
        assert_eq!(parse_reply(true, &pkt[..24], None, 0x1234), None);
        // IPv6: the source comes from the socket address.
        let from = ip("fd00::2");
        let r6 = echo(ICMP6_ECHO_REPLY, 9, 65535, &NO_KEY, false);
        assert_eq!(
            parse_reply(false, &r6, Some(from), 9),
            Some((ip("fd00::2"), 65535))
        );
    }
}
