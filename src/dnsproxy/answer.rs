//! What a DNS answer tells the learner: the queried name and the A/AAAA addresses that belong
//! to it, with their TTLs. Parsing never panics on hostile bytes (a property test feeds it
//! arbitrary and mutated messages); anything that is not a plain answer learns nothing and is
//! still forwarded as it came.

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{Name, RData};
use std::net::IpAddr;

/// CNAME hops followed from the queried name: more is a loop or an attack, not an answer.
const MAX_CNAME_HOPS: usize = 16;

/// The addresses an answer gives for the name a pod asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The queried name, lowercase, without the trailing dot.
    pub name: String,
    /// Each address with the TTL of its record.
    pub addresses: Vec<(IpAddr, u32)>,
    /// The TC bit: the pod will retry over TCP, whose answer is learned then.
    pub truncated: bool,
}

/// Parses a response and follows the CNAME chain from the (single) question's name: the
/// final A/AAAA records of that chain belong to the queried name. `None` for what is not a
/// successful response to one question (queries, errors, malformed bytes).
pub fn parse(bytes: &[u8]) -> Option<Answer> {
    let msg = Message::from_vec(bytes).ok()?;
    if msg.metadata.message_type != MessageType::Response
        || msg.metadata.response_code != ResponseCode::NoError
        || msg.queries.len() != 1
    {
        return None;
    }
    let queried = msg.queries[0].name();
    let mut current = queried.clone();
    for _ in 0..MAX_CNAME_HOPS {
        let next = msg.answers.iter().find_map(|r| match &r.data {
            RData::CNAME(target) if r.name == current => Some(target.0.clone()),
            _ => None,
        });
        match next {
            Some(target) => current = target,
            None => break,
        }
    }
    let addresses = msg
        .answers
        .iter()
        .filter(|r| r.name == current || r.name == *queried)
        .filter_map(|r| match &r.data {
            RData::A(a) => Some((IpAddr::V4(a.0), r.ttl)),
            RData::AAAA(a) => Some((IpAddr::V6(a.0), r.ttl)),
            _ => None,
        })
        .collect();
    Some(Answer {
        name: plain(queried),
        addresses,
        truncated: msg.metadata.truncation,
    })
}

/// Whether `bytes` is a DNS query with one question: what the proxy forwards. Anything else
/// a pod sends to port 53 is dropped, so garbage costs no upstream socket nor a slot.
pub fn is_query(bytes: &[u8]) -> bool {
    Message::from_vec(bytes)
        .is_ok_and(|m| m.metadata.message_type == MessageType::Query && m.queries.len() == 1)
}

/// The message ID (the first two bytes; 0 for a message too short to have one).
pub fn id(bytes: &[u8]) -> u16 {
    match bytes {
        [a, b, ..] => u16::from_be_bytes([*a, *b]),
        _ => 0,
    }
}

/// Overwrites the message ID (no-op on a message too short to have one).
pub fn set_id(bytes: &mut [u8], id: u16) {
    if let Some(head) = bytes.get_mut(..2) {
        head.copy_from_slice(&id.to_be_bytes());
    }
}

/// A fresh random ID for an upstream query, so that an answer cannot be forged from the
/// pod's own ID (`None` only if the OS has no randomness to give).
pub fn fresh_id() -> Option<u16> {
    let mut b = [0u8; 2];
    getrandom::fill(&mut b).ok()?;
    Some(u16::from_ne_bytes(b))
}

/// Whether `answer` is a response to `query`'s question (same name, type and class).
pub fn answers_question(query: &[u8], answer: &[u8]) -> bool {
    let (Ok(q), Ok(a)) = (Message::from_vec(query), Message::from_vec(answer)) else {
        return false;
    };
    a.metadata.message_type == MessageType::Response
        && a.queries.len() == 1
        && a.queries == q.queries
}

/// `Www.Example.COM.` -> `www.example.com`.
fn plain(name: &Name) -> String {
    let s = name.to_lowercase().to_ascii();
    s.strip_suffix('.').unwrap_or(&s).to_string()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use hickory_proto::op::{OpCode, Query};
    use hickory_proto::rr::rdata::{A, AAAA, CNAME};
    use hickory_proto::rr::{Record, RecordType};
    use proptest::prelude::*;
    use std::str::FromStr;

    fn name(s: &str) -> Name {
        Name::from_str(s).unwrap()
    }

    /// A response to `qname` with `records` as (owner, data, ttl).
    pub(crate) fn response(qname: &str, records: &[(&str, RData, u32)], tc: bool) -> Vec<u8> {
        let mut m = Message::response(7, OpCode::Query);
        m.metadata.truncation = tc;
        m.add_query(Query::query(name(qname), RecordType::A));
        for (owner, data, ttl) in records {
            m.add_answer(Record::from_rdata(name(owner), *ttl, data.clone()));
        }
        m.to_vec().unwrap()
    }

    fn a(ip: &str) -> RData {
        RData::A(A(ip.parse().unwrap()))
    }

    fn aaaa(ip: &str) -> RData {
        RData::AAAA(AAAA(ip.parse().unwrap()))
    }

    fn cname(target: &str) -> RData {
        RData::CNAME(CNAME(name(target)))
    }

    #[test]
    fn follows_cnames_to_the_final_addresses() {
        let bytes = response(
            "WWW.example.com.",
            &[
                ("www.example.com.", cname("edge.cdn.net."), 300),
                ("edge.cdn.net.", cname("e1.cdn.net."), 60),
                ("e1.cdn.net.", a("198.51.100.7"), 20),
                ("e1.cdn.net.", aaaa("2001:db8::7"), 30),
                ("unrelated.net.", a("203.0.113.9"), 20),
            ],
            false,
        );
        let got = parse(&bytes).unwrap();
        assert_eq!(got.name, "www.example.com");
        assert_eq!(
            got.addresses,
            [
                ("198.51.100.7".parse().unwrap(), 20),
                ("2001:db8::7".parse().unwrap(), 30)
            ],
            "the chain's final records, not an unrelated one"
        );
        assert!(!got.truncated);
    }

    #[test]
    fn a_cname_loop_ends_and_truncation_is_reported() {
        let bytes = response(
            "a.example.com.",
            &[
                ("a.example.com.", cname("b.example.com."), 5),
                ("b.example.com.", cname("a.example.com."), 5),
            ],
            true,
        );
        let got = parse(&bytes).unwrap();
        assert!(got.addresses.is_empty() && got.truncated);
    }

    #[test]
    fn only_one_question_queries_are_forwarded() {
        let mut q = Message::query();
        assert!(!is_query(&q.to_vec().unwrap()), "no question");
        q.add_query(Query::query(name("a.example.com."), RecordType::A));
        assert!(is_query(&q.to_vec().unwrap()));
        assert!(
            !is_query(&response("a.example.com.", &[], false)),
            "an answer"
        );
        assert!(!is_query(&[0xde, 0xad]));
    }

    #[test]
    fn queries_and_errors_learn_nothing() {
        let mut q = Message::query();
        q.add_query(Query::query(name("a.example.com."), RecordType::A));
        assert_eq!(parse(&q.to_vec().unwrap()), None);
        let mut e = Message::error_msg(1, OpCode::Query, ResponseCode::NXDomain);
        e.add_query(Query::query(name("a.example.com."), RecordType::A));
        assert_eq!(parse(&e.to_vec().unwrap()), None);
        assert_eq!(parse(&[]), None);
    }

    #[test]
    fn an_answer_counts_only_for_the_same_question() {
        let mut q = Message::query();
        q.add_query(Query::query(name("a.example.com."), RecordType::A));
        let query = q.to_vec().unwrap();
        assert!(answers_question(
            &query,
            &response("a.example.com.", &[], false)
        ));
        assert!(!answers_question(
            &query,
            &response("b.example.com.", &[], false)
        ));
        assert!(!answers_question(&query, &query), "the query itself");
        assert!(!answers_question(&query, &[0xde, 0xad]));
        let mut bytes = response("a.example.com.", &[], false);
        set_id(&mut bytes, 0xbeef);
        assert_eq!(id(&bytes), 0xbeef);
        assert_eq!(id(&[1]), 0);
        let ids: std::collections::BTreeSet<u16> = (0..64).filter_map(|_| fresh_id()).collect();
        assert!(ids.len() > 50, "IDs are not random: {ids:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        /// Arbitrary bytes never panic.
        #[test]
        fn arbitrary_bytes_do_not_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse(&bytes);
        }

        /// A real answer with bytes flipped, cut or extended never panics.
        #[test]
        fn mutated_answers_do_not_panic(
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
            cut in any::<prop::sample::Index>(),
            tail in prop::collection::vec(any::<u8>(), 0..16),
        ) {
            let mut bytes = response(
                "www.example.com.",
                &[("www.example.com.", cname("e.cdn.net."), 9),
                  ("e.cdn.net.", a("198.51.100.7"), 9)],
                false,
            );
            for (i, b) in flips {
                let i = i.index(bytes.len());
                bytes[i] ^= b;
            }
            bytes.truncate(cut.index(bytes.len() + 1));
            bytes.extend(tail);
            let _ = parse(&bytes);
        }
    }
}
