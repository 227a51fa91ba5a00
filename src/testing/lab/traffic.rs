//! Real packets: echo servers that report the peer they saw, TCP/UDP probes, ping.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, SockaddrStorage};
use nix::sys::{socket::sockopt, time::TimeVal};

use super::netns::Ns;

/// How often server loops look at their stop flag.
const POLL: Duration = Duration::from_millis(20);

/// What a lab server answers: its tag, the client address it saw (proves SNAT/DNAT), and for
/// UDP the TOS byte it received (`tos >> 2` is the DSCP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub server: String,
    pub peer: SocketAddr,
    pub tos: Option<u8>,
}

impl Reply {
    pub fn src_ip(&self) -> IpAddr {
        self.peer.ip()
    }

    pub fn dscp(&self) -> Option<u8> {
        self.tos.map(|t| t >> 2)
    }

    fn encode(server: &str, peer: SocketAddr, tos: Option<u8>) -> String {
        let tos = tos.map_or("-".to_string(), |t| t.to_string());
        format!("{server} {} {tos}\n", canonical(peer))
    }

    fn decode(text: &str) -> Option<Reply> {
        let mut it = text.split_whitespace();
        let (server, peer, tos) = (it.next()?, it.next()?.parse().ok()?, it.next()?);
        let tos = if tos == "-" {
            None
        } else {
            Some(tos.parse().ok()?)
        };
        Some(Reply {
            server: server.into(),
            peer,
            tos,
        })
    }
}

/// Result of a TCP connect or UDP exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Reply(Reply),
    /// TCP RST or ICMP port unreachable (nft `reject`, closed port).
    Refused,
    /// ICMP host/net unreachable or prohibited, or a local EPERM/EACCES.
    Unreachable(String),
    /// No answer in time (nft `drop`, no route back).
    Timeout,
}

impl Outcome {
    #[track_caller]
    pub fn expect_reply(self) -> Reply {
        match self {
            Outcome::Reply(r) => r,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    pub fn is_reply(&self) -> bool {
        matches!(self, Outcome::Reply(_))
    }

    fn from_io(err: io::Error, ctx: &str) -> Outcome {
        use nix::errno::Errno as E;
        match err.raw_os_error().map(E::from_raw) {
            Some(E::ECONNREFUSED | E::ECONNRESET) => Outcome::Refused,
            Some(E::EHOSTUNREACH | E::ENETUNREACH | E::EPERM | E::EACCES) => {
                Outcome::Unreachable(err.to_string())
            }
            // EINPROGRESS: a blocking connect whose SO_SNDTIMEO expired.
            Some(E::EINPROGRESS | E::EAGAIN | E::ETIMEDOUT) => Outcome::Timeout,
            _ => panic!("{ctx}: unexpected error: {err}"),
        }
    }
}

/// A TCP or UDP server thread inside a netns; stops and joins on drop.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// The bound address (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Ns {
    /// TCP server on `bind` (e.g. "0.0.0.0:8080", "[::]:0"): every connection gets one
    /// `Reply` line naming `tag` and the peer, then is closed.
    pub fn tcp_server(&self, bind: impl ToSocketAddrs, tag: &str) -> Server {
        let (bind, tag) = (first_addr(bind), checked_tag(tag));
        self.start_server(move |stop| {
            let listener = TcpListener::bind(bind)?;
            listener.set_nonblocking(true)?;
            let addr = listener.local_addr()?;
            Ok((addr, move || serve_tcp(listener, &tag, &stop)))
        })
    }

    /// UDP server on `bind`: answers each datagram with a `Reply` (including the TOS seen).
    pub fn udp_server(&self, bind: impl ToSocketAddrs, tag: &str) -> Server {
        let (bind, tag) = (first_addr(bind), checked_tag(tag));
        self.start_server(move |stop| {
            let sock = UdpSocket::bind(bind)?;
            // IP_RECVTOS also covers v4-mapped traffic on a dual-stack [::] socket.
            socket::setsockopt(&sock, sockopt::IpRecvTos, &true)?;
            if bind.is_ipv6() {
                socket::setsockopt(&sock, sockopt::Ipv6RecvTClass, &true)?;
            }
            sock.set_read_timeout(Some(POLL))?;
            let addr = sock.local_addr()?;
            Ok((addr, move || serve_udp(sock, &tag, &stop)))
        })
    }

    /// Binds in the netns, then hands the serving loop to a thread that stays there.
    fn start_server<L, S>(&self, setup: S) -> Server
    where
        L: FnOnce() + Send + 'static,
        S: FnOnce(Arc<AtomicBool>) -> io::Result<(SocketAddr, L)> + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let stop2 = stop.clone();
        let name = self.name().to_string();
        let thread = self.spawn(move || match setup(stop2) {
            Ok((addr, serve)) => {
                let _ = tx.send(Ok(addr));
                serve();
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        });
        match rx.recv() {
            Ok(Ok(addr)) => Server {
                addr,
                stop,
                thread: Some(thread),
            },
            Ok(Err(e)) => panic!("server in netns {name}: {e}"),
            Err(_) => panic!(
                "server thread in netns {name} died: {:?}",
                thread.join().err()
            ),
        }
    }

    /// TCP connect (from any source) and read the server's reply, all within `timeout`.
    pub fn tcp_connect(&self, dst: impl ToSocketAddrs, timeout: Duration) -> Outcome {
        self.tcp_probe(None, first_addr(dst), timeout)
    }

    /// Like `tcp_connect`, bound to source address `src` first.
    pub fn tcp_connect_from(&self, src: IpAddr, dst: impl ToSocketAddrs, t: Duration) -> Outcome {
        self.tcp_probe(Some(src), first_addr(dst), t)
    }

    /// Like `tcp_connect`, from source address and port `src` (`SO_REUSEADDR`: the same
    /// 4-tuple again, as a client that reuses its port).
    pub fn tcp_connect_from_port(&self, src: SocketAddr, dst: SocketAddr, t: Duration) -> Outcome {
        let ctx = format!("tcp {src} -> {dst} in {}", self.name());
        self.enter(move || match tcp_exchange_from(Some(src), dst, t) {
            Ok(text) => Reply::decode(&text)
                .map(Outcome::Reply)
                .unwrap_or_else(|| panic!("{ctx}: not a lab reply: {text:?}")),
            Err(e) => Outcome::from_io(e, &ctx),
        })
    }

    fn tcp_probe(&self, src: Option<IpAddr>, dst: SocketAddr, timeout: Duration) -> Outcome {
        let ctx = format!("tcp {src:?} -> {dst} in {}", self.name());
        self.enter(move || match tcp_exchange(src, dst, timeout) {
            Ok(text) => Reply::decode(&text)
                .map(Outcome::Reply)
                .unwrap_or_else(|| panic!("{ctx}: not a lab reply: {text:?}")),
            Err(e) => Outcome::from_io(e, &ctx),
        })
    }

    /// Sends a datagram to `dst` (re-sent every 200 ms) and waits for a reply up to `timeout`.
    pub fn udp_exchange(&self, dst: impl ToSocketAddrs, timeout: Duration) -> Outcome {
        self.udp_probe(None, first_addr(dst), timeout)
    }

    /// Like `udp_exchange`, from source address `src`.
    pub fn udp_exchange_from(&self, src: IpAddr, dst: impl ToSocketAddrs, t: Duration) -> Outcome {
        self.udp_probe(Some(src), first_addr(dst), t)
    }

    /// Like `udp_exchange`, sending with this TOS / IPv6 traffic class byte (DSCP << 2 | ECN).
    pub fn udp_exchange_tos(&self, dst: impl ToSocketAddrs, tos: u8, t: Duration) -> Outcome {
        self.udp_probe_tos(None, first_addr(dst), Some(tos), t)
    }

    fn udp_probe(&self, src: Option<IpAddr>, dst: SocketAddr, timeout: Duration) -> Outcome {
        self.udp_probe_tos(src, dst, None, timeout)
    }

    fn udp_probe_tos(
        &self,
        src: Option<IpAddr>,
        dst: SocketAddr,
        tos: Option<u8>,
        timeout: Duration,
    ) -> Outcome {
        let ctx = format!("udp {src:?} -> {dst} (tos {tos:?}) in {}", self.name());
        self.enter(move || match udp_exchange(src, dst, tos, timeout) {
            Ok(text) => Reply::decode(&text)
                .map(Outcome::Reply)
                .unwrap_or_else(|| panic!("{ctx}: not a lab reply: {text:?}")),
            Err(e) => Outcome::from_io(e, &ctx),
        })
    }

    /// True if `addr` answers ICMP echo within 2 s (a request every 200 ms until one reply).
    /// Needs `ping` (iputils-ping).
    pub fn ping(&self, addr: impl std::fmt::Display) -> bool {
        let addr = addr.to_string();
        match self.exec(&["ping", "-n", "-c", "1", "-i", "0.2", "-w", "2", &addr]) {
            Ok(_) => true,
            // ip netns exec reports a missing binary as "exec of \"ping\" failed".
            Err(e) if e.stderr.contains("exec of") => panic!("ping unavailable: {e}"),
            Err(_) => false,
        }
    }
}

fn tcp_exchange(src: Option<IpAddr>, dst: SocketAddr, timeout: Duration) -> io::Result<String> {
    tcp_exchange_from(src.map(|ip| SocketAddr::new(ip, 0)), dst, timeout)
}

fn tcp_exchange_from(
    src: Option<SocketAddr>,
    dst: SocketAddr,
    timeout: Duration,
) -> io::Result<String> {
    let deadline = Instant::now() + timeout;
    let family = if dst.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    if let Some(src) = src {
        if src.port() != 0 {
            socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
        }
        socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(src))?;
    }
    // A blocking connect honours SO_SNDTIMEO and fails with EINPROGRESS when it expires.
    socket::setsockopt(&fd, sockopt::SendTimeout, &timeval(timeout))?;
    socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(dst))?;
    let mut stream = TcpStream::from(fd);
    stream.set_read_timeout(Some(remaining(deadline)))?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

fn udp_exchange(
    src: Option<IpAddr>,
    dst: SocketAddr,
    tos: Option<u8>,
    timeout: Duration,
) -> io::Result<String> {
    let deadline = Instant::now() + timeout;
    let any: IpAddr = if dst.is_ipv4() {
        [0u8; 4].into()
    } else {
        [0u16; 8].into()
    };
    let sock = UdpSocket::bind(SocketAddr::new(src.unwrap_or(any), 0))?;
    // UDP keeps the ECN bits of IP_TOS (TCP would clear them).
    match tos.map(i32::from) {
        Some(t) if dst.is_ipv4() => socket::setsockopt(&sock, sockopt::Ipv4Tos, &t)?,
        Some(t) => socket::setsockopt(&sock, sockopt::Ipv6TClass, &t)?,
        None => {}
    }
    sock.connect(dst)?;
    let mut buf = [0u8; 512];
    loop {
        sock.send(b"lab")?;
        let wait = remaining(deadline).min(Duration::from_millis(200));
        sock.set_read_timeout(Some(wait))?;
        match sock.recv(&mut buf) {
            Ok(n) => return Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) if is_timeout(&e) && Instant::now() < deadline => continue,
            Err(e) => return Err(e),
        }
    }
}

fn serve_tcp(listener: TcpListener, tag: &str, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut conn, peer)) => {
                let _ = conn.write_all(Reply::encode(tag, peer, None).as_bytes());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(e) => eprintln!("lab tcp server {tag}: accept: {e}"),
        }
    }
}

fn serve_udp(sock: UdpSocket, tag: &str, stop: &AtomicBool) {
    let mut buf = [0u8; 512];
    let mut cmsg = nix::cmsg_space!(i32);
    while !stop.load(Ordering::Relaxed) {
        let mut iov = [io::IoSliceMut::new(&mut buf)];
        let msg = match socket::recvmsg::<SockaddrStorage>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::empty(),
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EAGAIN) => continue,
            Err(e) => {
                eprintln!("lab udp server {tag}: recvmsg: {e}");
                continue;
            }
        };
        let tos = msg
            .cmsgs()
            .ok()
            .into_iter()
            .flatten()
            .find_map(|c| match c {
                socket::ControlMessageOwned::Ipv4Tos(t) => Some(t),
                socket::ControlMessageOwned::Ipv6TClass(t) => Some(t as u8),
                _ => None,
            });
        let Some(peer) = msg.address.and_then(sockaddr_to_std) else {
            continue;
        };
        let _ = sock.send_to(Reply::encode(tag, peer, tos).as_bytes(), peer);
    }
}

fn sockaddr_to_std(sa: SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = sa.as_sockaddr_in() {
        return Some(SocketAddr::V4((*v4).into()));
    }
    sa.as_sockaddr_in6().map(|v6| SocketAddr::V6((*v6).into()))
}

/// v4-mapped IPv6 peers (dual-stack listeners) are reported as plain IPv4.
fn canonical(peer: SocketAddr) -> SocketAddr {
    SocketAddr::new(peer.ip().to_canonical(), peer.port())
}

fn first_addr(a: impl ToSocketAddrs) -> SocketAddr {
    a.to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .expect("a socket address such as \"10.0.0.1:80\" or \"[fd00::1]:80\"")
}

fn checked_tag(tag: &str) -> String {
    assert!(
        !tag.is_empty() && !tag.contains(char::is_whitespace),
        "server tag {tag:?} must be one non-empty word"
    );
    tag.to_string()
}

fn remaining(deadline: Instant) -> Duration {
    // Zero would mean "no timeout" to set_read_timeout; keep a floor.
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn timeval(d: Duration) -> TimeVal {
    // Zero would mean "block forever".
    let d = d.max(Duration::from_millis(1));
    TimeVal::new(d.as_secs() as _, d.subsec_micros() as _)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

impl Ns {
    /// A minimal HTTP/1.1 `GET path` to `addr` from this netns (e.g. the agent's `/readyz`):
    /// Ok((status code, body)), Err with the reason if nothing parseable came back.
    pub fn http_get(
        &self,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<(u16, String), String> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n");
        let text = self.enter(move || -> io::Result<String> {
            let mut s = TcpStream::connect_timeout(&addr, timeout)?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            s.write_all(request.as_bytes())?;
            let mut text = String::new();
            s.read_to_string(&mut text)?;
            Ok(text)
        });
        let text = text.map_err(|e| format!("GET http://{addr}{path}: {e}"))?;
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("GET http://{addr}{path}: not HTTP: {text:?}"))?;
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Ok((code, body.to_string()))
    }

    /// Waits up to `within` until `GET path` on `addr` answers `code` with a body containing
    /// `needle`; returns that body.
    #[track_caller]
    pub fn wait_http(
        &self,
        addr: SocketAddr,
        path: &str,
        code: u16,
        needle: &str,
        within: Duration,
    ) -> String {
        super::eventually(within, || {
            match self.http_get(addr, path, Duration::from_secs(5)) {
                Ok((c, body)) if c == code && body.contains(needle) => Ok(body),
                other => Err(format!(
                    "GET {path}: want {code} with {needle:?}, got {other:?}"
                )),
            }
        })
    }
}
