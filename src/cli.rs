//! Command line. Every option can also come from an environment variable (NODEPLANE_*) and
//! from a config file (`--config`); command line and environment win over the file, the file
//! wins over the built-in defaults. `config::Config::resolve` does the merging.

use clap::{Arg, Args, Parser, Subcommand};
use std::path::PathBuf;

/// `#[arg(bare_means = true)]`: a boolean option that takes its value after `=` (`--x=false`;
/// also yes/no, on/off, 1/0) or none (`--x` alone means `true`), so that an option whose
/// default is true can be turned off.
trait BoolOption {
    fn bare_means(self, value: bool) -> Self;
}

impl BoolOption for Arg {
    fn bare_means(self, value: bool) -> Self {
        self.value_name("BOOL")
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value(if value { "true" } else { "false" })
            .value_parser(clap::builder::BoolishValueParser::new())
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "agent",
    version,
    about = "nodeplane node agent: turns EgressFirewall, EgressQoS, EgressIP, \
             CloudPrivateIPConfig, Service / Endpoints / EndpointSlice and NetworkPolicy objects \
             into nftables rules (table inet nodeplane, and table bridge nodeplane for bridged \
             pods), addresses, routes and policy rules on this node.",
    long_about = None
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub opts: Opts,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Remove everything the agent created on this node: the nftables tables inet nodeplane
    /// and bridge nodeplane, the EgressIP addresses, the np-eip tunnel, and the routes and
    /// policy rules it marked as its own. Nothing else is touched. The state directory is
    /// left alone (delete it by hand to forget the last valid objects).
    Cleanup,
    /// Run only the cluster's EgressIP assigner: watch Nodes, EgressIPs and
    /// CloudPrivateIPConfigs, stand for the Lease `nodeplane-egress-assigner`, and while
    /// leading probe the egress nodes and write EgressIP `status.items` and
    /// CloudPrivateIPConfigs. Nothing is programmed on this host. deploy/assigner.yaml runs it
    /// as a Deployment under its own ServiceAccount (see README "EgressIP assignment").
    Assigner,
    /// Why was this packet dropped (or allowed)? Follows one packet through the tables the
    /// agent plans for this node (the same IR `--dry-run` prints and the kernel receives),
    /// hook by hook, and prints every decision it meets: the chain and rule, the set or map
    /// element that matched, the object behind it (kind, namespace, name, the rule's index
    /// and text) and the verdict, then what the kernel does next. Offline: with
    /// `--manifests DIR --node-name N` it needs no privileges and changes nothing. A Service
    /// with several backends gives one path per backend a random pick could choose. What the
    /// kernel learns at run time (DNS answers of dnsName rules, session affinity, bridged
    /// flows, conntrack) is reported as unknown with the assumption taken.
    ///
    /// Example: agent explain --manifests examples --node-name worker-1
    /// --src 10.128.0.11 --dst 203.0.113.10 --proto tcp --dport 443
    ///
    /// Live, with the kernel's own account of real packets:
    /// agent explain --live --trace 10 --src 10.128.0.12 --dst 10.128.0.11 --dport 8443
    Explain(Box<ExplainArgs>),
}

/// The packet `agent explain` follows (a connection's first packet unless `--ct-state`).
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Source address (IPv4 or IPv6).
    #[arg(long, value_name = "IP")]
    pub src: std::net::IpAddr,
    /// Destination address (same family as --src).
    #[arg(long, value_name = "IP")]
    pub dst: std::net::IpAddr,
    /// L4 protocol: tcp, udp, sctp, icmp, icmpv6, or a number.
    #[arg(long, default_value = "tcp", value_name = "PROTO")]
    pub proto: String,
    /// Source port (tcp, udp, sctp). Default: 40000.
    #[arg(long, value_name = "PORT")]
    pub sport: Option<u16>,
    /// Destination port (tcp, udp, sctp).
    #[arg(long, value_name = "PORT")]
    pub dport: Option<u16>,
    /// Input interface name (`meta iifname`); not given: an interface the table names nowhere.
    #[arg(long, value_name = "IFNAME")]
    pub iif: Option<String>,
    /// Output interface name (`meta oifname`); not given: as for --iif.
    #[arg(long, value_name = "IFNAME")]
    pub oif: Option<String>,
    /// Conntrack state: new (default), established, related, invalid, untracked.
    #[arg(long, value_name = "STATE")]
    pub ct_state: Option<String>,
    /// The packet crosses a Linux bridge between two pods: the bridge table's forward hook
    /// (and the inet hooks after it with --br-netfilter).
    #[arg(long)]
    pub bridged: bool,
    /// With --bridged: br_netfilter hands bridged IP traffic to the inet hooks too.
    #[arg(long)]
    pub br_netfilter: bool,
    /// Another address of this node (repeatable), besides its Node object's addresses:
    /// `fib daddr type local` is true for these.
    #[arg(long = "local-addr", value_name = "IP")]
    pub local_addrs: Vec<std::net::IpAddr>,
    /// Ask the running agent on this node instead (its admin endpoint, --admin-address):
    /// the packet is explained against the tables it applied (inet, and bridge with
    /// --bridged), with its node's addresses.
    #[arg(long)]
    pub live: bool,
    /// With --live: also trace real packets like this one in the kernel for up to SECONDS
    /// (1-30): the agent adds a table `nodeplane-trace` that sets `meta nftrace` on packets
    /// matching the addresses, protocol and the ports and --iif given, reports every rule of
    /// its tables they meet with the object and rule behind it, and removes the table when
    /// done (the kernel removes it too if the agent dies: it is owned by the agent's socket).
    /// Send the packet while the trace runs. One trace at a time per agent.
    #[arg(long, value_name = "SECONDS", requires = "live")]
    pub trace: Option<u64>,
    /// With --trace: stop after this many packets (1-20). Default: 1.
    #[arg(long, value_name = "N", default_value = "1", requires = "trace")]
    pub trace_packets: usize,
    /// `text` (aligned, one decision a line) or `json`.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

/// Options shared by every mode. All are optional here so that the config file can fill
/// the gaps; defaults are applied in `Config::resolve`.
#[derive(Debug, Args, Default)]
pub struct Opts {
    /// Read settings from this YAML or TOML file (keys are the long option names, e.g.
    /// `node-name`, `cluster-cidr`). Command-line options and environment variables win.
    #[arg(long, global = true, env = "NODEPLANE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Name of the Kubernetes Node this agent serves; decides which pods are local.
    /// Default: the NODE_NAME environment variable, then the host name.
    #[arg(long, global = true, env = "NODEPLANE_NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,

    /// Read objects from YAML/JSON files under this directory (recursively) instead of the
    /// Kubernetes API. `kubectl get ... -o yaml` output works as is. Watched for changes;
    /// only changed files are parsed again. A file beyond a --manifest-max-* limit is
    /// rejected and reported (in run mode /readyz is degraded until it is fixed); if a
    /// version of it was accepted before in this run, that version stays in force.
    #[arg(long, global = true, env = "NODEPLANE_MANIFESTS", value_name = "DIR")]
    pub manifests: Option<PathBuf>,

    /// Largest manifest file read, in bytes; a larger one is rejected (see --manifests).
    /// Default: 8388608 (8 MiB).
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_MANIFEST_MAX_BYTES",
        value_name = "BYTES"
    )]
    pub manifest_max_bytes: Option<u64>,

    /// Deepest nesting of sequences and mappings in a YAML manifest document (a document's
    /// top-level mapping is depth 1); a deeper document is rejected before it is parsed.
    /// Default: 100.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_MANIFEST_MAX_DEPTH",
        value_name = "LEVELS"
    )]
    pub manifest_max_depth: Option<usize>,

    /// How much a YAML manifest document's aliases (`*name`) may stand for, in bytes (the
    /// anchored content each alias repeats, as if written out); more is rejected before the
    /// document is parsed ("billion laughs"). Default: 1048576 (1 MiB).
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_MANIFEST_MAX_ALIAS_EXPANSION",
        value_name = "BYTES"
    )]
    pub manifest_max_alias_expansion: Option<u64>,

    /// Kubeconfig file for reaching the API server when not using --manifests.
    /// Default: in-cluster service account, then ~/.kube/config.
    #[arg(long, global = true, env = "NODEPLANE_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The API server's real address (https://HOST:PORT), used instead of the one in the
    /// kubeconfig or the in-cluster environment (KUBERNETES_SERVICE_HOST/PORT, which are
    /// honoured as given). On a cluster without kube-proxy the in-cluster address is the
    /// `kubernetes` ClusterIP, which only the agent's own table translates: after a reboot
    /// the agent could not reach the API. Credentials still come from the kubeconfig or the
    /// service account.
    #[arg(long, global = true, env = "NODEPLANE_API_SERVER", value_name = "URL")]
    pub api_server: Option<String>,

    /// Pod network of the cluster (repeatable, IPv4 and IPv6). Traffic to it is pod-to-pod
    /// and is never filtered by EgressFirewall or SNATed by EgressIP. Default: 10.128.0.0/14.
    #[arg(
        long = "cluster-cidr",
        global = true,
        env = "NODEPLANE_CLUSTER_CIDR",
        value_delimiter = ',',
        value_name = "CIDR"
    )]
    pub cluster_cidrs: Vec<String>,

    /// Service ClusterIP range (repeatable, IPv4 and IPv6). Unallocated addresses in it are
    /// dropped. Default: 172.30.0.0/16.
    #[arg(
        long = "service-cidr",
        global = true,
        env = "NODEPLANE_SERVICE_CIDR",
        value_delimiter = ',',
        value_name = "CIDR"
    )]
    pub service_cidrs: Vec<String>,

    /// `spec.externalIPs` the agent honours (repeatable, IPv4 and IPv6; `0.0.0.0/0,::/0` for
    /// all, as kube-proxy does). Default: none, as OpenShift's externalIP policy: an
    /// externalIP lets whoever can create a Service in any namespace take over traffic to
    /// that address (CVE-2020-8554), so it has to be allowed explicitly. Refused ones are
    /// reported with their field path; the rest of the Service applies.
    #[arg(
        long = "external-ip-allowed-cidrs",
        global = true,
        env = "NODEPLANE_EXTERNAL_IP_ALLOWED_CIDRS",
        value_delimiter = ',',
        value_name = "CIDR"
    )]
    pub external_ip_allowed_cidrs: Vec<String>,

    /// `spec.externalIPs` the agent never honours, even inside --external-ip-allowed-cidrs
    /// (rejected wins). Default: none.
    #[arg(
        long = "external-ip-rejected-cidrs",
        global = true,
        env = "NODEPLANE_EXTERNAL_IP_REJECTED_CIDRS",
        value_delimiter = ',',
        value_name = "CIDR"
    )]
    pub external_ip_rejected_cidrs: Vec<String>,

    /// LoadBalancer IPs (`status.loadBalancer.ingress[].ip`) the agent honours (repeatable,
    /// IPv4 and IPv6). Whatever this says, an ingress IP inside --cluster-cidr (a pod's
    /// address) or --service-cidr, or a node's address, is refused: the controllers that write
    /// Service status may be wrong or compromised. Default: all others (as kube-proxy).
    #[arg(
        long = "load-balancer-ip-allowed-cidrs",
        global = true,
        env = "NODEPLANE_LOAD_BALANCER_IP_ALLOWED_CIDRS",
        value_delimiter = ',',
        value_name = "CIDR"
    )]
    pub load_balancer_ip_allowed_cidrs: Vec<String>,

    /// LoadBalancer IPs never honoured, even when allowed (rejected wins), e.g. the addresses
    /// of the API server or other infrastructure outside the cluster. Default: none.
    #[arg(
        long = "load-balancer-ip-rejected-cidrs",
        global = true,
        env = "NODEPLANE_LOAD_BALANCER_IP_REJECTED_CIDRS",
        value_delimiter = ',',
        value_name = "CIDR"
    )]
    pub load_balancer_ip_rejected_cidrs: Vec<String>,

    /// kube-proxy's --nodeport-addresses: the local addresses NodePorts are served on.
    /// `primary` (the default, as kube-proxy's nftables mode): the node's primary address per
    /// family (the first InternalIP, else ExternalIP, of its Node object). Or CIDRs
    /// (repeatable): the local addresses inside them; a family with no CIDR listed serves on
    /// all its local addresses (`0.0.0.0/0,::/0`: every local address). Loopback never.
    #[arg(
        long = "nodeport-addresses",
        global = true,
        env = "NODEPLANE_NODEPORT_ADDRESSES",
        value_delimiter = ',',
        value_name = "primary|CIDR"
    )]
    pub nodeport_addresses: Vec<String>,

    /// Print the nftables ruleset the agent would apply (nft -f syntax) and the address,
    /// route and rule changes as # comments, then exit. Changes nothing; needs no privileges.
    #[arg(long, env = "NODEPLANE_DRY_RUN", conflicts_with = "once")]
    pub dry_run: bool,

    /// Apply the desired state once and exit: 0 on success, non-zero with the reason.
    #[arg(long, env = "NODEPLANE_ONCE")]
    pub once: bool,

    /// Seconds between full resynchronisations, which repair drift made by others.
    /// Default: 3600.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_RESYNC_SECONDS",
        value_name = "SECONDS"
    )]
    pub resync_seconds: Option<u64>,

    /// Log filter (error, warn, info, debug, trace, or a tracing directive such as
    /// `nodeplane=debug`). Default: info.
    #[arg(long, global = true, env = "NODEPLANE_LOG_LEVEL", value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// Address of the admin HTTP server (/healthz, /readyz, /metrics, /ruleset) in run mode.
    /// Keep it on loopback (the default): /ruleset shows every namespace's rules, dnsNames,
    /// learned addresses and pod IPs, and /readyz the agent's state; any pod could read them
    /// on a node address. Prometheus scrapes --metrics-bind-address instead. Default:
    /// 127.0.0.1:9942.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_ADMIN_ADDRESS",
        value_name = "HOST:PORT"
    )]
    pub admin_address: Option<std::net::SocketAddr>,

    /// Metrics-only HTTP server in run mode (`/metrics`, kube-proxy's port): safe to expose,
    /// it serves nothing but the metrics. Empty disables it. Default: 0.0.0.0:10249.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_METRICS_BIND_ADDRESS",
        value_name = "HOST:PORT"
    )]
    pub metrics_bind_address: Option<String>,

    /// kube-proxy's node-level health server in run mode: `/healthz` (200 while the dataplane
    /// is in sync and the node is not being deleted, else 503; what cloud load balancers probe
    /// for `externalTrafficPolicy: Cluster`) and `/livez`. Empty disables it. Default:
    /// 0.0.0.0:10256 (dual-stack where the host has IPv6, as kube-proxy's).
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_HEALTHZ_BIND_ADDRESS",
        value_name = "HOST:PORT"
    )]
    pub healthz_bind_address: Option<String>,

    /// Resolver configuration (resolv.conf syntax) used to resolve EgressFirewall `dnsName`
    /// rules; names are re-resolved when their shortest TTL expires. Default: /etc/resolv.conf.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_RESOLV_CONF",
        value_name = "PATH"
    )]
    pub resolv_conf: Option<PathBuf>,

    /// Directory for the last valid EgressFirewall, EgressQoS, EgressIP and NetworkPolicy
    /// objects (`last-valid.json`), so that an object turned invalid while the agent was down
    /// keeps its last valid rules after a restart. Default: /var/lib/nodeplane.
    ///
    /// It holds the last valid EgressFirewall and EgressQoS of each namespace and the last
    /// valid version of each EgressIP and NetworkPolicy, as API objects, with the node name:
    /// after a restart
    /// (or in the next --once), an object that is invalid is planned from its saved version
    /// instead of the namespace falling open. Written atomically after a successful sync
    /// when those objects changed; created (mode 0700) if missing; a failed write is a
    /// warning, not a failed sync. Read once at start: a corrupt file, one of another
    /// format or written for another node, or an object in it that no longer validates is
    /// reported and ignored. --dry-run reads it too (never writes), so that it prints what
    /// the agent would apply.
    #[arg(long, global = true, env = "NODEPLANE_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Server-side timeout (`timeoutSeconds`) of each watch of the Kubernetes API, 1 to 1800.
    /// A watch silent for this long plus 5 s is taken for dead (a silently stalled
    /// connection) and resumed on a new connection, and `/readyz` fails while a kind hears
    /// nothing for this long plus 2 s. Each kind re-watches once per timeout (jittered down by
    /// up to a fifth), from its last resourceVersion: no relist. Default: 25 (dead watches
    /// noticed within 30 s, ~0.45 watch requests/s per node).
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_API_WATCH_TIMEOUT_SECONDS",
        value_name = "SECONDS"
    )]
    pub api_watch_timeout_seconds: Option<u64>,

    /// Features to run (repeatable, comma-separated): egress-firewall, egress-qos, egress-ip,
    /// services, network-policy, or all. A feature that is off has nothing of its own on
    /// the node: no chains, sets, addresses, listeners, annotations or watches (e.g. turn
    /// services off beside kube-proxy, network-policy off beside a CNI that enforces it).
    /// Default: all.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_FEATURES",
        value_name = "LIST",
        value_delimiter = ','
    )]
    pub features: Vec<String>,

    /// Features to turn off (repeatable, comma-separated), after --features.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_DISABLE_FEATURES",
        value_name = "LIST",
        value_delimiter = ','
    )]
    pub disable_features: Vec<String>,

    /// nodeplane assigns EgressIPs in this cluster (Kubernetes mode): the agent publishes its
    /// Node's `k8s.ovn.org/host-cidrs`, fences itself when cut off, and (see
    /// --egress-ip-assigner-candidate) stands for the assigner's election. `false` where
    /// another controller (OVN-Kubernetes' cluster manager) assigns: it writes EgressIP
    /// `status.items` and the annotation, and two assigners would fight. Default: true.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_EGRESS_IP_ASSIGNER",
        bare_means = true
    )]
    pub egress_ip_assigner: Option<bool>,

    /// Stand for the assigner's election in this node agent: at most one process at a time
    /// holds the role, elected with the Lease `nodeplane-egress-assigner`, and it writes
    /// EgressIP status and CloudPrivateIPConfigs. deploy/ sets `false` and runs the role as
    /// `agent assigner` under an identity of its own, so that no node's credentials can move
    /// egress IPs; `true` suits a single identity (systemd, small labs). Default: true.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_EGRESS_IP_ASSIGNER_CANDIDATE",
        bare_means = true
    )]
    pub egress_ip_assigner_candidate: Option<bool>,

    /// While a NetworkPolicy is in force, drop forwarded packets whose source address is not
    /// routed back through the interface they came in on (`fib saddr . iif oif missing`):
    /// a routed pod cannot send with another pod's address, whatever `rp_filter` says. For
    /// bridged pods, drop frames whose source is a pod address bound to another bridge port,
    /// or that come from a pod's port with an address not bound to it (the bindings come
    /// from the kernel's veth pairing; README "NetworkPolicy").
    /// `false` for CNIs that check sources themselves, or nodes with asymmetric routing on
    /// their uplinks. Default: true.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_POD_SOURCE_CHECK",
        bare_means = true
    )]
    pub pod_source_check: Option<bool>,

    /// Seconds after this node's first pod-network pod is seen within which the agent must
    /// count a packet from the cluster CIDRs in its forward hook; if none comes, a warning in
    /// the log and `/readyz` says that pod traffic does not cross this node's netfilter hooks
    /// (e.g. OVN-Kubernetes keeps it in OVS), so nothing the agent programs applies to pods.
    /// 0 turns the check off. Default: 300.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_POD_TRAFFIC_CHECK_SECONDS",
        value_name = "SECONDS"
    )]
    pub pod_traffic_check_seconds: Option<u64>,

    /// Seconds between two reads of the kernel's per-rule counters for `/metrics` (packets
    /// and bytes per EgressFirewall rule, EgressQoS rule and NetworkPolicy: one dump per
    /// table and per EgressFirewall map, never per rule). 0 turns the per-rule series off:
    /// for very large clusters, where they are one series pair per rule. Default: 15.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_RULE_COUNTERS_SECONDS",
        value_name = "SECONDS"
    )]
    pub rule_counters_seconds: Option<u64>,

    /// Namespace of the election Lease. Default: the POD_NAMESPACE environment variable (the
    /// DaemonSet sets it from the downward API), then `nodeplane`.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_LEADER_ELECT_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub leader_elect_namespace: Option<String>,

    /// How long followers wait, from the last change of the Lease they saw (their own
    /// clock), before taking over from a leader that stopped renewing. Whole seconds, e.g.
    /// `4s`. Default: 4s.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_LEADER_ELECT_LEASE_DURATION",
        value_name = "DURATION"
    )]
    pub leader_elect_lease_duration: Option<String>,

    /// A leader that could not renew the Lease for this long stops acting as leader. Less
    /// than the lease duration, e.g. `3s`. Default: 3s.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_LEADER_ELECT_RENEW_DEADLINE",
        value_name = "DURATION"
    )]
    pub leader_elect_renew_deadline: Option<String>,

    /// Between two election attempts: the leader renews, each follower reads the Lease (up
    /// to 20% later, jittered), e.g. `1s` or `500ms`. Default: 1s.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_LEADER_ELECT_RETRY_PERIOD",
        value_name = "DURATION"
    )]
    pub leader_elect_retry_period: Option<String>,

    /// Time between two rounds of the EgressIP assigner's node health probes (ICMP echo to
    /// each egress-assignable node's InternalIPs, answered by the node's kernel, so an agent
    /// restart is not a failure), 10ms to 10s, e.g. `100ms`. Only the leading assigner
    /// probes. Default: 100ms.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_EGRESS_IP_PROBE_INTERVAL",
        value_name = "DURATION"
    )]
    pub egress_ip_probe_interval: Option<String>,

    /// Consecutive unanswered probe rounds after which a node is dead and its egress IPs move
    /// (it gets them back after 3 answered rounds): a failure is acted on within interval ×
    /// (misses + 1). 0 turns the probes off (failures are seen only through Node Ready).
    /// Default: 3 (400 ms at most with the default interval).
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_EGRESS_IP_PROBE_MISSES",
        value_name = "COUNT"
    )]
    pub egress_ip_probe_misses: Option<u32>,

    /// File holding the key (at least 32 bytes; trailing whitespace ignored) that signs the
    /// assigner's probes and lets a node tell them from forged ones: shared by every agent,
    /// e.g. a Secret mounted into the DaemonSet (see README "EgressIP"). Without it probes
    /// never keep a node's egress IPs: a node cut off from the API server drops them (a
    /// warning in the log and /readyz). Read when the agent starts.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_EGRESS_IP_PROBE_KEY_FILE",
        value_name = "PATH"
    )]
    pub egress_ip_probe_key_file: Option<PathBuf>,

    /// Port of the transparent DNS proxy that sees the DNS answers of pods whose namespace's
    /// EgressFirewall has `dnsName` rules, and adds the answered addresses before the pod
    /// gets them (see README "EgressFirewall DNS"). 0 turns it off (only the agent's own
    /// resolution then feeds `dnsName` rules). Default: 15353.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_DNS_PROXY_PORT",
        value_name = "PORT"
    )]
    pub dns_proxy_port: Option<u16>,

    /// Shortest time an address learned from a DNS answer stays allowed (its record's TTL
    /// when longer). Default: 5.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_DNS_MIN_TTL_SECONDS",
        value_name = "SECONDS"
    )]
    pub dns_min_ttl_seconds: Option<u32>,

    /// Longest time an address learned from one DNS answer stays allowed (a longer TTL is
    /// cut to it; a TTL with the top bit set counts as 0, RFC 2181 8). Default: 86400.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_DNS_MAX_TTL_SECONDS",
        value_name = "SECONDS"
    )]
    pub dns_max_ttl_seconds: Option<u32>,

    /// The DNS servers whose answers the proxy learns from (repeatable or comma-separated):
    /// only pod DNS to these is proxied; DNS to any other address is ordinary traffic for
    /// the EgressFirewall and NetworkPolicy. Default: the ClusterIPs of the cluster DNS
    /// Service (`kube-system/kube-dns` or `openshift-dns/dns-default`) and the nameservers
    /// of --resolv-conf.
    #[arg(
        long = "dns-resolvers",
        global = true,
        env = "NODEPLANE_DNS_RESOLVERS",
        value_delimiter = ',',
        value_name = "ADDRESS"
    )]
    pub dns_resolvers: Vec<String>,

    /// Learned addresses kept per queried name (the first ones of an answer; the least
    /// recently answered go first). Default: 50.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_DNS_MAX_ADDRESSES_PER_NAME",
        value_name = "COUNT"
    )]
    pub dns_max_addresses_per_name: Option<usize>,

    /// Learned addresses kept per namespace, all its names together (the least recently
    /// answered go first). Default: 2000.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_DNS_MAX_ADDRESSES_PER_NAMESPACE",
        value_name = "COUNT"
    )]
    pub dns_max_addresses_per_namespace: Option<usize>,

    /// Steered DNS packets (UDP queries and TCP connection openings to a trusted resolver)
    /// each pod may send per second, counted per pod interface and source address; also
    /// the burst. Beyond it they are dropped in the kernel, so that no pod, nor a pod forging
    /// its neighbour's address, can flood the proxy or the resolvers. 0: no limit.
    /// Default: 100.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_DNS_RATE_LIMIT",
        value_name = "PER_SECOND"
    )]
    pub dns_rate_limit: Option<u32>,

    /// The NFLOG group that ACL logging (namespaces annotated `k8s.ovn.org/acl-logging`)
    /// sends the logged EgressFirewall and NetworkPolicy verdicts to; the agent reads it and
    /// writes one log line per packet. Nothing else on the node may bind it. Default: 100.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_ACL_LOG_GROUP",
        value_name = "GROUP"
    )]
    pub acl_log_group: Option<u16>,

    /// ACL log lines per second per namespace (and IP family), also the burst; the kernel
    /// drops the log (never the verdict) beyond it. At least 1. Default: 20 (OVN-Kubernetes'
    /// `acl-logging-rate-limit`).
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_ACL_LOG_RATE_LIMIT",
        value_name = "PER_SECOND"
    )]
    pub acl_log_rate_limit: Option<u32>,
    /// Where egress IPs live: `auto` (from the Nodes' `spec.providerID`: `aws://`,
    /// `azure://`, `gce://`, `openstack://`, anything else bare metal), `baremetal`, `aws`,
    /// `azure`, `gcp` or `openstack`. On a cloud the EgressIP assigner asks the cloud
    /// controller for each IP (CloudPrivateIPConfig) and places it only once attached.
    /// Default: auto.
    #[arg(
        long,
        global = true,
        env = "NODEPLANE_PLATFORM",
        value_name = "PLATFORM"
    )]
    pub platform: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_bool_option_takes_its_value_after_equals_or_none() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["agent"].iter().chain(args)).map(|c| c.opts.pod_source_check)
        };
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(parse(&["--pod-source-check"]).unwrap(), Some(true));
        assert_eq!(parse(&["--pod-source-check=false"]).unwrap(), Some(false));
        assert_eq!(parse(&["--pod-source-check=no"]).unwrap(), Some(false));
        assert_eq!(parse(&["--pod-source-check=on"]).unwrap(), Some(true));
        assert!(parse(&["--pod-source-check=maybe"]).is_err());
        // Not `--pod-source-check false`: the value must follow `=`.
        assert!(parse(&["--pod-source-check", "false"]).is_err());
    }
}
