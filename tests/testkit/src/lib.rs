//! Test support for bouncer: the shared local cluster, per-test namespaces, metrics-server reads,
//! fixture controllers that behave like real operators, and workload builders.
//!
//! The pieces, and why they exist:
//!
//! - [`cluster()`], [`client()`], [`kubectl()`], [`TestNs`]: the control plane starts once per test
//!   process (`scripts/cluster up`, or `BOUNCER_TEST_KUBECONFIG`), every test gets its own client
//!   and its own namespace, which is dumped to `target/test-dumps/` when the test panics.
//! - [`metrics`]: pod memory as the real metrics-server reports it. The cluster's KWOK nodes
//!   report each pod's memory from a model set by its annotations ([`MEMORY_BASE`],
//!   [`MEMORY_LEAK_PER_MINUTE`], [`MEMORY_CONTAINER`]), so a leak and its reset by a restart are
//!   visible to bouncer exactly as on a real cluster; [`model_usage`] predicts the values.
//! - [`BarePodApp`]: an app that recreates bare pods by name (mcpd), which only eviction bounces.
//! - [`workloads`]: builders for small, schedulable workloads and ToolHive-shaped ones.
//! - [`rollout`]: kubectl's rollout-completion rules and watch-based waits for assertions.
//! - [`toolhive`]: the real ToolHive operator (pinned releases, one process per test namespace)
//!   and the resources it reconciles: the operator that reverts restartedAt (v0.44.0) and the
//!   one that keeps it (v0.45.0).
//! - [`flux`]: the real Flux controllers (source-controller and kustomize-controller, pinned),
//!   one pair per test, applying from a Git repository served on loopback by git's smart HTTP
//!   ([`git`]).
//! - [`monitoring`]: what a run notifies at its end, received for real: [`Receiver`] (an HTTP
//!   server recording webhook requests, answering 200, 500 or never), and Debian's
//!   [`Pushgateway`] and [`Prometheus`], one per test on free loopback ports, killed with it.
//!
//! Setup helpers (`cluster`, `client`, `TestNs::new`) panic with a clear message, because a test
//! cannot do anything useful without them; operations return `anyhow::Result`.
//!
//! Tests should fail by panicking (`expect`, `assert!`), not by returning `Err`: [`TestNs`] dumps
//! its namespace only when it is dropped during a panic.
//!
//! A typical integration test (in `tests/it/<area>.rs`):
//!
//! ```no_run
//! use std::time::Duration;
//! use bouncer_testkit::{Kind, PodTemplateExt, TestNs, client, create, deployment};
//! use bouncer_testkit::{rollout_restart_patch, wait_pod_memory, wait_pods_ready, wait_rollout_complete};
//!
//! # async fn example() {
//! let client = client().await; // starts or reuses the cluster
//! let ns = TestNs::new(&client, "example").await; // declared first, so dropped last
//! let web = deployment("web", 2, &[("app", "web")]).with_memory("64Mi", "30Mi");
//! create(&client, ns.name(), &web).await.unwrap();
//! let wait = Duration::from_secs(180);
//! wait_rollout_complete(&client, Kind::Deployment, ns.name(), "web", wait).await.unwrap();
//! let pods = wait_pods_ready(&client, ns.name(), "app=web", 2, wait).await.unwrap();
//! let name = pods[0].metadata.name.as_deref().unwrap();
//! let memory = wait_pod_memory(&client, ns.name(), name, wait, |m| m.is_some()).await.unwrap();
//! rollout_restart_patch(&client, Kind::Deployment, ns.name(), "web").await.unwrap();
//! wait_rollout_complete(&client, Kind::Deployment, ns.name(), "web", wait).await.unwrap();
//! # let _ = memory;
//! # }
//! ```

pub mod cluster;
mod crd_gate;
pub mod fixtures;
pub mod flux;
pub mod git;
pub mod metrics;
pub mod monitoring;
pub mod rollout;
pub mod toolhive;
pub mod workloads;

pub use cluster::{Cluster, TestNs, client, cluster, kubectl, repo_root};
pub use fixtures::BarePodApp;
pub use flux::{FLUX_MANAGER, FLUX_VERSION, Flux, Reconciled};
pub use metrics::{PodMemory, model_usage, parse_quantity, pod_memory, wait_pod_memory};
pub use monitoring::{Answer, Prometheus, Pushgateway, Received, Receiver, Sample};
pub use rollout::{
    Kind, rollout_restart_patch, wait_pod_replaced, wait_pods_ready, wait_rollout_complete,
};
pub use toolhive::{TOOLHIVE_FIXED, TOOLHIVE_REVERTING, ToolHiveOperator};
pub use workloads::{
    McpServer, PodTemplateExt, create, daemonset, deployment, mcp_server, pod_template,
    statefulset, virtual_mcp_server,
};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::task::JoinHandle;

/// Pod annotation: memory the model starts from (a quantity, default 16Mi). The model itself is
/// KWOK's usage expression in `tests/cluster/kwok.yaml`; these names must match it.
pub const MEMORY_BASE: &str = "bouncer.dev/test-memory-base";
/// Pod annotation: memory added per minute of pod age (a quantity, default 0).
pub const MEMORY_LEAK_PER_MINUTE: &str = "bouncer.dev/test-memory-leak-per-minute";
/// Pod annotation: the container the model applies to (default the first); others report 4Mi.
pub const MEMORY_CONTAINER: &str = "bouncer.dev/test-memory-container";
/// The annotation `kubectl rollout restart` writes into the pod template.
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";
/// bouncer's attempt mark, on the workload's metadata.
pub const ATTEMPT_MARK: &str = "bouncer.dev/last-attempt";
/// Label on every test namespace, so leftovers are easy to find and delete in bulk.
pub const TEST_NAMESPACE_LABEL: &str = "bouncer.dev/test";

/// A background tokio task that is aborted when the handle is dropped, so a fixture never
/// outlives the test (or the demo command) that started it.
#[derive(Debug)]
pub struct BackgroundTask {
    handle: JoinHandle<()>,
    actions: Arc<AtomicUsize>,
}

impl BackgroundTask {
    pub(crate) fn spawn<F>(actions: Arc<AtomicUsize>, fut: F) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        Self {
            handle: tokio::spawn(fut),
            actions,
        }
    }

    /// How many corrective writes the task made (reverts, recreated pods).
    /// Lets a test prove the fixture acted instead of only observing the end state.
    pub fn actions(&self) -> usize {
        self.actions.load(Ordering::SeqCst)
    }

    /// True while the task runs; a fixture task only ends early when it hit a fatal error.
    pub fn is_running(&self) -> bool {
        !self.handle.is_finished()
    }
}

impl Drop for BackgroundTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

pub(crate) fn count(actions: &AtomicUsize) {
    actions.fetch_add(1, Ordering::SeqCst);
}

/// `k=v,k2=v2` label selector for a label map, as kubectl -l takes it.
pub fn selector_string<'a>(labels: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    labels
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// True for the kube error the API server returns when the object already exists.
pub(crate) fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 409)
}

/// True for the kube error the API server returns when the object does not exist.
pub(crate) fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 404)
}
