//! ACL logging's reader: the task that reads the logged verdicts from NFLOG and writes each
//! as one structured log line (target `acl_log`):
//!
//! ```text
//! WARN acl_log: ACL verdict namespace="web" kind=EgressFirewall object="default"
//!   rule="rule 1: Deny 0.0.0.0/0" verdict=deny severity=warning proto=tcp
//!   src=10.128.0.5 sport=40000 dst=203.0.113.10 dport=80
//! ```
//!
//! The planner (`plan::acl_log`) sends each logged verdict to NFLOG with a prefix that is
//! only an id; the [`Book`] of the last applied plan maps it back to namespace, object and
//! rule. The severity picks the line's level: `alert` error, `warning` warn, `notice` and
//! `info` info, `debug` debug.
//!
//! Bounded: the kernel lets through at most the rate limit per namespace (the log, never the
//! verdict, is what it drops beyond), the reader holds one datagram, and a reader that falls
//! behind loses log messages in the kernel (`ENOBUFS`, counted and reported), never the
//! control loop's time: it is a task of its own beside the loop. The group is bound only
//! once a plan logs something, so an agent without ACL logging leaves it to others.

pub mod nflog;
pub mod packet;

use crate::config::acl_log::AclLogSettings;
use crate::plan::acl_log::{Book, Entry, parse_prefix};
use crate::task::{OnExit, Task};
use nflog::{Logged, RECV_BUF, Reader};
use packet::{FiveTuple, ProtoName, five_tuple};
use std::sync::Arc;
use tokio::sync::watch;
use tracing::{Level, debug, info, warn};

/// The log target of the verdict lines (`RUST_LOG=acl_log=debug` shows `debug` ones).
pub const TARGET: &str = "acl_log";
/// The message of every verdict line.
pub const MESSAGE: &str = "ACL verdict";

/// The reader task: binds `settings.group` once `book` has something logged.
pub fn task(settings: AclLogSettings, book: watch::Receiver<Arc<Book>>) -> impl Task {
    crate::task::task("acl-log", OnExit::Restart, move |mut ctx| {
        let book = book.clone();
        async move { ctx.until_stopped(run(settings.group, book)).await }
    })
}

async fn run(group: u16, mut book: watch::Receiver<Arc<Book>>) -> Result<(), String> {
    book.wait_for(|b| !b.entries.is_empty())
        .await
        .map_err(|_| "the control loop is gone".to_string())?;
    let mut reader = Reader::bind(group)
        .await
        .map_err(|e| format!("NFLOG group {group}: bind: {e}"))?;
    info!("ACL logging: reading NFLOG group {group}");
    let mut buf = bytes::BytesMut::with_capacity(RECV_BUF);
    let mut lost: u64 = 0;
    loop {
        match reader.next(&mut buf).await {
            Ok(packets) => {
                let book = book.borrow().clone();
                for p in &packets {
                    write(&book, p);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                lost += 1;
                warn!("ACL logging: the kernel dropped log messages ({lost} times so far)");
            }
            Err(e) => return Err(format!("NFLOG group {group}: recv: {e}")),
        }
    }
}

/// Writes the line of one logged packet; a prefix not of ours (someone else's rule logging
/// to the group) is skipped, an id the last plan does not have (a verdict just removed)
/// is noted at debug level.
pub fn write(book: &Book, packet: &Logged) {
    let Some(id) = parse_prefix(&packet.prefix) else {
        return;
    };
    match book.entries.get(&id) {
        Some(entry) => line(entry, five_tuple(&packet.payload)),
        None => debug!(target: TARGET, "ACL verdict {id:016x} not in the current plan"),
    }
}

fn line(e: &Entry, t: Option<FiveTuple>) {
    let level = match e.severity {
        crate::api::acl_logging::Severity::Alert => Level::ERROR,
        crate::api::acl_logging::Severity::Warning => Level::WARN,
        crate::api::acl_logging::Severity::Notice | crate::api::acl_logging::Severity::Info => {
            Level::INFO
        }
        crate::api::acl_logging::Severity::Debug => Level::DEBUG,
    };
    let unknown = || "?".to_string();
    let (src, dst) = t.map_or_else(
        || (unknown(), unknown()),
        |t| (t.src.to_string(), t.dst.to_string()),
    );
    let (proto, sport, dport) = t.map_or((unknown(), 0, 0), |t| {
        (ProtoName(t.proto).to_string(), t.sport, t.dport)
    });
    macro_rules! emit {
        ($level:expr) => {
            tracing::event!(
                target: TARGET,
                $level,
                namespace = ?e.namespace,
                kind = e.kind,
                object = ?e.object,
                rule = ?e.rule,
                verdict = e.action.as_str(),
                severity = e.severity.as_str(),
                proto = %proto,
                src = %src,
                sport,
                dst = %dst,
                dport,
                "{MESSAGE}"
            )
        };
    }
    match level {
        Level::ERROR => emit!(Level::ERROR),
        Level::WARN => emit!(Level::WARN),
        Level::INFO => emit!(Level::INFO),
        _ => emit!(Level::DEBUG),
    }
}
