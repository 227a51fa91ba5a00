//! Authenticated probes: what makes the assigner's probes the only echo requests the fence
//! takes for the assigner's word.
//!
//! **Payload** (48 bytes after the ICMP echo header): the magic `nodeplan`, a session (random
//! per prober run), a counter (one per probe of the session), the sender's wall clock in Unix
//! milliseconds, and HMAC-SHA256 truncated to 16 bytes over all of that and the *target*
//! address, keyed by the cluster's probe key (`--egress-ip-probe-key-file`).
//!
//! **Acceptance** ([`Verifier::accept`], clock-explicit): the MAC must be valid for one of
//! the receiving node's own addresses (a probe sent to another node is no probe here), the
//! timestamp within [`MAX_SKEW`] of the local clock either way, and the counter above the
//! last accepted one of its session (a replay is refused). The source check (a Node's
//! address) is the caller's. What a pod or a host on the segment can still do: delay or
//! replay a probe captured within the last [`MAX_SKEW`] that this node never saw (or saw
//! before its agent restarted), which keeps the fence quiet at most [`MAX_SKEW`] longer.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// What every probe starts with.
pub const MAGIC: &[u8; 8] = b"nodeplan";
/// Magic, session, counter, timestamp, MAC.
pub const PAYLOAD_LEN: usize = 8 + 8 + 8 + 8 + MAC_LEN;

/// What the probes carry without a key: the magic and zeros (tests).
#[cfg(test)]
pub const NO_KEY: [u8; PAYLOAD_LEN] = {
    let mut p = [0u8; PAYLOAD_LEN];
    let mut i = 0;
    while i < 8 {
        p[i] = MAGIC[i];
        i += 1;
    }
    p
};
const MAC_LEN: usize = 16;
/// The shortest key accepted (e.g. `openssl rand -hex 32` gives 64).
pub const MIN_KEY_LEN: usize = 32;
/// How far apart the prober's and the node's clocks may be (NTP keeps nodes within
/// milliseconds); also the longest a captured probe stays usable.
pub const MAX_SKEW: Duration = Duration::from_secs(2);
/// Sessions remembered for replay checks (only the key's holders create them: one per
/// assigner term).
const MAX_SESSIONS: usize = 16;

/// The shared probe key. Its `Debug` shows no byte of it.
#[derive(Clone)]
pub struct ProbeKey(Arc<[u8]>);

impl fmt::Debug for ProbeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProbeKey({} bytes)", self.0.len())
    }
}

impl ProbeKey {
    pub fn new(bytes: &[u8]) -> Result<ProbeKey, String> {
        if bytes.len() < MIN_KEY_LEN {
            return Err(format!(
                "the key has {} bytes, fewer than {MIN_KEY_LEN}",
                bytes.len()
            ));
        }
        Ok(ProbeKey(bytes.into()))
    }

    /// The file's bytes, without trailing whitespace (a Secret made with `--from-literal`
    /// or `--from-file` of a hex string works either way).
    pub fn load(path: &Path) -> Result<ProbeKey, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let end = bytes
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |i| i + 1);
        ProbeKey::new(&bytes[..end]).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn mac(&self, signed: &[u8], target: IpAddr) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .expect("HMAC takes keys of any length");
        mac.update(signed);
        match target {
            IpAddr::V4(a) => mac.update(&a.octets()),
            IpAddr::V6(a) => mac.update(&a.octets()),
        }
        mac
    }
}

/// What a probe says about when and by whom it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub session: u64,
    pub counter: u64,
    pub unix_ms: u64,
}

/// The payload of a probe to `target`.
pub fn sign(key: &ProbeKey, stamp: Stamp, target: IpAddr) -> [u8; PAYLOAD_LEN] {
    let mut p = [0u8; PAYLOAD_LEN];
    p[..8].copy_from_slice(MAGIC);
    p[8..16].copy_from_slice(&stamp.session.to_be_bytes());
    p[16..24].copy_from_slice(&stamp.counter.to_be_bytes());
    p[24..32].copy_from_slice(&stamp.unix_ms.to_be_bytes());
    let tag = key.mac(&p[..32], target).finalize().into_bytes();
    p[32..].copy_from_slice(&tag[..MAC_LEN]);
    p
}

/// Why a payload was not taken for a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not a probe's size or magic (another ping).
    NotAProbe,
    /// Not signed with this key for any of this node's addresses.
    BadMac,
    /// Signed, but its clock is this far from ours (ms, positive: from the future).
    Skew(i64),
    /// Signed and fresh, but not newer than the last one accepted of its session.
    Replay,
}

/// The receiving side's checks, with the last accepted counter of each recent session.
#[derive(Debug)]
pub struct Verifier {
    key: ProbeKey,
    /// Session → (last accepted counter, its timestamp).
    sessions: HashMap<u64, (u64, u64)>,
}

impl Verifier {
    pub fn new(key: ProbeKey) -> Verifier {
        Verifier {
            key,
            sessions: HashMap::new(),
        }
    }

    /// Accepts `payload` as a probe to one of `own` (this node's addresses) at `now_unix_ms`.
    pub fn accept(
        &mut self,
        payload: &[u8],
        own: &[IpAddr],
        now_unix_ms: u64,
    ) -> Result<Stamp, Refused> {
        let p: &[u8; PAYLOAD_LEN] = payload
            .get(..PAYLOAD_LEN)
            .and_then(|p| p.try_into().ok())
            .ok_or(Refused::NotAProbe)?;
        if &p[..8] != MAGIC {
            return Err(Refused::NotAProbe);
        }
        // Constant-time comparison (`verify_truncated_left`): the MAC leaks nothing byte by byte.
        let valid = own.iter().any(|a| {
            self.key
                .mac(&p[..32], *a)
                .verify_truncated_left(&p[32..])
                .is_ok()
        });
        if !valid {
            return Err(Refused::BadMac);
        }
        let word = |i: usize| u64::from_be_bytes(p[i..i + 8].try_into().expect("8 bytes"));
        let stamp = Stamp {
            session: word(8),
            counter: word(16),
            unix_ms: word(24),
        };
        let skew = stamp.unix_ms as i64 - now_unix_ms as i64;
        if skew.unsigned_abs() > MAX_SKEW.as_millis() as u64 {
            return Err(Refused::Skew(skew));
        }
        if let Some((last, _)) = self.sessions.get(&stamp.session)
            && stamp.counter <= *last
        {
            return Err(Refused::Replay);
        }
        self.sessions
            .insert(stamp.session, (stamp.counter, stamp.unix_ms));
        if self.sessions.len() > MAX_SESSIONS
            && let Some(oldest) = self
                .sessions
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(s, _)| *s)
        {
            self.sessions.remove(&oldest);
        }
        Ok(stamp)
    }
}

/// The wall clock in Unix milliseconds (probes compare clocks across nodes).
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::egress_ip::ip;

    fn key(b: u8) -> ProbeKey {
        ProbeKey::new(&[b; 32]).unwrap()
    }

    const T: u64 = 1_800_000_000_000;

    fn stamp(counter: u64, unix_ms: u64) -> Stamp {
        Stamp {
            session: 7,
            counter,
            unix_ms,
        }
    }

    #[test]
    fn a_signed_probe_is_accepted_once_by_its_target_and_only_with_its_key() {
        let node = [ip("192.168.50.12"), ip("fd00::12")];
        let p = sign(&key(1), stamp(1, T), node[1]);
        let mut v = Verifier::new(key(1));
        assert_eq!(v.accept(&p, &node, T), Ok(stamp(1, T)));
        // The same probe again, or an older one of the session: a replay.
        assert_eq!(v.accept(&p, &node, T + 10), Err(Refused::Replay));
        let older = sign(&key(1), stamp(0, T + 5), node[0]);
        assert_eq!(v.accept(&older, &node, T + 10), Err(Refused::Replay));
        let next = sign(&key(1), stamp(2, T + 100), node[0]);
        assert_eq!(v.accept(&next, &node, T + 100), Ok(stamp(2, T + 100)));
        // Another session starts its own count.
        let other = sign(
            &key(1),
            Stamp {
                session: 8,
                ..stamp(1, T + 100)
            },
            node[0],
        );
        assert!(v.accept(&other, &node, T + 100).is_ok());
        // Signed for another node, or with another key.
        let elsewhere = sign(&key(1), stamp(3, T + 200), ip("192.168.50.13"));
        assert_eq!(v.accept(&elsewhere, &node, T + 200), Err(Refused::BadMac));
        let wrong_key = sign(&key(2), stamp(4, T + 200), node[0]);
        assert_eq!(v.accept(&wrong_key, &node, T + 200), Err(Refused::BadMac));
    }

    #[test]
    fn skew_beyond_the_window_either_way_is_refused() {
        let node = [ip("10.0.0.1")];
        let mut v = Verifier::new(key(1));
        let max = MAX_SKEW.as_millis() as u64;
        let p = sign(&key(1), stamp(1, T), node[0]);
        assert_eq!(
            v.accept(&p, &node, T + max + 1),
            Err(Refused::Skew(-(max as i64) - 1))
        );
        assert_eq!(
            v.accept(&p, &node, T - max - 1),
            Err(Refused::Skew(max as i64 + 1))
        );
        // At the edge of the window: accepted.
        assert!(v.accept(&p, &node, T + max).is_ok());
    }

    #[test]
    fn forged_and_tampered_payloads_are_refused() {
        let node = [ip("10.0.0.1")];
        let mut v = Verifier::new(key(1));
        // What probes carried before they were signed, and a truncated probe.
        assert_eq!(v.accept(MAGIC, &node, T), Err(Refused::NotAProbe));
        let p = sign(&key(1), stamp(1, T), node[0]);
        assert_eq!(v.accept(&p[..40], &node, T), Err(Refused::NotAProbe));
        let mut zeros = p;
        zeros[32..].fill(0);
        assert_eq!(v.accept(&zeros, &node, T), Err(Refused::BadMac));
        // A newer counter or timestamp written into a real probe breaks its MAC.
        let mut bumped = p;
        bumped[23] += 1;
        assert_eq!(v.accept(&bumped, &node, T), Err(Refused::BadMac));
        // Another ping's payload of the right length.
        assert_eq!(
            v.accept(&[0x41; PAYLOAD_LEN], &node, T),
            Err(Refused::NotAProbe)
        );
    }

    #[test]
    fn keys_are_at_least_32_bytes_and_trailing_whitespace_is_not_key() {
        assert!(ProbeKey::new(&[1; 31]).is_err());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
        let k = ProbeKey::load(&path).unwrap();
        assert_eq!(format!("{k:?}"), "ProbeKey(64 bytes)");
        let p = sign(&k, stamp(1, T), ip("10.0.0.1"));
        let from_literal = ProbeKey::new("ab".repeat(32).as_bytes()).unwrap();
        assert!(
            Verifier::new(from_literal)
                .accept(&p, &[ip("10.0.0.1")], T)
                .is_ok()
        );
        std::fs::write(&path, "short\n").unwrap();
        let e = ProbeKey::load(&path).unwrap_err();
        assert!(e.contains("fewer than 32"), "{e}");
        let e = ProbeKey::load(&dir.path().join("missing")).unwrap_err();
        assert!(e.contains("missing"), "{e}");
    }
}
