//! Domain structs the planner works on, converted once from API objects at the edge.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Kinds of workload bouncer restarts. `Pod` is a bare pod (no controller).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub enum Kind {
    Deployment,
    StatefulSet,
    DaemonSet,
    Pod,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::Deployment,
        Kind::StatefulSet,
        Kind::DaemonSet,
        Kind::Pod,
    ];

    /// The default of `spec.target.kinds`: a bare pod is bounced only when a policy lists `Pod`,
    /// because evicting one that nothing recreates removes it for good.
    pub const CONTROLLERS: [Kind; 3] = [Kind::Deployment, Kind::StatefulSet, Kind::DaemonSet];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Deployment => "Deployment",
            Kind::StatefulSet => "StatefulSet",
            Kind::DaemonSet => "DaemonSet",
            Kind::Pod => "Pod",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a bounce restarts its pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Method {
    /// The restartedAt patch, then the controller's own rolling update.
    Rollout,
    /// Pods evicted one at a time through the Eviction API.
    Evict,
    /// ToolHive's operator asked, through the MCPServer's restart annotation, to roll the proxy
    /// Deployment it owns; bouncer follows and verifies that rollout like its own.
    Toolhive,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkloadRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.kind.as_str().to_lowercase(),
            self.namespace,
            self.name
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UpdateStrategy {
    RollingUpdate,
    /// Deployment strategy: all old pods go before new ones start.
    Recreate,
    /// StatefulSet/DaemonSet: the template change does not replace pods.
    OnDelete,
}

/// A `maxSurge` or `maxUnavailable` as the spec writes it: a count, or a percentage of the
/// replicas that each controller rounds its own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOrPercent {
    Int(i32),
    Percent(i32),
}

/// A rolling update's bounds as the spec sets them; `None` is an absent field, for which
/// the controller's default applies (Deployment 25%/25%, StatefulSet maxUnavailable 1,
/// DaemonSet maxUnavailable 1 and maxSurge 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollingParams {
    pub max_surge: Option<IntOrPercent>,
    pub max_unavailable: Option<IntOrPercent>,
}

/// Rollout-relevant status of a controller, as kubectl's rollout-status rules read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutStatus {
    pub generation: i64,
    pub observed_generation: i64,
    /// spec.replicas (Deployment/StatefulSet) or desiredNumberScheduled (DaemonSet).
    pub desired: i32,
    /// status.replicas (Deployment/StatefulSet) or currentNumberScheduled (DaemonSet).
    pub current: i32,
    pub updated: i32,
    pub ready: i32,
    pub available: i32,
    /// StatefulSet only: `spec.updateStrategy.rollingUpdate`, which kubectl's rule reads.
    pub rolling_update: StsRollingUpdate,
    pub current_revision: Option<String>,
    pub update_revision: Option<String>,
    /// Deployment's Progressing condition has reason ProgressDeadlineExceeded.
    pub progress_deadline_exceeded: bool,
}

/// A StatefulSet's `spec.updateStrategy.rollingUpdate` as kubectl's completion rule tells its
/// cases apart: absent, or present with or without a partition. API defaulting always sets it
/// (partition 0) on a RollingUpdate StatefulSet; `Unset` is what other kinds carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StsRollingUpdate {
    #[default]
    Unset,
    Set {
        partition: Option<i32>,
    },
}

impl StsRollingUpdate {
    /// Ordinals below this keep their pods through a template change (0: none are held).
    pub fn partition(self) -> i32 {
        match self {
            StsRollingUpdate::Set { partition: Some(p) } => p.max(0),
            _ => 0,
        }
    }
}

/// A workload with the pods the inventory grouped under it.
#[derive(Debug, Clone)]
pub struct Workload {
    pub target: WorkloadRef,
    /// The object's own `metadata.uid`. A workload deleted and recreated under its name is
    /// another one: the fresh read before acting must find the UID the plan judged, every
    /// write is conditional on it, and a mark written on the old object is not the new one's.
    pub uid: Option<Uid>,
    /// Labels every pod of the workload gets (the pod template's; a bare pod's own).
    /// Shared with the workloads (and, for a bare pod, the pod) whose template labels are the
    /// same, as most are once only the labels the policies read are kept.
    pub template_labels: Arc<BTreeMap<String, String>>,
    /// The controller's pod selector in `kubectl -l` form: the fresh read before acting lists
    /// its pods with it (a string: one map per workload was a fifth of a large plan's memory).
    pub pod_selector: String,
    /// UIDs of the controllers whose pods are this workload's (their controller
    /// ownerReference): a StatefulSet's or DaemonSet's own, a Deployment's ReplicaSets (those
    /// with pods in the snapshot; every one it controls on the fresh read). Empty for a bare pod,
    /// which is its own. An eviction's replacement is counted only among these controllers'
    /// pods, never among others that happen to match the selector.
    pub pod_owners: Vec<String>,
    /// bouncer's own annotations on the workload's metadata (`bouncer.dev/...`: opt-out,
    /// overrides, attempt mark); no other annotation is kept.
    pub annotations: BTreeMap<String, String>,
    /// bouncer's mark of its last attempt (metadata annotation; for bare pods, from the Lease).
    pub attempt: AttemptMark,
    /// kubectl.kubernetes.io/restartedAt from the pod template, if any and parseable.
    pub restarted_at: Option<DateTime<Utc>>,
    /// A digest of the pod template's spec (never of its metadata, where restarts write): a
    /// different one after bouncer's restart means someone rolled out a new version meanwhile.
    pub template_spec: Option<u64>,
    /// Field managers other than bouncer that own that annotation (managedFields): whether a
    /// restart written there holds (`core::pin`). Boxed and None for most workloads.
    pub restart_owners: Option<Box<RestartOwners>>,
    pub paused: bool,
    pub strategy: UpdateStrategy,
    /// The rolling update's `maxSurge` and `maxUnavailable` as the spec sets them; with
    /// `status.desired` (replicas), the strategy and the partition, what
    /// [`disruption`](crate::core::disruption) reads to tell how many pods a restart takes away.
    pub rolling: RollingParams,
    pub status: RolloutStatus,
    pub pods: Vec<PodSample>,
    /// A bare pod that is a mirror/static pod; never touched.
    pub mirror: bool,
    /// On its way out (its own deletionTimestamp, or its namespace's): never touched.
    pub deleting: Option<Deleting>,
    /// What a restart through ToolHive's MCPServer needs (Deployments an MCPServer owns).
    pub toolhive: ToolhiveRestart,
}

/// What is being deleted under a workload. Either way a bounce can only fail or take pods
/// away for nothing: a controller whose deletion started rolls nothing out (the Deployment
/// controller only syncs its status), and the API server creates no pod in a namespace being
/// deleted, so neither a rollout's new pods nor an evicted pod's replacement would come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleting {
    Workload,
    Namespace,
}

/// A Deployment as ToolHive's operator restarts it: through the MCPServer that owns it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolhiveRestart {
    /// The MCPServer that controls the Deployment (its controller ownerReference). Boxed: few
    /// workloads have one, and a workload is one of thousands.
    pub server: Option<Box<McpServerRef>>,
    /// The pod template's `mcpserver.toolhive.stacklok.dev/restarted-at`: the operator writes
    /// the time it acted on a restart request there.
    pub restarted_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerRef {
    /// As the ownerReference names it, e.g. `toolhive.stacklok.dev/v1beta1`.
    pub api_version: String,
    pub name: String,
    /// The ownerReference's UID: the server it was written for, which a server deleted and
    /// created again under the same name is not.
    pub uid: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PodSample {
    pub name: String,
    pub uid: Uid,
    /// Shared between the pods of one ReplicaSet (or StatefulSet revision) that carry the same
    /// labels, which is most of a large cluster's pods: one map each would be most of the
    /// snapshot's memory.
    pub labels: Arc<BTreeMap<String, String>>,
    /// status.startTime.
    pub started: Option<DateTime<Utc>>,
    pub ready: bool,
    pub deleting: bool,
    /// The containers and native sidecars (init containers with `restartPolicy: Always`): what
    /// runs for the pod's whole life and so counts in its memory.
    pub containers: Vec<ContainerSample>,
    /// The pod-level memory limit (`spec.resources.limits.memory`), where the server serves it.
    pub limit: Option<u64>,
    /// Whether a PodMetrics object was found for this pod.
    pub has_metrics: bool,
}

/// A pod's `metadata.uid`. The API server writes lowercase RFC 4122 UUIDs, kept as their 16
/// bytes (a string each was a tenth of a large snapshot's memory); anything else as its text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Uid {
    Uuid(uuid::Uuid),
    Text(Box<str>),
}

impl From<String> for Uid {
    fn from(text: String) -> Uid {
        // Only the form that prints back the same: the UID is sent back in eviction preconditions.
        let canonical = text.len() == 36 && !text.bytes().any(|b| b.is_ascii_uppercase());
        match uuid::Uuid::try_parse(&text) {
            Ok(u) if canonical => Uid::Uuid(u),
            _ => Uid::Text(text.into_boxed_str()),
        }
    }
}

impl From<&str> for Uid {
    fn from(text: &str) -> Uid {
        Uid::from(text.to_string())
    }
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Uid::Uuid(u) => fmt::Display::fmt(&u.hyphenated(), f),
            Uid::Text(t) => f.write_str(t),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSample {
    /// Shared by the containers of that name (most pods' are called the same few names).
    pub name: Arc<str>,
    /// Working set bytes from metrics.k8s.io; None when the pod has no metrics for it.
    pub usage: Option<u64>,
    pub limit: Option<u64>,
}

/// A pod the selector matched whose owner bouncer does not restart (Job, a custom resource...).
#[derive(Debug, Clone, PartialEq)]
pub struct Unsupported {
    pub namespace: String,
    pub pod: String,
    pub owner_kind: String,
    pub owner_name: String,
    pub labels: BTreeMap<String, String>,
}

/// A PodDisruptionBudget, as the gates read it: which pods it covers and how many of them may
/// go now (its status, computed by the disruption controller from minAvailable/maxUnavailable).
#[derive(Debug, Clone)]
pub struct Pdb {
    pub namespace: String,
    pub name: String,
    pub selector: crate::core::selector::Selector,
    pub disruptions_allowed: i32,
}

/// Whether pod metrics could be read this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsState {
    Available,
    /// metrics.k8s.io is not served or the read failed; memory triggers cannot fire.
    Unavailable(String),
}

/// Everything the planner needs from the cluster, as plain data.
#[derive(Debug, Clone)]
pub struct Inventory {
    pub workloads: Vec<Workload>,
    pub unsupported: Vec<Unsupported>,
    /// Namespaces annotated `bouncer.dev/exclude: "true"`.
    pub excluded_namespaces: std::collections::BTreeSet<String>,
    pub pdbs: Vec<Pdb>,
    pub metrics: MetricsState,
}

/// How far an attempt got. `Started` is written before anything is disrupted, so a run that
/// dies mid-bounce still leaves its mark; a rollout's mark (part of the restart patch) keeps it,
/// an eviction's is updated at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AttemptOutcome {
    Started,
    Bounced,
    RevertedEvicted,
    Reverted,
    Failed,
    Interrupted,
    /// Someone restarted the workload again while bouncer waited on its own restart.
    Superseded,
}

/// One attempt, as stored (JSON in the annotation value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attempt {
    /// When the attempt began (bouncer's clock: only ever compared with bouncer's clock).
    pub time: DateTime<Utc>,
    pub policy: String,
    pub method: Method,
    pub outcome: AttemptOutcome,
    /// The digest of the pod template's spec it was made on: a later attempt on another one
    /// is on a new version, for which the backoff and the breaker start over. None for bare
    /// pods and in marks written before it was kept.
    pub template: Option<u64>,
}

/// An attempt older than the latest, as the mark keeps it: what the backoff and the circuit
/// breaker read (when, and how it ended), not which policy or method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PastAttempt {
    pub time: DateTime<Utc>,
    pub outcome: AttemptOutcome,
}

/// bouncer's last attempts on one workload: the latest in full, and a few earlier ones, newest
/// first. Bounded: at most `mark::MAX_ATTEMPTS` in all, none kept past `mark::RETENTION`
/// before the latest. Built only by decoding a mark or by `record`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttemptHistory {
    pub(crate) latest: Option<Attempt>,
    pub(crate) earlier: Vec<PastAttempt>,
}

/// What the snapshot found about a workload's last attempts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AttemptMark {
    #[default]
    None,
    /// Boxed: most workloads have no mark, and a workload is one of thousands.
    Seen(Box<AttemptHistory>),
    /// The mark is there but unreadable (hand-edited, or the Lease could not be read): the
    /// planner fails closed and skips, naming the annotation.
    Unreadable(String),
}

#[cfg(test)]
mod tests {
    use super::Uid;

    #[test]
    fn a_uid_prints_back_exactly_as_the_api_server_wrote_it() {
        let served = "0b6f1c2e-5d4a-4e8b-9c3d-7f2a1b0c9d8e";
        let uid = Uid::from(served);
        assert!(matches!(uid, Uid::Uuid(_)), "{uid:?}");
        assert_eq!(uid.to_string(), served);
        // Forms that would print back differently, or are no UUID at all, stay text.
        for text in [
            "0B6F1C2E-5D4A-4E8B-9C3D-7F2A1B0C9D8E",
            "0b6f1c2e5d4a4e8b9c3d7f2a1b0c9d8e",
            "{0b6f1c2e-5d4a-4e8b-9c3d-7f2a1b0c9d8e}",
            "uid-web-1",
            "",
        ] {
            let uid = Uid::from(text);
            assert!(matches!(uid, Uid::Text(_)), "{text}: {uid:?}");
            assert_eq!(uid.to_string(), text);
        }
        assert_ne!(
            Uid::from(served),
            Uid::from("0b6f1c2e-5d4a-4e8b-9c3d-7f2a1b0c9d8f")
        );
    }
}

/// A field manager other than bouncer that owns the pod template's restartedAt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartOwner {
    pub manager: String,
    /// The owner applies (server-side apply): it writes its value back on its next apply.
    pub apply: bool,
}

/// Who else owns the pod template's restartedAt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestartOwners {
    pub owners: Vec<RestartOwner>,
    /// `namespace/name` of the Kustomization that applies the workload, from Flux's labels.
    pub kustomization: Option<String>,
}
