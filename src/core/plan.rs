//! The planner: a pure function from policies, inventory and `now` to an ordered plan in which
//! every workload a policy selects is either a bounce or a skip with its reason.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::core::history::{self, Prometheus};
use crate::core::literals::EXCLUDE_ANNOTATION;
use crate::core::mark::AttemptMark;
use crate::core::memory::{self, Evaluation, MemoryReading, MemoryState};
pub use crate::core::model::Method;
use crate::core::model::{Inventory, Kind, Pdb, UpdateStrategy, Workload, WorkloadRef};
use crate::core::policy::{OnRevert, Policy, RestartMethod};
use crate::core::reasons::{NotDue, SkipReason, Trigger};
use crate::core::rollout::{self, RolloutState};
use crate::core::schedule::ScheduleVerdict;
use crate::core::trend::{self, HistoryVerdicts};

#[derive(Debug, Clone)]
pub struct Bounce {
    pub policy: String,
    pub target: WorkloadRef,
    pub method: Method,
    pub triggers: Vec<Trigger>,
    pub pods: usize,
    pub memory: Option<MemoryReading>,
    /// The restartedAt annotation the plan saw; a different one before acting means someone
    /// else restarted the workload meanwhile.
    pub seen_restarted_at: Option<DateTime<Utc>>,
    pub timeout: Option<Duration>,
    pub on_revert: OnRevert,
    pub allow_downtime: bool,
    pub cooldown: Duration,
}

#[derive(Debug, Clone)]
pub struct Skip {
    pub policy: String,
    pub target: WorkloadRef,
    pub pods: usize,
    pub memory: Option<MemoryReading>,
    pub reason: SkipReason,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub now: DateTime<Utc>,
    /// In execution order.
    pub bounces: Vec<Bounce>,
    pub skips: Vec<Skip>,
    pub metrics_unavailable: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Limits {
    /// Global cap on bounces per run (`--max-bounces`).
    pub max_bounces: usize,
}

struct Candidate {
    bounce: Bounce,
    urgency: Option<f64>,
    oldest: Option<DateTime<Utc>>,
}

/// Decides the whole run without Prometheus (history triggers off, blockers block).
pub fn plan(
    policies: &[Policy],
    inventory: &Inventory,
    now: DateTime<Utc>,
    limits: &Limits,
) -> Plan {
    let off = Prometheus::off("no Prometheus configured (--prometheus-url)");
    plan_with(policies, inventory, &off, now, limits)
}

/// Decides the whole run. Policies are visited by name so the result is deterministic.
pub fn plan_with(
    policies: &[Policy],
    inventory: &Inventory,
    prometheus: &Prometheus,
    now: DateTime<Utc>,
    limits: &Limits,
) -> Plan {
    let mut policies: Vec<&Policy> = policies.iter().collect();
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    let metrics_unavailable = match &inventory.metrics {
        crate::core::model::MetricsState::Available => None,
        crate::core::model::MetricsState::Unavailable(why) => Some(why.clone()),
    };

    let mut candidates = Vec::new();
    let mut skips = Vec::new();
    for policy in &policies {
        for workload in &inventory.workloads {
            if !selects(policy, workload) {
                continue;
            }
            let (reading, memory) = memory::assess(
                policy.memory.as_ref(),
                &policy.windows,
                workload,
                &inventory.metrics,
                now,
            );
            let history = trend::assess_history(
                policy.memory.as_ref(),
                &policy.windows,
                workload,
                &prometheus.history,
                now,
            );
            let decided = decide(policy, workload, (memory, history), inventory, now)
                .and_then(|d| blocker(policy, prometheus).map(|()| d));
            match decided {
                Ok((method, triggers, urgency)) => candidates.push(Candidate {
                    bounce: Bounce {
                        policy: policy.name.clone(),
                        target: workload.target.clone(),
                        method,
                        triggers,
                        pods: workload.pods.len(),
                        memory: reading,
                        seen_restarted_at: workload.restarted_at,
                        timeout: policy.restart.timeout,
                        on_revert: policy.restart.on_revert,
                        allow_downtime: policy.allow_downtime,
                        cooldown: policy.cooldown,
                    },
                    urgency,
                    oldest: oldest_start(workload),
                }),
                Err(reason) => skips.push(Skip {
                    policy: policy.name.clone(),
                    target: workload.target.clone(),
                    pods: workload.pods.len(),
                    memory: reading,
                    reason,
                }),
            }
        }
        for pod in &inventory.unsupported {
            let in_scope =
                policy.namespaces.is_empty() || policy.namespaces.contains(&pod.namespace);
            if in_scope && policy.selector.matches(&pod.labels) {
                skips.push(Skip {
                    policy: policy.name.clone(),
                    target: WorkloadRef {
                        kind: Kind::Pod,
                        namespace: pod.namespace.clone(),
                        name: pod.pod.clone(),
                    },
                    pods: 1,
                    memory: None,
                    reason: SkipReason::UnsupportedOwner {
                        kind: pod.owner_kind.clone(),
                        name: pod.owner_name.clone(),
                    },
                });
            }
        }
    }

    // Most urgent first: highest memory/threshold ratio, then the oldest pods, then by name.
    candidates.sort_by(|a, b| {
        b.urgency
            .unwrap_or(0.0)
            .total_cmp(&a.urgency.unwrap_or(0.0))
            .then_with(|| cmp_oldest(a.oldest, b.oldest))
            .then_with(|| a.bounce.target.namespace.cmp(&b.bounce.target.namespace))
            .then_with(|| a.bounce.target.name.cmp(&b.bounce.target.name))
            .then_with(|| a.bounce.policy.cmp(&b.bounce.policy))
    });

    let mut bounces: Vec<Bounce> = Vec::new();
    let mut per_policy: BTreeMap<String, u32> = BTreeMap::new();
    let max_per_run: BTreeMap<&str, Option<u32>> = policies
        .iter()
        .map(|p| (p.name.as_str(), p.max_per_run))
        .collect();
    let mut chosen: BTreeMap<WorkloadRef, String> = BTreeMap::new();
    for c in candidates {
        let b = c.bounce;
        let reason = if let Some(by) = chosen.get(&b.target) {
            Some(SkipReason::Claimed { policy: by.clone() })
        } else if let Some(max) = max_per_run[b.policy.as_str()]
            .filter(|max| per_policy.get(&b.policy).copied().unwrap_or(0) >= *max)
        {
            Some(SkipReason::PolicyCap { max })
        } else if bounces.len() >= limits.max_bounces {
            Some(SkipReason::GlobalCap {
                max: limits.max_bounces,
            })
        } else {
            None
        };
        match reason {
            Some(reason) => skips.push(Skip {
                policy: b.policy,
                target: b.target,
                pods: b.pods,
                memory: b.memory,
                reason,
            }),
            None => {
                *per_policy.entry(b.policy.clone()).or_default() += 1;
                chosen.insert(b.target.clone(), b.policy.clone());
                bounces.push(b);
            }
        }
    }
    skips.sort_by(|a, b| (&a.target, &a.policy).cmp(&(&b.target, &b.policy)));
    Plan {
        now,
        bounces,
        skips,
        metrics_unavailable,
    }
}

/// A workload is selected when its pod template (or any of its pods) carries matching labels.
fn selects(policy: &Policy, w: &Workload) -> bool {
    let in_scope = policy.namespaces.is_empty() || policy.namespaces.contains(&w.target.namespace);
    in_scope
        && (policy.selector.matches(&w.template_labels)
            || w.pods.iter().any(|p| policy.selector.matches(&p.labels)))
}

type Decision = (Method, Vec<Trigger>, Option<f64>);

/// A policy's blockWhen holds back each of its bounces: any result, or no answer (fail closed).
fn blocker(policy: &Policy, prometheus: &Prometheus) -> Result<(), SkipReason> {
    let Some(query) = &policy.block_when else {
        return Ok(());
    };
    match prometheus.blocker(query) {
        Ok([]) => Ok(()),
        Ok(results) => Err(SkipReason::Blocked {
            alerts: history::result_names(results),
        }),
        Err(error) => Err(SkipReason::BlockerFailed { error }),
    }
}

fn decide(
    policy: &Policy,
    w: &Workload,
    memory: (Option<Evaluation>, HistoryVerdicts),
    inv: &Inventory,
    now: DateTime<Utc>,
) -> Result<Decision, SkipReason> {
    identity_gates(policy, w, &inv.excluded_namespaces)?;
    if w.pods.is_empty() {
        return Err(SkipReason::NoPods);
    }
    if let AttemptMark::Unreadable(error) = &w.attempt {
        return Err(SkipReason::BadAttemptMark {
            error: error.clone(),
        });
    }
    let (triggers, urgency) = match triggers(policy, w, memory, now) {
        // A fire held back only by our own recent attempt reads as the cooldown while that
        // lasts (the reason names the attempt's time); after it, the fire stays attempted.
        Err(SkipReason::NotDue(n))
            if matches!(n.schedule, Some(ScheduleVerdict::AlreadyAttempted { .. })) =>
        {
            cooldown(policy, w, now)?;
            return Err(SkipReason::NotDue(n));
        }
        other => other?,
    };
    cooldown(policy, w, now)?;
    let method = preflight(policy, w, &inv.pdbs)?;
    Ok((method, triggers, urgency))
}

/// Opt-outs and things bouncer never restarts.
pub fn identity_gates(
    policy: &Policy,
    w: &Workload,
    excluded_ns: &BTreeSet<String>,
) -> Result<(), SkipReason> {
    if excluded_ns.contains(&w.target.namespace) {
        return Err(SkipReason::NamespaceExcluded);
    }
    if w.annotations
        .get(EXCLUDE_ANNOTATION)
        .is_some_and(|v| v == "true")
    {
        return Err(SkipReason::Excluded);
    }
    if w.mirror {
        return Err(SkipReason::MirrorPod);
    }
    if !policy.kinds.contains(&w.target.kind) {
        return Err(SkipReason::KindNotSelected {
            kind: w.target.kind,
        });
    }
    Ok(())
}

fn triggers(
    policy: &Policy,
    w: &Workload,
    (eval, history): (Option<Evaluation>, HistoryVerdicts),
    now: DateTime<Utc>,
) -> Result<(Vec<Trigger>, Option<f64>), SkipReason> {
    let mut fired = history.fired;
    let mut not_due = NotDue {
        history: history.waiting,
        ..NotDue::default()
    };
    let urgency = eval.as_ref().and_then(|e| e.ratio);
    if let Some(eval) = eval {
        match eval.state {
            MemoryState::Over {
                pod,
                usage,
                threshold,
            } => fired.push(Trigger::Memory {
                pod,
                usage,
                threshold,
            }),
            other => not_due.memory = Some(other),
        }
    }
    if let Some(schedule) = &policy.schedule {
        match schedule.verdict(now, oldest_start(w)) {
            // bouncer's own mark at or after the fire: this fire was attempted (and failed, or
            // left pods old); it is not attempted again, whatever the cooldown.
            ScheduleVerdict::Due { fired: at } if w.attempt.time().is_some_and(|t| t >= at) => {
                not_due.schedule = Some(ScheduleVerdict::AlreadyAttempted {
                    fired: at,
                    at: w.attempt.time().unwrap_or(at),
                });
                not_due.next = schedule.next_fire(now);
            }
            ScheduleVerdict::Due { fired: at } => fired.push(Trigger::Schedule { fired: at }),
            verdict => {
                not_due.schedule = Some(verdict);
                not_due.next = schedule.next_fire(now);
            }
        }
    }
    if fired.is_empty() {
        Err(SkipReason::NotDue(not_due))
    } else {
        Ok((fired, urgency))
    }
}

/// Skip while the last restart (ours, kubectl's, or a fresh deploy) or bouncer's last attempt
/// (whatever its method and outcome) is younger than the cooldown.
pub fn cooldown(policy: &Policy, w: &Workload, now: DateTime<Utc>) -> Result<(), SkipReason> {
    let last = [w.restarted_at, oldest_start(w), w.attempt.time()]
        .into_iter()
        .flatten()
        .max();
    if let Some(last) = last {
        let until =
            last + chrono::Duration::from_std(policy.cooldown).unwrap_or(chrono::TimeDelta::MAX);
        if now < until {
            return Err(SkipReason::Cooldown { last, until });
        }
    }
    Ok(())
}

/// Safety checks on the workload's current state; also re-run on a fresh read before acting.
pub fn preflight(policy: &Policy, w: &Workload, pdbs: &[Pdb]) -> Result<Method, SkipReason> {
    let method = method_for(policy, w)?;
    if w.paused {
        return Err(SkipReason::Paused);
    }
    // A held partition is an operator's staged rollout: restarting would roll only part of the
    // workload, and the held pods would keep it due forever.
    let partition = w.status.rolling_update.partition();
    if w.target.kind == Kind::StatefulSet && partition > 0 {
        return Err(SkipReason::Partitioned { partition });
    }
    // OnDelete workloads always look rolled out; their updated count tells whether every pod
    // runs the current template. Evicting the others would deploy a change nobody rolled out.
    if method == Method::Evict
        && matches!(w.target.kind, Kind::StatefulSet | Kind::DaemonSet)
        && (w.status.updated < w.status.desired
            || w.status.generation > w.status.observed_generation)
    {
        return Err(SkipReason::PendingTemplate {
            updated: w.status.updated,
            desired: w.status.desired,
        });
    }
    if w.target.kind == Kind::Pod {
        let pod = &w.pods[0];
        if pod.deleting || !pod.ready {
            return Err(SkipReason::NotAvailable {
                ready: 0,
                desired: 1,
            });
        }
    } else {
        if let RolloutState::InProgress(detail) | RolloutState::Failed(detail) =
            rollout::state(w.target.kind, w.strategy, &w.status)
        {
            return Err(SkipReason::RolloutInProgress { detail });
        }
        let ready = w.pods.iter().filter(|p| p.ready && !p.deleting).count() as i32;
        if w.status.available.min(ready) < w.status.desired {
            return Err(SkipReason::NotAvailable {
                ready: w.status.available.min(ready),
                desired: w.status.desired,
            });
        }
    }
    let stays_ready = match method {
        Method::Rollout => w.min_ready_during_restart,
        Method::Evict => w.pods.iter().filter(|p| p.ready).count() as i32 - 1,
    };
    if stays_ready < 1 && !policy.allow_downtime {
        return Err(SkipReason::Downtime);
    }
    if method == Method::Evict {
        for pdb in pdbs.iter().filter(|p| p.namespace == w.target.namespace) {
            if pdb.disruptions_allowed < 1 && w.pods.iter().any(|p| pdb.selector.matches(&p.labels))
            {
                return Err(SkipReason::PdbBlocks {
                    name: pdb.name.clone(),
                });
            }
        }
    }
    Ok(method)
}

fn method_for(policy: &Policy, w: &Workload) -> Result<Method, SkipReason> {
    let rolls = match w.target.kind {
        Kind::Pod => false,
        Kind::Deployment => true,
        Kind::StatefulSet | Kind::DaemonSet => w.strategy != UpdateStrategy::OnDelete,
    };
    match (policy.restart.method, rolls) {
        (RestartMethod::Evict, _) | (RestartMethod::Auto, false) => Ok(Method::Evict),
        (RestartMethod::Rollout, false) if w.target.kind == Kind::Pod => {
            Err(SkipReason::BarePodNoRollout)
        }
        (RestartMethod::Rollout, false) => Err(SkipReason::OnDelete),
        (_, true) => Ok(Method::Rollout),
    }
}

pub fn oldest_start(w: &Workload) -> Option<DateTime<Utc>> {
    w.pods.iter().filter_map(|p| p.started).min()
}

fn cmp_oldest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> std::cmp::Ordering {
    match (a, b) {
        (Some(a), Some(b)) => a.cmp(&b),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "plan_prometheus_tests.rs"]
mod prometheus_tests;
