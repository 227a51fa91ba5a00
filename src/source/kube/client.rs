//! The API client: `--kubeconfig` when given, else kube's inference (in-cluster service
//! account, then `$KUBECONFIG` / `~/.kube/config`), at `--api-server` when given (a node
//! without kube-proxy cannot reach the in-cluster `kubernetes` ClusterIP before the agent has
//! programmed it), with timeouts so that no request waits on a silently stalled connection
//! for longer than a watch may stay quiet.
//!
//! kube's defaults wait forever for a response (no read timeout) and 30 s for a connection;
//! a request sent on a pooled connection that went dead (packets dropped, no RST) would then
//! hang until the kernel gives up retransmitting (~15 minutes). What we set:
//! - read timeout [`Liveness::idle`] (the watch timeout plus 5 s), counted from when the
//!   request was written (`reset_reader_on_write`), not from when the pooled connection last
//!   carried data: a response, page or watch that brings no byte for that long fails and is
//!   retried on a new connection; a healthy watch is never that quiet (it ends at its
//!   `timeoutSeconds`);
//! - write timeout the same, connect timeout 10 s (a SYN into a black hole).
//!
//! Not set: TCP keepalive / `TCP_USER_TIMEOUT` (kube 5 builds its connector internally; the
//! read timeout covers the same partitions at the HTTP level) and HTTP/2 pings (kube's TLS
//! connector speaks HTTP/1.1 only).

use std::path::Path;
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::{KubeError, Liveness};

/// A SYN that gets no answer for this long went into a black hole.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn client(
    kubeconfig: Option<&Path>,
    api_server: Option<&hyper::Uri>,
    liveness: Liveness,
) -> Result<Client, KubeError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|e| KubeError::Config {
                what: path.display().to_string(),
                reason: e.to_string(),
            })?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| KubeError::Config {
                    what: path.display().to_string(),
                    reason: e.to_string(),
                })?
        }
        None => kube::Config::infer().await.map_err(|e| KubeError::Config {
            what: "in-cluster config or ~/.kube/config".into(),
            reason: e.to_string(),
        })?,
    };
    if let Some(url) = api_server {
        config.cluster_url = url.clone();
    }
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(liveness.idle());
    config.reset_reader_on_write = true;
    config.write_timeout = Some(liveness.idle());
    Client::try_from(config).map_err(|e| KubeError::Client(e.to_string()))
}
