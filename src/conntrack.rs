//! Deletes stale UDP conntrack entries of services (ctnetlink over a netlink socket, in
//! process): those of backends that went away, and those that met no endpoint at a frontend
//! that now has one (never DNATed). Without this a UDP client that keeps its source port
//! keeps being sent to the dead backend, or past the service, for as long as it sends (each
//! packet refreshes the entry).

use crate::nft::nftnl::kept::Kept;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple, Protocol,
    Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};
use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;

mod flows;

pub use crate::plan::services::{ConntrackReconciled, UdpFrontend};

/// The services' side effect after each commit: a deleted flow's next packet picks a live
/// backend, or reaches the frontend that now has one. What it did per family is kept for
/// the metrics (kube-proxy's `conntrack_reconciler_*`).
impl crate::plan::Output for crate::plan::services::ServicesOutput {
    fn after_commit(&mut self) -> Result<(), String> {
        let done = delete_stale_udp_flows(&self.stale_udp, &self.new_udp_frontends)
            .map_err(|e| format!("conntrack: stale UDP service flows not deleted: {e}"))?;
        self.conntrack = done;
        Ok(())
    }
}

/// Deletes, in one dump of the table, the UDP entries
/// - whose reply comes from one of `backends` (address, port): flows DNATed to a backend that
///   went away;
/// - whose original destination is one of `frontends` and that were not DNATed (the reply
///   comes from the original destination): flows that met no endpoint there and would keep
///   missing the DNAT now that it has one. DNATed flows to them are left alone.
///
/// Returns how long each family took and how many entries it deleted (IPv4, IPv6), or
/// `None` when there was nothing to look for (no dump is made).
pub fn delete_stale_udp_flows(
    backends: &[(IpAddr, u16)],
    frontends: &[UdpFrontend],
) -> io::Result<Option<[ConntrackReconciled; 2]>> {
    if backends.is_empty() && frontends.is_empty() {
        return Ok(None);
    }
    let backends: BTreeSet<(IpAddr, u16)> = backends.iter().copied().collect();
    let frontends: BTreeSet<UdpFrontend> = frontends.iter().copied().collect();
    delete_matching(|orig, reply| {
        let (from, to) = (udp_source(reply), udp_endpoint(orig, Side::Destination));
        let to_dead_backend =
            from.is_some_and(|src| backends.contains(&src)) && udp_source(orig) != from;
        let missed_frontend = to.is_some_and(|(ip, port)| {
            from == to
                && (frontends.contains(&UdpFrontend::Addr(ip, port))
                    || frontends.contains(&UdpFrontend::NodePort(port)))
        });
        to_dead_backend || missed_frontend
    })
    .map(Some)
}

/// Deletes the entries for which `doomed(original, reply)` holds, in both families; returns
/// the time and deletions of each (IPv4, IPv6).
fn delete_matching(
    doomed: impl Fn(&[Tuple], &[Tuple]) -> bool,
) -> io::Result<[ConntrackReconciled; 2]> {
    with_socket(|sock| delete_matching_on(sock, &doomed))
}

fn delete_matching_on(
    sock: &Socket,
    doomed: &impl Fn(&[Tuple], &[Tuple]) -> bool,
) -> io::Result<[ConntrackReconciled; 2]> {
    let mut done = [ConntrackReconciled::default(); 2];
    for (i, family) in [NetfilterProtoFamily::IPv4, NetfilterProtoFamily::IPv6]
        .into_iter()
        .enumerate()
    {
        let started = std::time::Instant::now();
        let mut deleted = 0;
        let doomed: Vec<Vec<Tuple>> = dump(sock, family)?
            .into_iter()
            .filter(|(orig, reply, _)| doomed(orig, reply))
            .map(|(orig, _, _)| orig)
            .collect();
        for orig in doomed {
            match request(
                sock,
                family,
                ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(orig)]),
                NLM_F_REQUEST | NLM_F_ACK,
            ) {
                Ok(_) => deleted += 1,
                // Gone meanwhile (expired, or deleted by someone else): fine.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        done[i] = ConntrackReconciled {
            took: started.elapsed(),
            deleted,
        };
    }
    Ok(done)
}

/// The (original source, original destination) addresses of every live conntrack entry, both
/// families, in one dump each: which destinations still have flows, and from whom. A TCP
/// entry is live while opening or established (a closed connection's entry lingers in
/// TIME_WAIT for two minutes); other protocols' entries live until they time out.
pub fn flow_endpoints() -> io::Result<BTreeSet<(IpAddr, IpAddr)>> {
    with_socket(flow_endpoints_on)
}

fn flow_endpoints_on(sock: &Socket) -> io::Result<BTreeSet<(IpAddr, IpAddr)>> {
    let mut out = BTreeSet::new();
    for family in [NetfilterProtoFamily::IPv4, NetfilterProtoFamily::IPv6] {
        send(
            sock,
            family,
            ConntrackMessage::Get(vec![]),
            NLM_F_REQUEST | NLM_F_DUMP,
        )?;
        let mut entries = Vec::new();
        while !flows::read(&sock.recv_from_full()?.0, &mut entries)? {}
        // nf_conntrack_tcp: 1 SYN_SENT, 2 SYN_RECV, 3 ESTABLISHED, 9 SYN_SENT2.
        out.extend(
            entries
                .into_iter()
                .filter(|(_, _, tcp)| tcp.is_none_or(|s| matches!(s, 1..=3 | 9)))
                .map(|(src, dst, _)| (src, dst)),
        );
    }
    Ok(out)
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Source,
    Destination,
}

/// The UDP source (address, port) of a tuple.
fn udp_source(tuple: &[Tuple]) -> Option<(IpAddr, u16)> {
    udp_endpoint(tuple, Side::Source)
}

/// The UDP source or destination (address, port) of a tuple.
fn udp_endpoint(tuple: &[Tuple], side: Side) -> Option<(IpAddr, u16)> {
    let mut ip = None;
    let (mut udp, mut port) = (false, None);
    for t in tuple {
        match t {
            Tuple::Ip(ips) => {
                for i in ips {
                    match (i, side) {
                        (IPTuple::SourceAddress(a), Side::Source)
                        | (IPTuple::DestinationAddress(a), Side::Destination) => ip = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(ps) => {
                for p in ps {
                    match p {
                        ProtoTuple::Protocol(Protocol::Udp) => udp = true,
                        ProtoTuple::SourcePort(sp) if side == Side::Source => port = Some(*sp),
                        ProtoTuple::DestinationPort(dp) if side == Side::Destination => {
                            port = Some(*dp)
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some((ip?, port.filter(|_| udp)?))
}

/// (original, reply, TCP state if TCP).
type Tuples = (Vec<Tuple>, Vec<Tuple>, Option<u8>);

/// Every entry of one family as (original, reply) tuples and its TCP state.
fn dump(sock: &Socket, family: NetfilterProtoFamily) -> io::Result<Vec<Tuples>> {
    let replies = request(
        sock,
        family,
        ConntrackMessage::Get(vec![]),
        NLM_F_REQUEST | NLM_F_DUMP,
    )?;
    Ok(replies
        .into_iter()
        .filter_map(|m| {
            let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) = m.inner else {
                return None;
            };
            let (mut orig, mut reply, mut tcp_state) = (None, None, None);
            for a in attrs {
                match a {
                    ConntrackAttribute::CtaTupleOrig(t) => orig = Some(t),
                    ConntrackAttribute::CtaTupleReply(t) => reply = Some(t),
                    ConntrackAttribute::CtaProtoInfo(infos) => {
                        for info in infos {
                            if let ProtoInfo::TCP(tcp) = info {
                                for t in tcp {
                                    if let ProtoInfoTCP::State(s) = t {
                                        tcp_state = Some(s);
                                    }
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
            Some((orig?, reply?, tcp_state))
        })
        .collect())
}

/// Sockets kept between calls: closing one stalls the node's nf_tables commits for an RCU
/// grace period ([`crate::nft::nftnl::kept`]).
static SOCKETS: Kept<Socket> = Kept::new();

/// Runs `exchange` on a kept socket (or a new one) and keeps the socket for the next call
/// when it succeeded; after an error it may hold half a dump, so it is closed.
fn with_socket<T>(exchange: impl FnOnce(&Socket) -> io::Result<T>) -> io::Result<T> {
    let sock = match SOCKETS.take() {
        Some(sock) => sock,
        None => {
            let mut sock = Socket::new(NETLINK_NETFILTER)?;
            sock.bind_auto()?;
            sock.connect(&SocketAddr::new(0, 0))?;
            sock
        }
    };
    let out = exchange(&sock)?;
    SOCKETS.give_back(sock);
    Ok(out)
}

/// Sends one request and collects the replies until DONE (dump) or the ACK.
fn request(
    sock: &Socket,
    family: NetfilterProtoFamily,
    msg: ConntrackMessage,
    flags: u16,
) -> io::Result<Vec<NetfilterMessage>> {
    send(sock, family, msg, flags)?;
    let mut out = Vec::new();
    loop {
        let (data, _) = sock.recv_from_full()?;
        let mut offset = 0;
        while offset < data.len() {
            let msg = NetlinkMessage::<NetfilterMessage>::deserialize(&data[offset..])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = msg.header.length as usize;
            if len == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "empty netlink message",
                ));
            }
            offset += len.next_multiple_of(4);
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => {
                    return match e.code {
                        None => Ok(out),
                        Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                    };
                }
                NetlinkPayload::InnerMessage(m) => out.push(m),
                _ => {}
            }
        }
    }
}

/// Sends one request (sequence number 1: a socket only ever has one exchange under way).
fn send(
    sock: &Socket,
    family: NetfilterProtoFamily,
    msg: ConntrackMessage,
    flags: u16,
) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = 1;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            msg,
        )),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    sock.send(&buf, 0)?;
    Ok(())
}
