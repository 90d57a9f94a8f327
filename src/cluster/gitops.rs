//! The labels and managedFields of one workload that tell whether a GitOps controller manages it
//! (`core::gitops` decides what they mean), read with one GET for `bouncer explain`.

use std::collections::BTreeMap;

use kube::Client;
use kube::api::GetParams;
use kube::core::Request;
use serde::Deserialize;

use super::kinds::collection;
use super::wire;
use crate::core::gitops::{FLUX_NAME_LABEL, FLUX_NAMESPACE_LABEL, Facts, ManagedEntry};
use crate::core::literals::RESTARTED_AT;
use crate::core::model::WorkloadRef;

#[derive(Debug, Default, Deserialize)]
struct Object {
    #[serde(default)]
    metadata: Meta,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    managed_fields: Option<Vec<Entry>>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    manager: Option<String>,
    operation: Option<String>,
    #[serde(rename = "fieldsV1")]
    fields_v1: Option<serde_json::Value>,
}

/// The workload's GitOps facts: only the Flux labels, and every managedFields entry.
pub async fn facts(client: &Client, target: &WorkloadRef) -> Result<Facts, kube::Error> {
    let req = Request::new(collection(target.kind, Some(&target.namespace)))
        .get(&target.name, &GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    let json = client.request_text(req).await?;
    let object: Object =
        wire::decode(&json, target.kind.as_str(), &target.namespace, &target.name)?;
    Ok(convert(object))
}

fn convert(object: Object) -> Facts {
    // A JSON pointer: the key's `/` is spelled `~1`.
    let key = format!(
        "/f:spec/f:template/f:metadata/f:annotations/f:{}",
        RESTARTED_AT.replace('/', "~1")
    );
    let labels = object
        .metadata
        .labels
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k == FLUX_NAME_LABEL || k == FLUX_NAMESPACE_LABEL)
        .collect();
    let managed = object
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .map(|e| ManagedEntry {
            manager: e.manager.unwrap_or_default(),
            operation: e.operation.unwrap_or_default(),
            owns_restarted_at: e
                .fields_v1
                .as_ref()
                .is_some_and(|f| f.pointer(&key).is_some()),
        })
        .collect();
    Facts { labels, managed }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_flux_labels_and_who_owns_the_restart_annotation() {
        let json = serde_json::json!({"metadata": {
        "labels": {"app": "web", FLUX_NAME_LABEL: "apps", FLUX_NAMESPACE_LABEL: "flux-system"},
        "managedFields": [
            {"manager": "kustomize-controller", "operation": "Apply", "fieldsV1": {"f:spec": {
                "f:template": {"f:metadata": {"f:annotations": {
                    "f:kubectl.kubernetes.io/restartedAt": {}}}}}}},
            {"manager": "kube-controller-manager", "operation": "Update",
             "fieldsV1": {"f:status": {}}},
        ]}});
        let facts = convert(serde_json::from_value(json).unwrap());
        assert_eq!(
            facts.labels.len(),
            2,
            "only Flux's labels: {:?}",
            facts.labels
        );
        assert_eq!(
            facts.managed,
            [
                ManagedEntry {
                    manager: "kustomize-controller".into(),
                    operation: "Apply".into(),
                    owns_restarted_at: true
                },
                ManagedEntry {
                    manager: "kube-controller-manager".into(),
                    operation: "Update".into(),
                    owns_restarted_at: false
                },
            ]
        );
    }
}
