//! Address conflicts: another host on the segment answered ARP (IPv6: neighbour
//! advertisements) for an egress IP this node added. The net backend finds them when it adds
//! the address (`crate::net::conflict`: it waits for the holder to let go, at most a second,
//! then adds it anyway so the IP is not left unserved); this turns each into the EgressIP's
//! status line and a Warning Event with OVN-Kubernetes' reason `EgressIPConflict`, so alerts
//! written for it fire. The node that holds the address reports it (only it can see it).

use super::status::event_note;
use crate::api::egress_ip::event_reason;
use crate::net::AddressConflict;
use crate::plan::{NodeEvent, ObjectStatus};
use crate::snapshot::{Kind, Snapshot};

/// Amends the EgressIP statuses of `statuses` with `conflicts` (the net backend's, after the
/// apply): each EgressIP asking for a conflicting IP gets the problem in its status line and
/// an `EgressIPConflict` Event from this node.
pub fn report_conflicts(
    snapshot: &Snapshot,
    node: &str,
    conflicts: &[AddressConflict],
    statuses: &mut [ObjectStatus],
) {
    for c in conflicts {
        for (name, object) in snapshot.egress_ips() {
            let Ok(valid) = object.validate() else {
                continue;
            };
            let Some(i) = valid.ips.iter().position(|ip| *ip == c.addr) else {
                continue;
            };
            let msg = format!(
                "spec.egressIPs[{i}]: {}: another host ({}) on {} answers for it too; node \
                 {node} holds it as well: two hosts answer for the address",
                c.addr, c.holder, c.dev
            );
            for s in statuses
                .iter_mut()
                .filter(|s| s.kind == Kind::EgressIP && s.key.name == *name)
            {
                s.result = match &s.result {
                    Ok(()) => Err(msg.clone()),
                    Err(e) => Err(format!("{e}; {msg}")),
                };
                let note = match s.event.take() {
                    None => event_note(node, &msg),
                    Some(e) => format!("{}; {msg}", e.note),
                };
                s.event = Some(NodeEvent {
                    reason: event_reason::CONFLICT_WITH_NODE,
                    note,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::ObjectKey;
    use crate::testing::objects;

    #[test]
    fn a_conflict_is_the_status_line_and_an_egress_ip_conflict_event() {
        let eip = objects::egress_ip("e", &["10.0.0.9", "192.168.50.200"], &[("team", "a")])
            .hosted(&[("192.168.50.200", "worker-1")])
            .object();
        let snap = Snapshot::builder().with(eip).build();
        let mut statuses = vec![ObjectStatus {
            kind: Kind::EgressIP,
            key: ObjectKey::cluster("e"),
            result: Ok(()),
            event: None,
        }];
        let conflict = AddressConflict {
            addr: "192.168.50.200".parse().unwrap(),
            dev: "eth0".into(),
            holder: "02:00:00:00:00:01".into(),
        };
        report_conflicts(&snap, "worker-1", &[conflict], &mut statuses);
        let want = "spec.egressIPs[1]: 192.168.50.200: another host (02:00:00:00:00:01) on eth0 \
                    answers for it too; node worker-1 holds it as well: two hosts answer for the \
                    address";
        assert_eq!(statuses[0].result, Err(want.to_string()));
        let event = statuses[0].event.as_ref().unwrap();
        assert_eq!(event.reason, "EgressIPConflict");
        assert_eq!(event.note, format!("node worker-1: {want}"));
    }
}
