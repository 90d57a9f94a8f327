//! Why a workload is bounced (`Trigger`) or skipped (`SkipReason`), with stable codes for JSON.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::core::history::QueryError;
use crate::core::literals::rfc3339;

use crate::core::memory::MemoryState;
use crate::core::model::{Deleting, Kind, WorkloadRef};
use crate::core::quantity::format_bytes;
use crate::core::schedule::ScheduleVerdict;

#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    Schedule {
        fired: DateTime<Utc>,
    },
    Memory {
        pod: String,
        usage: u64,
        threshold: u64,
    },
    /// Not due itself, bounced because a member of its restart group is.
    Group {
        due: WorkloadRef,
    },
    /// Every sample of the window over the threshold.
    MemorySustained {
        pod: String,
        lowest: u64,
        threshold: u64,
        window: Duration,
        samples: usize,
    },
    /// A least-squares slope over the window faster than the policy's rate.
    MemoryGrowth {
        pod: String,
        mib_per_hour: f64,
        above_mib_per_hour: f64,
        window: Duration,
        samples: usize,
    },
    /// The fitted line reaches `target` (the threshold, else the limit) at `projected`.
    MemoryPredict {
        pod: String,
        projected: DateTime<Utc>,
        target: u64,
        mib_per_hour: f64,
        case: PredictCase,
    },
}

/// Which rule made a projected OOM due.
#[derive(Debug, Clone, PartialEq)]
pub enum PredictCase {
    /// Within the `before` horizon.
    Horizon { before: Duration },
    /// Inside a window, before the next window ends: waiting for it would risk the OOM.
    InsideWindow { next_window_ends: DateTime<Utc> },
    /// Outside the windows, before the next one opens: waiting would mean the OOM.
    OutsideWindow { next_window_opens: DateTime<Utc> },
}

impl Trigger {
    pub fn code(&self) -> &'static str {
        match self {
            Trigger::Schedule { .. } => "schedule",
            Trigger::Memory { .. } => "memory",
            Trigger::Group { .. } => "group",
            Trigger::MemorySustained { .. } => "memorySustained",
            Trigger::MemoryGrowth { .. } => "memoryGrowth",
            Trigger::MemoryPredict { .. } => "memoryPredict",
        }
    }
}

fn human(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(d.as_secs()))
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::Schedule { fired } => write!(f, "schedule (fired {})", rfc3339(*fired)),
            Trigger::Memory {
                pod,
                usage,
                threshold,
            } => {
                write!(
                    f,
                    "memory ({pod} {} > {})",
                    format_bytes(*usage),
                    format_bytes(*threshold)
                )
            }
            Trigger::Group { due } => write!(f, "group ({due} is due)"),
            Trigger::MemorySustained {
                pod,
                lowest,
                threshold,
                window,
                samples,
            } => write!(
                f,
                "memory sustained ({pod} >= {} > {} for {}, {samples} samples)",
                format_bytes(*lowest),
                format_bytes(*threshold),
                human(*window)
            ),
            Trigger::MemoryGrowth {
                pod,
                mib_per_hour,
                above_mib_per_hour,
                window,
                samples,
            } => write!(
                f,
                "memory growth ({pod} {mib_per_hour:+.1} MiB/h > {above_mib_per_hour:.1} MiB/h over {}, {samples} samples)",
                human(*window)
            ),
            Trigger::MemoryPredict {
                pod,
                projected,
                target,
                mib_per_hour,
                case,
            } => {
                write!(
                    f,
                    "memory predict ({pod} reaches {} at {}, {mib_per_hour:+.1} MiB/h, ",
                    format_bytes(*target),
                    rfc3339(*projected)
                )?;
                match case {
                    PredictCase::Horizon { before } => write!(f, "within {})", human(*before)),
                    PredictCase::InsideWindow { next_window_ends } => write!(
                        f,
                        "inside a window, before the next window ends at {})",
                        rfc3339(*next_window_ends)
                    ),
                    PredictCase::OutsideWindow { next_window_opens } => write!(
                        f,
                        "outside the windows, before the next window opens at {})",
                        rfc3339(*next_window_opens)
                    ),
                }
            }
        }
    }
}

/// Why a history trigger did not fire, for the report: `memory.{trigger}: {detail}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    pub trigger: &'static str,
    pub detail: String,
}

/// Why no trigger fired.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NotDue {
    pub schedule: Option<ScheduleVerdict>,
    pub next: Option<DateTime<Utc>>,
    pub memory: Option<MemoryState>,
    /// Why each history trigger (sustained, growth, predict) did not fire.
    pub history: Vec<Waiting>,
}

/// Why a Deployment that names an MCPServer as its controller is not the one its operator
/// restarts (see `core::toolhive`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotProxy {
    /// The operator's proxy Deployment carries the server's name; this one does not.
    Name,
    /// The ownerReference was written for another server of that name (`owner`, by UID) than
    /// the one that exists now (`server`).
    Uid { owner: String, server: String },
    /// No MCPServer controls it (any more).
    NoOwner,
}

impl fmt::Display for NotProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotProxy::Name => write!(
                f,
                "the operator's proxy Deployment carries the server's name"
            ),
            NotProxy::Uid { owner, server } => write!(
                f,
                "its ownerReference names UID {owner:?}, the server's UID is {server:?}"
            ),
            NotProxy::NoOwner => write!(f, "no MCPServer controls it"),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum SkipReason {
    NamespaceExcluded,
    /// `bouncer.dev/exclude` with any value but `"false"`, as written.
    Excluded {
        value: String,
    },
    MirrorPod,
    /// The workload, or its namespace, is being deleted.
    BeingDeleted(Deleting),
    UnsupportedOwner {
        kind: String,
        name: String,
    },
    KindNotSelected {
        kind: Kind,
    },
    NoPods,
    NotDue(NotDue),
    Cooldown {
        last: DateTime<Utc>,
        until: DateTime<Utc>,
    },
    /// The last attempts failed or were reverted, `failures` in a row: the cooldown after the
    /// latest doubles per failure (`core::breaker`).
    BackingOff {
        failures: u32,
        last: DateTime<Utc>,
        until: DateTime<Utc>,
    },
    /// The circuit breaker: `bounces` attempts within `per`, at least the policy's
    /// `breaker.maxBounces`; it closes at `until`, when the oldest of them leaves the window.
    BreakerOpen {
        bounces: usize,
        max_bounces: u32,
        per: Duration,
        until: DateTime<Utc>,
    },
    Paused,
    RolloutInProgress {
        detail: String,
    },
    NotAvailable {
        ready: i32,
        desired: i32,
    },
    OnDelete,
    /// An OnDelete StatefulSet/DaemonSet whose pods are not all at its current template:
    /// evicting them would deploy a template change nobody has rolled out yet.
    PendingTemplate {
        updated: i32,
        desired: i32,
    },
    /// A StatefulSet with `rollingUpdate.partition > 0`: a restart would roll only the ordinals
    /// at or above it and leave the held ones old (due again at every run).
    Partitioned {
        partition: i32,
    },
    BarePodNoRollout,
    Downtime,
    PdbBlocks {
        name: String,
    },
    PolicyCap {
        max: u32,
    },
    GlobalCap {
        max: usize,
    },
    Claimed {
        policy: String,
    },
    /// bouncer's own attempt mark cannot be read: without it a failed bounce could repeat.
    BadAttemptMark {
        error: String,
    },
    /// The restartedAt annotation changed between the plan and the fresh read.
    RestartedMeanwhile,
    /// A bounce an earlier run started (and did not see through: killed, preempted) is still
    /// rolling `target`, within its timeout: no other bounce starts beside it.
    InFlight {
        target: WorkloadRef,
        since: DateTime<Utc>,
        until: DateTime<Utc>,
    },
    /// A restart request an interrupted run left on the MCPServer at `since`, which its
    /// operator did not act on within the bounce's timeout: withdrawn before any bounce.
    RequestLeft {
        server: String,
        since: DateTime<Utc>,
    },
    /// Deleted and recreated under its name between the plan and the fresh read (UID `was`,
    /// now `now`): the new object is not the one the plan judged; the next run judges it.
    Replaced {
        was: String,
        /// The new object's UID, where a read found it; `None` when the API server refused a
        /// write named for `was` (the name changed hands between the read and the write).
        now: Option<String>,
    },
    /// The workload disappeared, or a safety read failed: fail closed.
    ReadFailed {
        error: String,
    },
    /// A per-workload override annotation has a value bouncer cannot use.
    InvalidOverride {
        annotation: String,
        value: String,
        problem: String,
    },
    /// A member of the workload's restart group cannot be bounced, so none of the group is.
    GroupHeld {
        member: WorkloadRef,
        reason: Box<SkipReason>,
    },
    /// The policy's blockWhen query has results (firing alerts, by name).
    Blocked {
        alerts: Vec<String>,
    },
    /// The policy's blockWhen query could not be answered: fail closed.
    BlockerFailed {
        error: QueryError,
    },
    /// `restart.method: toolhive`, but the MCPServer asks its operator for a restart strategy
    /// other than rolling (`immediate` deletes every pod of the server at once).
    RestartStrategy {
        server: String,
        strategy: String,
    },
    /// `restart.method: toolhive` on a Deployment that names an MCPServer as its controller
    /// but is not that server's proxy Deployment, the one its operator restarts.
    NotOperatorOwned {
        server: String,
        why: NotProxy,
    },
    /// The policy says `suspend: true`: it is not evaluated at all.
    Suspended,
    /// A server-side apply manager other than bouncer owns the pod template's restartedAt
    /// (Git sets it, for Flux): its next apply writes its value back over a restart, so none is
    /// written.
    RestartPinned {
        manager: String,
        /// `namespace/name` of the Kustomization, from the workload's labels.
        kustomization: Option<String>,
    },
    /// bouncer's last restart through the template (`written`) was replaced since, by a value
    /// (`found`, None when absent or no time) that another manager owns and that is no later
    /// restart: a revert found after the run that made the restart.
    RevertedSince {
        manager: String,
        written: String,
        found: Option<String>,
    },
    /// Another dry-run policy would bounce the workload this run (`spec.dryRun`).
    ClaimedInDryRun {
        policy: String,
    },
}

impl SkipReason {
    /// The field manager that holds the pod template's restartedAt, for the reasons about it.
    pub fn restart_owner(&self) -> Option<&str> {
        match self {
            SkipReason::RestartPinned { manager, .. }
            | SkipReason::RevertedSince { manager, .. } => Some(manager),
            _ => None,
        }
    }

    /// Why a bounce evicts where it would have restarted through the template, for a reason
    /// `gates::route` turned into an eviction (the skip's advice to evict would read oddly).
    pub fn evicted_because(&self) -> String {
        match self {
            SkipReason::RestartPinned {
                manager,
                kustomization,
            } => {
                let by = kustomization
                    .as_ref()
                    .map(|k| format!(" (Kustomization {k})"))
                    .unwrap_or_default();
                format!(
                    "restartedAt is pinned by {manager}{by}, whose next apply would undo a restart"
                )
            }
            SkipReason::RevertedSince {
                manager, written, ..
            } => format!("{manager} reverted bouncer's restart of {written}"),
            other => other.to_string(),
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            SkipReason::NamespaceExcluded => "namespaceExcluded",
            SkipReason::Excluded { .. } => "excluded",
            SkipReason::MirrorPod => "mirrorPod",
            SkipReason::BeingDeleted(_) => "beingDeleted",
            SkipReason::UnsupportedOwner { .. } => "unsupportedOwner",
            SkipReason::KindNotSelected { .. } => "kindNotSelected",
            SkipReason::NoPods => "noPods",
            SkipReason::NotDue(_) => "notDue",
            SkipReason::Cooldown { .. } => "cooldown",
            SkipReason::BackingOff { .. } => "backingOff",
            SkipReason::BreakerOpen { .. } => "breakerOpen",
            SkipReason::Paused => "paused",
            SkipReason::RolloutInProgress { .. } => "rolloutInProgress",
            SkipReason::NotAvailable { .. } => "notAvailable",
            SkipReason::OnDelete => "onDelete",
            SkipReason::PendingTemplate { .. } => "pendingTemplate",
            SkipReason::Partitioned { .. } => "partitioned",
            SkipReason::BarePodNoRollout => "barePodNoRollout",
            SkipReason::Downtime => "downtime",
            SkipReason::PdbBlocks { .. } => "pdbBlocks",
            SkipReason::PolicyCap { .. } => "policyCap",
            SkipReason::GlobalCap { .. } => "globalCap",
            SkipReason::Claimed { .. } => "claimed",
            SkipReason::BadAttemptMark { .. } => "badAttemptMark",
            SkipReason::RestartedMeanwhile => "restartedMeanwhile",
            SkipReason::Replaced { .. } => "replaced",
            SkipReason::InFlight { .. } => "bounceInFlight",
            SkipReason::RequestLeft { .. } => "requestLeft",
            SkipReason::ReadFailed { .. } => "readFailed",
            SkipReason::InvalidOverride { .. } => "invalidOverride",
            SkipReason::GroupHeld { .. } => "groupHeld",
            SkipReason::Blocked { .. } => "blocked",
            SkipReason::BlockerFailed { .. } => "blockerFailed",
            SkipReason::RestartStrategy { .. } => "restartStrategy",
            SkipReason::NotOperatorOwned { .. } => "notOperatorOwned",
            SkipReason::Suspended => "suspended",
            SkipReason::RestartPinned { .. } => "restartPinned",
            SkipReason::RevertedSince { .. } => "revertedSince",
            SkipReason::ClaimedInDryRun { .. } => "claimed",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::NamespaceExcluded => {
                write!(f, "namespace is annotated bouncer.dev/exclude=true")
            }
            SkipReason::Excluded { value } if value == "true" => {
                write!(f, "annotated bouncer.dev/exclude=true")
            }
            SkipReason::Excluded { value } => write!(
                f,
                "annotated bouncer.dev/exclude={value:?}: not \"true\" or \"false\", so excluded (fail closed)"
            ),
            SkipReason::MirrorPod => write!(f, "static (mirror) pod"),
            SkipReason::BeingDeleted(Deleting::Workload) => write!(
                f,
                "being deleted (deletionTimestamp set): its controller rolls nothing out"
            ),
            SkipReason::BeingDeleted(Deleting::Namespace) => write!(
                f,
                "its namespace is being deleted: the API server creates no pod there"
            ),
            SkipReason::UnsupportedOwner { kind, name } => {
                write!(f, "unsupported owner {kind} {name}")
            }
            SkipReason::KindNotSelected { kind } => {
                write!(f, "kind {kind} not in the policy's kinds")
            }
            SkipReason::NoPods => write!(f, "no pods"),
            SkipReason::NotDue(n) => write!(f, "{n}"),
            SkipReason::Cooldown { last, until } => {
                write!(
                    f,
                    "cooldown: restarted {}, due again after {}",
                    rfc3339(*last),
                    rfc3339(*until)
                )
            }
            SkipReason::BackingOff {
                failures,
                last,
                until,
            } => {
                let attempts = if *failures == 1 {
                    "attempt"
                } else {
                    "attempts"
                };
                write!(
                    f,
                    "backing off: {failures} failed or reverted {attempts} in a row, the last {}; due again after {}",
                    rfc3339(*last),
                    rfc3339(*until)
                )
            }
            SkipReason::BreakerOpen {
                bounces,
                max_bounces,
                per,
                until,
            } => write!(
                f,
                "circuit breaker open: {bounces} bounces within {} (breaker.maxBounces {max_bounces}); closes after {}",
                human(*per),
                rfc3339(*until)
            ),
            SkipReason::Paused => write!(f, "deployment is paused"),
            SkipReason::RolloutInProgress { detail } => write!(f, "rollout in progress: {detail}"),
            SkipReason::NotAvailable { ready, desired } => {
                write!(f, "not fully available ({ready}/{desired} ready)")
            }
            SkipReason::OnDelete => {
                write!(
                    f,
                    "updateStrategy OnDelete: restartedAt would not replace pods (restart.method: rollout)"
                )
            }
            SkipReason::PendingTemplate { updated, desired } => write!(
                f,
                "only {updated} of {desired} pods are at the current template: evicting would roll out a pending template change"
            ),
            SkipReason::Partitioned { partition } => write!(
                f,
                "updateStrategy partition {partition}: a restart would leave ordinals below it old"
            ),
            SkipReason::BarePodNoRollout => {
                write!(f, "bare pod has no rollout (restart.method: rollout)")
            }
            SkipReason::Downtime => write!(
                f,
                "no pod would stay ready during the restart (allowDowntime: false)"
            ),
            SkipReason::PdbBlocks { name } => write!(
                f,
                "PodDisruptionBudget {name} allows fewer disruptions than the restart takes at once"
            ),
            SkipReason::PolicyCap { max } => write!(f, "maxPerRun {max} reached"),
            SkipReason::GlobalCap { max } => write!(f, "max bounces per run ({max}) reached"),
            SkipReason::Claimed { policy } => write!(f, "bounced this run by policy {policy}"),
            SkipReason::ClaimedInDryRun { policy } => {
                write!(f, "would be bounced this run by dry-run policy {policy}")
            }
            SkipReason::Suspended => write!(f, "policy suspended (spec.suspend: true)"),
            SkipReason::RestartPinned {
                manager,
                kustomization,
            } => {
                write!(
                    f,
                    "restartedAt is pinned by {manager} (server-side apply owner of the pod \
                     template's kubectl.kubernetes.io/restartedAt): its next apply would write its \
                     value back and roll the pods a second time, so no restart is written"
                )?;
                if let Some(k) = kustomization {
                    write!(f, "; Kustomization {k}")?;
                }
                write!(
                    f,
                    "; remove the annotation from the applied manifest (Git), or set \
                     restart.onRevert: evict to evict the pods instead"
                )
            }
            SkipReason::RevertedSince {
                manager,
                written,
                found,
            } => write!(
                f,
                "reverted after the run: bouncer's restart ({written}) was replaced by {} \
                 written by {manager}; no restart is written while {manager} owns \
                 kubectl.kubernetes.io/restartedAt (restart.onRevert: evict evicts instead)",
                found.as_deref().unwrap_or("no restartedAt")
            ),
            SkipReason::BadAttemptMark { error } => write!(
                f,
                "unreadable attempt mark ({}): {error}",
                crate::core::literals::ATTEMPT_ANNOTATION
            ),
            SkipReason::RestartedMeanwhile => write!(f, "restarted by someone else since the plan"),
            SkipReason::InFlight {
                target,
                since,
                until,
            } => write!(
                f,
                "the bounce of {target} that an earlier run started at {} has not finished rolling: no other bounce starts beside it (until it completes, or its timeout passes at {})",
                rfc3339(*since),
                rfc3339(*until)
            ),
            SkipReason::RequestLeft { server, since } => write!(
                f,
                "an earlier run asked MCPServer {server} for a restart at {} and was stopped before it saw the operator act; the operator did not act within the bounce's timeout, so a run withdraws the request before any bounce (while the MCPServer holds it unprocessed) and records the attempt interrupted",
                rfc3339(*since)
            ),
            SkipReason::Replaced {
                was,
                now: Some(now),
            } => write!(
                f,
                "deleted and recreated since the plan (UID {was}, now {now}): the next run judges the new one"
            ),
            SkipReason::Replaced { was, now: None } => write!(
                f,
                "deleted and recreated since the fresh read: the API server refused the write for UID {was}, so nothing was written; the next run judges the new one"
            ),
            SkipReason::ReadFailed { error } => {
                write!(f, "could not re-read before acting: {error}")
            }
            SkipReason::InvalidOverride {
                annotation,
                value,
                problem,
            } => write!(f, "invalid override: {annotation}={value:?}: {problem}"),
            SkipReason::GroupHeld { member, reason } => {
                write!(f, "group held by {member}: {reason}")
            }
            SkipReason::Blocked { alerts } => {
                write!(f, "blocked by blockWhen: {}", alerts.join(", "))
            }
            SkipReason::BlockerFailed { error } => {
                write!(f, "blocked: the blockWhen query failed ({error})")
            }
            SkipReason::RestartStrategy { server, strategy } => write!(
                f,
                "MCPServer {server} is annotated {}={strategy:?}: only a rolling restart is asked of its operator (immediate deletes every pod at once)",
                crate::core::literals::TOOLHIVE_RESTART_STRATEGY
            ),
            SkipReason::NotOperatorOwned { server, why } => {
                write!(f, "not the proxy Deployment of MCPServer {server}: {why}")
            }
        }
    }
}

/// What a memory state says, as the report and `explain` word it.
pub fn memory_text(m: &MemoryState) -> String {
    match m {
        MemoryState::Below { usage, threshold } => {
            format!(
                "memory {} <= {}",
                format_bytes(*usage),
                format_bytes(*threshold)
            )
        }
        MemoryState::OutsideWindow => "memory over threshold but outside the windows".to_string(),
        MemoryState::NoMetrics => "memory: metrics missing (no pod reported yet)".to_string(),
        MemoryState::NoLimit => "memory: no memory limit".to_string(),
        MemoryState::Unavailable(why) => format!("memory: metrics unavailable ({why})"),
        MemoryState::Over {
            pod,
            usage,
            threshold,
        } => format!(
            "memory ({pod} {} > {})",
            format_bytes(*usage),
            format_bytes(*threshold)
        ),
    }
}

/// What a schedule verdict says, as the report and `explain` word it.
pub fn schedule_text(s: &ScheduleVerdict) -> String {
    match s {
        ScheduleVerdict::Due { fired } => format!("schedule (fired {})", rfc3339(*fired)),
        ScheduleVerdict::AlreadyRestarted { fired } => {
            format!("schedule: restarted since {}", rfc3339(*fired))
        }
        ScheduleVerdict::AlreadyAttempted { fired, at } => {
            format!(
                "schedule: fire {} already attempted at {}",
                rfc3339(*fired),
                rfc3339(*at)
            )
        }
        ScheduleVerdict::Missed { fired } => {
            format!(
                "schedule: missed {} (past startingDeadline)",
                rfc3339(*fired)
            )
        }
        ScheduleVerdict::NoPods { .. } => "schedule: no pods".to_string(),
        ScheduleVerdict::NotYet => "schedule: not fired yet".to_string(),
    }
}

impl fmt::Display for NotDue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(m) = &self.memory {
            parts.push(match m {
                MemoryState::Over { .. } => "memory over threshold".to_string(),
                m => memory_text(m),
            });
        }
        for w in &self.history {
            parts.push(format!("memory.{}: {}", w.trigger, w.detail));
        }
        if let Some(s) = &self.schedule {
            parts.push(match s {
                ScheduleVerdict::Due { .. } => "schedule: not fired yet".to_string(),
                s => schedule_text(s),
            });
            if let Some(next) = self.next {
                parts.push(format!("next {}", rfc3339(next)));
            }
        }
        if parts.is_empty() {
            return write!(f, "not due");
        }
        write!(f, "not due: {}", parts.join("; "))
    }
}
