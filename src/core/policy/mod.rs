//! Bounce policies: the validated form the planner consumes (`Policy`), loading from YAML files
//! and directories (`load`), and the JSON Schema of the file format (`schema`).

mod bounds;
mod check;
mod load;
mod raw;
mod schema;
mod validate;

use std::time::Duration;

use crate::core::model::Kind;
pub use crate::core::schedule::{Schedule, Window};

pub use crate::core::selector::{Operator, Requirement, Selector};
pub use load::{LoadError, PolicyError, load_paths, parse_str};
pub use schema::json_schema;

mod values;

pub use values::{ValueError, bytes_value, duration_value, percent_value};

pub const API_VERSION: &str = "bouncer.dev/v1alpha1";
pub const KIND: &str = "BouncePolicy";

/// One validated BouncePolicy. Every field is already parsed and checked; defaults are applied.
#[derive(Debug, Clone)]
pub struct Policy {
    pub name: String,
    /// Where it came from, for messages: "policies/vmcp.yaml (document 2)".
    pub source: String,
    /// Empty means every namespace the install may touch.
    pub namespaces: Vec<String>,
    pub selector: Selector,
    /// Kinds of the owning workload this policy may bounce; never empty (defaults to
    /// the three controllers: `Pod` only when listed).
    pub kinds: Vec<Kind>,
    /// `target.groupBy`: a pod-template label whose value makes a restart group.
    pub group_by: Option<String>,
    pub schedule: Option<Schedule>,
    pub memory: Option<MemoryTrigger>,
    /// Memory-trigger windows; empty means any time.
    pub windows: Vec<Window>,
    pub cooldown: Duration,
    pub max_per_run: Option<u32>,
    pub allow_downtime: bool,
    /// `spec.dryRun`: planned as usual, its bounces reported and never carried out.
    pub dry_run: bool,
    /// `spec.suspend`: not evaluated; each workload it selects is a `suspended` skip.
    pub suspend: bool,
    pub restart: Restart,
    /// A PromQL query whose any result (or failure) blocks every bounce of the policy.
    pub block_when: Option<String>,
    /// How far override annotations may loosen the policy (`spec.overrides`).
    pub overrides: OverrideBounds,
    /// `spec.breaker`: None means no circuit breaker (the backoff after failures always holds).
    pub breaker: Option<Breaker>,
}

/// The loosest values override annotations may set. `None`: the policy's own value, so an
/// annotation can only make bouncer more careful. A threshold of the other kind than the
/// policy's (bytes against a percentage) is comparable with nothing, so it needs its bound.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OverrideBounds {
    pub min_memory_above: Option<u64>,
    pub min_percent_of_limit: Option<f64>,
    pub min_cooldown: Option<Duration>,
}

/// The circuit breaker: a workload bounced `max_bounces` times within `per` is not bounced
/// again until the oldest of those leaves the window, and each run that refuses it says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    pub max_bounces: u32,
    pub per: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MemoryTrigger {
    /// None only when a history trigger (growth, predict) stands alone.
    pub threshold: Option<Threshold>,
    /// Only this container's usage (and limit) counts; None means the sum over the pod.
    pub container: Option<String>,
    pub history: HistoryTriggers,
}

/// The memory triggers that read Prometheus history rather than one sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryTriggers {
    /// Over the threshold for this whole window; replaces the one-sample threshold trigger.
    pub sustained: Option<Duration>,
    pub growth: Option<Growth>,
    pub predict: Option<Predict>,
}

impl HistoryTriggers {
    /// The longest history any of them reads.
    pub fn lookback(&self) -> Option<Duration> {
        [
            self.sustained,
            self.growth.as_ref().map(|g| g.window),
            self.predict.as_ref().map(|p| p.window),
        ]
        .into_iter()
        .flatten()
        .max()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Growth {
    /// Bytes per `per`.
    pub above: u64,
    pub per: Duration,
    pub window: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Predict {
    pub before: Duration,
    pub window: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    Bytes(u64),
    /// Percent (0 < p <= 100) of the memory limit.
    PercentOfLimit(f64),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Restart {
    pub method: RestartMethod,
    /// None: the run's default (`--rollout-timeout`).
    pub timeout: Option<Duration>,
    pub on_revert: OnRevert,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum RestartMethod {
    /// Rolling restart for Deployments and RollingUpdate StatefulSets/DaemonSets; eviction for
    /// bare pods and OnDelete workloads.
    Auto,
    /// Rolling restart only; workloads that cannot roll are skipped.
    Rollout,
    /// Evict pods one at a time through the Eviction API.
    Evict,
    /// A Deployment that a ToolHive MCPServer owns is restarted through that resource: bouncer
    /// sets its `mcpserver.toolhive.stacklok.dev/restarted-at` annotation, the operator rolls
    /// the Deployment, and bouncer follows and verifies that rollout. Other workloads are
    /// restarted as with `auto`.
    Toolhive,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum OnRevert {
    /// Report the revert, fail the bounce and halt the queue. A restart another manager would
    /// undo (an applier owns restartedAt, or it reverted bouncer's last one) is not written:
    /// the workload is skipped (`restartPinned`, `revertedSince`).
    Fail,
    /// Report the revert, then evict the pods one at a time. A restart another manager would
    /// undo is not written: the pods are evicted instead.
    Evict,
}

/// The pod and pod-template label keys the policies read (their selectors and `groupBy`), plus
/// the StatefulSet revision label the verification reads: the snapshot keeps no other label,
/// which is most of a large cluster's memory.
pub fn label_keys(policies: &[Policy]) -> std::collections::BTreeSet<String> {
    let mut keys: std::collections::BTreeSet<String> = policies
        .iter()
        .flat_map(|p| p.selector.keys().chain(p.group_by.as_deref()))
        .map(str::to_string)
        .collect();
    keys.insert(crate::core::literals::REVISION_LABEL.to_string());
    keys
}

impl OnRevert {
    /// As the policy file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnRevert::Fail => "fail",
            OnRevert::Evict => "evict",
        }
    }
}

/// One valid policy document as JSON, for the loader's, the validator's and the schema's tests.
#[cfg(test)]
pub(crate) fn example_document() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "bouncer.dev/v1alpha1",
        "kind": "BouncePolicy",
        "metadata": {"name": "web"},
        "spec": {
            "target": {"selector": {"matchLabels": {"app": "web"}}},
            "triggers": {"schedule": {"cron": "0 3 * * *"}, "memory": {"above": "1Gi"}},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys_are_what_selectors_and_group_by_read() {
        let doc = serde_json::json!({
            "apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "mcp"},
            "spec": {
                "target": {"groupBy": "toolhive-name", "selector": {
                    "matchLabels": {"toolhive": "true"},
                    "matchExpressions": [{"key": "tier", "operator": "Exists"}]}},
                "triggers": {"schedule": {"cron": "0 3 * * *"}},
            },
        });
        let policies = parse_str("p.yaml", &doc.to_string()).unwrap();
        let keys: Vec<String> = label_keys(&policies).into_iter().collect();
        assert_eq!(
            keys,
            [
                "controller-revision-hash",
                "tier",
                "toolhive",
                "toolhive-name"
            ]
        );
    }
}
