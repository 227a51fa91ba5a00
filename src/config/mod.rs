//! The resolved agent configuration: command line and environment over the config file over
//! built-in defaults. Planners receive `&Config` and nothing else from the outside world.

pub mod acl_log;
mod dns_proxy;
pub mod election;
pub mod platform;
pub mod probes;

use crate::cli::Opts;
use crate::features::Features;
use crate::source::limits::Limits;
pub use dns_proxy::{
    DEFAULT_DNS_MAX_PER_NAME, DEFAULT_DNS_MAX_PER_NAMESPACE, DEFAULT_DNS_MAX_TTL_SECS,
    DEFAULT_DNS_MIN_TTL_SECS, DEFAULT_DNS_PROXY_PORT, DEFAULT_DNS_RATE_LIMIT, DnsProxySettings,
    resolv_conf_nameservers,
};
use election::Timings;
use ipnet::IpNet;
use platform::PlatformChoice;
use probes as probe;
use serde::Deserialize;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_CLUSTER_CIDR: &str = "10.128.0.0/14";
pub const DEFAULT_SERVICE_CIDR: &str = "172.30.0.0/16";
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(3600);
pub const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";
pub const DEFAULT_ADMIN_ADDRESS: &str = "127.0.0.1:9942";
/// kube-proxy's metrics port: existing scrape configs find the agent there.
pub const DEFAULT_METRICS_BIND_ADDRESS: &str = "0.0.0.0:10249";
/// kube-proxy's default `--healthz-bind-address`.
pub const DEFAULT_HEALTHZ_BIND_ADDRESS: &str = "0.0.0.0:10256";
pub const DEFAULT_STATE_DIR: &str = "/var/lib/nodeplane";
/// Server-side timeout of each watch. A healthy watch ends (and is resumed from its
/// resourceVersion) at least this often, so one silent for this long plus 5 s is taken for
/// dead: 25 s notices a silently stalled API connection within 30 s. Cost: one watch request
/// per kind per ~22 s (jittered 20-25 s), about 0.45 requests/s per node for the ten kinds,
/// each served from the API server's watch cache (no list, no etcd read).
/// `--pod-traffic-check-seconds`: long enough for a new node's pods to send something.
pub const DEFAULT_POD_TRAFFIC_CHECK: Duration = Duration::from_secs(300);
/// `--rule-counters-seconds`: about one read per Prometheus scrape (15 s to 1 min).
pub const DEFAULT_RULE_COUNTERS: Duration = Duration::from_secs(15);
pub const DEFAULT_API_WATCH_TIMEOUT: Duration = Duration::from_secs(25);
/// The API server caps nothing, but a watch longer than this hides a stall for too long to be
/// a setting anyone wants (client-go uses 5 to 10 minutes).
const MAX_API_WATCH_TIMEOUT: u64 = 1800;
/// Namespace of the election Lease without `--leader-elect-namespace` or POD_NAMESPACE.
pub const DEFAULT_LEADER_ELECT_NAMESPACE: &str = "nodeplane";
/// Bounds of `--egress-ip-probe-interval`: below 10 ms the probes cost more than they tell;
/// above 10 s Node Ready is about as fast.
const MIN_PROBE_INTERVAL: Duration = Duration::from_millis(10);
const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("{option}: invalid CIDR {value:?}: {reason}")]
    Cidr {
        option: &'static str,
        value: String,
        reason: String,
    },
    #[error("node name: {0}")]
    NodeName(String),
    #[error("{option}: {reason}")]
    Invalid {
        option: &'static str,
        reason: String,
    },
    #[error("--api-watch-timeout-seconds: {0} is not between 1 and {MAX_API_WATCH_TIMEOUT}")]
    WatchTimeout(u64),
    #[error("{option}: invalid duration {value:?} (e.g. 4s, 500ms, 1.5s)")]
    Duration { option: &'static str, value: String },
    #[error("leader election: {0}")]
    LeaderElection(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub node_name: String,
    pub manifests: Option<PathBuf>,
    /// Resource limits on manifest files (`--manifest-max-*`).
    pub manifest_limits: Limits,
    pub kubeconfig: Option<PathBuf>,
    /// `--api-server`: the API server's address, overriding the kubeconfig's or the
    /// in-cluster one.
    pub api_server: Option<hyper::Uri>,
    pub cluster_cidrs: Vec<IpNet>,
    pub service_cidrs: Vec<IpNet>,
    /// `spec.externalIPs` honoured: those in one of these and in none of
    /// `external_ip_rejected_cidrs` (OpenShift's `Network.spec.externalIP.policy`). Empty
    /// (the default) honours none.
    pub external_ip_allowed_cidrs: Vec<IpNet>,
    /// `spec.externalIPs` never honoured, even when allowed (rejected wins).
    pub external_ip_rejected_cidrs: Vec<IpNet>,
    /// LoadBalancer IPs honoured: those in one of these (empty: any) and in none of
    /// `load_balancer_ip_rejected_cidrs`; never one in the cluster or service CIDRs.
    pub load_balancer_ip_allowed_cidrs: Vec<IpNet>,
    pub load_balancer_ip_rejected_cidrs: Vec<IpNet>,
    /// kube-proxy's `--nodeport-addresses`.
    pub nodeport_addresses: NodePortAddresses,
    pub resync: Duration,
    pub log_level: String,
    /// Resolver configuration for EgressFirewall `dnsName` rules.
    pub resolv_conf: PathBuf,
    /// Where the admin HTTP server listens in run mode.
    pub admin_address: std::net::SocketAddr,
    /// The metrics-only server (`--metrics-bind-address`); `None` (empty) disables it.
    pub metrics_bind_address: Option<std::net::SocketAddr>,
    /// kube-proxy's `--healthz-bind-address`: the node-level proxy health server (`/healthz`,
    /// `/livez`) in run mode; `None` (an empty value) disables it.
    pub healthz_bind_address: Option<std::net::SocketAddr>,
    /// Where the last valid objects are kept across restarts (`crate::state`).
    pub state_dir: PathBuf,
    /// Server-side timeout of each watch of the API; also bounds how long a silently stalled
    /// connection goes unnoticed (`source::kube::Liveness`).
    pub api_watch_timeout: Duration,
    /// The features that run on this node (`--features`, `--disable-features`).
    pub features: Features,
    /// nodeplane assigns EgressIPs in this cluster (Kubernetes mode): the node publishes its
    /// `k8s.ovn.org/host-cidrs` and fences itself.
    pub egress_ip_assigner: bool,
    /// This process stands for the assigner's election (`agent assigner` always does).
    pub egress_ip_assigner_candidate: bool,
    /// NetworkPolicy's reverse-path check on forwarded packets (`plan::netpol`).
    pub pod_source_check: bool,
    /// How long pods may run before no pod packet in the forward hook is a warning
    /// (`app::pod_traffic`); `None`: no check.
    pub pod_traffic_check: Option<Duration>,
    /// How often the per-rule counters are read for `/metrics` (`admin::rule_counters`);
    /// `None`: no per-rule series.
    pub rule_counters: Option<Duration>,
    /// Namespace of the election Lease.
    pub leader_elect_namespace: String,
    /// Lease duration, renew deadline and retry period of the election.
    pub leader_elect: Timings,
    /// The EgressIP assigner's node health probes (interval, misses).
    pub egress_ip_probe: probe::Settings,
    /// The shared key that signs and checks the probes (`--egress-ip-probe-key-file`); read
    /// when the agent starts. `None`: probes are unauthenticated and never keep a node's
    /// egress IPs (`controller::egress_ip::fence`).
    pub egress_ip_probe_key_file: Option<PathBuf>,
    /// The transparent DNS proxy of `dnsName` rules (`--dns-proxy-port`, `--dns-min-ttl-seconds`).
    pub dns_proxy: DnsProxySettings,
    /// ACL logging's NFLOG group and rate limit (`--acl-log-group`, `--acl-log-rate-limit`).
    pub acl_log: acl_log::AclLogSettings,
    /// `--platform`: bare metal, a cloud, or detected from the Nodes.
    pub platform: PlatformChoice,
}

impl Config {
    /// A config for tests and benchmarks: OpenShift default CIDRs.
    pub fn for_node(node_name: &str) -> Config {
        Config {
            node_name: node_name.to_string(),
            manifests: None,
            manifest_limits: Limits::default(),
            kubeconfig: None,
            api_server: None,
            cluster_cidrs: vec![DEFAULT_CLUSTER_CIDR.parse().expect("valid default")],
            service_cidrs: vec![DEFAULT_SERVICE_CIDR.parse().expect("valid default")],
            external_ip_allowed_cidrs: Vec::new(),
            external_ip_rejected_cidrs: Vec::new(),
            load_balancer_ip_allowed_cidrs: Vec::new(),
            load_balancer_ip_rejected_cidrs: Vec::new(),
            nodeport_addresses: NodePortAddresses::Primary,
            resync: DEFAULT_RESYNC,
            log_level: "info".into(),
            resolv_conf: PathBuf::from(DEFAULT_RESOLV_CONF),
            admin_address: DEFAULT_ADMIN_ADDRESS.parse().expect("valid default"),
            metrics_bind_address: Some(
                DEFAULT_METRICS_BIND_ADDRESS.parse().expect("valid default"),
            ),
            healthz_bind_address: Some(
                DEFAULT_HEALTHZ_BIND_ADDRESS.parse().expect("valid default"),
            ),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            api_watch_timeout: DEFAULT_API_WATCH_TIMEOUT,
            features: Features::default(),
            egress_ip_assigner: true,
            egress_ip_assigner_candidate: true,
            pod_source_check: true,
            pod_traffic_check: Some(DEFAULT_POD_TRAFFIC_CHECK),
            rule_counters: Some(DEFAULT_RULE_COUNTERS),
            leader_elect_namespace: DEFAULT_LEADER_ELECT_NAMESPACE.into(),
            leader_elect: Timings::DEFAULT,
            egress_ip_probe: probe::Settings::default(),
            egress_ip_probe_key_file: None,
            dns_proxy: DnsProxySettings::default(),
            acl_log: acl_log::AclLogSettings::default(),
            platform: PlatformChoice::Auto,
        }
    }

    /// Merges options (flags/env) over the config file over defaults, and validates. The
    /// options are checked in this order; the first invalid one is the error.
    pub fn resolve(opts: &Opts) -> Result<Config, ConfigError> {
        let file = match &opts.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        // Settings read by reference first: the rest moves out of `file`.
        let manifest_limits = manifest_limits(opts, &file)?;
        let api_watch_timeout = api_watch_timeout(opts, &file)?;
        let leader_elect = election_timings(opts, &file)?;
        let egress_ip_probe = egress_ip_probe(opts, &file)?;
        let platform = platform(opts, &file)?;
        let leader_elect_namespace = election_namespace(opts, &file)?;
        let resolv_conf = (opts.resolv_conf.clone().or(file.resolv_conf.clone()))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_RESOLV_CONF));
        let node_name = node_name(opts, file.node_name.clone())?;
        let healthz_bind_address = optional_address(
            "--healthz-bind-address",
            &opts.healthz_bind_address,
            &file.healthz_bind_address,
            DEFAULT_HEALTHZ_BIND_ADDRESS,
        )?;
        let networks = networks(opts, &file)?;
        // Checked in its place below (its options come last); read here while `file` is whole.
        let dns_proxy = dns_proxy::settings(opts, &file, &resolv_conf);
        let acl_log = acl_log::settings(opts, &file);
        Ok(Config {
            node_name,
            manifests: opts.manifests.clone().or(file.manifests),
            manifest_limits,
            kubeconfig: opts.kubeconfig.clone().or(file.kubeconfig),
            api_server: networks.api_server,
            cluster_cidrs: networks.cluster_cidrs,
            service_cidrs: networks.service_cidrs,
            external_ip_allowed_cidrs: networks.external_ip_allowed_cidrs,
            external_ip_rejected_cidrs: networks.external_ip_rejected_cidrs,
            load_balancer_ip_allowed_cidrs: networks.load_balancer_ip_allowed_cidrs,
            load_balancer_ip_rejected_cidrs: networks.load_balancer_ip_rejected_cidrs,
            nodeport_addresses: networks.nodeport_addresses,
            resync: resync(opts.resync_seconds.or(file.resync_seconds)),
            log_level: setting(opts.log_level.clone(), file.log_level, "info".into()),
            admin_address: (opts.admin_address.or(file.admin_address))
                .unwrap_or_else(|| DEFAULT_ADMIN_ADDRESS.parse().expect("valid default")),
            metrics_bind_address: optional_address(
                "--metrics-bind-address",
                &opts.metrics_bind_address,
                &file.metrics_bind_address,
                DEFAULT_METRICS_BIND_ADDRESS,
            )?,
            healthz_bind_address,
            state_dir: (opts.state_dir.clone().or(file.state_dir))
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
            api_watch_timeout,
            features: features(opts, file.features, file.disable_features)?,
            egress_ip_assigner: setting(opts.egress_ip_assigner, file.egress_ip_assigner, true),
            egress_ip_assigner_candidate: setting(
                opts.egress_ip_assigner_candidate,
                file.egress_ip_assigner_candidate,
                true,
            ),
            pod_source_check: setting(opts.pod_source_check, file.pod_source_check, true),
            pod_traffic_check: seconds_or_off(
                (opts.pod_traffic_check_seconds).or(file.pod_traffic_check_seconds),
                DEFAULT_POD_TRAFFIC_CHECK,
            ),
            rule_counters: seconds_or_off(
                (opts.rule_counters_seconds).or(file.rule_counters_seconds),
                DEFAULT_RULE_COUNTERS,
            ),
            leader_elect_namespace,
            leader_elect,
            egress_ip_probe,
            egress_ip_probe_key_file: (opts.egress_ip_probe_key_file.clone())
                .or(file.egress_ip_probe_key_file),
            dns_proxy: dns_proxy?,
            acl_log,
            resolv_conf,
            platform,
        })
    }
}

/// The flag's value, else the file's, else `default`.
fn setting<T>(flag: Option<T>, file: Option<T>, default: T) -> T {
    flag.or(file).unwrap_or(default)
}

/// `--api-watch-timeout-seconds`, within 1 s ..= [`MAX_API_WATCH_TIMEOUT`].
fn api_watch_timeout(opts: &Opts, file: &FileConfig) -> Result<Duration, ConfigError> {
    let secs = setting(
        opts.api_watch_timeout_seconds,
        file.api_watch_timeout_seconds,
        DEFAULT_API_WATCH_TIMEOUT.as_secs(),
    );
    if !(1..=MAX_API_WATCH_TIMEOUT).contains(&secs) {
        return Err(ConfigError::WatchTimeout(secs));
    }
    Ok(Duration::from_secs(secs))
}

/// `--platform`; without it, detected from the Nodes.
fn platform(opts: &Opts, file: &FileConfig) -> Result<PlatformChoice, ConfigError> {
    match opts.platform.clone().or(file.platform.clone()) {
        Some(p) => p.parse().map_err(|reason| ConfigError::Invalid {
            option: "--platform",
            reason,
        }),
        None => Ok(PlatformChoice::Auto),
    }
}

/// `--node-name`, else [`default_node_name`]; never empty.
fn node_name(opts: &Opts, file: Option<String>) -> Result<String, ConfigError> {
    let name = match opts.node_name.clone().or(file) {
        Some(n) => n,
        None => default_node_name()?,
    };
    if name.is_empty() {
        return Err(ConfigError::NodeName("must not be empty".into()));
    }
    Ok(name)
}

/// `--features` and `--disable-features`.
fn features(
    opts: &Opts,
    file: Option<Vec<String>>,
    file_disabled: Option<Vec<String>>,
) -> Result<Features, ConfigError> {
    Features::select(
        &pick_list(&opts.features, file),
        &pick_list(&opts.disable_features, file_disabled),
    )
    .map_err(|reason| ConfigError::Invalid {
        option: "--features",
        reason,
    })
}

/// `--resync-seconds`: at least 1 s.
fn resync(seconds: Option<u64>) -> Duration {
    Duration::from_secs(seconds.unwrap_or(DEFAULT_RESYNC.as_secs()).max(1))
}

/// A period in seconds (`--pod-traffic-check-seconds`, `--rule-counters-seconds`), else
/// `default`; 0 turns it off.
fn seconds_or_off(seconds: Option<u64>, default: Duration) -> Option<Duration> {
    match seconds {
        Some(0) => None,
        Some(s) => Some(Duration::from_secs(s)),
        None => Some(default),
    }
}

/// The cluster's address options, checked in this order.
struct Networks {
    api_server: Option<hyper::Uri>,
    cluster_cidrs: Vec<IpNet>,
    service_cidrs: Vec<IpNet>,
    external_ip_allowed_cidrs: Vec<IpNet>,
    external_ip_rejected_cidrs: Vec<IpNet>,
    load_balancer_ip_allowed_cidrs: Vec<IpNet>,
    load_balancer_ip_rejected_cidrs: Vec<IpNet>,
    nodeport_addresses: NodePortAddresses,
}

/// `--api-server`, the cluster and service CIDRs, the externalIP and load-balancer IP
/// policies and `--nodeport-addresses`.
fn networks(opts: &Opts, file: &FileConfig) -> Result<Networks, ConfigError> {
    Ok(Networks {
        api_server: parse_api_server(opts.api_server.clone().or(file.api_server.clone()))?,
        cluster_cidrs: parse_cidrs(
            "--cluster-cidr",
            &pick(
                &opts.cluster_cidrs,
                file.cluster_cidr.clone(),
                DEFAULT_CLUSTER_CIDR,
            ),
        )?,
        service_cidrs: parse_cidrs(
            "--service-cidr",
            &pick(
                &opts.service_cidrs,
                file.service_cidr.clone(),
                DEFAULT_SERVICE_CIDR,
            ),
        )?,
        external_ip_allowed_cidrs: cidr_list(
            "--external-ip-allowed-cidrs",
            &opts.external_ip_allowed_cidrs,
            file.external_ip_allowed_cidrs.clone(),
        )?,
        external_ip_rejected_cidrs: cidr_list(
            "--external-ip-rejected-cidrs",
            &opts.external_ip_rejected_cidrs,
            file.external_ip_rejected_cidrs.clone(),
        )?,
        load_balancer_ip_allowed_cidrs: cidr_list(
            "--load-balancer-ip-allowed-cidrs",
            &opts.load_balancer_ip_allowed_cidrs,
            file.load_balancer_ip_allowed_cidrs.clone(),
        )?,
        load_balancer_ip_rejected_cidrs: cidr_list(
            "--load-balancer-ip-rejected-cidrs",
            &opts.load_balancer_ip_rejected_cidrs,
            file.load_balancer_ip_rejected_cidrs.clone(),
        )?,
        nodeport_addresses: NodePortAddresses::parse(&pick_list(
            &opts.nodeport_addresses,
            file.nodeport_addresses.clone(),
        ))?,
    })
}

/// A CIDR list option whose default is empty.
fn cidr_list(
    option: &'static str,
    flags: &[String],
    file: Option<Vec<String>>,
) -> Result<Vec<IpNet>, ConfigError> {
    parse_cidrs(option, &pick_list(flags, file))
}

fn pick(flags: &[String], file: Option<Vec<String>>, default: &str) -> Vec<String> {
    if !flags.is_empty() {
        flags.to_vec()
    } else {
        file.unwrap_or_else(|| vec![default.to_string()])
    }
}

/// Like [`pick`] for a list whose default is empty.
fn pick_list(flags: &[String], file: Option<Vec<String>>) -> Vec<String> {
    if !flags.is_empty() {
        flags.to_vec()
    } else {
        file.unwrap_or_default()
    }
}

/// A listener's HOST:PORT (the flag's, else the file's, else `default`); empty: the listener
/// is off.
fn optional_address(
    option: &'static str,
    flag: &Option<String>,
    file: &Option<String>,
    default: &str,
) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    let value = flag.as_deref().or(file.as_deref()).unwrap_or(default);
    match value.trim() {
        "" => Ok(None),
        a => Ok(Some(a.parse().map_err(|e| ConfigError::Invalid {
            option,
            reason: format!("{a:?} is not HOST:PORT (empty disables): {e}"),
        })?)),
    }
}

/// `--api-server`: an absolute http(s) URL with a host (the path, if any, is kept as a prefix
/// as kube does).
fn parse_api_server(value: Option<String>) -> Result<Option<hyper::Uri>, ConfigError> {
    let Some(value) = value else { return Ok(None) };
    let invalid = |reason: String| ConfigError::Invalid {
        option: "--api-server",
        reason: format!("{:?}: {reason}", value.trim()),
    };
    let uri: hyper::Uri = value.trim().parse().map_err(|e| invalid(format!("{e}")))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("https" | "http"), Some(_)) => Ok(Some(uri)),
        _ => Err(invalid("not an http(s)://HOST[:PORT] URL".into())),
    }
}

fn parse_addrs(option: &'static str, values: &[String]) -> Result<Vec<IpAddr>, ConfigError> {
    values
        .iter()
        .map(|v| {
            v.trim().parse().map_err(|e| ConfigError::Invalid {
                option,
                reason: format!("invalid address {v:?}: {e}"),
            })
        })
        .collect()
}

fn parse_cidrs(option: &'static str, values: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    values
        .iter()
        .map(|v| {
            let net: IpNet = v.trim().parse().map_err(|e| ConfigError::Cidr {
                option,
                value: v.clone(),
                reason: format!("{e}"),
            })?;
            if net != net.trunc() {
                return Err(ConfigError::Cidr {
                    option,
                    value: v.clone(),
                    reason: format!("host bits set (did you mean {}?)", net.trunc()),
                });
            }
            Ok(net)
        })
        .collect()
}

/// kube-proxy's `--nodeport-addresses`: which local addresses NodePorts are served on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// The node's primary address per family (kube-proxy's nftables default).
    Primary,
    /// The local addresses inside these CIDRs; in a family none of them is of, every local
    /// address (kube-proxy's rule).
    Cidrs(Vec<IpNet>),
}

impl NodePortAddresses {
    /// `primary` alone, or CIDRs; an empty list is `primary`.
    fn parse(values: &[String]) -> Result<NodePortAddresses, ConfigError> {
        const OPTION: &str = "--nodeport-addresses";
        if values.iter().all(|v| v.trim() == "primary") {
            return Ok(NodePortAddresses::Primary);
        }
        if values.iter().any(|v| v.trim() == "primary") {
            return Err(ConfigError::Invalid {
                option: OPTION,
                reason: "\"primary\" must be the only entry, not mixed with CIDRs".into(),
            });
        }
        parse_cidrs(OPTION, values).map(NodePortAddresses::Cidrs)
    }
}

/// NODE_NAME (set by the DaemonSet from the downward API), then the host name.
fn default_node_name() -> Result<String, ConfigError> {
    if let Ok(n) = std::env::var("NODE_NAME")
        && !n.is_empty()
    {
        return Ok(n);
    }
    hostname::get()
        .map_err(|e| ConfigError::NodeName(format!("cannot read host name: {e}")))?
        .into_string()
        .map_err(|_| ConfigError::NodeName("host name is not UTF-8".into()))
}

/// The config file: same names as the long options. Unknown keys are errors so that a typo
/// does not silently fall back to a default.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct FileConfig {
    node_name: Option<String>,
    manifests: Option<PathBuf>,
    manifest_max_bytes: Option<u64>,
    manifest_max_depth: Option<usize>,
    manifest_max_alias_expansion: Option<u64>,
    kubeconfig: Option<PathBuf>,
    api_server: Option<String>,
    cluster_cidr: Option<Vec<String>>,
    service_cidr: Option<Vec<String>>,
    external_ip_allowed_cidrs: Option<Vec<String>>,
    external_ip_rejected_cidrs: Option<Vec<String>>,
    load_balancer_ip_allowed_cidrs: Option<Vec<String>>,
    load_balancer_ip_rejected_cidrs: Option<Vec<String>>,
    nodeport_addresses: Option<Vec<String>>,
    resync_seconds: Option<u64>,
    log_level: Option<String>,
    resolv_conf: Option<PathBuf>,
    admin_address: Option<std::net::SocketAddr>,
    metrics_bind_address: Option<String>,
    healthz_bind_address: Option<String>,
    state_dir: Option<PathBuf>,
    api_watch_timeout_seconds: Option<u64>,
    features: Option<Vec<String>>,
    disable_features: Option<Vec<String>>,
    egress_ip_assigner: Option<bool>,
    egress_ip_assigner_candidate: Option<bool>,
    pod_source_check: Option<bool>,
    pod_traffic_check_seconds: Option<u64>,
    rule_counters_seconds: Option<u64>,
    leader_elect_namespace: Option<String>,
    leader_elect_lease_duration: Option<DurationValue>,
    leader_elect_renew_deadline: Option<DurationValue>,
    leader_elect_retry_period: Option<DurationValue>,
    egress_ip_probe_interval: Option<DurationValue>,
    egress_ip_probe_misses: Option<u32>,
    egress_ip_probe_key_file: Option<PathBuf>,
    dns_proxy_port: Option<u16>,
    dns_min_ttl_seconds: Option<u32>,
    dns_max_ttl_seconds: Option<u32>,
    dns_resolvers: Option<Vec<String>>,
    dns_max_addresses_per_name: Option<usize>,
    dns_max_addresses_per_namespace: Option<usize>,
    dns_rate_limit: Option<u32>,
    acl_log_group: Option<u16>,
    acl_log_rate_limit: Option<u32>,
    platform: Option<String>,
}

/// `--manifest-max-*`.
fn manifest_limits(opts: &Opts, file: &FileConfig) -> Result<Limits, ConfigError> {
    let defaults = Limits::default();
    let limits = Limits {
        max_bytes: (opts.manifest_max_bytes)
            .or(file.manifest_max_bytes)
            .unwrap_or(defaults.max_bytes),
        max_depth: (opts.manifest_max_depth)
            .or(file.manifest_max_depth)
            .unwrap_or(defaults.max_depth),
        max_alias_expansion: (opts.manifest_max_alias_expansion)
            .or(file.manifest_max_alias_expansion)
            .unwrap_or(defaults.max_alias_expansion),
    };
    if limits.max_depth == 0 {
        return Err(ConfigError::Invalid {
            option: "--manifest-max-depth",
            reason: "must be at least 1".into(),
        });
    }
    Ok(limits)
}

/// A duration option: the flag's text, else the file's value, else `default`.
fn duration(
    option: &'static str,
    flag: &Option<String>,
    file: &Option<DurationValue>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match flag.clone().map(DurationValue::Text).or(file.clone()) {
        Some(v) => v.parse(option),
        None => Ok(default),
    }
}

/// `--leader-elect-{lease-duration,renew-deadline,retry-period}`, validated together.
fn election_timings(opts: &Opts, file: &FileConfig) -> Result<Timings, ConfigError> {
    let d = Timings::DEFAULT;
    let timings = Timings {
        lease_duration: duration(
            "--leader-elect-lease-duration",
            &opts.leader_elect_lease_duration,
            &file.leader_elect_lease_duration,
            d.lease_duration,
        )?,
        renew_deadline: duration(
            "--leader-elect-renew-deadline",
            &opts.leader_elect_renew_deadline,
            &file.leader_elect_renew_deadline,
            d.renew_deadline,
        )?,
        retry_period: duration(
            "--leader-elect-retry-period",
            &opts.leader_elect_retry_period,
            &file.leader_elect_retry_period,
            d.retry_period,
        )?,
    };
    timings.validate().map_err(ConfigError::LeaderElection)?;
    Ok(timings)
}

/// `--leader-elect-namespace`, else the pod's namespace (`POD_NAMESPACE`), else `nodeplane`.
fn election_namespace(opts: &Opts, file: &FileConfig) -> Result<String, ConfigError> {
    let namespace = (opts.leader_elect_namespace.clone())
        .or(file.leader_elect_namespace.clone())
        .or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| DEFAULT_LEADER_ELECT_NAMESPACE.into());
    if namespace.is_empty() {
        return Err(ConfigError::LeaderElection(
            "--leader-elect-namespace must not be empty".into(),
        ));
    }
    Ok(namespace)
}

/// `--egress-ip-probe-interval` and `--egress-ip-probe-misses`.
fn egress_ip_probe(opts: &Opts, file: &FileConfig) -> Result<probe::Settings, ConfigError> {
    let interval = duration(
        "--egress-ip-probe-interval",
        &opts.egress_ip_probe_interval,
        &file.egress_ip_probe_interval,
        probe::DEFAULT_INTERVAL,
    )?;
    if !(MIN_PROBE_INTERVAL..=MAX_PROBE_INTERVAL).contains(&interval) {
        return Err(ConfigError::Invalid {
            option: "--egress-ip-probe-interval",
            reason: format!(
                "{interval:?} is not between {MIN_PROBE_INTERVAL:?} and {MAX_PROBE_INTERVAL:?}"
            ),
        });
    }
    let misses = (opts.egress_ip_probe_misses)
        .or(file.egress_ip_probe_misses)
        .unwrap_or(probe::DEFAULT_MISSES);
    Ok(probe::Settings {
        interval,
        misses,
        ..probe::Settings::default()
    })
}

/// A duration in the config file: `4s`, `500ms`, `1.5s`, `1m`, or a number of seconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum DurationValue {
    Seconds(f64),
    Text(String),
}

impl DurationValue {
    fn parse(&self, option: &'static str) -> Result<Duration, ConfigError> {
        let err = || ConfigError::Duration {
            option,
            value: match self {
                DurationValue::Seconds(s) => s.to_string(),
                DurationValue::Text(t) => t.clone(),
            },
        };
        let secs = match self {
            DurationValue::Seconds(s) => *s,
            DurationValue::Text(t) => {
                let t = t.trim();
                let split = t
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .unwrap_or(t.len());
                let (number, unit) = t.split_at(split);
                let n: f64 = number.parse().map_err(|_| err())?;
                let scale = match unit.trim() {
                    "" | "s" => 1.0,
                    "ms" => 1e-3,
                    "m" => 60.0,
                    _ => return Err(err()),
                };
                n * scale
            }
        };
        Duration::try_from_secs_f64(secs).map_err(|_| err())
    }
}

impl FileConfig {
    fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let err = |reason: String| ConfigError::File {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let is_toml = path.extension().is_some_and(|e| e == "toml");
        if is_toml {
            toml::from_str(&text).map_err(|e| err(e.to_string()))
        } else {
            serde_norway::from_str(&text).map_err(|e| err(e.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `text` to `name` in `dir`.
    fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A config file (`c.yaml`) holding `text`; it goes with the returned directory.
    fn config_file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "c.yaml", text);
        (dir, path)
    }

    fn opts() -> Opts {
        Opts {
            node_name: Some("n1".into()),
            ..Default::default()
        }
    }

    /// [`opts`] reading a config file that holds `text`; it goes with the returned directory.
    fn opts_with_file(text: &str) -> (tempfile::TempDir, Opts) {
        let (dir, path) = config_file(text);
        let o = Opts {
            config: Some(path),
            ..opts()
        };
        (dir, o)
    }

    #[test]
    fn defaults_are_openshift_cidrs() {
        let c = Config::resolve(&opts()).unwrap();
        assert_eq!(c.cluster_cidrs, vec!["10.128.0.0/14".parse().unwrap()]);
        assert_eq!(c.service_cidrs, vec!["172.30.0.0/16".parse().unwrap()]);
        assert_eq!(c.resync, DEFAULT_RESYNC);
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/nodeplane"));
        assert_eq!(c.manifest_limits, Limits::default());
        assert_eq!(c.api_watch_timeout, Duration::from_secs(25));
    }

    #[test]
    fn healthz_bind_address_defaults_to_kube_proxys_and_empty_disables() {
        let c = Config::resolve(&opts()).unwrap();
        assert_eq!(
            c.healthz_bind_address,
            Some("0.0.0.0:10256".parse().unwrap())
        );
        let with = |a: &str| {
            Config::resolve(&Opts {
                healthz_bind_address: Some(a.into()),
                ..opts()
            })
        };
        assert_eq!(with("").unwrap().healthz_bind_address, None);
        assert_eq!(
            with("[::1]:10300").unwrap().healthz_bind_address,
            Some("[::1]:10300".parse().unwrap())
        );
        assert!(with("10256").is_err());
        let (_dir, o) = opts_with_file("healthz-bind-address: ''\n");
        assert_eq!(Config::resolve(&o).unwrap().healthz_bind_address, None);
    }

    #[test]
    fn api_watch_timeout_from_file_flag_and_bounds() {
        let (_dir, mut o) = opts_with_file("api-watch-timeout-seconds: 300\n");
        assert_eq!(
            Config::resolve(&o).unwrap().api_watch_timeout,
            Duration::from_secs(300)
        );
        o.api_watch_timeout_seconds = Some(5);
        assert_eq!(
            Config::resolve(&o).unwrap().api_watch_timeout,
            Duration::from_secs(5)
        );
        o.api_watch_timeout_seconds = Some(0);
        let e = Config::resolve(&o).unwrap_err().to_string();
        assert!(e.contains("--api-watch-timeout-seconds"), "{e}");
    }

    #[test]
    fn rule_counters_read_every_15_s_unless_set_and_0_turns_them_off() {
        assert_eq!(
            Config::resolve(&opts()).unwrap().rule_counters,
            Some(Duration::from_secs(15))
        );
        let (_dir, mut o) = opts_with_file("rule-counters-seconds: 0\n");
        assert_eq!(Config::resolve(&o).unwrap().rule_counters, None);
        o.rule_counters_seconds = Some(60);
        assert_eq!(
            Config::resolve(&o).unwrap().rule_counters,
            Some(Duration::from_secs(60))
        );
    }

    #[test]
    fn manifest_limits_from_file_and_flags() {
        let (_dir, mut o) = opts_with_file(
            "manifest-max-bytes: 1000\nmanifest-max-depth: 20\nmanifest-max-alias-expansion: 5\n",
        );
        let c = Config::resolve(&o).unwrap();
        let want = Limits {
            max_bytes: 1000,
            max_depth: 20,
            max_alias_expansion: 5,
        };
        assert_eq!(c.manifest_limits, want);
        o.manifest_max_depth = Some(30);
        assert_eq!(Config::resolve(&o).unwrap().manifest_limits.max_depth, 30);
        o.manifest_max_depth = Some(0);
        let e = Config::resolve(&o).unwrap_err().to_string();
        assert!(e.contains("--manifest-max-depth"), "{e}");
    }

    #[test]
    fn flags_win_over_file_and_file_over_defaults() {
        let (_dir, path) = config_file(
            "node-name: from-file\ncluster-cidr: [10.0.0.0/16, fd00::/48]\nresync-seconds: 60\n\
             state-dir: /srv/np-state\n",
        );
        let mut o = Opts {
            config: Some(path.clone()),
            ..Default::default()
        };
        let c = Config::resolve(&o).unwrap();
        assert_eq!(c.node_name, "from-file");
        assert_eq!(c.cluster_cidrs.len(), 2);
        assert_eq!(c.resync, Duration::from_secs(60));
        assert_eq!(c.state_dir, PathBuf::from("/srv/np-state"));
        o.node_name = Some("from-flag".into());
        o.state_dir = Some("/run/np".into());
        o.cluster_cidrs = vec!["10.1.0.0/16".into()];
        let c = Config::resolve(&o).unwrap();
        assert_eq!(c.node_name, "from-flag");
        assert_eq!(c.cluster_cidrs, vec!["10.1.0.0/16".parse().unwrap()]);
        assert_eq!(c.state_dir, PathBuf::from("/run/np"));
    }

    #[test]
    fn toml_file_and_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            "c.toml",
            "node-name = \"t\"\nservice-cidr = [\"fd02::/112\"]\n",
        );
        let o = Opts {
            config: Some(path),
            ..Default::default()
        };
        let c = Config::resolve(&o).unwrap();
        assert_eq!(c.service_cidrs, vec!["fd02::/112".parse().unwrap()]);

        let bad = write(&dir, "bad.yaml", "nodename: typo\n");
        let o = Opts {
            config: Some(bad),
            ..Default::default()
        };
        let e = Config::resolve(&o).unwrap_err().to_string();
        assert!(e.contains("bad.yaml") && e.contains("nodename"), "{e}");
    }

    #[test]
    fn nodeport_addresses_default_to_primary_and_name_a_bad_entry() {
        assert_eq!(
            Config::resolve(&opts()).unwrap().nodeport_addresses,
            NodePortAddresses::Primary
        );
        let mut o = opts();
        o.nodeport_addresses = vec!["192.168.2.0/24".into(), "fd00::/64".into()];
        let nets = vec![
            "192.168.2.0/24".parse().unwrap(),
            "fd00::/64".parse().unwrap(),
        ];
        assert_eq!(
            Config::resolve(&o).unwrap().nodeport_addresses,
            NodePortAddresses::Cidrs(nets)
        );
        for (bad, says) in [
            ("192.168.2.1/24", "host bits set"),
            ("eth0", "invalid"),
            ("primary", "must be the only entry"),
        ] {
            o.nodeport_addresses = vec!["10.0.0.0/8".into(), bad.into()];
            let e = Config::resolve(&o).unwrap_err().to_string();
            assert!(
                e.contains("--nodeport-addresses") && e.contains(bad) && e.contains(says),
                "{e}"
            );
        }
    }

    #[test]
    fn external_ip_policy_defaults_to_none_and_comes_from_flags_or_file() {
        let c = Config::resolve(&opts()).unwrap();
        assert!(c.external_ip_allowed_cidrs.is_empty());
        assert!(c.external_ip_rejected_cidrs.is_empty());
        let (_dir, mut o) = opts_with_file(
            "external-ip-allowed-cidrs: [198.51.100.0/24]\n\
             external-ip-rejected-cidrs: [198.51.100.128/25]\n",
        );
        let c = Config::resolve(&o).unwrap();
        assert_eq!(
            c.external_ip_allowed_cidrs,
            vec!["198.51.100.0/24".parse().unwrap()]
        );
        assert_eq!(
            c.external_ip_rejected_cidrs,
            vec!["198.51.100.128/25".parse().unwrap()]
        );
        o.external_ip_allowed_cidrs = vec!["0.0.0.0/0".into(), "::/0".into()];
        let c = Config::resolve(&o).unwrap();
        assert_eq!(c.external_ip_allowed_cidrs.len(), 2);
        o.external_ip_rejected_cidrs = vec!["198.51.100.1/24".into()];
        let e = Config::resolve(&o).unwrap_err().to_string();
        assert!(e.contains("--external-ip-rejected-cidrs"), "{e}");
    }

    #[test]
    fn leader_election_defaults_flags_file_and_rules() {
        let c = Config::resolve(&opts()).unwrap();
        assert!(c.egress_ip_assigner);
        assert_eq!(c.leader_elect, Timings::DEFAULT);
        let (_dir, mut o) = opts_with_file(
            "egress-ip-assigner: false\nleader-elect-namespace: net\n\
             leader-elect-lease-duration: 15\nleader-elect-renew-deadline: 10s\n\
             leader-elect-retry-period: 2s\n",
        );
        let c = Config::resolve(&o).unwrap();
        assert!(!c.egress_ip_assigner);
        assert_eq!(c.leader_elect_namespace, "net");
        assert_eq!(
            c.leader_elect,
            Timings {
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            }
        );
        o.egress_ip_assigner = Some(true);
        o.leader_elect_namespace = Some("kube-system".into());
        o.leader_elect_retry_period = Some("500ms".into());
        let c = Config::resolve(&o).unwrap();
        assert!(c.egress_ip_assigner);
        assert_eq!(c.leader_elect_namespace, "kube-system");
        assert_eq!(c.leader_elect.retry_period, Duration::from_millis(500));
        assert_eq!(c.leader_elect.lease_duration, Duration::from_secs(15));

        o.leader_elect_renew_deadline = Some("20s".into());
        let e = Config::resolve(&o).unwrap_err().to_string();
        assert!(
            e.contains("leader election") && e.contains("less than"),
            "{e}"
        );
        o.leader_elect_renew_deadline = Some("ten".into());
        let e = Config::resolve(&o).unwrap_err().to_string();
        assert!(e.contains("--leader-elect-renew-deadline"), "{e}");
        o.leader_elect_renew_deadline = Some("3h".into());
        assert!(Config::resolve(&o).is_err());
    }

    #[test]
    fn dns_proxy_defaults_file_flags_and_off() {
        let dir = tempfile::tempdir().unwrap();
        let resolv = write(
            &dir,
            "resolv.conf",
            "search x\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\n",
        );
        let mut o = opts();
        o.resolv_conf = Some(resolv);
        let c = Config::resolve(&o).unwrap();
        assert_eq!(
            c.dns_proxy,
            DnsProxySettings {
                resolv_conf_nameservers: vec![
                    "10.0.0.2".parse().unwrap(),
                    "fe80::1".parse().unwrap()
                ],
                ..Default::default()
            }
        );
        assert_eq!(c.dns_proxy.port, Some(15353));
        let path = write(
            &dir,
            "c.yaml",
            "dns-proxy-port: 0\ndns-min-ttl-seconds: 9\ndns-resolvers: [10.0.0.53]\ndns-max-addresses-per-name: 7\n",
        );
        o.config = Some(path);
        let c = Config::resolve(&o).unwrap();
        assert_eq!(c.dns_proxy.port, None, "0 turns the proxy off");
        assert_eq!(c.dns_proxy.min_ttl_secs, 9);
        assert_eq!(
            c.dns_proxy.resolvers,
            ["10.0.0.53".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(c.dns_proxy.max_per_name, 7);
        o.dns_resolvers = vec!["not-an-address".into()];
        let e = Config::resolve(&o).unwrap_err().to_string();
        assert!(
            e.contains("--dns-resolvers") && e.contains("not-an-address"),
            "{e}"
        );
        o.dns_resolvers = Vec::new();
        o.dns_proxy_port = Some(5353);
        o.dns_min_ttl_seconds = Some(0);
        let c = Config::resolve(&o).unwrap();
        assert_eq!(c.dns_proxy.port, Some(5353), "flags win");
        assert_eq!(c.dns_proxy.min_ttl_secs, 1, "a floor of at least 1 s");
    }

    #[test]
    fn egress_ip_probe_defaults_flags_file_and_bounds() {
        let c = Config::resolve(&opts()).unwrap();
        assert_eq!(c.egress_ip_probe, probe::Settings::default());
        assert_eq!(c.egress_ip_probe.interval, Duration::from_millis(100));
        assert_eq!(c.egress_ip_probe.misses, 3);
        let (_dir, mut o) =
            opts_with_file("egress-ip-probe-interval: 200ms\negress-ip-probe-misses: 5\n");
        let c = Config::resolve(&o).unwrap();
        assert_eq!(c.egress_ip_probe.interval, Duration::from_millis(200));
        assert_eq!(c.egress_ip_probe.misses, 5);
        // Flags win; 0 misses turns the probes off.
        o.egress_ip_probe_interval = Some("50ms".into());
        o.egress_ip_probe_misses = Some(0);
        let c = Config::resolve(&o).unwrap();
        assert_eq!(c.egress_ip_probe.interval, Duration::from_millis(50));
        assert!(!c.egress_ip_probe.enabled());
        assert_eq!(c.egress_ip_probe_key_file, None);
        o.egress_ip_probe_key_file = Some("/etc/nodeplane/probe-key/key".into());
        let c = Config::resolve(&o).unwrap();
        assert_eq!(
            c.egress_ip_probe_key_file,
            Some(PathBuf::from("/etc/nodeplane/probe-key/key"))
        );
        for bad in ["0", "5ms", "11s", "fast"] {
            o.egress_ip_probe_interval = Some(bad.into());
            let e = Config::resolve(&o).unwrap_err().to_string();
            assert!(e.contains("--egress-ip-probe-interval"), "{bad}: {e}");
        }
    }

    #[test]
    fn platform_defaults_to_auto_from_flag_or_file() {
        use platform::Platform;
        assert_eq!(
            Config::resolve(&opts()).unwrap().platform,
            PlatformChoice::Auto
        );
        let (_dir, mut o) = opts_with_file("platform: azure\n");
        let c = Config::resolve(&o).unwrap();
        assert_eq!(c.platform, PlatformChoice::Fixed(Platform::Azure));
        o.platform = Some("baremetal".into());
        let c = Config::resolve(&o).unwrap();
        assert_eq!(c.platform, PlatformChoice::Fixed(Platform::BareMetal));
        o.platform = Some("ec2".into());
        let e = Config::resolve(&o).unwrap_err().to_string();
        assert!(e.starts_with("--platform: \"ec2\" is not one of"), "{e}");
    }

    #[test]
    fn bad_cidr_names_the_option() {
        let mut o = opts();
        o.cluster_cidrs = vec!["10.0.0.1/8".into()];
        let e = Config::resolve(&o).unwrap_err().to_string();
        assert!(
            e.contains("--cluster-cidr") && e.contains("host bits"),
            "{e}"
        );
        o.cluster_cidrs = vec!["nonsense".into()];
        assert!(Config::resolve(&o).is_err());
    }
}
