//! events.k8s.io/v1 Events on bounced workloads: Bounced, BounceFailed, BounceReverted, and
//! BounceBreakerOpen on a due workload the circuit breaker held back.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::core::model::{Kind, WorkloadRef};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

fn api_version(kind: Kind) -> &'static str {
    match kind {
        Kind::Pod => "v1",
        _ => "apps/v1",
    }
}

/// Records an Event on the workload. Best effort: a failure is logged, never fatal, because the
/// bounce itself already happened (or failed) and the report says so.
pub async fn emit(
    client: &Client,
    target: &WorkloadRef,
    reason: &str,
    note: &str,
    severity: Severity,
    now: DateTime<Utc>,
) {
    let micros =
        k8s_openapi::jiff::Timestamp::from_microsecond(now.timestamp_micros()).unwrap_or_default();
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.bouncer-", target.name)),
            namespace: Some(target.namespace.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(micros)),
        action: Some("Bounce".into()),
        reason: Some(reason.into()),
        note: Some(note.chars().take(1024).collect()),
        type_: Some(match severity {
            Severity::Normal => "Normal".into(),
            Severity::Warning => "Warning".into(),
        }),
        reporting_controller: Some("bouncer.dev/bouncer".into()),
        reporting_instance: Some("bouncer".into()),
        regarding: Some(ObjectReference {
            api_version: Some(api_version(target.kind).into()),
            kind: Some(target.kind.as_str().into()),
            namespace: Some(target.namespace.clone()),
            name: Some(target.name.clone()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &target.namespace);
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        tracing::warn!("failed to record event {reason} on {target}: {e}");
    }
}
