//! Conversion of API objects into the core's domain structs, done once at the edge, from the
//! slim [`wire`](super::wire) forms every answer is read as (LIST items, GET, PATCH and watch
//! events alike): one set of rules per kind.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::shared::Shared;
use super::wire::{self, ObjectMeta, PodTemplateSpec};
use crate::core::gitops::{FLUX_NAME_LABEL, FLUX_NAMESPACE_LABEL};
use crate::core::literals::{
    FIELD_MANAGER, MCP_SERVER_KIND, MIRROR_ANNOTATION, PROGRESS_DEADLINE_EXCEEDED, RESTARTED_AT,
    SIDECAR_RESTART_POLICY, TOOLHIVE_GROUP, TOOLHIVE_RESTARTED_AT, WORKLOAD_ANNOTATIONS,
};
use crate::core::mark::AttemptMark;
use crate::core::model::{
    ContainerSample, Deleting, IntOrPercent, Kind, McpServerRef, Pdb, PodSample, RollingParams,
    RolloutStatus, StsRollingUpdate, ToolhiveRestart, Uid, UpdateStrategy, Workload, WorkloadRef,
};
use crate::core::pin::{RestartOwner as PinOwner, RestartOwners};
use crate::core::quantity::parse_bytes;
use crate::core::selector::{Operator, Requirement, Selector};
use crate::core::verify::FieldWrite;

pub fn time(t: &Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
        .unwrap_or_default()
}

fn map(m: &Option<BTreeMap<String, String>>) -> BTreeMap<String, String> {
    m.clone().unwrap_or_default()
}

fn template_restarted_at(t: &PodTemplateSpec) -> Option<DateTime<Utc>> {
    let value = t
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(RESTARTED_AT)?;
    DateTime::parse_from_rfc3339(value)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// The MCPServer that controls a Deployment, and the restart its operator last wrote on the
/// pod template.
fn toolhive(kind: Kind, meta: &ObjectMeta, template: &PodTemplateSpec) -> ToolhiveRestart {
    if kind != Kind::Deployment {
        return ToolhiveRestart::default();
    }
    let server = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| {
            o.controller == Some(true)
                && o.kind == MCP_SERVER_KIND
                && o.api_version.split('/').next() == Some(TOOLHIVE_GROUP)
        })
        .map(|o| McpServerRef {
            api_version: o.api_version.clone(),
            name: o.name.clone(),
            uid: o.uid.clone(),
        });
    let restarted_at = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(TOOLHIVE_RESTARTED_AT))
        .cloned();
    ToolhiveRestart {
        server: server.map(Box::new),
        restarted_at,
    }
}

/// The annotations the core reads (opt-out, overrides, attempt mark), and no other: a bare
/// pod's own annotations are its workload's, and other keys under bouncer's prefix (a test
/// harness's, a newer version's) would be kept on every pod.
fn own(annotations: Option<BTreeMap<String, String>>) -> BTreeMap<String, String> {
    annotations
        .into_iter()
        .flatten()
        .filter(|(k, _)| WORKLOAD_ANNOTATIONS.contains(&k.as_str()))
        .collect()
}

/// Who but bouncer owns the pod template's restartedAt, and the Kustomization that applies the
/// workload (Flux's labels), for `core::pin`.
fn restart_owners(meta: &ObjectMeta) -> Option<Box<RestartOwners>> {
    let owners: Vec<_> = meta
        .managed_fields
        .iter()
        .filter(|o| o.manager != FIELD_MANAGER)
        .map(|o| PinOwner {
            manager: o.manager.clone(),
            apply: o.apply,
        })
        .collect();
    if owners.is_empty() {
        return None;
    }
    let labels = meta.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k));
    let kustomization = label(FLUX_NAME_LABEL).map(|name| match label(FLUX_NAMESPACE_LABEL) {
        Some(ns) => format!("{ns}/{name}"),
        None => name.clone(),
    });
    Some(Box::new(RestartOwners {
        owners,
        kustomization,
    }))
}

fn base(
    kind: Kind,
    meta: ObjectMeta,
    template: PodTemplateSpec,
    selector: &LabelSelector,
) -> Workload {
    let restarted_at = template_restarted_at(&template);
    let toolhive = toolhive(kind, &meta, &template);
    let restart_owners = restart_owners(&meta);
    // A Deployment's pods belong to its ReplicaSets, which the snapshot and the fresh read add.
    let pod_owners = match kind {
        Kind::StatefulSet | Kind::DaemonSet => meta.uid.iter().cloned().collect(),
        Kind::Deployment | Kind::Pod => Vec::new(),
    };
    let uid = meta.uid.clone().map(Uid::from);
    let deleting = meta
        .deletion_timestamp
        .is_some()
        .then_some(Deleting::Workload);
    Workload {
        target: WorkloadRef {
            kind,
            namespace: meta.namespace.unwrap_or_default(),
            name: meta.name.unwrap_or_default(),
        },
        // A controller's mark lives on the object itself, so one older than the object was
        // copied onto it with the old one's manifest (deleted and recreated under its name).
        attempt: AttemptMark::from_annotations(
            meta.annotations.as_ref().unwrap_or(&BTreeMap::new()),
        )
        .written_since(meta.creation_timestamp.as_ref().map(time)),
        uid,
        template_labels: Arc::new(template.metadata.and_then(|m| m.labels).unwrap_or_default()),
        pod_selector: self::selector(selector).to_string(),
        pod_owners,
        annotations: own(meta.annotations),
        restarted_at,
        template_spec: template.spec.map(|d| d.0),
        restart_owners,
        paused: false,
        strategy: UpdateStrategy::RollingUpdate,
        status: RolloutStatus {
            generation: meta.generation.unwrap_or(0),
            ..Default::default()
        },
        rolling: RollingParams::default(),
        pods: Vec::new(),
        mirror: false,
        deleting,
        toolhive,
    }
}

/// A maxSurge/maxUnavailable as the core reads it. API validation admits only counts and
/// `N%`; anything else (which the server never serves) reads as 100%, the careful reading for
/// maxUnavailable, and is harmless for maxSurge, which only keeps pods.
fn int_or_percent(v: IntOrString) -> IntOrPercent {
    match v {
        IntOrString::Int(n) => IntOrPercent::Int(n),
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|p| p.parse().ok())
            .map_or(IntOrPercent::Percent(100), IntOrPercent::Percent),
    }
}

fn rolling(r: Option<wire::RollingUpdate>) -> RollingParams {
    let r = r.unwrap_or_default();
    RollingParams {
        max_surge: r.max_surge.map(int_or_percent),
        max_unavailable: r.max_unavailable.map(int_or_percent),
    }
}

/// A count as the API server's validation guarantees it: never negative. The core does arithmetic
/// on counts, which must not overflow whatever the answer held (the fuzz target `api_objects`).
fn count(v: Option<i32>) -> i32 {
    v.unwrap_or(0).max(0)
}

/// A Deployment, StatefulSet or DaemonSet (`kind`) as the planner sees it.
pub fn controller(kind: Kind, c: wire::Controller) -> Workload {
    match kind {
        Kind::Deployment => deployment(c),
        Kind::StatefulSet => statefulset(c),
        Kind::DaemonSet => daemonset(c),
        Kind::Pod => unreachable!("a bare pod is read as a Pod"),
    }
}

fn deployment(d: wire::Controller) -> Workload {
    let spec = d.spec.unwrap_or_default();
    let mut w = base(Kind::Deployment, d.metadata, spec.template, &spec.selector);
    let desired = spec.replicas.unwrap_or(1).max(0);
    w.paused = spec.paused.unwrap_or(false);
    let strategy = spec.strategy.unwrap_or_default();
    let recreate = strategy.type_.as_deref() == Some("Recreate");
    w.strategy = if recreate {
        UpdateStrategy::Recreate
    } else {
        UpdateStrategy::RollingUpdate
    };
    w.rolling = rolling(strategy.rolling_update);
    if let Some(s) = &d.status {
        w.status.observed_generation = s.observed_generation.unwrap_or(0);
        w.status.current = count(s.replicas);
        w.status.updated = count(s.updated_replicas);
        w.status.ready = count(s.ready_replicas);
        w.status.available = count(s.available_replicas);
        w.status.progress_deadline_exceeded = s.conditions.iter().flatten().any(|c| {
            c.type_ == "Progressing" && c.reason.as_deref() == Some(PROGRESS_DEADLINE_EXCEEDED)
        });
    }
    w.status.desired = desired;
    w
}

fn statefulset(s: wire::Controller) -> Workload {
    let spec = s.spec.unwrap_or_default();
    let mut w = base(Kind::StatefulSet, s.metadata, spec.template, &spec.selector);
    let desired = spec.replicas.unwrap_or(1).max(0);
    let strategy = spec.update_strategy.unwrap_or_default();
    w.strategy = if strategy.type_.as_deref() == Some("OnDelete") {
        UpdateStrategy::OnDelete
    } else {
        UpdateStrategy::RollingUpdate
    };
    w.status.rolling_update = match &strategy.rolling_update {
        None => StsRollingUpdate::Unset,
        Some(r) => StsRollingUpdate::Set {
            partition: r.partition.map(|p| p.max(0)),
        },
    };
    w.rolling = rolling(strategy.rolling_update);
    w.status.desired = desired;
    if let Some(st) = s.status {
        w.status.observed_generation = st.observed_generation.unwrap_or(0);
        w.status.current = count(st.replicas);
        w.status.updated = count(st.updated_replicas);
        w.status.ready = count(st.ready_replicas);
        // availableReplicas is served from v1.22; before that readiness is the best signal.
        w.status.available = count(st.available_replicas.or(Some(w.status.ready)));
        w.status.current_revision = st.current_revision;
        w.status.update_revision = st.update_revision;
    }
    w
}

fn daemonset(d: wire::Controller) -> Workload {
    let spec = d.spec.unwrap_or_default();
    let mut w = base(Kind::DaemonSet, d.metadata, spec.template, &spec.selector);
    let strategy = spec.update_strategy.unwrap_or_default();
    w.strategy = if strategy.type_.as_deref() == Some("OnDelete") {
        UpdateStrategy::OnDelete
    } else {
        UpdateStrategy::RollingUpdate
    };
    w.rolling = rolling(strategy.rolling_update);
    if let Some(st) = &d.status {
        w.status.desired = count(st.desired_number_scheduled);
        w.status.observed_generation = st.observed_generation.unwrap_or(0);
        w.status.current = count(st.current_number_scheduled);
        w.status.updated = count(st.updated_number_scheduled);
        w.status.ready = count(st.number_ready);
        w.status.available = count(st.number_available);
    }
    w
}

fn memory_limit(resources: Option<&wire::ResourceRequirements>) -> Option<u64> {
    resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.memory.as_ref())
        .and_then(|q| parse_bytes(&q.0).ok())
}

impl From<&wire::Pod> for PodSample {
    fn from(p: &wire::Pod) -> PodSample {
        pod(p.clone(), &mut Shared::default())
    }
}

/// What runs for the pod's whole life: its containers and native sidecars.
fn lifelong(s: &wire::PodSpec) -> impl Iterator<Item = &wire::Container> {
    let sidecars = s
        .init_containers
        .iter()
        .filter(|c| c.restart_policy.as_deref() == Some(SIDECAR_RESTART_POLICY));
    s.containers.iter().chain(sidecars)
}

/// A pod as the planner samples it; its labels and container names are `shared` with the pods
/// read before it that have the same.
pub fn pod(p: wire::Pod, shared: &mut Shared) -> PodSample {
    let status = p.status.as_ref();
    let labels = shared.labels(p.metadata.labels.unwrap_or_default());
    // Sized exactly: collecting through the sidecar filter would reserve room for four.
    let mut containers = Vec::with_capacity(p.spec.as_ref().map_or(0, |s| lifelong(s).count()));
    containers.extend(p.spec.iter().flat_map(lifelong).map(|c| ContainerSample {
        name: shared.name(&c.name),
        usage: None,
        limit: memory_limit(c.resources.as_ref()),
    }));
    PodSample {
        name: p.metadata.name.unwrap_or_default(),
        uid: p.metadata.uid.unwrap_or_default().into(),
        labels,
        started: status.and_then(|s| s.start_time.as_ref()).map(time),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        deleting: p.metadata.deletion_timestamp.is_some(),
        containers,
        limit: p
            .spec
            .as_ref()
            .and_then(|s| memory_limit(s.resources.as_ref())),
        has_metrics: false,
    }
}

/// A bare pod as its own workload (its labels `shared`, as [`pod`]'s).
pub fn bare(mut p: wire::Pod, shared: &mut Shared) -> Workload {
    let namespace = p.metadata.namespace.take().unwrap_or_default();
    let annotations = p.metadata.annotations.take().unwrap_or_default();
    let sample = pod(p, shared);
    Workload {
        target: WorkloadRef {
            kind: Kind::Pod,
            namespace,
            name: sample.name.clone(),
        },
        uid: Some(sample.uid.clone()),
        template_labels: Arc::clone(&sample.labels),
        pod_selector: String::new(),
        pod_owners: Vec::new(),
        mirror: annotations.contains_key(MIRROR_ANNOTATION),
        deleting: sample.deleting.then_some(Deleting::Workload),
        toolhive: Default::default(),
        annotations: own(Some(annotations)),
        // A bare pod's mark lives on the Lease (it must survive the pod); see Inventory.
        attempt: AttemptMark::None,
        restarted_at: None,
        template_spec: None,
        restart_owners: None,
        paused: false,
        strategy: UpdateStrategy::RollingUpdate,
        status: RolloutStatus {
            desired: 1,
            current: 1,
            updated: 1,
            ready: i32::from(sample.ready),
            available: i32::from(sample.ready),
            ..Default::default()
        },
        rolling: RollingParams::default(),
        pods: vec![sample],
    }
}

/// A LabelSelector as the core's matcher (a controller's pods, a PodDisruptionBudget's).
pub fn selector(s: &LabelSelector) -> Selector {
    Selector {
        match_labels: map(&s.match_labels),
        match_expressions: s
            .match_expressions
            .iter()
            .flatten()
            .map(|e| Requirement {
                key: e.key.clone(),
                operator: match e.operator.as_str() {
                    "In" => Operator::In,
                    "NotIn" => Operator::NotIn,
                    "Exists" => Operator::Exists,
                    _ => Operator::DoesNotExist,
                },
                values: e.values.clone().unwrap_or_default(),
            })
            .collect(),
    }
}

impl From<wire::PodDisruptionBudget> for Pdb {
    fn from(p: wire::PodDisruptionBudget) -> Pdb {
        Pdb {
            namespace: p.metadata.namespace.unwrap_or_default(),
            name: p.metadata.name.unwrap_or_default(),
            selector: p
                .spec
                .and_then(|s| s.selector)
                .map(|s| selector(&s))
                .unwrap_or_default(),
            disruptions_allowed: p.status.map_or(0, |s| s.disruptions_allowed),
        }
    }
}

/// A managedFields entry as the revert rule reads it.
pub fn field_write(e: wire::ManagedFieldsEntry) -> FieldWrite {
    FieldWrite {
        manager: e.manager.unwrap_or_default(),
        time: e.time.as_ref().map(time),
        template: e
            .fields_v1
            .as_ref()
            .is_some_and(|f| f.pointer("/f:spec/f:template").is_some()),
    }
}

#[cfg(test)]
mod kubectl_rule_tests {
    use crate::cluster::convert;
    use crate::core::model::{Kind, Workload};
    use crate::core::rollout::{RolloutState, state};

    /// A StatefulSet as the API server serves it (defaulting always sets rollingUpdate), read by
    /// the edge and judged by the core's rule.
    fn served(rolling_update: serde_json::Value, status: serde_json::Value) -> Workload {
        let mut strategy = serde_json::json!({"type": "RollingUpdate"});
        if !rolling_update.is_null() {
            strategy["rollingUpdate"] = rolling_update;
        }
        let json = serde_json::json!({
            "metadata": {"name": "db", "namespace": "a", "generation": 2},
            "spec": {"replicas": 3, "selector": {}, "template": {}, "updateStrategy": strategy},
            "status": status,
        });
        convert::controller(Kind::StatefulSet, serde_json::from_value(json).unwrap())
    }

    /// The pod template's spec is known by its digest: a restart (template metadata) keeps it,
    /// a new image or a new resource limit changes it, and the same text read twice gives the
    /// same digest (it is compared across reads of one run).
    #[test]
    fn a_template_spec_digest_changes_with_the_spec_and_not_with_a_restart() {
        let text = |restarted: &str, image: &str, limit: u32| {
            format!(
                r#"{{"metadata": {{"name": "web", "namespace": "a", "uid": "u"}},
                "spec": {{"replicas": 1, "selector": {{}}, "template": {{
                    "metadata": {{"annotations": {{"kubectl.kubernetes.io/restartedAt": "{restarted}"}}}},
                    "spec": {{"containers": [{{"name": "app", "image": "{image}", "args": [1, -2, 0.5, true, null],
                        "resources": {{"limits": {{"memory": "{limit}Mi"}}}}}}]}}}}}}}}"#
            )
        };
        let digest = |t: String| {
            let c: crate::cluster::wire::Controller = serde_json::from_str(&t).unwrap();
            convert::controller(Kind::Deployment, c).template_spec
        };
        let first = digest(text("2026-01-01T03:00:00Z", "app:1", 64));
        assert!(first.is_some());
        assert_eq!(first, digest(text("2026-01-01T03:00:00Z", "app:1", 64)));
        assert_eq!(first, digest(text("2026-02-01T03:00:00Z", "app:1", 64)));
        assert_ne!(first, digest(text("2026-01-01T03:00:00Z", "app:2", 64)));
        assert_ne!(first, digest(text("2026-01-01T03:00:00Z", "app:1", 128)));
        // Values do not run together: "ab" + "c" is not "a" + "bc".
        let pair = |a: &str, b: &str| {
            let t = format!(
                r#"{{"spec": {{"selector": {{}}, "template": {{"spec": ["{a}", "{b}"]}}}}}}"#
            );
            digest(t)
        };
        assert_ne!(pair("ab", "c"), pair("a", "bc"));
    }

    /// Hole 1: the StatefulSet's own maxUnavailable reaches the core as written (a count or a
    /// percentage); a value the API would never serve reads as 100%, the careful reading.
    #[test]
    fn a_statefulsets_max_unavailable_reaches_the_core() {
        use crate::core::model::IntOrPercent::{Int, Percent};
        for (written, read) in [
            (serde_json::json!(2), Some(Int(2))),
            (serde_json::json!("50%"), Some(Percent(50))),
            (serde_json::json!("half"), Some(Percent(100))),
            (serde_json::Value::Null, None),
        ] {
            let w = served(
                serde_json::json!({"partition": 0, "maxUnavailable": written}),
                serde_json::json!({}),
            );
            assert_eq!(w.rolling.max_unavailable, read, "{written}");
        }
    }

    /// Safety case 5: kubectl takes the partition branch whenever rollingUpdate is set (done
    /// when updatedReplicas >= replicas - partition), and compares revisions only without it.
    #[test]
    fn case5_statefulset_completion_is_kubectls_rule() {
        let st = |w: &Workload| state(Kind::StatefulSet, w.strategy, &w.status);
        // All pods updated and ready; the controller has not yet moved currentRevision.
        let status = serde_json::json!({"observedGeneration": 2, "replicas": 3, "readyReplicas": 3,
            "updatedReplicas": 3, "currentRevision": "a", "updateRevision": "b"});
        let defaulted = served(serde_json::json!({"partition": 0}), status.clone());
        assert_eq!(st(&defaulted), RolloutState::Complete);
        // rollingUpdate present without partition: kubectl skips the count and is done.
        let empty = served(serde_json::json!({}), status.clone());
        assert_eq!(st(&empty), RolloutState::Complete);
        // Without rollingUpdate, the revisions decide.
        let bare = served(serde_json::Value::Null, status);
        assert!(
            matches!(st(&bare), RolloutState::InProgress(_)),
            "{:?}",
            st(&bare)
        );
        // Revisions equal but updatedReplicas short: kubectl (partition 0) still waits.
        let short = serde_json::json!({"observedGeneration": 2, "replicas": 3, "readyReplicas": 3,
            "updatedReplicas": 2, "currentRevision": "b", "updateRevision": "b"});
        let waiting = served(serde_json::json!({"partition": 0}), short.clone());
        assert!(matches!(st(&waiting), RolloutState::InProgress(m) if m.contains("2 of 3")));
        assert_eq!(
            st(&served(serde_json::Value::Null, short)),
            RolloutState::Complete
        );
        // Partition 1: done at 2 updated.
        let two = serde_json::json!({"observedGeneration": 2, "replicas": 3, "readyReplicas": 3,
            "updatedReplicas": 2, "currentRevision": "a", "updateRevision": "b"});
        assert_eq!(
            st(&served(serde_json::json!({"partition": 1}), two)),
            RolloutState::Complete
        );
    }
}

#[cfg(test)]
mod api_json_tests {
    use serde_json::json;

    use crate::cluster::convert;
    use crate::cluster::wire::*;
    use crate::core::model::{Kind, Method, PodSample};

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
    fn pods_convert_from_api_json() {
        let slim: Pod = serde_json::from_value(pod_json()).unwrap();
        let sample = PodSample::from(&slim);
        assert_eq!(sample.name, "web-7d4b9c-x2x9z");
        assert_eq!(sample.containers[0].limit, Some(256 << 20));
        assert_eq!(sample.containers[1].limit, None);
        assert!(sample.ready);
        assert_eq!(sample.started.map(|t| t.timestamp()), Some(1_714_557_600));
        // The same pod as its own workload: itself, ready, one of one.
        let bare = convert::bare(slim, &mut Default::default());
        assert!(bare.mirror, "the mirror annotation is read");
        assert_eq!(bare.target.to_string(), "pod/shop/web-7d4b9c-x2x9z");
        assert_eq!(
            (
                bare.status.desired,
                bare.status.ready,
                bare.status.available
            ),
            (1, 1, 1)
        );
        assert_eq!(
            bare.template_labels.get("app").map(String::as_str),
            Some("web")
        );
        assert_eq!(bare.pods.len(), 1);
        assert_eq!(bare.pods[0].uid, "u-1".into());
        assert!(
            bare.annotations.is_empty(),
            "the mirror annotation is not kept"
        );
    }

    /// A bare pod's annotations are its workload's: only those the core reads are kept, not
    /// every key under bouncer's prefix (a test harness's memory model, a newer version's).
    #[test]
    fn a_workload_keeps_only_the_annotations_bouncer_reads() {
        let mut json = pod_json();
        json["metadata"]["annotations"] = json!({
            "bouncer.dev/cooldown": "2h", "bouncer.dev/exclude": "false",
            "bouncer.dev/test-memory-base": "200Mi", "bouncer.dev/something-newer": "x",
            "team": "web",
        });
        let bare = convert::bare(
            serde_json::from_value(json).unwrap(),
            &mut Default::default(),
        );
        let kept: Vec<_> = bare.annotations.keys().map(String::as_str).collect();
        assert_eq!(kept, ["bouncer.dev/cooldown", "bouncer.dev/exclude"]);
    }

    #[test]
    fn controllers_convert_from_api_json() {
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
        let read = |kind: Kind, json: serde_json::Value| {
            let w = convert::controller(kind, serde_json::from_value(json).unwrap());
            (format!("{w:?}"), w)
        };
        let (d, deployment) = read(Kind::Deployment, deployment);
        assert!(
            d.contains("progress_deadline_exceeded: true") && d.contains("paused: true"),
            "{d}"
        );
        assert!(
            deployment.pod_selector == "app=web,tier notin (canary)"
                && d.contains("restarted_at: Some(2024-05-01T10:00:00Z)"),
            "{d}"
        );
        let (s, _) = read(Kind::StatefulSet, statefulset);
        assert!(
            s.contains("partition: Some(1)") && s.contains("update_revision: Some(\"b\")"),
            "{s}"
        );
        let (ds, _) = read(Kind::DaemonSet, daemonset);
        assert!(
            ds.contains("OnDelete") && ds.contains("max_unavailable: Some(Percent(34))"),
            "{ds}"
        );
    }

    /// Who owns the template's restartedAt is read from managedFields as the API server sends
    /// them: an Apply entry (kustomize-controller) and an Update entry (an operator) that own
    /// the key, bouncer's own entry and entries for other fields left out; Flux's labels name
    /// the Kustomization.
    #[test]
    fn the_owners_of_restarted_at_are_read_from_managed_fields() {
        use crate::core::literals::RESTARTED_AT;
        use crate::core::pin::{RestartOwner, RestartOwners};
        let key = format!("f:{RESTARTED_AT}");
        let owns = json!({"f:spec": {"f:replicas": {}, "f:template": {"f:metadata": {
            "f:annotations": {".": {}, key.as_str(): {}}, "f:labels": {"f:app": {}}}}}});
        let other = json!({"f:spec": {"f:template": {"f:metadata": {"f:annotations": {"f:team": {}}}}},
                           "f:status": {"f:replicas": {}}});
        let entry = |manager: &str, operation: &str, fields: &serde_json::Value| {
            json!({
            "manager": manager, "operation": operation, "apiVersion": "apps/v1",
            "time": "2026-12-06T09:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields})
        };
        let deployment = json!({
            "metadata": {"name": "web", "namespace": "shop",
                "labels": {"kustomize.toolkit.fluxcd.io/name": "apps",
                           "kustomize.toolkit.fluxcd.io/namespace": "flux-system"},
                "managedFields": [
                    entry("kustomize-controller", "Apply", &owns),
                    entry("bouncer", "Update", &owns),
                    entry("kube-controller-manager", "Update", &other),
                    entry("thv-operator", "Update", &owns),
                    {"manager": "old", "operation": "Update"},
                ]},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}}},
            "status": {}
        });
        let w = convert::controller(
            Kind::Deployment,
            serde_json::from_value(deployment.clone()).unwrap(),
        );
        let owner = |manager: &str, apply: bool| RestartOwner {
            manager: manager.into(),
            apply,
        };
        assert_eq!(
            w.restart_owners.as_deref(),
            Some(&RestartOwners {
                owners: vec![
                    owner("kustomize-controller", true),
                    owner("thv-operator", false)
                ],
                kustomization: Some("flux-system/apps".into()),
            })
        );
        // bouncer alone, or nobody: no owner to answer to.
        let mut alone = deployment;
        alone["metadata"]["managedFields"] = json!([entry("bouncer", "Update", &owns)]);
        let w = convert::controller(Kind::Deployment, serde_json::from_value(alone).unwrap());
        assert_eq!(w.restart_owners, None);
    }

    /// A Deployment an MCPServer controls names it (the operator's ownerReference), with the
    /// restart the operator last wrote on its template; other owners do not count.
    #[test]
    fn an_mcp_server_that_controls_a_deployment_is_read_from_its_owner_reference() {
        let owner = |api: &str, kind: &str, controller: bool| json!({"apiVersion": api, "kind": kind, "name": "fetch", "uid": "u", "controller": controller});
        let read = |owners: serde_json::Value| {
            let json = json!({
                "metadata": {"name": "fetch", "namespace": "mcp", "ownerReferences": owners},
                "spec": {"selector": {}, "template": {"metadata": {"annotations":
                    {"mcpserver.toolhive.stacklok.dev/restarted-at": "2026-12-03T10:00:00Z"}}}}
            });
            convert::controller(Kind::Deployment, serde_json::from_value(json).unwrap()).toolhive
        };
        let got = read(json!([owner(
            "toolhive.stacklok.dev/v1beta1",
            "MCPServer",
            true
        )]));
        let server = got.server.expect("the MCPServer");
        assert_eq!(
            (server.api_version.as_str(), server.name.as_str()),
            ("toolhive.stacklok.dev/v1beta1", "fetch")
        );
        assert_eq!(got.restarted_at.as_deref(), Some("2026-12-03T10:00:00Z"));
        for other in [
            owner("toolhive.stacklok.dev/v1beta1", "MCPServer", false),
            owner("toolhive.stacklok.dev/v1beta1", "VirtualMCPServer", true),
            owner("example.com/v1", "MCPServer", true),
        ] {
            assert_eq!(read(json!([other])).server, None, "{other}");
        }
    }

    /// An answer that does not read as its slim form is an error naming the object, never a
    /// panic, and never retried.
    #[test]
    fn an_answer_that_does_not_decode_is_an_error_naming_the_object() {
        let e = decode::<Controller>("{\"spec\": 3}", "Deployment", "shop", "web").unwrap_err();
        let kube_error = kube::Error::from(e);
        assert!(
            !crate::cluster::retry::transient(&kube_error),
            "not retried"
        );
        let text = kube_error.to_string();
        assert!(
            text.contains("failed to read Deployment shop/web from the API server's answer"),
            "{text}"
        );
        // The happy path: a served object reads.
        let json = serde_json::to_string(&pod_json()).unwrap();
        assert!(decode::<Pod>(&json, "Pod", "shop", "web").is_ok());
    }

    /// Found by the fuzz target `api_objects` (seed `limits.json`): counts the API server's
    /// validation never lets through overflowed the restart arithmetic (a panic in a debug build,
    /// nonsense in a release one). They convert as the nearest valid count.
    #[test]
    fn counts_no_api_server_would_serve_convert_without_overflow() {
        let json = json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"replicas": i32::MIN, "selector": {}, "template": {},
                     "strategy": {"rollingUpdate": {"maxSurge": "2147483647%", "maxUnavailable": 1}},
                     "updateStrategy": {"rollingUpdate": {"maxUnavailable": 1, "partition": i32::MIN}}},
            "status": {"observedGeneration": 1, "replicas": i32::MAX, "updatedReplicas": i32::MIN, "readyReplicas": -1,
                       "desiredNumberScheduled": i32::MIN, "numberReady": i32::MIN}
        });
        for kind in [Kind::Deployment, Kind::StatefulSet, Kind::DaemonSet] {
            let w = convert::controller(kind, serde_json::from_value(json.clone()).unwrap());
            let s = &w.status;
            assert!(
                s.desired >= 0 && s.updated >= 0 && s.ready >= 0,
                "{kind:?}: {s:?}"
            );
            // The core's arithmetic on them must not overflow either.
            for method in [Method::Rollout, Method::Evict] {
                let _ = crate::core::disruption::min_ready(&w, method);
                let _ = crate::core::disruption::taken_at_once(&w, method);
            }
            let _ = crate::core::rollout::state(kind, w.strategy, s);
        }
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
        let pdb = crate::core::model::Pdb::from(pdb);
        assert_eq!((pdb.name.as_str(), pdb.disruptions_allowed), ("web", 1));
        assert_eq!(
            pdb.selector.match_labels.get("app").map(String::as_str),
            Some("web")
        );
    }
}
