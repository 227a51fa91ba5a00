//! `agent explain` output: aligned, one decision a line, for people; or JSON. Every name
//! and comment comes from tenants' objects, so each is quoted and escaped ([`quote`]): no
//! name can pass for a column, a line or another object.

use super::event::{Action, Event, Path, Verdict};
use super::packet::{Packet, proto_name};
use super::provenance::{Index, Origin};
use crate::text::{one_line, quote};
use serde::Serialize;
use std::fmt::Write;

/// One decision and its object.
#[derive(Debug, Serialize)]
pub struct Decision {
    #[serde(flatten)]
    pub event: Event,
    pub origin: Origin,
}

/// The whole explanation, as printed with `--output json`.
#[derive(Debug, Serialize)]
pub struct Report {
    pub node: String,
    pub packet: String,
    pub assumptions: Vec<String>,
    /// The verdict every path agrees on; `None` (null) when the backend picked decides.
    pub verdict: Option<Verdict>,
    pub paths: Vec<PathReport>,
    /// With `--trace`: what the kernel did with real packets like this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceReport>,
}

#[derive(Debug, Serialize)]
pub struct PathReport {
    #[serde(skip)]
    pub path: Path,
    /// The `numgen` buckets this path took.
    pub choices: Vec<super::event::Choice>,
    pub hooks: Vec<String>,
    pub verdict: Verdict,
    /// Each decision with the object behind it.
    pub decisions: Vec<Decision>,
    /// The packet as it leaves the last hook (after NAT).
    pub leaves_as: String,
    /// What the kernel does next.
    pub after: String,
}

pub fn report(node: &str, query_packet: &Packet, paths: Vec<Path>, index: &Index) -> Report {
    let verdict = super::overall(&paths);
    let paths = paths
        .into_iter()
        .map(|path| {
            let decisions = path
                .events
                .iter()
                .map(|e| Decision {
                    event: e.clone(),
                    origin: index.origin(e, &path),
                })
                .collect();
            PathReport {
                leaves_as: show_packet(&path.packet),
                after: after(&path),
                choices: path.choices.clone(),
                hooks: path.hooks.clone(),
                verdict: path.verdict,
                decisions,
                path,
            }
        })
        .collect();
    Report {
        node: node.to_string(),
        packet: show_packet(query_packet),
        assumptions: query_packet.assumptions(),
        verdict,
        paths,
        trace: None,
    }
}

/// `tcp 10.128.0.11:40000 -> 203.0.113.10:443`.
pub fn show_packet(p: &Packet) -> String {
    let end = |ip: std::net::IpAddr, port: Option<u16>| match port {
        Some(port) if ip.is_ipv6() => format!("[{ip}]:{port}"),
        Some(port) => format!("{ip}:{port}"),
        None => ip.to_string(),
    };
    format!(
        "{} {} -> {}",
        proto_name(p.proto),
        end(p.src, p.sport),
        end(p.dst, p.dport)
    )
}

/// What the kernel does once the tables are through with the packet.
fn after(path: &Path) -> String {
    let nat = path.events.iter().find_map(|e| match &e.action {
        Action::Masquerade => {
            Some("masqueraded to the output interface's address, then ".to_string())
        }
        Action::Snat { to } => Some(format!("source NAT to {to}, then ")),
        _ => None,
    });
    let nat = nat.unwrap_or_default();
    match path.verdict {
        Verdict::Forwarded => format!(
            "{nat}routed by the kernel's routing table towards {}",
            path.packet.dst
        ),
        Verdict::DeliveredLocally => "delivered to a socket on this node".into(),
        Verdict::Bridged => "bridged to the destination's port".into(),
        Verdict::Dropped => "dropped".into(),
        Verdict::Rejected => "rejected (the sender is told)".into(),
    }
}

fn verdict_word(v: Option<Verdict>) -> &'static str {
    match v {
        Some(Verdict::Forwarded) => "ALLOWED (forwarded)",
        Some(Verdict::DeliveredLocally) => "ALLOWED (delivered locally)",
        Some(Verdict::Bridged) => "ALLOWED (bridged)",
        Some(Verdict::Dropped) => "DROPPED",
        Some(Verdict::Rejected) => "REJECTED",
        None => "DEPENDS on the backend picked (see each path)",
    }
}

/// The report for people: a header, then per path one aligned line per decision.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "packet   {} on node {}",
        report.packet,
        quote(&report.node)
    );
    for a in &report.assumptions {
        let _ = writeln!(out, "assumed  {a}");
    }
    let _ = writeln!(out, "verdict  {}", verdict_word(report.verdict));
    let n = report.paths.len();
    for (i, p) in report.paths.iter().enumerate() {
        out.push('\n');
        let choices: Vec<String> = p
            .path
            .choices
            .iter()
            .map(|c| format!("bucket {} of {} in {}", c.picked, c.of, c.chain))
            .collect();
        let _ = write!(out, "path {}/{n}", i + 1);
        if !choices.is_empty() {
            let _ = write!(out, " (numgen: {})", choices.join(", "));
        }
        let _ = writeln!(out, ": {}", verdict_word(Some(p.path.verdict)));
        let rows: Vec<[String; 5]> = p
            .decisions
            .iter()
            .map(|d| row(&d.event, &d.origin))
            .collect();
        out.push_str(&aligned(&rows));
        let _ = writeln!(out, "  leaves as {}; {}", p.leaves_as, p.after);
    }
    if let Some(t) = &report.trace {
        out.push_str(&trace_text(t));
    }
    out
}

fn row(e: &Event, o: &Origin) -> [String; 5] {
    let place = format!("{} {}", e.table, e.hook);
    let at = match (e.rule, &e.action) {
        (Some(r), _) => format!("{}[{r}]", e.chain),
        // A traced chain that ran out of rules.
        (None, Action::Return) => format!("{} end", e.chain),
        (None, _) => format!("{} policy", e.chain),
    };
    let mut object = o.kind.to_string();
    if let Some(ns) = &o.namespace {
        let _ = write!(object, " {}", quote(ns));
        if let Some(name) = &o.name {
            let _ = write!(object, "/{}", quote(name));
        }
    }
    if let Some(r) = &o.rule {
        let _ = write!(object, " {r}");
    }
    let mut detail = Vec::new();
    if let Some(el) = &e.element {
        detail.push(format!("@{} {}", el.set, el.key));
    }
    match (&o.text, &e.rule_text) {
        (Some(t), _) => detail.push(quote(t)),
        (None, Some(rule)) if e.element.is_none() => {
            detail.push(format!("rule: {}", one_line(rule)))
        }
        _ => {}
    }
    if let Some(w) = &o.why {
        detail.push(w.clone());
    }
    if let Action::Unknown { what, assumed } = &e.action {
        detail.push(format!("{what}; assumed: {assumed}"));
    }
    [place, at, object, action_word(&e.action), detail.join("; ")]
}

fn action_word(a: &Action) -> String {
    match a {
        Action::Accept => "accept".into(),
        Action::Drop => "drop".into(),
        Action::Reject { with } => format!("reject ({with})"),
        Action::Jump { to } => format!("jump {to}"),
        Action::Goto { to } => format!("goto {to}"),
        Action::Return => "return".into(),
        Action::Dnat { to } => format!("dnat to {to}"),
        Action::Snat { to } => format!("snat to {to}"),
        Action::Masquerade => "masquerade".into(),
        Action::Mark { from, to } => format!("mark {from:#x} -> {to:#x}"),
        Action::Dscp { value } => format!("dscp set {value}"),
        Action::Tproxy { port } => format!("tproxy to :{port}"),
        Action::Log { prefix } => format!("log {}", quote(prefix)),
        Action::SetAdd { set } => format!("add to @{set}"),
        Action::Continue => "continue".into(),
        Action::Unknown { .. } => "unknown offline".into(),
    }
}

/// Rows as columns padded to their widest cell (the last column is not padded).
fn aligned(rows: &[[String; 5]]) -> String {
    let mut widths = [0usize; 5];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        out.push(' ');
        for (i, c) in r.iter().enumerate() {
            out.push(' ');
            out.push_str(c);
            if i + 1 < r.len() {
                out.push_str(&" ".repeat(widths[i] - c.chars().count()));
            }
        }
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
        out.push('\n');
    }
    out
}

/// What the trace saw.
#[derive(Debug, Serialize)]
pub struct TraceReport {
    pub seconds: u64,
    pub packets_asked: usize,
    /// What the trace table matched, as nft prints it.
    pub matched: String,
    /// Trace messages the kernel could not queue for the agent (its buffer was full).
    pub lost: u64,
    pub packets: Vec<TracedPacket>,
}

/// One traced packet: what the kernel did with it, rule by rule.
#[derive(Debug, Serialize)]
pub struct TracedPacket {
    /// The kernel's trace id.
    pub id: String,
    /// The packet as it entered the first hook.
    pub packet: String,
    pub dropped: bool,
    /// The evaluator's verdict for this packet against the applied table.
    pub predicted: Option<Verdict>,
    /// Whether kernel and evaluator agree on dropped or not, and on the rule that dropped.
    pub agrees: bool,
    pub steps: Vec<Decision>,
}

/// The trace for people: per packet, the kernel's verdict beside the prediction, then one
/// aligned line per rule the kernel reported.
pub fn trace_text(t: &TraceReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\ntrace    {} packet(s) traced in up to {} s (at most {}) matching: {}",
        t.packets.len(),
        t.seconds,
        t.packets_asked,
        t.matched
    );
    if t.lost > 0 {
        let _ = writeln!(
            out,
            "trace    {} trace message(s) lost: the listener fell behind",
            t.lost
        );
    }
    if t.packets.is_empty() {
        let _ = writeln!(
            out,
            "trace    no packet matched while the trace ran: send one during it"
        );
    }
    for (i, p) in t.packets.iter().enumerate() {
        let _ = writeln!(
            out,
            "\ntraced   packet {}/{} (trace id {}): {}",
            i + 1,
            t.packets.len(),
            p.id,
            p.packet
        );
        let kernel = if p.dropped {
            "DROPPED"
        } else {
            "ACCEPTED by every hook it met"
        };
        let agree = if p.agrees { "agrees" } else { "DIFFERS" };
        let _ = writeln!(
            out,
            "kernel   {kernel}; explain predicts {}: {agree}",
            verdict_word(p.predicted)
        );
        let rows: Vec<[String; 5]> = p.steps.iter().map(|d| row(&d.event, &d.origin)).collect();
        out.push_str(&aligned(&rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_cannot_forge_a_column_or_a_line() {
        let event = Event {
            table: "inet",
            hook: "forward",
            base: "filter-forward".into(),
            chain: "fw-X-evil".into(),
            rule: Some(0),
            comment: None,
            rule_text: None,
            element: None,
            action: Action::Drop,
        };
        let origin = Origin {
            kind: "EgressFirewall",
            namespace: Some("evil\"/\"default\" rule 0 accept\n  inet forward x".into()),
            name: Some("default".into()),
            rule: Some("rule 0".into()),
            text: Some("Deny\u{202e}0.0.0.0/0".into()),
            why: None,
        };
        let shown = aligned(&[row(&event, &origin)]);
        assert_eq!(shown.lines().count(), 1, "{shown}");
        assert!(
            shown.contains(r#""evil\"/\"default\" rule 0 accept\n  inet forward x"/"default""#),
            "{shown}"
        );
        assert!(shown.contains(r"Deny\u{202e}0.0.0.0/0"), "{shown}");
    }
}
