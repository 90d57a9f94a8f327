//! A bounce an earlier run started and did not see through (its Job's pod was OOM-killed,
//! preempted, SIGKILLed): what stops the next run from starting a second rollout beside it.
//! Nothing of the dead run survives but its attempt mark (`started`) and the workload's status,
//! and those are enough: while that workload has not finished rolling, within the bounce's
//! timeout, no other bounce starts; once it has, the planner reads the `started` mark with its
//! new pods as bounced, as it reads any verified rollout.
//!
//! A restart asked of ToolHive's operator (`restart.method: toolhive`) is in flight from the
//! request on, before the Deployment moves: while the operator has not acted on it, it may at
//! any moment. Past its timeout the dead run would have withdrawn it; the next run does
//! (`LeftRequest`), so a request nobody follows never restarts the server later, unobserved.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::core::literals::whole_seconds;
use crate::core::mark::{Attempt, AttemptMark, AttemptOutcome};
use crate::core::model::{Kind, McpServerRef, Method, Uid, Workload, WorkloadRef};
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
            let (latest, until) = started(w, policy, default_timeout)?;
            let rolling = state(w.target.kind, w.strategy, &w.status) != RolloutState::Complete
                || unanswered(w, latest);
            (now < until && rolling).then(|| InFlight {
                target: w.target.clone(),
                since: latest.time,
                until,
            })
        })
        .min_by_key(|f| f.since)
}

/// A restart request an interrupted run left on an MCPServer that its operator has not acted
/// on within the bounce's timeout: the next run withdraws it (if the MCPServer still holds
/// bouncer's unprocessed request) and records the attempt `interrupted`.
#[derive(Debug, Clone, PartialEq)]
pub struct LeftRequest {
    pub target: WorkloadRef,
    /// The Deployment's UID as the snapshot read it: the mark is written for it.
    pub uid: Option<Uid>,
    pub server: McpServerRef,
    /// The attempt the dead run marked `started`, and the mark it is in.
    pub attempt: Attempt,
    pub mark: AttemptMark,
}

/// Of the same controllers as `in_flight`, those whose latest attempt is a ToolHive request
/// marked `started`, unanswered by the operator, and past its timeout.
pub fn left_requests<'a>(
    marked: impl Iterator<Item = (&'a Workload, &'a Policy)>,
    default_timeout: Duration,
    now: DateTime<Utc>,
) -> Vec<LeftRequest> {
    marked
        .filter_map(|(w, policy)| {
            let (latest, until) = started(w, policy, default_timeout)?;
            let server = w.toolhive.server.as_deref()?;
            (unanswered(w, latest) && now >= until).then(|| LeftRequest {
                target: w.target.clone(),
                uid: w.uid.clone(),
                server: server.clone(),
                attempt: latest.clone(),
                mark: w.attempt.clone(),
            })
        })
        .collect()
}

/// The workload's latest attempt if it is `started`, and when that bounce's timeout ends (its
/// policy's, `default_timeout` where it sets none).
fn started<'w>(
    w: &'w Workload,
    policy: &Policy,
    default_timeout: Duration,
) -> Option<(&'w Attempt, DateTime<Utc>)> {
    let latest = w.attempt.latest()?;
    let timeout = policy.restart.timeout.unwrap_or(default_timeout);
    let until = latest.time + TimeDelta::from_std(timeout).unwrap_or(TimeDelta::MAX);
    (latest.outcome == AttemptOutcome::Started).then_some((latest, until))
}

/// A request to ToolHive's operator that it has not acted on: the proxy's pod template holds no
/// `restarted-at` (the operator writes the time it acted) as late as the attempt. A request is
/// never earlier than its attempt began (whole seconds), so a later value is the operator's
/// answer to it.
fn unanswered(w: &Workload, latest: &Attempt) -> bool {
    let acted = w
        .toolhive
        .restarted_at
        .as_deref()
        .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
        .is_some_and(|t| t.to_utc() >= whole_seconds(latest.time));
    latest.method == Method::Toolhive && !acted
}
