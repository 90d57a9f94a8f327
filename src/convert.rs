//! Conversion of API objects into the small domain structs, done once at the edge. The rules
//! read the slim [`wire`] forms the snapshot lists; the few full k8s-openapi objects read one at
//! a time (fresh reads, watches) are read back into the same slim forms first.

pub mod list;
pub mod wire;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::consts::{
    MIRROR_ANNOTATION, PROGRESS_DEADLINE_EXCEEDED, RESTARTED_AT, SIDECAR_RESTART_POLICY,
};
use crate::model::{
    ContainerSample, Kind, Pdb, PodSample, RolloutStatus, StsRollingUpdate, UpdateStrategy,
    Workload, WorkloadRef,
};
use crate::policy::{Operator, Requirement, Selector};
use crate::quantity::parse_bytes;
use wire::{ObjectMeta, PodTemplateSpec, RereadError};

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

fn base(
    kind: Kind,
    meta: ObjectMeta,
    template: PodTemplateSpec,
    selector: &LabelSelector,
) -> Workload {
    let restarted_at = template_restarted_at(&template);
    Workload {
        target: WorkloadRef {
            kind,
            namespace: meta.namespace.unwrap_or_default(),
            name: meta.name.unwrap_or_default(),
        },
        labels: meta.labels.unwrap_or_default(),
        template_labels: template.metadata.and_then(|m| m.labels).unwrap_or_default(),
        pod_selector: selector_string(selector),
        attempt: crate::mark::AttemptMark::from_annotations(
            meta.annotations.as_ref().unwrap_or(&BTreeMap::new()),
        ),
        annotations: meta.annotations.unwrap_or_default(),
        restarted_at,
        paused: false,
        strategy: UpdateStrategy::RollingUpdate,
        status: RolloutStatus {
            generation: meta.generation.unwrap_or(0),
            ..Default::default()
        },
        min_ready_during_restart: 0,
        pods: Vec::new(),
        mirror: false,
    }
}

/// Resolves an IntOrString against a replica count the way the Deployment controller does.
fn resolve(v: Option<&IntOrString>, total: i32, default_percent: i32, round_up: bool) -> i32 {
    match v {
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(s)) => {
            let pct: i32 = s.trim_end_matches('%').parse().unwrap_or(default_percent);
            percent_of(total, pct, round_up)
        }
        None => percent_of(total, default_percent, round_up),
    }
}

fn percent_of(total: i32, pct: i32, round_up: bool) -> i32 {
    let scaled = total as i64 * pct as i64;
    (if round_up {
        (scaled + 99) / 100
    } else {
        scaled / 100
    }) as i32
}

pub fn deployment(d: &Deployment) -> Result<Workload, RereadError> {
    wire::reread::<wire::Deployment, _>(d).map(Workload::from)
}

pub fn statefulset(s: &StatefulSet) -> Result<Workload, RereadError> {
    wire::reread::<wire::StatefulSet, _>(s).map(Workload::from)
}

pub fn daemonset(d: &DaemonSet) -> Result<Workload, RereadError> {
    wire::reread::<wire::DaemonSet, _>(d).map(Workload::from)
}

pub fn pod_sample(p: &Pod) -> Result<PodSample, RereadError> {
    wire::reread::<wire::Pod, _>(p).map(|p| PodSample::from(&p))
}

/// A bare pod as its own workload.
pub fn bare_pod(p: &Pod) -> Result<Workload, RereadError> {
    wire::reread(p).map(bare)
}

impl From<wire::Deployment> for Workload {
    fn from(d: wire::Deployment) -> Workload {
        let spec = d.spec.unwrap_or_default();
        let mut w = base(Kind::Deployment, d.metadata, spec.template, &spec.selector);
        let desired = spec.replicas.unwrap_or(1);
        w.paused = spec.paused.unwrap_or(false);
        let strategy = spec.strategy.unwrap_or_default();
        let recreate = strategy.type_.as_deref() == Some("Recreate");
        w.strategy = if recreate {
            UpdateStrategy::Recreate
        } else {
            UpdateStrategy::RollingUpdate
        };
        w.min_ready_during_restart = if recreate {
            0
        } else {
            let ru = strategy.rolling_update.unwrap_or_default();
            let surge = resolve(ru.max_surge.as_ref(), desired, 25, true);
            let mut unavailable = resolve(ru.max_unavailable.as_ref(), desired, 25, false);
            if surge == 0 && unavailable == 0 {
                unavailable = 1;
            }
            desired - unavailable
        };
        if let Some(s) = &d.status {
            w.status.observed_generation = s.observed_generation.unwrap_or(0);
            w.status.current = s.replicas.unwrap_or(0);
            w.status.updated = s.updated_replicas.unwrap_or(0);
            w.status.ready = s.ready_replicas.unwrap_or(0);
            w.status.available = s.available_replicas.unwrap_or(0);
            w.status.progress_deadline_exceeded = s.conditions.iter().flatten().any(|c| {
                c.type_ == "Progressing" && c.reason.as_deref() == Some(PROGRESS_DEADLINE_EXCEEDED)
            });
        }
        w.status.desired = desired;
        w
    }
}

impl From<wire::StatefulSet> for Workload {
    fn from(s: wire::StatefulSet) -> Workload {
        let spec = s.spec.unwrap_or_default();
        let mut w = base(Kind::StatefulSet, s.metadata, spec.template, &spec.selector);
        let desired = spec.replicas.unwrap_or(1);
        let strategy = spec.update_strategy.unwrap_or_default();
        w.strategy = if strategy.type_.as_deref() == Some("OnDelete") {
            UpdateStrategy::OnDelete
        } else {
            UpdateStrategy::RollingUpdate
        };
        w.status.rolling_update = match strategy.rolling_update {
            None => StsRollingUpdate::Unset,
            Some(r) => StsRollingUpdate::Set {
                partition: r.partition,
            },
        };
        // The StatefulSet controller replaces one pod at a time.
        w.min_ready_during_restart = desired - 1;
        w.status.desired = desired;
        if let Some(st) = s.status {
            w.status.observed_generation = st.observed_generation.unwrap_or(0);
            w.status.current = st.replicas;
            w.status.updated = st.updated_replicas.unwrap_or(0);
            w.status.ready = st.ready_replicas.unwrap_or(0);
            // availableReplicas is served from v1.22; before that readiness is the best signal.
            w.status.available = st.available_replicas.unwrap_or(w.status.ready);
            w.status.current_revision = st.current_revision;
            w.status.update_revision = st.update_revision;
        }
        w
    }
}

impl From<wire::DaemonSet> for Workload {
    fn from(d: wire::DaemonSet) -> Workload {
        let spec = d.spec.unwrap_or_default();
        let mut w = base(Kind::DaemonSet, d.metadata, spec.template, &spec.selector);
        let strategy = spec.update_strategy.unwrap_or_default();
        w.strategy = if strategy.type_.as_deref() == Some("OnDelete") {
            UpdateStrategy::OnDelete
        } else {
            UpdateStrategy::RollingUpdate
        };
        if let Some(st) = &d.status {
            let desired = st.desired_number_scheduled;
            // DaemonSets default to maxUnavailable 1; a percentage rounds up.
            let unavailable = match strategy.rolling_update.and_then(|r| r.max_unavailable) {
                None => 1,
                Some(v) => resolve(Some(&v), desired, 0, true).max(1),
            };
            w.min_ready_during_restart = desired - unavailable;
            w.status.desired = desired;
            w.status.observed_generation = st.observed_generation.unwrap_or(0);
            w.status.current = st.current_number_scheduled;
            w.status.updated = st.updated_number_scheduled.unwrap_or(0);
            w.status.ready = st.number_ready;
            w.status.available = st.number_available.unwrap_or(0);
        }
        w
    }
}

fn memory_limit(resources: Option<&wire::ResourceRequirements>) -> Option<u64> {
    resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.memory.as_ref())
        .and_then(|q| parse_bytes(&q.0).ok())
}

impl From<&wire::Pod> for PodSample {
    fn from(p: &wire::Pod) -> PodSample {
        let status = p.status.as_ref();
        PodSample {
            name: p.metadata.name.clone().unwrap_or_default(),
            uid: p.metadata.uid.clone().unwrap_or_default(),
            labels: map(&p.metadata.labels),
            started: status.and_then(|s| s.start_time.as_ref()).map(time),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            deleting: p.metadata.deletion_timestamp.is_some(),
            containers: p
                .spec
                .iter()
                .flat_map(|s| {
                    let sidecars = s
                        .init_containers
                        .iter()
                        .filter(|c| c.restart_policy.as_deref() == Some(SIDECAR_RESTART_POLICY));
                    s.containers.iter().chain(sidecars)
                })
                .map(|c| ContainerSample {
                    name: c.name.clone(),
                    usage: None,
                    limit: memory_limit(c.resources.as_ref()),
                })
                .collect(),
            limit: p
                .spec
                .as_ref()
                .and_then(|s| memory_limit(s.resources.as_ref())),
            has_metrics: false,
        }
    }
}

/// A bare pod as its own workload.
pub fn bare(p: wire::Pod) -> Workload {
    let sample = PodSample::from(&p);
    let meta = p.metadata;
    let name = meta.name.unwrap_or_default();
    Workload {
        target: WorkloadRef {
            kind: Kind::Pod,
            namespace: meta.namespace.unwrap_or_default(),
            name,
        },
        labels: sample.labels.clone(),
        template_labels: sample.labels.clone(),
        pod_selector: String::new(),
        annotations: map(&meta.annotations),
        // A bare pod's mark lives on the Lease (it must survive the pod); see Inventory.
        attempt: crate::mark::AttemptMark::None,
        restarted_at: None,
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
        min_ready_during_restart: 0,
        mirror: meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)),
        pods: vec![sample],
    }
}

/// A LabelSelector in `-l` syntax, for listing a controller's pods.
pub fn selector_string(s: &LabelSelector) -> String {
    let mut parts: Vec<String> = map(&s.match_labels)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in s.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

/// A LabelSelector as bouncer's own matcher (for PodDisruptionBudgets).
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
