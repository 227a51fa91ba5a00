//! Address conflict detection before an egress IP is added (RFC 5227 probes for IPv4, RFC
//! 4862 duplicate address detection messages for IPv6), so that two nodes never answer ARP
//! or NS for the same IP at once during a move.
//!
//! In a planned move the old and the new hosting node act on the same `status.items` write,
//! each in its own time: without this, the new node could add the address while the old one
//! still holds it (the EgressIP kernel test caught both holding it 138 ms into a move on a
//! loaded machine). The new node therefore asks the segment first: an ARP probe (sender IP
//! 0.0.0.0, target the IP) or a DAD neighbour solicitation (source ::, to the IP's
//! solicited-node group), and waits `probe` for an answer. Whoever still holds the address
//! answers within a round trip (its *kernel* does, agent or not); the node probes again until
//! nobody answers, and adds the address then, announcing it at once. After `max_wait` it adds
//! the address anyway (a holder that never lets go, such as a node cut off from the control
//! plane with its fence off, must not keep the IP unserved) and says so.
//!
//! Cost: one `probe` (20 ms by default) per added egress address when nobody holds it, which
//! is the unplanned-failover case; a planned move costs until the old node lets go.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use pnet_datalink::Config;

use super::announce::{
    ETH_P_ARP, ETH_P_IPV6, EthernetChannel, ethernet_channel, ethernet_header, icmpv6_checksum,
};

/// One address about to be added on an Ethernet-like interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub ifindex: u32,
    pub dev: String,
    pub mac: [u8; 6],
    pub addr: IpAddr,
}

/// What [`wait_until_free`] saw for one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nobody answered the first probe.
    Free,
    /// A holder answered; it let go after this long.
    Released(Duration),
    /// A holder still answered after the maximum wait (its MAC).
    StillHeld([u8; 6]),
}

/// Probes `c.addr` until no other host answers within `probe`, at most `max_wait`.
pub fn wait_until_free(c: &Candidate, probe: Duration, max_wait: Duration) -> io::Result<Outcome> {
    let (mut tx, mut rx) = open(c, probe)?;
    let started = Instant::now();
    let frame = probe_frame(c.mac, c.addr);
    let mut holder = None;
    loop {
        tx.send_to(&frame, None)
            .unwrap_or_else(|| Err(io::Error::other("probe not sent")))?;
        let deadline = Instant::now() + probe;
        let mut answered = None;
        while answered.is_none() && Instant::now() < deadline {
            match rx.next() {
                Ok(f) => answered = holder_of(f, c.addr, c.mac),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(e) => return Err(e),
            }
        }
        match answered {
            None if holder.is_none() => return Ok(Outcome::Free),
            None => return Ok(Outcome::Released(started.elapsed())),
            Some(mac) if started.elapsed() >= max_wait => return Ok(Outcome::StillHeld(mac)),
            Some(mac) => {
                holder = Some(mac);
                // The holder is acting on the same change: give it a moment, not a spin.
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

fn open(c: &Candidate, probe: Duration) -> io::Result<EthernetChannel> {
    let config = Config {
        promiscuous: false,
        read_timeout: Some(probe.min(Duration::from_millis(10))),
        ..Default::default()
    };
    ethernet_channel(&c.dev, c.ifindex, c.mac, config)
}

/// The probe for `addr` from `mac`.
pub fn probe_frame(mac: [u8; 6], addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(ip) => arp_probe(mac, ip),
        IpAddr::V6(ip) => dad_ns(mac, ip),
    }
}

/// A broadcast ARP request "who has `ip`" with sender IP 0.0.0.0 (RFC 5227 2.1.1), so that
/// no neighbour updates its cache from it.
fn arp_probe(mac: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
    let mut f = ethernet_header([0xff; 6], mac, ETH_P_ARP);
    f.extend_from_slice(&1u16.to_be_bytes());
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&[6, 4]);
    f.extend_from_slice(&1u16.to_be_bytes()); // request
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0; 4]);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&ip.octets());
    f.resize(60, 0);
    f
}

/// A duplicate address detection solicitation for `ip`: source ::, destination its
/// solicited-node group, no source link-layer option (RFC 4862 5.4.2). A holder answers with
/// an advertisement to all nodes.
fn dad_ns(mac: [u8; 6], ip: Ipv6Addr) -> Vec<u8> {
    let o = ip.octets();
    let group = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    );
    let g = group.octets();
    let mut icmp = vec![135, 0, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(&o);
    let sum = icmpv6_checksum(&Ipv6Addr::UNSPECIFIED, &group, &icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut f = ethernet_header([0x33, 0x33, g[12], g[13], g[14], g[15]], mac, ETH_P_IPV6);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    f.extend_from_slice(&[58, 255]);
    f.extend_from_slice(&Ipv6Addr::UNSPECIFIED.octets());
    f.extend_from_slice(&g);
    f.extend_from_slice(&icmp);
    f
}

/// The MAC of another host that claims `addr` in this frame: an ARP packet (reply or request)
/// whose sender IP is `addr`, or a neighbour advertisement whose target is `addr`. Frames from
/// `own` are ignored.
pub fn holder_of(frame: &[u8], addr: IpAddr, own: [u8; 6]) -> Option<[u8; 6]> {
    let src: [u8; 6] = frame.get(6..12)?.try_into().ok()?;
    if src == own {
        return None;
    }
    let ethertype = u16::from_be_bytes(frame.get(12..14)?.try_into().ok()?);
    match (addr, ethertype) {
        (IpAddr::V4(ip), ETH_P_ARP) => {
            let arp = frame.get(14..42)?;
            let sender_ip = &arp[14..18];
            (sender_ip == ip.octets()).then(|| arp[8..14].try_into().ok())?
        }
        (IpAddr::V6(ip), ETH_P_IPV6) => {
            let ipv6 = frame.get(14..54)?;
            let icmp = frame.get(54..78)?;
            (ipv6[6] == 58 && icmp[0] == 136 && icmp[8..24] == ip.octets()).then_some(src)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::announce::{garp_frame, na_frame};

    const OWN: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const OTHER: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn arp_reply(from: [u8; 6], ip: Ipv4Addr) -> Vec<u8> {
        let mut f = garp_frame(from, ip);
        f[20..22].copy_from_slice(&2u16.to_be_bytes());
        f
    }

    #[test]
    fn a_holder_is_recognised_by_its_arp_or_na_and_our_own_frames_are_not() {
        let v4 = Ipv4Addr::new(192, 168, 50, 200);
        let v6: Ipv6Addr = "fd00:50::200".parse().unwrap();
        assert_eq!(
            holder_of(&arp_reply(OTHER, v4), v4.into(), OWN),
            Some(OTHER)
        );
        assert_eq!(
            holder_of(&garp_frame(OTHER, v4), v4.into(), OWN),
            Some(OTHER)
        );
        assert_eq!(holder_of(&garp_frame(OWN, v4), v4.into(), OWN), None);
        let other_ip = Ipv4Addr::new(192, 168, 50, 201);
        assert_eq!(holder_of(&arp_reply(OTHER, other_ip), v4.into(), OWN), None);
        assert_eq!(holder_of(&na_frame(OTHER, v6), v6.into(), OWN), Some(OTHER));
        assert_eq!(holder_of(&na_frame(OTHER, v6), v4.into(), OWN), None);
        // Our own probes are neither.
        assert_eq!(
            holder_of(&probe_frame(OWN, v4.into()), v4.into(), OWN),
            None
        );
        assert_eq!(holder_of(&[0u8; 10], v4.into(), OWN), None);
    }

    #[test]
    fn probes_claim_nothing_for_the_sender() {
        let f = probe_frame(OWN, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)));
        assert_eq!(&f[28..32], &[0, 0, 0, 0], "sender IP 0.0.0.0");
        assert_eq!(&f[38..42], &[10, 0, 0, 7]);
        let v6: Ipv6Addr = "fd00::1:2:3".parse().unwrap();
        let f = probe_frame(OWN, v6.into());
        assert_eq!(&f[0..6], &[0x33, 0x33, 0xff, 0x02, 0x00, 0x03]);
        assert_eq!(&f[22..38], &Ipv6Addr::UNSPECIFIED.octets());
        let icmp = &f[54..];
        assert_eq!(icmp[0], 135);
        let group: [u8; 16] = f[38..54].try_into().unwrap();
        assert_eq!(
            icmpv6_checksum(&Ipv6Addr::UNSPECIFIED, &Ipv6Addr::from(group), icmp),
            0
        );
    }
}
