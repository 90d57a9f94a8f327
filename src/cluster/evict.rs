//! Eviction, the other way to restart: one pod at a time through the Eviction API (which
//! PodDisruptionBudgets guard), each followed by a wait for its ready replacement.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::Client;
use serde_json::json;

use super::error::ClusterError;
use super::kinds;
use super::retry::transient;
use super::watch::{Filter, Seen, follow};
use super::wire;
use crate::core::model::{Kind, PodSample};

/// The Eviction API: policy/v1, served from v1.21 (the oldest release bouncer supports).
pub const EVICTION_API: &str = "policy/v1";

#[derive(Debug, thiserror::Error)]
pub enum EvictError {
    #[error(transparent)]
    Api(#[from] ClusterError),
    /// 429 is a PodDisruptionBudget saying no; the last answer tells which (or what else) refused.
    #[error("the eviction of pod {pod} was refused until the timeout (last answer: {last})")]
    Refused { pod: String, last: String },
    #[error("no ready replacement for pod {pod} within the timeout ({detail})")]
    NoReplacement { pod: String, detail: String },
}

/// Evicts one pod, retrying while a PodDisruptionBudget answers 429, until `deadline`. The UID
/// precondition makes the eviction hit only the pod that existed before the bounce, never a
/// replacement that took its name (a StatefulSet's): the server then answers 409, which means
/// that pod is already gone.
pub async fn evict(
    client: &Client,
    namespace: &str,
    pod: &str,
    uid: &str,
    deadline: tokio::time::Instant,
) -> Result<(), EvictError> {
    let body = serde_json::to_vec(&json!({
        "apiVersion": EVICTION_API, "kind": "Eviction",
        "metadata": {"name": pod, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }))
    .expect("static JSON serializes");
    let url = format!("/api/v1/namespaces/{namespace}/pods/{pod}/eviction");
    let mut delay = Duration::from_millis(500);
    let mut last = None;
    let refused = |last: Option<String>| EvictError::Refused {
        pod: format!("{namespace}/{pod}"),
        last: last.unwrap_or_else(|| "none: the client itself still retried 429/503/504".into()),
    };
    loop {
        let req = http::Request::post(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .expect("valid request");
        // The client retries 429/503/504 by itself with a backoff that grows to minutes, so one
        // request can outlast the whole bounce: the deadline bounds each request too.
        let Ok(answer) = tokio::time::timeout_at(deadline, client.request::<Status>(req)).await
        else {
            return Err(refused(last));
        };
        match answer {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(()),
            Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 429) || transient(&e) => {
                if tokio::time::Instant::now() + delay > deadline {
                    return Err(refused(Some(e.to_string())));
                }
                tracing::info!("eviction of {namespace}/{pod} refused ({e}); retrying");
                last = Some(e.to_string());
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(source) => {
                return Err(ClusterError::Evict {
                    namespace: namespace.into(),
                    pod: pod.into(),
                    source,
                }
                .into());
            }
        }
    }
}

fn uid(p: &wire::Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

/// (ready, deleting) of a watched pod, by the same rules as the snapshot's.
fn readiness(p: &wire::Pod) -> (bool, bool) {
    let s = PodSample::from(p);
    (s.ready, s.deleting)
}

/// Waits until the evicted pod (by UID) is gone and `want` ready pods match again: a bare pod
/// recreated under its name, or a controller's replacement under its selector.
pub async fn wait_replaced(
    client: &Client,
    namespace: &str,
    evicted_uid: &str,
    selector: Option<&str>,
    name: &str,
    want: usize,
    deadline: tokio::time::Instant,
) -> Result<(), EvictError> {
    let filter = match selector {
        Some(s) if !s.is_empty() => Filter {
            labels: Some(s.to_string()),
            ..Default::default()
        },
        _ => Filter {
            fields: Some(format!("metadata.name={name}")),
            ..Default::default()
        },
    };
    let url = kinds::collection(Kind::Pod, Some(namespace));
    let mut pods: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let done = |pods: &BTreeMap<String, (bool, bool)>| {
        !pods.contains_key(evicted_uid)
            && pods
                .values()
                .filter(|(ready, deleting)| *ready && !*deleting)
                .count()
                >= want
    };
    let waiting = follow(client, &url, &filter, None, |seen: Seen<wire::Pod>| {
        match seen {
            Seen::Listed(all) => pods = all.iter().map(|p| (uid(p), readiness(p))).collect(),
            Seen::Applied(p) => {
                pods.insert(uid(&p), readiness(&p));
            }
            Seen::Deleted(p) => {
                pods.remove(&uid(&p));
            }
        }
        done(&pods).then_some(())
    });
    let finished = tokio::time::timeout_at(deadline, waiting).await.is_ok();
    if finished {
        Ok(())
    } else {
        let ready = pods.values().filter(|(r, d)| *r && !*d).count();
        Err(EvictError::NoReplacement {
            pod: format!("{namespace}/{name}"),
            detail: format!(
                "{ready}/{want} ready, old pod gone: {}",
                !pods.contains_key(evicted_uid)
            ),
        })
    }
}
