//! The `explain` evaluator against the kernel: random small tables, built from the IR and
//! applied through the agent's own libnftnl path (`Engine` + `NftnlBackend`), and random
//! UDP packets; the evaluator's verdict must equal the kernel's.
//!
//! The kernel's verdict is read cheaply: the rules hook `output` in a fresh netns and each
//! packet is a `sendto` from a socket there. A drop in `output` makes `sendto` fail with
//! `EPERM` synchronously (`ip_local_out` returns the hook's verdict to the caller);
//! anything that passes is sent (to addresses on `lo`). Measured on 6.18: every dropped
//! case gave `EPERM` (errno 1), every accepted one a successful send; no other error.
//! Each packet has its own source port, so no conntrack entry makes one case the next's
//! `established`. The generator draws from small domains (4 sources, 8 destinations, 8
//! ports, a few prefixes and ranges) so rules hit often; the seed is printed, and
//! `EXPLAIN_SEED=N` replays a run.

use nodeplane::explain::packet::{NodeFacts, Packet};
use nodeplane::explain::{self, Query, Tables, Topology, explain_paths};
use nodeplane::nft::nftnl::NftnlBackend;
use nodeplane::nft::render::render_full;
use nodeplane::nft::*;
use nodeplane::testing::lab::Lab;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

const TABLES: usize = 250;
const PACKETS_PER_TABLE: usize = 4;

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }
}

fn src(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 9, 0, 1 + i as u8)
}
fn dst(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 9, 1, 1 + i as u8)
}
fn v4(a: Ipv4Addr) -> Value {
    Value::Ipv4(a)
}
fn port(r: &mut Rng) -> u16 {
    1000 + r.below(8) as u16
}

/// Disjoint prefixes (an interval set's elements must not overlap).
const PREFIXES: [&str; 4] = ["10.9.1.0/30", "10.9.1.4/31", "10.9.0.0/30", "10.9.1.7/32"];

fn prefix_at(i: usize) -> KeyPart {
    KeyPart::Prefix(PREFIXES[i % PREFIXES.len()].parse().unwrap())
}

/// One or two disjoint prefixes, or the whole lab range alone.
fn prefixes(r: &mut Rng) -> Vec<ElemKey> {
    match r.below(4) {
        0 => vec![vec![KeyPart::Prefix("10.9.0.0/16".parse().unwrap())]],
        1 => vec![vec![prefix_at(r.below(4))]],
        _ => {
            let i = r.below(4);
            vec![vec![prefix_at(i)], vec![prefix_at(i + 1 + r.below(3))]]
        }
    }
}

fn random_match(r: &mut Rng) -> Stmt {
    let m = |key: Vec<Field>, op: MatchOp| Stmt::Match(Match { key, op });
    match r.below(9) {
        0 => Stmt::matches(Field::Ip4Saddr, v4(src(r.below(4)))),
        1 => Stmt::not_matches(Field::Ip4Daddr, v4(dst(r.below(8)))),
        2 => m(vec![Field::Ip4Daddr], MatchOp::InAnon(prefixes(r))),
        3 => {
            let lo = port(r);
            let range = KeyPart::Range(Value::Port(lo), Value::Port(lo + r.below(4) as u16));
            m(vec![Field::ThDport], MatchOp::InAnon(vec![vec![range]]))
        }
        4 => Stmt::in_set(vec![Field::Ip4Daddr], "nets"),
        5 => Stmt::not_in_set(vec![Field::Ip4Saddr, Field::ThDport], "pairs"),
        6 => Stmt::matches(
            Field::L4Proto,
            Value::Proto(r.pick(&[proto::UDP, proto::TCP])),
        ),
        7 => m(
            vec![Field::Mark],
            MatchOp::Masked {
                mask: Value::Mark(0xf),
                value: Value::Mark(r.below(3) as u32),
                eq: r.below(2) == 0,
            },
        ),
        _ => Stmt::matches(Field::ThDport, Value::Port(port(r))),
    }
}

/// A verdict that may leave chain `from` for a later chain (no loops).
fn random_verdict(r: &mut Rng, from: usize, chains: usize) -> Option<Verdict> {
    let later = (from + 1 < chains).then(|| format!("c{}", from + 1 + r.below(chains - from - 1)));
    match (r.below(7), later) {
        (0 | 1, _) => Some(Verdict::Accept),
        (2 | 3, _) => Some(Verdict::Drop),
        (4, Some(c)) => Some(Verdict::Jump(c)),
        (5, Some(c)) => Some(Verdict::Goto(c)),
        (6, _) if from > 0 => Some(Verdict::Return),
        _ => None,
    }
}

/// IPv4-keyed verdict map `name` with up to three random verdicts of chain `from`, each under
/// the key `key` draws.
fn random_verdict_map(
    r: &mut Rng,
    name: String,
    (from, chains): (usize, usize),
    key: impl Fn(&mut Rng) -> Value,
) -> Set {
    let mut map = Set::new(name, vec![DataType::Ipv4Addr], SetKind::VerdictMap);
    for _ in 0..3 {
        if let Some(v) = random_verdict(r, from, chains) {
            map.insert_mapping(vec![key(r).into()], ElemData::Verdict(v));
        }
    }
    map
}

fn random_rule(r: &mut Rng, from: usize, chains: usize) -> Rule {
    match r.below(8) {
        0 => return Rule::new(vec![Stmt::vmap(vec![Field::Ip4Daddr], format!("vm{from}"))]),
        // The services' address-shard selector: `ip daddr & 0.0.0.15 vmap @...`.
        1 => {
            let key = vec![Field::Ip4DaddrLowNibble];
            return Rule::new(vec![Stmt::vmap(key, format!("nib{from}"))]);
        }
        _ => {}
    }
    let mut stmts: Vec<Stmt> = (0..r.below(3)).map(|_| random_match(r)).collect();
    if r.below(4) == 0 {
        stmts.push(Stmt::MarkSet(r.below(3) as u32));
    }
    stmts.extend(random_verdict(r, from, chains).map(Stmt::Verdict));
    if stmts.is_empty() {
        stmts.push(Stmt::Counter);
    }
    Rule::new(stmts)
}

fn random_table(r: &mut Rng) -> Table {
    let mut t = Table::new(TABLE_NAME);
    let interval = SetFlags {
        interval: true,
        ..Default::default()
    };
    let mut nets = Set::new("nets", vec![DataType::Ipv4Addr], SetKind::Set).with_flags(interval);
    for key in prefixes(r) {
        nets.insert(key);
    }
    t.add_set(nets);
    let mut pairs = Set::new(
        "pairs",
        vec![DataType::Ipv4Addr, DataType::InetService],
        SetKind::Set,
    );
    for _ in 0..4 {
        pairs.insert(vec![
            v4(src(r.below(4))).into(),
            Value::Port(port(r)).into(),
        ]);
    }
    t.add_set(pairs);
    let chains = 1 + r.below(3);
    for i in 0..chains {
        let to_dst = |r: &mut Rng| v4(dst(r.below(8)));
        t.add_set(random_verdict_map(r, format!("vm{i}"), (i, chains), to_dst));
        let to_nibble = |r: &mut Rng| Value::ip(low_nibble(IpAddr::V4(dst(r.below(8)))));
        t.add_set(random_verdict_map(
            r,
            format!("nib{i}"),
            (i, chains),
            to_nibble,
        ));
        let policy = if r.below(2) == 0 {
            Policy::Accept
        } else {
            Policy::Drop
        };
        let base = BaseChain {
            kind: ChainType::Filter,
            hook: Hook::Output,
            priority: 0,
            policy,
        };
        let mut chain = if i == 0 {
            Chain::base("c0", base)
        } else {
            Chain::regular(format!("c{i}"))
        };
        for _ in 0..1 + r.below(4) {
            chain.push(random_rule(r, i, chains));
        }
        t.add_chain(chain);
    }
    t
}

/// The kernel's verdict: `sendto` from (src, sport) to (dst, dport).
fn kernel_drops(from: SocketAddr, to: SocketAddr) -> bool {
    let sock = UdpSocket::bind(from).unwrap_or_else(|e| panic!("bind {from}: {e}"));
    match sock.send_to(b"explain", to) {
        Ok(_) => false,
        Err(e) if e.kind() == ErrorKind::PermissionDenied => true,
        Err(e) => panic!("sendto {from} -> {to}: {e} (neither sent nor EPERM)"),
    }
}

#[test]
fn evaluator_verdicts_equal_the_kernels_on_random_tables_and_packets() {
    let seed = std::env::var("EXPLAIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    let seed = seed.unwrap_or_else(|| std::process::id() as u64 * 0x9e37_79b9 + 1);
    eprintln!("seed {seed} (EXPLAIN_SEED={seed} replays it)");
    let mut lab = Lab::new();
    let ns = lab.add_host("explain");
    ns.exec(&["ip", "link", "set", "lo", "up"]).unwrap();
    ns.exec(&["ip", "addr", "add", "10.9.0.1/16", "dev", "lo"])
        .unwrap();
    for i in 1..4 {
        ns.exec(&["ip", "addr", "add", &format!("{}/32", src(i)), "dev", "lo"])
            .unwrap();
    }
    let facts = NodeFacts {
        local: (0..4).map(|i| IpAddr::V4(src(i))).collect(),
    };
    let (mut rng, mut sport, mut drops, mut cases) = (Rng(seed), 20000u16, 0, 0);
    ns.enter(|| {
        let mut engine = Engine::new(NftnlBackend::new());
        for _ in 0..TABLES {
            let table = random_table(&mut rng);
            engine.sync(table.clone()).unwrap_or_else(|e| panic!("apply: {e}\n{}", render_full(&table)));
            let tables = Tables::new(&table, None);
            for _ in 0..PACKETS_PER_TABLE {
                let (s, d, dport) = (src(rng.below(4)), dst(rng.below(8)), port(&mut rng));
                sport += 1;
                let packet = Packet::new(s.into(), d.into(), proto::UDP, Some(sport), Some(dport)).unwrap();
                let query = Query { packet, topology: Topology::Routed };
                let paths = explain_paths(&tables, &facts, &query);
                let ours = paths[0].verdict == explain::Verdict::Dropped;
                let kernel = kernel_drops((s, sport).into(), (d, dport).into());
                assert_eq!(
                    ours, kernel,
                    "seed {seed}: {s}:{sport} -> {d}:{dport}: explain says drop={ours}, kernel drop={kernel}\n{}\n{:#?}",
                    render_full(&table), paths[0].events
                );
                drops += usize::from(kernel);
                cases += 1;
            }
        }
    });
    eprintln!("{cases} cases, {drops} dropped by the kernel");
    assert!(
        cases >= 1000 && drops > cases / 10 && drops < cases * 9 / 10,
        "{drops} of {cases}"
    );
}
