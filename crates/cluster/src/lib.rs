//! Thaw on a cluster.
//!
//! - [`placement`]: which node runs an invocation (consistent hashing with bounded
//!   loads, snapshot-aware), used by the gateway and by the simulator alike;
//! - [`ring`], [`hash`]: the deterministic consistent-hashing ring under it;
//! - [`sim`]: `thaw sim`, trace-driven simulation of 10..1,000 nodes;
//! - [`agent`]: `thaw serve --cluster`: the node's advertisement (its ThawNode), published;
//! - [`follow`]: `thaw serve --cluster`: the functions of the registry (ThawFunctions), deployed;
//! - [`registry`]: the function registry (ThawFunctions + bundles in the store), shared by agents and gateways;
//! - [`layers`]: the cluster's Lambda layers (ThawLayers + zips in the store), which registry functions name;
//! - [`events`]: asynchronous invocations through the gateways, queued in the store, run at least once;
//! - [`view`]: advertisements (ThawNode objects) watched from the apiserver, as placement inputs;
//! - [`gateway`]: `thaw gateway`: the Lambda API of the cluster, SigV4, calls placed and forwarded to agents;
//! - [`metrics`]: the gateway's Prometheus metrics;
//! - [`controlplane`]: a real etcd + kube-apiserver on 127.0.0.1 for tests.
#![forbid(unsafe_code)]

pub mod agent;
pub mod cli;
pub mod controlplane;
pub mod events;
pub mod follow;
pub mod gateway;
pub mod hash;
pub mod layers;
pub mod metrics;
pub mod placement;
pub mod registry;
pub mod ring;
pub mod sim;
pub mod view;

mod chart;

/// UTC now as the apiserver's date-time (RFC 3339, seconds).
pub(crate) fn now_rfc3339() -> String {
    k8s_openapi::chrono::Utc::now().to_rfc3339_opts(k8s_openapi::chrono::SecondsFormat::Secs, true)
}

/// Select rustls's ring provider for every kube client of the process. The workspace
/// also links rustls with aws-lc-rs (object_store in thaw-store), and with two
/// providers compiled in rustls cannot pick one by itself (it panics).
pub(crate) fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    #[error("kubeconfig {path}")]
    Kubeconfig {
        path: std::path::PathBuf,
        #[source]
        source: Box<kube::config::KubeconfigError>,
    },
    #[error("connecting to the Kubernetes API")]
    Kube(#[source] Box<kube::Error>),
}

/// A Kubernetes client from `kubeconfig`, or the default one (the pod's service
/// account in a cluster, else $KUBECONFIG or ~/.kube/config).
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, KubeClientError> {
    install_tls_provider();
    match kubeconfig {
        Some(path) => {
            let kerr = |source| KubeClientError::Kubeconfig { path: path.to_path_buf(), source: Box::new(source) };
            let opts = kube::config::KubeConfigOptions::default();
            let cfg = kube::Config::from_custom_kubeconfig(kube::config::Kubeconfig::read_from(path).map_err(kerr)?, &opts).await.map_err(kerr)?;
            kube::Client::try_from(cfg).map_err(|e| KubeClientError::Kube(Box::new(e)))
        }
        None => kube::Client::try_default().await.map_err(|e| KubeClientError::Kube(Box::new(e))),
    }
}
