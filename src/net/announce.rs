//! Neighbour announcements for addresses the agent adds: gratuitous ARP (IPv4) and unsolicited
//! neighbour advertisements (IPv6), sent as raw Ethernet frames through `AF_PACKET` channels.
//! (The kernel sends neither when an address is added; `ndisc_notify` covers link events, not a
//! `nodad` address add.)
//!
//! The socket is opened by the caller's thread, so it lives in the caller's network namespace;
//! the first round goes out at once, the repeats from a short-lived background thread so that
//! the reconcile loop never waits for them.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::thread::JoinHandle;
use std::time::Duration;

use pnet_datalink::{Channel, DataLinkReceiver, DataLinkSender, MacAddr, NetworkInterface};

pub(super) const ETH_P_ARP: u16 = 0x0806;
pub(super) const ETH_P_IPV6: u16 = 0x86dd;
const BROADCAST: [u8; 6] = [0xff; 6];
/// The Ethernet group of ff02::1 (all nodes).
const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// Ethernet frames shorter than this (without FCS) are padded.
const ETH_MIN_FRAME: usize = 60;

/// One address to announce on one Ethernet-like interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement {
    pub ifindex: u32,
    pub dev: String,
    pub mac: [u8; 6],
    pub addr: IpAddr,
}

impl Announcement {
    /// `(destination MAC, ethertype, full Ethernet frame)`.
    pub fn frame(&self) -> ([u8; 6], u16, Vec<u8>) {
        match self.addr {
            IpAddr::V4(ip) => (BROADCAST, ETH_P_ARP, garp_frame(self.mac, ip)),
            IpAddr::V6(ip) => (ALL_NODES_MAC, ETH_P_IPV6, na_frame(self.mac, ip)),
        }
    }
}

pub(super) fn ethernet_header(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_MIN_FRAME + 32);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// A broadcast ARP request with sender = target = `ip` (RFC 5227 "ARP announcement").
pub fn garp_frame(mac: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
    let mut f = ethernet_header(BROADCAST, mac, ETH_P_ARP);
    f.extend_from_slice(&1u16.to_be_bytes()); // hardware: Ethernet
    f.extend_from_slice(&0x0800u16.to_be_bytes()); // protocol: IPv4
    f.extend_from_slice(&[6, 4]); // address lengths
    f.extend_from_slice(&1u16.to_be_bytes()); // request
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ip.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&ip.octets());
    f.resize(ETH_MIN_FRAME, 0);
    f
}

/// An unsolicited neighbour advertisement for `ip` to ff02::1: override flag, target
/// link-layer address option, hop limit 255 (RFC 4861 7.2.6).
pub fn na_frame(mac: [u8; 6], ip: Ipv6Addr) -> Vec<u8> {
    let mut icmp = Vec::with_capacity(32);
    icmp.extend_from_slice(&[136, 0, 0, 0]); // type NA, code 0, checksum placeholder
    icmp.extend_from_slice(&[0x20, 0, 0, 0]); // flags: override (not router, not solicited)
    icmp.extend_from_slice(&ip.octets());
    icmp.extend_from_slice(&[2, 1]); // option: target link-layer address, 8 bytes
    icmp.extend_from_slice(&mac);
    let sum = icmpv6_checksum(&ip, &ALL_NODES, &icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());

    let mut f = ethernet_header(ALL_NODES_MAC, mac, ETH_P_IPV6);
    f.extend_from_slice(&[0x60, 0, 0, 0]); // version 6, no traffic class or flow label
    f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    f.extend_from_slice(&[58, 255]); // next header ICMPv6, hop limit 255
    f.extend_from_slice(&ip.octets());
    f.extend_from_slice(&ALL_NODES.octets());
    f.extend_from_slice(&icmp);
    f
}

/// Internet checksum of an ICMPv6 message over the IPv6 pseudo-header.
pub(super) fn icmpv6_checksum(src: &Ipv6Addr, dst: &Ipv6Addr, msg: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(40 + msg.len());
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(msg);
    inet_checksum(&pseudo)
}

/// The Internet checksum (RFC 1071): the one's complement of the one's-complement sum of
/// the 16-bit words (an odd last byte padded with zero).
pub fn inet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Where frames go out: one `AF_PACKET` transmit channel per interface, opened through
/// `pnet_datalink` (which keeps the socket FFI out of this crate). Receiving is not used; the
/// channel's receive side is dropped at once and promiscuous mode is off.
pub struct PacketSender {
    channels: Vec<(u32, Box<dyn DataLinkSender>)>,
}

/// Both ends of a raw Ethernet channel.
pub(super) type EthernetChannel = (Box<dyn DataLinkSender>, Box<dyn DataLinkReceiver>);

/// Opens a raw Ethernet channel on interface `dev` (index `ifindex`, address `mac`).
pub(super) fn ethernet_channel(
    dev: &str,
    ifindex: u32,
    mac: [u8; 6],
    config: pnet_datalink::Config,
) -> io::Result<EthernetChannel> {
    let iface = NetworkInterface {
        name: dev.to_string(),
        description: String::new(),
        index: ifindex,
        mac: Some(MacAddr::from(mac)),
        ips: Vec::new(),
        flags: 0,
    };
    match pnet_datalink::channel(&iface, config)? {
        Channel::Ethernet(tx, rx) => Ok((tx, rx)),
        _ => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{dev}: not an Ethernet channel"),
        )),
    }
}

impl PacketSender {
    /// Opens a channel on every interface of `list`. Needs `CAP_NET_RAW` in the caller's
    /// network namespace.
    pub fn open(list: &[Announcement]) -> io::Result<PacketSender> {
        let mut channels: Vec<(u32, Box<dyn DataLinkSender>)> = Vec::new();
        for a in list {
            if channels.iter().any(|(i, _)| *i == a.ifindex) {
                continue;
            }
            let config = pnet_datalink::Config {
                promiscuous: false,
                ..Default::default()
            };
            let (tx, _) = ethernet_channel(&a.dev, a.ifindex, a.mac, config)?;
            channels.push((a.ifindex, tx));
        }
        Ok(PacketSender { channels })
    }

    /// Sends a full Ethernet frame out of interface `ifindex` (opened by [`Self::open`]).
    pub fn send(&mut self, ifindex: u32, frame: &[u8]) -> io::Result<()> {
        let (_, tx) = self
            .channels
            .iter_mut()
            .find(|(i, _)| *i == ifindex)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no channel"))?;
        tx.send_to(frame, None)
            .unwrap_or_else(|| Err(io::Error::other("frame not sent")))
    }
}

fn send_round(sock: &mut PacketSender, list: &[Announcement]) -> Vec<(String, io::Error)> {
    let mut failures = Vec::new();
    for a in list {
        let (_, _, frame) = a.frame();
        if let Err(e) = sock.send(a.ifindex, &frame) {
            failures.push((format!("announce {} on {}", a.addr, a.dev), e));
        }
    }
    failures
}

/// What [`announce`] did before returning.
#[derive(Debug, Default)]
pub struct Announced {
    /// `("announce ADDR on DEV", error)` for each frame of the first round that failed.
    pub failures: Vec<(String, io::Error)>,
    /// The thread sending the remaining rounds, if any.
    pub repeats: Option<JoinHandle<()>>,
}

/// Announces every address of `list` `count` times, `interval` apart: the first round before
/// returning (its failures are returned), the others from a background thread (failures are
/// logged). Fails only when the packet socket cannot be opened.
pub fn announce(list: Vec<Announcement>, count: u32, interval: Duration) -> io::Result<Announced> {
    if list.is_empty() || count == 0 {
        return Ok(Announced::default());
    }
    let mut sock = PacketSender::open(&list)?;
    let failures = send_round(&mut sock, &list);
    if count == 1 {
        return Ok(Announced {
            failures,
            repeats: None,
        });
    }
    let repeats = std::thread::Builder::new()
        .name("nodeplane-announce".into())
        .spawn(move || {
            for _ in 1..count {
                std::thread::sleep(interval);
                for (what, e) in send_round(&mut sock, &list) {
                    tracing::warn!("{what}: {e}");
                }
            }
        })?;
    Ok(Announced {
        failures,
        repeats: Some(repeats),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

    #[test]
    fn garp_has_sender_equal_target() {
        let f = garp_frame(MAC, Ipv4Addr::new(192, 168, 50, 100));
        assert_eq!(f.len(), 60);
        assert_eq!(&f[0..6], &BROADCAST);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[20..22], &[0, 1], "ARP request");
        assert_eq!(&f[22..28], &MAC);
        assert_eq!(&f[28..32], &[192, 168, 50, 100]);
        assert_eq!(&f[38..42], &[192, 168, 50, 100]);
    }

    #[test]
    fn na_checksum_verifies_and_fields_are_set() {
        let ip: Ipv6Addr = "2001:db8:50::100".parse().unwrap();
        let f = na_frame(MAC, ip);
        assert_eq!(f.len(), 14 + 40 + 32);
        assert_eq!(&f[0..6], &ALL_NODES_MAC);
        assert_eq!(f[14 + 7], 255, "hop limit");
        let icmp = &f[54..];
        assert_eq!(icmp[0], 136);
        assert_eq!(icmp[4], 0x20, "override flag only");
        assert_eq!(&icmp[8..24], &ip.octets());
        assert_eq!(&icmp[24..32], &[2, 1, 0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
        // A message whose checksum field is set sums to zero (checksum 0 after complement).
        assert_eq!(icmpv6_checksum(&ip, &ALL_NODES, icmp), 0);
    }
}
