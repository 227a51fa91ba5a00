//! Kernel tests of the agent as a process: its modes on a manifest directory, and kube mode
//! against a fake API server. One binary (one link); they need root and fail, never skip,
//! without it (see docs/testing.md).

mod agent;
mod egress_ip_assign;
mod egress_ip_cloud;
mod egress_ip_conflict;
mod egress_ip_failover;
mod explain_live;
mod kube;
mod lease;
mod sandbox;
