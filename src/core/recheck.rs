//! The gates again, right before acting: the planner's chain (`gates::admits`, `gates::safety`)
//! on a fresh read with its own context, for a planned bounce and for evictions after a revert.

use chrono::{DateTime, Utc};

use crate::core::action::Fresh;
use crate::core::gates::{Route, admits, blocker, evicting, preflight, safety};
use crate::core::model::Uid;
use crate::core::outcome::{Outcome, Status};
use crate::core::overrides;
use crate::core::plan::Bounce;
use crate::core::policy::Policy;
use crate::core::reasons::SkipReason;

/// A planned bounce before anything happened to it.
pub fn planned(b: &Bounce) -> Outcome {
    Outcome {
        policy: b.policy.clone(),
        target: b.target.clone(),
        method: b.method,
        status: Status::NotAttempted(None),
        started: None,
        patched_at: None,
        completed_at: None,
        finished: None,
        verification: None,
        written: None,
        attempt: None,
        last_confirmed: None,
        instead: b.instead.clone(),
    }
}

/// The fresh read right before a planned bounce acts: the planner's gates again on what the
/// cluster holds now (namespace opt-outs, disruption budgets and blockers read afresh too), and
/// nobody else restarted it since the plan.
pub fn before_acting(
    policy: &Policy,
    b: &Bounce,
    fresh: &Fresh,
    now: DateTime<Utc>,
) -> Result<Route, SkipReason> {
    let Some(context) = &fresh.context else {
        return Err(SkipReason::ReadFailed {
            error: "the fresh read lacks the namespaces, disruption budgets and blockers".into(),
        });
    };
    let w = &fresh.workload;
    admits(policy, w, &context.excluded_namespaces)?;
    if w.uid != b.seen_uid {
        return Err(replaced(b, Some(uid_text(w.uid.as_ref()))));
    }
    if w.restarted_at != b.seen_restarted_at {
        return Err(SkipReason::RestartedMeanwhile);
    }
    // The workload's override annotations as they are now, not as the plan saw them.
    let policy = overrides::effective(policy, w)?;
    safety(&policy, w, &context.pdbs, &context.prometheus, now)
}

/// The workload the plan judged (`b.seen_uid`) is gone under its name: `now` is the UID a read
/// found instead, or `None` when the API server refused a write named for the old one.
pub fn replaced(b: &Bounce, now: Option<String>) -> SkipReason {
    SkipReason::Replaced {
        was: uid_text(b.seen_uid.as_ref()),
        now,
    }
}

fn uid_text(uid: Option<&Uid>) -> String {
    uid.map(ToString::to_string).unwrap_or_default()
}

/// Evictions after a reverted restart (onRevert: evict) pass the gates of an eviction bounce on
/// a fresh read; the cooldown is not among them (the bounce itself just began).
pub fn before_evicting(policy: &Policy, fresh: &Fresh) -> Result<(), SkipReason> {
    let Some(context) = &fresh.context else {
        return Err(SkipReason::ReadFailed {
            error: "the fresh read lacks the namespaces, disruption budgets and blockers".into(),
        });
    };
    let w = &fresh.workload;
    admits(policy, w, &context.excluded_namespaces)?;
    let evicting = evicting(overrides::effective(policy, w)?.as_ref());
    preflight(&evicting, w, &context.pdbs)?;
    blocker(&evicting, &context.prometheus)
}
