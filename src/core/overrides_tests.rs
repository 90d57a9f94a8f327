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
use crate::core::policy::{Policy, Threshold};

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
    let p = policy(true);
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
    // Over 500Mi, cooldown 1h: "recent" restarted 30 minutes ago bounces with its 10m.
    let p = run(&[over(super::tests::policy("p", "x"), 500)], &inv);
    let mut bounced: Vec<_> = p.bounces.iter().map(|b| b.target.name.as_str()).collect();
    bounced.sort_unstable();
    assert_eq!(bounced, ["lowered", "plain", "recent"]);
    assert_eq!(reason_of(&p, "raised").code(), "notDue");
    assert_eq!(reason_of(&p, "bad").code(), "invalidOverride");
    assert_eq!(reason_of(&p, "excluded").code(), "excluded");
}
