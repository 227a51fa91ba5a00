//! Kernel tests of the dataplane: each feature's rules and routes applied by the agent in a
//! lab of network namespaces, checked with real traffic; the lab itself; the net backend.
//! One binary (one link) for all of them; they need root and fail, never skip, without it
//! (see docs/testing.md).

mod acl_log;
mod acl_log_bridged;
mod dns;
mod dns_attacks;
mod dns_flood;
mod dns_policy;
mod dns_share;
mod egress_ip;
mod explain_bridged;
mod failclosed;
mod fence;
mod firewall;
mod hostile_input;
mod lab_selftest;
mod listeners;
mod net;
mod netpol;
mod netpol_attacks;
mod netpol_bridged;
mod netpol_bridged_attacks;
mod netpol_explain;
mod netpol_guard_metrics;
mod netpol_interplay;
mod netpol_scenarios;
mod probe;
mod qos;
mod rule_counters;
mod sandbox;
mod services;
mod services_lb_status;
mod services_parity;
