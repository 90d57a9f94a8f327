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

struct Failure {
    detail: String,
    retry: bool,
}

/// Sends requests, each attempt (connection and body included) ending within `timeout`.
pub struct Sender {
    client: reqwest::Client,
    timeout: Duration,
    retries: u32,
}

impl Sender {
    pub fn new(timeout: Duration, retries: u32) -> Result<Sender, String> {
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
            .map_err(|e| chain(&e.without_url()))?;
        Ok(Sender {
            client,
            timeout,
            retries,
        })
    }

    async fn attempt(&self, req: &Request) -> Result<(), Failure> {
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
                let detail = if e.is_timeout() {
                    format!(
                        "timed out after {}",
                        humantime::format_duration(self.timeout)
                    )
                } else {
                    chain(&e)
                };
                return Err(Failure {
                    detail,
                    retry: true,
                });
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let body = response.text().await.unwrap_or_default();
        let mut detail = format!("HTTP {status}");
        if !body.trim().is_empty() {
            detail.push_str(&format!(": {}", excerpt(&body)));
        }
        let retry = status.is_server_error()
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || status == reqwest::StatusCode::REQUEST_TIMEOUT;
        Err(Failure { detail, retry })
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
                Err(f) if f.retry && n < last => {
                    tracing::warn!(
                        target = name,
                        attempt = n,
                        "notification failed, retrying: {}",
                        f.detail
                    );
                    tokio::time::sleep(backoff(n)).await;
                    n += 1;
                }
                Err(f) => {
                    tracing::error!(
                        target = name,
                        attempts = n,
                        "notification failed: {}",
                        f.detail
                    );
                    return Delivery {
                        target,
                        status: DeliveryStatus::Failed,
                        attempts: n,
                        detail: Some(f.detail),
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
}
