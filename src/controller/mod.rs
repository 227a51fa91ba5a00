//! Cluster-wide controllers run by one agent at a time (the leader).
pub mod egress_ip;
