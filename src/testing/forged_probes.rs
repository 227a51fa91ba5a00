//! What an attacker on a node can do to the EgressIP fence: capture a real probe as it
//! reaches the node, replay probes the node never saw, and send echo requests to the node
//! from a pod, with any payload and any IPv4 source address (a raw `IPPROTO_RAW` socket
//! writes the IP header itself).

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::socket::{self, AddressFamily, SockFlag, SockProtocol, SockType, SockaddrIn};

use crate::controller::egress_ip::probe_auth::{self, ProbeKey, Stamp};
use crate::testing::lab::Ns;

/// The payload every probe carried before probes were authenticated.
pub const OLD_PAYLOAD: &[u8; 8] = b"nodeplan";

/// Waits in `ns` for an ICMP echo request from `from` and returns its ICMP part (header and
/// payload), as a replay would send it.
pub fn capture_echo_request(ns: &Ns, from: Ipv4Addr, within: Duration) -> Vec<u8> {
    ns.enter(|| {
        let fd = socket::socket(
            AddressFamily::Inet,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::Icmp,
        )
        .expect("raw ICMP socket");
        let sock = std::net::UdpSocket::from(fd);
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("read timeout");
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 2048];
        while Instant::now() < deadline {
            let Ok(n) = sock.recv(&mut buf) else {
                continue;
            };
            let pkt = &buf[..n];
            let ihl = usize::from(pkt[0] & 0x0f) * 4;
            if pkt.len() > ihl + 8 && pkt[12..16] == from.octets() && pkt[ihl] == 8 {
                return pkt[ihl..].to_vec();
            }
        }
        panic!("no echo request from {from} within {within:?}");
    })
}

/// The echo requests `ns`'s kernel has received (`Icmp: InEchos` of `/proc/net/snmp`): what
/// reached the node, whatever its sockets then did with it.
pub fn echo_requests_received(ns: &Ns) -> u64 {
    let snmp = ns.run(&["cat", "/proc/net/snmp"]);
    let mut icmp = snmp.lines().filter(|l| l.starts_with("Icmp: "));
    let (names, values) = (icmp.next(), icmp.next());
    let (Some(names), Some(values)) = (names, values) else {
        panic!("no Icmp lines in /proc/net/snmp:\n{snmp}");
    };
    let at = names
        .split_whitespace()
        .position(|n| n == "InEchos")
        .expect("an InEchos column");
    values
        .split_whitespace()
        .nth(at)
        .and_then(|v| v.parse().ok())
        .expect("an InEchos value")
}

/// An echo request (type 8) with `payload`, checksummed.
pub fn echo_request(ident: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![8, 0, 0, 0];
    p.extend_from_slice(&ident.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(payload);
    let sum = crate::net::announce::inet_checksum(&p);
    p[2..4].copy_from_slice(&sum.to_be_bytes());
    p
}

/// A probe to `target` signed with `key` and stamped now: what an attacker holds who
/// captured, within `probe_auth::MAX_SKEW`, a probe on its way to a node that never saw it
/// (on the segment while the node was cut off, say). A test holding the cluster's key makes
/// a fresh one per round, standing for a stream of such captures.
pub fn unseen_probe(key: &ProbeKey, counter: u64, target: Ipv4Addr) -> Vec<u8> {
    let stamp = Stamp {
        session: UNSEEN_SESSION,
        counter,
        unix_ms: probe_auth::unix_ms_now(),
    };
    let payload = probe_auth::sign(key, stamp, IpAddr::V4(target));
    echo_request(0x4e50, counter as u16, &payload)
}

/// The session of [`unseen_probe`]'s probes (any session the node has not seen counts).
const UNSEEN_SESSION: u64 = 0x0bad_5e55_1011;

/// Sends every `(source, ICMP message)` to `dst` from `ns` every `interval` until dropped.
pub struct Forger {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Forger {
    pub fn start(
        ns: &Ns,
        dst: Ipv4Addr,
        packets: Vec<(Ipv4Addr, Vec<u8>)>,
        interval: Duration,
    ) -> Forger {
        Forger::start_with(ns, dst, interval, move || packets.clone())
    }

    /// Like [`Forger::start`], with the packets of each round made by `make` (fresh
    /// stamps and counters).
    pub fn start_with(
        ns: &Ns,
        dst: Ipv4Addr,
        interval: Duration,
        mut make: impl FnMut() -> Vec<(Ipv4Addr, Vec<u8>)> + Send + 'static,
    ) -> Forger {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (s, count) = (stop.clone(), sent.clone());
        let thread = ns.spawn(move || {
            let fd = socket::socket(
                AddressFamily::Inet,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::Raw,
            )
            .expect("raw IP socket");
            let to = SockaddrIn::from(SocketAddrV4::new(dst, 0));
            while !s.load(Ordering::Relaxed) {
                for (src, icmp) in &make() {
                    let pkt = ipv4(*src, dst, icmp);
                    if socket::sendto(
                        std::os::fd::AsRawFd::as_raw_fd(&fd),
                        &pkt,
                        &to,
                        socket::MsgFlags::empty(),
                    )
                    .is_ok()
                    {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(interval);
            }
        });
        Forger {
            stop,
            sent,
            thread: Some(thread),
        }
    }

    /// Packets sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

/// The forger's packets sent, and the echo requests `ns` received, since [`Reach::start`].
/// The counters are read in the order that never counts a packet as sent but not received:
/// received first at the start (reading `/proc/net/snmp` forks a process, slow on a busy
/// machine, and packets sent meanwhile would land in the baseline: a run under load saw
/// "31 of 42 replays reached the node" that way), sent first at the end.
pub struct Reach<'a> {
    forger: &'a Forger,
    ns: &'a Ns,
    sent0: u64,
    received0: u64,
}

impl<'a> Reach<'a> {
    pub fn start(forger: &'a Forger, ns: &'a Ns) -> Reach<'a> {
        let received0 = echo_requests_received(ns);
        let sent0 = forger.sent();
        Reach {
            forger,
            ns,
            sent0,
            received0,
        }
    }

    /// (sent, received) so far.
    pub fn counts(&self) -> (u64, u64) {
        let sent = self.forger.sent() - self.sent0;
        (sent, echo_requests_received(self.ns) - self.received0)
    }
}

impl Drop for Forger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An IPv4 packet carrying `icmp` (the kernel fills in the header checksum and the ID).
fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, icmp: &[u8]) -> Vec<u8> {
    let len = (20 + icmp.len()) as u16;
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&len.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, 1, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(icmp);
    p
}

/// The IPv4 address of `ip`, for callers holding an `IpAddr`.
pub fn v4(ip: IpAddr) -> Ipv4Addr {
    match ip {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => panic!("{a}: the forger sends IPv4 only"),
    }
}
