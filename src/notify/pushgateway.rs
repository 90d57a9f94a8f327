//! The run's metrics for a Prometheus Pushgateway: the exposition (Prometheus text format, by
//! prometheus-client), the group's URL (job=bouncer plus cluster) and how it is pushed.
//!
//! A successful run replaces its group (PUT). A failed run merges into it (POST), which replaces
//! every metric it carries and keeps the one it does not: the last success's timestamp, which is
//! what the "no successful run" alert reads. So that a merge leaves nothing stale behind, every
//! other metric is always pushed whole: skips carry every reason code (zeros included), and a
//! failed run always has at least one bounce row.

use std::collections::BTreeMap;

use base64::Engine as _;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::Run;
use crate::report::Report;

pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The `job` label of the grouping key.
pub const JOB: &str = "bouncer";

/// Every skip reason code a row can carry (`reasonCode`); the unit tests keep it complete.
pub const SKIP_REASONS: [&str; 38] = [
    "backingOff",
    "badAttemptMark",
    "barePodNoRollout",
    "beingDeleted",
    "blocked",
    "blockerFailed",
    "bounceInFlight",
    "breakerOpen",
    "claimed",
    "cooldown",
    "downtime",
    "excluded",
    "globalCap",
    "groupHeld",
    "invalidOverride",
    "kindNotSelected",
    "mirrorPod",
    "namespaceExcluded",
    "noPods",
    "notAvailable",
    "notDue",
    "notOperatorOwned",
    "onDelete",
    "partitioned",
    "paused",
    "pdbBlocks",
    "pendingTemplate",
    "policyCap",
    "readFailed",
    "replaced",
    "requestLeft",
    "restartPinned",
    "restartStrategy",
    "restartedMeanwhile",
    "revertedSince",
    "rolloutInProgress",
    "suspended",
    "unsupportedOwner",
];

/// The metrics source the report says is (un)available.
const METRICS_SOURCE: &str = "metrics.k8s.io";

type Labels = Vec<(String, String)>;

/// Gauges of one metric, one per label set, encoded in label order so the exposition is the
/// same for the same report (prometheus-client's own Family keeps a hash map).
#[derive(Debug, Default)]
struct Gauges(BTreeMap<Labels, f64>);

impl Gauges {
    fn one(value: f64) -> Gauges {
        Gauges(BTreeMap::from([(Vec::new(), value)]))
    }

    fn add(&mut self, labels: &[(&str, &str)], value: f64) {
        let key = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        *self.0.entry(key).or_default() += value;
    }
}

impl EncodeMetric for Gauges {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, value) in &self.0 {
            if labels.is_empty() {
                encoder.encode_gauge(value)?;
            } else {
                encoder.encode_family(labels)?.encode_gauge(value)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn seconds(t: chrono::DateTime<chrono::Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}

/// The exposition of one run: what its report says, plus when it ended, how long it took and
/// whether it exited 0.
pub fn exposition(report: &Report, run: &Run) -> String {
    let mut registry = Registry::default();
    registry.register(
        "bouncer_last_run_timestamp_seconds",
        "When the last run ended, in seconds since the Unix epoch",
        Gauges::one(seconds(run.finished)),
    );
    if run.succeeded {
        registry.register(
            "bouncer_last_success_timestamp_seconds",
            "When the last run that exited 0 ended, in seconds since the Unix epoch",
            Gauges::one(seconds(run.finished)),
        );
    }
    registry.register(
        "bouncer_last_run_success",
        "1 if the last run exited 0, else 0 (a bounce failed, was reverted or was interrupted)",
        Gauges::one(if run.succeeded { 1.0 } else { 0.0 }),
    );
    registry.register(
        "bouncer_last_run_duration_seconds",
        "How long the last run took, from its snapshot to its report",
        Gauges::one(run.duration.as_secs_f64()),
    );
    registry.register(
        "bouncer_last_run_dry_run",
        "1 if the last run was a dry run (nothing was changed), else 0",
        Gauges::one(if report.mode == crate::report::Mode::DryRun {
            1.0
        } else {
            0.0
        }),
    );
    registry.register(
        "bouncer_last_run_planned",
        "Bounces the last run planned",
        Gauges::one(report.summary.planned as f64),
    );
    registry.register(
        "bouncer_last_run_dry_run_planned",
        "Bounces the dry-run policies (spec.dryRun) of the last run would have made; none was made",
        Gauges::one(report.summary.dry_run as f64),
    );
    let mut bounces = Gauges::default();
    let mut skips = Gauges::default();
    for reason in SKIP_REASONS {
        skips.add(&[("reason", reason)], 0.0);
    }
    for row in &report.rows {
        match (row.order, row.decision.as_str()) {
            // Counted in bouncer_last_run_dry_run_planned.
            (None, crate::report::DRY_RUN) => {}
            (None, _) | (Some(_), "skipped") => {
                let code = row.reason_code.as_deref().unwrap_or("unknown");
                skips.add(&[("reason", code)], 1.0);
                if row.order.is_some() {
                    bounces.add(&[("policy", &row.policy), ("result", "skipped")], 1.0);
                }
            }
            // A dry run's queue: planned, not bounced.
            (Some(_), "bounce") => {}
            (Some(_), result) => bounces.add(&[("policy", &row.policy), ("result", result)], 1.0),
        }
    }
    registry.register(
        "bouncer_last_run_bounces",
        "Bounces of the last run by policy and result (bounced, revertedEvicted, reverted, superseded, failed, interrupted, notAttempted, skipped)",
        bounces,
    );
    registry.register(
        "bouncer_last_run_skips",
        "Workloads the last run skipped, by reason code",
        skips,
    );
    // Always pushed (zero included), so a failed run's merge leaves no stale count behind.
    registry.register(
        "bouncer_last_run_breakers_open",
        "Workloads the last run did not bounce because their circuit breaker (spec.breaker) is open",
        Gauges::one(super::breakers_open(report) as f64),
    );
    let mut available = Gauges::default();
    let up = if report.metrics_unavailable.is_some() {
        0.0
    } else {
        1.0
    };
    available.add(&[("source", METRICS_SOURCE)], up);
    registry.register(
        "bouncer_metrics_source_available",
        "1 if the last run could read pod memory from the source, else 0 (memory triggers were off)",
        available,
    );
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
        .expect("writing to a String does not fail");
    out
}

/// `BASE/metrics/job/bouncer/cluster/NAME`. A value the URL path cannot carry (empty, or with a
/// `/`) goes base64url-encoded, as the Pushgateway's API defines.
pub fn group_url(base: &reqwest::Url, cluster: &str) -> reqwest::Url {
    let mut url = base.clone();
    url.set_query(None);
    url.set_fragment(None);
    let (key, value) = if cluster.is_empty() || cluster.contains('/') {
        let encoded = base64::engine::general_purpose::URL_SAFE.encode(cluster);
        // The Pushgateway reads a lone `=` as the empty value.
        let encoded = if encoded.is_empty() {
            "=".to_string()
        } else {
            encoded
        };
        ("cluster@base64", encoded)
    } else {
        ("cluster", cluster.to_string())
    };
    url.path_segments_mut()
        .expect("an http(s) URL has a path")
        .pop_if_empty()
        .extend(["metrics", "job", JOB, key, &value]);
    url
}

/// PUT (replace the group) after a successful run, POST (merge, keeping the last success's
/// timestamp) after a failed one.
pub fn method(succeeded: bool) -> reqwest::Method {
    if succeeded {
        reqwest::Method::PUT
    } else {
        reqwest::Method::POST
    }
}

#[cfg(test)]
#[path = "pushgateway_tests.rs"]
mod tests;
