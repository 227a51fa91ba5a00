//! The transparent DNS proxy of EgressFirewall `dnsName` rules (see README "EgressFirewall
//! DNS"): pod DNS of namespaces with `dnsName` rules is steered here by nftables `tproxy`;
//! each answer's addresses of watched names are written to the learned sets, acknowledged by
//! the kernel, before the answer goes on to the pod.

pub mod answer;
pub mod learn;
