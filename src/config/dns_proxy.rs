//! The transparent DNS proxy of EgressFirewall `dnsName` rules (`--dns-*`), read by
//! `dnsproxy`.

use super::{ConfigError, FileConfig, parse_addrs, pick_list, setting};
use crate::cli::Opts;
use std::net::IpAddr;
use std::path::Path;

/// `port`: `None` = no proxy (and no steering).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsProxySettings {
    pub port: Option<u16>,
    pub min_ttl_secs: u32,
    /// Longest time an address learned from one answer stays allowed (`--dns-max-ttl-seconds`).
    pub max_ttl_secs: u32,
    /// `--dns-resolvers`: the only servers whose answers are learned. Empty: the cluster DNS
    /// Service's ClusterIPs plus `resolv_conf_nameservers`.
    pub resolvers: Vec<IpAddr>,
    /// The `nameserver` lines of `--resolv-conf`, read at start.
    pub resolv_conf_nameservers: Vec<IpAddr>,
    /// Learned addresses kept per queried name and per namespace (oldest evicted first).
    pub max_per_name: usize,
    pub max_per_namespace: usize,
    /// Steered DNS packets (UDP queries, TCP connection openings) per second per pod
    /// interface and source address, also the burst (`--dns-rate-limit`); 0: no limit.
    pub rate_limit: u32,
}

pub const DEFAULT_DNS_PROXY_PORT: u16 = 15353;
pub const DEFAULT_DNS_MIN_TTL_SECS: u32 = 5;
/// One day (Cilium's `tofqdns-max-ttl` default is the same order).
pub const DEFAULT_DNS_MAX_TTL_SECS: u32 = 86_400;
/// As Cilium's `tofqdns-endpoint-max-ip-per-hostname`.
pub const DEFAULT_DNS_MAX_PER_NAME: usize = 50;
pub const DEFAULT_DNS_MAX_PER_NAMESPACE: usize = 2000;
/// Ten lookups at once of a pod with the usual `ndots:5` search list (up to ~10 queries
/// each), ten a second after that; what it sends beyond is dropped in the kernel.
pub const DEFAULT_DNS_RATE_LIMIT: u32 = 100;

impl Default for DnsProxySettings {
    fn default() -> Self {
        DnsProxySettings {
            port: Some(DEFAULT_DNS_PROXY_PORT),
            min_ttl_secs: DEFAULT_DNS_MIN_TTL_SECS,
            max_ttl_secs: DEFAULT_DNS_MAX_TTL_SECS,
            resolvers: Vec::new(),
            resolv_conf_nameservers: Vec::new(),
            max_per_name: DEFAULT_DNS_MAX_PER_NAME,
            max_per_namespace: DEFAULT_DNS_MAX_PER_NAMESPACE,
            rate_limit: DEFAULT_DNS_RATE_LIMIT,
        }
    }
}

/// The `nameserver` addresses of a resolv.conf text (anything unparsable is skipped: the
/// resolver itself reports a broken file).
pub fn resolv_conf_nameservers(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next())?
        })
        // A link-local IPv6 nameserver may carry a zone (`fe80::1%eth0`).
        .filter_map(|a| a.split('%').next()?.parse().ok())
        .collect()
}

/// `--dns-*` over the config file over the defaults; `resolv_conf`'s nameservers are read now.
pub(super) fn settings(
    opts: &Opts,
    file: &FileConfig,
    resolv_conf: &Path,
) -> Result<DnsProxySettings, ConfigError> {
    Ok(DnsProxySettings {
        resolvers: parse_addrs(
            "--dns-resolvers",
            &pick_list(&opts.dns_resolvers, file.dns_resolvers.clone()),
        )?,
        resolv_conf_nameservers: std::fs::read_to_string(resolv_conf)
            .map(|t| resolv_conf_nameservers(&t))
            .unwrap_or_default(),
        max_ttl_secs: setting(
            opts.dns_max_ttl_seconds,
            file.dns_max_ttl_seconds,
            DEFAULT_DNS_MAX_TTL_SECS,
        )
        .max(1),
        max_per_name: setting(
            opts.dns_max_addresses_per_name,
            file.dns_max_addresses_per_name,
            DEFAULT_DNS_MAX_PER_NAME,
        )
        .max(1),
        max_per_namespace: setting(
            opts.dns_max_addresses_per_namespace,
            file.dns_max_addresses_per_namespace,
            DEFAULT_DNS_MAX_PER_NAMESPACE,
        )
        .max(1),
        rate_limit: setting(
            opts.dns_rate_limit,
            file.dns_rate_limit,
            DEFAULT_DNS_RATE_LIMIT,
        ),
        // 0 turns the proxy off.
        port: Some(setting(
            opts.dns_proxy_port,
            file.dns_proxy_port,
            DEFAULT_DNS_PROXY_PORT,
        ))
        .filter(|p| *p != 0),
        min_ttl_secs: setting(
            opts.dns_min_ttl_seconds,
            file.dns_min_ttl_seconds,
            DEFAULT_DNS_MIN_TTL_SECS,
        )
        .max(1),
    })
}
