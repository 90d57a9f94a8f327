//! The cluster edge: everything that talks to the Kubernetes API server. It reads answers in
//! slim wire forms, converts them once into the core's types, and writes only what the shell asks
//! for: the restart patch, evictions, the Lease, Events.

pub mod convert;
pub mod error;
pub mod events;
pub mod evict;
pub mod gitops;
pub mod kinds;
pub mod list;
pub mod lock;
pub mod prometheus;
pub mod restart;
pub mod retry;
pub mod revert;
pub mod shared;
pub mod snapshot;
pub mod toolhive;
pub mod watch;
pub mod wire;

use kube::Client;

use error::ClusterError;

/// Names bouncer in the API server's audit log, so its requests can be counted.
pub const USER_AGENT: &str = concat!("bouncer/", env!("CARGO_PKG_VERSION"));

/// The clients of one run.
pub struct Clients {
    /// For everything but metrics.
    pub api: Client,
    /// For metrics.k8s.io, without kube's retries: metrics are optional, and kube retries a 503
    /// (metrics-server down) for minutes before it answers.
    pub metrics: Client,
    /// For the snapshot's LISTs, on connections of their own (as `api`'s otherwise): reading a
    /// large LIST grows a connection's read buffer to a few hundred KiB, which it keeps while
    /// it idles in the pool; dropped after the snapshot, these connections close.
    pub lists: Client,
}

/// Connects from the kubeconfig file `kubeconfig` (None: KUBECONFIG or ~/.kube/config) and its
/// `context` (None: the current one); with neither, as kubectl: a kubeconfig, else in-cluster.
pub async fn connect(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> Result<Clients, ClusterError> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config_error = |e: &dyn std::fmt::Display| ClusterError::Config(e.to_string());
    let mut config = match (kubeconfig, context) {
        (Some(path), _) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                ClusterError::Config(format!("cannot read kubeconfig {}: {e}", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| config_error(&e))?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| config_error(&e))?,
        (None, None) => kube::Config::infer().await.map_err(|e| config_error(&e))?,
    };
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    let mut once = config.clone();
    once.default_retry = false;
    Ok(Clients {
        lists: Client::try_from(config.clone()).map_err(ClusterError::Connect)?,
        api: Client::try_from(config).map_err(ClusterError::Connect)?,
        metrics: Client::try_from(once).map_err(ClusterError::Connect)?,
    })
}
