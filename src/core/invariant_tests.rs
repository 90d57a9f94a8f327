//! The one invariant the gates exist for, over generated workloads: when the gate chain lets a
//! restart proceed, the pods that stay ready while it runs are at least what the workload's
//! own rules and every PodDisruptionBudget covering it allow (at least one pod, unless
//! `allowDowntime`). The expectation is computed here, independently: the controllers' rounding
//! transcribed from k8s.io/kubernetes v1.36 in floating point as Go does it, the disruption
//! controller's budget arithmetic, nothing from `core::disruption`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::core::gates::{cooldown, identity_gates, preflight};
use crate::core::literals::{COOLDOWN_ANNOTATION, EXCLUDE_ANNOTATION, MEMORY_ABOVE_ANNOTATION};
use crate::core::model::{
    IntOrPercent, Kind, McpServerRef, Method, Pdb, RollingParams, RolloutStatus, StsRollingUpdate,
    UpdateStrategy, Workload,
};
use crate::core::overrides;
use crate::core::plan::tests::{NOW, OLD, deployment, labels, over, pod, policy, t};
use crate::core::policy::{OnRevert, Policy, RestartMethod};
use crate::core::reasons::SkipReason;
use crate::core::selector::Selector;

/// A PodDisruptionBudget as written: its spec, whether it selects the workload's pods, and
/// sometimes a status that lags its spec (the controller has not caught up).
#[derive(Debug, Clone)]
struct Budget {
    min_available: Option<IntOrPercent>,
    max_unavailable: Option<IntOrPercent>,
    covers: bool,
    stale_allowed: Option<i32>,
}

#[derive(Debug, Clone)]
struct Case {
    kind: Kind,
    replicas: i32,
    strategy: UpdateStrategy,
    rolling: RollingParams,
    partition: i32,
    ready: Vec<bool>,
    deleting: usize,
    budgets: Vec<Budget>,
    allow_downtime: bool,
    method: RestartMethod,
    on_revert: OnRevert,
    toolhive_owned: bool,
    annotations: BTreeMap<String, String>,
}

fn int_or_percent() -> impl Strategy<Value = IntOrPercent> {
    prop_oneof![
        (0..=14i32).prop_map(IntOrPercent::Int),
        prop_oneof![Just(0), Just(25), Just(50), Just(100), 0..=100i32]
            .prop_map(IntOrPercent::Percent),
    ]
}

fn budget() -> impl Strategy<Value = Budget> {
    (
        prop::option::of(int_or_percent()),
        prop::option::of(int_or_percent()),
        prop::bool::weighted(0.8),
        prop::option::weighted(0.2, 0..=3i32),
    )
        .prop_map(|(min, max, covers, stale_allowed)| Budget {
            // A budget sets one of the two (validation); with neither, maxUnavailable 0 is
            // not the default, minAvailable 1 is.
            min_available: if max.is_some() {
                None
            } else {
                min.or(Some(IntOrPercent::Int(1)))
            },
            max_unavailable: max,
            covers,
            stale_allowed,
        })
}

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    let exclude = prop::option::weighted(
        0.1,
        prop::sample::select(vec!["true", "false", "True", "yes", "1", ""]),
    );
    let above = prop::option::weighted(0.2, prop::sample::select(vec!["1", "256Mi", "4Gi"]));
    let cooldown = prop::option::weighted(0.2, prop::sample::select(vec!["1s", "1h", "2h"]));
    (exclude, above, cooldown).prop_map(|(e, a, c)| {
        [
            (EXCLUDE_ANNOTATION, e),
            (MEMORY_ABOVE_ANNOTATION, a),
            (COOLDOWN_ANNOTATION, c),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v?.to_string())))
        .collect()
    })
}

fn case() -> impl Strategy<Value = Case> {
    let shape = (
        prop::sample::select(Kind::ALL.to_vec()),
        0..=12i32,
        0..3usize,
        prop::option::weighted(0.7, int_or_percent()),
        prop::option::weighted(0.7, int_or_percent()),
        prop::option::weighted(0.15, 1..=3i32),
    );
    let pods = (
        prop::collection::vec(prop::bool::weighted(0.9), 12),
        0..=12usize,
    );
    let gates = (
        prop::collection::vec(budget(), 0..=2),
        any::<bool>(),
        prop::sample::select(vec![
            RestartMethod::Auto,
            RestartMethod::Rollout,
            RestartMethod::Evict,
            RestartMethod::Toolhive,
        ]),
        prop::sample::select(vec![OnRevert::Fail, OnRevert::Evict]),
        any::<bool>(),
        annotations(),
    );
    (shape, pods, gates).prop_map(
        |(
            (kind, replicas, strategy, max_surge, max_unavailable, partition),
            (ready, deleting),
            (budgets, allow_downtime, method, on_revert, toolhive_owned, annotations),
        )| {
            let replicas = if kind == Kind::Pod { 1 } else { replicas };
            let strategy = match (kind, strategy) {
                (_, 0) | (Kind::Pod, _) => UpdateStrategy::RollingUpdate,
                (Kind::Deployment, _) => UpdateStrategy::Recreate,
                _ => UpdateStrategy::OnDelete,
            };
            Case {
                kind,
                replicas,
                strategy,
                rolling: RollingParams {
                    max_surge,
                    max_unavailable,
                },
                partition: if kind == Kind::StatefulSet {
                    partition.unwrap_or(0)
                } else {
                    0
                },
                ready: ready[..replicas as usize].to_vec(),
                // Mostly none: one pod index in twelve, at most, is being deleted.
                deleting: deleting.saturating_sub(11),
                budgets,
                allow_downtime,
                method,
                on_revert,
                toolhive_owned,
                annotations,
            }
        },
    )
}

/// The workload as the edge would convert it: status consistent with its pods.
fn workload(c: &Case) -> Workload {
    let pods = (0..c.replicas as usize)
        .map(|i| {
            let mut p = pod(&format!("w-{i}"), "x", OLD, Some(100));
            p.ready = c.ready[i];
            p.deleting = c.deleting > 0 && i + 1 == c.deleting;
            p
        })
        .collect();
    let mut w = deployment("a", "w", "x", pods);
    let ready = c.ready.iter().filter(|r| **r).count() as i32;
    w.target.kind = c.kind;
    w.strategy = c.strategy;
    w.rolling = c.rolling;
    w.status = RolloutStatus {
        generation: 1,
        observed_generation: 1,
        desired: c.replicas,
        current: c.replicas,
        updated: c.replicas,
        ready,
        available: ready,
        rolling_update: if c.kind == Kind::StatefulSet {
            StsRollingUpdate::Set {
                partition: Some(c.partition),
            }
        } else {
            StsRollingUpdate::Unset
        },
        ..Default::default()
    };
    w.annotations = c.annotations.clone();
    if c.toolhive_owned && c.kind == Kind::Deployment {
        w.toolhive.server = Some(Box::new(McpServerRef {
            api_version: "toolhive.stacklok.dev/v1beta1".into(),
            name: "w".into(),
            uid: "server-uid".into(),
        }));
    }
    w
}

fn the_policy(c: &Case) -> Policy {
    let mut p = over(policy("p", "x"), 50);
    p.allow_downtime = c.allow_downtime;
    p.restart.method = c.method;
    p.restart.on_revert = c.on_revert;
    p
}

/// Go's `GetScaledValueFromIntOrPercent`, in floating point as Go computes it.
fn go_scaled(v: IntOrPercent, total: i32, round_up: bool) -> i32 {
    match v {
        IntOrPercent::Int(n) => n,
        IntOrPercent::Percent(p) => {
            let x = f64::from(p) * f64::from(total) / 100.0;
            (if round_up { x.ceil() } else { x.floor() }) as i32
        }
    }
}

/// How many pods the controller may have unavailable at once while it rolls the workload
/// (ResolveFenceposts, getStatefulSetMaxUnavailable, the DaemonSet's updatedDesiredNodeCounts).
fn controller_max_unavailable(c: &Case) -> i32 {
    let n = c.replicas;
    let r = c.rolling;
    let unavailable = match (c.kind, c.strategy) {
        (Kind::Deployment, UpdateStrategy::Recreate) => n,
        (Kind::Deployment, _) => {
            let surge = go_scaled(r.max_surge.unwrap_or(IntOrPercent::Percent(25)), n, true);
            let unavailable = go_scaled(
                r.max_unavailable.unwrap_or(IntOrPercent::Percent(25)),
                n,
                false,
            );
            if surge == 0 && unavailable == 0 {
                1
            } else {
                unavailable
            }
        }
        (Kind::StatefulSet, _) => {
            let u = go_scaled(r.max_unavailable.unwrap_or(IntOrPercent::Int(1)), n, false);
            if u < 1 { 1 } else { u }
        }
        (Kind::DaemonSet, _) => {
            let u = go_scaled(r.max_unavailable.unwrap_or(IntOrPercent::Int(1)), n, true);
            let s = go_scaled(r.max_surge.unwrap_or(IntOrPercent::Int(0)), n, true);
            if n > 0 && u == 0 && s == 0 { 1 } else { u }
        }
        (Kind::Pod, _) => n,
    };
    unavailable.min(n)
}

/// Ready pods that are not being deleted: what serves now, and what a budget counts healthy.
fn ready_now(c: &Case) -> i32 {
    (0..c.ready.len())
        .filter(|&i| c.ready[i] && !(c.deleting > 0 && i + 1 == c.deleting))
        .count() as i32
}

/// Pods that stay ready while the restart runs, by what the cluster does with the method.
fn stays_ready(c: &Case, method: Method) -> i32 {
    let ready_now = ready_now(c);
    let rolls = match c.kind {
        Kind::Pod => false,
        Kind::Deployment => true,
        _ => c.strategy != UpdateStrategy::OnDelete,
    };
    match method {
        // One pod at a time; the next waits for a ready replacement.
        Method::Evict => (ready_now - 1).max(0),
        // A restartedAt patch on a workload that does not roll replaces nothing.
        Method::Rollout | Method::Toolhive if !rolls => ready_now,
        Method::Rollout | Method::Toolhive => {
            ready_now.min(c.replicas - controller_max_unavailable(c))
        }
    }
}

/// The disruption controller: desiredHealthy from the spec (minAvailable percentages round
/// up; maxUnavailable is taken from the expected count), disruptionsAllowed = healthy - that.
fn disruptions_allowed(b: &Budget, expected: i32, healthy: i32) -> i32 {
    if let Some(allowed) = b.stale_allowed {
        return allowed;
    }
    let desired_healthy = match (b.min_available, b.max_unavailable) {
        (_, Some(max)) => expected - go_scaled(max, expected, true),
        (Some(min), None) => go_scaled(min, expected, true),
        (None, None) => 1,
    };
    (healthy - desired_healthy).max(0)
}

fn budgets(c: &Case) -> Vec<Pdb> {
    let healthy = ready_now(c);
    c.budgets
        .iter()
        .enumerate()
        .map(|(i, b)| Pdb {
            namespace: "a".into(),
            name: format!("pdb-{i}"),
            selector: Selector {
                match_labels: labels(&[("app", if b.covers { "x" } else { "other" })]),
                match_expressions: vec![],
            },
            disruptions_allowed: disruptions_allowed(b, c.replicas, healthy),
        })
        .collect()
}

/// The chain the plan and every re-check before acting run, in their order.
fn gate_chain(p: &Policy, w: &Workload, pdbs: &[Pdb]) -> Result<Method, SkipReason> {
    identity_gates(p, w, &BTreeSet::new())?;
    if w.pods.is_empty() {
        return Err(SkipReason::NoPods);
    }
    let p = overrides::effective(p, w)?;
    cooldown(&p, w, t(NOW))?;
    preflight(&p, w, pdbs)
}

#[derive(Default)]
struct Tally {
    proceeded: AtomicUsize,
    rollouts_with_unavailable: AtomicUsize,
    downtime: AtomicUsize,
    pdb_blocks: AtomicUsize,
}

/// Hole 1, 3 and the gates together: 10,000 generated workloads, none of them let through to
/// fewer ready pods than their rules and budgets allow.
#[test]
fn a_restart_never_leaves_fewer_ready_pods_than_the_rules_and_budgets_allow() {
    let tally = Arc::new(Tally::default());
    let mut runner = TestRunner::new(Config {
        // Pure functions and a fixed count: nothing to persist between runs.
        failure_persistence: None,
        ..Config::with_cases(10_000)
    });
    let seen = Arc::clone(&tally);
    runner
        .run(&case(), move |c| {
            let w = workload(&c);
            let pdbs = budgets(&c);
            match gate_chain(&the_policy(&c), &w, &pdbs) {
                Err(SkipReason::Downtime) => {
                    seen.downtime.fetch_add(1, Ordering::Relaxed);
                }
                Err(SkipReason::PdbBlocks { .. }) => {
                    seen.pdb_blocks.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {}
                Ok(method) => {
                    seen.proceeded.fetch_add(1, Ordering::Relaxed);
                    let stays = stays_ready(&c, method);
                    let ready_now = ready_now(&c);
                    if method != Method::Evict && stays < ready_now {
                        seen.rollouts_with_unavailable
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    if !c.allow_downtime {
                        prop_assert!(stays >= 1, "{method:?} leaves {stays} ready: {c:?}");
                    }
                    for (pdb, b) in pdbs.iter().zip(&c.budgets).filter(|(_, b)| b.covers) {
                        let floor = ready_now - pdb.disruptions_allowed;
                        prop_assert!(
                            stays >= floor,
                            "{method:?} leaves {stays} ready, {} allows {floor}: {b:?} {c:?}",
                            pdb.name
                        );
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    // The property is only as good as the cases that reach it.
    let count = |a: &AtomicUsize| a.load(Ordering::Relaxed);
    let (proceeded, unavailable) = (
        count(&tally.proceeded),
        count(&tally.rollouts_with_unavailable),
    );
    let (downtime, pdb) = (count(&tally.downtime), count(&tally.pdb_blocks));
    assert!(
        proceeded > 1_000 && unavailable > 300 && downtime > 300 && pdb > 300,
        "proceeded {proceeded}, rollouts taking pods {unavailable}, downtime {downtime}, pdbBlocks {pdb}"
    );
}
