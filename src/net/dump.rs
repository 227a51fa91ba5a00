//! One rtnetlink dump, consistent or failed: shared by the backend's reads (`rtnl`) and the
//! bridge ports' (`bridge_ports`).

use futures::StreamExt;
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::Handle;
use rtnetlink::packet_core::{
    NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};

use super::NetError;

/// Attempts at a consistent dump before giving up (the kernel flags a dump that raced with a
/// change with `NLM_F_DUMP_INTR`).
const DUMP_ATTEMPTS: usize = 5;

pub(super) fn netlink_err(what: &str, e: impl std::fmt::Display) -> NetError {
    NetError::Netlink {
        what: what.into(),
        reason: e.to_string(),
    }
}

/// One dump request; retried while the kernel reports it as interrupted.
pub(super) async fn dump(
    handle: &Handle,
    what: &str,
    request: RouteNetlinkMessage,
) -> Result<Vec<RouteNetlinkMessage>, NetError> {
    for _ in 0..DUMP_ATTEMPTS {
        let mut msg = NetlinkMessage::from(request.clone());
        msg.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut replies = handle
            .clone()
            .request(msg)
            .map_err(|e| netlink_err(what, e))?;
        let mut out = Vec::new();
        let mut interrupted = false;
        while let Some(reply) = replies.next().await {
            interrupted |= reply.header.flags & NLM_F_DUMP_INTR != 0;
            match reply.payload {
                NetlinkPayload::InnerMessage(inner) => out.push(inner),
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    return Err(netlink_err(what, e.to_io()));
                }
                _ => {}
            }
        }
        if !interrupted {
            return Ok(out);
        }
    }
    Err(netlink_err(
        what,
        format!("dump interrupted by concurrent changes {DUMP_ATTEMPTS} times"),
    ))
}
