//! The vocabulary between the bounce machine and the executor: what the machine asks for
//! (`Action`) and what the executor saw carrying it out (`Observation`). Plain data both ways,
//! so the machine's every transition can be tested with scripted observations.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::core::history::Prometheus;
use crate::core::mark::{Attempt, AttemptHistory};
use crate::core::model::{McpServerRef, Pdb, Uid, Workload, WorkloadRef};
use crate::core::outcome::{Failure, Outcome};
use crate::core::toolhive::McpServerState;
use crate::core::verify::Reverters;

/// One pod, as an eviction names it (the UID is its precondition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub name: String,
    pub uid: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Bounced,
    Failed,
    Reverted,
    Superseded,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub target: WorkloadRef,
    pub kind: EventKind,
    pub note: String,
}

/// What a wait waits for; each ends at `deadline`, the bounce's budget.
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// The workload's rollout complete by kubectl's rules, watched from `from` (the patch's
    /// resourceVersion), or from a fresh LIST when there is none.
    Rollout {
        target: WorkloadRef,
        from: Option<String>,
        deadline: DateTime<Utc>,
        timeout: Duration,
    },
    /// ToolHive's operator has written a new restart annotation on the pod template.
    OperatorActed {
        target: WorkloadRef,
        server: McpServerRef,
        /// The operator's annotation before the request: a different one is its answer.
        before: Option<String>,
        from: Option<String>,
        deadline: DateTime<Utc>,
        timeout: Duration,
    },
    /// The evicted pod gone and `want` ready pods of the same owner again: for a controller,
    /// pods whose controller is one of `owners` (the selector only narrows the watch); for a
    /// bare pod, one recreated under its name.
    Replaced {
        target: WorkloadRef,
        pod: PodRef,
        owners: Vec<String>,
        selector: String,
        want: usize,
        deadline: DateTime<Utc>,
    },
}

#[derive(Debug, Clone)]
pub enum Action {
    /// A fresh read of the workload and its pods; with `context`, also what the gates read
    /// besides it (namespace opt-outs, disruption budgets, the policy's blocker query).
    Read {
        target: WorkloadRef,
        context: bool,
        block_when: Option<String>,
    },
    /// The restartedAt patch (with the attempt mark on the workload's metadata, in one write).
    /// `uid`: the object the fresh read judged; the server refuses the write if the name now
    /// holds another (deleted and recreated since).
    Patch {
        target: WorkloadRef,
        uid: Option<Uid>,
        at: DateTime<Utc>,
        mark: AttemptHistory,
    },
    /// The attempt mark alone: a controller's metadata holds `history` (its past attempts with
    /// this one recorded); a bare pod's Lease entry records `attempt`. Rolls nothing. A
    /// controller's is conditional on `uid`, as the patch is.
    Mark {
        target: WorkloadRef,
        uid: Option<Uid>,
        attempt: Attempt,
        history: AttemptHistory,
    },
    ReadOperator {
        target: WorkloadRef,
        server: McpServerRef,
    },
    /// The MCPServer's restart annotation, conditional on the state read before asking.
    RequestOperatorRestart {
        target: WorkloadRef,
        server: McpServerRef,
        value: String,
        resource_version: String,
    },
    /// Removes the request if it still holds `value`.
    Withdraw {
        target: WorkloadRef,
        server: McpServerRef,
        value: String,
    },
    /// One pod through the Eviction API, retried while a disruption budget refuses it.
    Evict {
        target: WorkloadRef,
        pod: PodRef,
        deadline: DateTime<Utc>,
    },
    Wait(Stage),
    Sleep {
        until: DateTime<Utc>,
    },
    /// Who wrote the pod template since `since`, from managedFields.
    FindReverters {
        target: WorkloadRef,
        since: DateTime<Utc>,
    },
    Emit(Event),
    /// This bounce is over.
    Done(Box<Outcome>),
    /// The whole queue is over.
    Finished,
}

impl Action {
    /// Whether the run's stop (SIGTERM, a lost lock) cuts it short: the executor then answers
    /// `Observation::Stopped` instead of waiting it out.
    pub fn interruptible(&self) -> bool {
        matches!(
            self,
            Action::Wait(_) | Action::Sleep { .. } | Action::Evict { .. }
        )
    }

    /// The step of a bounce this action is, by the name the fault tests stop a run at
    /// (`BOUNCER_TEST_HALT_AT`); None for reads and Events, which change nothing.
    pub fn step(&self) -> Option<&'static str> {
        Some(match self {
            Action::Patch { .. } => "patch",
            Action::Mark { .. } => "mark",
            Action::Evict { .. } => "evict",
            Action::RequestOperatorRestart { .. } => "request",
            Action::Wait(Stage::Rollout { .. }) => "rollout-wait",
            Action::Wait(Stage::OperatorActed { .. }) => "operator-wait",
            Action::Wait(Stage::Replaced { .. }) => "replacement-wait",
            Action::Sleep { .. } => "settle",
            _ => return None,
        })
    }
}

/// What gates on a fresh read need besides the workload, read at the same moment.
#[derive(Debug, Clone)]
pub struct Context {
    pub excluded_namespaces: BTreeSet<String>,
    pub pdbs: Vec<Pdb>,
    pub prometheus: Prometheus,
}

#[derive(Debug, Clone)]
pub struct Fresh {
    pub workload: Workload,
    /// Present when the read asked for it.
    pub context: Option<Context>,
}

/// Why the edge could not carry out a read or a write. The edge classifies its own error by the
/// API server's answer, so the machine can tell causes apart without naming a client type;
/// `message` is the edge's text, which names the action and the object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EdgeError {
    /// The object is not there (404): deleted since it was planned, or never created.
    #[error("{message}")]
    NotFound { message: String },
    /// A condition of a write to the workload failed (409): the UID it was for (the object was
    /// deleted and recreated), or the resourceVersion it was read at (someone wrote in between).
    /// A write to bouncer's own Lease is never this: that is `Other`.
    #[error("{message}")]
    Conflict { message: String },
    /// The identity lacks a permission (401/403): retrying will not help.
    #[error("{message}")]
    Forbidden { message: String },
    /// No answer: the connection failed or the request timed out.
    #[error("{message}")]
    Unreachable { message: String },
    /// Any other answer the API server refused with.
    #[error("{message}")]
    Api { status: u16, message: String },
    /// bouncer's own side, before or after any answer (no run lock to write in, an answer it
    /// could not read).
    #[error("{message}")]
    Other { message: String },
}

#[derive(Debug, Clone)]
pub enum Observation {
    /// The first step of a bounce or of the queue.
    Begin,
    Read(Result<Box<Fresh>, EdgeError>),
    /// The value written, and the resourceVersion the patch returned.
    Patched(Result<(String, String), EdgeError>),
    /// The resourceVersion the mark's patch returned (none for a bare pod's Lease).
    Marked(Result<Option<String>, EdgeError>),
    Operator(Result<McpServerState, EdgeError>),
    Requested(Result<(), EdgeError>),
    Withdrawn(Result<(), EdgeError>),
    Evicted(Result<(), Failure>),
    RolledOut(Result<(), Failure>),
    /// The operator's annotation as it wrote it, and the resourceVersion where it was seen.
    OperatorActed(Result<(String, String), Failure>),
    Replaced(Result<(), Failure>),
    Slept,
    Reverters(Reverters),
    Emitted,
    /// The run was asked to stop while the action waited.
    Stopped,
}
