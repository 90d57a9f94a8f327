//! Table tests of the gates this module decides: the opt-out's values, the pods a restart
//! leaves ready by kind and strategy, and the disruption budgets a rollout or an eviction
//! must fit in.

use std::collections::BTreeSet;

use super::{excludes, identity_gates, preflight, unclear_exclude};
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
    owned.toolhive.server = Some(crate::core::model::McpServerRef {
        api_version: "toolhive.stacklok.dev/v1beta1".into(),
        name: "w".into(),
    });
    let mut p = strict();
    p.restart.method = RestartMethod::Toolhive;
    assert_eq!(preflight(&p, &owned, &[]), Ok(Method::Toolhive));
    assert_eq!(preflight(&p, &owned, &[budget("a", "x", 0)]), blocked("x"));
}
