//! Per-workload override annotations, alone and in the planner.

use std::collections::BTreeMap;
use std::time::Duration;

use std::borrow::Cow;

use crate::core::literals::{
    COOLDOWN_ANNOTATION, MEMORY_ABOVE_ANNOTATION, PERCENT_OF_LIMIT_ANNOTATION,
};
use crate::core::model::Workload;
use crate::core::overrides::effective;
use crate::core::policy::parse_str;
use crate::core::policy::{OverrideBounds, Policy, Threshold};

fn policy(memory: bool) -> Policy {
    let triggers = if memory {
        "{memory: {above: 1Gi}, schedule: {cron: '0 3 * * *'}}"
    } else {
        "{schedule: {cron: '0 3 * * *'}}"
    };
    let text = format!(
        "apiVersion: bouncer.dev/v1alpha1\nkind: BouncePolicy\nmetadata: {{name: p}}\n\
         spec: {{target: {{selector: {{matchLabels: {{app: x}}}}}}, triggers: {triggers}, cooldown: 6h}}\n"
    );
    parse_str("p.yaml", &text).unwrap().remove(0)
}

fn workload(annotations: &[(&str, &str)]) -> Workload {
    let mut w = super::tests::deployment("a", "w", "x", vec![]);
    w.annotations = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<BTreeMap<_, _>>();
    w
}

#[test]
fn annotations_replace_threshold_and_cooldown_for_that_workload_only() {
    let mut p = policy(true);
    // The policy lets annotations shorten its 6h cooldown to 30m (the threshold only rises).
    p.overrides.min_cooldown = Some(Duration::from_secs(1800));
    assert!(matches!(
        effective(&p, &workload(&[])),
        Ok(Cow::Borrowed(_))
    ));
    let w = workload(&[
        (MEMORY_ABOVE_ANNOTATION, "2Gi"),
        (COOLDOWN_ANNOTATION, "30m"),
    ]);
    let e = effective(&p, &w).unwrap();
    let memory = e.memory.as_ref().expect("memory trigger");
    assert_eq!(
        (memory.threshold, &memory.container),
        (Some(Threshold::Bytes(2 << 30)), &None)
    );
    assert_eq!(e.cooldown, Duration::from_secs(1800));
    assert_eq!(
        p.cooldown,
        Duration::from_secs(6 * 3600),
        "the policy is unchanged"
    );
    p.overrides.min_percent_of_limit = Some(70.0);
    let w = workload(&[(PERCENT_OF_LIMIT_ANNOTATION, "70")]);
    assert_eq!(
        effective(&p, &w)
            .unwrap()
            .memory
            .as_ref()
            .unwrap()
            .threshold,
        Some(Threshold::PercentOfLimit(70.0))
    );
    // A threshold override adds no memory trigger to a schedule-only policy.
    let schedule_only = policy(false);
    let w = workload(&[(MEMORY_ABOVE_ANNOTATION, "2Gi")]);
    assert_eq!(effective(&schedule_only, &w).unwrap().memory, None);
}

#[test]
fn a_bad_value_is_a_skip_naming_the_annotation() {
    let p = policy(true);
    let cases = [
        (
            vec![(MEMORY_ABOVE_ANNOTATION, "1GB")],
            "invalid override: bouncer.dev/memory-above=\"1GB\": ",
        ),
        (
            vec![(MEMORY_ABOVE_ANNOTATION, "0")],
            "invalid override: bouncer.dev/memory-above=\"0\": must be more than 0 bytes",
        ),
        (
            vec![(PERCENT_OF_LIMIT_ANNOTATION, "150")],
            "invalid override: bouncer.dev/memory-percent-of-limit=\"150\": must be more than 0 and at most 100",
        ),
        (
            vec![(PERCENT_OF_LIMIT_ANNOTATION, "high")],
            "invalid override: bouncer.dev/memory-percent-of-limit=\"high\": not a number",
        ),
        (
            vec![(COOLDOWN_ANNOTATION, "soon")],
            "invalid override: bouncer.dev/cooldown=\"soon\": not a duration",
        ),
        (
            vec![
                (MEMORY_ABOVE_ANNOTATION, "1Gi"),
                (PERCENT_OF_LIMIT_ANNOTATION, "80"),
            ],
            "invalid override: bouncer.dev/memory-above=\"1Gi\": set one of",
        ),
    ];
    for (annotations, want) in cases {
        let err = effective(&p, &workload(&annotations)).unwrap_err();
        assert_eq!(err.code(), "invalidOverride");
        assert!(err.to_string().starts_with(want), "{err}");
    }
}

/// In the planner: the threshold and the cooldown a workload's annotations set decide its
/// bounce; a bad value is a skip, and an opt-out still reads as the opt-out.
#[test]
fn the_planner_decides_with_the_overrides() {
    use super::tests::{OLD, inventory, over, pod, reason_of, run, t};
    use crate::core::literals::EXCLUDE_ANNOTATION;
    let w = |name: &str, mib: u64, annotations: &[(&str, &str)]| {
        let mut w = super::tests::deployment(
            "a",
            name,
            "x",
            vec![pod(&format!("{name}-0"), "x", OLD, Some(mib))],
        );
        w.annotations = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        w
    };
    let mut recent = w("recent", 900, &[(COOLDOWN_ANNOTATION, "10m")]);
    recent.restarted_at = Some(t("2026-03-10T03:00:00Z"));
    let inv = inventory(vec![
        w("plain", 900, &[]),
        w("raised", 900, &[(MEMORY_ABOVE_ANNOTATION, "1Gi")]),
        w("lowered", 300, &[(PERCENT_OF_LIMIT_ANNOTATION, "25")]),
        w("bad", 900, &[(COOLDOWN_ANNOTATION, "-1h")]),
        w(
            "excluded",
            900,
            &[(EXCLUDE_ANNOTATION, "true"), (COOLDOWN_ANNOTATION, "-1h")],
        ),
        recent,
    ]);
    // Over 500Mi, cooldown 1h, loosened as far as 25% and 10m: "recent" restarted 30 minutes
    // ago bounces with its 10m.
    let mut p = over(super::tests::policy("p", "x"), 500);
    p.overrides = OverrideBounds {
        min_percent_of_limit: Some(25.0),
        min_cooldown: Some(Duration::from_secs(600)),
        ..Default::default()
    };
    let p = run(&[p], &inv);
    let mut bounced: Vec<_> = p.bounces.iter().map(|b| b.target.name.as_str()).collect();
    bounced.sort_unstable();
    assert_eq!(bounced, ["lowered", "plain", "recent"]);
    assert_eq!(reason_of(&p, "raised").code(), "notDue");
    assert_eq!(reason_of(&p, "bad").code(), "invalidOverride");
    assert_eq!(reason_of(&p, "excluded").code(), "excluded");
}

/// Hole 7: with no `spec.overrides`, an annotation may only make bouncer more careful: a lower
/// threshold or a shorter cooldown than the policy's is refused (`invalidOverride`), and a
/// threshold of the other kind compares with nothing; with bounds, it may loosen down to them.
#[test]
fn an_override_loosens_only_within_the_policys_bounds() {
    let p = policy(true); // above 1Gi, cooldown 6h
    let refused = |p: &Policy, annotations: &[(&str, &str)]| {
        effective(p, &workload(annotations))
            .map(|e| (e.memory.clone(), e.cooldown))
            .unwrap_err()
            .to_string()
    };
    let accepted = |p: &Policy, annotations: &[(&str, &str)]| {
        let e = effective(p, &workload(annotations)).unwrap();
        (e.memory.as_ref().and_then(|m| m.threshold), e.cooldown)
    };
    let hours = |h: u64| Duration::from_secs(h * 3600);
    // The case: "1" byte and "1s" bounce every run and rank first.
    let err = refused(&p, &[(MEMORY_ABOVE_ANNOTATION, "1")]);
    assert!(
        err.starts_with("invalid override: bouncer.dev/memory-above=\"1\": below 1Gi, the loosest"),
        "{err}"
    );
    let err = refused(&p, &[(COOLDOWN_ANNOTATION, "1s")]);
    assert!(
        err.starts_with("invalid override: bouncer.dev/cooldown=\"1s\": below 6h, the loosest"),
        "{err}"
    );
    let err = refused(&p, &[(PERCENT_OF_LIMIT_ANNOTATION, "99")]);
    assert!(err.contains("spec.overrides.minPercentOfLimit"), "{err}");
    // More careful, or the policy's own value: always.
    assert_eq!(
        accepted(
            &p,
            &[
                (MEMORY_ABOVE_ANNOTATION, "1Gi"),
                (COOLDOWN_ANNOTATION, "6h")
            ]
        ),
        (Some(Threshold::Bytes(1 << 30)), hours(6))
    );
    assert_eq!(
        accepted(
            &p,
            &[
                (MEMORY_ABOVE_ANNOTATION, "4Gi"),
                (COOLDOWN_ANNOTATION, "1d")
            ]
        ),
        (Some(Threshold::Bytes(4 << 30)), hours(24))
    );
    // Bounds let it loosen that far, and no further.
    let mut bounded = p.clone();
    bounded.overrides = OverrideBounds {
        min_memory_above: Some(512 << 20),
        min_percent_of_limit: Some(50.0),
        min_cooldown: Some(hours(1)),
    };
    assert_eq!(
        accepted(
            &bounded,
            &[
                (MEMORY_ABOVE_ANNOTATION, "512Mi"),
                (COOLDOWN_ANNOTATION, "1h")
            ]
        ),
        (Some(Threshold::Bytes(512 << 20)), hours(1))
    );
    assert_eq!(
        accepted(&bounded, &[(PERCENT_OF_LIMIT_ANNOTATION, "50")]).0,
        Some(Threshold::PercentOfLimit(50.0))
    );
    for annotations in [
        [(MEMORY_ABOVE_ANNOTATION, "511Mi")],
        [(PERCENT_OF_LIMIT_ANNOTATION, "49.5")],
        [(COOLDOWN_ANNOTATION, "59m")],
    ] {
        let err = refused(&bounded, &annotations);
        assert!(err.contains("the loosest this policy allows"), "{err}");
    }
}
