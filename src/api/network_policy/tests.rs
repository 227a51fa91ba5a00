use super::*;

fn from_yaml(spec: &str) -> NetworkPolicy {
    serde_norway::from_str(&format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
         metadata: {{name: p, namespace: ns1}}\nspec:\n{spec}"
    ))
    .unwrap()
}

#[test]
fn policy_types_default_as_the_api_documents() {
    let only_ingress = validate(&from_yaml("  podSelector: {}\n")).unwrap();
    assert_eq!(only_ingress.ingress, Some(vec![]), "Ingress always");
    assert_eq!(only_ingress.egress, None);
    let with_egress = validate(&from_yaml("  podSelector: {}\n  egress: [{}]\n")).unwrap();
    assert!(with_egress.ingress.is_some() && with_egress.egress.is_some());
    let egress_only = validate(&from_yaml("  podSelector: {}\n  policyTypes: [Egress]\n")).unwrap();
    assert_eq!(
        (egress_only.ingress, egress_only.egress),
        (None, Some(vec![]))
    );
}

#[test]
fn peers_and_ports_parse() {
    let p = validate(&from_yaml(
        "  podSelector: {matchLabels: {app: db}}\n  ingress:\n  - from:\n    \
         - {podSelector: {matchLabels: {app: web}}, namespaceSelector: {matchLabels: {t: a}}}\n    \
         - podSelector: {}\n    \
         - ipBlock: {cidr: 10.0.0.1/8, except: [10.1.0.0/16]}\n    \
         ports: [{port: 80}, {protocol: UDP, port: 53, endPort: 60}, {port: http}, {protocol: SCTP}]\n",
    ))
    .unwrap();
    let rule = &p.ingress.unwrap()[0];
    let peers = rule.peers.as_ref().unwrap();
    assert!(matches!(
        &peers[0],
        Peer::Pods {
            namespaces: NamespaceScope::Matching(_),
            ..
        }
    ));
    assert!(
        matches!(&peers[1], Peer::Pods { namespaces: NamespaceScope::Own, pods } if pods.is_everything())
    );
    assert_eq!(
        peers[2],
        Peer::Block {
            cidr: "10.0.0.0/8".parse().unwrap(),
            except: vec!["10.1.0.0/16".parse().unwrap()]
        }
    );
    let ports = rule.ports.as_ref().unwrap();
    assert_eq!(
        ports[0],
        PolicyPort {
            protocol: Protocol::Tcp,
            port: PortSpec::Range(80, 80)
        }
    );
    assert_eq!(
        ports[1],
        PolicyPort {
            protocol: Protocol::Udp,
            port: PortSpec::Range(53, 60)
        }
    );
    assert_eq!(ports[2].port, PortSpec::Named("http".into()));
    assert_eq!(
        ports[3],
        PolicyPort {
            protocol: Protocol::Sctp,
            port: PortSpec::All
        }
    );
}

#[test]
fn error_messages_name_the_field() {
    #[rustfmt::skip]
    let cases = [
        ("  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]\n",
         r#"NetworkPolicy ns1/p: spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR "10.0.0.0/33""#),
        ("  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.1.0.0/24]}}]}]\n",
         "NetworkPolicy ns1/p: spec.egress[0].to[0].ipBlock.except[0]: 10.1.0.0/24 must be strictly inside the cidr 10.0.0.0/16"),
        ("  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.0.0.0/16]}}]}]\n",
         "NetworkPolicy ns1/p: spec.egress[0].to[0].ipBlock.except[0]: 10.0.0.0/16 must be strictly inside the cidr 10.0.0.0/16"),
        ("  ingress: [{ports: [{port: 0}]}]\n",
         "NetworkPolicy ns1/p: spec.ingress[0].ports[0].port: port 0 out of range 1-65535"),
        ("  ingress: [{ports: [{port: 90, endPort: 80}]}]\n",
         "NetworkPolicy ns1/p: spec.ingress[0].ports[0].endPort: endPort 80 is below port 90"),
        ("  ingress: [{ports: [{port: http, endPort: 80}]}]\n",
         "NetworkPolicy ns1/p: spec.ingress[0].ports[0].endPort: endPort needs a numeric port"),
        ("  ingress: [{ports: [{port: Http}]}]\n",
         r#"NetworkPolicy ns1/p: spec.ingress[0].ports[0].port: invalid port name "Http" (1-15 of a-z, 0-9 and '-', with a letter)"#),
        ("  ingress: [{ports: [{protocol: ICMP, port: 1}]}]\n",
         r#"NetworkPolicy ns1/p: spec.ingress[0].ports[0].protocol: invalid protocol "ICMP" (want TCP, UDP or SCTP)"#),
        ("  ingress: [{ports: [{protocol: tcp}]}]\n",
         r#"NetworkPolicy ns1/p: spec.ingress[0].ports[0].protocol: invalid protocol "tcp" (want TCP, UDP or SCTP)"#),
        ("  policyTypes: [Inbound]\n",
         r#"NetworkPolicy ns1/p: spec.policyTypes[0]: invalid policy type "Inbound" (want Ingress or Egress)"#),
        ("  ingress: [{from: [{}]}]\n",
         "NetworkPolicy ns1/p: spec.ingress[0].from[0]: must specify podSelector, namespaceSelector or ipBlock"),
        ("  ingress: [{from: [{podSelector: {}, ipBlock: {cidr: 10.0.0.0/8}}]}]\n",
         "NetworkPolicy ns1/p: spec.ingress[0].from[0]: ipBlock cannot be combined with podSelector or namespaceSelector"),
        ("  podSelector: {matchExpressions: [{key: app, operator: In}]}\n",
         "NetworkPolicy ns1/p: spec.podSelector.matchExpressions[0].values: operator In requires at least one value"),
    ];
    for (spec, want) in cases {
        let got = validate(&from_yaml(spec)).unwrap_err().to_string();
        assert_eq!(got, want, "{spec}");
    }
}
