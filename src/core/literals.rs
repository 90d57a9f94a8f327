//! Kubernetes literals bouncer reads or writes, in one place, and the wire format of the
//! restartedAt annotation.

use chrono::{DateTime, SecondsFormat, Utc};

/// The pod-template annotation `kubectl rollout restart` writes (not kube-rs's `kube.kubernetes.io/restartedAt`).
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// A time as `kubectl rollout restart` writes restartedAt (RFC3339, whole seconds, `Z`); the
/// report prints every time the same way.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `t` as the API server writes times (startTime, managedFields, restartedAt): whole seconds.
/// bouncer's own clock (marks, to the millisecond) is compared with them through this.
pub fn whole_seconds(t: DateTime<Utc>) -> DateTime<Utc> {
    chrono::SubsecRound::trunc_subsecs(t, 0)
}
/// The pod label the StatefulSet controller sets to the revision a pod was created from.
pub const REVISION_LABEL: &str = "controller-revision-hash";
/// bouncer's own annotations (opt-out, overrides, marks) share this prefix; the chart's admission
/// policy lets bouncer's ServiceAccount change only its marks under it.
pub const ANNOTATION_PREFIX: &str = "bouncer.dev/";
/// Opt-out on a workload or a namespace.
pub const EXCLUDE_ANNOTATION: &str = "bouncer.dev/exclude";
/// Per-workload overrides of its policies' memory threshold and cooldown (metadata annotations).
pub const MEMORY_ABOVE_ANNOTATION: &str = "bouncer.dev/memory-above";
pub const PERCENT_OF_LIMIT_ANNOTATION: &str = "bouncer.dev/memory-percent-of-limit";
pub const COOLDOWN_ANNOTATION: &str = "bouncer.dev/cooldown";
/// bouncer's mark of its last bounce attempts on a workload's metadata (JSON: the latest's time,
/// policy, method, outcome, and a few earlier ones); cooldown, schedule, backoff and breaker
/// honour it whatever the method and outcome.
pub const ATTEMPT_ANNOTATION: &str = "bouncer.dev/last-attempt";
/// Every annotation of a workload's metadata that bouncer reads; the snapshot keeps no other.
pub const WORKLOAD_ANNOTATIONS: [&str; 5] = [
    EXCLUDE_ANNOTATION,
    MEMORY_ABOVE_ANNOTATION,
    PERCENT_OF_LIMIT_ANNOTATION,
    COOLDOWN_ANNOTATION,
    ATTEMPT_ANNOTATION,
];
/// On the run Lease: the marks of bare pods, which must survive the pods they describe.
pub const BARE_ATTEMPTS_ANNOTATION: &str = "bouncer.dev/bare-pod-attempts";
/// Set by the kubelet on mirror pods of static pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// An init container with this restart policy is a native sidecar: it runs beside the containers.
pub const SIDECAR_RESTART_POLICY: &str = "Always";
/// Field manager of bouncer's own writes, so managedFields tell them apart.
pub const FIELD_MANAGER: &str = "bouncer";
/// The Deployment Progressing condition reason that means the rollout failed.
pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
/// Controllers whose template writes are expected after a bounce (not a revert).
pub const BUILTIN_MANAGERS: &[&str] = &[
    "kube-controller-manager",
    "deployment-controller",
    "kube-apiserver",
];
/// Event reasons.
pub const REASON_BOUNCED: &str = "Bounced";
pub const REASON_FAILED: &str = "BounceFailed";
pub const REASON_REVERTED: &str = "BounceReverted";
/// Someone else's restart overtook bouncer's while it waited (Normal).
pub const REASON_SUPERSEDED: &str = "BounceSuperseded";
/// A restart request an interrupted run left on an MCPServer, unanswered past its timeout, that
/// the next run withdrew (Warning).
pub const REASON_REQUEST_WITHDRAWN: &str = "BounceRequestWithdrawn";
/// A due workload the circuit breaker (`spec.breaker`) kept from being bounced (Warning).
pub const REASON_BREAKER_OPEN: &str = "BounceBreakerOpen";
/// A due workload its policy's `blockWhen` held back: a firing alert, or no answer (Warning).
pub const REASON_BLOCKED: &str = "BounceBlocked";
/// A due workload whose restartedAt an applier (Flux, Argo CD, `kubectl apply --server-side`)
/// pins, so a restart would be undone by its next apply (Warning).
pub const REASON_RESTART_PINNED: &str = "BounceRestartPinned";
/// On the run Lease: when each held-back workload was last told by an Event (`core::notice`).
pub const TOLD_ANNOTATION: &str = "bouncer.dev/told";
/// ToolHive's MCPServer (group toolhive.stacklok.dev): its operator restarts the proxy
/// Deployment when the resource's `restarted-at` annotation (RFC3339) is newer than its
/// `last-processed-restart`, and writes the time it did so on the pod template under the same key.
pub const TOOLHIVE_GROUP: &str = "toolhive.stacklok.dev";
pub const MCP_SERVER_KIND: &str = "MCPServer";
pub const MCP_SERVER_RESOURCE: &str = "mcpservers";
pub const TOOLHIVE_RESTARTED_AT: &str = "mcpserver.toolhive.stacklok.dev/restarted-at";
pub const TOOLHIVE_LAST_PROCESSED: &str = "mcpserver.toolhive.stacklok.dev/last-processed-restart";
/// `rolling` (the default) or `immediate`, which deletes every pod of the server at once.
pub const TOOLHIVE_RESTART_STRATEGY: &str = "mcpserver.toolhive.stacklok.dev/restart-strategy";
pub const TOOLHIVE_ROLLING: &str = "rolling";
