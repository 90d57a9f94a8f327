//! The cluster snapshot: a fixed set of paged LISTs (fetched concurrently, converted page by page
//! into domain structs) and the grouping of pods under their owning workloads.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::error::ClusterError;
use super::list::pages;
use super::{convert, kinds, wire};
use crate::core::literals::EXCLUDE_ANNOTATION;
use crate::core::model::{
    Inventory, Kind, MetricsState, Pdb, PodSample, Unsupported, Workload, WorkloadRef,
};
use crate::core::quantity::parse_bytes;

/// A pod as the snapshot keeps it: under its controller, or a bare pod (its own workload).
enum PodEntry {
    Owned {
        owner_kind: String,
        owner: String,
        namespace: String,
        sample: PodSample,
    },
    Bare(Box<Workload>),
}

/// Pods on their way out (terminating, or finished) say nothing about the workload's current
/// pods: counting them would make a just-restarted workload look old again.
fn gone(p: &wire::Pod) -> bool {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    p.metadata.deletion_timestamp.is_some() || matches!(phase, Some("Succeeded" | "Failed"))
}

fn pod_entry(p: wire::Pod) -> Option<PodEntry> {
    let controller = p
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    match controller {
        // A terminating bare pod stays: it is the workload, and the gates must see it.
        _ if gone(&p) && controller.is_some() => None,
        Some(o) => Some(PodEntry::Owned {
            owner_kind: o.kind.clone(),
            owner: o.name.clone(),
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            sample: PodSample::from(&p),
        }),
        None => Some(PodEntry::Bare(Box::new(convert::bare(p)))),
    }
}

/// (namespace, replicaset) -> the Deployment that controls it, if any.
fn rs_owner(rs: wire::ReplicaSet) -> ((String, String), Option<String>) {
    let owner = rs
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Deployment")
        .map(|o| o.name.clone());
    (
        (
            rs.metadata.namespace.unwrap_or_default(),
            rs.metadata.name.unwrap_or_default(),
        ),
        owner,
    )
}

/// Working set per (namespace, pod) -> (container, bytes); a pod has a container or two, for
/// which a list is a fraction of the size of a map.
type Usage = BTreeMap<(String, String), Vec<(String, u64)>>;

fn metrics_entry(m: wire::PodMetrics) -> ((String, String), Vec<(String, u64)>) {
    let containers = m
        .containers
        .into_iter()
        .filter_map(|c| {
            let bytes = parse_bytes(&c.usage.memory?.0).ok()?;
            Some((c.name, bytes))
        })
        .collect();
    (
        (
            m.metadata.namespace.unwrap_or_default(),
            m.metadata.name.unwrap_or_default(),
        ),
        containers,
    )
}

/// LISTs every page of one collection (`url(namespace)`), in every namespace or in each of
/// `scope`, reading each object in its slim wire form `W` and converting it at once.
async fn list<W, T>(
    client: &Client,
    scope: &[String],
    url: impl Fn(Option<&str>) -> String,
    f: impl Fn(W) -> T,
) -> Result<Vec<T>, kube::Error>
where
    W: DeserializeOwned,
{
    let urls: Vec<String> = if scope.is_empty() {
        vec![url(None)]
    } else {
        scope.iter().map(|ns| url(Some(ns))).collect()
    };
    let mut out = Vec::new();
    for url in urls {
        pages(client, &url, &ListParams::default(), &f, &mut out).await?;
    }
    Ok(out)
}

/// PodMetrics have no k8s-openapi type to ask for their URL.
fn pod_metrics(namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods"),
        None => "/apis/metrics.k8s.io/v1beta1/pods".to_string(),
    }
}

/// Why the metrics read failed, in the words an operator acts on.
fn metrics_failure(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 404 => "metrics.k8s.io is not served".into(),
        kube::Error::Api(s) if s.code == 503 => {
            "metrics.k8s.io answered 503 service unavailable (is metrics-server running?)".into()
        }
        kube::Error::Api(s) if s.code == 403 => {
            format!("listing pod metrics is forbidden: {}", s.message)
        }
        e => format!("listing pod metrics failed: {e}"),
    }
}

fn excluded_namespace(n: wire::Namespace) -> Option<String> {
    let excluded = n
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXCLUDE_ANNOTATION))
        .is_some_and(|v| v == "true");
    excluded.then(|| n.metadata.name.unwrap_or_default())
}

async fn controllers(
    client: &Client,
    scope: &[String],
    kind: Kind,
) -> Result<Vec<Workload>, kube::Error> {
    let url = |ns: Option<&str>| kinds::collection(kind, ns);
    list(client, scope, url, |c| convert::controller(kind, c)).await
}

/// Takes the snapshot. Metrics are optional (their failure is recorded, not fatal); every other
/// read failing fails the snapshot, because a partial inventory could hide a reason to skip.
/// `metrics_client` is the one for metrics.k8s.io (it does not retry: see `cluster::connect`).
pub async fn snapshot(
    client: &Client,
    metrics_client: &Client,
    scope: &[String],
) -> Result<Inventory, ClusterError> {
    let wrap = |what: &'static str| move |source| ClusterError::List { what, source };
    let namespaces = async {
        let all = list(
            client,
            &[],
            |_| Namespace::url_path(&(), None),
            excluded_namespace,
        )
        .await
        .map_err(wrap("namespaces"))?;
        Ok::<_, ClusterError>(all.into_iter().flatten().collect::<BTreeSet<_>>())
    };
    let metrics = async {
        match list(metrics_client, scope, pod_metrics, metrics_entry).await {
            Ok(m) => (MetricsState::Available, m.into_iter().collect::<Usage>()),
            Err(e) => (MetricsState::Unavailable(metrics_failure(&e)), Usage::new()),
        }
    };
    let (pods, rs, deployments, statefulsets, daemonsets, pdbs, excluded, (metrics, usage)) = futures::join!(
        async {
            list(
                client,
                scope,
                |ns| kinds::collection(Kind::Pod, ns),
                pod_entry,
            )
            .await
            .map_err(wrap("pods"))
        },
        async {
            list(client, scope, kinds::replicasets, rs_owner)
                .await
                .map_err(wrap("replicasets"))
        },
        async {
            controllers(client, scope, Kind::Deployment)
                .await
                .map_err(wrap("deployments"))
        },
        async {
            controllers(client, scope, Kind::StatefulSet)
                .await
                .map_err(wrap("statefulsets"))
        },
        async {
            controllers(client, scope, Kind::DaemonSet)
                .await
                .map_err(wrap("daemonsets"))
        },
        async {
            let url = |ns: Option<&str>| PodDisruptionBudget::url_path(&(), ns);
            list(
                client,
                scope,
                url,
                <Pdb as From<wire::PodDisruptionBudget>>::from,
            )
            .await
            .map_err(wrap("poddisruptionbudgets"))
        },
        namespaces,
        metrics,
    );
    let mut workloads: Vec<Workload> = deployments?;
    workloads.extend(statefulsets?);
    workloads.extend(daemonsets?);
    let inventory = group(pods?, rs?.into_iter().collect(), workloads, &usage);
    Ok(Inventory {
        workloads: inventory.0,
        unsupported: inventory.1,
        excluded_namespaces: excluded?,
        pdbs: pdbs?,
        metrics,
    })
}

fn with_usage(mut sample: PodSample, namespace: &str, usage: &Usage) -> PodSample {
    if let Some(containers) = usage.get(&(namespace.to_string(), sample.name.clone())) {
        sample.has_metrics = true;
        for c in &mut sample.containers {
            c.usage = containers
                .iter()
                .find(|(name, _)| *name == c.name)
                .map(|(_, bytes)| *bytes);
        }
    }
    sample
}

/// Groups pods under their workloads: Pod→ReplicaSet→Deployment, Pod→StatefulSet,
/// Pod→DaemonSet, bare pods on their own; any other owner is reported as unsupported.
fn group(
    pods: Vec<Option<PodEntry>>,
    rs_owners: BTreeMap<(String, String), Option<String>>,
    mut workloads: Vec<Workload>,
    usage: &Usage,
) -> (Vec<Workload>, Vec<Unsupported>) {
    let index: BTreeMap<WorkloadRef, usize> = workloads
        .iter()
        .enumerate()
        .map(|(i, w)| (w.target.clone(), i))
        .collect();
    let mut unsupported = Vec::new();
    let mut bare = Vec::new();
    for entry in pods.into_iter().flatten() {
        match entry {
            PodEntry::Bare(mut w) => {
                let ns = w.target.namespace.clone();
                w.pods = w
                    .pods
                    .into_iter()
                    .map(|p| with_usage(p, &ns, usage))
                    .collect();
                bare.push(*w);
            }
            PodEntry::Owned {
                owner_kind,
                owner,
                namespace,
                sample,
            } => {
                let resolved = match owner_kind.as_str() {
                    "ReplicaSet" => match rs_owners.get(&(namespace.clone(), owner.clone())) {
                        Some(Some(deployment)) => Some((Kind::Deployment, deployment.clone())),
                        _ => None,
                    },
                    "StatefulSet" => Some((Kind::StatefulSet, owner.clone())),
                    "DaemonSet" => Some((Kind::DaemonSet, owner.clone())),
                    _ => None,
                };
                let slot = resolved.and_then(|(kind, name)| {
                    index
                        .get(&WorkloadRef {
                            kind,
                            namespace: namespace.clone(),
                            name,
                        })
                        .copied()
                });
                match slot {
                    Some(i) => workloads[i]
                        .pods
                        .push(with_usage(sample, &namespace, usage)),
                    None => unsupported.push(Unsupported {
                        namespace,
                        pod: sample.name,
                        owner_kind,
                        owner_name: owner,
                        labels: sample.labels,
                    }),
                }
            }
        }
    }
    workloads.extend(bare);
    workloads.sort_by(|a, b| a.target.cmp(&b.target));
    (workloads, unsupported)
}

/// A fresh read of one workload and its pods, right before acting on it.
pub async fn read_workload(client: &Client, target: &WorkloadRef) -> Result<Workload, kube::Error> {
    let ns = target.namespace.as_str();
    let mut w = kinds::get(client, target).await?;
    if target.kind == Kind::Pod {
        return Ok(w);
    }
    let selected = ListParams::default().labels(&w.pod_selector.to_string());
    let mut listed: Vec<wire::Pod> = Vec::new();
    pages(
        client,
        &kinds::collection(Kind::Pod, Some(ns)),
        &selected,
        |p| p,
        &mut listed,
    )
    .await?;
    let rs_names: BTreeSet<String> = if target.kind == Kind::Deployment {
        let mut rs = Vec::new();
        pages(
            client,
            &kinds::replicasets(Some(ns)),
            &selected,
            rs_owner,
            &mut rs,
        )
        .await?;
        rs.into_iter()
            .filter(|(_, owner)| owner.as_deref() == Some(target.name.as_str()))
            .map(|((_, name), _)| name)
            .collect()
    } else {
        BTreeSet::new()
    };
    w.pods = listed
        .iter()
        .filter(|p| !gone(p))
        .filter(|p| {
            p.metadata.owner_references.iter().flatten().any(|o| {
                o.controller == Some(true)
                    && match target.kind {
                        Kind::Deployment => o.kind == "ReplicaSet" && rs_names.contains(&o.name),
                        _ => o.kind == target.kind.as_str() && o.name == target.name,
                    }
            })
        })
        .map(PodSample::from)
        .collect();
    Ok(w)
}
