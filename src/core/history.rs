//! Memory history and blocker answers from Prometheus, as plain data: what a run asks Prometheus
//! (`Needs`, and the PromQL it sends), and what came back (`Prometheus`). The asking is bounded:
//! one range query for every pod's history, by namespace and never by pod, plus one instant query
//! per distinct `blockWhen` query, however many workloads there are.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::core::policy::Policy;

/// The kubelet resource-metrics / cAdvisor series, with `namespace`, `pod` and `container` labels.
pub const WORKING_SET: &str = "container_memory_working_set_bytes";

/// Most points per series in one run's range query: enough to tell a spike from a plateau and to
/// fit a line, while a cluster's worth of pods stays a few MiB.
const POINTS: u64 = 120;
const MIN_STEP: Duration = Duration::from_secs(15);

/// One container's working set over time: (Unix seconds, bytes), oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub container: String,
    pub samples: Vec<(f64, f64)>,
}

/// The range query's answer, per pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// The query's resolution: samples closer than this cannot be told apart.
    pub step: Duration,
    /// (namespace, pod) to the pod's containers.
    pub pods: BTreeMap<(String, String), Vec<Series>>,
}

/// One result of a blocker query: its labels (an alert's carry `alertname`).
pub type Labels = BTreeMap<String, String>;

/// What this run knows from Prometheus.
#[derive(Debug, Clone, PartialEq)]
pub struct Prometheus {
    /// Why Prometheus is not there at all (not configured); history and blockers say the same.
    pub off: Option<String>,
    /// The history, or why it could not be read (then the history triggers are off).
    pub history: Result<History, String>,
    /// Each blocker query to its results, or to why it failed.
    pub blockers: BTreeMap<String, Result<Vec<Labels>, String>>,
}

impl Prometheus {
    pub fn off(why: impl Into<String>) -> Prometheus {
        let why = why.into();
        Prometheus {
            off: Some(why.clone()),
            history: Err(why),
            blockers: BTreeMap::new(),
        }
    }

    /// A blocker's answer; one that was not asked (Prometheus off) fails, so it blocks.
    pub fn blocker(&self, query: &str) -> Result<&[Labels], String> {
        match self.blockers.get(query) {
            Some(Ok(results)) => Ok(results),
            Some(Err(e)) => Err(e.clone()),
            None => Err(self
                .off
                .clone()
                .unwrap_or_else(|| "the query was not run".into())),
        }
    }
}

/// What the policies need from Prometheus this run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Needs {
    /// Namespaces whose history is read; None: every namespace. Empty: no history is needed.
    pub namespaces: Option<BTreeSet<String>>,
    /// The longest window any history trigger reads.
    pub lookback: Option<Duration>,
    pub blockers: BTreeSet<String>,
}

impl Needs {
    pub fn any(&self) -> bool {
        self.history() || !self.blockers.is_empty()
    }

    pub fn history(&self) -> bool {
        self.lookback.is_some() && self.namespaces.as_ref().is_none_or(|n| !n.is_empty())
    }

    /// The range query's resolution: at most `POINTS` points over the lookback.
    pub fn step(&self) -> Duration {
        let lookback = self.lookback.unwrap_or_default().as_secs();
        Duration::from_secs(lookback.div_ceil(POINTS)).max(MIN_STEP)
    }

    /// How far back the range query starts: one step more than the lookback, so the window's
    /// first instant has a sample.
    pub fn range(&self) -> Duration {
        self.lookback.unwrap_or_default() + self.step()
    }

    /// The one range query: every container's working set in the namespaces, deduplicated over
    /// scrape jobs (`max by`), without the pod-level (`container=""`) and sandbox (`POD`) series.
    pub fn history_query(&self) -> String {
        let namespace = match &self.namespaces {
            None => r#"namespace!="""#.to_string(),
            // Namespace names are DNS labels: nothing in them needs escaping in a regex.
            Some(set) => format!(
                r#"namespace=~"{}""#,
                set.iter().cloned().collect::<Vec<_>>().join("|")
            ),
        };
        format!(
            r#"max by (namespace, pod, container) ({WORKING_SET}{{{namespace},container!="",container!="POD"}})"#
        )
    }
}

/// What `policies` need, within `only` (`--namespaces`; empty: all).
pub fn needs(policies: &[Policy], only: &[String]) -> Needs {
    let mut needs = Needs {
        namespaces: Some(BTreeSet::new()),
        ..Needs::default()
    };
    for p in policies {
        // A suspended policy is not evaluated: nothing it would read is worth a query.
        if p.suspend {
            continue;
        }
        if let Some(q) = &p.block_when {
            needs.blockers.insert(q.clone());
        }
        let Some(lookback) = p.memory.as_ref().and_then(|m| m.history.lookback()) else {
            continue;
        };
        needs.lookback = needs.lookback.max(Some(lookback));
        let wanted: Option<Vec<&String>> = match (p.namespaces.is_empty(), only.is_empty()) {
            (true, true) => None,
            (true, false) => Some(only.iter().collect()),
            (false, true) => Some(p.namespaces.iter().collect()),
            (false, false) => Some(p.namespaces.iter().filter(|n| only.contains(n)).collect()),
        };
        match (wanted, &mut needs.namespaces) {
            (None, n) => *n = None,
            (Some(list), Some(set)) => set.extend(list.into_iter().cloned()),
            (Some(_), None) => {}
        }
    }
    needs
}

/// The names a blocker's results are reported by: each alert's `alertname`, else its labels.
pub fn result_names(results: &[Labels]) -> Vec<String> {
    let mut names: Vec<String> = results
        .iter()
        .map(|labels| match labels.get("alertname") {
            Some(name) => name.clone(),
            None => {
                let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
                format!("{{{}}}", pairs.join(","))
            }
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Seconds since the epoch as the core's instant type (Prometheus answers in float seconds).
pub fn instant(seconds: f64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis((seconds * 1000.0).round() as i64)
}

pub fn seconds(t: DateTime<Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::policy::parse_str;

    fn policies(yaml: &str) -> Vec<Policy> {
        parse_str("t.yaml", yaml).expect("valid")
    }

    const DOC: &str = r#"
apiVersion: bouncer.dev/v1alpha1
kind: BouncePolicy
metadata: {name: NAME}
spec:
  target: {namespaces: NS, selector: {matchLabels: {app: web}}}
  triggers: {memory: MEMORY}
  BLOCK
"#;

    fn doc(name: &str, ns: &str, memory: &str, block: &str) -> String {
        DOC.replace("NAME", name)
            .replace("NS", ns)
            .replace("MEMORY", memory)
            .replace("BLOCK", block)
    }

    #[test]
    fn one_history_query_over_the_namespaces_and_the_longest_window() {
        let text = [
            doc("a", "[shop]", "{above: 1Gi, sustained: 15m}", ""),
            doc(
                "b",
                "[toolhive, shop]",
                "{predict: {before: 2h, window: 6h}}",
                "",
            ),
            doc(
                "c",
                "[other]",
                "{above: 1Gi}",
                "blockWhen: {prometheus: 'ALERTS'}",
            ),
            doc(
                "d",
                "[other]",
                "{above: 1Gi}",
                "blockWhen: {prometheus: 'ALERTS'}",
            ),
        ]
        .join("---\n");
        let n = needs(&policies(&text), &[]);
        assert_eq!(n.lookback, Some(Duration::from_secs(6 * 3600)));
        assert_eq!(n.step(), Duration::from_secs(180));
        assert_eq!(n.range(), Duration::from_secs(6 * 3600 + 180));
        assert_eq!(
            n.history_query(),
            r#"max by (namespace, pod, container) (container_memory_working_set_bytes{namespace=~"shop|toolhive",container!="",container!="POD"})"#
        );
        // Two policies with one blocker query ask it once.
        assert_eq!(n.blockers.len(), 1);

        // --namespaces narrows the set; a policy over every namespace reads them all.
        let only = needs(&policies(&text), &["shop".into()]);
        assert_eq!(only.namespaces, Some(BTreeSet::from(["shop".to_string()])));
        let all = needs(
            &policies(&doc("e", "null", "{above: 1Gi, sustained: 5m}", "")),
            &[],
        );
        assert!(all.history_query().contains(r#"namespace!="""#));
        assert_eq!(all.step(), MIN_STEP);

        // Nothing reads history: no range query.
        let none = needs(&policies(&doc("f", "[x]", "{above: 1Gi}", "")), &[]);
        assert!(!none.history() && !none.any());
        let outside = needs(
            &policies(&doc("g", "[x]", "{above: 1Gi, sustained: 5m}", "")),
            &["y".into()],
        );
        assert!(!outside.history());
    }

    #[test]
    fn a_suspended_policy_asks_prometheus_nothing() {
        let text = doc(
            "s",
            "[shop]",
            "{above: 1Gi, sustained: 15m}",
            "blockWhen: {prometheus: 'ALERTS'}\n  suspend: true",
        );
        let n = needs(&policies(&text), &[]);
        assert!(!n.history() && !n.any(), "{n:?}");
    }

    #[test]
    fn blocker_results_are_named_by_alertname() {
        let alert = |name: &str| Labels::from([("alertname".into(), name.into())]);
        let bare = Labels::from([("job".into(), "api".into())]);
        assert_eq!(
            result_names(&[
                alert("NodeDown"),
                alert("DiskFull"),
                alert("NodeDown"),
                bare
            ]),
            ["DiskFull", "NodeDown", r#"{job="api"}"#]
        );
        let off = Prometheus::off("not configured");
        assert_eq!(off.blocker("up"), Err("not configured".to_string()));
    }
}
