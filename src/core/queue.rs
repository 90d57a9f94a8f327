//! The run's queue as a pure state machine: bounces strictly one at a time, each through its
//! own `bounce::Machine`; a restart group checked whole before its first member acts; every
//! earlier restart confirmed intact before the next one starts (and once more at the end); the
//! queue halted by the first failure or a stop.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::core::action::{Action, Event, EventKind, Observation};
use crate::core::bounce::{self, Limits, Machine};
use crate::core::group::Group;
use crate::core::model::{Method, WorkloadRef};
use crate::core::outcome::{Failure, FailureCode, Outcome, Status};
use crate::core::plan::Bounce;
use crate::core::policy::Policy;
use crate::core::recheck;
use crate::core::verify::{annotation_label, restart_annotation, supersedes};

/// A restart group, as the queue tells groups apart: by namespace too.
type GroupKey = (String, Group);

fn group_key(b: &Bounce) -> Option<GroupKey> {
    b.group.clone().map(|g| (b.target.namespace.clone(), g))
}

/// What the queue is doing between bounces.
enum Between {
    /// Re-reading an earlier verified restart (by index into the outcomes).
    Confirming {
        index: usize,
        pending: Vec<usize>,
    },
    /// Who reverted an earlier restart the confirmation found changed.
    FindingReverters {
        index: usize,
        found: Option<String>,
        pending: Vec<usize>,
    },
    /// Giving the owner of the last restart `settle` after its completion to revert it.
    Settling {
        pending: Vec<usize>,
    },
    /// The Event of a late revert went out: on to the next confirmation.
    Resuming {
        pending: Vec<usize>,
    },
    /// Reading each member of a group before its first member acts.
    CheckingGroup {
        members: Vec<usize>,
        at: usize,
    },
    Idle,
}

pub struct Queue<'a> {
    bounces: &'a [Bounce],
    policies: &'a BTreeMap<&'a str, &'a Policy>,
    default_timeout: Duration,
    settle: Duration,
    next: usize,
    current: Option<Machine<'a>>,
    between: Between,
    outcomes: Vec<Outcome>,
    halted: bool,
    /// A group member that was not bounced: the rest of its group is left alone.
    held: Option<(GroupKey, WorkloadRef)>,
    /// Groups checked whole before their first member.
    checked: Vec<GroupKey>,
    /// The final confirmation has run.
    confirmed: bool,
    /// How many outcomes there were when earlier restarts were last confirmed.
    confirmed_upto: usize,
}

impl<'a> Queue<'a> {
    pub fn new(
        bounces: &'a [Bounce],
        policies: &'a BTreeMap<&'a str, &'a Policy>,
        default_timeout: Duration,
        settle: Duration,
    ) -> Queue<'a> {
        Queue {
            bounces,
            policies,
            default_timeout,
            settle,
            next: 0,
            current: None,
            between: Between::Idle,
            outcomes: Vec::new(),
            halted: false,
            held: None,
            checked: Vec::new(),
            confirmed: false,
            confirmed_upto: 0,
        }
    }

    /// The bounce being carried out, as (position from 1, queue length, bounce), if one is.
    pub fn in_progress(&self) -> Option<(usize, usize, &'a Bounce)> {
        self.current
            .as_ref()
            .map(|_| (self.next + 1, self.bounces.len(), &self.bounces[self.next]))
    }

    /// The outcome recorded last, if any.
    pub fn last_outcome(&self) -> Option<&Outcome> {
        self.outcomes.last()
    }

    /// The outcomes, in plan order, once `step` has answered `Action::Finished`.
    pub fn outcomes(self) -> Vec<Outcome> {
        self.outcomes
    }

    pub fn step(&mut self, seen: Observation, now: DateTime<Utc>, stop: Option<&str>) -> Action {
        if let Some(machine) = &mut self.current {
            match machine.step(seen, now, stop) {
                Action::Done(outcome) => {
                    self.current = None;
                    self.record(*outcome);
                    return self.advance(now, stop);
                }
                action => return action,
            }
        }
        match std::mem::replace(&mut self.between, Between::Idle) {
            Between::Idle => self.advance(now, stop),
            Between::Confirming { index, pending } => {
                self.on_confirm(index, pending, seen, now, stop)
            }
            Between::FindingReverters {
                index,
                found,
                pending,
            } => {
                let Observation::Reverters(by) = seen else {
                    return self.advance_confirming(pending, now, stop);
                };
                let out = &mut self.outcomes[index];
                let note = format!(
                    "{} was reverted after the bounce was verified, by {by} (now: {}); \
                     its pods restart again under the owner's template",
                    annotation_label(out.method),
                    found.as_deref().unwrap_or("removed")
                );
                out.verification = Some(note.clone());
                out.status = Status::Reverted {
                    managers: by.managers.clone(),
                };
                // A late revert rolls the workload again: nothing else starts while it does.
                self.halted = true;
                let event = Action::Emit(Event {
                    target: out.target.clone(),
                    kind: EventKind::Reverted,
                    note,
                });
                self.between = Between::Resuming { pending };
                event
            }
            Between::Resuming { pending } | Between::Settling { pending } => {
                self.advance_confirming(pending, now, stop)
            }
            Between::CheckingGroup { members, at } => {
                self.on_group_read(members, at, seen, now, stop)
            }
        }
    }

    fn record(&mut self, outcome: Outcome) {
        self.halted |= outcome.status.halts();
        if let (Some(key), false) = (
            group_key(&self.bounces[self.next]),
            outcome.status.bounced(),
        ) {
            self.held = Some((key, outcome.target.clone()));
        }
        self.outcomes.push(outcome);
        self.next += 1;
    }

    /// Starts the next bounce, or says why it is not attempted; confirms earlier restarts first.
    fn advance(&mut self, now: DateTime<Utc>, stop: Option<&str>) -> Action {
        loop {
            let Some(b) = self.bounces.get(self.next) else {
                if !self.confirmed {
                    self.confirmed = true;
                    return self.advance_confirming(self.to_confirm(), now, stop);
                }
                return Action::Finished;
            };
            let mut outcome = recheck::planned(b);
            if !self.halted
                && let Some(why) = stop
            {
                // Asked to stop between two bounces: the first one left out is reported as
                // interrupted, so the report and the exit code say the queue was not finished.
                self.halted = true;
                outcome.status = Status::Interrupted(why.to_string());
            }
            let key = group_key(b);
            if self.halted {
                self.push(outcome);
                continue;
            }
            if let Some((held, member)) = &self.held
                && key.as_ref() == Some(held)
            {
                outcome.status = Status::NotAttempted(Some(member.clone()));
                self.push(outcome);
                continue;
            }
            // Earlier restarts intact, before another rollout starts beside a reverted one.
            let pending = self.due_confirmations();
            if !pending.is_empty() {
                // An owner that reverts on its next reconcile shows itself after the rollout, not
                // at the verification right after it: give it `settle` before the next starts.
                let settled =
                    self.outcomes.last().and_then(|o| o.completed_at).map(|at| {
                        at + chrono::TimeDelta::from_std(self.settle).unwrap_or_default()
                    });
                if let Some(until) = settled.filter(|u| *u > now) {
                    self.between = Between::Settling { pending };
                    return Action::Sleep { until };
                }
                return self.advance_confirming(pending, now, stop);
            }
            if let Some(key) = key
                && !self.checked.contains(&key)
            {
                self.checked.push(key.clone());
                // The plan puts a group's members next to each other.
                let members: Vec<usize> = (self.next..self.bounces.len())
                    .take_while(|&i| group_key(&self.bounces[i]).as_ref() == Some(&key))
                    .collect();
                if members.len() > 1 {
                    self.between = Between::CheckingGroup { members, at: 0 };
                    return self.read_member(self.next);
                }
            }
            let limits = Limits {
                policy: self.policies[b.policy.as_str()],
                timeout: b.timeout.unwrap_or(self.default_timeout),
                settle: self.settle,
            };
            let mut machine = Machine::new(b, limits);
            let first = machine.step(Observation::Begin, now, stop);
            self.current = Some(machine);
            return first;
        }
    }

    fn push(&mut self, outcome: Outcome) {
        self.outcomes.push(outcome);
        self.next += 1;
    }

    /// Verified restarts whose annotation the run has not confirmed since they were made.
    fn to_confirm(&self) -> Vec<usize> {
        self.outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| {
                matches!(
                    (&o.status, o.method, &o.written),
                    (Status::Bounced, Method::Rollout | Method::Toolhive, Some(_))
                )
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Once per bounce that restarted something, before the next one starts.
    fn due_confirmations(&mut self) -> Vec<usize> {
        if self.confirmed_upto == self.outcomes.len()
            || !self.outcomes.last().is_some_and(|o| o.status.bounced())
        {
            return Vec::new();
        }
        self.confirmed_upto = self.outcomes.len();
        self.to_confirm()
    }

    fn advance_confirming(
        &mut self,
        mut pending: Vec<usize>,
        now: DateTime<Utc>,
        stop: Option<&str>,
    ) -> Action {
        if pending.is_empty() {
            return self.advance(now, stop);
        }
        let index = pending.remove(0);
        self.between = Between::Confirming { index, pending };
        Action::Read {
            target: self.outcomes[index].target.clone(),
            context: false,
            block_when: None,
        }
    }

    fn on_confirm(
        &mut self,
        index: usize,
        pending: Vec<usize>,
        seen: Observation,
        now: DateTime<Utc>,
        stop: Option<&str>,
    ) -> Action {
        let out = &mut self.outcomes[index];
        let written = out.written.clone().unwrap_or_default();
        match seen {
            Observation::Read(Ok(fresh)) => {
                let found = restart_annotation(out.method, &fresh.workload);
                if found.as_deref() == Some(written.as_str()) {
                    out.last_confirmed = Some(now);
                    return self.advance_confirming(pending, now, stop);
                }
                // A restart after the verified bounce is not a revert: bouncer's restart held,
                // and the later one is its author's to watch.
                if let Some(later) = found.as_deref().filter(|f| supersedes(f, &written, now)) {
                    let note = out.verification.take().unwrap_or_default();
                    out.verification = Some(format!(
                        "{note}; restarted again since, {} is now {later}",
                        annotation_label(out.method)
                    ));
                    return self.advance_confirming(pending, now, stop);
                }
                self.between = Between::FindingReverters {
                    index,
                    found,
                    pending,
                };
                Action::FindReverters {
                    target: out.target.clone(),
                    since: out.patched_at.unwrap_or(now),
                }
            }
            other => {
                let error = match other {
                    Observation::Read(Err(e)) => e.to_string(),
                    other => format!("unexpected {other:?}"),
                };
                out.status = Status::Failed(Failure::new(
                    FailureCode::RecheckFailed,
                    format!(
                        "bounced and verified, but the re-check of restartedAt failed: {error}"
                    ),
                ));
                self.halted = true;
                self.advance_confirming(pending, now, stop)
            }
        }
    }

    fn read_member(&self, i: usize) -> Action {
        let b = &self.bounces[i];
        Action::Read {
            target: b.target.clone(),
            context: true,
            block_when: self.policies[b.policy.as_str()].block_when.clone(),
        }
    }

    /// Each member of a group passes the gates on a fresh read before the first one acts, so
    /// a group is not left half restarted by a member skipped after its backend was bounced.
    fn on_group_read(
        &mut self,
        members: Vec<usize>,
        at: usize,
        seen: Observation,
        now: DateTime<Utc>,
        stop: Option<&str>,
    ) -> Action {
        let b = &self.bounces[members[at]];
        let policy = self.policies[b.policy.as_str()];
        let checked = match seen {
            Observation::Read(Ok(fresh)) => {
                recheck::before_acting(policy, b, &fresh, now).map(drop)
            }
            Observation::Read(Err(e)) => Err(bounce::read_failed(&e)),
            other => Err(crate::core::reasons::SkipReason::ReadFailed {
                error: format!("unexpected {other:?}"),
            }),
        };
        if let Err(reason) = checked {
            // The member that cannot be bounced is reported with its reason; the others of the
            // group are not attempted, naming it.
            let member = b.target.clone();
            let key = group_key(b).expect("a group member");
            for &i in &members {
                let mut out = recheck::planned(&self.bounces[i]);
                out.status = if i == members[at] {
                    Status::Skipped(reason.clone())
                } else {
                    Status::NotAttempted(Some(member.clone()))
                };
                self.outcomes.push(out);
            }
            self.next = members.last().map_or(self.next, |l| l + 1);
            self.held = Some((key, member));
            return self.advance(now, stop);
        }
        if at + 1 < members.len() {
            self.between = Between::CheckingGroup {
                members: members.clone(),
                at: at + 1,
            };
            return self.read_member(members[at + 1]);
        }
        self.advance(now, stop)
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
