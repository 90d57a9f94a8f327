//! Warning Events for skips a person must see: a due workload held back by its policy's
//! `blockWhen` (a firing alert, or a query that could not be answered), by its open circuit
//! breaker, or by an owner that would undo its restart (`restartPinned`, `revertedSince`). Told on the workload at most once per [`EVERY`] for as long as the condition lasts,
//! not on every run: a CronJob every 15 minutes would otherwise write 96 Events a day per
//! workload. What was told when lives on the run Lease (see `cluster::lock`).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::literals::{
    REASON_BLOCKED, REASON_BREAKER_OPEN, REASON_RESTART_PINNED, REASON_REVERTED,
};
use super::model::WorkloadRef;
use super::reasons::SkipReason;

/// The API server keeps Events for an hour by default (`--event-ttl`): told once an hour, a
/// held-back workload always shows a recent Event in `kubectl describe`.
pub const EVERY: Duration = Duration::from_secs(3600);
/// Events one run records at most; the rest are told by the next runs (an alert that blocks a
/// thousand workloads must not become a thousand writes at once).
pub const PER_RUN: usize = 50;

/// When each condition was last told, by `REASON/kind/namespace/name`.
pub type Told = BTreeMap<String, DateTime<Utc>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub target: WorkloadRef,
    /// The Event's reason.
    pub reason: &'static str,
    pub note: String,
}

fn event_reason(reason: &SkipReason) -> Option<&'static str> {
    match reason {
        SkipReason::BreakerOpen { .. } => Some(REASON_BREAKER_OPEN),
        SkipReason::Blocked { .. } | SkipReason::BlockerFailed { .. } => Some(REASON_BLOCKED),
        SkipReason::RestartPinned { .. } => Some(REASON_RESTART_PINNED),
        SkipReason::RevertedSince { .. } => Some(REASON_REVERTED),
        _ => None,
    }
}

/// The Events this run records, from the plan's skips (workload, policy, reason), and what to
/// remember as told. A condition never told, or last told `EVERY` ago or more, is due; those
/// never told go first, then the longest untold, up to [`PER_RUN`]. Conditions that no longer
/// hold are forgotten, so one that comes back is told at once.
pub fn notices<'a>(
    skips: impl IntoIterator<Item = (&'a WorkloadRef, &'a str, &'a SkipReason)>,
    told: &Told,
    now: DateTime<Utc>,
) -> (Vec<Notice>, Told) {
    let mut current: BTreeMap<String, Notice> = BTreeMap::new();
    for (target, policy, reason) in skips {
        let Some(event) = event_reason(reason) else {
            continue;
        };
        current
            .entry(format!("{event}/{target}"))
            .or_insert_with(|| Notice {
                target: target.clone(),
                reason: event,
                note: format!("not bounced by policy {policy}: {reason}"),
            });
    }
    let every = chrono::Duration::from_std(EVERY).expect("an hour fits");
    let mut due: Vec<(Option<DateTime<Utc>>, String)> = current
        .keys()
        .map(|k| (told.get(k).copied(), k.clone()))
        // A time in the future (a clock moved back) is as good as never told.
        .filter(|(last, _)| last.is_none_or(|t| now - t >= every || t > now))
        .collect();
    due.sort();
    due.truncate(PER_RUN);
    let mut next: Told = current
        .keys()
        .filter_map(|k| Some((k.clone(), *told.get(k)?)))
        .collect();
    let mut out = Vec::with_capacity(due.len());
    for (_, key) in due {
        next.insert(key.clone(), now);
        out.extend(current.remove(&key));
    }
    (out, next)
}

#[cfg(test)]
#[path = "notice_tests.rs"]
mod tests;
