//! The EgressIP control plane's kernel tests inside the DaemonSet's sandbox
//! (`nodeplane::testing::lab::sandbox`; the dataplane features' are in
//! `kernel_dataplane::sandbox`): assignment and failover with the node probes (raw ICMP,
//! CAP_NET_RAW), and fencing, in Kubernetes mode against the fake API server.

use nodeplane::testing::lab::sandboxed;

#[test]
fn egress_ip_failover_in_the_sandbox() {
    sandboxed(
        crate::egress_ip_failover::an_egress_ip_without_status_is_placed_and_moves_when_its_node_dies,
    );
}

#[test]
fn egress_ip_fencing_in_the_sandbox() {
    sandboxed(crate::egress_ip_failover::a_node_cut_off_from_the_assigner_and_the_api_server_drops_its_ip_and_keeps_it_dropped);
}
