//! EgressFirewall DNS under the policies that judge the same query without the proxy: the
//! sending pod's EgressFirewall and NetworkPolicy (egress) and the resolver pod's
//! NetworkPolicy (ingress), also when the resolver is a ClusterIP whose backend is a pod.
//!
//! Node `node-1` forwards for pod `a1` (namespace `alpha`, whose EgressFirewall has a
//! `dnsName` rule, so its DNS is steered) and pod `r1` (namespace `dns`), which serves DNS at
//! 10.128.0.9:53 and is the backend of the cluster DNS Service `kube-system/kube-dns`
//! (ClusterIP 172.30.0.10). The external host 192.168.1.100 runs the resolver of the node's
//! resolv.conf and owns 198.18.0.0/15 with a TCP server on port 80 of every address. Both
//! resolvers are trusted (the defaults: the cluster DNS ClusterIP and resolv.conf).

use nodeplane::testing::lab::dns::{DnsServer, Zone, lookup, lookup_and_connect};
use nodeplane::testing::lab::{
    AgentProcess, Lab, ManifestAgent, Ns, Pod, Server, eventually, set_br_netfilter,
};
use nodeplane::testing::objects;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

const NODE: &str = "node-1";
const EXTERNAL_DNS: &str = "192.168.1.100:53";
const CLUSTER_DNS: &str = "172.30.0.10:53";
const LOOKUP: Duration = Duration::from_secs(2);
const CONNECT: Duration = Duration::from_millis(500);
/// Both resolvers answer `*.example.com`, each with its own address (who answered shows).
const EXTERNAL_ANSWER: &str = "198.18.1.1";
const POD_ANSWER: &str = "198.18.2.2";
/// DNS to the external resolver allowed, `*.example.com` learned, everything else denied.
const FIREWALL: &str = "[{type: Allow, to: {cidrSelector: 192.168.1.100/32}, ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]}, {type: Allow, to: {dnsName: '*.example.com'}}, {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]";

fn zone(answer: &str) -> Zone {
    let mut z = Zone::default();
    for name in ["x.example.com", "y.example.com"] {
        z.fixed
            .insert(name.into(), (vec![answer.parse().unwrap()], 30));
    }
    z
}

fn external_dns() -> SocketAddr {
    EXTERNAL_DNS.parse().unwrap()
}

fn cluster_dns() -> SocketAddr {
    CLUSTER_DNS.parse().unwrap()
}

/// The cluster DNS Service and its EndpointSlice, backed by `backend` (port 53, UDP and TCP).
fn cluster_dns_service(backend: &str) -> String {
    let service = objects::service(
        "kube-dns",
        "172.30.0.10",
        "{name: dns, port: 53, protocol: UDP, targetPort: 53}, {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}",
    )
    .in_namespace("kube-system");
    let slice = objects::endpoint_slice(
        "kube-dns-1",
        "kube-dns",
        "IPv4",
        "{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}",
        &[objects::ep(backend, NODE)],
    )
    .in_namespace("kube-system");
    format!("{service}---\n{slice}")
}

/// Everything of one test but the pods, which differ between routed and bridged.
struct Site {
    node: Ns,
    /// The uplink host (192.168.1.100, fd00:1::100).
    ext: Ns,
    external: DnsServer,
    agent: ManifestAgent,
    _server: Server,
}

fn site(lab: &mut Lab, node: &Ns, flags: &[&str]) -> Site {
    let ext = lab.add_uplink_host(node, "ext");
    lab.add_uplink_prefix(node, &ext, "198.18.0.0/15");
    let server = ext.tcp_server("0.0.0.0:80", "ext");
    let external = DnsServer::start(&ext, external_dns(), zone(EXTERNAL_ANSWER));
    let mut args = vec!["--cluster-cidr", "10.128.0.0/14,fd01::/48"];
    args.extend_from_slice(flags);
    let mut agent = ManifestAgent::new(node, NODE, &args);
    agent.set_resolv_conf(
        "nameserver 192.168.1.100\nnameserver fd00:1::100\noptions timeout:1 attempts:1\n",
    );
    Site {
        node: node.clone(),
        ext,
        external,
        agent,
        _server: server,
    }
}

impl Site {
    /// Waits until `map` (an nft set or map of the agent's table) lists `ip` (or, with
    /// `present` false, no longer does).
    fn wait_listed(&self, map: &str, ip: IpAddr, present: bool) {
        eventually(Duration::from_secs(15), || {
            let listing = self
                .node
                .nft(&["list", "map", "inet", "nodeplane", map])
                .or_else(|_| self.node.nft(&["list", "set", "inet", "nodeplane", map]))
                .unwrap_or_default();
            if listing.contains(&format!("{ip} ")) == present {
                Ok(())
            } else {
                Err(format!("{ip} listed {}: {listing}", !present))
            }
        });
    }

    /// Writes the NetworkPolicies `docs` (none: removes them), named `names` (as
    /// `namespace/name`), and waits until the node has a chain for each and its dispatch maps
    /// say which pods they isolate.
    fn policies(
        &self,
        (docs, names): (&[String], &[&str]),
        egress: &[IpAddr],
        ingress: &[IpAddr],
        all: &[IpAddr],
    ) {
        self.agent.write("np.yaml", &docs.join("---\n"));
        eventually(Duration::from_secs(15), || {
            let chains = self
                .node
                .nft(&["list", "chains", "inet"])
                .unwrap_or_default();
            // Chain names carry the key with `/` and `-` as `_`.
            let missing: Vec<_> = names
                .iter()
                .map(|n| n.replace(['/', '-'], "_"))
                .filter(|n| !chains.contains(n.as_str()))
                .collect();
            match missing.is_empty() {
                true => Ok(()),
                false => Err(format!("no chain for {missing:?} yet")),
            }
        });
        for ip in all {
            self.wait_listed("np-egress-v4", *ip, egress.contains(ip));
            self.wait_listed("np-ingress-v4", *ip, ingress.contains(ip));
        }
    }
}

/// The outcome of a lookup in `pod` at `server`, UDP then TCP (`lookup_and_connect`).
fn ask(pod: &Pod, server: SocketAddr, name: &str) -> [Result<(Ipv4Addr, bool), String>; 2] {
    lookup_and_connect(&pod.ns, server, name, (LOOKUP, CONNECT))
}

/// Both lookups answered by `answer` and the address allowed at once.
fn answered(got: &[Result<(Ipv4Addr, bool), String>; 2], answer: &str) -> bool {
    let want: Ipv4Addr = answer.parse().unwrap();
    got.iter().all(|g| g == &Ok((want, true)))
}

fn refused(got: &[Result<(Ipv4Addr, bool), String>; 2]) -> bool {
    got.iter().all(Result::is_err)
}

fn node_ip() -> IpAddr {
    "192.168.1.1".parse().unwrap()
}

/// The routed topology of the module documentation.
struct Routed {
    site: Site,
    a1: Pod,
    r1: Pod,
    in_pod: DnsServer,
    _lab: Lab,
}

fn routed(firewall: &str, flags: &[&str]) -> Routed {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let a1 = lab.add_pod(&node, "a1", &["10.128.0.5", "fd01::5"]);
    let r1 = lab.add_pod(&node, "r1", &["10.128.0.9"]);
    let in_pod = DnsServer::start(&r1.ns, "10.128.0.9:53".parse().unwrap(), zone(POD_ANSWER));
    let site = site(&mut lab, &node, flags);
    let pods = [
        a1.manifest("alpha", "a1", NODE),
        r1.manifest("dns", "r1", NODE),
    ];
    site.agent.write("pods.yaml", &pods.join("---\n"));
    site.agent
        .write("svc.yaml", &cluster_dns_service("10.128.0.9"));
    site.agent.write(
        "fw-alpha.yaml",
        &objects::egress_firewall("alpha", firewall).to_string(),
    );
    Routed {
        site,
        a1,
        r1,
        in_pod,
        _lab: lab,
    }
}

impl Routed {
    /// Starts the agent; up once a1 is steered and a lookup through the proxy (asked from
    /// the node) works at `server`.
    fn spawn(&self, server: SocketAddr, flags: &[&str]) -> AgentProcess {
        let agent = self.site.agent.spawn(flags);
        self.site.wait_listed("fw-dns-pods-v4", self.a1.ip(), true);
        eventually(Duration::from_secs(15), || {
            let _ = self.site.external.take_sources();
            let _ = self.in_pod.take_sources();
            lookup(&self.a1.ns, server, "probe.example.com", LOOKUP)?;
            let mut sources = self.site.external.take_sources();
            sources.extend(self.in_pod.take_sources());
            if sources.contains(&node_ip()) {
                Ok(())
            } else {
                Err(format!("queries come from {sources:?}"))
            }
        });
        agent
    }

    fn all(&self) -> [IpAddr; 2] {
        [self.a1.ip(), self.r1.ip()]
    }
}

/// `podSelector: {}` of `namespace` with the given spec lines after it.
fn policy(namespace: &str, name: &str, spec: &str) -> String {
    objects::network_policy(namespace, name, &format!("  podSelector: {{}}\n{spec}")).to_string()
}

/// (a) A steered pod whose egress NetworkPolicy does not allow DNS gets no answer through the
/// proxy, from either resolver; allowing DNS to one resolver opens exactly that one.
#[test]
fn a_steered_pods_egress_policy_judges_its_proxied_dns() {
    let t = routed(FIREWALL, &[]);
    let agent = t.spawn(external_dns(), &[]);
    let before = [
        ask(&t.a1, external_dns(), "x.example.com"),
        ask(&t.a1, cluster_dns(), "y.example.com"),
    ];
    // alpha may only open TCP 80 to 198.18.0.0/15.
    let web_only = policy(
        "alpha",
        "web-only",
        "  policyTypes: [Egress]\n  egress: [{to: [{ipBlock: {cidr: 198.18.0.0/15}}], ports: [{protocol: TCP, port: 80}]}]\n",
    );
    t.site.policies(
        (std::slice::from_ref(&web_only), &["alpha/web-only"]),
        &[t.a1.ip()],
        &[],
        &t.all(),
    );
    let _ = (t.site.external.take_sources(), t.in_pod.take_sources());
    let denied = [
        ask(&t.a1, external_dns(), "x.example.com"),
        ask(&t.a1, cluster_dns(), "y.example.com"),
    ];
    let asked = (t.site.external.take_sources(), t.in_pod.take_sources());
    // Plus DNS to the external resolver only.
    let dns_out = policy(
        "alpha",
        "dns-out",
        "  policyTypes: [Egress]\n  egress: [{to: [{ipBlock: {cidr: 192.168.1.100/32}}], ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]}]\n",
    );
    let both = [web_only, dns_out];
    let names = ["alpha/web-only", "alpha/dns-out"];
    t.site
        .policies((&both, &names), &[t.a1.ip()], &[], &t.all());
    let partly = [
        ask(&t.a1, external_dns(), "x.example.com"),
        ask(&t.a1, cluster_dns(), "y.example.com"),
    ];
    let (status, logs) = agent.stop();
    assert!(
        answered(&before[0], EXTERNAL_ANSWER) && answered(&before[1], POD_ANSWER),
        "without a policy both resolvers answer through the proxy: {before:?}\n{logs}"
    );
    assert!(
        refused(&denied[0]) && refused(&denied[1]),
        "the egress policy denies DNS, yet: {denied:?} (asked: {asked:?})"
    );
    assert!(
        asked.0.is_empty() && asked.1.is_empty(),
        "a denied query reached a resolver: {asked:?}"
    );
    assert!(
        answered(&partly[0], EXTERNAL_ANSWER) && refused(&partly[1]),
        "DNS allowed to the external resolver only: {partly:?}"
    );
    assert!(status.success(), "{status}:\n{logs}");
}

/// (a) over IPv6: a trusted resolver at fd00:1::100 (resolv.conf), a1 asking from fd01::5;
/// the egress policy allows no IPv6 at all.
#[test]
fn a_steered_pods_egress_policy_judges_its_proxied_dns_over_ipv6() {
    let t = routed(FIREWALL, &[]);
    let dns6: SocketAddr = "[fd00:1::100]:53".parse().unwrap();
    let server6 = DnsServer::start(&t.site.ext, dns6, zone(EXTERNAL_ANSWER));
    let agent = t.spawn(external_dns(), &[]);
    t.site
        .wait_listed("fw-dns-pods-v6", "fd01::5".parse().unwrap(), true);
    let _ = server6.take_sources();
    let before = ask(&t.a1, dns6, "x.example.com");
    let proxied_from = server6.take_sources();
    let web_only = policy(
        "alpha",
        "web-only",
        "  policyTypes: [Egress]\n  egress: [{to: [{ipBlock: {cidr: 198.18.0.0/15}}], ports: [{protocol: TCP, port: 80}]}]\n",
    );
    let all = [t.a1.ip(), t.r1.ip()];
    t.site
        .policies((&[web_only], &["alpha/web-only"]), &[t.a1.ip()], &[], &all);
    let denied = ask(&t.a1, dns6, "x.example.com");
    let asked = server6.take_sources();
    let (status, logs) = agent.stop();
    assert!(
        answered(&before, EXTERNAL_ANSWER),
        "without a policy the IPv6 resolver answers: {before:?}\n{logs}"
    );
    assert_eq!(
        proxied_from,
        ["fd00:1::1".parse::<IpAddr>().unwrap()].into(),
        "the IPv6 queries went through the proxy"
    );
    assert!(
        refused(&denied) && asked.is_empty(),
        "the egress policy denies IPv6 DNS, yet: {denied:?} (asked by {asked:?})"
    );
    assert!(status.success(), "{status}:\n{logs}");
}

/// (b) The resolver pod behind the cluster DNS ClusterIP isolates itself: a steered pod's
/// query through the proxy does not reach it; an ingress rule for that pod lets it through.
#[test]
fn an_isolated_resolver_pod_is_not_reached_through_the_proxy() {
    let t = routed(FIREWALL, &[]);
    let agent = t.spawn(cluster_dns(), &[]);
    let before = ask(&t.a1, cluster_dns(), "x.example.com");
    let isolated = policy("dns", "nobody", "  ingress: []\n");
    t.site
        .policies((&[isolated], &["dns/nobody"]), &[], &[t.r1.ip()], &t.all());
    let _ = t.in_pod.take_sources();
    let denied = ask(&t.a1, cluster_dns(), "x.example.com");
    let asked = t.in_pod.take_sources();
    let from_a1 = policy(
        "dns",
        "from-a1",
        "  ingress: [{from: [{ipBlock: {cidr: 10.128.0.5/32}}], ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]}]\n",
    );
    t.site
        .policies((&[from_a1], &["dns/from-a1"]), &[], &[t.r1.ip()], &t.all());
    let allowed = ask(&t.a1, cluster_dns(), "y.example.com");
    let (status, logs) = agent.stop();
    assert!(
        answered(&before, POD_ANSWER),
        "the ClusterIP resolver answers through the proxy: {before:?}\n{logs}"
    );
    assert!(
        refused(&denied) && asked.is_empty(),
        "the isolated resolver pod answered: {denied:?} (asked by {asked:?})"
    );
    assert!(
        answered(&allowed, POD_ANSWER),
        "the resolver admits a1: {allowed:?}\n{logs}"
    );
    assert!(status.success(), "{status}:\n{logs}");
}

/// (b) and issue 26 item 9: the trusted resolver is a pod's own address
/// (`--dns-resolvers`); when it isolates itself, a steered pod does not reach its port 53.
#[test]
fn a_steered_pod_does_not_reach_an_isolated_pods_port_53() {
    let pod_dns: SocketAddr = "10.128.0.9:53".parse().unwrap();
    let t = routed(FIREWALL, &[]);
    let agent = t.spawn(pod_dns, &["--dns-resolvers", "10.128.0.9,192.168.1.100"]);
    let before = ask(&t.a1, pod_dns, "x.example.com");
    let isolated = policy("dns", "nobody", "  ingress: []\n");
    t.site
        .policies((&[isolated], &["dns/nobody"]), &[], &[t.r1.ip()], &t.all());
    let _ = t.in_pod.take_sources();
    let denied = ask(&t.a1, pod_dns, "x.example.com");
    let asked = t.in_pod.take_sources();
    let (status, logs) = agent.stop();
    assert!(
        answered(&before, POD_ANSWER),
        "the pod resolver answers through the proxy: {before:?}\n{logs}"
    );
    assert!(
        refused(&denied) && asked.is_empty(),
        "the isolated pod answered: {denied:?} (asked by {asked:?})"
    );
    assert!(status.success(), "{status}:\n{logs}");
}

/// (c) The EgressFirewall denies the external resolver (`Deny 0.0.0.0/0`, no DNS rule): as
/// without the proxy, the pod cannot ask it, while the cluster DNS (in the cluster, which an
/// EgressFirewall never judges) answers and teaches.
#[test]
fn a_trusted_resolver_the_firewall_denies_is_not_asked() {
    let t = routed(
        "[{type: Allow, to: {dnsName: '*.example.com'}}, {type: Deny, to: {cidrSelector: 0.0.0.0/0}}]",
        &[],
    );
    let agent = t.spawn(cluster_dns(), &[]);
    let _ = t.site.external.take_sources();
    let external = ask(&t.a1, external_dns(), "x.example.com");
    let asked = t.site.external.take_sources();
    let cluster = ask(&t.a1, cluster_dns(), "y.example.com");
    let (status, logs) = agent.stop();
    assert!(
        refused(&external) && asked.is_empty(),
        "the firewall denies 192.168.1.100, yet: {external:?} (asked by {asked:?})"
    );
    assert!(
        answered(&cluster, POD_ANSWER),
        "the cluster DNS answers and teaches: {cluster:?}\n{logs}"
    );
    assert!(status.success(), "{status}:\n{logs}");
}

/// Bridged pods (`br0`, 10.128.5.0/24), with `br_netfilter` off and on: client `p` (alpha,
/// steered) and the cluster DNS backend `r` (namespace `dns`) on the same bridge. Egress
/// denied: no answer from either resolver; the resolver isolated: the ClusterIP does not
/// answer, the external resolver still does.
#[test]
fn bridged_pods_proxied_dns_meets_the_same_policies() {
    let mut lab = Lab::new();
    let node = lab.add_node("node");
    let bridge = lab.add_bridge(&node, "br0", &["10.128.5.1/24"]);
    let p = lab.add_bridged_pod(&bridge, "p", &["10.128.5.2/24"]);
    let r = lab.add_bridged_pod(&bridge, "r", &["10.128.5.3/24"]);
    let in_pod = DnsServer::start(&r.ns, "10.128.5.3:53".parse().unwrap(), zone(POD_ANSWER));
    let site = site(&mut lab, &node, &[]);
    let pods = [
        objects::pod("alpha", "p").on(NODE).ips(&["10.128.5.2"]),
        objects::pod("dns", "r").on(NODE).ips(&["10.128.5.3"]),
    ]
    .map(|p| p.to_string());
    site.agent.write("pods.yaml", &pods.join("---\n"));
    site.agent
        .write("svc.yaml", &cluster_dns_service("10.128.5.3"));
    site.agent.write(
        "fw-alpha.yaml",
        &objects::egress_firewall("alpha", FIREWALL).to_string(),
    );
    let all = [p.ip(), r.ip()];
    let agent = site.agent.spawn(&[]);
    site.wait_listed("fw-dns-pods-v4", p.ip(), true);
    let no_egress = policy("alpha", "none", "  policyTypes: [Egress]\n  egress: []\n");
    let isolated = policy("dns", "nobody", "  ingress: []\n");
    let mut failures = Vec::new();
    for on in [false, true] {
        set_br_netfilter(&node, on);
        site.policies((&[], &[]), &[], &[], &all);
        // Up (and steered) once the external resolver is asked from the node.
        eventually(Duration::from_secs(15), || {
            let at = external_dns();
            site.external
                .lookup_via(&p.ns, at, "probe.example.com", node_ip(), LOOKUP)
        });
        let open = [
            ask(&p, external_dns(), "x.example.com"),
            ask(&p, cluster_dns(), "y.example.com"),
        ];
        if !(answered(&open[0], EXTERNAL_ANSWER) && answered(&open[1], POD_ANSWER)) {
            failures.push(format!("br_netfilter {on}, no policy: {open:?}"));
        }
        site.policies(
            (std::slice::from_ref(&no_egress), &["alpha/none"]),
            &[p.ip()],
            &[],
            &all,
        );
        let _ = (site.external.take_sources(), in_pod.take_sources());
        let denied = [
            ask(&p, external_dns(), "x.example.com"),
            ask(&p, cluster_dns(), "y.example.com"),
        ];
        let asked = (site.external.take_sources(), in_pod.take_sources());
        if !(refused(&denied[0]) && refused(&denied[1]) && asked.0.is_empty() && asked.1.is_empty())
        {
            failures.push(format!(
                "br_netfilter {on}, egress denied: {denied:?} (asked {asked:?})"
            ));
        }
        site.policies(
            (std::slice::from_ref(&isolated), &["dns/nobody"]),
            &[],
            &[r.ip()],
            &all,
        );
        let _ = in_pod.take_sources();
        let resolver_isolated = [
            ask(&p, external_dns(), "x.example.com"),
            ask(&p, cluster_dns(), "y.example.com"),
        ];
        let asked = in_pod.take_sources();
        if !(answered(&resolver_isolated[0], EXTERNAL_ANSWER)
            && refused(&resolver_isolated[1])
            && asked.is_empty())
        {
            failures.push(format!(
                "br_netfilter {on}, resolver isolated: {resolver_isolated:?} (asked by {asked:?})"
            ));
        }
    }
    let (status, logs) = agent.stop();
    assert!(failures.is_empty(), "{failures:#?}\n{logs}");
    assert!(status.success(), "{status}:\n{logs}");
}
