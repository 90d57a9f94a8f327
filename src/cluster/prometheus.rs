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
use crate::http_text::{chain, excerpt, shown_url as shown};

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
#[path = "prometheus_tests.rs"]
mod tests;
