//! The history triggers on plain data: samples built as Prometheus answers them.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::*;
use crate::core::history::Series;
use crate::core::model::{ContainerSample, Kind, RolloutStatus, UpdateStrategy, WorkloadRef};
use crate::core::policy::{Policy, parse_str};
use crate::core::schedule::window_spans;

const MI: f64 = (1u64 << 20) as f64;
const STEP: u64 = 15;

pub(crate) fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

/// A policy with `memory` as its trigger (YAML flow mapping) and `extra` spec fields.
pub(crate) fn policy(memory: &str, extra: &str) -> Policy {
    let text = format!(
        "apiVersion: bouncer.dev/v1alpha1\nkind: BouncePolicy\nmetadata: {{name: p}}\nspec:\n  target: {{selector: {{matchLabels: {{app: web}}}}}}\n  triggers: {{memory: {memory}}}\n  cooldown: 1h\n{extra}"
    );
    parse_str("t.yaml", &text).expect("valid").remove(0)
}

/// One pod with a 1Gi limit and `usage_mib` now (the metrics-server sample).
pub(crate) fn workload(usage_mib: f64) -> Workload {
    Workload {
        target: WorkloadRef {
            kind: Kind::Deployment,
            namespace: "shop".into(),
            name: "web".into(),
        },
        uid: None,
        template_labels: BTreeMap::from([("app".into(), "web".into())]).into(),
        pod_selector: Default::default(),
        pod_owners: Vec::new(),
        annotations: BTreeMap::new(),
        attempt: Default::default(),
        restarted_at: None,
        template_spec: None,
        restart_owners: None,
        paused: false,
        strategy: UpdateStrategy::RollingUpdate,
        status: RolloutStatus {
            generation: 1,
            observed_generation: 1,
            desired: 1,
            current: 1,
            updated: 1,
            ready: 1,
            available: 1,
            ..Default::default()
        },
        rolling: Default::default(),
        pods: vec![PodSample {
            name: "web-1".into(),
            uid: "u1".into(),
            labels: BTreeMap::from([("app".into(), "web".into())]).into(),
            started: Some(t("2026-03-01T00:00:00Z")),
            ready: true,
            deleting: false,
            containers: vec![ContainerSample {
                name: "app".into(),
                usage: Some((usage_mib * MI) as u64),
                limit: Some(1 << 30),
            }],
            limit: None,
            has_metrics: true,
        }],
        mirror: false,
        deleting: None,
        toolhive: Default::default(),
    }
}

/// `minutes` of samples every STEP seconds up to `end`, valued by `mib(minutes before end)`.
pub(crate) fn history(
    end: DateTime<Utc>,
    minutes: u64,
    mib: impl Fn(f64) -> f64,
) -> Result<History, QueryError> {
    let end_s = crate::core::history::seconds(end);
    let samples = (0..=minutes * 60 / STEP)
        .rev()
        .map(|i| {
            let ago = (i * STEP) as f64;
            (end_s - ago, mib(ago / 60.0) * MI)
        })
        .collect();
    Ok(History {
        step: Duration::from_secs(STEP),
        pods: BTreeMap::from([(
            ("shop".to_string(), "web-1".to_string()),
            vec![Series {
                container: "app".into(),
                samples,
            }],
        )]),
    })
}

fn assess(p: &Policy, h: &Result<History, QueryError>, now: &str) -> HistoryVerdicts {
    assess_history(p.memory.as_ref(), &p.windows, &workload(100.0), h, t(now))
}

pub(crate) const NOW: &str = "2026-03-10T12:00:00Z";

fn waiting(v: &HistoryVerdicts) -> String {
    assert!(v.fired.is_empty(), "{:?}", v.fired);
    v.waiting
        .iter()
        .map(|w| format!("{}: {}", w.trigger, w.detail))
        .collect()
}

#[test]
fn a_one_sample_spike_is_not_sustained() {
    let p = policy("{above: 1Gi, sustained: 15m}", "");
    let spike = history(t(NOW), 20, |ago| if ago == 5.0 { 2048.0 } else { 100.0 });
    let why = waiting(&assess(&p, &spike, NOW));
    assert!(
        why.contains("web-1 went down to 100Mi <= 1Gi in the last 15m"),
        "{why}"
    );

    let over = history(t(NOW), 20, |_| 1500.0);
    let v = assess(&p, &over, NOW);
    assert_eq!(v.fired.len(), 1, "{v:?}");
    assert_eq!(v.fired[0].code(), "memorySustained");
    assert_eq!(
        v.fired[0].to_string(),
        "memory sustained (web-1 >= 1500Mi > 1Gi for 15m, 61 samples)"
    );
}

#[test]
fn missing_stale_or_short_history_never_fires() {
    let p = policy(
        "{above: 1Gi, sustained: 15m, growth: {above: 10Mi, per: 1h}}",
        "",
    );
    let high = |_: f64| 1500.0;
    // The last sample 10 minutes old: the pod may be gone.
    let stale = history(t("2026-03-10T11:50:00Z"), 60, high);
    let why = waiting(&assess(&p, &stale, NOW));
    assert!(why.contains("stale: the last sample is 10m old"), "{why}");
    // Five minutes of a fifteen-minute window.
    let short = history(t(NOW), 5, high);
    let why = waiting(&assess(&p, &short, NOW));
    assert!(why.contains("history covers 5m of the 15m window"), "{why}");
    // A pod Prometheus has no series for.
    let none = Ok(History {
        step: Duration::from_secs(STEP),
        pods: BTreeMap::new(),
    });
    let why = waiting(&assess(&p, &none, NOW));
    assert!(why.contains("no samples in the last 15m"), "{why}");
    // Prometheus down: every history trigger off, with the reason.
    let off = Err(QueryError::Unreachable {
        url: "http://prometheus:9090".into(),
        detail: "connection refused".into(),
    });
    let v = assess(&p, &off, NOW);
    assert_eq!(
        waiting(&v),
        "sustained: off: Prometheus history unavailable: no answer from Prometheus at http://prometheus:9090: connection refused\
         growth: off: Prometheus history unavailable: no answer from Prometheus at http://prometheus:9090: connection refused"
    );
    // Not configured: no query failed, so none is said to.
    let v = assess(&p, &Err(QueryError::NotConfigured), NOW);
    assert!(
        waiting(&v).starts_with("sustained: off: no Prometheus configured (--prometheus-url)"),
        "{v:?}"
    );
}

/// Each way a pod's samples fall short, as a variant: none of them is a bounce.
#[test]
fn samples_that_fall_short_say_how() {
    let step = Duration::from_secs(STEP);
    let window = Duration::from_secs(15 * 60);
    let now = 10_000.0;
    let every = |from: f64, to: f64, each: f64| -> Vec<(f64, f64)> {
        let n = ((to - from) / each) as usize;
        (0..=n).map(|i| (from + i as f64 * each, 1.0)).collect()
    };
    // How many samples are inside, or why too few.
    let check = |samples: &[(f64, f64)], min, whole| {
        covered(samples, now, window, step, min, whole).map(<[_]>::len)
    };
    assert_eq!(check(&[], 3, true), Err(NoHistory::NoSamples { window }));
    let stale = every(now - 795.0, now - 600.0, 15.0);
    assert_eq!(
        check(&stale, 3, true),
        Err(NoHistory::Stale {
            age: Duration::from_secs(600)
        })
    );
    let two = every(now - 15.0, now, 15.0);
    assert!(matches!(
        check(&two, 5, false),
        Err(NoHistory::TooFew {
            found: 2,
            need: 5,
            ..
        })
    ));
    let short = every(now - 300.0, now, 15.0);
    assert!(matches!(
        check(&short, 3, true),
        Err(NoHistory::Short { covers, .. }) if covers == Duration::from_secs(300)
    ));
    let mut gappy = every(now - 900.0, now - 600.0, 15.0);
    gappy.extend(every(now - 300.0, now, 15.0));
    assert_eq!(
        check(&gappy, 3, true),
        Err(NoHistory::Gap {
            gap: Duration::from_secs(300)
        })
    );
    // The same gap is fine for a line, which needs half the window.
    assert!(check(&gappy, 5, false).is_ok());
    assert_eq!(
        NoHistory::TooFew {
            found: 2,
            window,
            need: 5
        }
        .to_string(),
        "too few samples (2 in the last 15m, need 5)"
    );
    assert_eq!(
        NoHistory::Gap {
            gap: Duration::from_secs(300)
        }
        .to_string(),
        "a 5m gap in the samples"
    );
}

/// The pods a trigger cannot assess, in the words the plan uses.
#[test]
fn a_pod_without_a_limit_or_a_line_is_not_enough_history() {
    let mut w = workload(100.0);
    w.pods[0].containers[0].limit = None;
    let p = policy(
        "{percentOfLimit: 90, sustained: 15m, predict: {before: 6h}}",
        "",
    );
    let h = history(t(NOW), 60, |_| 500.0);
    let v = assess_history(p.memory.as_ref(), &p.windows, &w, &h, t(NOW));
    assert_eq!(
        waiting(&v),
        "sustained: not enough history (web-1: no memory limit)\
         predict: not enough history (web-1: no memory limit and no threshold to project to)"
    );
    assert_eq!(NoHistory::OneInstant.to_string(), "samples at one instant");
}

#[test]
fn a_steady_leak_grows_faster_than_the_rate() {
    // 100 MiB/h, with a little noise that the least-squares line sees through.
    let leak = history(t(NOW), 60, |ago| {
        400.0 - ago * 100.0 / 60.0
            + if (ago as u64).is_multiple_of(2) {
                3.0
            } else {
                -3.0
            }
    });
    let p = policy("{growth: {above: 50Mi, per: 1h}}", "");
    let v = assess(&p, &leak, NOW);
    assert_eq!(v.fired.len(), 1, "{v:?}");
    let Trigger::MemoryGrowth { mib_per_hour, .. } = &v.fired[0] else {
        panic!("{v:?}")
    };
    assert!((mib_per_hour - 100.0).abs() < 1.0, "{mib_per_hour}");
    assert!(
        v.fired[0].to_string().starts_with("memory growth (web-1 +")
            && v.fired[0]
                .to_string()
                .contains("MiB/h > 50.0 MiB/h over 1h, 241 samples)"),
        "{}",
        v.fired[0]
    );
    // 150 MiB per 2h is 75 MiB/h: faster than that is needed.
    let slow = policy("{growth: {above: 300Mi, per: 2h}}", "");
    let why = waiting(&assess(&slow, &leak, NOW));
    assert!(why.contains("MiB/h <= 150.0 MiB/h over 2h"), "{why}");
    // A flat line does not grow.
    let flat = history(t(NOW), 60, |_| 400.0);
    let why = waiting(&assess(&p, &flat, NOW));
    assert!(why.contains("+0.0 MiB/h <= 50.0 MiB/h"), "{why}");
}

/// 100 MiB/h, at `now_mib` now.
pub(crate) fn leak_at(now: &str, now_mib: f64) -> Result<History, QueryError> {
    history(t(now), 60, move |ago| now_mib - ago * 100.0 / 60.0)
}

#[test]
fn predict_within_the_horizon_without_windows() {
    // 524 MiB now, the 1Gi limit at 100 MiB/h: in 5 hours.
    let h = leak_at(NOW, 524.0);
    let near = policy("{predict: {before: 6h}}", "");
    let v = assess(&near, &h, NOW);
    let Some(Trigger::MemoryPredict {
        projected, case, ..
    }) = v.fired.first()
    else {
        panic!("{v:?}")
    };
    assert_eq!(*projected, t("2026-03-10T17:00:00Z"));
    assert_eq!(
        *case,
        PredictCase::Horizon {
            before: Duration::from_secs(6 * 3600)
        }
    );
    assert_eq!(
        v.fired[0].to_string(),
        "memory predict (web-1 reaches 1Gi at 2026-03-10T17:00:00Z, +100.0 MiB/h, within 6h)"
    );
    let far = policy("{predict: {before: 2h}}", "");
    let why = waiting(&assess(&far, &h, NOW));
    assert_eq!(
        why,
        "predict: web-1 reaches 1Gi at 2026-03-10T17:00:00Z (+100.0 MiB/h), after the 2h horizon"
    );
    // The threshold, where there is one, is the target: 600Mi in 45 minutes.
    let threshold = policy("{above: 600Mi, predict: {before: 1h}}", "");
    let v = assess(&threshold, &h, NOW);
    assert!(
        matches!(&v.fired[..], [Trigger::MemoryPredict { projected, .. }] if *projected == t("2026-03-10T12:45:36Z")),
        "{v:?}"
    );
}

const NIGHTS: &str =
    "  windows: [{days: [Mon, Tue, Wed, Thu, Fri, Sat, Sun], from: \"01:00\", to: \"05:00\"}]\n";

#[test]
fn predict_with_windows_bounces_outside_only_before_the_next_window() {
    let p = policy("{predict: {before: 2h}}", NIGHTS);
    // Outside at 12:00, OOM at 17:00, the window opens at 01:00: waiting would mean the OOM.
    let v = assess(&p, &leak_at(NOW, 524.0), NOW);
    assert_eq!(
        v.fired.first().map(ToString::to_string).as_deref(),
        Some(
            "memory predict (web-1 reaches 1Gi at 2026-03-10T17:00:00Z, +100.0 MiB/h, outside the windows, before the next window opens at 2026-03-11T01:00:00Z)"
        )
    );
    let spans = window_spans(&p.windows, t(NOW));
    assert!(matches!(
        predict_case(&spans, t(NOW), t("2026-03-11T02:00:00Z"), Duration::from_secs(7200)),
        Err(NotYet::WaitsForWindow { next_window_opens }) if next_window_opens == t("2026-03-11T01:00:00Z")
    ));
    assert_eq!(
        predict_case(
            &[],
            t(NOW),
            t("2026-03-11T02:00:00Z"),
            Duration::from_secs(7200)
        ),
        Err(NotYet::AfterHorizon {
            before: Duration::from_secs(7200)
        })
    );
    // 50 MiB/h from 324 MiB: the OOM at 02:00 tomorrow, in the window that opens at 01:00.
    let slower = history(t(NOW), 60, |ago| 324.0 - ago * 50.0 / 60.0);
    let why = waiting(&assess(&p, &slower, NOW));
    assert!(
        why.contains("after the next window opens at 2026-03-11T01:00:00Z: waits for the window"),
        "{why}"
    );
}

#[test]
fn predict_with_windows_bounces_inside_before_the_next_window_ends() {
    let p = policy("{predict: {before: 2h}}", NIGHTS);
    let inside = "2026-03-10T02:00:00Z";
    // 300 MiB at 02:00 reaches 1Gi 7h14m later (09:14): before tomorrow's window ends at 05:00.
    let v = assess(&p, &leak_at(inside, 300.0), inside);
    assert!(
        matches!(
            &v.fired[..],
            [Trigger::MemoryPredict { case: PredictCase::InsideWindow { next_window_ends }, .. }]
                if *next_window_ends == t("2026-03-11T05:00:00Z")
        ),
        "{v:?}"
    );
    // A leak that reaches 1Gi only in 3 days waits for a later window.
    let spans = window_spans(&p.windows, t(inside));
    let in_three_days = t("2026-03-13T02:00:00Z");
    assert_eq!(
        predict_case(&spans, t(inside), in_three_days, Duration::from_secs(7200)),
        Err(NotYet::AfterNextWindow {
            next_window_ends: t("2026-03-11T05:00:00Z"),
            before: Duration::from_secs(7200),
        })
    );
    let slow = history(t(inside), 60, |ago| 300.0 - ago * 10.0 / 60.0);
    let why = waiting(&assess(&p, &slow, inside));
    assert!(
        why.contains("after the next window ends at 2026-03-11T05:00:00Z and the 2h horizon"),
        "{why}"
    );
}
