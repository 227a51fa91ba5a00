//! The NFLOG side of ACL logging: a NETLINK_NETFILTER socket bound to one NFULNL group, and
//! the decoding of what the kernel sends on it (each packet's prefix and first bytes).
//!
//! The kernel copies at most [`COPY_RANGE`] bytes of each packet (the IP and L4 headers),
//! batches up to [`QUEUE_THRESHOLD`] packets or [`FLUSH`] worth into one datagram, and
//! drops what does not fit the socket's receive buffer (`ENOBUFS` here, counted): the reader
//! never holds more than one datagram.

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nflog::{
    ConfigCmd, ConfigMode, ConfigNla, PacketNla, ULogMessage, config_request,
};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::{AsyncSocket, AsyncSocketExt, TokioSocket, protocols::NETLINK_NETFILTER};
use std::io;
use std::time::Duration;

/// Bytes of each packet the kernel copies: an IPv6 header and a TCP header fit.
pub const COPY_RANGE: u32 = 128;
/// Packets the kernel batches into one datagram at most.
pub const QUEUE_THRESHOLD: u32 = 32;
/// Longest the kernel holds a batch back.
pub const FLUSH: Duration = Duration::from_millis(50);
/// The socket's receive buffer; beyond it the kernel drops log messages (never packets).
const RCVBUF: usize = 1 << 20;
/// One datagram: a batch of [`QUEUE_THRESHOLD`] packets is ~10 KB.
pub const RECV_BUF: usize = 1 << 16;

/// One logged packet: its prefix and first bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Logged {
    pub prefix: String,
    pub payload: Vec<u8>,
}

/// A socket bound to NFLOG group `group`.
pub struct Reader {
    socket: TokioSocket,
}

impl Reader {
    /// Binds `group` (fails with `EBUSY` when another socket holds it).
    pub async fn bind(group: u16) -> io::Result<Reader> {
        let mut socket = TokioSocket::new(NETLINK_NETFILTER)?;
        socket.socket_mut().bind_auto()?;
        socket.socket_mut().set_rx_buf_sz(RCVBUF)?;
        let hundredths = (FLUSH.as_millis() / 10) as u32;
        let config: Vec<ConfigNla> = vec![
            ConfigCmd::Bind.into(),
            ConfigMode::new_packet(COPY_RANGE).into(),
            ConfigNla::QThresh(QUEUE_THRESHOLD),
            netlink_packet_netfilter::nflog::Timeout::new(hundredths).into(),
        ];
        let request = config_request(NetfilterProtoFamily::Unspec, group, config);
        let mut buf = vec![0; request.buffer_len()];
        request.serialize(&mut buf);
        socket.send(&buf).await?;
        let mut reply = bytes::BytesMut::with_capacity(RECV_BUF);
        socket.recv(&mut reply).await?;
        match NetlinkMessage::<NetfilterMessage>::deserialize(&reply) {
            Ok(NetlinkMessage {
                payload: NetlinkPayload::Error(e),
                ..
            }) => match e.code {
                None => Ok(Reader { socket }),
                Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
            },
            other => Err(io::Error::other(format!("unexpected reply: {other:?}"))),
        }
    }

    /// Waits for the next datagram into `buf` (cleared first) and decodes its packets.
    /// `Err` with `ENOBUFS`: the kernel dropped log messages; reading goes on.
    pub async fn next(&mut self, buf: &mut bytes::BytesMut) -> io::Result<Vec<Logged>> {
        buf.clear();
        self.socket.recv(buf).await?;
        Ok(decode(buf))
    }
}

/// The packets of one datagram (what is not a packet message is skipped).
pub fn decode(mut datagram: &[u8]) -> Vec<Logged> {
    let mut out = Vec::new();
    while !datagram.is_empty() {
        let Ok(message) = NetlinkMessage::<NetfilterMessage>::deserialize(datagram) else {
            break;
        };
        let len = (message.header.length as usize).next_multiple_of(4);
        if len == 0 || len > datagram.len() {
            break;
        }
        datagram = &datagram[len..];
        if let NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::ULog(ULogMessage::Packet(nlas)),
            ..
        }) = message.payload
        {
            out.push(logged(nlas));
        }
    }
    out
}

fn logged(nlas: Vec<PacketNla>) -> Logged {
    let mut l = Logged::default();
    for nla in nlas {
        match nla {
            PacketNla::Prefix(p) => l.prefix = p.to_string_lossy().into_owned(),
            PacketNla::Payload(p) => l.payload = p,
            _ => {}
        }
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_netfilter::NetfilterHeader;
    use std::ffi::CString;

    fn packet_message(prefix: &str, payload: &[u8]) -> Vec<u8> {
        let nlas = vec![
            PacketNla::Mark(0),
            PacketNla::Prefix(CString::new(prefix).unwrap()),
            PacketNla::Payload(payload.to_vec()),
        ];
        let mut m = NetlinkMessage::from(NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 100),
            ULogMessage::Packet(nlas),
        ));
        m.finalize();
        let mut buf = vec![0; m.buffer_len()];
        m.serialize(&mut buf);
        buf
    }

    #[test]
    fn a_datagram_of_several_packets_decodes_each_and_stops_at_garbage() {
        let mut datagram = packet_message("acl:0123456789abcdef", &[0x45, 1, 2]);
        datagram.extend(packet_message("other", &[0x60]));
        let got = decode(&datagram);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].prefix, "acl:0123456789abcdef");
        assert_eq!(got[0].payload, [0x45, 1, 2]);
        assert_eq!(got[1].prefix, "other");
        // Truncated or garbage input ends decoding, it never panics.
        datagram.extend([0xff; 7]);
        assert_eq!(decode(&datagram).len(), 2);
        assert!(decode(&datagram[..10]).is_empty());
        assert!(decode(&[]).is_empty());
    }
}
