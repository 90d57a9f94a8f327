//! The cluster snapshot: a fixed set of paged LISTs (fetched concurrently, converted page by page
//! into domain structs) and the grouping of pods under their owning workloads.

use std::collections::{BTreeMap, BTreeSet};

use k8s_metrics::v1beta1::PodMetrics;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::consts::EXCLUDE_ANNOTATION;
use crate::convert;
use crate::error::ClusterError;
use crate::model::{Inventory, Kind, MetricsState, Pdb, PodSample, Unsupported, Workload, WorkloadRef};
use crate::quantity::parse_bytes;

const PAGE: u32 = 500;

/// A pod as the snapshot keeps it: under its controller, or a bare pod (its own workload).
enum PodEntry {
    Owned { owner_kind: String, owner: String, namespace: String, sample: PodSample },
    Bare(Box<Workload>),
}

/// Pods on their way out (terminating, or finished) say nothing about the workload's current
/// pods: counting them would make a just-restarted workload look old again.
fn gone(p: &Pod) -> bool {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    p.metadata.deletion_timestamp.is_some() || matches!(phase, Some("Succeeded" | "Failed"))
}

fn pod_entry(p: Pod) -> Option<PodEntry> {
    let controller = p.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
    match controller {
        // A terminating bare pod stays: it is the workload, and the gates must see it.
        _ if gone(&p) && controller.is_some() => None,
        Some(o) => Some(PodEntry::Owned {
            owner_kind: o.kind.clone(),
            owner: o.name.clone(),
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            sample: convert::pod_sample(&p),
        }),
        None => Some(PodEntry::Bare(Box::new(convert::bare_pod(&p)))),
    }
}

/// (namespace, replicaset) -> the Deployment that controls it, if any.
fn rs_owner(rs: ReplicaSet) -> ((String, String), Option<String>) {
    let owner = rs
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Deployment")
        .map(|o| o.name.clone());
    ((rs.metadata.namespace.unwrap_or_default(), rs.metadata.name.unwrap_or_default()), owner)
}

/// Working set per (namespace, pod) -> container -> bytes.
type Usage = BTreeMap<(String, String), BTreeMap<String, u64>>;

fn metrics_entry(m: PodMetrics) -> ((String, String), BTreeMap<String, u64>) {
    let containers = m
        .containers
        .iter()
        .filter_map(|c| Some((c.name.clone(), parse_bytes(&c.usage.memory.0).ok()?)))
        .collect();
    ((m.metadata.namespace.unwrap_or_default(), m.metadata.name.unwrap_or_default()), containers)
}

/// LISTs every page of one kind, in every namespace or in each of `scope`, converting as it goes.
async fn list<K, T>(client: &Client, scope: &[String], f: fn(K) -> T) -> Result<Vec<T>, kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let apis: Vec<Api<K>> = if scope.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        scope.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect()
    };
    let mut out = Vec::new();
    for api in apis {
        pages(&api, f, &mut out).await?;
    }
    Ok(out)
}

async fn pages<K, T>(api: &Api<K>, f: fn(K) -> T, out: &mut Vec<T>) -> Result<(), kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        out.extend(page.items.into_iter().map(f));
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// PodDisruptionBudgets from policy/v1, or policy/v1beta1 on servers before v1.21.
async fn pdbs(client: &Client, scope: &[String]) -> Result<Vec<Pdb>, kube::Error> {
    for version in ["v1", "v1beta1"] {
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("policy", version, "PodDisruptionBudget"));
        let apis: Vec<Api<DynamicObject>> = if scope.is_empty() {
            vec![Api::all_with(client.clone(), &ar)]
        } else {
            scope.iter().map(|ns| Api::namespaced_with(client.clone(), ns, &ar)).collect()
        };
        let mut out = Vec::new();
        let mut served = true;
        for api in apis {
            match api.list(&ListParams::default()).await {
                Ok(list) => out.extend(list.items.into_iter().map(pdb)),
                Err(e) if is_not_found(&e) => {
                    served = false;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if served {
            return Ok(out);
        }
    }
    Ok(Vec::new())
}

fn pdb(o: DynamicObject) -> Pdb {
    let selector = o
        .data
        .pointer("/spec/selector")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .map(|s| convert::selector(&s))
        .unwrap_or_default();
    Pdb {
        namespace: o.metadata.namespace.unwrap_or_default(),
        name: o.metadata.name.unwrap_or_default(),
        selector,
        disruptions_allowed: o.data.pointer("/status/disruptionsAllowed").and_then(|v| v.as_i64()).unwrap_or(0) as i32,
    }
}

fn excluded_namespace(n: Namespace) -> Option<String> {
    let excluded = n.metadata.annotations.as_ref().and_then(|a| a.get(EXCLUDE_ANNOTATION)).is_some_and(|v| v == "true");
    excluded.then(|| n.metadata.name.unwrap_or_default())
}

/// Takes the snapshot. Metrics are optional (their failure is recorded, not fatal); every other
/// read failing fails the snapshot, because a partial inventory could hide a reason to skip.
pub async fn snapshot(client: &Client, scope: &[String]) -> Result<Inventory, ClusterError> {
    let wrap = |what: &'static str| move |source| ClusterError::List { what, source };
    let namespaces = async {
        let all = list_cluster::<Namespace, _>(client, excluded_namespace).await.map_err(wrap("namespaces"))?;
        Ok::<_, ClusterError>(all.into_iter().flatten().collect::<BTreeSet<_>>())
    };
    let metrics = async {
        match list::<PodMetrics, _>(client, scope, metrics_entry).await {
            Ok(m) => (MetricsState::Available, m.into_iter().collect::<Usage>()),
            Err(e) if is_not_found(&e) => (MetricsState::Unavailable("metrics.k8s.io is not served".into()), Usage::new()),
            Err(e) => (MetricsState::Unavailable(format!("listing pod metrics failed: {e}")), Usage::new()),
        }
    };
    let (pods, rs, deployments, statefulsets, daemonsets, pdbs, excluded, (metrics, usage)) = futures::join!(
        async { list::<Pod, _>(client, scope, pod_entry).await.map_err(wrap("pods")) },
        async { list::<ReplicaSet, _>(client, scope, rs_owner).await.map_err(wrap("replicasets")) },
        async { list::<Deployment, _>(client, scope, |d| convert::deployment(&d)).await.map_err(wrap("deployments")) },
        async { list::<StatefulSet, _>(client, scope, |s| convert::statefulset(&s)).await.map_err(wrap("statefulsets")) },
        async { list::<DaemonSet, _>(client, scope, |d| convert::daemonset(&d)).await.map_err(wrap("daemonsets")) },
        async { pdbs(client, scope).await.map_err(wrap("poddisruptionbudgets")) },
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

async fn list_cluster<K, T>(client: &Client, f: fn(K) -> T) -> Result<Vec<T>, kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    pages(&Api::<K>::all(client.clone()), f, &mut out).await?;
    Ok(out)
}

fn with_usage(mut sample: PodSample, namespace: &str, usage: &Usage) -> PodSample {
    if let Some(containers) = usage.get(&(namespace.to_string(), sample.name.clone())) {
        sample.has_metrics = true;
        for c in &mut sample.containers {
            c.usage = containers.get(&c.name).copied();
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
    let index: BTreeMap<WorkloadRef, usize> = workloads.iter().enumerate().map(|(i, w)| (w.target.clone(), i)).collect();
    let mut unsupported = Vec::new();
    let mut bare = Vec::new();
    for entry in pods.into_iter().flatten() {
        match entry {
            PodEntry::Bare(mut w) => {
                let ns = w.target.namespace.clone();
                w.pods = w.pods.into_iter().map(|p| with_usage(p, &ns, usage)).collect();
                bare.push(*w);
            }
            PodEntry::Owned { owner_kind, owner, namespace, sample } => {
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
                    index.get(&WorkloadRef { kind, namespace: namespace.clone(), name }).copied()
                });
                match slot {
                    Some(i) => workloads[i].pods.push(with_usage(sample, &namespace, usage)),
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
    let mut w = match target.kind {
        Kind::Deployment => convert::deployment(&Api::<Deployment>::namespaced(client.clone(), ns).get(&target.name).await?),
        Kind::StatefulSet => {
            convert::statefulset(&Api::<StatefulSet>::namespaced(client.clone(), ns).get(&target.name).await?)
        }
        Kind::DaemonSet => convert::daemonset(&Api::<DaemonSet>::namespaced(client.clone(), ns).get(&target.name).await?),
        Kind::Pod => return Ok(convert::bare_pod(&Api::<Pod>::namespaced(client.clone(), ns).get(&target.name).await?)),
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let listed = pods.list(&ListParams::default().labels(&w.pod_selector)).await?;
    let rs_names: BTreeSet<String> = if target.kind == Kind::Deployment {
        let rs: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
        rs.list(&ListParams::default().labels(&w.pod_selector))
            .await?
            .items
            .into_iter()
            .map(rs_owner)
            .filter(|(_, owner)| owner.as_deref() == Some(target.name.as_str()))
            .map(|((_, name), _)| name)
            .collect()
    } else {
        BTreeSet::new()
    };
    w.pods = listed
        .items
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
        .map(convert::pod_sample)
        .collect();
    Ok(w)
}
