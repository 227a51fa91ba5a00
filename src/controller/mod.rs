//! Cluster-wide roles: work that exactly one agent of the cluster does at a time, elected
//! with a `coordination.k8s.io/v1` Lease ([`lease`]): the EgressIP assigner ([`egress_ip`]).

pub mod egress_ip;
pub mod lease;
