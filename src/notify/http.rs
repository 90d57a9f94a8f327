//! Delivering one notification over HTTP: a rustls client, a timeout per attempt, a bounded
//! number of retries for what can pass (timeouts, connection errors, 408, 429, 5xx), and an
//! error text that never contains the URL (a webhook's URL is its credential).

use std::time::Duration;

use super::{Delivery, DeliveryStatus, Target};
use crate::http_text::{chain, excerpt};

const USER_AGENT: &str = concat!("bouncer/", env!("CARGO_PKG_VERSION"));

pub struct Request {
    pub method: reqwest::Method,
    pub url: reqwest::Url,
    pub content_type: &'static str,
    pub body: String,
}

impl Request {
    pub fn post(url: &reqwest::Url, content_type: &'static str, body: String) -> Request {
        Request {
            method: reqwest::Method::POST,
            url: url.clone(),
            content_type,
            body,
        }
    }
}

/// The HTTP client could not be built (its TLS setup): no notification can be sent.
#[derive(Debug, thiserror::Error)]
#[error("{}", chain(.source))]
pub struct ClientError {
    #[source]
    source: reqwest::Error,
}

/// Why one attempt failed. The texts never name the URL: a webhook's URL is its credential.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error("timed out after {}", humantime::format_duration(*after))]
    TimedOut { after: Duration },
    /// No answer: the connection, TLS, or the request broke off.
    #[error("{}", chain(.source))]
    Unreachable {
        #[source]
        source: reqwest::Error,
    },
    /// An answer other than 2xx, with the start of its body when it has one.
    #[error("HTTP {status}{}", excerpt.as_deref().map(|e| format!(": {e}")).unwrap_or_default())]
    Status {
        status: reqwest::StatusCode,
        excerpt: Option<String>,
    },
}

impl AttemptError {
    /// Whether another attempt can pass: no answer, or one that says "later".
    fn retry(&self) -> bool {
        match self {
            AttemptError::TimedOut { .. } | AttemptError::Unreachable { .. } => true,
            AttemptError::Status { status, .. } => {
                status.is_server_error()
                    || *status == reqwest::StatusCode::TOO_MANY_REQUESTS
                    || *status == reqwest::StatusCode::REQUEST_TIMEOUT
            }
        }
    }
}

/// Sends requests, each attempt (connection and body included) ending within `timeout`.
pub struct Sender {
    client: reqwest::Client,
    timeout: Duration,
    retries: u32,
}

impl Sender {
    pub fn new(timeout: Duration, retries: u32) -> Result<Sender, ClientError> {
        // reqwest is built without a crypto provider of its own, so the binary carries only
        // ring, which kube uses as well. Installing it fails harmlessly when one is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .timeout(timeout)
            .connect_timeout(timeout)
            // A redirected POST would become a GET elsewhere; a webhook that moved is a failure.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ClientError {
                source: e.without_url(),
            })?;
        Ok(Sender {
            client,
            timeout,
            retries,
        })
    }

    async fn attempt(&self, req: &Request) -> Result<(), AttemptError> {
        let sent = self
            .client
            .request(req.method.clone(), req.url.clone())
            .header(reqwest::header::CONTENT_TYPE, req.content_type)
            .body(req.body.clone())
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                let e = e.without_url();
                return Err(if e.is_timeout() {
                    AttemptError::TimedOut {
                        after: self.timeout,
                    }
                } else {
                    AttemptError::Unreachable { source: e }
                });
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        // The status is the answer; a body that breaks off only loses the excerpt.
        let body = response.text().await.unwrap_or_default();
        let excerpt = (!body.trim().is_empty()).then(|| excerpt(&body));
        Err(AttemptError::Status { status, excerpt })
    }

    /// Sends `req`, retrying up to `retries` times, and says how it went. Logs each failure.
    pub async fn send(&self, target: Target, req: Request) -> Delivery {
        let name = target.as_str();
        let last = self.retries + 1;
        let mut n = 1;
        loop {
            match self.attempt(&req).await {
                Ok(()) => {
                    tracing::info!(target = name, attempts = n, "notification sent");
                    return Delivery {
                        target,
                        status: DeliveryStatus::Sent,
                        attempts: n,
                        detail: None,
                    };
                }
                Err(e) if e.retry() && n < last => {
                    tracing::warn!(
                        target = name,
                        attempt = n,
                        "notification failed, retrying: {e}"
                    );
                    tokio::time::sleep(backoff(n)).await;
                    n += 1;
                }
                Err(e) => {
                    tracing::error!(target = name, attempts = n, "notification failed: {e}");
                    return Delivery {
                        target,
                        status: DeliveryStatus::Failed,
                        attempts: n,
                        detail: Some(e.to_string()),
                    };
                }
            }
        }
    }
}

/// Pause before retry `n` (1-based): 0.5 s, 1 s, 2 s, then 2 s.
fn backoff(n: u32) -> Duration {
    Duration::from_millis(500 * 2u64.pow(n.saturating_sub(1).min(2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_short_and_capped() {
        let pauses: Vec<_> = (1..=5).map(backoff).collect();
        assert_eq!(
            pauses,
            [500, 1000, 2000, 2000, 2000].map(Duration::from_millis)
        );
    }

    #[test]
    fn an_answer_is_retried_only_when_it_says_later() {
        let status = |code: u16, excerpt: Option<&str>| AttemptError::Status {
            status: reqwest::StatusCode::from_u16(code).unwrap(),
            excerpt: excerpt.map(str::to_string),
        };
        for code in [500, 503, 429, 408] {
            assert!(status(code, None).retry(), "{code}");
        }
        for code in [400, 401, 403, 404, 301] {
            assert!(!status(code, None).retry(), "{code}");
        }
        let after = Duration::from_secs(5);
        assert!(AttemptError::TimedOut { after }.retry());
        // What the report's delivery detail reads.
        assert_eq!(
            status(404, Some("no_service")).to_string(),
            "HTTP 404 Not Found: no_service"
        );
        assert_eq!(
            status(500, None).to_string(),
            "HTTP 500 Internal Server Error"
        );
        assert_eq!(
            AttemptError::TimedOut { after }.to_string(),
            "timed out after 5s"
        );
    }

    /// A client error reads as the client's causes; here a request the builder refuses stands
    /// in for a TLS setup that fails, which a test cannot provoke.
    #[test]
    fn errors_without_an_answer_read_as_their_causes() {
        let sender = Sender::new(Duration::from_secs(1), 0).unwrap();
        let refused = sender
            .client
            .get("no-scheme")
            .build()
            .unwrap_err()
            .without_url();
        let text = chain(&refused);
        let unreachable = AttemptError::Unreachable { source: refused };
        assert!(unreachable.retry());
        assert_eq!(unreachable.to_string(), text);
        assert!(text.starts_with("builder error"), "{text}");
        let source = sender
            .client
            .get("no-scheme")
            .build()
            .unwrap_err()
            .without_url();
        assert_eq!(ClientError { source }.to_string(), text);
    }
}
