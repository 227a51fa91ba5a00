//! Service and EndpointSlice manifests for the services kernel tests.

/// One endpoint: address, node, ready.
pub struct Ep<'a> {
    pub ip: &'a str,
    pub node: &'a str,
    pub ready: bool,
}

pub fn ep<'a>(ip: &'a str, node: &'a str) -> Ep<'a> {
    Ep {
        ip,
        node,
        ready: true,
    }
}

/// A Service; `extra_spec` is YAML flow-map entries added to the spec (e.g.
/// `type: NodePort, externalTrafficPolicy: Local`), `ports` flow-map items.
pub fn service(name: &str, cluster_ips: &[&str], ports: &str, extra_spec: &str) -> String {
    let ips: Vec<String> = cluster_ips.iter().map(|ip| format!("'{ip}'")).collect();
    let extra = if extra_spec.is_empty() {
        String::new()
    } else {
        format!(", {extra_spec}")
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n\
         spec: {{clusterIP: '{}', clusterIPs: [{}], ports: [{ports}]{extra}}}\n",
        cluster_ips[0],
        ips.join(", ")
    )
}

/// Adds `status.loadBalancer.ingress` to a service document.
pub fn with_lb_ingress(doc: &str, ips: &[&str]) -> String {
    let items: Vec<String> = ips.iter().map(|ip| format!("{{ip: '{ip}'}}")).collect();
    format!(
        "{doc}status: {{loadBalancer: {{ingress: [{}]}}}}\n",
        items.join(", ")
    )
}

/// An EndpointSlice of `service` (family from `address_type`), ports as flow-map items.
pub fn slice(name: &str, service: &str, address_type: &str, ports: &str, eps: &[Ep]) -> String {
    let eps: Vec<String> = eps
        .iter()
        .map(|e| {
            format!(
                "{{addresses: ['{}'], nodeName: {}, conditions: {{ready: {}, serving: {}, terminating: false}}}}",
                e.ip, e.node, e.ready, e.ready
            )
        })
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata: {{name: {name}, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}\n\
         addressType: {address_type}\nports: [{ports}]\nendpoints: [{}]\n",
        eps.join(", ")
    )
}

pub fn node(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n\
         status: {{addresses: [{{type: InternalIP, address: '{ip}'}}]}}\n"
    )
}
