//! The two ways bouncer restarts: kubectl's restartedAt patch, and pod eviction one at a time.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde_json::json;

use crate::consts::{ATTEMPT_ANNOTATION, FIELD_MANAGER, RESTARTED_AT};
use crate::convert;
use crate::error::ClusterError;
use crate::mark::Attempt;
use crate::model::{Kind, Workload, WorkloadRef};
use crate::reason::rfc3339;

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

/// What a restart patch wrote and what the server returned.
pub struct Patched {
    /// The restartedAt value written.
    pub value: String,
    /// The workload as the patch left it, and its resourceVersion (where the rollout wait starts).
    pub workload: Workload,
    pub resource_version: String,
}

/// Writes exactly what `kubectl rollout restart` writes: a strategic-merge patch of the pod
/// template's restartedAt annotation (RFC3339, seconds). The same patch writes bouncer's
/// attempt mark on the workload's metadata, so no restart can happen without its mark.
pub async fn patch_restarted_at(
    client: &Client,
    target: &WorkloadRef,
    at: DateTime<Utc>,
    mark: &Attempt,
) -> Result<Patched, ClusterError> {
    let value = rfc3339(at);
    let body = json!({
        "metadata": {"annotations": {ATTEMPT_ANNOTATION: mark.encode()}},
        "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: value}}}},
    });
    let (workload, resource_version) = patch(client, target, &body).await?;
    Ok(Patched {
        value,
        workload,
        resource_version,
    })
}

/// Writes only the attempt mark (metadata, so nothing rolls) and returns the workload as the
/// patch left it, pod template included: the run's final check of its restartedAt.
pub async fn patch_mark(
    client: &Client,
    target: &WorkloadRef,
    mark: &Attempt,
) -> Result<Workload, ClusterError> {
    let body = json!({"metadata": {"annotations": {ATTEMPT_ANNOTATION: mark.encode()}}});
    Ok(patch(client, target, &body).await?.0)
}

/// One strategic-merge patch of a controller as bouncer's field manager, with retries.
async fn patch(
    client: &Client,
    target: &WorkloadRef,
    body: &serde_json::Value,
) -> Result<(Workload, String), ClusterError> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let ns = target.namespace.as_str();
    let patched = with_retries(&format!("patch {target}"), || {
        let patch = Patch::Strategic(body);
        let (client, params, name) = (client.clone(), &params, target.name.as_str());
        async move {
            use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
            type Convert<K> = fn(&K) -> Result<Workload, convert::wire::RereadError>;
            fn seen<K: Resource>(obj: K, f: Convert<K>) -> Result<(Workload, String), kube::Error> {
                Ok((
                    f(&obj)?,
                    obj.meta().resource_version.clone().unwrap_or_default(),
                ))
            }
            match target.kind {
                Kind::Deployment => Api::<Deployment>::namespaced(client, ns)
                    .patch(name, params, &patch)
                    .await
                    .and_then(|d| seen(d, convert::deployment)),
                Kind::StatefulSet => Api::<StatefulSet>::namespaced(client, ns)
                    .patch(name, params, &patch)
                    .await
                    .and_then(|s| seen(s, convert::statefulset)),
                Kind::DaemonSet => Api::<DaemonSet>::namespaced(client, ns)
                    .patch(name, params, &patch)
                    .await
                    .and_then(|d| seen(d, convert::daemonset)),
                Kind::Pod => unreachable!("bare pods are evicted, never patched"),
            }
        }
    })
    .await;
    patched.map_err(|source| ClusterError::Patch {
        target: target.clone(),
        source,
    })
}

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

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

/// (ready, deleting) of a watched pod; one that does not convert counts as not ready (fail
/// closed: it cannot stand in for the evicted pod).
fn readiness(p: &Pod) -> (bool, bool) {
    match convert::pod_sample(p) {
        Ok(s) => (s.ready, s.deleting),
        Err(e) => {
            tracing::warn!("{e}");
            (false, true)
        }
    }
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
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let config = match selector {
        Some(s) if !s.is_empty() => watcher::Config::default().labels(s),
        _ => watcher::Config::default().fields(&format!("metadata.name={name}")),
    };
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut pods: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let mut init: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let done = |pods: &BTreeMap<String, (bool, bool)>| {
        !pods.contains_key(evicted_uid)
            && pods
                .values()
                .filter(|(ready, deleting)| *ready && !*deleting)
                .count()
                >= want
    };
    let waiting = async {
        loop {
            match events.try_next().await {
                Ok(Some(watcher::Event::Init)) => init.clear(),
                Ok(Some(watcher::Event::InitApply(p))) => {
                    init.insert(uid(&p), readiness(&p));
                }
                Ok(Some(watcher::Event::InitDone)) => pods = std::mem::take(&mut init),
                Ok(Some(watcher::Event::Apply(p))) => {
                    pods.insert(uid(&p), readiness(&p));
                }
                Ok(Some(watcher::Event::Delete(p))) => {
                    pods.remove(p.metadata.uid.as_deref().unwrap_or_default());
                }
                Ok(None) => return,
                Err(e) => tracing::warn!("watching pods in {namespace}: {e}; retrying"),
            }
            if done(&pods) {
                return;
            }
        }
    };
    let _ = tokio::time::timeout_at(deadline, waiting).await;
    if done(&pods) {
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
