//! Golden tests of the Pushgateway exposition, its group URL and method.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::*;
use crate::core::model::{Kind, WorkloadRef};
use crate::core::reasons::{NotDue, SkipReason};
use crate::notify::tests::{quiet_report, report, row};

fn run(succeeded: bool) -> Run {
    Run {
        finished: "2026-12-03T03:00:09.5Z".parse().unwrap(),
        duration: Duration::from_millis(4250),
        succeeded,
    }
}

/// The samples of an exposition as (series, value), comments dropped.
fn samples(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_string(), value.to_string())
        })
        .collect()
}

fn value(text: &str, series: &str) -> Option<String> {
    samples(text)
        .into_iter()
        .find(|(s, _)| s == series)
        .map(|(_, v)| v)
}

#[test]
fn golden_exposition_of_a_failed_run() {
    let text = exposition(&report(), &run(false));
    assert_eq!(text, include_str!("golden/failed-run.prom"));
}

#[test]
fn only_a_successful_run_sets_the_last_success() {
    let failed = exposition(&report(), &run(false));
    assert!(!failed.contains("bouncer_last_success_timestamp_seconds"));
    let ok = exposition(&quiet_report(), &run(true));
    assert_eq!(
        value(&ok, "bouncer_last_success_timestamp_seconds").as_deref(),
        Some("1796266809.5")
    );
    assert_eq!(
        value(&ok, "bouncer_last_run_timestamp_seconds"),
        value(&ok, "bouncer_last_success_timestamp_seconds")
    );
    assert_eq!(
        value(&ok, "bouncer_last_run_success").as_deref(),
        Some("1.0")
    );
    assert_eq!(
        value(&ok, "bouncer_last_run_planned").as_deref(),
        Some("0.0")
    );
    // Nothing bounced: no bounce series at all (the PUT of a success clears the last ones).
    assert!(!ok.contains("bouncer_last_run_bounces"), "{ok}");
}

#[test]
fn a_dry_run_plans_without_bounce_results() {
    let mut r = report();
    r.mode = crate::report::Mode::DryRun;
    for row in r.rows.iter_mut().filter(|r| r.order.is_some()) {
        row.decision = "bounce".into();
    }
    let text = exposition(&r, &run(true));
    assert_eq!(
        value(&text, "bouncer_last_run_dry_run").as_deref(),
        Some("1.0")
    );
    assert_eq!(
        value(&text, "bouncer_last_run_planned").as_deref(),
        Some("3.0")
    );
    assert!(!text.contains("bouncer_last_run_bounces{"), "{text}");
}

#[test]
fn a_recheck_skip_counts_as_a_skip_and_as_a_bounce_result() {
    let mut r = quiet_report();
    let mut skipped = row(Some(1), "p", Kind::Deployment, "ns", "web");
    skipped.decision = "skipped".into();
    skipped.reason_code = Some("restartedMeanwhile".into());
    r.rows.insert(0, skipped);
    let text = exposition(&r, &run(true));
    let series = |s: &str| value(&text, s);
    assert_eq!(
        series(r#"bouncer_last_run_skips{reason="restartedMeanwhile"}"#).as_deref(),
        Some("1.0")
    );
    assert_eq!(
        series(r#"bouncer_last_run_bounces{policy="p",result="skipped"}"#).as_deref(),
        Some("1.0")
    );
}

#[test]
fn metrics_sources_say_whether_memory_could_be_read() {
    let mut r = report();
    let series = r#"bouncer_metrics_source_available{source="metrics.k8s.io"}"#;
    assert_eq!(
        value(&exposition(&r, &run(true)), series).as_deref(),
        Some("1.0")
    );
    r.metrics_unavailable = Some("metrics.k8s.io answered 503".into());
    assert_eq!(
        value(&exposition(&r, &run(true)), series).as_deref(),
        Some("0.0")
    );
}

#[test]
fn label_values_are_escaped() {
    let mut r = quiet_report();
    let mut b = row(Some(1), "we\"ird\\policy", Kind::Deployment, "ns", "web");
    b.decision = "bounced".into();
    r.rows.push(b);
    let text = exposition(&r, &run(true));
    assert!(
        text.contains(r#"bouncer_last_run_bounces{policy="we\"ird\\policy",result="bounced"} 1.0"#),
        "{text}"
    );
}

/// One of every skip reason; the match has no wildcard, so a new reason does not compile until
/// it is listed here (and then in `SKIP_REASONS`, or this test fails).
fn every_skip_reason() -> Vec<SkipReason> {
    let now = chrono::Utc::now();
    let all = vec![
        SkipReason::NamespaceExcluded,
        SkipReason::Excluded {
            value: "yes".into(),
        },
        SkipReason::MirrorPod,
        SkipReason::UnsupportedOwner {
            kind: "Job".into(),
            name: "j".into(),
        },
        SkipReason::KindNotSelected { kind: Kind::Pod },
        SkipReason::NoPods,
        SkipReason::NotDue(NotDue::default()),
        SkipReason::Cooldown {
            last: now,
            until: now,
        },
        SkipReason::BackingOff {
            failures: 1,
            last: now,
            until: now,
        },
        SkipReason::BreakerOpen {
            bounces: 3,
            max_bounces: 3,
            per: std::time::Duration::from_secs(3600),
            until: now,
        },
        SkipReason::Paused,
        SkipReason::RolloutInProgress {
            detail: String::new(),
        },
        SkipReason::NotAvailable {
            ready: 0,
            desired: 1,
        },
        SkipReason::OnDelete,
        SkipReason::PendingTemplate {
            updated: 0,
            desired: 1,
        },
        SkipReason::Partitioned { partition: 1 },
        SkipReason::BarePodNoRollout,
        SkipReason::Downtime,
        SkipReason::PdbBlocks { name: "pdb".into() },
        SkipReason::PolicyCap { max: 1 },
        SkipReason::GlobalCap { max: 1 },
        SkipReason::Claimed { policy: "p".into() },
        SkipReason::BadAttemptMark {
            error: String::new(),
        },
        SkipReason::RestartedMeanwhile,
        SkipReason::Replaced {
            was: String::new(),
            now: None,
        },
        SkipReason::InFlight {
            target: WorkloadRef {
                kind: Kind::Deployment,
                namespace: String::new(),
                name: String::new(),
            },
            since: DateTime::<Utc>::MIN_UTC,
            until: DateTime::<Utc>::MIN_UTC,
        },
        SkipReason::RequestLeft {
            server: String::new(),
            since: DateTime::<Utc>::MIN_UTC,
        },
        SkipReason::ReadFailed {
            error: String::new(),
        },
        SkipReason::InvalidOverride {
            annotation: String::new(),
            value: String::new(),
            problem: String::new(),
        },
        SkipReason::GroupHeld {
            member: WorkloadRef {
                kind: Kind::StatefulSet,
                namespace: "ns".into(),
                name: "db".into(),
            },
            reason: Box::new(SkipReason::Paused),
        },
        SkipReason::Blocked { alerts: vec![] },
        SkipReason::BlockerFailed {
            error: crate::core::history::QueryError::NotRun,
        },
        SkipReason::RestartStrategy {
            server: String::new(),
            strategy: String::new(),
        },
        SkipReason::NotOperatorOwned {
            server: String::new(),
            why: crate::core::reasons::NotProxy::Name,
        },
        SkipReason::Suspended,
        SkipReason::BeingDeleted(crate::core::model::Deleting::Workload),
        SkipReason::ClaimedInDryRun { policy: "p".into() },
        SkipReason::RestartPinned {
            manager: String::new(),
            kustomization: None,
        },
        SkipReason::RevertedSince {
            manager: String::new(),
            written: String::new(),
            found: None,
        },
    ];
    for r in &all {
        match r {
            SkipReason::NamespaceExcluded
            | SkipReason::Excluded { .. }
            | SkipReason::MirrorPod
            | SkipReason::BeingDeleted(_)
            | SkipReason::UnsupportedOwner { .. }
            | SkipReason::KindNotSelected { .. }
            | SkipReason::NoPods
            | SkipReason::NotDue(_)
            | SkipReason::Cooldown { .. }
            | SkipReason::BackingOff { .. }
            | SkipReason::BreakerOpen { .. }
            | SkipReason::Paused
            | SkipReason::RolloutInProgress { .. }
            | SkipReason::NotAvailable { .. }
            | SkipReason::OnDelete
            | SkipReason::PendingTemplate { .. }
            | SkipReason::Partitioned { .. }
            | SkipReason::BarePodNoRollout
            | SkipReason::Downtime
            | SkipReason::PdbBlocks { .. }
            | SkipReason::PolicyCap { .. }
            | SkipReason::GlobalCap { .. }
            | SkipReason::Claimed { .. }
            | SkipReason::BadAttemptMark { .. }
            | SkipReason::RestartedMeanwhile
            | SkipReason::Replaced { .. }
            | SkipReason::InFlight { .. }
            | SkipReason::RequestLeft { .. }
            | SkipReason::ReadFailed { .. }
            | SkipReason::InvalidOverride { .. }
            | SkipReason::GroupHeld { .. }
            | SkipReason::Blocked { .. }
            | SkipReason::BlockerFailed { .. }
            | SkipReason::RestartStrategy { .. }
            | SkipReason::NotOperatorOwned { .. }
            | SkipReason::Suspended
            | SkipReason::ClaimedInDryRun { .. }
            | SkipReason::RestartPinned { .. }
            | SkipReason::RevertedSince { .. } => {}
        }
    }
    all
}

#[test]
fn every_skip_reason_is_pushed_even_at_zero() {
    let mut codes: Vec<&str> = every_skip_reason().iter().map(SkipReason::code).collect();
    codes.sort_unstable();
    codes.dedup();
    assert_eq!(codes, SKIP_REASONS);
    let text = exposition(&quiet_report(), &run(false));
    for code in SKIP_REASONS {
        let series = format!("bouncer_last_run_skips{{reason=\"{code}\"}}");
        assert!(value(&text, &series).is_some(), "{series} missing");
    }
}

#[test]
fn the_group_is_job_bouncer_and_the_cluster() {
    let url = |base: &str, cluster: &str| {
        group_url(&reqwest::Url::parse(base).unwrap(), cluster).to_string()
    };
    assert_eq!(
        url("http://pg:9091", "prod-eu"),
        "http://pg:9091/metrics/job/bouncer/cluster/prod-eu"
    );
    assert_eq!(
        url("https://gw.example/push/?x=1", "prod eu"),
        "https://gw.example/push/metrics/job/bouncer/cluster/prod%20eu"
    );
    assert_eq!(
        url("http://pg:9091/", ""),
        "http://pg:9091/metrics/job/bouncer/cluster@base64/="
    );
    assert_eq!(
        url("http://pg:9091", "eu/prod"),
        "http://pg:9091/metrics/job/bouncer/cluster@base64/ZXUvcHJvZA=="
    );
}

#[test]
fn a_success_replaces_the_group_and_a_failure_merges_into_it() {
    assert_eq!(method(true), reqwest::Method::PUT);
    assert_eq!(method(false), reqwest::Method::POST);
}

/// A workload held back by its circuit breaker is counted in its own gauge, pushed at zero too
/// (a failed run's merge must not leave an old count behind), and once however many policies
/// refused it.
#[test]
fn open_breakers_are_counted_once_per_workload() {
    let quiet = exposition(&quiet_report(), &run(false));
    assert_eq!(
        value(&quiet, "bouncer_last_run_breakers_open").as_deref(),
        Some("0.0")
    );
    let mut r = quiet_report();
    for policy in ["a", "b"] {
        let mut s = row(None, policy, Kind::Deployment, "shop", "api");
        s.decision = "skip".into();
        s.reason_code = Some("breakerOpen".into());
        r.rows.push(s);
    }
    let text = exposition(&r, &run(true));
    assert_eq!(
        value(&text, "bouncer_last_run_breakers_open").as_deref(),
        Some("1.0")
    );
    assert_eq!(
        value(&text, "bouncer_last_run_skips{reason=\"breakerOpen\"}").as_deref(),
        Some("2.0")
    );
}
