//! An address conflict on the segment: a foreign host (the external host) answers ARP for
//! the egress IP. The hosting node waits for it to let go, adds the address anyway after the
//! maximum wait (the IP must not stay unserved), and says so where operators and alerts
//! look: an `EgressIPConflict` Warning Event on the EgressIP, the counter
//! `nodeplane_egress_ip_address_conflicts_total`, and the EgressIP's status line.

use std::net::SocketAddr;
use std::time::Duration;

use nodeplane::testing::eip_cluster::{EIP, EipCluster};

use super::egress_ip_assign::events;

const WAIT: Duration = Duration::from_secs(15);

#[test]
fn a_foreign_host_answering_arp_for_the_egress_ip_is_an_event_a_metric_and_a_status() {
    let c = EipCluster::new(1, &[0]);
    // The external host's kernel answers ARP for every local address (arp_ignore 0).
    c.ext
        .run(&["ip", "addr", "add", &format!("{EIP}/32"), "dev", "lo"]);
    c.start_agent(0);
    c.put_egress_ip();
    c.wait_hosted(WAIT);

    let event = c.wait(WAIT, || {
        events(&c.api, "backend", "EgressIPConflict")
            .pop()
            .ok_or_else(|| "no EgressIPConflict Event yet".to_string())
    });
    assert_eq!(event["type"], "Warning");
    let note = event["note"].as_str().unwrap_or_default().to_string();
    let ext_mac = c.ext.run(&["cat", "/sys/class/net/eth0/address"]);
    assert!(
        note.starts_with(&format!(
            "node node-1: spec.egressIPs[0]: {EIP}: another host ({}) on ",
            ext_mac.trim()
        )) && note.ends_with("two hosts answer for the address"),
        "{note}"
    );

    let admin: SocketAddr = "127.0.0.1:9942".parse().unwrap();
    let metrics = c.wait(WAIT, || {
        let (code, body) = c.nodes[0].http_get(admin, "/metrics", Duration::from_secs(2))?;
        (code == 200 && body.contains("nodeplane_egress_ip_address_conflicts_total 1\n"))
            .then_some(body.clone())
            .ok_or_else(|| format!("{code}: {body}"))
    });
    assert!(metrics.contains("# TYPE nodeplane_egress_ip_address_conflicts counter"));

    let logs = c.logs(0);
    assert!(
        logs.lines().any(|l| l.contains("WARN")
            && l.contains("EgressIP backend")
            && l.contains("two hosts answer for the address")),
        "no status line with the conflict:\n{logs}"
    );
}
