//! One bounce as a pure state machine: from the fresh read before acting to the outcome, every
//! decision (gates, method, restart request, waits, verification, revert handling, evictions,
//! withdrawal, marks, events) is made here from plain observations. The executor only carries
//! out the `Action` it is given and hands back what it saw.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::core::action::{Action, EdgeError, Event, EventKind, Fresh, Observation, PodRef, Stage};
use crate::core::mark::{Attempt, AttemptMark};
use crate::core::model::{McpServerRef, Method, Uid, Workload};
use crate::core::outcome::{Failure, FailureCode, Outcome, Status, attempt_outcome};
use crate::core::plan::Bounce;
use crate::core::policy::Policy;
use crate::core::reasons::SkipReason;
use crate::core::recheck;
use crate::core::toolhive;

/// A restart written to the pod template (by bouncer, or by an owner it asked), as verified.
#[derive(Debug, Clone)]
struct Restart {
    method: Method,
    /// The annotation's value that proves it; None until the operator has written it.
    written: Option<String>,
    at: DateTime<Utc>,
    /// The pods from before, by UID.
    old: BTreeSet<Uid>,
    /// The digest of the pod template's spec it was written on.
    template: Option<u64>,
}

/// Where a bounce stands; each variant waits for the observation of the action it asked for.
#[derive(Debug, Clone)]
enum Phase {
    Start,
    /// The fresh read before acting.
    Reading,
    /// `restart.method: toolhive`: the MCPServer's restart annotations, right before asking.
    ReadingOperator {
        server: McpServerRef,
    },
    /// The attempt mark, written before anything is disrupted (evictions and ToolHive).
    Marking {
        then: AfterMark,
    },
    Patching,
    Requesting {
        server: McpServerRef,
        value: String,
    },
    WaitingOperator {
        server: McpServerRef,
        value: String,
    },
    WaitingRollout {
        again: bool,
    },
    Settling,
    Verifying {
        again: bool,
    },
    FindingReverters {
        found: Option<String>,
    },
    /// onRevert: evict: the fresh read whose gates the evictions must pass.
    RecheckingEviction {
        note: String,
        managers: Vec<String>,
    },
    Evicting {
        queue: Vec<PodRef>,
        done: usize,
        want: usize,
        revert: Option<Revert>,
    },
    Replacing {
        queue: Vec<PodRef>,
        done: usize,
        want: usize,
        revert: Option<Revert>,
    },
    /// A restart request the operator did not act on is taken back before the bounce ends.
    Withdrawing {
        status: Status,
    },
    /// The outcome is known: its mark and Event go out, then it is done.
    Finishing,
}

#[derive(Debug, Clone)]
enum AfterMark {
    Evict,
    Request {
        server: McpServerRef,
        value: String,
        resource_version: String,
    },
}

/// A revert the evictions follow, for their report.
#[derive(Debug, Clone)]
struct Revert {
    note: String,
    managers: Vec<String>,
}

/// Everything the gates on a fresh read need that is not the workload.
pub struct Limits<'a> {
    pub policy: &'a Policy,
    /// The whole bounce's budget (rollout, settle, verification and any eviction).
    pub timeout: Duration,
    /// Least time between the restart and its verification, so a reverting owner shows itself.
    pub settle: Duration,
}

pub struct Machine<'a> {
    bounce: &'a Bounce,
    limits: Limits<'a>,
    phase: Phase,
    outcome: Outcome,
    attempt: Option<Attempt>,
    /// Who owns the workload's pods and how they are selected, from the latest fresh read: an
    /// evicted pod's replacement is one of theirs.
    owners: Vec<String>,
    selector: String,
    /// The workload's mark as read before acting: each write records the attempt in it.
    seen_mark: AttemptMark,
    restart: Option<Restart>,
    /// The workload as read right before acting.
    fresh: Option<Workload>,
    /// Its UID then: every write of this bounce is conditional on it.
    uid: Option<Uid>,
    deadline: Option<DateTime<Utc>>,
    /// Where the wait for the operator starts: the mark's resourceVersion.
    from: Option<String>,
    /// Actions whose answers need no decision (Events, the final mark), then the next one.
    queued: VecDeque<Action>,
}

impl<'a> Machine<'a> {
    pub fn new(bounce: &'a Bounce, limits: Limits<'a>) -> Machine<'a> {
        Machine {
            outcome: recheck::planned(bounce),
            bounce,
            limits,
            phase: Phase::Start,
            attempt: None,
            owners: Vec::new(),
            selector: String::new(),
            seen_mark: AttemptMark::None,
            restart: None,
            fresh: None,
            uid: None,
            deadline: None,
            from: None,
            queued: VecDeque::new(),
        }
    }

    /// The next action, given what the last one observed (`Observation::Begin` at first),
    /// `now`, and why the run must stop, if it must.
    pub fn step(&mut self, seen: Observation, now: DateTime<Utc>, stop: Option<&str>) -> Action {
        if matches!(seen, Observation::Emitted | Observation::Marked(_))
            && let Some(next) = self.queued.pop_front()
        {
            return next;
        }
        let phase = std::mem::replace(&mut self.phase, Phase::Finishing);
        if let Observation::Stopped = seen {
            return self.interrupted(phase, now, stop);
        }
        match (phase, seen) {
            (Phase::Start, _) => {
                self.outcome.started = Some(now);
                self.deadline = Some(now + chrono_of(self.limits.timeout));
                self.phase = Phase::Reading;
                self.read(true)
            }
            (Phase::Reading, Observation::Read(read)) => self.on_fresh(read, now, stop),
            (Phase::ReadingOperator { server }, Observation::Operator(state)) => {
                let state = match state {
                    Ok(s) => s,
                    Err(e) => return self.skip(read_failed(&e), now),
                };
                let proxy = self.fresh.as_ref().expect("read before acting");
                match toolhive::restart_request(&state, proxy, now) {
                    Ok(value) => {
                        let resource_version = state.resource_version.clone();
                        self.phase = Phase::Marking {
                            then: AfterMark::Request {
                                server,
                                value,
                                resource_version,
                            },
                        };
                        self.mark_started()
                    }
                    Err(reason) => self.skip(reason, now),
                }
            }
            (Phase::Marking { then }, Observation::Marked(marked)) => {
                let version = match marked {
                    Ok(v) => v,
                    // The mark is a patch named for the UID the fresh read found: a conflict is
                    // the name having changed hands since; nothing was written or disrupted.
                    Err(EdgeError::Conflict { .. }) => {
                        return self.skip(recheck::replaced(self.bounce, None), now);
                    }
                    Err(e) => {
                        let nothing = match then {
                            AfterMark::Evict => "nothing was evicted",
                            AfterMark::Request { .. } => "the MCPServer was not asked to restart",
                        };
                        let detail = format!("could not record the attempt mark: {e}; {nothing}");
                        return self.fail(Failure::new(FailureCode::MarkFailed, detail), now);
                    }
                };
                match then {
                    AfterMark::Evict => {
                        let fresh = self.fresh.take().expect("read before acting");
                        self.start_evictions(fresh, None, now)
                    }
                    AfterMark::Request {
                        server,
                        value,
                        resource_version,
                    } => {
                        self.outcome.patched_at = Some(now);
                        self.restart_mut().at = now;
                        self.from = version;
                        self.phase = Phase::Requesting {
                            server: server.clone(),
                            value: value.clone(),
                        };
                        Action::RequestOperatorRestart {
                            target: self.bounce.target.clone(),
                            server,
                            value,
                            resource_version,
                        }
                    }
                }
            }
            (Phase::Patching, Observation::Patched(patched)) => match patched {
                Ok((written, version)) => {
                    self.outcome.written = Some(written.clone());
                    self.restart_mut().written = Some(written);
                    self.phase = Phase::WaitingRollout { again: false };
                    self.wait_rollout(Some(version))
                }
                // The patch names the UID the fresh read found: a conflict is the name having
                // changed hands since, and nothing was written.
                Err(EdgeError::Conflict { .. }) => {
                    self.skip(recheck::replaced(self.bounce, None), now)
                }
                Err(e) => self.fail(Failure::new(FailureCode::PatchFailed, e.to_string()), now),
            },
            (Phase::Requesting { server, value }, Observation::Requested(requested)) => {
                match requested {
                    Ok(()) => {
                        let before = self
                            .fresh
                            .as_ref()
                            .and_then(|w| w.toolhive.restarted_at.clone());
                        self.phase = Phase::WaitingOperator {
                            server: server.clone(),
                            value,
                        };
                        Action::Wait(Stage::OperatorActed {
                            target: self.bounce.target.clone(),
                            server,
                            before,
                            from: self.from.take(),
                            deadline: self.deadline(),
                            timeout: self.limits.timeout,
                        })
                    }
                    // The answer may have been lost after the server took the request: it is
                    // taken back all the same.
                    Err(e) => {
                        let failure = Failure::new(FailureCode::PatchFailed, e.to_string());
                        self.withdraw(server, value, Status::Failed(failure))
                    }
                }
            }
            (Phase::WaitingOperator { server, value }, Observation::OperatorActed(acted)) => {
                match acted {
                    Ok((written, version)) => {
                        self.outcome.written = Some(written.clone());
                        self.restart_mut().written = Some(written);
                        self.phase = Phase::WaitingRollout { again: false };
                        self.wait_rollout(Some(version))
                    }
                    Err(failure) => self.withdraw(server, value, Status::Failed(failure)),
                }
            }
            (Phase::WaitingRollout { again }, Observation::RolledOut(done)) => match done {
                Err(failure) => self.fail(failure, now),
                Ok(()) if again => {
                    self.phase = Phase::Verifying { again: true };
                    self.read(false)
                }
                Ok(()) => {
                    self.outcome.completed_at = Some(now);
                    // Give a reverting owner `settle` after the restart to show itself; rollouts
                    // usually take longer, so verification normally follows completion at once.
                    let settled = self.restart_mut().at + chrono_of(self.limits.settle);
                    if settled > now {
                        self.phase = Phase::Settling;
                        Action::Sleep {
                            until: settled.min(self.deadline()),
                        }
                    } else {
                        self.phase = Phase::Verifying { again: false };
                        self.read(false)
                    }
                }
            },
            (Phase::Settling, Observation::Slept) => {
                self.phase = Phase::Verifying { again: false };
                self.read(false)
            }
            (Phase::Verifying { again }, Observation::Read(read)) => {
                self.on_verify(read.map(|f| f.workload), again, now)
            }
            (Phase::FindingReverters { found }, Observation::Reverters(reverters)) => {
                self.on_reverted(found, &reverters, now)
            }
            (Phase::RecheckingEviction { note, managers }, Observation::Read(read)) => {
                let revert = Revert { note, managers };
                match read {
                    Err(e) => self.reverted_untouched(revert, &e, now),
                    Ok(fresh) => match recheck::before_evicting(self.limits.policy, &fresh) {
                        Ok(()) => self.start_evictions(fresh.workload, Some(revert), now),
                        Err(reason) => self.reverted_untouched(revert, &reason, now),
                    },
                }
            }
            (
                Phase::Evicting {
                    queue,
                    done,
                    want,
                    revert,
                },
                Observation::Evicted(evicted),
            ) => match evicted {
                Ok(()) => {
                    let pod = queue[done].clone();
                    self.phase = Phase::Replacing {
                        queue,
                        done,
                        want,
                        revert,
                    };
                    Action::Wait(Stage::Replaced {
                        target: self.bounce.target.clone(),
                        pod,
                        owners: self.owners.clone(),
                        selector: self.selector.clone(),
                        want,
                        deadline: self.deadline(),
                    })
                }
                Err(failure) => self.eviction_failed(failure, revert, now),
            },
            (
                Phase::Replacing {
                    queue,
                    done,
                    want,
                    revert,
                },
                Observation::Replaced(replaced),
            ) => match replaced {
                Ok(()) => self.next_eviction(queue, done + 1, want, revert, now),
                Err(failure) => self.eviction_failed(failure, revert, now),
            },
            (Phase::Withdrawing { status }, Observation::Withdrawn(withdrawn)) => {
                let status = match (status, withdrawn) {
                    (Status::Failed(f), Ok(())) => {
                        Status::Failed(f.after_detail("the restart request was withdrawn"))
                    }
                    (Status::Failed(f), Err(e)) => Status::Failed(f.after_detail(&e.to_string())),
                    (other, _) => other,
                };
                self.finish(status, now)
            }
            (Phase::Finishing, _) => self.done(),
            (phase, seen) => {
                // An answer to another action than the one asked for is a bug in the executor:
                // fail closed, touching nothing more (a pending request is still withdrawn).
                let detail = format!("unexpected {seen:?} while {phase:?}");
                let failure = Failure::new(FailureCode::Internal, detail);
                match phase {
                    Phase::Requesting { server, value }
                    | Phase::WaitingOperator { server, value } => {
                        self.withdraw(server, value, Status::Failed(failure))
                    }
                    _ => self.fail(failure, now),
                }
            }
        }
    }

    fn on_fresh(
        &mut self,
        read: Result<Box<Fresh>, EdgeError>,
        now: DateTime<Utc>,
        stop: Option<&str>,
    ) -> Action {
        let fresh = match read {
            Ok(f) => f,
            Err(e) => return self.skip(read_failed(&e), now),
        };
        let method = match recheck::before_acting(self.limits.policy, self.bounce, &fresh, now) {
            Ok(route) => {
                self.outcome.instead = route.instead;
                route.method
            }
            Err(reason) => return self.skip(reason, now),
        };
        // The fresh read takes a moment; a stop that came meanwhile starts nothing new.
        if let Some(why) = stop {
            return self.finish(Status::Interrupted(why.to_string()), now);
        }
        let w = fresh.workload;
        self.outcome.method = method;
        let attempt = Attempt::new(now, &self.bounce.policy, method).on_template(w.template_spec);
        self.attempt = Some(attempt.clone());
        self.outcome.attempt = Some(attempt.clone());
        self.restart = Some(Restart {
            method,
            written: None,
            at: now,
            old: w.pods.iter().map(|p| p.uid.clone()).collect(),
            template: w.template_spec,
        });
        let server = w.toolhive.server.clone();
        self.seen_mark = w.attempt.clone();
        self.owners = w.pod_owners.clone();
        self.selector = w.pod_selector.clone();
        self.uid = w.uid.clone();
        self.fresh = Some(w);
        match method {
            Method::Rollout => {
                self.outcome.patched_at = Some(now);
                self.phase = Phase::Patching;
                Action::Patch {
                    target: self.bounce.target.clone(),
                    uid: self.uid.clone(),
                    at: now,
                    mark: self.seen_mark.recorded(&attempt),
                }
            }
            Method::Evict => {
                self.phase = Phase::Marking {
                    then: AfterMark::Evict,
                };
                self.mark_started()
            }
            Method::Toolhive => match server.map(|s| *s) {
                Some(server) => {
                    self.phase = Phase::ReadingOperator {
                        server: server.clone(),
                    };
                    Action::ReadOperator {
                        target: self.bounce.target.clone(),
                        server,
                    }
                }
                None => {
                    let error = "no MCPServer controls it any more".to_string();
                    self.skip(SkipReason::ReadFailed { error }, now)
                }
            },
        }
    }

    /// The run was asked to stop during `phase`: a restart request the operator has not acted
    /// on is withdrawn first; nothing new starts.
    fn interrupted(&mut self, phase: Phase, now: DateTime<Utc>, stop: Option<&str>) -> Action {
        let status = Status::Interrupted(stop.unwrap_or_default().to_string());
        match phase {
            Phase::Requesting { server, value } | Phase::WaitingOperator { server, value } => {
                self.withdraw(server, value, status)
            }
            _ => self.finish(status, now),
        }
    }

    fn withdraw(&mut self, server: McpServerRef, value: String, status: Status) -> Action {
        self.phase = Phase::Withdrawing { status };
        Action::Withdraw {
            target: self.bounce.target.clone(),
            server,
            value,
        }
    }

    fn skip(&mut self, reason: SkipReason, now: DateTime<Utc>) -> Action {
        self.finish(Status::Skipped(reason), now)
    }

    fn fail(&mut self, failure: Failure, now: DateTime<Utc>) -> Action {
        self.finish(Status::Failed(failure), now)
    }

    /// The outcome is decided: the attempt's mark records it (whatever the method: the cooldown,
    /// the backoff and the breaker read it), the Event tells it, then the bounce is done.
    fn finish(&mut self, status: Status, now: DateTime<Utc>) -> Action {
        self.phase = Phase::Finishing;
        self.outcome.finished = Some(now);
        // A verified rollout's mark rode on its restart patch and stands as written: one write
        // per successful bounce (the planner reads `started` with new pods as bounced).
        let rode_on_patch = status == Status::Bounced && self.outcome.method == Method::Rollout;
        if let Status::Skipped(_) = status {
            self.outcome.attempt = None;
        } else if let Some(attempt) = self.attempt.as_ref().filter(|_| !rode_on_patch) {
            let marked = attempt.with_outcome(attempt_outcome(&status));
            self.outcome.attempt = Some(marked.clone());
            self.queued.push_back(Action::Mark {
                target: self.bounce.target.clone(),
                uid: self.uid.clone(),
                history: self.seen_mark.recorded(&marked),
                attempt: marked,
            });
        }
        let event = match &status {
            Status::Bounced => Some(self.event(
                EventKind::Bounced,
                format!(
                    "restarted by policy {} ({})",
                    self.bounce.policy,
                    self.outcome.verification.as_deref().unwrap_or("verified")
                ),
            )),
            Status::Failed(why) => Some(self.event(EventKind::Failed, why.detail.clone())),
            Status::Superseded { .. } => Some(self.event(
                EventKind::Superseded,
                self.outcome.verification.clone().unwrap_or_default(),
            )),
            _ => None,
        };
        self.queued.extend(event);
        self.outcome.status = status;
        self.queued.pop_front().unwrap_or_else(|| self.done())
    }

    fn done(&mut self) -> Action {
        let outcome = std::mem::replace(&mut self.outcome, recheck::planned(self.bounce));
        Action::Done(Box::new(outcome))
    }

    /// `first`, then `next` (whose answer the current phase waits for).
    fn before(&mut self, first: Action, next: Action) -> Action {
        self.queued.push_front(next);
        first
    }

    fn event(&self, kind: EventKind, note: String) -> Action {
        Action::Emit(Event {
            target: self.bounce.target.clone(),
            kind,
            note,
        })
    }

    fn mark_started(&self) -> Action {
        let attempt = self.attempt.clone().expect("set before acting");
        Action::Mark {
            target: self.bounce.target.clone(),
            uid: self.uid.clone(),
            history: self.seen_mark.recorded(&attempt),
            attempt,
        }
    }

    fn read(&self, context: bool) -> Action {
        Action::Read {
            target: self.bounce.target.clone(),
            context,
            block_when: context
                .then(|| self.limits.policy.block_when.clone())
                .flatten(),
        }
    }

    fn wait_rollout(&self, from: Option<String>) -> Action {
        Action::Wait(Stage::Rollout {
            target: self.bounce.target.clone(),
            from,
            deadline: self.deadline(),
            timeout: self.limits.timeout,
        })
    }

    fn deadline(&self) -> DateTime<Utc> {
        self.deadline.expect("set at the start")
    }

    fn restart_mut(&mut self) -> &mut Restart {
        self.restart.as_mut().expect("set before acting")
    }
}

/// A read that failed before acting: the skip reason carries its text into the report.
pub(crate) fn read_failed(e: &EdgeError) -> SkipReason {
    SkipReason::ReadFailed {
        error: e.to_string(),
    }
}

fn chrono_of(d: Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(d).unwrap_or(chrono::TimeDelta::MAX)
}

#[path = "bounce_after.rs"]
mod after;

#[cfg(test)]
#[path = "bounce_tests.rs"]
pub(crate) mod tests;
