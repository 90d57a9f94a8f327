//! Per-kind access to workloads, written once: where each kind lives in the API, and the GET,
//! PATCH and managedFields reads of one workload as raw requests whose answers are read in the
//! slim wire forms and converted by `convert`, exactly as LIST items and watch events are.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{GetParams, Patch, PatchParams};
use kube::core::Request;
use kube::{Client, Resource};

use super::convert;
use super::wire::{self, DecodeError};
use crate::core::literals::FIELD_MANAGER;
use crate::core::model::{Kind, Workload, WorkloadRef};
use crate::core::verify::FieldWrite;

/// The collection URL of a kind, in one namespace or (None) in all.
pub fn collection(kind: Kind, namespace: Option<&str>) -> String {
    match kind {
        Kind::Deployment => Deployment::url_path(&(), namespace),
        Kind::StatefulSet => StatefulSet::url_path(&(), namespace),
        Kind::DaemonSet => DaemonSet::url_path(&(), namespace),
        Kind::Pod => Pod::url_path(&(), namespace),
    }
}

/// ReplicaSets, which the snapshot reads to find the Deployment that owns a pod.
pub fn replicasets(namespace: Option<&str>) -> String {
    ReplicaSet::url_path(&(), namespace)
}

/// One workload object's JSON (a GET, PATCH or watch answer) in its domain form, with its
/// resourceVersion.
pub fn decode(target: &WorkloadRef, json: &str) -> Result<(Workload, String), DecodeError> {
    let (ns, name) = (target.namespace.as_str(), target.name.as_str());
    let kind = target.kind.as_str();
    if target.kind == Kind::Pod {
        let pod: wire::Pod = wire::decode(json, kind, ns, name)?;
        let version = pod.metadata.resource_version.clone().unwrap_or_default();
        return Ok((convert::bare(pod, &mut Default::default()), version));
    }
    let c: wire::Controller = wire::decode(json, kind, ns, name)?;
    let version = c.metadata.resource_version.clone().unwrap_or_default();
    Ok((convert::controller(target.kind, c), version))
}

fn request(target: &WorkloadRef) -> Request {
    Request::new(collection(target.kind, Some(&target.namespace)))
}

/// One GET of a controller (or a bare pod), converted; a controller's pods are not listed.
pub async fn get(client: &Client, target: &WorkloadRef) -> Result<Workload, kube::Error> {
    let req = request(target)
        .get(&target.name, &GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    let json = client.request_text(req).await?;
    Ok(decode(target, &json)?.0)
}

/// One strategic-merge patch of a controller as bouncer's field manager: the workload as the
/// patch left it, and its resourceVersion (where a watch of its rollout starts).
pub async fn patch(
    client: &Client,
    target: &WorkloadRef,
    body: &serde_json::Value,
) -> Result<(Workload, String), kube::Error> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let req = request(target)
        .patch(&target.name, &params, &Patch::Strategic(body))
        .map_err(kube::Error::BuildRequest)?;
    let json = client.request_text(req).await?;
    Ok(decode(target, &json)?)
}

/// The workload's managedFields: who wrote which fields, and when.
pub async fn field_writes(
    client: &Client,
    target: &WorkloadRef,
) -> Result<Vec<FieldWrite>, kube::Error> {
    let req = request(target)
        .get(&target.name, &GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    let json = client.request_text(req).await?;
    let managed: wire::Managed =
        wire::decode(&json, target.kind.as_str(), &target.namespace, &target.name)?;
    Ok(managed
        .metadata
        .managed_fields
        .into_iter()
        .map(convert::field_write)
        .collect())
}
