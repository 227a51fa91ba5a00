//! ACL logging (`--acl-log-*`): where the kernel sends the logged verdicts of namespaces with
//! the `k8s.ovn.org/acl-logging` annotation, and how many per second it lets through.

use super::{FileConfig, setting};
use crate::cli::Opts;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclLogSettings {
    /// The NFLOG group the `log` statements send to and the agent reads (`--acl-log-group`).
    pub group: u16,
    /// Logged packets per second per namespace and IP family, also the burst
    /// (`--acl-log-rate-limit`); at least 1.
    pub rate_limit: u32,
}

/// Not 0, the group iptables' NFLOG and ulogd use unless told otherwise.
pub const DEFAULT_ACL_LOG_GROUP: u16 = 100;
/// OVN-Kubernetes' `acl-logging-rate-limit` default (messages per second).
pub const DEFAULT_ACL_LOG_RATE_LIMIT: u32 = 20;

impl Default for AclLogSettings {
    fn default() -> Self {
        AclLogSettings {
            group: DEFAULT_ACL_LOG_GROUP,
            rate_limit: DEFAULT_ACL_LOG_RATE_LIMIT,
        }
    }
}

/// `--acl-log-*` over the config file over the defaults.
pub(super) fn settings(opts: &Opts, file: &FileConfig) -> AclLogSettings {
    AclLogSettings {
        group: setting(
            opts.acl_log_group,
            file.acl_log_group,
            DEFAULT_ACL_LOG_GROUP,
        ),
        rate_limit: setting(
            opts.acl_log_rate_limit,
            file.acl_log_rate_limit,
            DEFAULT_ACL_LOG_RATE_LIMIT,
        )
        .max(1),
    }
}
