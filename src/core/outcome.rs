//! What became of each planned bounce (`Outcome`, with its `Status`), and why a bounce failed
//! (`Failure`, with a stable code for the JSON report, like a skip's).

use std::fmt;

use chrono::{DateTime, Utc};

use crate::core::mark::{Attempt, AttemptOutcome};
use crate::core::model::{Method, WorkloadRef};
use crate::core::reasons::SkipReason;

/// The closed set of ways a bounce fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureCode {
    /// The restartedAt patch was refused or could not be sent.
    PatchFailed,
    /// The rollout did not complete within the bounce's timeout.
    RolloutTimedOut,
    /// The rollout cannot complete by itself (ProgressDeadlineExceeded).
    RolloutFailed,
    /// The workload was deleted while bouncer waited for its rollout.
    WorkloadDeleted,
    /// The read after the rollout, which the verification needs, failed.
    VerifyReadFailed,
    /// The rollout completed, but pods from before the bounce remain or are not ready.
    VerifyFailed,
    /// bouncer's attempt mark could not be written, so nothing was evicted.
    MarkFailed,
    /// The Eviction API refused (a PodDisruptionBudget) until the timeout.
    EvictionRefused,
    /// An evicted pod had no ready replacement within the timeout.
    NoReplacement,
    /// The eviction request itself failed.
    EvictionFailed,
    /// Bounced and verified, but the run's final re-check of restartedAt could not read it.
    RecheckFailed,
    /// `restart.method: toolhive`: the operator did not roll the Deployment within the timeout
    /// after the restart request on its MCPServer.
    OperatorNoRestart,
    /// The executor answered an action with something else: a bug; nothing more was done.
    Internal,
}

impl FailureCode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureCode::PatchFailed => "patchFailed",
            FailureCode::RolloutTimedOut => "rolloutTimedOut",
            FailureCode::RolloutFailed => "rolloutFailed",
            FailureCode::WorkloadDeleted => "workloadDeleted",
            FailureCode::VerifyReadFailed => "verifyReadFailed",
            FailureCode::VerifyFailed => "verifyFailed",
            FailureCode::MarkFailed => "markFailed",
            FailureCode::EvictionRefused => "evictionRefused",
            FailureCode::NoReplacement => "noReplacement",
            FailureCode::EvictionFailed => "evictionFailed",
            FailureCode::RecheckFailed => "recheckFailed",
            FailureCode::OperatorNoRestart => "operatorNoRestart",
            FailureCode::Internal => "internal",
        }
    }
}

/// A failed bounce: its code and the message that names the action and the object.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub code: FailureCode,
    pub detail: String,
}

impl Failure {
    pub fn new(code: FailureCode, detail: impl Into<String>) -> Failure {
        Failure {
            code,
            detail: detail.into(),
        }
    }

    pub fn code(&self) -> &'static str {
        self.code.as_str()
    }

    /// The same failure with `more` after its message.
    pub fn after_detail(self, more: &str) -> Failure {
        Failure {
            detail: format!("{}; {more}", self.detail),
            ..self
        }
    }

    /// The same failure with `context` in front of its message.
    pub fn after(self, context: &str) -> Failure {
        Failure {
            detail: format!("{context}; {}", self.detail),
            ..self
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Restarted, rollout complete, verified.
    Bounced,
    /// The owner reverted the restart; the pods were then evicted one at a time (onRevert: evict).
    RevertedEvicted { managers: Vec<String> },
    /// The owner reverted the restart (onRevert: fail). Halts the queue.
    Reverted { managers: Vec<String> },
    /// The fresh read before acting found a reason not to.
    Skipped(SkipReason),
    /// Patch, rollout, eviction or verification failed. Halts the queue.
    Failed(Failure),
    /// Someone restarted the workload again while bouncer waited (the later restart's value):
    /// its pods roll under that restart. Neither a failure nor bouncer's bounce; the queue goes
    /// on and the breaker does not count it.
    Superseded { found: String },
    /// The run was asked to stop (SIGTERM, or the lock was lost: the text says which) during
    /// this bounce or right before it; nothing new is started after that.
    Interrupted(String),
    /// Not tried: an earlier bounce halted the queue (None), or a member of its restart group
    /// before it was not bounced (that member).
    NotAttempted(Option<WorkloadRef>),
}

impl Status {
    /// The workload's pods were replaced (by the rollout, or by evictions after a revert).
    pub fn bounced(&self) -> bool {
        matches!(self, Status::Bounced | Status::RevertedEvicted { .. })
    }

    pub fn halts(&self) -> bool {
        matches!(
            self,
            Status::Reverted { .. } | Status::Failed(_) | Status::Interrupted(_)
        )
    }

    pub fn code(&self) -> &'static str {
        match self {
            Status::Bounced => "bounced",
            Status::RevertedEvicted { .. } => "revertedEvicted",
            Status::Reverted { .. } => "reverted",
            Status::Superseded { .. } => "superseded",
            Status::Skipped(_) => "skipped",
            Status::Failed(_) => "failed",
            Status::Interrupted(_) => "interrupted",
            Status::NotAttempted(_) => "notAttempted",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub policy: String,
    pub target: WorkloadRef,
    pub method: Method,
    /// Why the pods were evicted where the template would have been restarted (see
    /// `Bounce::instead`), as the fresh read before acting found it.
    pub instead: Option<SkipReason>,
    pub status: Status,
    pub started: Option<DateTime<Utc>>,
    /// When the restartedAt patch (or the first eviction) was written.
    pub patched_at: Option<DateTime<Utc>>,
    /// When the rollout was seen complete (or the last replacement ready).
    pub completed_at: Option<DateTime<Utc>>,
    pub finished: Option<DateTime<Utc>>,
    pub verification: Option<String>,
    /// The restartedAt value the bounce wrote (rollouts only).
    pub written: Option<String>,
    /// The attempt mark this bounce wrote before acting.
    pub attempt: Option<Attempt>,
    /// When the run's final re-check (right before the report) last saw the annotation intact.
    pub last_confirmed: Option<DateTime<Utc>>,
}

/// The mark's outcome for a bounce's status.
pub fn attempt_outcome(status: &Status) -> AttemptOutcome {
    match status {
        Status::Bounced => AttemptOutcome::Bounced,
        Status::RevertedEvicted { .. } => AttemptOutcome::RevertedEvicted,
        Status::Reverted { .. } => AttemptOutcome::Reverted,
        Status::Interrupted(_) => AttemptOutcome::Interrupted,
        Status::Superseded { .. } => AttemptOutcome::Superseded,
        Status::Failed(_) | Status::Skipped(_) | Status::NotAttempted(_) => AttemptOutcome::Failed,
    }
}
