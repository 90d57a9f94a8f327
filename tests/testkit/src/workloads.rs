//! Workload builders: small schedulable Deployments, StatefulSets, DaemonSets and pod templates
//! with the memory-model annotations, plus ToolHive-shaped workloads (vMCP, MCPServer pairs).

use std::collections::BTreeMap;
use std::fmt::Debug;

use anyhow::{Context, Result};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, Deployment, DeploymentSpec, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{MEMORY_BASE, MEMORY_CONTAINER, MEMORY_LEAK_PER_MINUTE};

/// The image is never pulled (KWOK nodes run no containers) but must look real.
const IMAGE: &str = "registry.k8s.io/pause:3.2";
/// A large limit leaves room for percent-of-limit thresholds; the requests stay tiny, as a real
/// cluster's scheduler would need them.
const DEFAULT_MEMORY_LIMIT: &str = "2Gi";

fn labels_map(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn container(name: &str) -> Container {
    let q = |s: &str| Quantity(s.to_string());
    Container {
        name: name.to_string(),
        image: Some(IMAGE.to_string()),
        resources: Some(ResourceRequirements {
            requests: Some(
                [
                    ("cpu".to_string(), q("1m")),
                    ("memory".to_string(), q("8Mi")),
                ]
                .into(),
            ),
            limits: Some([("memory".to_string(), q(DEFAULT_MEMORY_LIMIT))].into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A pod template with one container `app`, tiny requests, a 2Gi memory limit and the labels.
pub fn pod_template(labels: &[(&str, &str)]) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels_map(labels)),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container("app")],
            // A KWOK node keeps a deleted pod Terminating for its whole grace period (an app that
            // uses all of it): short, so rollouts that wait for deletions stay quick.
            termination_grace_period_seconds: Some(2),
            ..Default::default()
        }),
    }
}

fn selector(labels: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(labels_map(labels)),
        ..Default::default()
    })
}

fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(labels_map(labels)),
        ..Default::default()
    }
}

/// A Deployment whose pods carry `labels` (also its selector), default RollingUpdate strategy.
pub fn deployment(name: &str, replicas: i32, labels: &[(&str, &str)]) -> Deployment {
    Deployment {
        metadata: meta(name, labels),
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: selector(labels).unwrap_or_default(),
            template: pod_template(labels),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A StatefulSet (RollingUpdate, OrderedReady like most charts). The governing Service named in
/// `serviceName` need not exist for pods to run.
pub fn statefulset(name: &str, replicas: i32, labels: &[(&str, &str)]) -> StatefulSet {
    StatefulSet {
        metadata: meta(name, labels),
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas),
            selector: selector(labels).unwrap_or_default(),
            service_name: Some(name.to_string()),
            template: pod_template(labels),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A DaemonSet (RollingUpdate): one pod per KWOK node.
pub fn daemonset(name: &str, labels: &[(&str, &str)]) -> DaemonSet {
    DaemonSet {
        metadata: meta(name, labels),
        spec: Some(DaemonSetSpec {
            selector: selector(labels).unwrap_or_default(),
            template: pod_template(labels),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Chainable edits of the pod template of a workload (or of a bare pod template).
pub trait PodTemplateExt: Sized {
    fn pod_template_mut(&mut self) -> &mut PodTemplateSpec;

    fn pod_template(&self) -> Option<&PodTemplateSpec>;

    /// The pod template's annotation `key`, as the API server returned it.
    fn template_annotation(&self, key: &str) -> Option<String> {
        self.pod_template()?
            .metadata
            .as_ref()?
            .annotations
            .as_ref()?
            .get(key)
            .cloned()
    }

    /// Sets the memory model: `base` plus `leak_per_minute` times pod age (quantities).
    fn with_memory(self, base: &str, leak_per_minute: &str) -> Self {
        self.with_annotation(MEMORY_BASE, base)
            .with_annotation(MEMORY_LEAK_PER_MINUTE, leak_per_minute)
    }

    /// Puts the memory model on a named container instead of the first one.
    fn with_memory_container(self, container: &str) -> Self {
        self.with_annotation(MEMORY_CONTAINER, container)
    }

    fn with_annotation(mut self, key: &str, value: &str) -> Self {
        let meta = self
            .pod_template_mut()
            .metadata
            .get_or_insert_with(Default::default);
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(key.to_string(), value.to_string());
        self
    }

    fn with_label(mut self, key: &str, value: &str) -> Self {
        let meta = self
            .pod_template_mut()
            .metadata
            .get_or_insert_with(Default::default);
        meta.labels
            .get_or_insert_with(Default::default)
            .insert(key.to_string(), value.to_string());
        self
    }

    /// Sets the memory limit of every container and native sidecar (`None` removes it, for
    /// "no limit" cases).
    fn with_memory_limit(mut self, limit: Option<&str>) -> Self {
        for c in self.pod_template_mut().spec.iter_mut().flat_map(|s| {
            s.containers
                .iter_mut()
                .chain(s.init_containers.iter_mut().flatten())
        }) {
            let limits = c
                .resources
                .get_or_insert_with(Default::default)
                .limits
                .get_or_insert_with(Default::default);
            match limit {
                Some(l) => limits.insert("memory".to_string(), Quantity(l.to_string())),
                None => limits.remove("memory"),
            };
        }
        self
    }

    /// Adds a native sidecar: an init container with `restartPolicy: Always` (same image,
    /// requests and limit as a regular container), which runs for the pod's whole life.
    fn with_sidecar(mut self, name: &str) -> Self {
        if let Some(spec) = self.pod_template_mut().spec.as_mut() {
            let mut sidecar = container(name);
            sidecar.restart_policy = Some("Always".to_string());
            spec.init_containers
                .get_or_insert_with(Vec::new)
                .push(sidecar);
        }
        self
    }

    /// Sets a pod-level memory limit (`spec.resources`) and removes the containers' own.
    fn with_pod_memory_limit(self, limit: &str) -> Self {
        let mut this = self.with_memory_limit(None);
        if let Some(spec) = this.pod_template_mut().spec.as_mut() {
            spec.resources = Some(ResourceRequirements {
                limits: Some([("memory".to_string(), Quantity(limit.to_string()))].into()),
                ..Default::default()
            });
        }
        this
    }

    /// Adds another container (same image, requests and limit as the first).
    fn with_container(mut self, name: &str) -> Self {
        if let Some(spec) = self.pod_template_mut().spec.as_mut() {
            spec.containers.push(container(name));
        }
        self
    }
}

impl PodTemplateExt for PodTemplateSpec {
    fn pod_template_mut(&mut self) -> &mut PodTemplateSpec {
        self
    }

    fn pod_template(&self) -> Option<&PodTemplateSpec> {
        Some(self)
    }
}

macro_rules! template_ext {
    ($($t:ty),*) => {$(
        impl PodTemplateExt for $t {
            fn pod_template_mut(&mut self) -> &mut PodTemplateSpec {
                &mut self.spec.get_or_insert_with(Default::default).template
            }

            fn pod_template(&self) -> Option<&PodTemplateSpec> {
                self.spec.as_ref().map(|s| &s.template)
            }
        }
    )*};
}
template_ext!(Deployment, StatefulSet, DaemonSet);

/// Creates a namespaced object in `ns` and returns what the server stored.
pub async fn create<K>(client: &Client, ns: &str, obj: &K) -> Result<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    Api::<K>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), obj)
        .await
        .with_context(|| format!("creating {} {ns}/{name}", K::kind(&())))
}

/// A Deployment shaped like the one ToolHive's operator makes for a VirtualMCPServer.
pub fn virtual_mcp_server(name: &str) -> Deployment {
    deployment(
        name,
        1,
        &[
            ("app.kubernetes.io/name", "virtualmcpserver"),
            ("app.kubernetes.io/instance", name),
        ],
    )
    .with_label("app.kubernetes.io/component", "vmcp")
    .with_label("app.kubernetes.io/managed-by", "toolhive-operator")
}

/// The two workloads ToolHive runs for one MCPServer: the proxy Deployment `<name>` and the
/// stdio backend StatefulSet `<name>-backend`. Both are public so a test can tune either.
#[derive(Debug, Clone)]
pub struct McpServer {
    pub proxy: Deployment,
    pub backend: StatefulSet,
}

pub fn mcp_server(name: &str) -> McpServer {
    let proxy = deployment(
        name,
        1,
        &[
            ("toolhive", "true"),
            ("toolhive-name", name),
            ("app.kubernetes.io/component", "proxy"),
        ],
    );
    let backend = statefulset(
        &format!("{name}-backend"),
        1,
        &[
            ("toolhive", "true"),
            ("toolhive-name", name),
            ("toolhive-transport", "stdio"),
        ],
    );
    McpServer { proxy, backend }
}

impl McpServer {
    /// Sets the same memory model on the proxy and the backend pods.
    pub fn with_memory(self, base: &str, leak_per_minute: &str) -> Self {
        Self {
            proxy: self.proxy.with_memory(base, leak_per_minute),
            backend: self.backend.with_memory(base, leak_per_minute),
        }
    }

    pub async fn create(&self, client: &Client, ns: &str) -> Result<()> {
        create(client, ns, &self.proxy).await?;
        create(client, ns, &self.backend).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_set_selector_labels_and_memory() {
        let d = deployment("web", 2, &[("app", "web")])
            .with_memory("32Mi", "1Mi")
            .with_memory_limit(Some("1Gi"));
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.selector.match_labels.as_ref().unwrap()["app"], "web");
        let t = spec.template.metadata.as_ref().unwrap();
        assert_eq!(t.labels.as_ref().unwrap()["app"], "web");
        assert_eq!(
            t.annotations.as_ref().unwrap()[MEMORY_LEAK_PER_MINUTE],
            "1Mi"
        );
        let c = &spec.template.spec.as_ref().unwrap().containers[0];
        let r = c.resources.as_ref().unwrap();
        assert_eq!(r.limits.as_ref().unwrap()["memory"].0, "1Gi");
        assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "1m");
    }

    #[test]
    fn mcp_server_pods_carry_toolhive_labels() {
        let s = mcp_server("fetch");
        assert_eq!(s.backend.metadata.name.as_deref(), Some("fetch-backend"));
        let proxy = s
            .proxy
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .labels
            .unwrap();
        let backend = s
            .backend
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .labels
            .unwrap();
        assert_eq!(
            (proxy["toolhive"].as_str(), proxy["toolhive-name"].as_str()),
            ("true", "fetch")
        );
        assert_eq!(backend["toolhive-transport"], "stdio");
    }
}
