//! What `kubectl rollout restart` writes, kubectl's rollout-completion rules, and watch-based
//! waits (rollout complete, pods ready, pod replaced) for test assertions.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use anyhow::{Result, bail};
use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::RESTARTED_AT;

/// The workload kinds a rollout restart applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Deployment,
    StatefulSet,
    DaemonSet,
}

/// Field manager kubectl >= 1.20 uses for `rollout restart`.
const KUBECTL_ROLLOUT: &str = "kubectl-rollout";

/// Does what `kubectl rollout restart` does: a strategic merge patch setting the template's
/// `kubectl.kubernetes.io/restartedAt` to now (RFC3339, seconds), field manager
/// `kubectl-rollout`. Returns the value written.
pub async fn rollout_restart_patch(
    client: &Client,
    kind: Kind,
    ns: &str,
    name: &str,
) -> Result<String> {
    let now = Timestamp::from_second(Timestamp::now().as_second())?.to_string();
    let body = json!({"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now}}}}});
    let params = PatchParams {
        field_manager: Some(KUBECTL_ROLLOUT.into()),
        ..Default::default()
    };
    let patch = Patch::Strategic(&body);
    match kind {
        Kind::Deployment => drop(
            Api::<Deployment>::namespaced(client.clone(), ns)
                .patch(name, &params, &patch)
                .await?,
        ),
        Kind::StatefulSet => drop(
            Api::<StatefulSet>::namespaced(client.clone(), ns)
                .patch(name, &params, &patch)
                .await?,
        ),
        Kind::DaemonSet => drop(
            Api::<DaemonSet>::namespaced(client.clone(), ns)
                .patch(name, &params, &patch)
                .await?,
        ),
    }
    Ok(now)
}

/// Where a rollout stands by kubectl's rules: done, or still waiting (with kubectl's message).
/// `Err` is a rollout that can never complete as asked (deadline exceeded, OnDelete strategy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    Done,
    Waiting(String),
}

/// kubectl's DeploymentStatusViewer (k8s.io/kubectl v0.36.3,
/// pkg/polymorphichelpers/rollout_status.go), transcribed from its source on the k8s-openapi
/// object, independently of bouncer's code: while `generation > observedGeneration`, waiting for
/// the spec update; then a Progressing condition with reason ProgressDeadlineExceeded is an
/// error; then waiting while `updatedReplicas < spec.replicas` (when set), `replicas >
/// updatedReplicas`, or `availableReplicas < updatedReplicas`.
pub fn deployment_progress(d: &Deployment) -> Result<Progress, String> {
    let status = d.status.clone().unwrap_or_default();
    if d.metadata.generation.unwrap_or(0) > status.observed_generation.unwrap_or(0) {
        return Ok(Progress::Waiting(
            "waiting for deployment spec update to be observed".into(),
        ));
    }
    let deadline = status.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing" && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    if deadline {
        return Err(format!(
            "deployment {:?} exceeded its progress deadline",
            d.name_any()
        ));
    }
    let desired = d.spec.as_ref().and_then(|s| s.replicas);
    let updated = status.updated_replicas.unwrap_or(0);
    let replicas = status.replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    Ok(if let Some(desired) = desired.filter(|d| updated < *d) {
        Progress::Waiting(format!(
            "{updated} out of {desired} new replicas have been updated"
        ))
    } else if replicas > updated {
        Progress::Waiting(format!(
            "{} old replicas are pending termination",
            replicas - updated
        ))
    } else if available < updated {
        Progress::Waiting(format!(
            "{available} of {updated} updated replicas are available"
        ))
    } else {
        Progress::Done
    })
}

/// kubectl's StatefulSetStatusViewer (k8s.io/kubectl v0.36.3,
/// pkg/polymorphichelpers/rollout_status.go), transcribed from its source on the k8s-openapi
/// object, independently of bouncer's code. Its steps, in order:
/// 1. `updateStrategy.type` other than RollingUpdate is an error;
/// 2. `observedGeneration == 0 || generation > observedGeneration`: waiting for the spec update;
/// 3. `spec.replicas` set and `readyReplicas < replicas`: waiting for pods to be ready;
/// 4. `rollingUpdate` set (API defaulting always sets it, partition 0): when `replicas` and
///    `partition` are both set and `updatedReplicas < replicas - partition`, waiting; otherwise
///    done, without looking at the revisions;
/// 5. only without `rollingUpdate`: waiting while `updateRevision != currentRevision`.
///
/// One concession: a missing `type` (never served: the API server defaults it) reads as
/// RollingUpdate, so hand-built fixtures need not spell it out.
pub fn statefulset_progress(s: &StatefulSet) -> Result<Progress, String> {
    let spec = s.spec.clone().unwrap_or_default();
    let strategy = spec.update_strategy.clone().unwrap_or_default();
    if strategy
        .type_
        .as_deref()
        .is_some_and(|t| t != "RollingUpdate")
    {
        return Err("rollout status is only available for RollingUpdate strategy type".into());
    }
    let status = s.status.clone().unwrap_or_default();
    let observed = status.observed_generation.unwrap_or(0);
    if observed == 0 || s.metadata.generation.unwrap_or(0) > observed {
        return Ok(Progress::Waiting(
            "Waiting for statefulset spec update to be observed...".into(),
        ));
    }
    let ready = status.ready_replicas.unwrap_or(0);
    if let Some(replicas) = spec.replicas
        && ready < replicas
    {
        return Ok(Progress::Waiting(format!(
            "Waiting for {} pods to be ready...",
            replicas - ready
        )));
    }
    let updated = status.updated_replicas.unwrap_or(0);
    if let Some(rolling) = strategy.rolling_update {
        if let (Some(replicas), Some(partition)) = (spec.replicas, rolling.partition)
            && updated < replicas - partition
        {
            return Ok(Progress::Waiting(format!(
                "Waiting for partitioned roll out to finish: {updated} out of {} new pods have been updated...",
                replicas - partition
            )));
        }
        return Ok(Progress::Done);
    }
    Ok(if status.update_revision != status.current_revision {
        Progress::Waiting(format!(
            "waiting for statefulset rolling update to complete {updated} pods at revision {}...",
            status.update_revision.unwrap_or_default()
        ))
    } else {
        Progress::Done
    })
}

/// kubectl's DaemonSetStatusViewer (k8s.io/kubectl v0.36.3), transcribed from its source like
/// the others: a strategy other than RollingUpdate is an error; while `generation >
/// observedGeneration`, waiting; then waiting while `updatedNumberScheduled <
/// desiredNumberScheduled` or `numberAvailable < desiredNumberScheduled`.
pub fn daemonset_progress(d: &DaemonSet) -> Result<Progress, String> {
    let strategy = d
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref());
    if strategy.is_some_and(|t| t != "RollingUpdate") {
        return Err("rollout status is only available for RollingUpdate strategy type".into());
    }
    let status = d.status.clone().unwrap_or_default();
    if d.metadata.generation.unwrap_or(0) > status.observed_generation.unwrap_or(0) {
        return Ok(Progress::Waiting(
            "waiting for daemon set spec update to be observed".into(),
        ));
    }
    let desired = status.desired_number_scheduled;
    let updated = status.updated_number_scheduled.unwrap_or(0);
    let available = status.number_available.unwrap_or(0);
    Ok(if updated < desired {
        Progress::Waiting(format!(
            "{updated} out of {desired} new pods have been updated"
        ))
    } else if available < desired {
        Progress::Waiting(format!(
            "{available} of {desired} updated pods are available"
        ))
    } else {
        Progress::Done
    })
}

/// Watches the workload until kubectl would call its rollout complete.
pub async fn wait_rollout_complete(
    client: &Client,
    kind: Kind,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<()> {
    match kind {
        Kind::Deployment => {
            watch_progress::<Deployment>(client, ns, name, timeout, deployment_progress).await
        }
        Kind::StatefulSet => {
            watch_progress::<StatefulSet>(client, ns, name, timeout, statefulset_progress).await
        }
        Kind::DaemonSet => {
            watch_progress::<DaemonSet>(client, ns, name, timeout, daemonset_progress).await
        }
    }
}

async fn watch_progress<K>(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
    progress: fn(&K) -> Result<Progress, String>,
) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + 'static,
{
    let api = Api::<K>::namespaced(client.clone(), ns);
    let mut last = String::from("no object seen");
    let wait = async {
        let mut stream = std::pin::pin!(watcher::watch_object(api, name));
        while let Some(obj) = stream.next().await {
            match obj?.as_ref().map(progress) {
                None => last = "object does not exist".into(),
                Some(Ok(Progress::Done)) => return Ok(()),
                Some(Ok(Progress::Waiting(msg))) => {
                    tracing::debug!("rollout of {ns}/{name}: {msg}");
                    last = msg;
                }
                Some(Err(msg)) => bail!("rollout of {} {ns}/{name} failed: {msg}", K::kind(&())),
            }
        }
        bail!("watch ended")
    };
    match tokio::time::timeout(timeout, wait).await {
        Ok(r) => r,
        Err(_) => bail!(
            "rollout of {} {ns}/{name} not complete after {timeout:?}: {last}",
            K::kind(&())
        ),
    }
}

/// Watches a list of objects until `pred` returns `Some`, re-evaluating after every change.
/// `what` names the wait in the timeout error; the error also shows what `pred` last saw.
pub async fn wait_list<K, R>(
    api: Api<K>,
    config: watcher::Config,
    timeout: Duration,
    what: &str,
    mut pred: impl FnMut(&[&K]) -> Option<R>,
) -> Result<R>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut seen: BTreeMap<String, K> = BTreeMap::new();
    let mut buffer: BTreeMap<String, K> = BTreeMap::new();
    let key = |o: &K| {
        format!(
            "{}/{}",
            o.meta().namespace.as_deref().unwrap_or(""),
            o.meta().name.as_deref().unwrap_or("")
        )
    };
    let wait = async {
        let mut stream = std::pin::pin!(watcher::watcher(api, config));
        while let Some(event) = stream.next().await {
            match event? {
                Event::Init => buffer.clear(),
                Event::InitApply(o) => drop(buffer.insert(key(&o), o)),
                Event::InitDone => seen = std::mem::take(&mut buffer),
                Event::Apply(o) => drop(seen.insert(key(&o), o)),
                Event::Delete(o) => drop(seen.remove(&key(&o))),
            }
            if let Some(r) = pred(&seen.values().collect::<Vec<_>>()) {
                return Ok(r);
            }
        }
        bail!("watch ended")
    };
    match tokio::time::timeout(timeout, wait).await {
        Ok(r) => r,
        Err(_) => bail!(
            "{what}: not within {timeout:?}; last seen: {:?}",
            seen.keys().collect::<Vec<_>>()
        ),
    }
}

/// True when the pod's Ready condition is True.
pub fn is_pod_ready(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Waits until exactly `count` pods match `selector` (a kubectl -l style label selector), none of
/// them terminating, all Ready; returns them sorted by name. Terminating pods must be gone
/// too, so "the rollout replaced every pod" can be asserted from the result.
pub async fn wait_pods_ready(
    client: &Client,
    ns: &str,
    selector: &str,
    count: usize,
    timeout: Duration,
) -> Result<Vec<Pod>> {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let what = format!("{count} ready pods matching {selector} in {ns}");
    wait_list(
        api,
        watcher::Config::default().labels(selector),
        timeout,
        &what,
        |pods| {
            let ok = pods.len() == count
                && pods
                    .iter()
                    .all(|p| p.metadata.deletion_timestamp.is_none() && is_pod_ready(p));
            ok.then(|| pods.iter().map(|p| (*p).clone()).collect())
        },
    )
    .await
}

/// Waits until pod `name` exists again with a UID other than `old_uid` and is Ready (a bare pod
/// recreated under the same name, or evicted and replaced by its owner app).
pub async fn wait_pod_replaced(
    client: &Client,
    ns: &str,
    name: &str,
    old_uid: &str,
    timeout: Duration,
) -> Result<Pod> {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let what = format!("pod {ns}/{name} replaced (old uid {old_uid}) and ready");
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    wait_list(api, config, timeout, &what, |pods| {
        pods.iter()
            .find(|p| p.uid().as_deref() != Some(old_uid) && is_pod_ready(p))
            .map(|p| (*p).clone())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(generation: i64, status: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "generation": generation},
            "spec": {"replicas": 2, "selector": {}, "template": {}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn deployment_follows_kubectl() {
        let done = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        assert_eq!(
            deployment_progress(&deploy(2, done.clone())),
            Ok(Progress::Done)
        );
        // The state from before the restart must not count: the generation is not yet observed.
        assert!(matches!(
            deployment_progress(&deploy(3, done)),
            Ok(Progress::Waiting(_))
        ));
        let surge = json!({"observedGeneration": 3, "replicas": 3, "updatedReplicas": 2, "availableReplicas": 2});
        assert!(
            matches!(deployment_progress(&deploy(3, surge)), Ok(Progress::Waiting(m)) if m.contains("pending termination"))
        );
        let dead = json!({"observedGeneration": 3, "conditions": [
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]});
        assert!(deployment_progress(&deploy(3, dead)).is_err());
    }

    #[test]
    fn statefulset_waits_for_revisions() {
        let sts = |status: serde_json::Value| -> StatefulSet {
            serde_json::from_value(json!({
                "metadata": {"name": "db", "generation": 2},
                "spec": {"replicas": 2, "selector": {}, "serviceName": "db", "template": {}},
                "status": status,
            }))
            .unwrap()
        };
        let rolling = json!({"observedGeneration": 2, "replicas": 2, "readyReplicas": 2,
            "currentRevision": "a", "updateRevision": "b"});
        assert!(matches!(
            statefulset_progress(&sts(rolling)),
            Ok(Progress::Waiting(_))
        ));
        let done = json!({"observedGeneration": 2, "replicas": 2, "readyReplicas": 2,
            "currentRevision": "b", "updateRevision": "b"});
        assert_eq!(statefulset_progress(&sts(done)), Ok(Progress::Done));
    }

    /// kubectl's partition branch, taken whenever rollingUpdate is set (as defaulting always
    /// does): the count decides, revisions are not compared.
    #[test]
    fn statefulset_with_rolling_update_counts_updated_replicas() {
        let sts = |rolling: serde_json::Value, status: serde_json::Value| -> StatefulSet {
            serde_json::from_value(json!({
                "metadata": {"name": "db", "generation": 2},
                "spec": {"replicas": 3, "selector": {}, "serviceName": "db", "template": {},
                         "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": rolling}},
                "status": status,
            }))
            .unwrap()
        };
        let status = |updated: i32, current: &str| {
            json!({"observedGeneration": 2, "replicas": 3, "readyReplicas": 3,
                   "updatedReplicas": updated, "currentRevision": current, "updateRevision": "b"})
        };
        let p0 = json!({"partition": 0});
        assert_eq!(
            statefulset_progress(&sts(p0.clone(), status(3, "a"))),
            Ok(Progress::Done)
        );
        assert!(matches!(
            statefulset_progress(&sts(p0, status(2, "b"))),
            Ok(Progress::Waiting(m)) if m.contains("2 out of 3")
        ));
        let p2 = json!({"partition": 2});
        assert_eq!(
            statefulset_progress(&sts(p2, status(1, "a"))),
            Ok(Progress::Done)
        );
        assert_eq!(
            statefulset_progress(&sts(json!({}), status(0, "a"))),
            Ok(Progress::Done)
        );
        let on_delete: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "db"}, "spec": {"selector": {}, "serviceName": "db", "template": {},
            "updateStrategy": {"type": "OnDelete"}}})).unwrap();
        assert!(statefulset_progress(&on_delete).is_err());
    }
}
