//! One builder per kind of object the agent reads, for unit tests, kernel tests and benches.
//!
//! Each builder prints a manifest (`Display`, YAML flow style, the form the agent loads from
//! its manifest directory) and parses into the typed object (`object()`), so a unit test and
//! an end-to-end test of the same case describe it the same way:
//!
//! ```text
//! let web = pod("web", "a").on("worker-1").labels(&[("app", "web")]).ips(&["10.128.0.5"]);
//! write_manifest(dir, "pods.yaml", &web.to_string());   // kernel test
//! Snapshot::builder().with(web.object());               // unit test
//! ```
//!
//! Rule lists (`egress`), ports and extra spec fields are YAML flow text, written as in the
//! API's documentation, so a test reads like the object it is about.

use std::fmt::{self, Display};

use serde::de::DeserializeOwned;

/// `{k: v, ...}`; empty for no labels.
fn flow_map(pairs: &[(String, String)]) -> String {
    // Quoted: an empty value (a label such as `k8s.ovn.org/egress-assignable: ""`) or `true`
    // is still a string.
    let items: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}: '{v}'")).collect();
    format!("{{{}}}", items.join(", "))
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn quoted(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
    items.join(", ")
}

fn strings(items: &[impl Display]) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

/// `metadata: {name: .., namespace: .., labels: {..}}`, each part only when given.
fn metadata(name: &str, namespace: Option<&str>, labels: &[(String, String)]) -> String {
    let mut parts = vec![format!("name: {name}")];
    if let Some(ns) = namespace {
        parts.push(format!("namespace: {ns}"));
    }
    if !labels.is_empty() {
        parts.push(format!("labels: {}", flow_map(labels)));
    }
    format!("metadata: {{{}}}", parts.join(", "))
}

/// Parses a manifest into its typed object; panics with the text when it does not parse.
#[track_caller]
pub fn parse<T: DeserializeOwned>(manifest: &str) -> T {
    serde_norway::from_str(manifest).unwrap_or_else(|e| panic!("{e}\n--- manifest ---\n{manifest}"))
}

/// Implements `object()` (the typed object) for a builder that is `Display` as its manifest.
macro_rules! typed {
    ($builder:ty => $kind:ty) => {
        impl $builder {
            /// The typed object, as the agent decodes it from the manifest.
            #[track_caller]
            pub fn object(&self) -> $kind {
                parse(&self.to_string())
            }
        }
    };
}

/// A Running pod; `on` its node, with `ips` (the first is `podIP`).
#[derive(Clone, Debug)]
pub struct Pod {
    namespace: String,
    name: String,
    node: Option<String>,
    labels: Vec<(String, String)>,
    ips: Vec<String>,
    /// Named container ports: (name, protocol, port).
    ports: Vec<(String, String, u16)>,
}

pub fn pod(namespace: &str, name: &str) -> Pod {
    Pod {
        namespace: namespace.into(),
        name: name.into(),
        node: None,
        labels: Vec::new(),
        ips: Vec::new(),
        ports: Vec::new(),
    }
}

impl Pod {
    pub fn on(mut self, node: &str) -> Pod {
        self.node = Some(node.into());
        self
    }

    pub fn labels(mut self, labels: &[(&str, &str)]) -> Pod {
        self.labels = owned(labels);
        self
    }

    pub fn ips(mut self, ips: &[impl Display]) -> Pod {
        self.ips = strings(ips);
        self
    }

    /// Named container ports (`name`, `protocol`, `containerPort`) of one container.
    pub fn named_ports(mut self, ports: &[(&str, &str, u16)]) -> Pod {
        self.ports = ports
            .iter()
            .map(|(n, p, port)| (n.to_string(), p.to_string(), *port))
            .collect();
        self
    }
}

impl Display for Pod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let meta = metadata(&self.name, Some(&self.namespace), &self.labels);
        let node = self
            .node
            .as_ref()
            .map_or(String::new(), |n| format!("nodeName: {n}, "));
        let pod_ip = self
            .ips
            .first()
            .map_or(String::new(), |ip| format!("podIP: '{ip}', "));
        let pod_ips: Vec<String> = self
            .ips
            .iter()
            .map(|ip| format!("{{ip: '{ip}'}}"))
            .collect();
        let ports: Vec<String> = self
            .ports
            .iter()
            .map(|(n, p, port)| format!("{{name: {n}, protocol: {p}, containerPort: {port}}}"))
            .collect();
        let containers = if ports.is_empty() {
            "[]".to_string()
        } else {
            format!("[{{name: c, ports: [{}]}}]", ports.join(", "))
        };
        write!(
            f,
            "apiVersion: v1\nkind: Pod\n{meta}\nspec: {{{node}containers: {containers}}}\n\
             status: {{phase: Running, {pod_ip}podIPs: [{}]}}\n",
            pod_ips.join(", ")
        )
    }
}

typed!(Pod => crate::api::Pod);

/// A Node with `ips` as its InternalIP addresses.
#[derive(Clone, Debug)]
pub struct Node {
    name: String,
    labels: Vec<(String, String)>,
    ips: Vec<String>,
    ready: Option<bool>,
    host_cidrs: Option<Vec<String>>,
    taints: Vec<String>,
    deleting: bool,
}

pub fn node(name: &str, ips: &[impl Display]) -> Node {
    Node {
        name: name.into(),
        labels: Vec::new(),
        ips: strings(ips),
        ready: None,
        host_cidrs: None,
        taints: Vec::new(),
        deleting: false,
    }
}

impl Node {
    pub fn labels(mut self, labels: &[(&str, &str)]) -> Node {
        self.labels = owned(labels);
        self
    }

    /// The Ready condition (none unless set).
    pub fn ready(mut self, ready: bool) -> Node {
        self.ready = Some(ready);
        self
    }

    /// A `NoSchedule` taint with this key (e.g. `ToBeDeletedByClusterAutoscaler`).
    pub fn taint(mut self, key: &str) -> Node {
        self.taints.push(key.into());
        self
    }

    /// Being deleted: a `deletionTimestamp` (and a finalizer, as such a node has).
    pub fn deleting(mut self) -> Node {
        self.deleting = true;
        self
    }

    /// The `k8s.ovn.org/host-cidrs` annotation (`address/prefix` entries).
    pub fn host_cidrs(mut self, cidrs: &[&str]) -> Node {
        self.host_cidrs = Some(strings(cidrs));
        self
    }
}

impl Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut meta = metadata(&self.name, None, &self.labels);
        if let Some(cidrs) = &self.host_cidrs {
            let json = serde_json::to_string(cidrs).expect("strings serialise");
            meta.pop();
            meta.push_str(&format!(
                ", annotations: {{'k8s.ovn.org/host-cidrs': '{json}'}}}}"
            ));
        }
        if self.deleting {
            meta.pop();
            meta.push_str(
                ", deletionTimestamp: '2026-01-01T00:00:00Z', finalizers: [example.com/hold]}",
            );
        }
        let spec = if self.taints.is_empty() {
            String::new()
        } else {
            let taints: Vec<String> = self
                .taints
                .iter()
                .map(|k| format!("{{key: '{k}', effect: NoSchedule}}"))
                .collect();
            format!("spec: {{taints: [{}]}}\n", taints.join(", "))
        };
        let addrs: Vec<String> = self
            .ips
            .iter()
            .map(|ip| format!("{{type: InternalIP, address: '{ip}'}}"))
            .collect();
        let conditions = self.ready.map_or(String::new(), |r| {
            let status = if r { "True" } else { "False" };
            format!(", conditions: [{{type: Ready, status: '{status}'}}]")
        });
        write!(
            f,
            "apiVersion: v1\nkind: Node\n{meta}\n{spec}status: {{addresses: [{}]{conditions}}}\n",
            addrs.join(", ")
        )
    }
}

typed!(Node => crate::api::Node);

/// A Namespace with labels (what namespace selectors match) and, optionally, the
/// `k8s.ovn.org/acl-logging` annotation.
#[derive(Clone, Debug)]
pub struct Namespace {
    name: String,
    labels: Vec<(String, String)>,
    acl_logging: Option<String>,
}

pub fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
    Namespace {
        name: name.into(),
        labels: owned(labels),
        acl_logging: None,
    }
}

impl Namespace {
    /// With `k8s.ovn.org/acl-logging: <value>` (`None`: without the annotation).
    pub fn acl_logging(mut self, value: Option<&str>) -> Self {
        self.acl_logging = value.map(str::to_string);
        self
    }
}

impl Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut meta = metadata(&self.name, None, &self.labels);
        if let Some(v) = &self.acl_logging {
            let annotations = flow_map(&[(crate::api::acl_logging::ANNOTATION.into(), v.clone())]);
            meta.insert_str(meta.len() - 1, &format!(", annotations: {annotations}"));
        }
        write!(f, "apiVersion: v1\nkind: Namespace\n{meta}\n")
    }
}

typed!(Namespace => crate::api::Namespace);

/// A NetworkPolicy `namespace/name`; `spec` is the YAML of its spec, indented by two spaces.
#[derive(Clone, Debug)]
pub struct NetworkPolicy {
    namespace: String,
    name: String,
    spec: String,
}

pub fn network_policy(namespace: &str, name: &str, spec: &str) -> NetworkPolicy {
    NetworkPolicy {
        namespace: namespace.into(),
        name: name.into(),
        spec: spec.into(),
    }
}

impl Display for NetworkPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ns, name, spec) = (&self.namespace, &self.name, &self.spec);
        write!(
            f,
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
             metadata: {{name: {name}, namespace: {ns}}}\nspec:\n{spec}\n"
        )
    }
}

typed!(NetworkPolicy => crate::api::NetworkPolicy);

/// The EgressFirewall of `namespace` (always named `default`); `egress` is the rule list.
#[derive(Clone, Debug)]
pub struct EgressFirewall {
    namespace: String,
    egress: String,
}

pub fn egress_firewall(namespace: &str, egress: &str) -> EgressFirewall {
    EgressFirewall {
        namespace: namespace.into(),
        egress: egress.into(),
    }
}

impl Display for EgressFirewall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ns, egress) = (&self.namespace, &self.egress);
        write!(
            f,
            "apiVersion: k8s.ovn.org/v1\nkind: EgressFirewall\n\
             metadata: {{name: default, namespace: {ns}}}\nspec:\n  egress: {egress}\n"
        )
    }
}

typed!(EgressFirewall => crate::api::EgressFirewall);

/// An EgressQoS of `namespace` named `default` (`named` for another); `egress` is the rules.
#[derive(Clone, Debug)]
pub struct EgressQos {
    namespace: String,
    name: String,
    egress: String,
}

pub fn egress_qos(namespace: &str, egress: &str) -> EgressQos {
    EgressQos {
        namespace: namespace.into(),
        name: "default".into(),
        egress: egress.into(),
    }
}

impl EgressQos {
    pub fn named(mut self, name: &str) -> EgressQos {
        self.name = name.into();
        self
    }
}

impl Display for EgressQos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ns, name, egress) = (&self.namespace, &self.name, &self.egress);
        write!(
            f,
            "apiVersion: k8s.ovn.org/v1\nkind: EgressQoS\n\
             metadata: {{name: {name}, namespace: {ns}}}\nspec:\n  egress: {egress}\n"
        )
    }
}

typed!(EgressQos => crate::api::EgressQoS);

/// An EgressIP selecting namespaces (and optionally pods) by labels, with the status
/// `items` (egress IP, node) that say where each address is hosted.
#[derive(Clone, Debug)]
pub struct EgressIp {
    name: String,
    created: Option<String>,
    ips: Vec<String>,
    namespace_selector: Vec<(String, String)>,
    pod_selector: Option<Vec<(String, String)>>,
    hosts: Vec<(String, String)>,
}

pub fn egress_ip(name: &str, ips: &[&str], namespace_labels: &[(&str, &str)]) -> EgressIp {
    EgressIp {
        name: name.into(),
        created: None,
        ips: strings(ips),
        namespace_selector: owned(namespace_labels),
        pod_selector: None,
        hosts: Vec::new(),
    }
}

impl EgressIp {
    pub fn pods(mut self, labels: &[(&str, &str)]) -> EgressIp {
        self.pod_selector = Some(owned(labels));
        self
    }

    /// `status.items`: (egress IP, node hosting it).
    pub fn hosted(mut self, hosts: &[(&str, &str)]) -> EgressIp {
        self.hosts = owned(hosts);
        self
    }

    /// `metadata.creationTimestamp` (RFC 3339): the oldest object wins a contested pod.
    pub fn created(mut self, timestamp: Option<&str>) -> EgressIp {
        self.created = timestamp.map(Into::into);
        self
    }
}

impl Display for EgressIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let created = self
            .created
            .as_ref()
            .map_or(String::new(), |t| format!(", creationTimestamp: '{t}'"));
        let pods = self.pod_selector.as_ref().map_or(String::new(), |p| {
            format!("\n  podSelector: {{matchLabels: {}}}", flow_map(p))
        });
        let items: Vec<String> = self
            .hosts
            .iter()
            .map(|(ip, node)| format!("{{egressIP: '{ip}', node: {node}}}"))
            .collect();
        write!(
            f,
            "apiVersion: k8s.ovn.org/v1\nkind: EgressIP\nmetadata: {{name: {}{created}}}\n\
             spec:\n  egressIPs: [{}]\n  namespaceSelector: {{matchLabels: {}}}{pods}\n\
             status:\n  items: [{}]\n",
            self.name,
            quoted(&self.ips),
            flow_map(&self.namespace_selector),
            items.join(", ")
        )
    }
}

typed!(EgressIp => crate::api::EgressIP);

/// A Service in namespace `default` (`in_namespace` for another). `ports` and `spec` are
/// flow-map items (`{name: http, port: 80, protocol: TCP}`; `type: NodePort, ...`).
#[derive(Clone, Debug)]
pub struct Service {
    namespace: String,
    name: String,
    cluster_ip: String,
    cluster_ips: Option<Vec<String>>,
    ports: String,
    spec: String,
    ingress: Vec<String>,
    created: Option<String>,
}

/// Only `spec.clusterIP`, as a single-stack object written by hand.
pub fn service(name: &str, cluster_ip: &str, ports: &str) -> Service {
    Service {
        namespace: "default".into(),
        name: name.into(),
        cluster_ip: cluster_ip.into(),
        cluster_ips: None,
        ports: ports.into(),
        spec: String::new(),
        ingress: Vec::new(),
        created: None,
    }
}

/// `spec.clusterIP` (the first) and `spec.clusterIPs`, as the API server fills them in.
pub fn service_ips(name: &str, cluster_ips: &[&str], ports: &str) -> Service {
    Service {
        cluster_ips: Some(strings(cluster_ips)),
        ..service(name, cluster_ips[0], ports)
    }
}

impl Service {
    pub fn in_namespace(mut self, namespace: &str) -> Service {
        self.namespace = namespace.into();
        self
    }

    /// More spec fields, e.g. `type: NodePort, externalTrafficPolicy: Local`.
    pub fn spec(mut self, fields: &str) -> Service {
        self.spec = fields.into();
        self
    }

    /// `status.loadBalancer.ingress` IPs.
    pub fn lb_ingress(mut self, ips: &[&str]) -> Service {
        self.ingress = strings(ips);
        self
    }

    /// `metadata.creationTimestamp` (RFC 3339): the older Service wins a contested frontend.
    pub fn created(mut self, timestamp: &str) -> Service {
        self.created = Some(timestamp.into());
        self
    }
}

impl Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ns, name, ip, ports) = (&self.namespace, &self.name, &self.cluster_ip, &self.ports);
        let ips = self.cluster_ips.as_ref().map_or(String::new(), |ips| {
            format!(", clusterIPs: [{}]", quoted(ips))
        });
        let extra = if self.spec.is_empty() {
            String::new()
        } else {
            format!(", {}", self.spec)
        };
        let created = self
            .created
            .as_ref()
            .map_or(String::new(), |t| format!(", creationTimestamp: '{t}'"));
        write!(
            f,
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}{created}}}\n\
             spec: {{clusterIP: '{ip}'{ips}, ports: [{ports}]{extra}}}\n"
        )?;
        if !self.ingress.is_empty() {
            let items: Vec<String> = self
                .ingress
                .iter()
                .map(|ip| format!("{{ip: '{ip}'}}"))
                .collect();
            writeln!(
                f,
                "status: {{loadBalancer: {{ingress: [{}]}}}}",
                items.join(", ")
            )?;
        }
        Ok(())
    }
}

typed!(Service => crate::api::Service);

/// One endpoint of a slice: address and node; `conditions` absent unless set (the API's
/// "unknown", which counts as ready).
#[derive(Clone, Debug)]
pub struct Ep {
    ip: String,
    node: String,
    ready: Option<bool>,
    terminating: bool,
    /// `hints.forZones` names.
    zones: Vec<String>,
    /// `hints.forNodes` names.
    nodes: Vec<String>,
    /// Further `addresses` after `ip` (the API treats them as the same endpoint).
    more_ips: Vec<String>,
}

/// A ready, serving, not terminating endpoint (conditions written out).
pub fn ep(ip: &str, node: &str) -> Ep {
    Ep {
        ip: ip.into(),
        node: node.into(),
        ready: Some(true),
        terminating: false,
        zones: Vec::new(),
        nodes: Vec::new(),
        more_ips: Vec::new(),
    }
}

impl Ep {
    /// Ready and serving as given, not terminating.
    pub fn ready(mut self, ready: bool) -> Ep {
        self.ready = Some(ready);
        self
    }

    /// Terminating but still serving (`ready: false, serving: true, terminating: true`): a
    /// pod in its grace period.
    pub fn terminating(mut self) -> Ep {
        self.ready = Some(false);
        self.terminating = true;
        self
    }

    /// `hints: {forZones: [...]}` with these zone names (topology-aware routing).
    pub fn for_zones(mut self, zones: &[&str]) -> Ep {
        self.zones = zones.iter().map(|z| z.to_string()).collect();
        self
    }

    /// `hints: {forNodes: [...]}` with these node names (`PreferSameNode`).
    pub fn for_nodes(mut self, nodes: &[&str]) -> Ep {
        self.nodes = nodes.iter().map(|n| n.to_string()).collect();
        self
    }

    /// More `addresses` after the first.
    pub fn more_ips(mut self, ips: &[&str]) -> Ep {
        self.more_ips = ips.iter().map(|ip| ip.to_string()).collect();
        self
    }

    /// No `conditions` at all.
    pub fn unknown(mut self) -> Ep {
        self.ready = None;
        self
    }
}

/// An EndpointSlice of `service` in namespace `default` (`in_namespace` for another);
/// `address_type` is `IPv4` or `IPv6`, `ports` flow-map items.
#[derive(Clone, Debug)]
pub struct EndpointSlice {
    namespace: String,
    name: String,
    service: String,
    address_type: String,
    ports: String,
    endpoints: Vec<Ep>,
}

pub fn endpoint_slice(
    name: &str,
    service: &str,
    address_type: &str,
    ports: &str,
    endpoints: &[Ep],
) -> EndpointSlice {
    EndpointSlice {
        namespace: "default".into(),
        name: name.into(),
        service: service.into(),
        address_type: address_type.into(),
        ports: ports.into(),
        endpoints: endpoints.to_vec(),
    }
}

impl EndpointSlice {
    pub fn in_namespace(mut self, namespace: &str) -> EndpointSlice {
        self.namespace = namespace.into();
        self
    }
}

impl Display for EndpointSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let eps: Vec<String> = self
            .endpoints
            .iter()
            .map(|e| {
                let conditions = e.ready.map_or(String::new(), |r| {
                    let (serving, t) = (r || e.terminating, e.terminating);
                    format!(", conditions: {{ready: {r}, serving: {serving}, terminating: {t}}}")
                });
                let names = |names: &[String]| {
                    let items: Vec<String> =
                        names.iter().map(|n| format!("{{name: {n}}}")).collect();
                    items.join(", ")
                };
                let hints = match (e.zones.is_empty(), e.nodes.is_empty()) {
                    (true, true) => String::new(),
                    _ => format!(
                        ", hints: {{forZones: [{}], forNodes: [{}]}}",
                        names(&e.zones),
                        names(&e.nodes)
                    ),
                };
                let addresses: Vec<String> = std::iter::once(&e.ip)
                    .chain(&e.more_ips)
                    .map(|ip| format!("'{ip}'"))
                    .collect();
                format!(
                    "{{addresses: [{}], nodeName: {}{conditions}{hints}}}",
                    addresses.join(", "),
                    e.node
                )
            })
            .collect();
        let (ns, name, service) = (&self.namespace, &self.name, &self.service);
        write!(
            f,
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: {name}, namespace: {ns}, labels: {{kubernetes.io/service-name: {service}}}}}\n\
             addressType: {}\nports: [{}]\nendpoints: [{}]\n",
            self.address_type,
            self.ports,
            eps.join(", ")
        )
    }
}

typed!(EndpointSlice => crate::api::EndpointSlice);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{node_internal_ips, pod_ips};

    #[test]
    fn every_builder_parses_into_its_kind() {
        let p = pod("web", "a")
            .on("w1")
            .labels(&[("app", "web")])
            .ips(&["10.128.0.5", "fd01::5"])
            .object();
        assert_eq!(pod_ips(&p).len(), 2);
        assert_eq!(
            node_internal_ips(&node("w1", &["192.0.2.1"]).object()).len(),
            1
        );
        namespace("web", &[("team", "a")]).object();
        egress_firewall("web", "[{type: Deny, to: {cidrSelector: 0.0.0.0/0}}]").object();
        egress_qos("web", "[{dscp: 46}]").named("q").object();
        egress_ip("e", &["192.0.2.9"], &[("team", "a")])
            .pods(&[("app", "api")])
            .hosted(&[("192.0.2.9", "w1")])
            .created(Some("2024-01-01T00:00:00Z"))
            .object();
        let ports = "{name: http, port: 80, protocol: TCP}";
        service_ips("s", &["172.30.0.1", "fd02::1"], ports)
            .spec("type: NodePort")
            .lb_ingress(&["198.51.100.1"])
            .object();
        let eps = [ep("10.128.0.5", "w1"), ep("10.128.0.6", "w1").ready(false)];
        endpoint_slice("s-1", "s", "IPv4", ports, &eps).object();
    }
}
