//! The API client: `--kubeconfig` when given, else kube's inference (in-cluster service
//! account, then `$KUBECONFIG` / `~/.kube/config`).

use std::path::Path;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::KubeError;

pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeError> {
    let config = match kubeconfig {
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
    Client::try_from(config).map_err(|e| KubeError::Client(e.to_string()))
}
