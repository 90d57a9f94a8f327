//! Table tests of the safety gates: the opt-out's values, the bounds each controller resolves
//! from its strategy, the pods a restart leaves ready by kind and strategy, and the disruption
//! budgets a rollout or an eviction must fit in.

use std::collections::BTreeSet;

use crate::core::gates::{excludes, identity_gates, preflight, unclear_exclude};
use crate::core::literals::EXCLUDE_ANNOTATION;
use crate::core::model::{
    IntOrPercent, Kind, Method, Pdb, StsRollingUpdate, UpdateStrategy, Workload,
};
use crate::core::plan::tests::{OLD, deployment, labels, pod, policy};
use crate::core::policy::{Policy, RestartMethod};
use crate::core::reasons::SkipReason;
use crate::core::selector::Selector;

use IntOrPercent::{Int, Percent};

/// A fully available workload of `n` ready pods.
fn workload(kind: Kind, n: usize, strategy: UpdateStrategy) -> Workload {
    let pods = (0..n)
        .map(|i| pod(&format!("w-{i}"), "x", OLD, Some(100)))
        .collect();
    let mut w = deployment("a", "w", "x", pods);
    w.target.kind = kind;
    w.strategy = strategy;
    if kind == Kind::StatefulSet {
        w.status.rolling_update = StsRollingUpdate::Set { partition: Some(0) };
    }
    w
}

fn with(
    mut w: Workload,
    surge: Option<IntOrPercent>,
    unavailable: Option<IntOrPercent>,
) -> Workload {
    w.rolling.max_surge = surge;
    w.rolling.max_unavailable = unavailable;
    w
}

fn budget(namespace: &str, app: &str, allowed: i32) -> Pdb {
    Pdb {
        namespace: namespace.into(),
        name: format!("{app}-pdb"),
        selector: Selector {
            match_labels: labels(&[("app", app)]),
            match_expressions: vec![],
        },
        disruptions_allowed: allowed,
    }
}

fn strict() -> Policy {
    policy("p", "x")
}

fn downtime_allowed() -> Policy {
    let mut p = policy("p", "x");
    p.allow_downtime = true;
    p
}

/// Hole 8: any value but "false" opts out; values other than "true" and "false" are named
/// in the reason (and warned about by the snapshot).
#[test]
fn every_exclude_value_but_false_opts_out() {
    let p = strict();
    for (value, excluded, unclear) in [
        ("true", true, false),
        ("false", false, false),
        ("True", true, true),
        ("yes", true, true),
        ("1", true, true),
        ("", true, true),
        (" false", true, true),
        ("FALSE", true, true),
    ] {
        assert_eq!(
            (excludes(value), unclear_exclude(value)),
            (excluded, unclear),
            "{value:?}"
        );
        let mut w = workload(Kind::Deployment, 2, UpdateStrategy::RollingUpdate);
        w.annotations
            .insert(EXCLUDE_ANNOTATION.into(), value.into());
        let got = identity_gates(&p, &w, &BTreeSet::new());
        if !excluded {
            assert_eq!(got, Ok(()), "{value:?}");
            continue;
        }
        let reason = got.unwrap_err();
        assert_eq!(
            reason,
            SkipReason::Excluded {
                value: value.into()
            }
        );
        let text = reason.to_string();
        if unclear {
            assert!(
                text.contains(&format!("{value:?}")) && text.contains("fail closed"),
                "{text}"
            );
        } else {
            assert_eq!(text, "annotated bouncer.dev/exclude=true");
        }
    }
}

/// Hole 1 and its siblings: what the controller's own strategy takes away, rounded as it
/// rounds, decides the downtime gate.
#[test]
fn the_pods_a_rollout_leaves_ready_follow_the_controllers_rounding() {
    use UpdateStrategy::{OnDelete, Recreate, RollingUpdate};
    let sts = |n, u| with(workload(Kind::StatefulSet, n, RollingUpdate), None, u);
    let deploy = |n, s, u| with(workload(Kind::Deployment, n, RollingUpdate), s, u);
    let ds = |n, s, u| with(workload(Kind::DaemonSet, n, RollingUpdate), s, u);
    let cases: Vec<(&str, Workload, Result<Method, SkipReason>)> = vec![
        (
            "sts default: one at a time",
            sts(3, None),
            Ok(Method::Rollout),
        ),
        (
            "sts maxUnavailable = replicas",
            sts(3, Some(Int(3))),
            Err(SkipReason::Downtime),
        ),
        (
            "sts maxUnavailable over replicas",
            sts(2, Some(Int(5))),
            Err(SkipReason::Downtime),
        ),
        (
            "sts maxUnavailable 2 of 3",
            sts(3, Some(Int(2))),
            Ok(Method::Rollout),
        ),
        (
            "sts 100%",
            sts(3, Some(Percent(100))),
            Err(SkipReason::Downtime),
        ),
        // 66% of 3 = 1.98, rounded down to 1: two stay.
        (
            "sts 66% rounds down",
            sts(3, Some(Percent(66))),
            Ok(Method::Rollout),
        ),
        // 10% of 1 rounds down to 0, and at least 1 is taken.
        (
            "sts single replica",
            sts(1, Some(Percent(10))),
            Err(SkipReason::Downtime),
        ),
        (
            "deploy defaults, one replica: surge",
            deploy(1, None, None),
            Ok(Method::Rollout),
        ),
        (
            "deploy 100% unavailable",
            deploy(4, None, Some(Percent(100))),
            Err(SkipReason::Downtime),
        ),
        // 75% of 4 = 3 (down): one stays.
        (
            "deploy 75%",
            deploy(4, None, Some(Percent(75))),
            Ok(Method::Rollout),
        ),
        // Both round to 0: the controller takes one anyway.
        (
            "deploy 0/0 single",
            deploy(1, Some(Percent(0)), Some(Percent(10))),
            Err(SkipReason::Downtime),
        ),
        (
            "deploy surge only",
            deploy(1, Some(Int(1)), Some(Int(0))),
            Ok(Method::Rollout),
        ),
        (
            "deploy Recreate",
            workload(Kind::Deployment, 3, Recreate),
            Err(SkipReason::Downtime),
        ),
        // 34% of 3 = 1.02, rounded up to 2: one stays.
        (
            "ds 34% rounds up",
            ds(3, None, Some(Percent(34))),
            Ok(Method::Rollout),
        ),
        (
            "ds 67% rounds up to all",
            ds(3, None, Some(Percent(67))),
            Err(SkipReason::Downtime),
        ),
        (
            "ds single node, surge",
            ds(1, Some(Int(1)), Some(Int(0))),
            Ok(Method::Rollout),
        ),
        (
            "ds single node, default",
            ds(1, None, None),
            Err(SkipReason::Downtime),
        ),
        (
            "ondelete sts evicts one of two",
            workload(Kind::StatefulSet, 2, OnDelete),
            Ok(Method::Evict),
        ),
        (
            "ondelete sts of one",
            workload(Kind::StatefulSet, 1, OnDelete),
            Err(SkipReason::Downtime),
        ),
    ];
    for (name, w, want) in cases {
        assert_eq!(preflight(&strict(), &w, &[]), want, "{name}");
        // allowDowntime lifts exactly the downtime gate.
        let lifted = preflight(&downtime_allowed(), &w, &[]);
        assert!(lifted.is_ok(), "{name}: {lifted:?}");
    }
}

/// Hole 3: a budget covering the workload must allow what the restart takes at once: a
/// rollout its resolved maxUnavailable (all pods for Recreate), an eviction one pod; a
/// surge-only rollout takes none and passes an exhausted budget.
#[test]
fn a_restart_fits_in_every_covering_disruption_budget() {
    use UpdateStrategy::{OnDelete, Recreate, RollingUpdate};
    let rolling = |u| {
        with(
            workload(Kind::Deployment, 4, RollingUpdate),
            Some(Int(0)),
            Some(Int(u)),
        )
    };
    let surge_only = with(
        workload(Kind::Deployment, 4, RollingUpdate),
        Some(Int(1)),
        Some(Int(0)),
    );
    let blocked = |app: &str| {
        Err(SkipReason::PdbBlocks {
            name: format!("{app}-pdb"),
        })
    };
    type Case = (
        &'static str,
        Workload,
        Vec<Pdb>,
        Policy,
        Result<Method, SkipReason>,
    );
    let cases: Vec<Case> = vec![
        (
            "rollout, exhausted budget",
            rolling(1),
            vec![budget("a", "x", 0)],
            strict(),
            blocked("x"),
        ),
        (
            "rollout, budget allows one",
            rolling(1),
            vec![budget("a", "x", 1)],
            strict(),
            Ok(Method::Rollout),
        ),
        (
            "rollout of two, budget allows one",
            rolling(2),
            vec![budget("a", "x", 1)],
            strict(),
            blocked("x"),
        ),
        (
            "rollout of two, budget allows two",
            rolling(2),
            vec![budget("a", "x", 2)],
            strict(),
            Ok(Method::Rollout),
        ),
        (
            "surge only, exhausted budget",
            surge_only,
            vec![budget("a", "x", 0)],
            strict(),
            Ok(Method::Rollout),
        ),
        (
            "Recreate, downtime allowed, budget allows three of four",
            workload(Kind::Deployment, 4, Recreate),
            vec![budget("a", "x", 3)],
            downtime_allowed(),
            blocked("x"),
        ),
        (
            "budget selecting other pods",
            rolling(1),
            vec![budget("a", "y", 0)],
            strict(),
            Ok(Method::Rollout),
        ),
        (
            "budget in another namespace",
            rolling(1),
            vec![budget("b", "x", 0)],
            strict(),
            Ok(Method::Rollout),
        ),
        (
            "one of two budgets exhausted",
            rolling(1),
            vec![budget("a", "x", 5), {
                let mut b = budget("a", "x", 0);
                b.name = "tight".into();
                b
            }],
            strict(),
            Err(SkipReason::PdbBlocks {
                name: "tight".into(),
            }),
        ),
        (
            "eviction, exhausted budget",
            workload(Kind::StatefulSet, 3, OnDelete),
            vec![budget("a", "x", 0)],
            strict(),
            blocked("x"),
        ),
        (
            "eviction, budget allows one",
            workload(Kind::StatefulSet, 3, OnDelete),
            vec![budget("a", "x", 1)],
            strict(),
            Ok(Method::Evict),
        ),
    ];
    for (name, w, pdbs, p, want) in cases {
        assert_eq!(preflight(&p, &w, &pdbs), want, "{name}");
    }
    // The same budget holds back the operator's rollout of an MCPServer's Deployment.
    let mut owned = rolling(1);
    owned.toolhive.server = Some(Box::new(crate::core::model::McpServerRef {
        api_version: "toolhive.stacklok.dev/v1beta1".into(),
        name: "w".into(),
        uid: "server-uid".into(),
    }));
    let mut p = strict();
    p.restart.method = RestartMethod::Toolhive;
    assert_eq!(preflight(&p, &owned, &[]), Ok(Method::Toolhive));
    assert_eq!(preflight(&p, &owned, &[budget("a", "x", 0)]), blocked("x"));
}

/// `core::disruption` alone: the controllers' rounding.
mod bounds {
    use crate::core::disruption::{rollout_bounds, scaled};
    use crate::core::model::RollingParams;
    use crate::core::model::{IntOrPercent, Kind, UpdateStrategy};
    use crate::core::plan::tests::{OLD, deployment, pod};
    use IntOrPercent::{Int, Percent};

    fn bounds(
        kind: Kind,
        strategy: UpdateStrategy,
        n: usize,
        surge: Option<IntOrPercent>,
        unavailable: Option<IntOrPercent>,
    ) -> Option<(i32, i32)> {
        let pods = (0..n)
            .map(|i| pod(&format!("w-{i}"), "x", OLD, None))
            .collect();
        let mut w = deployment("a", "w", "x", pods);
        w.target.kind = kind;
        w.strategy = strategy;
        w.rolling = RollingParams {
            max_surge: surge,
            max_unavailable: unavailable,
        };
        rollout_bounds(&w).map(|b| (b.max_unavailable, b.max_surge))
    }

    /// (maxUnavailable, maxSurge) as k8s.io/kubernetes v1.36's controllers resolve them.
    #[test]
    fn bounds_resolve_as_the_controllers_do() {
        use Kind::{DaemonSet, Deployment, Pod, StatefulSet};
        use UpdateStrategy::{OnDelete, Recreate, RollingUpdate};
        let cases = [
            // Deployment: 25%/25% by default, surge up, unavailable down.
            (Deployment, RollingUpdate, 10, None, None, Some((2, 3))),
            (Deployment, RollingUpdate, 1, None, None, Some((0, 1))),
            (
                Deployment,
                RollingUpdate,
                3,
                Some(Percent(0)),
                Some(Percent(10)),
                Some((1, 0)),
            ),
            (
                Deployment,
                RollingUpdate,
                3,
                Some(Int(2)),
                Some(Int(9)),
                Some((3, 2)),
            ),
            (
                Deployment,
                Recreate,
                3,
                Some(Int(2)),
                Some(Int(0)),
                Some((3, 0)),
            ),
            // StatefulSet: default 1, percentages down, at least 1, no surge.
            (StatefulSet, RollingUpdate, 5, None, None, Some((1, 0))),
            (
                StatefulSet,
                RollingUpdate,
                5,
                None,
                Some(Percent(10)),
                Some((1, 0)),
            ),
            (
                StatefulSet,
                RollingUpdate,
                5,
                None,
                Some(Percent(50)),
                Some((2, 0)),
            ),
            (
                StatefulSet,
                RollingUpdate,
                5,
                None,
                Some(Int(5)),
                Some((5, 0)),
            ),
            (StatefulSet, OnDelete, 5, None, Some(Int(5)), None),
            // DaemonSet: default 1 and 0, both round up, both zero means 1.
            (DaemonSet, RollingUpdate, 5, None, None, Some((1, 0))),
            (
                DaemonSet,
                RollingUpdate,
                5,
                None,
                Some(Percent(10)),
                Some((1, 0)),
            ),
            (
                DaemonSet,
                RollingUpdate,
                5,
                None,
                Some(Percent(30)),
                Some((2, 0)),
            ),
            (
                DaemonSet,
                RollingUpdate,
                5,
                Some(Percent(10)),
                Some(Int(0)),
                Some((0, 1)),
            ),
            (
                DaemonSet,
                RollingUpdate,
                5,
                Some(Int(0)),
                Some(Int(0)),
                Some((1, 0)),
            ),
            (Pod, RollingUpdate, 1, None, None, None),
        ];
        for (kind, strategy, n, surge, unavailable, want) in cases {
            assert_eq!(
                bounds(kind, strategy, n, surge, unavailable),
                want,
                "{kind} {strategy:?} {n} surge {surge:?} unavailable {unavailable:?}"
            );
        }
    }

    #[test]
    fn scaled_rounds_like_go() {
        assert_eq!(scaled(Percent(34), 3, true), 2);
        assert_eq!(scaled(Percent(34), 3, false), 1);
        assert_eq!(scaled(Percent(100), 7, false), 7);
        assert_eq!(scaled(Percent(0), 7, true), 0);
        assert_eq!(scaled(Int(4), 2, true), 4);
    }
}

/// Issue 40: a restartedAt an applier owns is never written. `onRevert: evict` evicts instead,
/// through eviction's own preflight (a budget with no room still holds it back); `fail` skips,
/// naming the owner.
#[test]
fn a_pinned_restart_is_routed_to_eviction_or_skipped() {
    use crate::core::gates::route;
    use crate::core::pin::{RestartOwner, RestartOwners};
    use crate::core::policy::OnRevert;

    let mut w = workload(Kind::Deployment, 3, UpdateStrategy::RollingUpdate);
    w.restart_owners = Some(Box::new(RestartOwners {
        owners: vec![RestartOwner {
            manager: "kustomize-controller".into(),
            apply: true,
        }],
        kustomization: Some("flux-system/apps".into()),
    }));
    let now = "2026-12-06T12:00:00Z".parse().unwrap();
    let pinned = SkipReason::RestartPinned {
        manager: "kustomize-controller".into(),
        kustomization: Some("flux-system/apps".into()),
    };

    let mut fail = strict();
    fail.restart.on_revert = OnRevert::Fail;
    assert_eq!(route(&fail, &w, &[], now), Err(pinned.clone()));

    let mut evict = strict();
    evict.restart.on_revert = OnRevert::Evict;
    let routed = route(&evict, &w, &[budget("a", "x", 1)], now).unwrap();
    assert_eq!(
        (routed.method, routed.instead),
        (Method::Evict, Some(pinned))
    );
    let full = route(&evict, &w, &[budget("a", "x", 0)], now);
    assert!(
        matches!(full, Err(SkipReason::PdbBlocks { .. })),
        "{full:?}"
    );

    // An Update owner (an operator) is not known to revert until it did: the restart is written.
    w.restart_owners.as_mut().unwrap().owners[0].apply = false;
    let held = route(&fail, &w, &[], now).unwrap();
    assert_eq!((held.method, held.instead), (Method::Rollout, None));
}
