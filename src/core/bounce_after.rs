//! The bounce machine after the restart: the verification, what a reverted restart leads to
//! (onRevert, after the eviction gates on a fresh read), and evictions, one pod at a time.

use chrono::{DateTime, Utc};

use super::{Machine, Phase, Revert};
use crate::core::action::{Action, EdgeError, EventKind, PodRef};
use crate::core::model::Workload;
use crate::core::outcome::{Failure, FailureCode, Status};
use crate::core::policy::OnRevert;
use crate::core::verify::{self, Reverters, Verdict, annotation_label};

impl Machine<'_> {
    pub(super) fn on_verify(
        &mut self,
        read: Result<Workload, EdgeError>,
        again: bool,
        now: DateTime<Utc>,
    ) -> Action {
        let after = match read {
            Ok(w) => w,
            Err(e) => {
                let detail = format!("verification read failed: {e}");
                return self.fail(Failure::new(FailureCode::VerifyReadFailed, detail), now);
            }
        };
        let restart = self.restart.as_ref().expect("restarted before verifying");
        let written = restart.written.as_deref().unwrap_or_default();
        let verdict = verify::check(
            &after,
            restart.method,
            written,
            &restart.old,
            restart.template,
            now,
        );
        match verdict {
            Verdict::Verified { pods } => {
                self.outcome.verification = Some(format!(
                    "{} intact, {pods}/{pods} pods new and ready",
                    annotation_label(restart.method)
                ));
                self.finish(Status::Bounced, now)
            }
            // Every pod is new but some are not ready: an autoscaler added them during the
            // settle. Wait (within the same budget) for kubectl's rule again, then re-check.
            Verdict::Incomplete { old: 0, .. } if !again => {
                self.phase = Phase::WaitingRollout { again: true };
                self.wait_rollout(None)
            }
            Verdict::Incomplete { detail, .. } => {
                self.outcome.verification = Some(detail.clone());
                let detail = format!("rollout completed but verification failed: {detail}");
                self.fail(Failure::new(FailureCode::VerifyFailed, detail), now)
            }
            Verdict::Superseded { found } => {
                self.outcome.verification = Some(format!(
                    "{} is now {found}, a restart after bouncer's ({written}): the pods roll \
                     under it; nothing more is done to the workload",
                    annotation_label(restart.method)
                ));
                self.finish(Status::Superseded { found }, now)
            }
            Verdict::NewTemplate => {
                self.outcome.verification = Some(format!(
                    "the pod template changed after bouncer's restart ({written}): a new version \
                     was rolled out over it, and its rollout replaced the pods; nothing more is \
                     done to the workload"
                ));
                let found = "a new pod template".to_string();
                self.finish(Status::Superseded { found }, now)
            }
            Verdict::Reverted { found } => {
                self.phase = Phase::FindingReverters { found };
                Action::FindReverters {
                    target: self.bounce.target.clone(),
                    since: restart.at,
                }
            }
        }
    }

    pub(super) fn on_reverted(
        &mut self,
        found: Option<String>,
        by: &Reverters,
        now: DateTime<Utc>,
    ) -> Action {
        let method = self.restart_mut().method;
        let note = format!(
            "{} was reverted by {by} (now: {}); onRevert: {}",
            annotation_label(method),
            found.as_deref().unwrap_or("removed"),
            self.bounce.on_revert.as_str()
        );
        self.outcome.verification = Some(note.clone());
        let event = self.event(EventKind::Reverted, note.clone());
        let managers = by.managers.clone();
        if self.bounce.on_revert == OnRevert::Fail {
            let next = self.finish(Status::Reverted { managers }, now);
            return self.before(event, next);
        }
        // Evictions after a revert pass the same gates as an eviction bounce, on a fresh read.
        self.phase = Phase::RecheckingEviction { note, managers };
        let read = self.read(true);
        self.before(event, read)
    }

    pub(super) fn reverted_untouched(
        &mut self,
        revert: Revert,
        why: &dyn std::fmt::Display,
        now: DateTime<Utc>,
    ) -> Action {
        self.outcome.verification = Some(format!("{}; nothing evicted: {why}", revert.note));
        self.finish(
            Status::Reverted {
                managers: revert.managers,
            },
            now,
        )
    }

    /// Evicts, one at a time, the live pods of `w` from before the bounce (all of them for an
    /// eviction bounce; after a revert, those the rollout did not replace).
    pub(super) fn start_evictions(
        &mut self,
        w: Workload,
        revert: Option<Revert>,
        now: DateTime<Utc>,
    ) -> Action {
        // After a revert the owners are those of the read the evictions' gates passed on.
        self.owners = w.pod_owners.clone();
        self.selector = w.pod_selector.clone();
        let old = &self.restart.as_ref().expect("set before acting").old;
        let live: Vec<_> = w.pods.iter().filter(|p| !p.deleting).collect();
        let want = live.len().max(1);
        let mut queue: Vec<PodRef> = live
            .into_iter()
            .filter(|p| old.contains(&p.uid))
            .map(|p| PodRef {
                name: p.name.clone(),
                uid: p.uid.to_string(),
            })
            .collect();
        queue.sort_by(|a, b| a.name.cmp(&b.name));
        self.next_eviction(queue, 0, want, revert, now)
    }

    pub(super) fn next_eviction(
        &mut self,
        queue: Vec<PodRef>,
        done: usize,
        want: usize,
        revert: Option<Revert>,
        now: DateTime<Utc>,
    ) -> Action {
        if done == queue.len() {
            self.outcome.completed_at = Some(now);
            return match revert {
                Some(r) => {
                    self.outcome.verification =
                        Some(format!("{}; {done} pods evicted one at a time", r.note));
                    self.finish(
                        Status::RevertedEvicted {
                            managers: r.managers,
                        },
                        now,
                    )
                }
                None => {
                    self.outcome.verification = Some(format!("{done} pods replaced one at a time"));
                    self.finish(Status::Bounced, now)
                }
            };
        }
        self.outcome.patched_at.get_or_insert(now);
        let pod = queue[done].clone();
        self.phase = Phase::Evicting {
            queue,
            done,
            want,
            revert,
        };
        Action::Evict {
            target: self.bounce.target.clone(),
            pod,
            deadline: self.deadline(),
        }
    }

    pub(super) fn eviction_failed(
        &mut self,
        failure: Failure,
        revert: Option<Revert>,
        now: DateTime<Utc>,
    ) -> Action {
        let failure = match revert {
            Some(r) => failure.after(&format!("{}; eviction failed", r.note)),
            None => failure,
        };
        self.fail(failure, now)
    }
}
