//! Which held-back workloads are told by an Event, and when again.

use super::*;
use crate::core::model::Kind;

fn t(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_780_000_000 + secs, 0).unwrap()
}

fn w(name: &str) -> WorkloadRef {
    WorkloadRef {
        kind: Kind::Deployment,
        namespace: "shop".into(),
        name: name.into(),
    }
}

fn breaker() -> SkipReason {
    SkipReason::BreakerOpen {
        bounces: 3,
        max_bounces: 3,
        per: Duration::from_secs(86_400),
        until: t(7200),
    }
}

fn blocked() -> SkipReason {
    SkipReason::Blocked {
        alerts: vec!["NodeDown".into()],
    }
}

fn told(skips: &[(WorkloadRef, SkipReason)], before: &Told, now: i64) -> (Vec<String>, Told) {
    let (out, next) = notices(skips.iter().map(|(w, r)| (w, "leaks", r)), before, t(now));
    let names = out
        .iter()
        .map(|n| format!("{} {}", n.reason, n.target.name))
        .collect();
    (names, next)
}

#[test]
fn a_held_back_workload_is_told_once_an_hour_while_it_lasts() {
    let skips = [(w("api"), breaker()), (w("web"), blocked())];
    let (first, after) = told(&skips, &Told::new(), 0);
    assert_eq!(first, ["BounceBlocked web", "BounceBreakerOpen api"]);
    // Every 15 minutes: quiet until the hour is up.
    let (quiet, same) = told(&skips, &after, 900);
    assert!(quiet.is_empty(), "{quiet:?}");
    assert_eq!(same, after);
    let (quiet, _) = told(&skips, &after, 3599);
    assert!(quiet.is_empty(), "{quiet:?}");
    let (again, later) = told(&skips, &after, 3600);
    assert_eq!(again.len(), 2, "{again:?}");
    assert!(later.values().all(|&at| at == t(3600)));
}

#[test]
fn the_note_names_the_policy_and_the_reason() {
    let (out, _) = notices([(&w("web"), "leaks", &blocked())], &Told::new(), t(0));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].reason, "BounceBlocked");
    assert_eq!(
        out[0].note,
        "not bounced by policy leaks: blocked by blockWhen: NodeDown"
    );
    let failed = SkipReason::BlockerFailed {
        error: crate::core::history::QueryError::Unreachable {
            url: "http://prometheus:9090".into(),
            detail: "connection refused".into(),
        },
    };
    let (out, _) = notices([(&w("web"), "leaks", &failed)], &Told::new(), t(0));
    assert_eq!(out[0].reason, "BounceBlocked");
}

#[test]
fn other_skips_are_not_told_and_two_policies_tell_once() {
    let not_due = SkipReason::Suspended;
    let (out, next) = notices(
        [
            (&w("web"), "a", &blocked()),
            (&w("web"), "b", &blocked()),
            (&w("calm"), "a", &not_due),
        ],
        &Told::new(),
        t(0),
    );
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        out[0].note,
        "not bounced by policy a: blocked by blockWhen: NodeDown"
    );
    assert_eq!(next.len(), 1);
}

#[test]
fn a_condition_that_clears_is_forgotten_and_told_at_once_when_it_returns() {
    let (_, after) = told(&[(w("api"), breaker())], &Told::new(), 0);
    let (none, cleared) = told(&[], &after, 900);
    assert!(none.is_empty() && cleared.is_empty());
    let (back, _) = told(&[(w("api"), breaker())], &cleared, 1800);
    assert_eq!(back, ["BounceBreakerOpen api"]);
}

#[test]
fn a_run_tells_at_most_per_run_never_told_first_then_the_longest_untold() {
    let skips: Vec<_> = (0..PER_RUN + 10)
        .map(|i| (w(&format!("w{i:03}")), blocked()))
        .collect();
    let (first, after) = told(&skips, &Told::new(), 0);
    assert_eq!(first.len(), PER_RUN);
    assert_eq!(after.len(), PER_RUN);
    // The next run tells the ten left over, though the rest were told only 15 minutes ago.
    let (rest, after) = told(&skips, &after, 900);
    assert_eq!(rest.len(), 10, "{rest:?}");
    assert!(rest.iter().all(|n| !first.contains(n)));
    assert_eq!(after.len(), PER_RUN + 10);
}

#[test]
fn a_time_told_in_the_future_does_not_silence_a_workload() {
    let mut before = Told::new();
    before.insert(format!("BounceBlocked/{}", w("web")), t(10_000));
    let (out, next) = told(&[(w("web"), blocked())], &before, 0);
    assert_eq!(out.len(), 1);
    assert_eq!(next.values().next(), Some(&t(0)));
}

#[test]
fn a_restart_an_owner_would_undo_is_told_as_a_warning() {
    let pinned = SkipReason::RestartPinned {
        manager: "kustomize-controller".into(),
        kustomization: Some("flux-system/apps".into()),
    };
    let reverted = SkipReason::RevertedSince {
        manager: "argocd-controller".into(),
        written: "2026-12-07T01:00:00Z".into(),
        found: None,
    };
    let skips = [(w("api"), pinned), (w("web"), reverted)];
    let (first, _) = told(&skips, &Told::new(), 0);
    assert_eq!(first, ["BounceRestartPinned api", "BounceReverted web"]);
}
