//! Rollout completion by kubectl's rules (`kubectl rollout status`), and the watch that waits for it.

use std::fmt::Debug;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use kube::api::{WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::convert;
use crate::model::{Kind, RolloutStatus, StsRollingUpdate, UpdateStrategy, Workload, WorkloadRef};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutState {
    Complete,
    /// Still rolling; the text is kubectl's progress message.
    InProgress(String),
    /// Will not complete by itself (ProgressDeadlineExceeded).
    Failed(String),
}

/// kubectl's per-kind rules (pkg/polymorphichelpers/rollout_status.go). Bare pods have no rollout.
pub fn state(kind: Kind, strategy: UpdateStrategy, s: &RolloutStatus) -> RolloutState {
    use RolloutState::*;
    match kind {
        Kind::Deployment => {
            if s.generation > s.observed_generation {
                return InProgress("waiting for the deployment spec update to be observed".into());
            }
            if s.progress_deadline_exceeded {
                return Failed("exceeded its progress deadline".into());
            }
            if s.updated < s.desired {
                return InProgress(format!(
                    "{} of {} new replicas updated",
                    s.updated, s.desired
                ));
            }
            if s.current > s.updated {
                return InProgress(format!(
                    "{} old replicas pending termination",
                    s.current - s.updated
                ));
            }
            if s.available < s.updated {
                return InProgress(format!(
                    "{} of {} updated replicas available",
                    s.available, s.updated
                ));
            }
            Complete
        }
        Kind::DaemonSet => {
            if s.generation > s.observed_generation {
                return InProgress("waiting for the daemon set spec update to be observed".into());
            }
            if strategy == UpdateStrategy::OnDelete {
                return Complete;
            }
            if s.updated < s.desired {
                return InProgress(format!("{} of {} new pods updated", s.updated, s.desired));
            }
            if s.available < s.desired {
                return InProgress(format!(
                    "{} of {} updated pods available",
                    s.available, s.desired
                ));
            }
            Complete
        }
        Kind::StatefulSet => {
            if s.observed_generation == 0 || s.generation > s.observed_generation {
                return InProgress("waiting for the statefulset spec update to be observed".into());
            }
            if s.ready < s.desired {
                return InProgress(format!("{} of {} pods ready", s.ready, s.desired));
            }
            if strategy == UpdateStrategy::OnDelete {
                return Complete;
            }
            // kubectl (StatefulSetStatusViewer): with rollingUpdate set, which API defaulting
            // always does, the partition count decides and the revisions are never compared;
            // `spec.replicas` is always set on a served object (defaulted to 1).
            match s.rolling_update {
                StsRollingUpdate::Set {
                    partition: Some(partition),
                } => {
                    let wanted = s.desired - partition;
                    if s.updated < wanted {
                        return InProgress(format!(
                            "partitioned roll out: {} of {} new pods updated",
                            s.updated, wanted
                        ));
                    }
                    Complete
                }
                StsRollingUpdate::Set { partition: None } => Complete,
                StsRollingUpdate::Unset if s.update_revision != s.current_revision => InProgress(
                    format!("{} of {} pods at the new revision", s.updated, s.desired),
                ),
                StsRollingUpdate::Unset => Complete,
            }
        }
        Kind::Pod => Complete,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("rollout of {target} did not complete within {}: {last}", humantime::format_duration(*timeout))]
    Timeout {
        target: WorkloadRef,
        timeout: Duration,
        last: String,
    },
    #[error("rollout of {target} failed: {reason}")]
    Failed { target: WorkloadRef, reason: String },
    #[error("{target} was deleted during the rollout")]
    Deleted { target: WorkloadRef },
    #[error("rollout of {target}: {source}")]
    Convert {
        target: WorkloadRef,
        source: Box<crate::convert::wire::RereadError>,
    },
    #[error("interrupted while waiting for the rollout of {target}")]
    Interrupted { target: WorkloadRef },
}

/// Where the wait starts: the object bouncer's patch returned.
pub struct Start<'a> {
    pub workload: &'a Workload,
    pub resource_version: &'a str,
}

/// Waits until the rollout completes by kubectl's rules. Normally a single WATCH from the patch's
/// resourceVersion covers the whole rollout; if it breaks (API server restart, expired version)
/// the watcher takes over, re-listing and resuming with backoff, so a blip does not lose the wait.
pub async fn wait(
    client: &Client,
    target: &WorkloadRef,
    timeout: Duration,
    start: Start<'_>,
) -> Result<(), WaitError> {
    match target.kind {
        Kind::Deployment => {
            watch::<Deployment>(client, target, timeout, start, convert::deployment).await
        }
        Kind::StatefulSet => {
            watch::<StatefulSet>(client, target, timeout, start, convert::statefulset).await
        }
        Kind::DaemonSet => {
            watch::<DaemonSet>(client, target, timeout, start, convert::daemonset).await
        }
        Kind::Pod => Ok(()),
    }
}

/// Converts a watched object at the edge.
type ToWorkload<K> = fn(&K) -> Result<Workload, crate::convert::wire::RereadError>;

/// Follows one workload's rollout; `last` keeps kubectl's latest progress message.
struct Progress<'a> {
    target: &'a WorkloadRef,
    last: String,
}

impl Progress<'_> {
    /// `Some` once the rollout has completed or failed.
    fn observe(&mut self, w: &Workload) -> Option<Result<(), WaitError>> {
        match state(self.target.kind, w.strategy, &w.status) {
            RolloutState::Complete => Some(Ok(())),
            RolloutState::Failed(reason) => Some(Err(WaitError::Failed {
                target: self.target.clone(),
                reason,
            })),
            RolloutState::InProgress(detail) => {
                if detail != self.last {
                    tracing::info!(target: "bouncer::rollout", workload = %self.target, "{detail}");
                    self.last = detail;
                }
                None
            }
        }
    }

    /// A watched object: one that does not convert fails the wait (closed, naming it).
    fn observe_obj(
        &mut self,
        w: Result<Workload, crate::convert::wire::RereadError>,
    ) -> Option<Result<(), WaitError>> {
        match w {
            Ok(w) => self.observe(&w),
            Err(source) => Some(Err(WaitError::Convert {
                target: self.target.clone(),
                source: Box::new(source),
            })),
        }
    }

    fn deleted(&self) -> Result<(), WaitError> {
        Err(WaitError::Deleted {
            target: self.target.clone(),
        })
    }
}

async fn watch<K>(
    client: &Client,
    target: &WorkloadRef,
    timeout: Duration,
    start: Start<'_>,
    to_workload: ToWorkload<K>,
) -> Result<(), WaitError>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + 'static,
{
    let api: Api<K> = Api::namespaced(client.clone(), &target.namespace);
    let fields = format!("metadata.name={}", target.name);
    let mut progress = Progress {
        target,
        last: String::from("no status observed yet"),
    };
    let waiting = async {
        if let Some(done) = progress.observe(start.workload) {
            return done;
        }
        let from = start.resource_version.to_string();
        if let Some(done) = watch_from(&api, &fields, from, to_workload, &mut progress).await {
            return done;
        }
        let config = watcher::Config::default().fields(&fields);
        let mut events = watcher(api, config).default_backoff().boxed();
        loop {
            match events.try_next().await {
                Ok(Some(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj))) => {
                    if let Some(done) = progress.observe_obj(to_workload(&obj)) {
                        return done;
                    }
                }
                Ok(Some(watcher::Event::Delete(_))) => return progress.deleted(),
                Ok(Some(watcher::Event::Init | watcher::Event::InitDone)) => {}
                Ok(None) => {
                    return Err(WaitError::Interrupted {
                        target: target.clone(),
                    });
                }
                // default_backoff already retried; log and keep waiting until the deadline.
                Err(e) => tracing::warn!(workload = %target, "watch error, retrying: {e}"),
            }
        }
    };
    let result = tokio::time::timeout(timeout, waiting).await;
    match result {
        Ok(r) => r,
        Err(_) => Err(WaitError::Timeout {
            target: target.clone(),
            timeout,
            last: progress.last,
        }),
    }
}

/// Plain WATCHes from `from`, each resumed from the last version seen when the server ends it.
/// `None` when a watch fails: the caller falls back to the re-listing watcher.
async fn watch_from<K>(
    api: &Api<K>,
    fields: &str,
    mut from: String,
    to_workload: ToWorkload<K>,
    progress: &mut Progress<'_>,
) -> Option<Result<(), WaitError>>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    // Below the server's minimum request timeout, so the server, not the network, ends it.
    let params = WatchParams::default().fields(fields).timeout(290);
    loop {
        let events = match api.watch(&params, &from).await {
            Ok(events) => events,
            Err(e) => {
                tracing::debug!(workload = %progress.target, "watch from {from} failed, re-listing: {e}");
                return None;
            }
        };
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj)) => {
                    if let Some(done) = progress.observe_obj(to_workload(&obj)) {
                        return Some(done);
                    }
                    from = obj.meta().resource_version.clone().unwrap_or(from);
                }
                Ok(WatchEvent::Deleted(_)) => return Some(progress.deleted()),
                Ok(WatchEvent::Bookmark(b)) => from = b.metadata.resource_version,
                Ok(WatchEvent::Error(status)) => {
                    tracing::debug!(workload = %progress.target, "watch ended: {}", status.message);
                    return None;
                }
                Err(e) => {
                    tracing::debug!(workload = %progress.target, "watch broke: {e}");
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(
        generation: i64,
        observed: i64,
        desired: i32,
        current: i32,
        updated: i32,
        available: i32,
    ) -> RolloutStatus {
        RolloutStatus {
            generation,
            observed_generation: observed,
            desired,
            current,
            updated,
            ready: available,
            available,
            ..Default::default()
        }
    }

    #[test]
    fn deployment_follows_kubectl() {
        let ru = UpdateStrategy::RollingUpdate;
        let cases = [
            (status(2, 1, 3, 3, 3, 3), false, "spec update"),
            (status(2, 2, 3, 4, 1, 3), false, "1 of 3 new"),
            (status(2, 2, 3, 4, 3, 3), false, "1 old replicas"),
            (status(2, 2, 3, 3, 3, 2), false, "2 of 3 updated"),
            (status(2, 2, 3, 3, 3, 3), true, ""),
        ];
        for (s, complete, text) in cases {
            match state(Kind::Deployment, ru, &s) {
                RolloutState::Complete => assert!(complete, "{s:?} should not be complete"),
                RolloutState::InProgress(m) => assert!(!complete && m.contains(text), "{s:?}: {m}"),
                RolloutState::Failed(m) => panic!("{s:?} failed: {m}"),
            }
        }
        let stuck = RolloutStatus {
            progress_deadline_exceeded: true,
            ..status(2, 2, 3, 4, 1, 3)
        };
        assert!(matches!(
            state(Kind::Deployment, ru, &stuck),
            RolloutState::Failed(_)
        ));
    }

    #[test]
    fn statefulset_waits_for_revision_and_partition() {
        let ru = UpdateStrategy::RollingUpdate;
        let mut s = status(3, 3, 2, 2, 1, 2);
        s.current_revision = Some("a".into());
        s.update_revision = Some("b".into());
        assert!(matches!(
            state(Kind::StatefulSet, ru, &s),
            RolloutState::InProgress(_)
        ));
        s.current_revision = Some("b".into());
        assert_eq!(state(Kind::StatefulSet, ru, &s), RolloutState::Complete);
        let never_observed = status(1, 0, 1, 1, 1, 1);
        assert!(matches!(
            state(Kind::StatefulSet, ru, &never_observed),
            RolloutState::InProgress(_)
        ));
        let mut part = status(3, 3, 4, 4, 1, 4);
        part.rolling_update = StsRollingUpdate::Set { partition: Some(2) };
        part.current_revision = Some("a".into());
        part.update_revision = Some("b".into());
        assert!(matches!(
            state(Kind::StatefulSet, ru, &part),
            RolloutState::InProgress(_)
        ));
        part.updated = 2;
        assert_eq!(state(Kind::StatefulSet, ru, &part), RolloutState::Complete);
        let not_ready = RolloutStatus {
            ready: 1,
            ..status(3, 3, 2, 2, 2, 1)
        };
        assert!(matches!(
            state(Kind::StatefulSet, ru, &not_ready),
            RolloutState::InProgress(_)
        ));
    }

    #[test]
    fn daemonset_waits_for_updated_and_available() {
        let ru = UpdateStrategy::RollingUpdate;
        assert!(matches!(
            state(Kind::DaemonSet, ru, &status(2, 1, 2, 2, 2, 2)),
            RolloutState::InProgress(_)
        ));
        assert!(matches!(
            state(Kind::DaemonSet, ru, &status(2, 2, 2, 2, 1, 2)),
            RolloutState::InProgress(_)
        ));
        assert!(matches!(
            state(Kind::DaemonSet, ru, &status(2, 2, 2, 2, 2, 1)),
            RolloutState::InProgress(_)
        ));
        assert_eq!(
            state(Kind::DaemonSet, ru, &status(2, 2, 2, 2, 2, 2)),
            RolloutState::Complete
        );
    }
}

#[cfg(test)]
mod kubectl_rule_tests {
    use super::*;

    /// A StatefulSet as the API server serves it (defaulting always sets rollingUpdate).
    fn served(rolling_update: serde_json::Value, status: serde_json::Value) -> Workload {
        let mut strategy = serde_json::json!({"type": "RollingUpdate"});
        if !rolling_update.is_null() {
            strategy["rollingUpdate"] = rolling_update;
        }
        let json = serde_json::json!({
            "metadata": {"name": "db", "namespace": "a", "generation": 2},
            "spec": {"replicas": 3, "selector": {}, "template": {}, "updateStrategy": strategy},
            "status": status,
        });
        Workload::from(serde_json::from_value::<crate::convert::wire::StatefulSet>(json).unwrap())
    }

    /// Safety case 5: kubectl takes the partition branch whenever rollingUpdate is set (done
    /// when updatedReplicas >= replicas - partition), and compares revisions only without it.
    #[test]
    fn case5_statefulset_completion_is_kubectls_rule() {
        let st = |w: &Workload| state(Kind::StatefulSet, w.strategy, &w.status);
        // All pods updated and ready; the controller has not yet moved currentRevision.
        let status = serde_json::json!({"observedGeneration": 2, "replicas": 3, "readyReplicas": 3,
            "updatedReplicas": 3, "currentRevision": "a", "updateRevision": "b"});
        let defaulted = served(serde_json::json!({"partition": 0}), status.clone());
        assert_eq!(st(&defaulted), RolloutState::Complete);
        // rollingUpdate present without partition: kubectl skips the count and is done.
        let empty = served(serde_json::json!({}), status.clone());
        assert_eq!(st(&empty), RolloutState::Complete);
        // Without rollingUpdate, the revisions decide.
        let bare = served(serde_json::Value::Null, status);
        assert!(
            matches!(st(&bare), RolloutState::InProgress(_)),
            "{:?}",
            st(&bare)
        );
        // Revisions equal but updatedReplicas short: kubectl (partition 0) still waits.
        let short = serde_json::json!({"observedGeneration": 2, "replicas": 3, "readyReplicas": 3,
            "updatedReplicas": 2, "currentRevision": "b", "updateRevision": "b"});
        let waiting = served(serde_json::json!({"partition": 0}), short.clone());
        assert!(matches!(st(&waiting), RolloutState::InProgress(m) if m.contains("2 of 3")));
        assert_eq!(
            st(&served(serde_json::Value::Null, short)),
            RolloutState::Complete
        );
        // Partition 1: done at 2 updated.
        let two = serde_json::json!({"observedGeneration": 2, "replicas": 3, "readyReplicas": 3,
            "updatedReplicas": 2, "currentRevision": "a", "updateRevision": "b"});
        assert_eq!(
            st(&served(serde_json::json!({"partition": 1}), two)),
            RolloutState::Complete
        );
    }
}
