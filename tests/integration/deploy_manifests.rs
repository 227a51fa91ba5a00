//! The packaging files agree with each other and with the agent: the deploy/ manifests parse
//! as Kubernetes objects and reference each other consistently, the DaemonSet and the systemd
//! unit grant only NET_ADMIN + NET_RAW, and both example configs are accepted by the agent.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, PodSpec, ServiceAccount, Volume};
use nodeplane::cli::Opts;
use nodeplane::config::Config;
use serde::de::DeserializeOwned;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn load<T: DeserializeOwned>(file: &str) -> T {
    let text = std::fs::read_to_string(repo(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn resolve(config_file: &Path) -> Config {
    let opts = Opts {
        config: Some(config_file.to_path_buf()),
        node_name: Some("n1".into()),
        ..Default::default()
    };
    Config::resolve(&opts).unwrap_or_else(|e| panic!("{}: {e}", config_file.display()))
}

#[test]
fn kustomization_lists_every_manifest() {
    let k: serde_json::Value = load("deploy/kustomization.yaml");
    let listed: BTreeSet<String> = k["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(repo("deploy"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, on_disk);
    assert_eq!(k["namespace"], "nodeplane");
}

#[test]
fn daemonset_is_host_network_with_only_the_sandbox_capabilities() {
    let ds: DaemonSet = load("deploy/daemonset.yaml");
    let sa: ServiceAccount = load("deploy/serviceaccount.yaml");
    let cm: ConfigMap = load("deploy/configmap.yaml");
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.service_account_name, sa.metadata.name);
    let tolerate_all = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerate_all
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none())
    );

    let c = &pod.containers[0];
    let caps = c.security_context.clone().unwrap().capabilities.unwrap();
    // Exactly what the kernel tests' sandbox grants (`lab::sandbox`) and what the agent
    // checks for at start (`host::ALL`).
    let sandbox = nodeplane::testing::lab::sandbox::CAPABILITIES;
    assert_eq!(caps.add.unwrap(), sandbox);
    let used: Vec<&str> = nodeplane::host::ALL
        .iter()
        .map(|c| c.name.trim_start_matches("CAP_"))
        .collect();
    assert_eq!(used, sandbox);
    assert_eq!(caps.drop.unwrap(), ["ALL"]);
    assert!(c.resources.clone().unwrap().requests.is_some());
    let env = c.env.clone().unwrap();
    let node_name = env
        .iter()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME");
    let field = node_name
        .value_from
        .clone()
        .unwrap()
        .field_ref
        .unwrap()
        .field_path;
    assert_eq!(field, "spec.nodeName");

    // --config points into the mounted ConfigMap.
    let args = c.args.clone().unwrap();
    let config = args[args.iter().position(|a| a == "--config").unwrap() + 1].clone();
    let mount = &c.volume_mounts.clone().unwrap()[0];
    assert_eq!(
        Path::new(&config).parent().unwrap(),
        Path::new(&mount.mount_path)
    );
    let volume = volume(&pod, &mount.name);
    assert_eq!(
        volume.config_map.as_ref().unwrap().name,
        cm.metadata.name.clone().unwrap()
    );
    let file_name = Path::new(&config).file_name().unwrap().to_str().unwrap();
    assert!(cm.data.unwrap().contains_key(file_name));
}

#[test]
fn daemonset_keeps_the_state_directory_on_the_node() {
    let ds: DaemonSet = load("deploy/daemonset.yaml");
    let cm: ConfigMap = load("deploy/configmap.yaml");
    let pod = ds.spec.unwrap().template.spec.unwrap();
    let c = &pod.containers[0];
    // The state directory the agent uses with this config file and these arguments.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, &cm.data.unwrap()["config.yaml"]).unwrap();
    let args = c.args.clone().unwrap();
    let flag = args.iter().position(|a| a == "--state-dir");
    let state_dir = match flag {
        Some(i) => PathBuf::from(&args[i + 1]),
        None => resolve(&path).state_dir,
    };
    assert_eq!(state_dir, Path::new("/var/lib/nodeplane"));
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| Path::new(&m.mount_path) == state_dir)
        .expect("the state directory is mounted");
    assert_ne!(mount.read_only, Some(true), "the agent writes it");
    let volume = volume(&pod, &mount.name);
    let host = volume
        .host_path
        .as_ref()
        .expect("a hostPath: it outlives the pod");
    assert_eq!(Path::new(&host.path), state_dir);
    assert_eq!(host.type_.as_deref(), Some("DirectoryOrCreate"));
}

#[test]
fn daemonset_probes_the_admin_server() {
    let ds: DaemonSet = load("deploy/daemonset.yaml");
    let c = ds.spec.unwrap().template.spec.unwrap().containers[0].clone();
    let default_admin: std::net::SocketAddr =
        nodeplane::config::DEFAULT_ADMIN_ADDRESS.parse().unwrap();
    for (probe, path) in [
        (c.liveness_probe, "/healthz"),
        (c.readiness_probe, "/readyz"),
    ] {
        let get = probe.expect("probe").http_get.expect("httpGet");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.host.as_deref(), Some("127.0.0.1"));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
                default_admin.port().into()
            )
        );
    }
}

#[test]
fn example_configs_are_accepted_by_the_agent() {
    let c = resolve(&repo("systemd/config.example.yaml"));
    assert_eq!(c.cluster_cidrs, ["10.128.0.0/14".parse().unwrap()]);
    assert_eq!(c.service_cidrs, ["172.30.0.0/16".parse().unwrap()]);
    assert!(c.manifests.is_some());

    let cm: ConfigMap = load("deploy/configmap.yaml");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, &cm.data.unwrap()["config.yaml"]).unwrap();
    let c = resolve(&path);
    assert_eq!(c.manifests, None, "the DaemonSet reads the Kubernetes API");
    assert!(c.egress_ip_assigner);
    assert_eq!(
        c.leader_elect,
        nodeplane::controller::lease::Timings::DEFAULT
    );
}

/// The kube-proxy-free component patches the agent container with an `--api-server` that the
/// agent accepts.
#[test]
fn kube_proxy_free_component_sets_an_api_server_the_agent_accepts() {
    let k: serde_json::Value = load("deploy/components/kube-proxy-free/kustomization.yaml");
    assert_eq!(k["kind"], "Component");
    let patch = k["patches"][0]["path"].as_str().expect("patch path");
    // A strategic-merge patch: a partial DaemonSet.
    let ds: serde_json::Value = load(&format!("deploy/components/kube-proxy-free/{patch}"));
    assert_eq!(ds["metadata"]["name"], "nodeplane-agent");
    let agent = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(agent["name"], "agent");
    let url = agent["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "NODEPLANE_API_SERVER")
        .and_then(|e| e["value"].as_str())
        .expect("NODEPLANE_API_SERVER");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, format!("node-name: n\napi-server: {url}\n")).unwrap();
    let c = resolve(&path);
    assert_eq!(c.api_server.unwrap().to_string(), format!("{url}/"));
}

#[test]
fn systemd_unit_keeps_only_the_sandbox_capabilities() {
    let unit = std::fs::read_to_string(repo("systemd/nodeplane-agent.service")).unwrap();
    let value = |key: &str| {
        let prefix = format!("{key}=");
        let line = unit.lines().find(|l| l.starts_with(&prefix));
        line.unwrap_or_else(|| panic!("{key} missing"))
            .trim_start_matches(&prefix)
    };
    let caps: Vec<String> = nodeplane::testing::lab::sandbox::CAPABILITIES
        .iter()
        .map(|c| format!("CAP_{c}"))
        .collect();
    assert_eq!(value("CapabilityBoundingSet"), caps.join(" "));
    assert_eq!(value("AmbientCapabilities"), caps.join(" "));
    assert_eq!(value("ProtectKernelTunables"), "yes");
    assert_eq!(value("NoNewPrivileges"), "yes");
    assert_eq!(value("ProtectSystem"), "strict");
    assert_eq!(value("Restart"), "on-failure");
    assert_eq!(
        value("ExecStart"),
        "/usr/local/bin/agent --config /etc/nodeplane/config.yaml --state-dir ${STATE_DIRECTORY}"
    );
    // The only writable place under ProtectSystem=strict: the last valid objects.
    assert_eq!(value("StateDirectory"), "nodeplane");
    assert_eq!(value("StateDirectoryMode"), "0700");
    let stop_post = unit.lines().any(|l| l.starts_with("ExecStopPost="));
    assert!(!stop_post, "rules stay on stop by design");
}

/// The pod's volume `name` (a container's mount of it names it).
fn volume<'a>(pod: &'a PodSpec, name: &str) -> &'a Volume {
    let mut volumes = pod.volumes.iter().flatten();
    let found = volumes.find(|v| v.name == name);
    found.unwrap_or_else(|| panic!("no volume {name}"))
}
