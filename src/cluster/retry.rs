//! Retries of API calls: which errors are worth another try, and a bounded backoff.

use std::future::Future;
use std::time::Duration;

/// Errors worth another try: throttling, server errors, conflicts and connection failures.
pub fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 409 || s.code == 429 || s.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Runs `op` until it succeeds, fails permanently, or five tries with 0.5-8 s backoff are spent.
pub async fn with_retries<T, F, Fut>(what: &str, mut op: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut delay = Duration::from_millis(500);
    let mut tries = 1;
    loop {
        match op().await {
            Err(e) if transient(&e) && tries < 5 => {
                tracing::warn!("{what}: {e}; retrying in {delay:?}");
                tokio::time::sleep(delay).await;
                delay *= 2;
                tries += 1;
            }
            other => return other,
        }
    }
}
