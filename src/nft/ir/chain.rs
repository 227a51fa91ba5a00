//! Chains and rules: base chains with their type, hook, priority and policy, regular chains
//! reached by jump, goto or vmap, and the rules (statements plus a comment) they hold.

use super::stmt::Stmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChainType {
    Filter,
    Nat,
    Route,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

impl Hook {
    /// The nft keyword (`hook prerouting`).
    pub fn keyword(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Input => "input",
            Hook::Forward => "forward",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Policy {
    Accept,
    Drop,
}

/// Well-known priorities (see nft(8) "CHAINS"), kept numeric in the IR.
pub mod priority {
    pub const RAW: i32 = -300;
    pub const MANGLE: i32 = -150;
    pub const DSTNAT: i32 = -100;
    pub const FILTER: i32 = 0;
    pub const SECURITY: i32 = 50;
    pub const SRCNAT: i32 = 100;
}

/// Hook attachment of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BaseChain {
    pub kind: ChainType,
    pub hook: Hook,
    pub priority: i32,
    pub policy: Policy,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    /// `None` for a regular chain reached by jump/goto/vmap.
    pub base: Option<BaseChain>,
    pub rules: Vec<Rule>,
}

impl Chain {
    pub fn regular(name: impl Into<String>) -> Self {
        Chain {
            name: name.into(),
            base: None,
            rules: Vec::new(),
        }
    }

    pub fn base(name: impl Into<String>, base: BaseChain) -> Self {
        Chain {
            name: name.into(),
            base: Some(base),
            rules: Vec::new(),
        }
    }

    pub fn push(&mut self, rule: Rule) -> &mut Self {
        self.rules.push(rule);
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    pub stmts: Vec<Stmt>,
    /// Shown by `nft list`; tells an operator which object a rule came from.
    pub comment: Option<String>,
}

impl Rule {
    pub fn new(stmts: Vec<Stmt>) -> Self {
        Rule {
            stmts,
            comment: None,
        }
    }

    pub fn with_comment(mut self, comment: impl Into<String>) -> Self {
        self.comment = Some(comment.into());
        self
    }
}
