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

/// An HTTP status as the edge saw it, e.g. `400 Bad Request` (the core names no HTTP type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpStatus {
    pub code: u16,
    /// The canonical reason phrase, when the code has one.
    pub reason: Option<&'static str>,
}

impl std::fmt::Display for HttpStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As the HTTP client prints a status, so the texts read as they always did.
        let reason = self.reason.unwrap_or("<unknown status code>");
        write!(f, "{} {reason}", self.code)
    }
}

/// Why a query has no usable answer from Prometheus, or was never sent. Built at the edge from
/// the client's errors as plain data, so a plan can say why and a caller can tell the cases
/// apart; `url` is the server's base URL without credentials.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueryError {
    /// No `--prometheus-url`: the history triggers are off and the blockers block.
    #[error("no Prometheus configured (--prometheus-url)")]
    NotConfigured,
    /// No policy of this run reads memory history, so the range query was not sent.
    #[error("no policy reads memory history")]
    NotNeeded,
    /// A query this run did not send (a blocker nobody asked for).
    #[error("the query was not run")]
    NotRun,
    /// The client could not be set up (CA file, token file, a token over http): nothing was sent.
    #[error("Prometheus at {url} not asked: {detail}")]
    Client { url: String, detail: String },
    /// No answer: the connection, TLS, or the answer broke off.
    #[error("no answer from Prometheus at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    /// No answer within `--prometheus-timeout`.
    #[error(
        "no answer from Prometheus at {url} within {} (--prometheus-timeout)",
        humantime::format_duration(*after)
    )]
    TimedOut { url: String, after: Duration },
    /// An answer that is not the API's JSON: a proxy's page, or a URL that is not Prometheus.
    #[error("HTTP {status} from {url}: not a Prometheus API answer ({detail}): {excerpt}")]
    NotAnAnswer {
        url: String,
        status: HttpStatus,
        detail: String,
        excerpt: String,
    },
    /// Prometheus refused the query: `error_type` is its own (`bad_data`, `timeout`, ...).
    #[error("HTTP {status}: {error_type}: {error}")]
    Refused {
        status: HttpStatus,
        error_type: String,
        error: String,
    },
    /// The history query answered something other than a range vector.
    #[error("expected a matrix, got a {got}")]
    NotAMatrix { got: String },
    /// A blocker answered a range vector: it must be an instant query.
    #[error("a blocker must be an instant vector query, got a {got}")]
    NotInstant { got: String },
    /// The result had the right type but not the shape of one.
    #[error("unreadable {what}: {detail}")]
    Unreadable { what: &'static str, detail: String },
}

impl QueryError {
    /// Whether the query reached Prometheus (or tried to), as opposed to never being sent.
    pub fn was_sent(&self) -> bool {
        !matches!(
            self,
            QueryError::NotConfigured
                | QueryError::NotNeeded
                | QueryError::NotRun
                | QueryError::Client { .. }
        )
    }
}

/// What this run knows from Prometheus.
#[derive(Debug, Clone, PartialEq)]
pub struct Prometheus {
    /// Why Prometheus is not asked at all; history and blockers say the same.
    pub off: Option<QueryError>,
    /// The history, or why it could not be read (then the history triggers are off).
    pub history: Result<History, QueryError>,
    /// Each blocker query to its results, or to why it failed.
    pub blockers: BTreeMap<String, Result<Vec<Labels>, QueryError>>,
}

impl Prometheus {
    pub fn off(why: QueryError) -> Prometheus {
        Prometheus {
            off: Some(why.clone()),
            history: Err(why),
            blockers: BTreeMap::new(),
        }
    }

    /// A blocker's answer; one that was not asked (Prometheus off) fails, so it blocks.
    pub fn blocker(&self, query: &str) -> Result<&[Labels], QueryError> {
        match self.blockers.get(query) {
            Some(Ok(results)) => Ok(results),
            Some(Err(e)) => Err(e.clone()),
            None => Err(self.off.clone().unwrap_or(QueryError::NotRun)),
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
    }

    #[test]
    fn a_blocker_without_an_answer_fails_with_the_reason() {
        let off = Prometheus::off(QueryError::NotConfigured);
        assert_eq!(off.blocker("up"), Err(QueryError::NotConfigured));
        let asked = Prometheus {
            off: None,
            history: Err(QueryError::NotNeeded),
            blockers: BTreeMap::from([("up".to_string(), Ok(vec![]))]),
        };
        assert_eq!(asked.blocker("up"), Ok(&[][..]));
        assert!(matches!(asked.blocker("down"), Err(QueryError::NotRun)));
    }

    /// The wording a plan's reasons quote: where, what, and what to change.
    #[test]
    fn query_errors_read_as_the_plan_quotes_them() {
        let url = "http://prometheus.monitoring:9090".to_string();
        let status = |code, reason| HttpStatus {
            code,
            reason: Some(reason),
        };
        let cases = [
            (
                QueryError::NotConfigured,
                "no Prometheus configured (--prometheus-url)",
            ),
            (QueryError::NotNeeded, "no policy reads memory history"),
            (QueryError::NotRun, "the query was not run"),
            (
                QueryError::Client {
                    url: url.clone(),
                    detail: "cannot read the CA file /etc/ca.pem: No such file or directory (os error 2)"
                        .into(),
                },
                "Prometheus at http://prometheus.monitoring:9090 not asked: cannot read the CA file /etc/ca.pem: No such file or directory (os error 2)",
            ),
            (
                QueryError::Unreachable {
                    url: url.clone(),
                    detail: "error sending request: connection refused".into(),
                },
                "no answer from Prometheus at http://prometheus.monitoring:9090: error sending request: connection refused",
            ),
            (
                QueryError::TimedOut {
                    url: url.clone(),
                    after: Duration::from_secs(10),
                },
                "no answer from Prometheus at http://prometheus.monitoring:9090 within 10s (--prometheus-timeout)",
            ),
            (
                QueryError::NotAnAnswer {
                    url: url.clone(),
                    status: status(404, "Not Found"),
                    detail: "expected value at line 1 column 1".into(),
                    excerpt: "404 page not found".into(),
                },
                "HTTP 404 Not Found from http://prometheus.monitoring:9090: not a Prometheus API answer (expected value at line 1 column 1): 404 page not found",
            ),
            (
                QueryError::Refused {
                    status: status(400, "Bad Request"),
                    error_type: "bad_data".into(),
                    error: "1:6: parse error: unexpected end of input".into(),
                },
                "HTTP 400 Bad Request: bad_data: 1:6: parse error: unexpected end of input",
            ),
            (
                QueryError::NotAMatrix {
                    got: "vector".into(),
                },
                "expected a matrix, got a vector",
            ),
            (
                QueryError::NotInstant {
                    got: "matrix".into(),
                },
                "a blocker must be an instant vector query, got a matrix",
            ),
            (
                QueryError::Unreadable {
                    what: "vector",
                    detail: "invalid type: string, expected a map".into(),
                },
                "unreadable vector: invalid type: string, expected a map",
            ),
        ];
        for (error, text) in cases {
            assert_eq!(error.to_string(), text);
        }
        let odd = HttpStatus {
            code: 599,
            reason: None,
        };
        assert_eq!(odd.to_string(), "599 <unknown status code>");
        assert!(!QueryError::NotConfigured.was_sent());
        assert!(
            QueryError::NotAMatrix {
                got: "vector".into()
            }
            .was_sent()
        );
    }
}
