//! The gates every bounce passes, in the plan and again on the executor's fresh read: opt-outs,
//! cooldown, and the safety checks on the workload's current state.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use crate::core::disruption;
use crate::core::history::{self, Prometheus};
use crate::core::literals::EXCLUDE_ANNOTATION;
use crate::core::mark::AttemptMark;
use crate::core::model::{Kind, McpServerRef, Method, Pdb, UpdateStrategy, Workload};
use crate::core::pin;
use crate::core::policy::{OnRevert, Policy, RestartMethod};
use crate::core::reasons::{NotProxy, SkipReason};
use crate::core::rollout::{self, RolloutState};

/// Opt-outs and things bouncer never restarts.
pub fn identity_gates(
    policy: &Policy,
    w: &Workload,
    excluded_ns: &BTreeSet<String>,
) -> Result<(), SkipReason> {
    if excluded_ns.contains(&w.target.namespace) {
        return Err(SkipReason::NamespaceExcluded);
    }
    if let Some(value) = w.annotations.get(EXCLUDE_ANNOTATION)
        && excludes(value)
    {
        return Err(SkipReason::Excluded {
            value: value.clone(),
        });
    }
    if w.mirror {
        return Err(SkipReason::MirrorPod);
    }
    if let Some(what) = w.deleting {
        return Err(SkipReason::BeingDeleted(what));
    }
    if !policy.kinds.contains(&w.target.kind) {
        return Err(SkipReason::KindNotSelected {
            kind: w.target.kind,
        });
    }
    Ok(())
}

/// Whether a `bouncer.dev/exclude` value (on a workload or a namespace) opts out: every value
/// but `"false"` does, so that `"True"`, `"yes"` or a typo never bounce what someone meant to
/// protect (fail closed).
pub fn excludes(value: &str) -> bool {
    value != "false"
}

/// A value that is neither `"true"` nor `"false"`: it excludes, and the run warns about it.
pub fn unclear_exclude(value: &str) -> bool {
    value != "true" && value != "false"
}

/// When the workload may be bounced again: the cooldown since its last restart or attempt, then
/// what bouncer's past attempts say (the circuit breaker, the backoff after failures). The plan
/// and every re-check before acting read it, so a fresh mark holds as the planned one did.
pub fn cooldown(policy: &Policy, w: &Workload, now: DateTime<Utc>) -> Result<(), SkipReason> {
    since_restart(policy, w, now)?;
    crate::core::breaker::gates(policy, w, now)
}

/// Skip while the last restart (ours, kubectl's, or a fresh deploy) or bouncer's last attempt
/// (whatever its method and outcome) is younger than the cooldown.
pub fn since_restart(policy: &Policy, w: &Workload, now: DateTime<Utc>) -> Result<(), SkipReason> {
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
    if disruption::min_ready(w, method) < 1 && !policy.allow_downtime {
        return Err(SkipReason::Downtime);
    }
    pdb_gate(w, method, pdbs)?;
    Ok(method)
}

/// Every PodDisruptionBudget covering the workload's pods must allow what the restart takes away
/// at once: an eviction one pod, a rollout its resolved maxUnavailable (all of them for
/// Recreate). A surge-only rollout takes none (an old pod goes only once its replacement is
/// available) and passes. The Eviction API enforces a budget itself; a controller's rollout
/// does not, so bouncer does. `allowDowntime` does not lift this: a budget is its own promise.
fn pdb_gate(w: &Workload, method: Method, pdbs: &[Pdb]) -> Result<(), SkipReason> {
    let taken = disruption::taken_at_once(w, method);
    if taken < 1 {
        return Ok(());
    }
    let covering = pdbs.iter().filter(|pdb| {
        pdb.namespace == w.target.namespace
            && w.pods.iter().any(|p| pdb.selector.matches(&p.labels))
    });
    for pdb in covering {
        if pdb.disruptions_allowed < taken {
            return Err(SkipReason::PdbBlocks {
                name: pdb.name.clone(),
            });
        }
    }
    Ok(())
}

fn method_for(policy: &Policy, w: &Workload) -> Result<Method, SkipReason> {
    let rolls = match w.target.kind {
        Kind::Pod => false,
        Kind::Deployment => true,
        Kind::StatefulSet | Kind::DaemonSet => w.strategy != UpdateStrategy::OnDelete,
    };
    match (policy.restart.method, rolls) {
        (RestartMethod::Toolhive, true) if w.toolhive.server.is_some() => {
            operator_proxy(w).map(|_| Method::Toolhive)
        }
        (RestartMethod::Evict, _) | (RestartMethod::Auto | RestartMethod::Toolhive, false) => {
            Ok(Method::Evict)
        }
        (RestartMethod::Rollout, false) if w.target.kind == Kind::Pod => {
            Err(SkipReason::BarePodNoRollout)
        }
        (RestartMethod::Rollout, false) => Err(SkipReason::OnDelete),
        (_, true) => Ok(Method::Rollout),
    }
}

/// Before the triggers: what bouncer never restarts, and marks it cannot read.
pub fn admits(
    policy: &Policy,
    w: &Workload,
    excluded_ns: &BTreeSet<String>,
) -> Result<(), SkipReason> {
    identity_gates(policy, w, excluded_ns)?;
    if w.pods.is_empty() {
        return Err(SkipReason::NoPods);
    }
    if let AttemptMark::Unreadable(error) = &w.attempt {
        return Err(SkipReason::BadAttemptMark {
            error: error.clone(),
        });
    }
    Ok(())
}

/// How a bounce that passed the gates is carried out: its method, and why the pods are evicted
/// where the template would have been restarted (a restart another manager would undo).
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub method: Method,
    pub instead: Option<SkipReason>,
}

/// After the triggers: the cooldown, the safety checks on the workload's state, and the
/// policy's blocker. The planner's chain and every fresh read's before acting.
pub fn safety(
    policy: &Policy,
    w: &Workload,
    pdbs: &[Pdb],
    prometheus: &Prometheus,
    now: DateTime<Utc>,
) -> Result<Route, SkipReason> {
    cooldown(policy, w, now)?;
    let route = route(policy, w, pdbs, now)?;
    blocker(policy, prometheus)?;
    Ok(route)
}

/// The safety checks on the workload's state, and the method they leave. A restart another
/// manager would undo is not written; onRevert: evict bounces the pods without touching the
/// template, through an eviction's own checks.
pub fn route(
    policy: &Policy,
    w: &Workload,
    pdbs: &[Pdb],
    now: DateTime<Utc>,
) -> Result<Route, SkipReason> {
    let method = preflight(policy, w, pdbs)?;
    let undone = (method == Method::Rollout)
        .then(|| pin::undone(w, now))
        .flatten();
    match undone {
        None => Ok(Route {
            method,
            instead: None,
        }),
        Some(reason) if policy.restart.on_revert == OnRevert::Evict => Ok(Route {
            method: preflight(&evicting(policy), w, pdbs)?,
            instead: Some(reason),
        }),
        Some(reason) => Err(reason),
    }
}

/// The policy as an eviction bounce reads it.
pub fn evicting(policy: &Policy) -> Policy {
    let mut evicting = policy.clone();
    evicting.restart.method = RestartMethod::Evict;
    evicting
}

/// A policy's blockWhen holds back each of its bounces: any result, or no answer (fail closed).
pub fn blocker(policy: &Policy, prometheus: &Prometheus) -> Result<(), SkipReason> {
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

pub fn oldest_start(w: &Workload) -> Option<DateTime<Utc>> {
    w.pods.iter().filter_map(|p| p.started).min()
}

/// The MCPServer to ask for a restart of `proxy` (`restart.method: toolhive`), if `proxy` can be
/// the Deployment its operator rolls: the one named after the server (see `core::toolhive`).
/// The plan knows no UIDs; `toolhive::restart_request` checks the server's on the fresh read.
pub fn operator_proxy(proxy: &Workload) -> Result<Option<&McpServerRef>, SkipReason> {
    match &proxy.toolhive.server {
        Some(server) if server.name != proxy.target.name => Err(SkipReason::NotOperatorOwned {
            server: server.name.clone(),
            why: NotProxy::Name,
        }),
        server => Ok(server.as_deref()),
    }
}
