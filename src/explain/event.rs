//! What the evaluator records: one [`Event`] per decision a packet meets, and the [`Path`]
//! one walk takes (one per choice of `numgen` bucket).

use super::packet::Packet;
use serde::Serialize;

/// One decision: where (table, hook, base chain, chain, rule), why (the rule's comment, the
/// set or map element that matched), and what it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// `inet` or `bridge`.
    pub table: &'static str,
    pub hook: &'static str,
    /// The base chain the hook entered (the walk may be deeper, in `chain`).
    pub base: String,
    pub chain: String,
    /// The rule's position in `chain` (0-based); `None` for the chain's policy.
    pub rule: Option<usize>,
    pub comment: Option<String>,
    /// The rule as `--dry-run` prints it (`None` for the policy).
    pub rule_text: Option<String>,
    pub element: Option<ElementHit>,
    pub action: Action,
}

/// The set or map element a lookup matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ElementHit {
    pub set: String,
    pub key: String,
    pub comment: Option<String>,
}

/// What a decision did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    Accept,
    Drop,
    Reject {
        with: String,
    },
    Jump {
        to: String,
    },
    Goto {
        to: String,
    },
    Return,
    Dnat {
        to: String,
    },
    Snat {
        to: String,
    },
    Masquerade,
    Mark {
        from: u32,
        to: u32,
    },
    Dscp {
        value: u8,
    },
    Tproxy {
        port: u16,
    },
    Log {
        prefix: String,
    },
    SetAdd {
        set: String,
    },
    /// The rule matched and the walk went on (a trace's `continue`: its statements did
    /// something that is no verdict, such as a counter or a mark).
    Continue,
    /// The rule depends on what the evaluator cannot know offline; `assumed` says how it
    /// was taken.
    Unknown {
        what: String,
        assumed: String,
    },
}

impl Action {
    /// A translation (DNAT, SNAT, masquerade).
    pub fn is_nat(&self) -> bool {
        matches!(
            self,
            Action::Dnat { .. } | Action::Snat { .. } | Action::Masquerade
        )
    }
}

/// How a walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Passed every hook: delivered to a local socket.
    DeliveredLocally,
    /// Passed every hook: routed out of the node (or to a pod behind it).
    Forwarded,
    /// Passed the bridge table: bridged to the pod's port.
    Bridged,
    Dropped,
    Rejected,
}

/// One walk: the choices of `numgen` it took, its decisions, its end, and the packet as it
/// leaves (after NAT).
#[derive(Debug, Clone, Serialize)]
pub struct Path {
    pub choices: Vec<Choice>,
    pub hooks: Vec<String>,
    pub events: Vec<Event>,
    pub verdict: Verdict,
    #[serde(skip)]
    pub packet: Packet,
}

/// A `numgen random mod N` the walk met and the bucket it took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Choice {
    pub chain: String,
    pub picked: u32,
    pub of: u32,
}
