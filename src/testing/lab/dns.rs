//! A DNS server and a pod-side stub resolver for the lab (UDP and TCP, built on
//! hickory-proto): the server answers A queries from a [`Zone`] the test changes while it
//! runs, can rotate answers (every query a new address) and can truncate UDP answers, so the
//! client's TCP fallback is exercised.

use super::netns::Ns;
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server answers.
#[derive(Debug, Clone, Default)]
pub struct Zone {
    /// name (lowercase, no trailing dot) -> (addresses, TTL).
    pub fixed: BTreeMap<String, (Vec<Ipv4Addr>, u32)>,
    /// name -> (first address, TTL): query `n` (from 0) is answered `first + n`.
    pub rotating: BTreeMap<String, (Ipv4Addr, u32)>,
    /// UDP answers carry TC and no records: clients must retry over TCP.
    pub truncate_udp: bool,
    /// How long the server waits before each UDP answer (a slow resolver; one at a time).
    pub udp_delay: Duration,
}

/// The server; stops when dropped.
pub struct DnsServer {
    zone: Arc<Mutex<Zone>>,
    stop: Arc<AtomicBool>,
    /// Queries answered (UDP and TCP).
    served: Arc<AtomicU64>,
    /// The distinct source addresses of the queries (the proxy asks from the node).
    sources: Arc<Mutex<BTreeSet<IpAddr>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl DnsServer {
    /// Serves `bind` (UDP and TCP) inside `ns`.
    pub fn start(ns: &Ns, bind: SocketAddr, zone: Zone) -> DnsServer {
        let (udp, tcp) = ns.enter(move || {
            let udp = UdpSocket::bind(bind).expect("bind DNS server (udp)");
            let tcp = TcpListener::bind(bind).expect("bind DNS server (tcp)");
            (udp, tcp)
        });
        udp.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        tcp.set_nonblocking(true).unwrap();
        let zone = Arc::new(Mutex::new(zone));
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let counter = Arc::new(AtomicU64::new(0));
        let sources = Arc::new(Mutex::new(BTreeSet::new()));
        let state = (zone.clone(), stop.clone(), served.clone(), counter.clone());
        let udp_sources = sources.clone();
        let udp_thread = std::thread::spawn(move || {
            let (zone, stop, served, counter) = state;
            let mut buf = [0u8; 4096];
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, peer)) = udp.recv_from(&mut buf) else {
                    continue;
                };
                if let Some(r) = respond(&buf[..n], &zone, &counter, true) {
                    let delay = zone.lock().unwrap().udp_delay;
                    if !delay.is_zero() {
                        std::thread::sleep(delay);
                    }
                    served.fetch_add(1, Ordering::Relaxed);
                    udp_sources.lock().unwrap().insert(peer.ip());
                    let _ = udp.send_to(&r, peer);
                }
            }
        });
        let state = (zone.clone(), stop.clone(), served.clone(), counter);
        let tcp_sources = sources.clone();
        let tcp_thread = std::thread::spawn(move || {
            let (zone, stop, served, counter) = state;
            while !stop.load(Ordering::Relaxed) {
                let Ok((mut conn, peer)) = tcp.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                tcp_sources.lock().unwrap().insert(peer.ip());
                let _ = conn.set_nonblocking(false);
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                while let Some(q) = read_framed(&mut conn) {
                    let Some(r) = respond(&q, &zone, &counter, false) else {
                        break;
                    };
                    served.fetch_add(1, Ordering::Relaxed);
                    if write_framed(&mut conn, &r).is_err() {
                        break;
                    }
                }
            }
        });
        DnsServer {
            zone,
            stop,
            served,
            sources,
            threads: vec![udp_thread, tcp_thread],
        }
    }

    /// Changes what the server answers from now on.
    pub fn update(&self, f: impl FnOnce(&mut Zone)) {
        f(&mut self.zone.lock().unwrap());
    }

    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// The distinct sources of the queries since the last call (and forgets them).
    pub fn take_sources(&self) -> BTreeSet<IpAddr> {
        std::mem::take(&mut self.sources.lock().unwrap())
    }

    /// Looks `name` up from `ns` at `at` (this server, or an address that reaches it):
    /// `Ok` only if answered and asked from `via` (the node's address: the proxy forwarded
    /// it), else what happened.
    pub fn lookup_via(
        &self,
        ns: &Ns,
        at: SocketAddr,
        name: &str,
        via: IpAddr,
        timeout: Duration,
    ) -> Result<Lookup, String> {
        let _ = self.take_sources();
        let got = lookup(ns, at, name, timeout);
        let sources = self.take_sources();
        match got {
            Ok(l) if sources.contains(&via) => Ok(l),
            got => Err(format!("{got:?}, asked from {sources:?}, not {via}")),
        }
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn respond(query: &[u8], zone: &Mutex<Zone>, counter: &AtomicU64, udp: bool) -> Option<Vec<u8>> {
    let q = Message::from_vec(query).ok()?;
    let question = q.queries.first()?.clone();
    let mut r = Message::response(q.metadata.id, OpCode::Query);
    r.metadata.recursion_desired = true;
    r.metadata.recursion_available = true;
    r.add_query(question.clone());
    let name = question.name().to_lowercase().to_ascii();
    let name = name.trim_end_matches('.');
    let zone = zone.lock().unwrap();
    if udp && zone.truncate_udp {
        r.metadata.truncation = true;
        return r.to_vec().ok();
    }
    if question.query_type() == RecordType::A {
        let (addrs, ttl) = if let Some((first, ttl)) = zone.rotating.get(name) {
            let n = counter.fetch_add(1, Ordering::Relaxed) as u32;
            (
                vec![Ipv4Addr::from(u32::from(*first).wrapping_add(n))],
                *ttl,
            )
        } else if let Some((addrs, ttl)) = zone.fixed.get(name) {
            (addrs.clone(), *ttl)
        } else {
            r.metadata.response_code = ResponseCode::NXDomain;
            (Vec::new(), 0)
        };
        for a in addrs {
            r.add_answer(Record::from_rdata(
                question.name().clone(),
                ttl,
                RData::A(A(a)),
            ));
        }
    }
    r.to_vec().ok()
}

/// An answer with ID `id` to an A query for `name` (no trailing dot) with `addrs`: what a
/// server sends, or what a pod forges.
pub fn a_answer(id: u16, name: &str, addrs: &[Ipv4Addr], ttl: u32) -> Vec<u8> {
    let name = Name::from_ascii(format!("{name}.")).expect("a valid name");
    let mut r = Message::response(id, OpCode::Query);
    r.metadata.recursion_desired = true;
    r.metadata.recursion_available = true;
    r.add_query(Query::query(name.clone(), RecordType::A));
    for a in addrs {
        r.add_answer(Record::from_rdata(name.clone(), ttl, RData::A(A(*a))));
    }
    r.to_vec().expect("encodes")
}

/// A one-question A query with ID `id` for `name` (no trailing dot): what a pod's resolver
/// library sends.
pub fn a_query(name: &str, id: u16) -> Vec<u8> {
    let mut q = Message::query();
    q.metadata.id = id;
    let name = Name::from_ascii(format!("{name}.")).expect("a valid name");
    q.add_query(Query::query(name, RecordType::A));
    q.to_vec().expect("encodes")
}

fn read_framed(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 2];
    conn.read_exact(&mut len).ok()?;
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    conn.read_exact(&mut msg).ok()?;
    Some(msg)
}

fn write_framed(conn: &mut TcpStream, msg: &[u8]) -> std::io::Result<()> {
    let mut framed = (msg.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(msg);
    conn.write_all(&framed)
}

/// What a lookup got: the A addresses, and whether it took the TCP fallback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    pub addrs: Vec<Ipv4Addr>,
    pub over_tcp: bool,
}

/// Looks `name` up (A) from inside `ns` at `server`, as a stub resolver does: UDP, and TCP
/// when the answer is truncated. `Err` on timeout or an unparsable answer.
pub fn lookup(
    ns: &Ns,
    server: SocketAddr,
    name: &str,
    timeout: Duration,
) -> Result<Lookup, String> {
    lookup_in(ns, server, name, timeout, false)
}

/// Looks `name` up in `ns` at `server` over UDP, then straight over TCP, each followed at
/// once by a connection to port 80 of its first address: that address and whether the
/// connection opened within `connect` (for a steered pod: learned before the answer
/// reached it).
pub fn lookup_and_connect(
    ns: &Ns,
    server: SocketAddr,
    name: &str,
    (timeout, connect): (Duration, Duration),
) -> [Result<(Ipv4Addr, bool), String>; 2] {
    [false, true].map(|tcp| {
        let got = match tcp {
            true => lookup_tcp(ns, server, name, timeout),
            false => lookup(ns, server, name, timeout),
        }?;
        let addr = *got.addrs.first().ok_or("no address")?;
        Ok((
            addr,
            ns.tcp_connect(format!("{addr}:80"), connect).is_reply(),
        ))
    })
}

/// [`lookup`] from the calling thread's netns.
pub fn lookup_here(server: SocketAddr, name: &str, timeout: Duration) -> Result<Lookup, String> {
    lookup_with(server, name, timeout, false)
}

/// [`lookup`] straight over TCP (no UDP attempt first).
pub fn lookup_tcp(
    ns: &Ns,
    server: SocketAddr,
    name: &str,
    timeout: Duration,
) -> Result<Lookup, String> {
    lookup_in(ns, server, name, timeout, true)
}

fn lookup_in(
    ns: &Ns,
    server: SocketAddr,
    name: &str,
    timeout: Duration,
    tcp_only: bool,
) -> Result<Lookup, String> {
    let name = name.to_string();
    ns.enter(move || lookup_with(server, &name, timeout, tcp_only))
}

fn lookup_with(
    server: SocketAddr,
    name: &str,
    timeout: Duration,
    tcp_only: bool,
) -> Result<Lookup, String> {
    let mut q = Message::query();
    q.metadata.message_type = MessageType::Query;
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(
        Name::from_str(&format!("{name}.")).map_err(|e| e.to_string())?,
        RecordType::A,
    ));
    let bytes = q.to_vec().map_err(|e| e.to_string())?;
    if tcp_only {
        let answer = tcp_exchange(server, &bytes, timeout)?;
        return finish(&q, answer, true);
    }
    let local = if server.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    };
    let udp = UdpSocket::bind(local).map_err(|e| e.to_string())?;
    udp.set_read_timeout(Some(timeout)).unwrap();
    udp.send_to(&bytes, server).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 4096];
    let (n, from) = udp.recv_from(&mut buf).map_err(|e| format!("udp: {e}"))?;
    if from != server {
        return Err(format!("answer from {from}, asked {server}"));
    }
    let mut answer = Message::from_vec(&buf[..n]).map_err(|e| e.to_string())?;
    let mut over_tcp = false;
    if answer.metadata.truncation {
        over_tcp = true;
        answer = tcp_exchange(server, &bytes, timeout)?;
    }
    finish(&q, answer, over_tcp)
}

fn tcp_exchange(server: SocketAddr, query: &[u8], timeout: Duration) -> Result<Message, String> {
    let mut conn = TcpStream::connect_timeout(&server, timeout).map_err(|e| format!("tcp: {e}"))?;
    conn.set_read_timeout(Some(timeout)).unwrap();
    write_framed(&mut conn, query).map_err(|e| e.to_string())?;
    let reply = read_framed(&mut conn).ok_or("tcp: no answer")?;
    Message::from_vec(&reply).map_err(|e| e.to_string())
}

fn finish(q: &Message, answer: Message, over_tcp: bool) -> Result<Lookup, String> {
    if answer.metadata.id != q.metadata.id {
        return Err("answer to another query".into());
    }
    let addrs = answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    Ok(Lookup { addrs, over_tcp })
}

/// Sends one UDP datagram with a forged IPv4 source (a raw socket with its own IP header, as
/// a pod with CAP_NET_RAW can) from inside `ns`.
pub fn send_spoofed_udp(
    ns: &Ns,
    src: std::net::SocketAddrV4,
    dst: std::net::SocketAddrV4,
    payload: &[u8],
) -> std::io::Result<()> {
    let packet = spoofed_udp_packet(src, dst, payload);
    ns.enter(move || send_raw(&raw_ipv4_socket()?, &packet, dst))
}

/// An IPv4 UDP datagram from `src` to `dst` with its own header, for [`send_raw`].
pub fn spoofed_udp_packet(
    src: std::net::SocketAddrV4,
    dst: std::net::SocketAddrV4,
    payload: &[u8],
) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let total = 20 + udp_len;
    let mut packet = Vec::with_capacity(total);
    // IPv4 header: version 4, IHL 5, total length, TTL 64, UDP; the kernel fills in the
    // checksum and the ID of a raw packet with its own header.
    packet.extend_from_slice(&[0x45, 0]);
    packet.extend_from_slice(&(total as u16).to_be_bytes());
    packet.extend_from_slice(&[0, 0, 0, 0, 64, 17, 0, 0]);
    packet.extend_from_slice(&src.ip().octets());
    packet.extend_from_slice(&dst.ip().octets());
    // UDP header, checksum 0 (none, allowed over IPv4).
    packet.extend_from_slice(&src.port().to_be_bytes());
    packet.extend_from_slice(&dst.port().to_be_bytes());
    packet.extend_from_slice(&(udp_len as u16).to_be_bytes());
    packet.extend_from_slice(&[0, 0]);
    packet.extend_from_slice(payload);
    packet
}

/// A raw IPv4 socket that sends packets with their own header, in the calling thread's
/// namespace (open it inside [`Ns::spawn`] to send many packets from a pod).
pub fn raw_ipv4_socket() -> std::io::Result<std::os::fd::OwnedFd> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};
    Ok(socket(
        AddressFamily::Inet,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Raw,
    )?)
}

/// Sends a packet built by [`spoofed_udp_packet`] on a [`raw_ipv4_socket`].
pub fn send_raw(
    fd: &std::os::fd::OwnedFd,
    packet: &[u8],
    dst: std::net::SocketAddrV4,
) -> std::io::Result<()> {
    use nix::sys::socket::{MsgFlags, SockaddrIn, sendto};
    use std::os::fd::AsRawFd;
    sendto(
        fd.as_raw_fd(),
        packet,
        &SockaddrIn::from(dst),
        MsgFlags::empty(),
    )?;
    Ok(())
}

/// Sends one UDP datagram with a forged IPv6 source from inside `ns` (a raw IPv6
/// `IPPROTO_RAW` socket writes its own header, as with [`send_spoofed_udp`]).
pub fn send_spoofed_udp6(
    ns: &Ns,
    src: std::net::SocketAddrV6,
    dst: std::net::SocketAddrV6,
    payload: &[u8],
) -> std::io::Result<()> {
    use nix::sys::socket::{
        AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn6, sendto, socket,
    };
    use std::os::fd::AsRawFd;
    let packet = spoofed_udp6_packet(src, dst, payload);
    ns.enter(move || {
        let fd = socket(
            AddressFamily::Inet6,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::Raw,
        )?;
        // A raw socket's destination port must be 0 (or its protocol).
        let to = std::net::SocketAddrV6::new(*dst.ip(), 0, 0, dst.scope_id());
        sendto(
            fd.as_raw_fd(),
            &packet,
            &SockaddrIn6::from(to),
            MsgFlags::empty(),
        )?;
        Ok(())
    })
}

/// An IPv6 UDP datagram from `src` to `dst` with its own header and a correct checksum
/// (mandatory over IPv6: a receiver drops a datagram without one).
pub fn spoofed_udp6_packet(
    src: std::net::SocketAddrV6,
    dst: std::net::SocketAddrV6,
    payload: &[u8],
) -> Vec<u8> {
    let udp_len = (8 + payload.len()) as u16;
    let mut udp = Vec::with_capacity(udp_len.into());
    udp.extend_from_slice(&src.port().to_be_bytes());
    udp.extend_from_slice(&dst.port().to_be_bytes());
    udp.extend_from_slice(&udp_len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    // The checksum over the pseudo-header (addresses, length, next header) and the datagram.
    let mut pseudo = Vec::with_capacity(40 + udp.len());
    pseudo.extend_from_slice(&src.ip().octets());
    pseudo.extend_from_slice(&dst.ip().octets());
    pseudo.extend_from_slice(&u32::from(udp_len).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 17]);
    pseudo.extend_from_slice(&udp);
    let mut sum: u32 = (pseudo.chunks(2))
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let checksum = match !(sum as u16) {
        0 => 0xffff, // 0 means "no checksum", which IPv6 does not allow
        c => c,
    };
    udp[6..8].copy_from_slice(&checksum.to_be_bytes());
    // IPv6 header: version 6, no traffic class or flow label, payload length, UDP, hop limit 64.
    let mut packet = vec![0x60, 0, 0, 0];
    packet.extend_from_slice(&udp_len.to_be_bytes());
    packet.extend_from_slice(&[17, 64]);
    packet.extend_from_slice(&src.ip().octets());
    packet.extend_from_slice(&dst.ip().octets());
    packet.extend_from_slice(&udp);
    packet
}
