//! Prometheus's HTTP API: the run's one range query for memory history and one instant query per
//! distinct blocker, each bounded by the timeout, answered into the core's plain `Prometheus`.
//! A failure never fails the run: it turns the history triggers off (with the reason) and makes
//! the blockers block.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Deserialize;

use crate::core::history::{
    self, History, HttpStatus, Labels, Needs, Prometheus, QueryError, Series,
};
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
        return Prometheus::off(QueryError::NotConfigured);
    };
    if !needs.any() {
        return Prometheus {
            off: None,
            history: Err(QueryError::NotNeeded),
            blockers: BTreeMap::new(),
        };
    }
    let api = match Api::new(settings) {
        Ok(api) => api,
        Err(e) => {
            return Prometheus::off(QueryError::Client {
                url: shown(&settings.url),
                detail: chain(&e),
            });
        }
    };
    let history = async {
        if !needs.history() {
            return Err(QueryError::NotNeeded);
        }
        let range = chrono::Duration::from_std(needs.range()).unwrap_or_default();
        let params = [
            ("query", needs.history_query()),
            ("start", format!("{:.3}", history::seconds(now - range))),
            ("end", format!("{:.3}", history::seconds(now))),
            ("step", needs.step().as_secs().to_string()),
        ];
        let data = api.query("query_range", &params).await?;
        to_history(data, needs.step())
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
    if let Err(e) = &history
        && e.was_sent()
    {
        tracing::warn!(
            "Prometheus history unavailable: {e}; memory sustained/growth/predict triggers are off"
        );
    }
    Prometheus {
        off: None,
        history,
        blockers: blockers.into_iter().collect(),
    }
}

/// Why the client could not be set up; then nothing is asked and every query fails with it.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot read the CA file {}: {source}", path.display())]
    CaFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the CA file {} is not PEM: {}", path.display(), chain(source))]
    CaNotPem {
        path: PathBuf,
        #[source]
        source: reqwest::Error,
    },
    /// The settings refuse this already; settings made another way must not leak the token.
    #[error("a bearer token is sent only over https, not to {url}: use an https:// URL")]
    TokenInClear { url: String },
    #[error("cannot read the token file {}: {source}", path.display())]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the HTTP client: {}", chain(source))]
    Build {
        #[source]
        source: reqwest::Error,
    },
}

/// Why a redirect is not followed; the HTTP client reports it as the request's cause.
#[derive(Debug, thiserror::Error)]
enum RedirectError {
    #[error("a redirect to {to} would send the bearer token in clear")]
    InClear { to: String },
    #[error("too many redirects")]
    TooMany,
}

/// A URL as messages show it: without the user and password it may carry (basic auth).
fn shown(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    // Only a URL that cannot be a base refuses these, and an http(s) URL always can.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}

fn status(s: reqwest::StatusCode) -> HttpStatus {
    HttpStatus {
        code: s.as_u16(),
        reason: s.canonical_reason(),
    }
}

struct Api {
    client: reqwest::Client,
    /// The server's base URL, the one that carries the credentials, if any.
    url: reqwest::Url,
    token: Option<String>,
    timeout: Duration,
}

impl Api {
    fn new(s: &Settings) -> Result<Api, ClientError> {
        // As for the webhooks: only ring is compiled in; installing it twice fails harmlessly.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .timeout(s.timeout)
            .connect_timeout(s.timeout);
        if let Some(path) = &s.ca_file {
            let pem = std::fs::read(path).map_err(|source| ClientError::CaFile {
                path: path.clone(),
                source,
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|source| {
                ClientError::CaNotPem {
                    path: path.clone(),
                    source,
                }
            })?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        if s.bearer_token_file.is_some() {
            // The settings refuse a token with an http:// URL; a redirect must not downgrade it.
            if s.url.scheme() != "https" {
                return Err(ClientError::TokenInClear { url: shown(&s.url) });
            }
            builder = builder.redirect(reqwest::redirect::Policy::custom(|attempt| {
                if attempt.url().scheme() != "https" {
                    let to = shown(attempt.url());
                    attempt.error(RedirectError::InClear { to })
                } else if attempt.previous().len() >= 10 {
                    attempt.error(RedirectError::TooMany)
                } else {
                    attempt.follow()
                }
            }));
        }
        let token = match &s.bearer_token_file {
            None => None,
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|source| ClientError::TokenFile {
                        path: path.clone(),
                        source,
                    })?
                    .trim()
                    .to_string(),
            ),
        };
        let client = builder.build().map_err(|source| ClientError::Build {
            source: source.without_url(),
        })?;
        Ok(Api {
            client,
            url: s.url.clone(),
            token,
            timeout: s.timeout,
        })
    }

    /// No answer at all: the connection, TLS, the body, or the timeout.
    fn unreachable(&self, e: reqwest::Error) -> QueryError {
        // The URL the client names may carry credentials; the message names the shown one.
        let e = e.without_url();
        let url = shown(&self.url);
        if e.is_timeout() {
            QueryError::TimedOut {
                url,
                after: self.timeout,
            }
        } else {
            QueryError::Unreachable {
                url,
                detail: chain(&e),
            }
        }
    }

    /// POSTs the form (a long namespace list stays out of the URL) and returns `data`.
    async fn query(&self, endpoint: &str, params: &[(&str, String)]) -> Result<Data, QueryError> {
        let started = Instant::now();
        // The form is encoded as a query string is; the URL around it is not sent.
        let mut form = self.url.clone();
        form.set_query(None);
        form.query_pairs_mut().extend_pairs(params);
        let base = self.url.as_str().trim_end_matches('/');
        let mut request = self
            .client
            .post(format!("{base}/api/v1/{endpoint}"))
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(form.query().unwrap_or_default().to_string());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| self.unreachable(e))?;
        let code = response.status();
        let body = response.text().await.map_err(|e| self.unreachable(e))?;
        tracing::debug!(
            endpoint,
            ms = started.elapsed().as_millis() as u64,
            bytes = body.len(),
            "Prometheus query"
        );
        answer(&self.url, status(code), &body)
    }
}

/// An answer's `data`, or why there is none: not the API's JSON, or Prometheus's own error.
fn answer(url: &reqwest::Url, status: HttpStatus, body: &str) -> Result<Data, QueryError> {
    let answer: Answer = serde_json::from_str(body).map_err(|e| QueryError::NotAnAnswer {
        url: shown(url),
        status,
        detail: e.to_string(),
        excerpt: excerpt(body),
    })?;
    match (answer.status.as_str(), answer.data) {
        ("success", Some(data)) => Ok(data),
        _ => Err(QueryError::Refused {
            status,
            error_type: answer.error_type.unwrap_or_else(|| "error".into()),
            error: answer.error.unwrap_or_default(),
        }),
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

#[derive(Debug, Deserialize)]
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

fn to_history(data: Data, step: Duration) -> Result<History, QueryError> {
    if data.result_type != "matrix" {
        return Err(QueryError::NotAMatrix {
            got: data.result_type,
        });
    }
    let items: Vec<MatrixItem> =
        serde_json::from_value(data.result).map_err(|e| QueryError::Unreadable {
            what: "matrix",
            detail: e.to_string(),
        })?;
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

fn to_results(data: Data) -> Result<Vec<Labels>, QueryError> {
    match data.result_type.as_str() {
        "vector" => serde_json::from_value::<Vec<VectorItem>>(data.result)
            .map(|items| items.into_iter().map(|i| i.metric).collect())
            .map_err(|e| QueryError::Unreadable {
                what: "vector",
                detail: e.to_string(),
            }),
        // A scalar or string is one result: a blocker written as `1` blocks.
        "scalar" | "string" => Ok(vec![Labels::new()]),
        _ => Err(QueryError::NotInstant {
            got: data.result_type,
        }),
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
        let Err(e) = Api::new(&settings(
            "http://bouncer:secret@prometheus.monitoring:9090",
        )) else {
            panic!("an http URL with a token was accepted");
        };
        assert!(matches!(e, ClientError::TokenInClear { .. }), "{e:?}");
        // The message names the server, not the password in its URL.
        assert_eq!(
            e.to_string(),
            "a bearer token is sent only over https, not to http://prometheus.monitoring:9090/: use an https:// URL"
        );
        // Over https the same settings get as far as reading the token file.
        let Err(e) = Api::new(&settings("https://prometheus.monitoring:9090")) else {
            panic!("a missing token file was accepted");
        };
        assert!(
            matches!(&e, ClientError::TokenFile { path, .. } if path.ends_with("token")),
            "{e:?}"
        );
        assert!(
            chain(&e).starts_with("cannot read the token file /nonexistent/token: "),
            "{e}"
        );
    }

    #[test]
    fn a_ca_file_that_is_missing_or_not_pem_stops_the_client() {
        let settings = |ca: &std::path::Path| Settings {
            url: "https://prometheus.monitoring:9090".parse().unwrap(),
            bearer_token_file: None,
            ca_file: Some(ca.to_path_buf()),
            timeout: Duration::from_secs(1),
        };
        let missing = std::path::Path::new("/nonexistent/ca.pem");
        let Err(e) = Api::new(&settings(missing)) else {
            panic!("a missing CA file was accepted");
        };
        assert!(matches!(e, ClientError::CaFile { .. }), "{e:?}");
        let dir = std::env::temp_dir().join(format!("bouncer-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let garbage = dir.join("ca.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let got = Api::new(&settings(&garbage));
        std::fs::remove_dir_all(&dir).unwrap();
        let Err(e) = got else {
            panic!("a CA file that is not PEM was accepted");
        };
        assert!(matches!(e, ClientError::CaNotPem { .. }), "{e:?}");
        assert!(e.to_string().contains("is not PEM: builder error"), "{e}");
    }

    #[test]
    fn shown_urls_carry_no_credentials() {
        let url = "https://bouncer:secret@prometheus.monitoring:9090/prom/"
            .parse()
            .unwrap();
        assert_eq!(shown(&url), "https://prometheus.monitoring:9090/prom/");
    }

    #[test]
    fn an_answer_that_is_not_the_api_or_an_error_says_what_came_back() {
        let url: reqwest::Url = "http://admin:pw@prometheus.monitoring:9090"
            .parse()
            .unwrap();
        let proxy = answer(
            &url,
            status(reqwest::StatusCode::BAD_GATEWAY),
            "<html>\n  <h1>502 Bad Gateway</h1>\n</html>",
        );
        let Err(e) = proxy else {
            panic!("HTML read as an answer")
        };
        assert!(
            matches!(&e, QueryError::NotAnAnswer { status, .. } if status.code == 502),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "HTTP 502 Bad Gateway from http://prometheus.monitoring:9090/: not a Prometheus API answer (expected value at line 1 column 1): <html> <h1>502 Bad Gateway</h1> </html>"
        );
        let refused = answer(
            &url,
            status(reqwest::StatusCode::BAD_REQUEST),
            r#"{"status":"error","errorType":"bad_data","error":"1:6: parse error: unexpected end of input"}"#,
        );
        assert!(
            matches!(&refused, Err(QueryError::Refused { error_type, .. }) if error_type == "bad_data"),
            "{refused:?}"
        );
        let ok = answer(
            &url,
            status(reqwest::StatusCode::OK),
            r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
        );
        assert_eq!(to_results(ok.unwrap()).unwrap(), Vec::<Labels>::new());
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
        assert!(
            matches!(to_results(matrix), Err(QueryError::NotInstant { got }) if got == "matrix")
        );
        let odd = data(
            serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": "x"}}),
        );
        assert!(matches!(
            to_results(odd),
            Err(QueryError::Unreadable { what: "vector", .. })
        ));
    }

    #[test]
    fn a_history_answer_must_be_a_matrix() {
        let vector = data(
            serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": []}}),
        );
        assert!(matches!(
            to_history(vector, Duration::from_secs(15)),
            Err(QueryError::NotAMatrix { got }) if got == "vector"
        ));
        let odd = data(
            serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": [1]}}),
        );
        assert!(matches!(
            to_history(odd, Duration::from_secs(15)),
            Err(QueryError::Unreadable { what: "matrix", .. })
        ));
    }
}
