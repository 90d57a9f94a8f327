//! WATCHes, read in the slim wire forms like every other answer: `follow` lists (or starts from
//! a known resourceVersion), then watches, resumes from the last version seen when the server ends
//! a watch, and lists again when the version has expired or the connection broke for good. The
//! rollout wait (kubectl's rules from `core::rollout`) and the wait for an evicted pod's
//! replacement are built on it.

use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::core::Request;
use serde::de::DeserializeOwned;

use super::kinds;
use super::list::pages;
use super::wire::{self, Object};
use crate::core::model::{Kind, Workload, WorkloadRef};
use crate::core::rollout::{self, RolloutState};

/// What a watch saw.
pub enum Seen<W> {
    /// The whole current set (a LIST, at the start or after the watch had to start over).
    Listed(Vec<W>),
    Applied(W),
    Deleted(W),
}

/// Which objects: a label selector or a field selector, as kubectl's `-l` / `--field-selector`.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub labels: Option<String>,
    pub fields: Option<String>,
}

impl Filter {
    fn list(&self) -> ListParams {
        let mut p = ListParams::default();
        if let Some(l) = &self.labels {
            p = p.labels(l);
        }
        if let Some(f) = &self.fields {
            p = p.fields(f);
        }
        p
    }

    fn watch(&self) -> WatchParams {
        // Below the server's minimum request timeout, so the server, not the network, ends it.
        let mut p = WatchParams::default().timeout(290);
        if let Some(l) = &self.labels {
            p = p.labels(l);
        }
        if let Some(f) = &self.fields {
            p = p.fields(f);
        }
        p
    }
}

const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Follows the objects at `url` matching `filter` until `on` returns `Some`, starting from
/// `from` (a resourceVersion) when given, else from a LIST. Never returns otherwise: the caller
/// bounds it with a timeout. Failures are logged and retried with a backoff of up to 5 s.
pub async fn follow<W, R>(
    client: &Client,
    url: &str,
    filter: &Filter,
    from: Option<String>,
    mut on: impl FnMut(Seen<W>) -> Option<R>,
) -> R
where
    W: DeserializeOwned + Clone + Object,
{
    let mut version = from;
    let mut backoff = Duration::from_millis(250);
    loop {
        let from = match version.take() {
            Some(v) => v,
            None => {
                let mut items = Vec::new();
                match pages(client, url, &filter.list(), |w: W| items.push(w)).await {
                    Ok(listed) => {
                        if let Some(done) = on(Seen::Listed(items)) {
                            return done;
                        }
                        listed.unwrap_or_default()
                    }
                    Err(e) => {
                        tracing::warn!("listing {url}: {e}; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                        continue;
                    }
                }
            }
        };
        let events = match Request::new(url).watch(&filter.watch(), &from) {
            Ok(req) => client.request_events::<W>(req).await,
            Err(e) => Err(kube::Error::BuildRequest(e)),
        };
        let events = match events {
            Ok(events) => events,
            Err(e) => {
                tracing::debug!("watch of {url} from {from} failed, listing again: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let mut events = std::pin::pin!(events);
        let mut resume = Some(from);
        let mut progressed = false;
        while let Some(event) = events.next().await {
            let seen = match event {
                Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => {
                    resume = o.meta().resource_version.clone().or(resume);
                    Seen::Applied(o)
                }
                Ok(WatchEvent::Deleted(o)) => {
                    resume = o.meta().resource_version.clone().or(resume);
                    Seen::Deleted(o)
                }
                Ok(WatchEvent::Bookmark(b)) => {
                    resume = Some(b.metadata.resource_version);
                    continue;
                }
                // 410 Gone (the version expired) or another refusal: start over from a LIST.
                Ok(WatchEvent::Error(status)) => {
                    tracing::debug!("watch of {url} ended: {}", status.message);
                    resume = None;
                    break;
                }
                Err(e) => {
                    tracing::debug!("watch of {url} broke: {e}");
                    break;
                }
            };
            progressed = true;
            if let Some(done) = on(seen) {
                return done;
            }
        }
        version = resume;
        if progressed {
            backoff = Duration::from_millis(250);
        } else {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("rollout of {target} did not complete within {}: {last}", humantime::format_duration(*timeout))]
    Timeout {
        target: WorkloadRef,
        timeout: Duration,
        last: String,
    },
    #[error("rollout of {target} failed: {reason}")]
    Failed { target: WorkloadRef, reason: String },
    #[error("{target} was deleted during the rollout")]
    Deleted { target: WorkloadRef },
    #[error("{target} was not rolled within {} of the restart request on {by}", humantime::format_duration(*timeout))]
    NotRolled {
        target: WorkloadRef,
        timeout: Duration,
        by: String,
    },
}

/// Follows one workload's rollout; `last` keeps kubectl's latest progress message.
struct Progress<'a> {
    target: &'a WorkloadRef,
    last: String,
}

impl Progress<'_> {
    /// `Some` once the rollout has completed or failed.
    fn observe(&mut self, w: &Workload) -> Option<Result<(), WaitError>> {
        match rollout::state(self.target.kind, w.strategy, &w.status) {
            RolloutState::Complete => Some(Ok(())),
            RolloutState::Failed(reason) => Some(Err(WaitError::Failed {
                target: self.target.clone(),
                reason,
            })),
            RolloutState::InProgress(detail) => {
                if detail != self.last {
                    tracing::info!(target: "bouncer::rollout", workload = %self.target, "{detail}");
                    self.last = detail;
                }
                None
            }
        }
    }
}

/// Waits until the rollout completes by kubectl's rules. Normally a single WATCH from the patch's
/// resourceVersion covers the whole rollout; if it breaks (API server restart, expired version)
/// `follow` lists and resumes, so a blip does not lose the wait.
/// `deadline` ends the bounce's whole budget, `timeout` (what the error names: the policy's or
/// the run's setting, not the time left when this wait began).
pub async fn wait(
    client: &Client,
    target: &WorkloadRef,
    (deadline, timeout): (tokio::time::Instant, Duration),
    from: Option<&str>,
) -> Result<(), WaitError> {
    if target.kind == Kind::Pod {
        return Ok(());
    }
    let mut progress = Progress {
        target,
        last: String::from("no status observed yet"),
    };
    let waiting = follow_one(client, target, from.unwrap_or_default(), |w, _| {
        progress.observe(&w)
    });
    let result = tokio::time::timeout_at(deadline, waiting).await;
    match result {
        Ok(r) => r,
        Err(_) => Err(WaitError::Timeout {
            target: target.clone(),
            timeout,
            last: progress.last,
        }),
    }
}

/// Waits, from `start`, until `rolled` holds for the workload: its owner has acted on a restart
/// request (ToolHive's operator writes the pod template). Returns the workload as first seen
/// so, and its resourceVersion, where the rollout wait starts. `by` names the request's object
/// for the timeout's message.
pub async fn wait_rolled(
    client: &Client,
    target: &WorkloadRef,
    (deadline, timeout): (tokio::time::Instant, Duration),
    from: &str,
    by: &str,
    mut rolled: impl FnMut(&Workload) -> bool,
) -> Result<(Workload, String), WaitError> {
    let waiting = follow_one(client, target, from, |w, version| {
        rolled(&w).then_some(Ok((w, version)))
    });
    match tokio::time::timeout_at(deadline, waiting).await {
        Ok(r) => r,
        Err(_) => Err(WaitError::NotRolled {
            target: target.clone(),
            timeout,
            by: by.to_string(),
        }),
    }
}

/// Follows one controller by name from `version` (a LIST when there is none), handing each
/// state and its resourceVersion to `on` until it answers; the workload's deletion ends it.
async fn follow_one<R>(
    client: &Client,
    target: &WorkloadRef,
    version: &str,
    mut on: impl FnMut(Workload, String) -> Option<Result<R, WaitError>>,
) -> Result<R, WaitError> {
    let url = kinds::collection(target.kind, Some(&target.namespace));
    let filter = Filter {
        fields: Some(format!("metadata.name={}", target.name)),
        ..Default::default()
    };
    let from = Some(version.to_string()).filter(|v| !v.is_empty() && v != "0");
    let deleted = || {
        Some(Err(WaitError::Deleted {
            target: target.clone(),
        }))
    };
    follow(
        client,
        &url,
        &filter,
        from,
        |seen: Seen<wire::Controller>| {
            let c = match seen {
                Seen::Listed(mut items) => match items.pop() {
                    Some(c) => c,
                    None => return deleted(),
                },
                Seen::Applied(c) => c,
                Seen::Deleted(_) => return deleted(),
            };
            let version = c.metadata.resource_version.clone().unwrap_or_default();
            on(super::convert::controller(target.kind, c), version)
        },
    )
    .await
}
