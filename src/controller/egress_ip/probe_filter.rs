//! The classic BPF socket filter of the fence's listener ([`super::probe_listener::Listener`]): the
//! kernel queues on the listener only echo requests of a probe's exact length with the
//! probes' magic that arrived on one of the given interfaces (the uplinks, see
//! [`super::uplinks`]). Everything else, every other ICMP message the node receives and
//! any flood from a pod, whatever its payload, is dropped in softirq before it can fill the
//! listener's receive queue and crowd out the assigner's probes.
//!
//! The program reads the packet as a raw socket's filter sees it: from the IPv4 header on an
//! ICMP socket (its length from the IHL), from the ICMPv6 header on an ICMPv6 socket. The
//! arrival interface is the `SKF_AD_IFINDEX` ancillary load (`skb->dev`, the device that
//! `IP_PKTINFO` names too). Which probes are the assigner's is still for
//! [`super::probe_auth`] to say; this only keeps the queue for what could be.

use super::probe_auth::{MAGIC, PAYLOAD_LEN};

/// One classic BPF instruction: `(code, jt, jf, k)` as in `struct sock_filter`.
pub type Insn = (u16, u8, u8, u32);

const LD: u16 = 0x00;
const LDX: u16 = 0x01;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const W: u16 = 0x00;
const B: u16 = 0x10;
const IMM: u16 = 0x00;
const ABS: u16 = 0x20;
const IND: u16 = 0x40;
const LEN: u16 = 0x80;
const MSH: u16 = 0xa0;
const SUB: u16 = 0x10;
const JEQ: u16 = 0x10;
const X: u16 = 0x08;
/// `SKF_AD_OFF + SKF_AD_IFINDEX`: the arrival interface's index.
const AD_IFINDEX: u32 = (-0x1000i32 + 8) as u32;

const ICMP_ECHO: u32 = 8;
const ICMP6_ECHO: u32 = 128;
/// The ICMP message of a probe: the echo header and the payload.
const PROBE_LEN: u32 = (8 + PAYLOAD_LEN) as u32;

/// More interfaces than this (jump offsets are 8 bits) and the interface check is left to
/// the listener's reader; no node has that many interfaces holding its addresses.
pub const MAX_INTERFACES: usize = 128;

/// The filter for the IPv4 (`v4`) or the IPv6 listener, passing probes that arrive on
/// `interfaces` (any interface when there are more than [`MAX_INTERFACES`]).
pub fn program(v4: bool, interfaces: &[u32]) -> Vec<Insn> {
    let word = |b: &[u8]| u32::from_be_bytes(b.try_into().expect("4 bytes"));
    let mut p: Vec<Insn> = Vec::new();
    // X = where the ICMP message starts.
    if v4 {
        p.push((LDX | B | MSH, 0, 0, 0));
    } else {
        p.push((LDX | W | IMM, 0, 0, 0));
    }
    // The "drop" jumps are patched once the program's length is known.
    let mut to_drop = Vec::new();
    let mut check = |p: &mut Vec<Insn>, load: Insn, want: u32| {
        p.push(load);
        to_drop.push(p.len());
        p.push((JMP | JEQ, 0, 0, want));
    };
    let echo = if v4 { ICMP_ECHO } else { ICMP6_ECHO };
    check(&mut p, (LD | B | IND, 0, 0, 0), echo);
    check(&mut p, (LD | B | IND, 0, 0, 1), 0);
    p.push((LD | W | LEN, 0, 0, 0));
    check(&mut p, (ALU | SUB | X, 0, 0, 0), PROBE_LEN);
    check(&mut p, (LD | W | IND, 0, 0, 8), word(&MAGIC[..4]));
    check(&mut p, (LD | W | IND, 0, 0, 12), word(&MAGIC[4..]));
    if interfaces.len() > MAX_INTERFACES {
        p.push((RET, 0, 0, u32::MAX));
    } else {
        p.push((LD | W | ABS, 0, 0, AD_IFINDEX));
        let n = interfaces.len();
        for (i, ifindex) in interfaces.iter().enumerate() {
            // Equal: on to "accept", past the rest of the list and "drop".
            p.push((JMP | JEQ, (n - i) as u8, 0, *ifindex));
        }
    }
    let drop = p.len();
    p.push((RET, 0, 0, 0));
    p.push((RET, 0, 0, u32::MAX));
    for at in to_drop {
        p[at].2 = (drop - at - 1) as u8;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `prog` the way the kernel runs a socket filter over `pkt` that arrived on
    /// `ifindex` (the instructions [`program`] uses): the length it keeps, 0 to drop.
    fn run(prog: &[Insn], pkt: &[u8], ifindex: u32) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let byte = |at: u32| pkt.get(at as usize).map(|b| u32::from(*b));
        let word = |at: u32| {
            let at = at as usize;
            pkt.get(at..at + 4)
                .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
        };
        loop {
            let (code, jt, jf, k) = prog[pc];
            pc += 1;
            match code {
                c if c == LDX | B | MSH => x = 4 * (byte(k).unwrap_or(0) & 0xf),
                c if c == LDX | W | IMM => x = k,
                c if c == LD | B | IND => match byte(x + k) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == LD | W | IND => match word(x + k) {
                    Some(v) => a = v,
                    None => return 0,
                },
                c if c == LD | W | LEN => a = pkt.len() as u32,
                c if c == LD | W | ABS && k == AD_IFINDEX => a = ifindex,
                c if c == ALU | SUB | X => a = a.wrapping_sub(x),
                c if c == JMP | JEQ => pc += usize::from(if a == k { jt } else { jf }),
                c if c == RET => return k,
                other => panic!("instruction {other:#x} not modelled"),
            }
        }
    }

    fn probe_icmp(type_: u8) -> Vec<u8> {
        let mut icmp = vec![type_, 0, 0, 0, 0, 1, 0, 1];
        icmp.extend_from_slice(MAGIC);
        icmp.resize(8 + PAYLOAD_LEN, 0xab);
        icmp
    }

    fn ipv4(options: usize, icmp: &[u8]) -> Vec<u8> {
        let ihl = 5 + options / 4;
        let mut p = vec![0x40 | ihl as u8, 0];
        p.resize(20 + options, 0);
        p.extend_from_slice(icmp);
        p
    }

    #[test]
    fn only_probe_shaped_echo_requests_on_the_given_interfaces_pass() {
        let v4 = program(true, &[2, 1]);
        let probe = ipv4(0, &probe_icmp(8));
        assert_eq!(run(&v4, &probe, 2), u32::MAX);
        assert_eq!(run(&v4, &probe, 1), u32::MAX);
        // IP options move the ICMP message: still found.
        assert_eq!(run(&v4, &ipv4(8, &probe_icmp(8)), 2), u32::MAX);
        // A pod's interface, or none given.
        assert_eq!(run(&v4, &probe, 10), 0);
        assert_eq!(run(&program(true, &[]), &probe, 2), 0);
        // A reply, another code, another length, another payload, a truncated packet.
        assert_eq!(run(&v4, &ipv4(0, &probe_icmp(0)), 2), 0);
        let mut code = probe.clone();
        code[21] = 1;
        assert_eq!(run(&v4, &code, 2), 0);
        let mut long = probe.clone();
        long.push(0);
        assert_eq!(run(&v4, &long, 2), 0);
        let mut other = probe.clone();
        other[20 + 8 + 7] = b'x';
        assert_eq!(run(&v4, &other, 2), 0);
        assert_eq!(run(&v4, &probe[..30], 2), 0);

        // IPv6: the ICMPv6 header first.
        let v6 = program(false, &[3]);
        assert_eq!(run(&v6, &probe_icmp(128), 3), u32::MAX);
        assert_eq!(run(&v6, &probe_icmp(128), 2), 0);
        assert_eq!(run(&v6, &probe_icmp(8), 3), 0);
        assert_eq!(run(&v6, &probe_icmp(129), 3), 0);
    }

    #[test]
    fn too_many_interfaces_leave_the_interface_to_the_reader() {
        let many: Vec<u32> = (1..=MAX_INTERFACES as u32 + 1).collect();
        let p = program(true, &many);
        assert_eq!(run(&p, &ipv4(0, &probe_icmp(8)), 9999), u32::MAX);
        assert_eq!(run(&p, &ipv4(0, &probe_icmp(0)), 1), 0);
        // The most that fit: every jump within 8 bits.
        let most: Vec<u32> = (1..=MAX_INTERFACES as u32).collect();
        let p = program(true, &most);
        assert_eq!(
            run(&p, &ipv4(0, &probe_icmp(8)), MAX_INTERFACES as u32),
            u32::MAX
        );
        assert_eq!(run(&p, &ipv4(0, &probe_icmp(8)), 1), u32::MAX);
        assert_eq!(run(&p, &ipv4(0, &probe_icmp(0)), 1), 0);
    }
}
