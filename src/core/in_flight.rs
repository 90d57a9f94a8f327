//! A bounce an earlier run started and did not see through (its Job's pod was OOM-killed,
//! preempted, SIGKILLed): what stops the next run from starting a second rollout beside it.
//! Nothing of the dead run survives but its attempt mark (`started`) and the workload's status,
//! and those are enough: while that workload has not finished rolling, within the bounce's
//! timeout, no other bounce starts; once it has, the planner reads the `started` mark with its
//! new pods as bounced, as it reads any verified rollout.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::core::mark::AttemptOutcome;
use crate::core::model::{Kind, Workload, WorkloadRef};
use crate::core::policy::Policy;
use crate::core::rollout::{RolloutState, state};

/// The bounce left in flight: the workload, when it began, and when its timeout ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub target: WorkloadRef,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

/// Of the controllers given with the policy their latest attempt names (this run's own, still
/// selecting them: another installation's bounce, under its own policies and Lease, is not this
/// queue's to wait for), the earliest whose attempt is `started`, younger than that policy's
/// timeout (`default_timeout` when it sets none), and whose rollout is not complete by kubectl's
/// rules. Bare pods are not followed: an evicted bare pod's replacement, if any, is another object.
pub fn in_flight<'a>(
    marked: impl Iterator<Item = (&'a Workload, &'a Policy)>,
    default_timeout: Duration,
    now: DateTime<Utc>,
) -> Option<InFlight> {
    marked
        .filter(|(w, _)| w.target.kind != Kind::Pod)
        .filter_map(|(w, policy)| {
            let latest = w.attempt.latest()?;
            if latest.outcome != AttemptOutcome::Started {
                return None;
            }
            let timeout = policy.restart.timeout.unwrap_or(default_timeout);
            let until = latest.time + TimeDelta::from_std(timeout).unwrap_or(TimeDelta::MAX);
            let rolling = state(w.target.kind, w.strategy, &w.status) != RolloutState::Complete;
            (now < until && rolling).then(|| InFlight {
                target: w.target.clone(),
                since: latest.time,
                until,
            })
        })
        .min_by_key(|f| f.since)
}
