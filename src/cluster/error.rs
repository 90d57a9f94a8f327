//! Errors at the cluster boundary, each naming the action and the object.

use crate::core::model::WorkloadRef;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("failed to load the kubeconfig: {0}")]
    Config(String),
    #[error("failed to reach the API server: {0}")]
    Connect(#[source] kube::Error),
    #[error("failed to list {what}: {source}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("failed to patch {target}: {source}")]
    Patch {
        target: WorkloadRef,
        #[source]
        source: kube::Error,
    },
    #[error("failed to evict pod {namespace}/{pod}: {source}")]
    Evict {
        namespace: String,
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to read {target}: {source}")]
    Read {
        target: WorkloadRef,
        #[source]
        source: kube::Error,
    },
    #[error("failed to take the lease {namespace}/{name}: {source}")]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl ClusterError {
    /// 401/403: the identity lacks a permission; retrying will not help.
    pub fn is_forbidden(&self) -> bool {
        let source = match self {
            ClusterError::Connect(e) => e,
            ClusterError::List { source, .. }
            | ClusterError::Patch { source, .. }
            | ClusterError::Evict { source, .. }
            | ClusterError::Read { source, .. }
            | ClusterError::Lease { source, .. } => source,
            ClusterError::Config(_) => return false,
        };
        matches!(source, kube::Error::Api(s) if s.code == 401 || s.code == 403)
    }
}
