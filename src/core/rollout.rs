//! Rollout completion by kubectl's rules (`kubectl rollout status`, pkg/polymorphichelpers/
//! rollout_status.go), decided from a workload's status; the watch that waits for it is
//! `cluster::watch`.

use super::model::{Kind, RolloutStatus, StsRollingUpdate, UpdateStrategy};

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
