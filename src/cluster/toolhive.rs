//! ToolHive's MCPServer as a restart method: one GET of its restart annotations, and the merge
//! patch of its `restarted-at` that asks the operator to roll the server's proxy Deployment.

use kube::Client;
use kube::api::{GetParams, Patch, PatchParams};
use kube::core::Request;
use serde::Deserialize;
use serde_json::json;

use super::retry::with_retries;
use crate::core::literals::{
    FIELD_MANAGER, MCP_SERVER_RESOURCE, TOOLHIVE_LAST_PROCESSED, TOOLHIVE_RESTART_STRATEGY,
    TOOLHIVE_RESTARTED_AT,
};
use crate::core::model::McpServerRef;
use crate::core::toolhive::McpServerState;

#[derive(Debug, thiserror::Error)]
pub enum ToolhiveError {
    #[error("failed to read MCPServer {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to withdraw the restart request on MCPServer {namespace}/{name}: {source}")]
    Withdraw {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to ask MCPServer {namespace}/{name} for a restart: {source}")]
    Patch {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Only the annotations of the resource.
#[derive(Deserialize)]
struct Resource {
    #[serde(default)]
    metadata: Metadata,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    annotations: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    managed_fields: Option<Vec<ManagedEntry>>,
}

#[derive(Deserialize)]
struct ManagedEntry {
    #[serde(default)]
    manager: Option<String>,
    #[serde(rename = "fieldsV1", default)]
    fields_v1: Option<serde_json::Value>,
}

impl ManagedEntry {
    /// This entry owns the resource's `restarted-at` (fieldsV1 spells a key `f:<key>`).
    fn owns_restarted_at(&self) -> bool {
        let key = format!("f:{TOOLHIVE_RESTARTED_AT}");
        self.fields_v1
            .as_ref()
            .and_then(|f| f.get("f:metadata")?.get("f:annotations")?.get(&key))
            .is_some()
    }
}

fn request(namespace: &str, server: &McpServerRef) -> Request {
    Request::new(format!(
        "/apis/{}/namespaces/{namespace}/{MCP_SERVER_RESOURCE}",
        server.api_version
    ))
}

fn state(server: &McpServerRef, json: &str) -> Result<McpServerState, kube::Error> {
    let r: Resource = serde_json::from_str(json).map_err(kube::Error::SerdeError)?;
    let mut annotations = r.metadata.annotations.unwrap_or_default();
    let requested_by_bouncer = r
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|e| e.manager.as_deref() == Some(FIELD_MANAGER) && e.owns_restarted_at());
    Ok(McpServerState {
        name: server.name.clone(),
        uid: r.metadata.uid.unwrap_or_default(),
        strategy: annotations.remove(TOOLHIVE_RESTART_STRATEGY),
        last_processed: annotations.remove(TOOLHIVE_LAST_PROCESSED),
        resource_version: r.metadata.resource_version.unwrap_or_default(),
        restarted_at: annotations.remove(TOOLHIVE_RESTARTED_AT),
        requested_by_bouncer,
    })
}

/// The MCPServer's UID and restart annotations (and who wrote its `restarted-at`), right
/// before asking, or before withdrawing a request an interrupted run left.
pub async fn read(
    client: &Client,
    namespace: &str,
    server: &McpServerRef,
) -> Result<McpServerState, ToolhiveError> {
    with_retries(
        &format!("read MCPServer {namespace}/{}", server.name),
        || async move {
            let req = request(namespace, server)
                .get(&server.name, &GetParams::default())
                .map_err(kube::Error::BuildRequest)?;
            state(server, &client.request_text(req).await?)
        },
    )
    .await
    .map_err(|source| ToolhiveError::Read {
        namespace: namespace.to_string(),
        name: server.name.clone(),
        source,
    })
}

/// Sets `restarted-at` on the MCPServer (a merge patch as bouncer's field manager): the
/// operator's next reconcile restarts the server with its rolling strategy. The patch carries
/// the resourceVersion read before asking, so the server refuses it (409) if anything changed
/// the resource in between (its restart strategy above all).
pub async fn request_restart(
    client: &Client,
    namespace: &str,
    server: &McpServerRef,
    value: &str,
    resource_version: &str,
) -> Result<(), ToolhiveError> {
    let body = json!({"metadata": {
        "resourceVersion": resource_version,
        "annotations": {TOOLHIVE_RESTARTED_AT: value},
    }});
    let params = &PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let body = &body;
    with_retries(
        &format!("patch MCPServer {namespace}/{}", server.name),
        || async move {
            let req = request(namespace, server)
                .patch(&server.name, params, &Patch::Merge(body))
                .map_err(kube::Error::BuildRequest)?;
            client.request_text(req).await.map(drop)
        },
    )
    .await
    .map_err(|source| ToolhiveError::Patch {
        namespace: namespace.to_string(),
        name: server.name.clone(),
        source,
    })
}

/// Removes bouncer's `restarted-at` from the MCPServer if it still holds `value` (a JSON patch
/// that tests the value first): a request the operator did not act on within the bounce's
/// timeout must not restart the server later, unobserved.
pub async fn withdraw(
    client: &Client,
    namespace: &str,
    server: &McpServerRef,
    value: &str,
) -> Result<(), ToolhiveError> {
    let path = format!(
        "/metadata/annotations/{}",
        TOOLHIVE_RESTARTED_AT.replace('~', "~0").replace('/', "~1")
    );
    let body = serde_json::to_vec(&json!([
        {"op": "test", "path": path, "value": value},
        {"op": "remove", "path": path},
    ]))
    .unwrap_or_default();
    let url = format!(
        "/apis/{}/namespaces/{namespace}/{MCP_SERVER_RESOURCE}/{}?fieldManager={FIELD_MANAGER}",
        server.api_version, server.name
    );
    let (url, body) = (&url, &body);
    with_retries(
        &format!(
            "withdraw the restart request on MCPServer {namespace}/{}",
            server.name
        ),
        || async move {
            let req = http::Request::patch(url.as_str())
                .header(http::header::CONTENT_TYPE, "application/json-patch+json")
                .body(body.clone())
                .map_err(|e| {
                    kube::Error::BuildRequest(kube::core::request::Error::BuildRequest(e))
                })?;
            client.request_text(req).await.map(drop)
        },
    )
    .await
    .map_err(|source| ToolhiveError::Withdraw {
        namespace: namespace.to_string(),
        name: server.name.clone(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> McpServerRef {
        McpServerRef {
            api_version: "toolhive.stacklok.dev/v1beta1".into(),
            name: "fetch".into(),
            uid: "u1".into(),
        }
    }

    /// As the API server returns an MCPServer bouncer asked, and the operator then annotated.
    #[test]
    fn the_request_is_bouncers_while_its_field_manager_owns_the_annotation() {
        let json = |manager: &str| {
            json!({"metadata": {
                "uid": "u1",
                "resourceVersion": "42",
                "annotations": {
                    TOOLHIVE_RESTARTED_AT: "2026-12-03T10:00:00Z",
                    TOOLHIVE_LAST_PROCESSED: "2026-12-03T09:00:00Z",
                },
                "managedFields": [
                    {"manager": "thv-operator", "operation": "Update", "fieldsV1": {
                        "f:metadata": {"f:annotations": {
                            format!("f:{TOOLHIVE_LAST_PROCESSED}"): {}}}}},
                    {"manager": manager, "operation": "Update", "fieldsV1": {
                        "f:metadata": {"f:annotations": {
                            format!("f:{TOOLHIVE_RESTARTED_AT}"): {}}}}},
                ],
            }})
            .to_string()
        };
        let ours = state(&server(), &json(FIELD_MANAGER)).unwrap();
        assert_eq!(ours.restarted_at.as_deref(), Some("2026-12-03T10:00:00Z"));
        assert_eq!(ours.last_processed.as_deref(), Some("2026-12-03T09:00:00Z"));
        assert_eq!(
            (ours.uid.as_str(), ours.resource_version.as_str()),
            ("u1", "42")
        );
        assert!(ours.requested_by_bouncer);
        let theirs = state(&server(), &json("kubectl-annotate")).unwrap();
        assert!(!theirs.requested_by_bouncer);
        let bare = state(&server(), r#"{"metadata": {"uid": "u1"}}"#).unwrap();
        assert_eq!(
            (bare.restarted_at, bare.requested_by_bouncer),
            (None, false)
        );
    }
}
