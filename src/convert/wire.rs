//! Slim wire types: only the fields bouncer reads, deserialized straight from the API server's
//! JSON. Field names and shapes mirror k8s-openapi's, so conversions read the same; everything
//! else (managedFields, full specs, container statuses) is skipped without being allocated.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

/// `null` reads as the default, like a missing field (Go encodes nil slices as null).
fn nullable<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A live object that did not read back as its slim form. Cannot happen for objects the API
/// server served (the slim forms are subsets), but it is an error, not a panic: the caller fails
/// closed (skips the workload, or fails the bounce) and the message names the object.
#[derive(Debug, thiserror::Error)]
#[error("failed to read {kind} {namespace}/{name} back as its slim form: {source}")]
pub struct RereadError {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    #[source]
    pub source: serde_json::Error,
}

/// For the call sites that speak `kube::Error` (retries, fresh reads): a deserialization error
/// that keeps the message naming the object, and is never retried.
impl From<RereadError> for kube::Error {
    fn from(e: RereadError) -> kube::Error {
        kube::Error::SerdeError(<serde_json::Error as serde::de::Error>::custom(e))
    }
}

/// A full k8s-openapi object read back as its slim form, through its JSON (used for the few
/// objects read one at a time, so that a single set of conversion rules exists).
pub fn reread<T: DeserializeOwned, K: Resource<DynamicType = ()> + Serialize>(
    full: &K,
) -> Result<T, RereadError> {
    serde_json::to_vec(full)
        .and_then(|json| serde_json::from_slice(&json))
        .map_err(|source| RereadError {
            kind: match K::kind(&()) {
                std::borrow::Cow::Borrowed(k) => k,
                std::borrow::Cow::Owned(_) => "object",
            },
            namespace: full.meta().namespace.clone().unwrap_or_default(),
            name: full.meta().name.clone().unwrap_or_default(),
            source,
        })
}

/// The metadata of a LIST page (its items are read one by one, see [`super::list`]).
#[derive(Debug, Default, Deserialize)]
pub struct ListMeta {
    #[serde(rename = "continue")]
    pub continue_: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub generation: Option<i64>,
    pub labels: Option<BTreeMap<String, String>>,
    pub annotations: Option<BTreeMap<String, String>>,
    pub owner_references: Option<Vec<OwnerReference>>,
    pub deletion_timestamp: Option<Time>,
}

#[derive(Debug, Default, Deserialize)]
pub struct OwnerReference {
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    pub controller: Option<bool>,
}

/// Metadata of a pod template: its labels and annotations.
#[derive(Debug, Default, Deserialize)]
pub struct PodTemplateSpec {
    pub metadata: Option<ObjectMeta>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<PodSpec>,
    pub status: Option<PodStatus>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, deserialize_with = "nullable")]
    pub containers: Vec<Container>,
    /// Native sidecars among them (`restartPolicy: Always`) run beside the containers.
    #[serde(default, deserialize_with = "nullable")]
    pub init_containers: Vec<Container>,
    /// Pod-level resources (PodLevelResources, beta from v1.34): a limit for the whole pod.
    pub resources: Option<ResourceRequirements>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    pub resources: Option<ResourceRequirements>,
    pub restart_policy: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ResourceRequirements {
    pub limits: Option<Resources>,
}

/// A resource list (limits, usage); only memory matters.
#[derive(Debug, Default, Deserialize)]
pub struct Resources {
    pub memory: Option<Quantity>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    pub phase: Option<String>,
    pub start_time: Option<Time>,
    pub conditions: Option<Vec<Condition>>,
}

/// A status condition (pods, Deployments).
#[derive(Debug, Default, Deserialize)]
pub struct Condition {
    #[serde(rename = "type", default, deserialize_with = "nullable")]
    pub type_: String,
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    pub reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ReplicaSet {
    #[serde(default)]
    pub metadata: ObjectMeta,
}

#[derive(Debug, Default, Deserialize)]
pub struct Deployment {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<DeploymentSpec>,
    pub status: Option<DeploymentStatus>,
}

#[derive(Debug, Default, Deserialize)]
pub struct DeploymentSpec {
    pub replicas: Option<i32>,
    pub paused: Option<bool>,
    #[serde(default, deserialize_with = "nullable")]
    pub selector: LabelSelector,
    pub strategy: Option<Strategy>,
    #[serde(default, deserialize_with = "nullable")]
    pub template: PodTemplateSpec,
}

/// Deployment `strategy`, StatefulSet and DaemonSet `updateStrategy`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Strategy {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub rolling_update: Option<RollingUpdate>,
}

/// The union of the three kinds' rolling-update parameters.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    pub max_surge: Option<IntOrString>,
    pub max_unavailable: Option<IntOrString>,
    pub partition: Option<i32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentStatus {
    pub observed_generation: Option<i64>,
    pub replicas: Option<i32>,
    pub updated_replicas: Option<i32>,
    pub ready_replicas: Option<i32>,
    pub available_replicas: Option<i32>,
    pub conditions: Option<Vec<Condition>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StatefulSet {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<StatefulSetSpec>,
    pub status: Option<StatefulSetStatus>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatefulSetSpec {
    pub replicas: Option<i32>,
    #[serde(default, deserialize_with = "nullable")]
    pub selector: LabelSelector,
    pub update_strategy: Option<Strategy>,
    #[serde(default, deserialize_with = "nullable")]
    pub template: PodTemplateSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatefulSetStatus {
    pub observed_generation: Option<i64>,
    #[serde(default, deserialize_with = "nullable")]
    pub replicas: i32,
    pub updated_replicas: Option<i32>,
    pub ready_replicas: Option<i32>,
    pub available_replicas: Option<i32>,
    pub current_revision: Option<String>,
    pub update_revision: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct DaemonSet {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<DaemonSetSpec>,
    pub status: Option<DaemonSetStatus>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSetSpec {
    #[serde(default, deserialize_with = "nullable")]
    pub selector: LabelSelector,
    pub update_strategy: Option<Strategy>,
    #[serde(default, deserialize_with = "nullable")]
    pub template: PodTemplateSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSetStatus {
    #[serde(default, deserialize_with = "nullable")]
    pub desired_number_scheduled: i32,
    pub observed_generation: Option<i64>,
    #[serde(default, deserialize_with = "nullable")]
    pub current_number_scheduled: i32,
    pub updated_number_scheduled: Option<i32>,
    #[serde(default, deserialize_with = "nullable")]
    pub number_ready: i32,
    pub number_available: Option<i32>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Namespace {
    #[serde(default)]
    pub metadata: ObjectMeta,
}

/// metrics.k8s.io/v1beta1 PodMetrics.
#[derive(Debug, Default, Deserialize)]
pub struct PodMetrics {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "nullable")]
    pub containers: Vec<ContainerMetrics>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ContainerMetrics {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub usage: Resources,
}

/// policy/v1 PodDisruptionBudget.
#[derive(Debug, Default, Deserialize)]
pub struct PodDisruptionBudget {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<PdbSpec>,
    pub status: Option<PdbStatus>,
}

#[derive(Debug, Default, Deserialize)]
pub struct PdbSpec {
    pub selector: Option<LabelSelector>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PdbStatus {
    #[serde(default, deserialize_with = "nullable")]
    pub disruptions_allowed: i32,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::convert;
    use crate::model::{PodSample, Workload};

    /// A pod as the API server sends it: managedFields, nulls, fields bouncer never reads.
    fn pod_json() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "web-7d4b9c-x2x9z", "namespace": "shop", "uid": "u-1", "generation": null,
                "labels": {"app": "web", "pod-template-hash": "7d4b9c"},
                "annotations": {"kubernetes.io/config.mirror": "x"},
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c", "uid": "r", "controller": true}
                ],
                "managedFields": [{"manager": "kubelet", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {".": {}}}}]
            },
            "spec": {
                "containers": [
                    {"name": "app", "image": "web:1", "resources": {"limits": {"memory": "256Mi", "cpu": "1"}, "requests": {"cpu": "10m"}}},
                    {"name": "proxy", "image": "proxy:1", "resources": {}}
                ],
                "nodeName": null
            },
            "status": {
                "phase": "Running", "startTime": "2024-05-01T10:00:00Z",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2024-05-01T10:00:05Z"}
                ],
                "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "state": {"running": {}}}]
            }
        })
    }

    #[test]
    fn slim_pods_convert_like_full_ones() {
        let slim: Pod = serde_json::from_value(pod_json()).unwrap();
        let full: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod_json()).unwrap();
        let sample = PodSample::from(&slim);
        assert_eq!(sample, convert::pod_sample(&full).unwrap());
        assert_eq!(sample.containers[0].limit, Some(256 << 20));
        assert_eq!(sample.containers[1].limit, None);
        assert!(sample.ready);
        assert_eq!(sample.started.map(|t| t.timestamp()), Some(1_714_557_600));
        assert_eq!(
            format!("{:?}", convert::bare(slim)),
            format!("{:?}", convert::bare_pod(&full).unwrap())
        );
    }

    #[test]
    fn slim_controllers_convert_like_full_ones() {
        let meta = json!({"name": "web", "namespace": "shop", "generation": 4, "labels": {"app": "web"},
                          "annotations": {"bouncer.dev/exclude": "true"}});
        let template = json!({"metadata": {"labels": {"app": "web"}, "creationTimestamp": null,
                              "annotations": {"kubectl.kubernetes.io/restartedAt": "2024-05-01T10:00:00Z"}},
                              "spec": {"containers": [{"name": "app", "image": "web:1"}]}});
        let selector = json!({"matchLabels": {"app": "web"},
                              "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["canary"]}]});
        let deployment = json!({
            "metadata": meta, "spec": {"replicas": 4, "paused": true, "selector": selector, "template": template,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "50%", "maxUnavailable": 1}}},
            "status": {"observedGeneration": 3, "replicas": 5, "updatedReplicas": 2, "readyReplicas": 4,
                       "availableReplicas": 4, "conditions": [{"type": "Progressing", "status": "False",
                       "reason": "ProgressDeadlineExceeded"}]}
        });
        let statefulset = json!({
            "metadata": meta, "spec": {"replicas": 3, "selector": selector, "template": template, "serviceName": "web",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}},
            "status": {"observedGeneration": 4, "replicas": 3, "readyReplicas": 2, "currentRevision": "a",
                       "updateRevision": "b"}
        });
        let daemonset = json!({
            "metadata": meta, "spec": {"selector": selector, "template": template,
            "updateStrategy": {"type": "OnDelete", "rollingUpdate": {"maxUnavailable": "34%"}}},
            "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2,
                       "numberMisscheduled": 0, "observedGeneration": 4}
        });
        let debug = |w: Workload| format!("{w:?}");
        let d = debug(Workload::from(
            serde_json::from_value::<Deployment>(deployment.clone()).unwrap(),
        ));
        assert_eq!(
            d,
            debug(convert::deployment(&serde_json::from_value(deployment).unwrap()).unwrap())
        );
        assert!(
            d.contains("progress_deadline_exceeded: true") && d.contains("paused: true"),
            "{d}"
        );
        assert!(
            d.contains("tier notin (canary)")
                && d.contains("restarted_at: Some(2024-05-01T10:00:00Z)"),
            "{d}"
        );
        let s = debug(Workload::from(
            serde_json::from_value::<StatefulSet>(statefulset.clone()).unwrap(),
        ));
        assert_eq!(
            s,
            debug(convert::statefulset(&serde_json::from_value(statefulset).unwrap()).unwrap())
        );
        assert!(
            s.contains("partition: Some(1)") && s.contains("update_revision: Some(\"b\")"),
            "{s}"
        );
        let ds = debug(Workload::from(
            serde_json::from_value::<DaemonSet>(daemonset.clone()).unwrap(),
        ));
        assert_eq!(
            ds,
            debug(convert::daemonset(&serde_json::from_value(daemonset).unwrap()).unwrap())
        );
        assert!(
            ds.contains("OnDelete") && ds.contains("min_ready_during_restart: 1"),
            "{ds}"
        );
    }

    /// A live object that does not read back is an error naming it, never a panic.
    #[test]
    fn a_failed_reread_is_an_error_naming_the_object() {
        let e = RereadError {
            kind: "Deployment",
            namespace: "shop".into(),
            name: "web".into(),
            source: serde_json::from_str::<u8>("x").unwrap_err(),
        };
        let kube_error = kube::Error::from(e);
        assert!(!crate::restart::transient(&kube_error), "not retried");
        let text = kube_error.to_string();
        assert!(
            text.contains("failed to read Deployment shop/web back as its slim form"),
            "{text}"
        );
        // The happy path: a served object reads back.
        let full: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod_json()).unwrap();
        assert!(reread::<Pod, _>(&full).is_ok());
    }

    #[test]
    fn metrics_and_pdbs_read_from_api_json() {
        let metrics: PodMetrics = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "n"}, "timestamp": "2024-05-01T10:00:00Z", "window": "30s",
            "containers": [{"name": "app", "usage": {"cpu": "1m", "memory": "1024Ki"}}, {"name": "x", "usage": {}}]
        }))
        .unwrap();
        assert_eq!(
            metrics.containers[0]
                .usage
                .memory
                .as_ref()
                .map(|q| q.0.as_str()),
            Some("1024Ki")
        );
        assert!(metrics.containers[1].usage.memory.is_none());
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"disruptionsAllowed": 1, "currentHealthy": 3}
        }))
        .unwrap();
        let pdb = crate::model::Pdb::from(pdb);
        assert_eq!((pdb.name.as_str(), pdb.disruptions_allowed), ("web", 1));
        assert_eq!(
            pdb.selector.match_labels.get("app").map(String::as_str),
            Some("web")
        );
    }
}
