//! The gates every bounce passes, in the plan and again on the executor's fresh read: opt-outs,
//! cooldown, and the safety checks on the workload's current state.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use crate::core::literals::EXCLUDE_ANNOTATION;
use crate::core::model::{Kind, McpServerRef, Method, Pdb, UpdateStrategy, Workload};
use crate::core::policy::{Policy, RestartMethod};
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
        Method::Rollout | Method::Toolhive => w.min_ready_during_restart,
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
        server => Ok(server.as_ref()),
    }
}
