//! The pin rule (`core::pin::undone`) over workloads built with the planner's test kit: who
//! owns restartedAt, and what bouncer last wrote there.

use chrono::{DateTime, Utc};

use crate::core::literals::rfc3339;
use crate::core::mark::AttemptHistory;
use crate::core::mark::AttemptMark;
use crate::core::model::Attempt;
use crate::core::model::{AttemptOutcome, Method, Workload};
use crate::core::pin::{RestartOwner, RestartOwners, undone};
use crate::core::plan::tests::{deployment, pod};
use crate::core::reasons::SkipReason;

fn at(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

fn owned(w: &mut Workload, owners: &[(&str, bool)], kustomization: Option<&str>) {
    w.restart_owners = Some(Box::new(RestartOwners {
        owners: owners
            .iter()
            .map(|(m, apply)| RestartOwner {
                manager: m.to_string(),
                apply: *apply,
            })
            .collect(),
        kustomization: kustomization.map(str::to_string),
    }));
}

fn bounced_at(w: &mut Workload, t: &str, outcome: AttemptOutcome) {
    let mut a = Attempt::new(at(t), "p", Method::Rollout);
    a.outcome = outcome;
    w.attempt = AttemptMark::Seen(Box::new(AttemptHistory::of(&a)));
}

fn web() -> Workload {
    deployment(
        "a",
        "web",
        "web",
        vec![pod("web-0", "web", "2026-12-06T09:00:00Z", None)],
    )
}

const NOW: &str = "2026-12-06T12:00:00Z";

#[test]
fn nobody_else_owning_the_key_lets_the_restart_hold() {
    let mut w = web();
    assert_eq!(undone(&w, at(NOW)), None);
    w.restarted_at = Some(at("2026-12-06T11:00:00Z"));
    bounced_at(&mut w, "2026-12-06T10:00:00Z", AttemptOutcome::Started);
    assert_eq!(
        undone(&w, at(NOW)),
        None,
        "a value nobody owns is no revert"
    );
}

#[test]
fn an_applier_of_the_key_pins_it_and_an_updater_does_not() {
    let mut w = web();
    w.restarted_at = Some(at("2026-01-01T00:00:00Z"));
    owned(
        &mut w,
        &[("kustomize-controller", true)],
        Some("flux-system/apps"),
    );
    let reason = undone(&w, at(NOW)).unwrap();
    assert_eq!(reason.code(), "restartPinned");
    let text = reason.to_string();
    assert!(text.contains("kustomize-controller"), "{text}");
    assert!(text.contains("Kustomization flux-system/apps"), "{text}");

    owned(&mut w, &[("kubectl-rollout", false)], None);
    assert_eq!(undone(&w, at(NOW)), None, "a kubectl restart is no pin");
}

#[test]
fn a_value_that_replaced_bouncers_restart_is_a_late_revert() {
    let mut w = web();
    bounced_at(&mut w, "2026-12-06T10:00:00.250Z", AttemptOutcome::Started);
    // Git's older value back, written by the applier.
    w.restarted_at = Some(at("2026-01-01T00:00:00Z"));
    owned(&mut w, &[("kustomize-controller", true)], None);
    let reason = undone(&w, at(NOW)).unwrap();
    assert_eq!(reason.code(), "revertedSince");
    let text = reason.to_string();
    assert!(text.contains("2026-12-06T10:00:00Z"), "{text}");
    assert!(text.contains("2026-01-01T00:00:00Z"), "{text}");
    assert!(text.contains("kustomize-controller"), "{text}");
    // An operator's controller, as an Update owner, is a late revert too.
    owned(&mut w, &[("operator", false)], None);
    assert_eq!(undone(&w, at(NOW)).unwrap().code(), "revertedSince");
    // bouncer's own value in place: nothing was undone.
    w.restarted_at = Some(at("2026-12-06T10:00:00Z"));
    assert_eq!(undone(&w, at(NOW)), None);
}

#[test]
fn a_later_restart_or_an_evictions_mark_is_no_late_revert() {
    let mut w = web();
    bounced_at(&mut w, "2026-12-06T10:00:00Z", AttemptOutcome::Started);
    w.restarted_at = Some(at("2026-12-06T11:00:00Z"));
    owned(&mut w, &[("kubectl-rollout", false)], None);
    assert_eq!(undone(&w, at(NOW)), None, "kubectl restarted it later");
    // A value pinned ahead of now is no restart that happened.
    w.restarted_at = Some(at("2027-01-01T00:00:00Z"));
    assert_eq!(undone(&w, at(NOW)).unwrap().code(), "revertedSince");
    for outcome in [AttemptOutcome::Reverted, AttemptOutcome::Superseded] {
        bounced_at(&mut w, "2026-12-06T10:00:00Z", outcome);
        assert_eq!(undone(&w, at(NOW)), None, "{outcome:?} was told in its run");
    }
    let a = Attempt::new(at("2026-12-06T10:00:00Z"), "p", Method::Evict);
    w.attempt = AttemptMark::Seen(Box::new(AttemptHistory::of(&a)));
    assert_eq!(
        undone(&w, at(NOW)),
        None,
        "an eviction writes no restartedAt"
    );
}

proptest::proptest! {
    /// Over generated owners, marks and values: an applier always holds the restart back; with
    /// no other owner nothing does; a late revert is only ever a value other than bouncer's.
    #[test]
    fn only_another_owner_holds_a_restart_back(
        owners in proptest::collection::vec(("[a-c]", proptest::bool::ANY), 0..3),
        mark in proptest::option::of((0..7200i64, 0..4usize)),
        value in proptest::option::of(0..7200i64),
    ) {
        let now = at(NOW);
        let mut w = web();
        let base = at("2026-12-06T10:00:00Z");
        w.restarted_at = value.map(|s| base + chrono::Duration::seconds(s));
        if let Some((offset, outcome)) = mark {
            let outcome = [
                AttemptOutcome::Started,
                AttemptOutcome::Bounced,
                AttemptOutcome::Reverted,
                AttemptOutcome::Failed,
            ][outcome];
            bounced_at(&mut w, &rfc3339(base + chrono::Duration::seconds(offset)), outcome);
        }
        let pairs: Vec<(&str, bool)> = owners.iter().map(|(m, a)| (m.as_str(), *a)).collect();
        if !pairs.is_empty() {
            owned(&mut w, &pairs, None);
        }
        let verdict = undone(&w, now);
        if pairs.iter().any(|(_, apply)| *apply) {
            proptest::prop_assert!(verdict.is_some(), "an applier owns the key: {pairs:?}");
        }
        if pairs.is_empty() {
            proptest::prop_assert_eq!(&verdict, &None);
        }
        if let Some(SkipReason::RevertedSince { written, found, manager }) = &verdict {
            proptest::prop_assert_ne!(Some(written), found.as_ref());
            proptest::prop_assert!(pairs.iter().any(|(m, _)| m == manager));
        }
    }
}
