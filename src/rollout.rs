//! Rollout completion by kubectl's rules (`kubectl rollout status`), and the watch that waits for it.

use std::fmt::Debug;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::convert;
use crate::model::{Kind, RolloutStatus, UpdateStrategy, WorkloadRef};

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
            if s.partition > 0 {
                let wanted = s.desired - s.partition;
                if s.updated < wanted {
                    return InProgress(format!(
                        "partitioned roll out: {} of {} new pods updated",
                        s.updated, wanted
                    ));
                }
                return Complete;
            }
            if s.update_revision != s.current_revision {
                return InProgress(format!(
                    "{} of {} pods at the new revision",
                    s.updated, s.desired
                ));
            }
            Complete
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
    #[error("interrupted while waiting for the rollout of {target}")]
    Interrupted { target: WorkloadRef },
}

/// Waits on a watch until the rollout completes by kubectl's rules. The watcher re-lists and
/// resumes with backoff across API errors and API server restarts, so a blip does not lose the wait.
pub async fn wait(
    client: &Client,
    target: &WorkloadRef,
    timeout: Duration,
) -> Result<(), WaitError> {
    match target.kind {
        Kind::Deployment => watch::<Deployment>(client, target, timeout, convert::deployment).await,
        Kind::StatefulSet => {
            watch::<StatefulSet>(client, target, timeout, convert::statefulset).await
        }
        Kind::DaemonSet => watch::<DaemonSet>(client, target, timeout, convert::daemonset).await,
        Kind::Pod => Ok(()),
    }
}

async fn watch<K>(
    client: &Client,
    target: &WorkloadRef,
    timeout: Duration,
    to_workload: fn(&K) -> crate::model::Workload,
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
    let config = watcher::Config::default().fields(&format!("metadata.name={}", target.name));
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut last = String::from("no status observed yet");
    let waiting = async {
        loop {
            match events.try_next().await {
                Ok(Some(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj))) => {
                    let w = to_workload(&obj);
                    match state(target.kind, w.strategy, &w.status) {
                        RolloutState::Complete => return Ok(()),
                        RolloutState::Failed(reason) => {
                            return Err(WaitError::Failed {
                                target: target.clone(),
                                reason,
                            });
                        }
                        RolloutState::InProgress(detail) => {
                            if detail != last {
                                tracing::info!(target: "bouncer::rollout", workload = %target, "{detail}");
                                last = detail;
                            }
                        }
                    }
                }
                Ok(Some(watcher::Event::Delete(_))) => {
                    return Err(WaitError::Deleted {
                        target: target.clone(),
                    });
                }
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
            last,
        }),
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
        part.partition = 2;
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
