//! How many of a workload's pods a restart takes away at once, and so how many stay ready
//! while it runs: from the numbers its update strategy sets (replicas, maxSurge,
//! maxUnavailable, Recreate), rounded as each controller rounds them (k8s.io/kubernetes
//! v1.36 `pkg/controller/{deployment,statefulset,daemon}`).

use crate::core::model::{IntOrPercent, Kind, Method, UpdateStrategy, Workload};

/// What a controller's rolling update may do at once, resolved against the replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RolloutBounds {
    /// Pods it may take away before their replacements are available.
    pub max_unavailable: i32,
    /// Pods it may add above the replicas (new ones started before old ones go).
    pub max_surge: i32,
}

/// `GetScaledValueFromIntOrPercent`: a count as written, a percentage of `total` rounded up
/// or down.
pub fn scaled(v: IntOrPercent, total: i32, round_up: bool) -> i32 {
    match v {
        IntOrPercent::Int(n) => n,
        IntOrPercent::Percent(p) => {
            let x = i64::from(p) * i64::from(total);
            let q = if round_up {
                x.div_euclid(100) + i64::from(x.rem_euclid(100) != 0)
            } else {
                x.div_euclid(100)
            };
            q.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
        }
    }
}

/// The bounds the workload's controller applies when it rolls its pods; `None` where a
/// template change replaces no pod (OnDelete, a bare pod).
pub fn rollout_bounds(w: &Workload) -> Option<RolloutBounds> {
    let replicas = w.status.desired.max(0);
    let r = w.rolling;
    let (unavailable, surge) = match (w.target.kind, w.strategy) {
        (Kind::Pod, _) | (_, UpdateStrategy::OnDelete) => return None,
        // Recreate: every old pod goes before a new one starts.
        (Kind::Deployment, UpdateStrategy::Recreate) => (replicas, 0),
        // ResolveFenceposts: surge rounds up, unavailable down, both default 25%; both zero
        // (a percentage rounded away) means one unavailable.
        (Kind::Deployment, _) => {
            let surge = scaled(
                r.max_surge.unwrap_or(IntOrPercent::Percent(25)),
                replicas,
                true,
            );
            let unavailable = scaled(
                r.max_unavailable.unwrap_or(IntOrPercent::Percent(25)),
                replicas,
                false,
            );
            if surge <= 0 && unavailable <= 0 {
                (1, 0)
            } else {
                (unavailable, surge)
            }
        }
        // getStatefulSetMaxUnavailable: default 1, a percentage rounds down, at least 1. The
        // field is honoured by controllers with the MaxUnavailableStatefulSet feature (beta,
        // off by default in v1.36; the API server drops it where the gate is off): where the
        // spec carries it, bouncer assumes the controller honours it, the careful reading.
        (Kind::StatefulSet, _) => (
            scaled(
                r.max_unavailable.unwrap_or(IntOrPercent::Int(1)),
                replicas,
                false,
            )
            .max(1),
            0,
        ),
        // UnavailableCount / SurgeCount: both round up; both zero means one unavailable.
        (Kind::DaemonSet, _) => {
            let unavailable = scaled(
                r.max_unavailable.unwrap_or(IntOrPercent::Int(1)),
                replicas,
                true,
            );
            let surge = scaled(r.max_surge.unwrap_or(IntOrPercent::Int(0)), replicas, true);
            if replicas > 0 && unavailable <= 0 && surge <= 0 {
                (1, 0)
            } else {
                (unavailable, surge)
            }
        }
    };
    Some(RolloutBounds {
        max_unavailable: unavailable.clamp(0, replicas),
        max_surge: surge.max(0),
    })
}

/// Pods of the workload that are ready now (a pod being deleted is already going).
pub fn ready_now(w: &Workload) -> i32 {
    w.pods.iter().filter(|p| p.ready && !p.deleting).count() as i32
}

/// How many of the workload's pods the restart takes away at once: what every covering
/// PodDisruptionBudget must allow. A surge-only rollout takes none: the controller removes an
/// old pod only once its replacement is available.
pub fn taken_at_once(w: &Workload, method: Method) -> i32 {
    match method {
        Method::Evict => i32::from(ready_now(w) > 0),
        // The operator restarts through the same Deployment rollout.
        Method::Rollout | Method::Toolhive => rollout_bounds(w).map_or(0, |b| b.max_unavailable),
    }
}

/// Pods that stay ready while the restart runs: the replicas less what a rollout may take
/// away, or the ready pods less the one being evicted.
pub fn min_ready(w: &Workload, method: Method) -> i32 {
    match method {
        Method::Evict => (ready_now(w) - 1).max(0),
        Method::Rollout | Method::Toolhive => match rollout_bounds(w) {
            Some(b) => w.status.desired.max(0) - b.max_unavailable,
            None => 0,
        },
    }
}
