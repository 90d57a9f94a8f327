//! The backoff and the circuit breaker (`core::breaker`) as the planner applies them: which due
//! workloads a plan skips for their past attempts, and which Events a run records for them.

use std::time::Duration;

use super::*;
use crate::core::mark::{Attempt, AttemptHistory, AttemptOutcome};
use crate::core::notice::{Told, notices};
use crate::core::policy::Breaker;
use crate::core::reasons::SkipReason;

fn t(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_780_000_000 + secs, 0).unwrap()
}

/// A mark's attempts as (time, outcome), oldest first.
type Marks<'a> = &'a [(&'a str, &'a str)];

/// The Events a first run (nothing told yet) records for the plan's skips.
fn plan_events(skips: &[Skip]) -> Vec<(WorkloadRef, String)> {
    let skips = skips
        .iter()
        .map(|s| (&s.target, s.policy.as_str(), &s.reason));
    let (told, _) = notices(skips, &Told::new(), t(0));
    told.into_iter().map(|n| (n.target, n.note)).collect()
}

#[test]
fn one_event_per_refused_workload() {
    let target = |name: &str| WorkloadRef {
        kind: Kind::Deployment,
        namespace: "shop".into(),
        name: name.into(),
    };
    let skip = |name: &str, policy: &str, reason: SkipReason| Skip {
        policy: policy.into(),
        target: target(name),
        pods: 1,
        memory: None,
        group: None,
        reason,
    };
    let open = SkipReason::BreakerOpen {
        bounces: 3,
        max_bounces: 3,
        per: Duration::from_secs(86400),
        until: t(0),
    };
    let skips = [
        skip("api", "a", open.clone()),
        skip("api", "b", open.clone()),
        skip("web", "a", SkipReason::Paused),
        skip("db", "a", open),
    ];
    let got = plan_events(&skips);
    let names: Vec<&str> = got.iter().map(|(w, _)| w.name.as_str()).collect();
    assert_eq!(names, ["api", "db"]);
    assert!(
        got[0].1.starts_with(
            "not bounced by policy a: circuit breaker open: 3 bounces within 1day (breaker.maxBounces 3); closes after "
        ),
        "{}",
        got[0].1
    );
}

/// Hole 11 in the planner: a memory-due workload whose last attempt failed is skipped as
/// backing off, not bounced first as the most urgent, and the next one is bounced; a
/// workload at its breaker's limit is skipped `breakerOpen`; a group is held by either;
/// and a fire already attempted stays `notDue`, never a breaker skip (no Event for it).
#[test]
fn the_planner_backs_off_and_breaks_most_urgent_workloads() {
    use crate::core::plan::tests::{
        NOW, OLD, deployment, inventory, names, nightly, over, pod, policy, reason_of, run,
    };
    let mark = |attempts: &[(&str, &str)]| {
        let mut h = AttemptHistory::default();
        for (time, outcome) in attempts {
            let outcome: AttemptOutcome =
                serde_json::from_value(serde_json::json!(outcome)).unwrap();
            let a = Attempt::new(time.parse().unwrap(), "m", Method::Rollout);
            h = h.record(&a.with_outcome(outcome));
        }
        crate::core::mark::AttemptMark::Seen(Box::new(h))
    };
    let hot = |name: &str, mib: u64, attempts: &[(&str, &str)]| {
        let mut w = deployment("shop", name, "x", vec![pod(name, "x", OLD, Some(mib))]);
        w.attempt = mark(attempts);
        w
    };
    let mut p = over(policy("m", "x"), 100);
    p.cooldown = Duration::from_secs(3600);
    // NOW is 03:30. (name, usage MiB, attempts) -> expected skip code (None: bounced).
    #[rustfmt::skip]
    let cases: &[(&str, u64, Marks, Option<&str>)] = &[
        ("failed-90m-ago", 900, &[("2026-03-10T02:00:00Z", "failed")], Some("backingOff")),
        ("reverted-90m-ago", 800, &[("2026-03-10T02:00:00Z", "reverted")], Some("backingOff")),
        ("failed-3h-ago", 700, &[("2026-03-10T00:30:00Z", "failed")], None),
        ("bounced-90m-ago", 600, &[("2026-03-10T02:00:00Z", "bounced")], None),
        ("two-failed-3h-ago", 500, &[("2026-03-09T23:00:00Z", "failed"), ("2026-03-10T00:30:00Z", "failed")], Some("backingOff")),
        ("no-mark", 400, &[], None),
    ];
    let inv = inventory(
        cases
            .iter()
            .map(|(n, mib, attempts, _)| hot(n, *mib, attempts))
            .collect(),
    );
    let plan = run(&[p.clone()], &inv);
    let want_bounced: Vec<&str> = cases
        .iter()
        .filter(|c| c.3.is_none())
        .map(|c| c.0)
        .collect();
    assert_eq!(names(&plan), want_bounced);
    for (name, _, _, want) in cases.iter().filter(|c| c.3.is_some()) {
        assert_eq!(Some(reason_of(&plan, name).code()), *want, "{name}");
    }
    let reason = reason_of(&plan, "failed-90m-ago").to_string();
    assert_eq!(
        reason,
        "backing off: 1 failed or reverted attempt in a row, the last 2026-03-10T02:00:00Z; due again after 2026-03-10T04:00:00Z"
    );
    let _ = NOW;

    // The breaker: three attempts today, whatever their outcome, with maxBounces 3.
    p.breaker = Some(Breaker {
        max_bounces: 3,
        per: Duration::from_secs(86400),
    });
    let busy: &[(&str, &str)] = &[
        ("2026-03-09T20:00:00Z", "bounced"),
        ("2026-03-09T23:00:00Z", "bounced"),
        ("2026-03-10T01:00:00Z", "bounced"),
    ];
    let calm: &[(&str, &str)] = &[
        ("2026-03-09T01:00:00Z", "bounced"),
        ("2026-03-09T23:00:00Z", "bounced"),
        ("2026-03-10T01:00:00Z", "bounced"),
    ];
    let inv = inventory(vec![hot("busy", 900, busy), hot("calm", 800, calm)]);
    let plan = run(&[p.clone()], &inv);
    assert_eq!(names(&plan), ["calm"]);
    assert_eq!(
        reason_of(&plan, "busy").to_string(),
        "circuit breaker open: 3 bounces within 1day (breaker.maxBounces 3); closes after 2026-03-10T20:00:00Z"
    );
    assert_eq!(plan_events(&plan.skips).len(), 1);

    // A group is held by a member at its breaker's limit.
    let mut grouped = p.clone();
    grouped.group_by = Some("g".into());
    let member = |name: &str, attempts| {
        let mut w = hot(name, 900, attempts);
        w.template_labels = [
            ("app".to_string(), "x".to_string()),
            ("g".to_string(), "one".to_string()),
        ]
        .into_iter()
        .collect::<std::collections::BTreeMap<_, _>>()
        .into();
        w
    };
    let plan = run(
        &[grouped],
        &inventory(vec![member("a-busy", busy), member("b-calm", calm)]),
    );
    assert!(plan.bounces.is_empty(), "{:?}", names(&plan));
    assert_eq!(reason_of(&plan, "a-busy").code(), "breakerOpen");
    assert_eq!(reason_of(&plan, "b-calm").code(), "groupHeld");

    // A nightly fire already attempted (03:05) is not due, whatever the breaker says: no
    // breaker skip, so no Event for a workload that would not have been bounced anyway.
    let mut n = nightly(policy("n", "x"));
    n.cooldown = Duration::from_secs(60);
    n.breaker = p.breaker;
    let fired: &[(&str, &str)] = &[
        ("2026-03-09T20:00:00Z", "bounced"),
        ("2026-03-09T23:00:00Z", "bounced"),
        ("2026-03-10T03:05:00Z", "failed"),
    ];
    let plan = run(&[n], &inventory(vec![hot("db", 10, fired)]));
    assert_eq!(reason_of(&plan, "db").code(), "notDue");
    assert!(plan_events(&plan.skips).is_empty());
}

/// Fault 5: a new version (another pod template spec than the latest attempt was made on, a
/// fixed leak say) starts the backoff and the breaker over: the planner bounces it. The same
/// version, or one unknown on either side (a mark from before the digest was kept), stays held.
#[test]
fn a_new_version_starts_the_backoff_and_the_breaker_over() {
    use crate::core::plan::tests::{OLD, deployment, inventory, names, over, pod, policy, run};
    let mut p = over(policy("m", "x"), 100);
    p.cooldown = Duration::from_secs(3600);
    p.breaker = Some(Breaker {
        max_bounces: 3,
        per: Duration::from_secs(86400),
    });
    // Three failures tonight, the last 70 minutes ago (NOW is 03:30): past the cooldown, but
    // backing off (8 cooldowns) and at the breaker's limit.
    let hot = |name: &str, attempts_on: Option<u64>, now_on: Option<u64>| {
        let mut w = deployment("shop", name, "x", vec![pod(name, "x", OLD, Some(900))]);
        let h = ["00:40", "01:00", "02:20"]
            .iter()
            .fold(AttemptHistory::default(), |h, hm| {
                let at = format!("2026-03-10T{hm}:00Z").parse().unwrap();
                let a = Attempt::new(at, "m", Method::Rollout).on_template(attempts_on);
                h.record(&a.with_outcome(AttemptOutcome::Failed))
            });
        w.attempt = crate::core::mark::AttemptMark::Seen(Box::new(h));
        w.template_spec = now_on;
        w
    };
    let inv = inventory(vec![
        hot("a-new-image", Some(1), Some(2)),
        hot("b-same-image", Some(1), Some(1)),
        hot("c-old-mark", None, Some(2)),
        hot("d-unknown-now", Some(1), None),
    ]);
    let plan = run(&[p], &inv);
    assert_eq!(names(&plan), ["a-new-image"]);
}
