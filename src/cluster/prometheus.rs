//! Prometheus's HTTP API: the run's one range query for memory history and one instant query per
//! distinct blocker, each bounded by the timeout, answered into the core's plain `Prometheus`.
//! A failure never fails the run: it turns the history triggers off (with the reason) and makes
//! the blockers block.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::core::history::{self, History, Labels, Needs, Prometheus, Series};
use crate::http_text::{chain, excerpt};

const USER_AGENT: &str = concat!("bouncer/", env!("CARGO_PKG_VERSION"));

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The server's base URL, e.g. http://prometheus.monitoring:9090 (a path prefix is kept).
    pub url: reqwest::Url,
    /// Read at every run (a mounted ServiceAccount token is rotated).
    pub bearer_token_file: Option<PathBuf>,
    /// PEM bundle of the CAs that sign the server's certificate, added to the system roots.
    pub ca_file: Option<PathBuf>,
    /// Per query, connection included.
    pub timeout: Duration,
}

/// What the policies need, read from Prometheus at `now`.
pub async fn read(settings: Option<&Settings>, needs: &Needs, now: DateTime<Utc>) -> Prometheus {
    let Some(settings) = settings else {
        return Prometheus::off("no Prometheus configured (--prometheus-url)");
    };
    if !needs.any() {
        return Prometheus {
            off: None,
            history: Err("no policy reads memory history".into()),
            blockers: BTreeMap::new(),
        };
    }
    let api = match Api::new(settings) {
        Ok(api) => api,
        Err(e) => return Prometheus::off(format!("Prometheus: {e}")),
    };
    let history = async {
        if !needs.history() {
            return Err("no policy reads memory history in the namespaces".to_string());
        }
        let range = chrono::Duration::from_std(needs.range()).unwrap_or_default();
        let params = [
            ("query", needs.history_query()),
            ("start", format!("{:.3}", history::seconds(now - range))),
            ("end", format!("{:.3}", history::seconds(now))),
            ("step", needs.step().as_secs().to_string()),
        ];
        let data = api.query("query_range", &params).await?;
        let history = to_history(data, needs.step())?;
        Ok(history)
    };
    let blockers = futures::future::join_all(needs.blockers.iter().map(|q| async {
        let params = [
            ("query", q.clone()),
            ("time", format!("{:.3}", history::seconds(now))),
        ];
        let answer = match api.query("query", &params).await {
            Ok(data) => to_results(data),
            Err(e) => Err(e),
        };
        (q.clone(), answer)
    }));
    let (history, blockers) = futures::future::join(history, blockers).await;
    let history = history.map_err(|e| format!("Prometheus history unavailable: {e}"));
    if let Err(e) = &history {
        tracing::warn!("{e}; memory sustained/growth/predict triggers are off");
    }
    Prometheus {
        off: None,
        history,
        blockers: blockers.into_iter().collect(),
    }
}

struct Api {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Api {
    fn new(s: &Settings) -> Result<Api, String> {
        // As for the webhooks: only ring is compiled in; installing it twice fails harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .timeout(s.timeout)
            .connect_timeout(s.timeout);
        if let Some(path) = &s.ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| format!("cannot read the CA file {}: {e}", path.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("the CA file {} is not PEM: {e}", path.display()))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        if s.bearer_token_file.is_some() {
            // The settings refuse a token with an http:// URL; a redirect must not downgrade it.
            if s.url.scheme() != "https" {
                return Err(format!(
                    "a bearer token is sent only over https, not to {}",
                    s.url
                ));
            }
            builder = builder.redirect(reqwest::redirect::Policy::custom(|attempt| {
                if attempt.url().scheme() != "https" {
                    let to = attempt.url().to_string();
                    attempt.error(format!(
                        "a redirect to {to} would send the bearer token in clear"
                    ))
                } else if attempt.previous().len() >= 10 {
                    attempt.error("too many redirects")
                } else {
                    attempt.follow()
                }
            }));
        }
        let token = match &s.bearer_token_file {
            None => None,
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?
                    .trim()
                    .to_string(),
            ),
        };
        Ok(Api {
            client: builder.build().map_err(|e| e.to_string())?,
            base: s.url.as_str().trim_end_matches('/').to_string(),
            token,
        })
    }

    /// POSTs the form (a long namespace list stays out of the URL) and returns `data`.
    async fn query(&self, endpoint: &str, params: &[(&str, String)]) -> Result<Data, String> {
        let started = Instant::now();
        let mut form = reqwest::Url::parse("http://form.invalid/").map_err(|e| e.to_string())?;
        form.query_pairs_mut().extend_pairs(params);
        let mut request = self
            .client
            .post(format!("{}/api/v1/{endpoint}", self.base))
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(form.query().unwrap_or_default().to_string());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| chain(&e.without_url()))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| chain(&e.without_url()))?;
        let answer: Answer = serde_json::from_str(&body).map_err(|e| {
            format!(
                "HTTP {status}: not a Prometheus API answer ({e}): {}",
                excerpt(&body)
            )
        })?;
        tracing::debug!(
            endpoint,
            ms = started.elapsed().as_millis() as u64,
            bytes = body.len(),
            "Prometheus query"
        );
        match (answer.status.as_str(), answer.data) {
            ("success", Some(data)) => Ok(data),
            _ => Err(format!(
                "HTTP {status}: {}: {}",
                answer.error_type.unwrap_or_else(|| "error".into()),
                answer.error.unwrap_or_default()
            )),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    status: String,
    data: Option<Data>,
    error_type: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct MatrixItem {
    metric: Labels,
    values: Vec<(f64, String)>,
}

#[derive(Deserialize)]
struct VectorItem {
    metric: Labels,
}

fn to_history(data: Data, step: Duration) -> Result<History, String> {
    if data.result_type != "matrix" {
        return Err(format!("expected a matrix, got a {}", data.result_type));
    }
    let items: Vec<MatrixItem> =
        serde_json::from_value(data.result).map_err(|e| format!("unreadable matrix: {e}"))?;
    let mut history = History {
        step,
        pods: BTreeMap::new(),
    };
    for item in items {
        let label = |name: &str| item.metric.get(name).cloned();
        let (Some(namespace), Some(pod), Some(container)) =
            (label("namespace"), label("pod"), label("container"))
        else {
            continue;
        };
        // "NaN" and "+Inf" parse as floats; neither is a working set.
        let samples = item
            .values
            .iter()
            .filter_map(|(t, v)| v.parse::<f64>().ok().map(|v| (*t, v)))
            .filter(|(_, v)| v.is_finite() && *v >= 0.0)
            .collect();
        history
            .pods
            .entry((namespace, pod))
            .or_default()
            .push(Series { container, samples });
    }
    Ok(history)
}

fn to_results(data: Data) -> Result<Vec<Labels>, String> {
    match data.result_type.as_str() {
        "vector" => serde_json::from_value::<Vec<VectorItem>>(data.result)
            .map(|items| items.into_iter().map(|i| i.metric).collect())
            .map_err(|e| format!("unreadable vector: {e}")),
        // A scalar or string is one result: a blocker written as `1` blocks.
        "scalar" | "string" => Ok(vec![Labels::new()]),
        other => Err(format!(
            "a blocker must be an instant vector query, got a {other}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(json: serde_json::Value) -> Data {
        serde_json::from_value::<Answer>(json)
            .unwrap()
            .data
            .unwrap()
    }

    #[test]
    fn a_matrix_becomes_per_pod_series() {
        let d = data(
            serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {"namespace": "shop", "pod": "web-1", "container": "app"},
                 "values": [[1700000000, "100"], [1700000015.5, "NaN"], [1700000030, "300"]]},
                {"metric": {"namespace": "shop", "pod": "web-1", "container": "proxy"}, "values": [[1700000000, "5"]]},
                {"metric": {"pod": "no-namespace", "container": "x"}, "values": [[1700000000, "1"]]}
            ]}}),
        );
        let h = to_history(d, Duration::from_secs(15)).unwrap();
        let web = &h.pods[&("shop".to_string(), "web-1".to_string())];
        assert_eq!(web.len(), 2);
        assert_eq!(web[0].container, "app");
        assert_eq!(web[0].samples, [(1.7e9, 100.0), (1_700_000_030.0, 300.0)]);
        assert_eq!(h.pods.len(), 1);
    }

    /// Even settings made without the command line's check never send a token in clear.
    #[test]
    fn a_bearer_token_is_never_sent_to_plain_http() {
        let settings = |url: &str| Settings {
            url: url.parse().unwrap(),
            bearer_token_file: Some("/nonexistent/token".into()),
            ca_file: None,
            timeout: Duration::from_secs(1),
        };
        let Err(e) = Api::new(&settings("http://prometheus.monitoring:9090")) else {
            panic!("an http URL with a token was accepted");
        };
        assert!(e.contains("only over https"), "{e}");
        // Over https the same settings get as far as reading the token file.
        let Err(e) = Api::new(&settings("https://prometheus.monitoring:9090")) else {
            panic!("a missing token file was accepted");
        };
        assert!(e.contains("cannot read the token file"), "{e}");
    }

    #[test]
    fn blocker_answers() {
        let firing = data(
            serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"alertname": "NodeDown", "severity": "critical"}, "value": [1700000000, "1"]}
            ]}}),
        );
        let got = to_results(firing).unwrap();
        assert_eq!(history::result_names(&got), ["NodeDown"]);
        let empty = data(
            serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": []}}),
        );
        assert_eq!(to_results(empty).unwrap(), Vec::<Labels>::new());
        let matrix = data(
            serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": []}}),
        );
        assert!(to_results(matrix).unwrap_err().contains("instant vector"));
    }
}
