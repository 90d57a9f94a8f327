//! The policy file format exactly as written in YAML (serde + JSON Schema from one set of types),
//! and the Kubernetes quantity parser for memory sizes.
//!
//! Values that need more than a type check (cron, durations, zones, names) stay strings here so
//! the loader can report every problem in a document, not just the first one serde meets.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};

use super::{OnRevert, Operator, RestartMethod};
use crate::core::model::Kind;

/// A BouncePolicy: which pods to watch, when their workloads are due for a restart, and how to
/// restart them one at a time.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(title = "BouncePolicy")]
pub struct RawPolicy {
    // Both are checked on the untyped document first, so a foreign object gets one clear error.
    #[allow(dead_code)]
    #[schemars(extend("const" = super::API_VERSION))]
    pub api_version: String,
    #[allow(dead_code)]
    #[schemars(extend("const" = super::KIND))]
    pub kind: String,
    pub metadata: RawMetadata,
    pub spec: RawSpec,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "Metadata")]
pub struct RawMetadata {
    /// Unique across all loaded policies; a DNS-1123 subdomain.
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "Spec")]
pub struct RawSpec {
    pub target: RawTarget,
    pub triggers: RawTriggers,
    /// When a memory trigger may act; omitted means any time. Schedules ignore windows.
    #[serde(default)]
    pub windows: Vec<RawWindow>,
    /// Minimum time between two bounces of one workload, as a duration such as "6h" (default 1h).
    pub cooldown: Option<String>,
    /// At most this many workloads of this policy are bounced per run (default: no limit).
    #[schemars(extend("minimum" = 1))]
    pub max_per_run: Option<u32>,
    /// Bounce even when no pod would stay ready during the restart, e.g. single replicas.
    pub allow_downtime: Option<bool>,
    pub restart: Option<RawRestart>,
    /// Skip every bounce of this policy while a blocker says so (like kured's alert blockers).
    pub block_when: Option<RawBlockWhen>,
    /// How far a workload's override annotations may loosen this policy. Omitted: not at all,
    /// an annotation may only make bouncer more careful (a higher threshold, a longer cooldown).
    pub overrides: Option<RawOverrides>,
    /// A circuit breaker: flag, rather than bounce, a workload that keeps needing bounces.
    pub breaker: Option<RawBreaker>,
    /// Plan this policy as usual but bounce nothing for it: its would-be bounces are reported
    /// (decision `dryRun`) and notified, and the run writes nothing for them (default false).
    pub dry_run: Option<bool>,
    /// Do not evaluate this policy at all: each workload it selects is reported skipped
    /// `suspended` (default false).
    pub suspend: Option<bool>,
}

/// The loosest values a workload's override annotations may set; a looser one is a skip
/// `invalidOverride`. Each must be at most the policy's own value.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "OverrideBounds")]
pub struct RawOverrides {
    /// The lowest `bouncer.dev/memory-above` accepted, e.g. "512Mi" (default: `memory.above`).
    pub min_memory_above: Option<RawQuantity>,
    /// The lowest `bouncer.dev/memory-percent-of-limit` accepted (default: `memory.percentOfLimit`).
    #[schemars(extend("exclusiveMinimum" = 0, "maximum" = 100))]
    pub min_percent_of_limit: Option<f64>,
    /// The shortest `bouncer.dev/cooldown` accepted, e.g. "30m" (default: `cooldown`).
    pub min_cooldown: Option<String>,
}

/// A workload bouncer attempted to bounce `maxBounces` times within `per` (whatever came of the
/// attempts, by any policy) is not bounced again until the oldest of them is `per` old: it is
/// skipped `breakerOpen`, with a Warning Event, a metric and a line in the notifications.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "Breaker")]
pub struct RawBreaker {
    /// Attempts allowed within `per`, 1 to 10 (the attempt mark keeps the last ten).
    #[schemars(extend("minimum" = 1, "maximum" = 10))]
    pub max_bounces: u32,
    /// The window, as a duration such as "24h", at most 30d (the mark keeps 30 days).
    pub per: String,
}

/// What holds a policy's bounces back.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "BlockWhen")]
pub struct RawBlockWhen {
    /// A PromQL instant query, e.g. 'ALERTS{alertstate="firing",severity="critical"}': any
    /// result blocks (the reason names each result's alertname), and so does a query that fails
    /// or a run without Prometheus.
    pub prometheus: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "Target")]
pub struct RawTarget {
    /// Namespaces to look in; omitted means every namespace the install may touch.
    pub namespaces: Option<Vec<String>>,
    pub selector: RawSelector,
    /// Kinds of the owning workload that may be bounced (default: Deployment, StatefulSet,
    /// DaemonSet). `Pod` means a pod without a controller, bounced only when listed: evicting a
    /// bare pod that nothing recreates removes it for good.
    pub kinds: Option<Vec<Kind>>,
    /// A pod-template label key. The selected workloads of one namespace with the same value
    /// are a restart group: bounced together when any of them is due, StatefulSets first, then
    /// Deployments, then DaemonSets, counted once for the caps, and held as a whole when one of
    /// them cannot be bounced or fails. A workload without the label is bounced alone.
    pub group_by: Option<String>,
}

/// Selects pods by their labels, like `kubectl get pods -l`. Must not be empty.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "LabelSelector")]
pub struct RawSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub match_expressions: Vec<RawRequirement>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "LabelSelectorRequirement")]
pub struct RawRequirement {
    pub key: String,
    pub operator: Operator,
    /// Required (non-empty) for In and NotIn; must be empty for Exists and DoesNotExist.
    #[serde(default)]
    pub values: Vec<String>,
}

/// Any trigger makes a workload due.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "Triggers")]
#[schemars(extend("minProperties" = 1))]
pub struct RawTriggers {
    pub schedule: Option<RawSchedule>,
    pub memory: Option<RawMemory>,
}

/// Restart once per cron fire. Stateless: a workload whose pods all started after the latest fire
/// is already restarted, and a fire older than the starting deadline is missed, not caught up.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "ScheduleTrigger")]
pub struct RawSchedule {
    /// Standard 5-field cron ("0 3 * * *") or @hourly, @daily, @midnight, @weekly, @monthly,
    /// @yearly, @annually.
    pub cron: String,
    /// IANA time zone the cron is read in, e.g. "Europe/Berlin" (default UTC).
    pub time_zone: Option<String>,
    /// How long after a fire a run may still act on it, as a duration (default "2h").
    pub starting_deadline: Option<String>,
}

/// Restart when a pod's memory working set is over a threshold (`above` or `percentOfLimit`, at
/// most one), over it for a whole window (`sustained`), growing too fast (`growth`) or projected to
/// reach the threshold or its limit soon (`predict`). `sustained` needs a threshold; `growth` and
/// `predict` work without one. The three read history from Prometheus.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "MemoryTrigger")]
#[schemars(extend(
    "anyOf" = [
        {"required": ["above"]}, {"required": ["percentOfLimit"]},
        {"required": ["growth"]}, {"required": ["predict"]}
    ],
    "not" = {"required": ["above", "percentOfLimit"]}
))]
pub struct RawMemory {
    pub above: Option<RawQuantity>,
    /// Percent of the memory limit, 0 < p <= 100. Pods without a limit cannot trigger.
    #[schemars(extend("exclusiveMinimum" = 0, "maximum" = 100))]
    pub percent_of_limit: Option<f64>,
    /// Count only this container; omitted means the sum over the pod's containers.
    pub container: Option<String>,
    /// Over the threshold for this whole duration ("15m"), every sample, not one spike.
    pub sustained: Option<String>,
    pub growth: Option<RawGrowth>,
    pub predict: Option<RawPredict>,
}

/// Working set growing faster than `above` per `per`: a least-squares slope over `window`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "GrowthTrigger")]
pub struct RawGrowth {
    pub above: RawQuantity,
    /// The rate's time unit as a duration, e.g. "1h".
    pub per: String,
    /// How much history the slope is fitted to (default: `per`).
    pub window: Option<String>,
}

/// Projected (a least-squares line over `window`) to reach the threshold, else the memory limit,
/// within `before`; with `windows`, inside a window: before the next window ends, outside: before
/// the next window opens.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "PredictTrigger")]
pub struct RawPredict {
    /// The horizon as a duration, e.g. "2h".
    pub before: String,
    /// How much history the line is fitted to (default "1h").
    pub window: Option<String>,
}

/// A weekly window: the listed days, from `from` until `to` (local time). `to` before `from`
/// runs past midnight into the next day.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "Window")]
pub struct RawWindow {
    /// Mon..Sun or full day names, any case. For a window past midnight, the day it opens.
    pub days: Vec<String>,
    /// "HH:MM", 24-hour clock, inclusive.
    pub from: String,
    /// "HH:MM", 24-hour clock, exclusive.
    pub to: String,
    /// IANA time zone (default: the schedule trigger's zone, else UTC).
    pub time_zone: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(rename = "Restart")]
pub struct RawRestart {
    /// How to restart (default auto).
    pub method: Option<RestartMethod>,
    /// Per-bounce time limit as a duration such as "10m" (default: the run's rollout timeout).
    pub timeout: Option<String>,
    /// What to do when something reverts the restart annotation (default fail).
    pub on_revert: Option<OnRevert>,
}

/// A Kubernetes quantity as written ("1536Mi", "2Gi", "500M", 1e9), kept as text for messages.
#[derive(Debug, Clone, PartialEq, Eq, JsonSchema)]
#[schemars(
    rename = "Quantity",
    description = "Bytes as a Kubernetes quantity: \"1536Mi\", \"2Gi\", \"500M\", \"1e9\" or a number.",
    extend("type" = ["string", "number"])
)]
pub struct RawQuantity(pub String);

impl<'de> Deserialize<'de> for RawQuantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RawQuantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a memory size such as \"1536Mi\" or a number of bytes")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_owned()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
            // YAML reads 1e9 as a float; Rust prints floats without exponents, so the text
            // goes through the same exact parser as a string would.
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(v.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_yaml_become_quantities() {
        #[derive(Deserialize)]
        struct Doc {
            q: RawQuantity,
        }
        let parse = |yaml: &str| {
            serde_yaml_ng::from_str::<Doc>(yaml).map(|d| crate::core::quantity::parse_bytes(&d.q.0))
        };
        assert_eq!(parse("q: 1e9").unwrap(), Ok(1_000_000_000));
        assert_eq!(parse("q: 2048").unwrap(), Ok(2048));
        assert_eq!(parse("q: 1.5").unwrap(), Ok(2));
        assert_eq!(parse("q: 1536Mi").unwrap(), Ok(1536 << 20));
        assert!(parse("q: -5").unwrap().is_err());
        assert!(parse("q: [1]").is_err());
    }
}
