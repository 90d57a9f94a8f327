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
use crate::core::model::{Kind, PodSample, Workload};

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

/// The pods that count as an evicted pod's replacement.
#[derive(Debug, Clone, Copy)]
pub enum Replacement<'a> {
    /// A controller's: pods whose controller ownerReference has one of these UIDs (the
    /// workload's `pod_owners`). The selector only narrows the watch: another pod with the same
    /// labels (a canary, a debug copy) is not a replacement, however ready it is.
    Owned {
        owners: &'a [String],
        selector: &'a str,
    },
    /// A bare pod's: one recreated under its name.
    Named,
}

impl<'a> Replacement<'a> {
    pub fn of(w: &'a Workload) -> Self {
        match w.target.kind {
            Kind::Pod => Replacement::Named,
            Kind::Deployment | Kind::StatefulSet | Kind::DaemonSet => Replacement::Owned {
                owners: &w.pod_owners,
                selector: &w.pod_selector,
            },
        }
    }

    fn counts(&self, p: &wire::Pod) -> bool {
        match self {
            Replacement::Owned { owners, .. } => {
                p.metadata.owner_references.iter().flatten().any(|o| {
                    o.controller == Some(true) && !o.uid.is_empty() && owners.contains(&o.uid)
                })
            }
            // The watch selects the name already.
            Replacement::Named => true,
        }
    }
}

/// Waits until the evicted pod (by UID) is gone and `want` ready pods of the same owner are
/// there again (see [`Replacement`]).
pub async fn wait_replaced(
    client: &Client,
    namespace: &str,
    (name, evicted_uid): (&str, &str),
    replacement: Replacement<'_>,
    want: usize,
    deadline: tokio::time::Instant,
) -> Result<(), EvictError> {
    let filter = match replacement {
        Replacement::Owned { selector, .. } if !selector.is_empty() => Filter {
            labels: Some(selector.to_string()),
            ..Default::default()
        },
        Replacement::Owned { .. } => Filter::default(),
        Replacement::Named => Filter {
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
            Seen::Listed(all) => {
                pods = all
                    .iter()
                    .filter(|p| replacement.counts(p))
                    .map(|p| (uid(p), readiness(p)))
                    .collect();
            }
            // A pod the owner let go of (its labels changed) no longer counts.
            Seen::Applied(p) if !replacement.counts(&p) => {
                pods.remove(&uid(&p));
            }
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
                "{ready}/{want} of its owner's pods ready, old pod gone: {}",
                !pods.contains_key(evicted_uid)
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, owners: serde_json::Value) -> wire::Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("u-{name}"), "labels": {"app": "web"},
                         "ownerReferences": owners},
        }))
        .unwrap()
    }

    /// Only the owner's pods replace an evicted one: a canary with the same labels, a pod that
    /// names the owner without being its controller, or one of a namesake owner (another UID)
    /// is not a replacement, however ready.
    #[test]
    fn only_pods_of_the_same_owner_count_as_replacements() {
        let owners = ["uid-rs-1".to_string(), "uid-rs-2".to_string()];
        let replacement = Replacement::Owned {
            owners: &owners,
            selector: "app=web",
        };
        let rs = |name: &str, uid: &str, controller: bool| json!([{"kind": "ReplicaSet", "name": name, "uid": uid, "controller": controller}]);
        let cases = [
            (pod("web-1-a", rs("web-1", "uid-rs-1", true)), true),
            (pod("web-2-a", rs("web-2", "uid-rs-2", true)), true),
            (pod("canary", json!([])), false),
            (pod("held", rs("web-1", "uid-rs-1", false)), false),
            (pod("namesake", rs("web-1", "uid-other", true)), false),
            (pod("no-uid", rs("web-1", "", true)), false),
        ];
        for (p, want) in cases {
            let name = p.metadata.name.clone().unwrap();
            assert_eq!(replacement.counts(&p), want, "{name}");
        }
        assert!(Replacement::Named.counts(&pod("mcpd-0", json!([]))));
    }
}
