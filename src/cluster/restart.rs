//! The restart: kubectl's restartedAt patch of the pod template (this is where the annotation
//! is written), and the patch of bouncer's attempt mark alone.

use chrono::{DateTime, Utc};
use kube::Client;
use serde_json::json;

use super::error::ClusterError;
use super::kinds;
use super::retry::with_retries;
use crate::core::literals::{ATTEMPT_ANNOTATION, RESTARTED_AT, rfc3339};
use crate::core::mark::AttemptHistory;
use crate::core::model::{Uid, Workload, WorkloadRef};

/// What a restart patch wrote and what the server returned.
pub struct Patched {
    /// The restartedAt value written.
    pub value: String,
    /// The workload as the patch left it, and its resourceVersion (where the rollout wait starts).
    pub workload: Workload,
    pub resource_version: String,
}

/// Writes exactly what `kubectl rollout restart` writes: a strategic-merge patch of the pod
/// template's restartedAt annotation (RFC3339, seconds). The same patch writes bouncer's
/// attempt mark on the workload's metadata, so no restart can happen without its mark: the
/// history the core recorded the attempt in (`AttemptMark::recorded`), written whole.
pub async fn patch_restarted_at(
    client: &Client,
    target: &WorkloadRef,
    uid: Option<&Uid>,
    at: DateTime<Utc>,
    mark: &AttemptHistory,
) -> Result<Patched, ClusterError> {
    let value = rfc3339(at);
    let body = json!({
        "metadata": metadata(uid, mark),
        "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: value}}}},
    });
    let (workload, resource_version) = patch(client, target, &body).await?;
    Ok(Patched {
        value,
        workload,
        resource_version,
    })
}

/// Writes only the attempt mark (metadata, so nothing rolls): the history as the core recorded
/// it. Returns the workload as the patch left it, and its resourceVersion (where a wait for an
/// owner's rollout starts).
pub async fn patch_mark(
    client: &Client,
    target: &WorkloadRef,
    uid: Option<&Uid>,
    mark: &AttemptHistory,
) -> Result<(Workload, String), ClusterError> {
    let body = json!({"metadata": metadata(uid, mark)});
    patch(client, target, &body).await
}

/// The mark, and the UID the write is for: a patch naming `metadata.uid` is refused by the
/// API server when the object under that name has another (a UID cannot change), so a
/// workload deleted and recreated since the fresh read is never restarted or marked.
fn metadata(uid: Option<&Uid>, mark: &AttemptHistory) -> serde_json::Value {
    let mut meta = json!({"annotations": {ATTEMPT_ANNOTATION: mark.encode()}});
    if let Some(uid) = uid {
        meta["uid"] = json!(uid.to_string());
    }
    meta
}

/// One strategic-merge patch of a controller as bouncer's field manager, with retries.
async fn patch(
    client: &Client,
    target: &WorkloadRef,
    body: &serde_json::Value,
) -> Result<(Workload, String), ClusterError> {
    with_retries(&format!("patch {target}"), || {
        kinds::patch(client, target, body)
    })
    .await
    .map_err(|source| ClusterError::Patch {
        target: target.clone(),
        source,
    })
}
