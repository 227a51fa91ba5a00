//! The kernel tests of every feature the agent process runs, run again inside the
//! DaemonSet's sandbox (`nodeplane::testing::lab::sandbox`: the node's netns, read-only
//! `/proc/sys`, `/sys` and root filesystem but the state directory, uid 0 with only the
//! capabilities `deploy/daemonset.yaml` adds). Each reuses its feature module's test body, so
//! the two runs prove the same behaviour; drift repair is in `kernel_nft::sandbox`.

use nodeplane::testing::lab::{Lab, ManifestAgent, eventually, sandboxed, sandboxed_with};
use std::net::SocketAddr;
use std::time::Duration;

#[test]
fn egress_ip_steering_in_the_sandbox() {
    sandboxed(crate::egress_ip::egress_ip_snat_steering_announcement_move_delete_and_cleanup);
}

#[test]
fn egress_ip_steering_with_strict_rp_filter_in_the_sandbox() {
    sandboxed(crate::egress_ip::steering_with_strict_rp_filter);
}

#[test]
fn dns_proxy_in_the_sandbox() {
    sandboxed(crate::dns::rotating_answers_are_allowed_before_the_pod_connects);
}

#[test]
fn services_udp_conntrack_cleanup_in_the_sandbox() {
    sandboxed(crate::services::removed_endpoint_gets_no_new_connections_and_its_udp_flow_moves);
}

#[test]
fn services_health_check_in_the_sandbox() {
    sandboxed(crate::services::health_check_node_port_counts_ready_local_endpoints);
}

#[test]
fn network_policy_in_the_sandbox() {
    sandboxed(
        crate::netpol::run_mode_applies_edits_and_deletes_live_and_keeps_the_last_valid_version,
    );
}

/// Without CAP_NET_BIND_SERVICE the DNS proxy cannot answer from port 53: the agent says so
/// at start, in the log and in `/readyz` (degraded), instead of counting every lost answer
/// as a `reply` error. A sysctl the features rely on (forwarding, off in a plain host netns)
/// is read, reported in both places, and left as it is.
#[test]
fn a_missing_capability_and_forwarding_off_are_reported_in_the_log_and_readyz() {
    let mut lab = Lab::new();
    let host = lab.add_host("plain");
    let forwarding = || host.run(&["cat", "/proc/sys/net/ipv4/conf/all/forwarding"]);
    assert_eq!(forwarding().trim(), "0");
    let agent = ManifestAgent::new(&host, "node-1", &[]);
    let admin: SocketAddr = "127.0.0.1:9942".parse().unwrap();
    let running = sandboxed_with(&["NET_ADMIN", "NET_RAW"], || agent.spawn(&[]));
    let body = eventually(Duration::from_secs(15), || {
        match host.http_get(admin, "/readyz", Duration::from_secs(1)) {
            // The capability check runs first thing, the proxy starts after the first list.
            Ok((503, body))
                if body.contains("CAP_NET_BIND_SERVICE")
                    && body.contains("dns proxy: not started") =>
            {
                Ok(body)
            }
            other => Err(format!("{other:?}\n{}", running.logs())),
        }
    });
    assert!(
        body.starts_with("degraded: capabilities: missing capability CAP_NET_BIND_SERVICE"),
        "{body}"
    );
    assert!(body.contains("dns proxy: not started"), "{body}");
    assert!(body.contains("Permission denied"), "{body}");
    assert!(
        body.contains("warning: net.ipv4.conf.all.forwarding: is 0, not 1"),
        "{body}"
    );
    let (_, logs) = running.kill();
    assert!(
        logs.contains("ERROR") && logs.contains("missing capability CAP_NET_BIND_SERVICE"),
        "{logs}"
    );
    assert!(logs.contains("dns proxy not started"), "{logs}");
    assert!(
        logs.contains("net.ipv4.conf.all.forwarding is 0, not 1"),
        "{logs}"
    );
    assert_eq!(forwarding().trim(), "0", "the agent changed no sysctl");
}
