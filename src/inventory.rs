//! The cluster snapshot: a fixed set of paged LISTs (fetched concurrently, converted page by page
//! into domain structs) and the grouping of pods under their owning workloads.

use std::collections::{BTreeMap, BTreeSet};

use futures::AsyncBufReadExt;
use k8s_metrics::v1beta1::PodMetrics;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::ListParams;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::consts::EXCLUDE_ANNOTATION;
use crate::convert::list::ListSplitter;
use crate::convert::{self, wire};
use crate::error::ClusterError;
use crate::model::{
    Inventory, Kind, MetricsState, Pdb, PodSample, Unsupported, Workload, WorkloadRef,
};
use crate::quantity::parse_bytes;

const PAGE: u32 = 500;

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

/// LISTs every page of kind `K` (its URL), in every namespace or in each of `scope`, reading each
/// object in its slim wire form `W` and converting it at once.
async fn list<K, W, T>(
    client: &Client,
    scope: &[String],
    f: fn(W) -> T,
) -> Result<Vec<T>, kube::Error>
where
    K: Resource<DynamicType = ()>,
    W: DeserializeOwned,
{
    let urls: Vec<String> = if scope.is_empty() {
        vec![K::url_path(&(), None)]
    } else {
        scope.iter().map(|ns| K::url_path(&(), Some(ns))).collect()
    };
    let mut out = Vec::new();
    for url in urls {
        pages(client, &url, &ListParams::default(), f, &mut out).await?;
    }
    Ok(out)
}

/// Every page (of 500) of one LIST; each object is converted as soon as it has arrived.
async fn pages<W, T>(
    client: &Client,
    url: &str,
    params: &ListParams,
    f: impl Fn(W) -> T,
    out: &mut Vec<T>,
) -> Result<(), kube::Error>
where
    W: DeserializeOwned,
{
    let mut params = params.clone().limit(PAGE);
    loop {
        let request = kube::core::Request::new(url)
            .list(&params)
            .map_err(kube::Error::BuildRequest)?;
        let page = read_list(client, request, |item: W| out.push(f(item))).await?;
        match page.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// One LIST response, split into items as its bytes arrive, so that memory holds one object at a
/// time rather than a page (API errors arrive as `kube::Error::Api`, as with `Api::list`).
async fn read_list<W: DeserializeOwned>(
    client: &Client,
    request: http::Request<Vec<u8>>,
    mut item: impl FnMut(W),
) -> Result<wire::ListMeta, kube::Error> {
    let body = client.request_stream(request).await?;
    let mut body = std::pin::pin!(body);
    let mut splitter = ListSplitter::default();
    loop {
        let chunk = body
            .fill_buf()
            .await
            .map_err(|e| kube::Error::Service(Box::new(e)))?;
        if chunk.is_empty() {
            break;
        }
        let len = chunk.len();
        splitter
            .feed(chunk, &mut item)
            .map_err(kube::Error::SerdeError)?;
        body.consume_unpin(len);
    }
    splitter.finish().map_err(kube::Error::SerdeError)
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

/// PodDisruptionBudgets (policy/v1, served from v1.21: the oldest release bouncer supports).
async fn pdbs(client: &Client, scope: &[String]) -> Result<Vec<Pdb>, kube::Error> {
    let urls: Vec<String> = if scope.is_empty() {
        vec!["/apis/policy/v1/poddisruptionbudgets".to_string()]
    } else {
        scope
            .iter()
            .map(|ns| format!("/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"))
            .collect()
    };
    let mut out = Vec::new();
    for url in urls {
        pages(
            client,
            &url,
            &ListParams::default(),
            <Pdb as From<wire::PodDisruptionBudget>>::from,
            &mut out,
        )
        .await?;
    }
    Ok(out)
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

/// Takes the snapshot. Metrics are optional (their failure is recorded, not fatal); every other
/// read failing fails the snapshot, because a partial inventory could hide a reason to skip.
/// `metrics` is the client for metrics.k8s.io (one that does not retry: see `lib::client`).
pub async fn snapshot(
    client: &Client,
    metrics_client: &Client,
    scope: &[String],
) -> Result<Inventory, ClusterError> {
    let wrap = |what: &'static str| move |source| ClusterError::List { what, source };
    let namespaces = async {
        let all = list::<Namespace, _, _>(client, &[], excluded_namespace)
            .await
            .map_err(wrap("namespaces"))?;
        Ok::<_, ClusterError>(all.into_iter().flatten().collect::<BTreeSet<_>>())
    };
    let metrics = async {
        match list::<PodMetrics, _, _>(metrics_client, scope, metrics_entry).await {
            Ok(m) => (MetricsState::Available, m.into_iter().collect::<Usage>()),
            Err(e) => (MetricsState::Unavailable(metrics_failure(&e)), Usage::new()),
        }
    };
    let (pods, rs, deployments, statefulsets, daemonsets, pdbs, excluded, (metrics, usage)) = futures::join!(
        async {
            list::<Pod, _, _>(client, scope, pod_entry)
                .await
                .map_err(wrap("pods"))
        },
        async {
            list::<ReplicaSet, _, _>(client, scope, rs_owner)
                .await
                .map_err(wrap("replicasets"))
        },
        async {
            list::<Deployment, wire::Deployment, _>(client, scope, Workload::from)
                .await
                .map_err(wrap("deployments"))
        },
        async {
            list::<StatefulSet, wire::StatefulSet, _>(client, scope, Workload::from)
                .await
                .map_err(wrap("statefulsets"))
        },
        async {
            list::<DaemonSet, wire::DaemonSet, _>(client, scope, Workload::from)
                .await
                .map_err(wrap("daemonsets"))
        },
        async {
            pdbs(client, scope)
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

/// One GET of a controller (or a bare pod), converted; its pods are not listed.
pub async fn read_controller(
    client: &Client,
    target: &WorkloadRef,
) -> Result<Workload, kube::Error> {
    let ns = target.namespace.as_str();
    Ok(match target.kind {
        Kind::Deployment => convert::deployment(
            &Api::<Deployment>::namespaced(client.clone(), ns)
                .get(&target.name)
                .await?,
        )?,
        Kind::StatefulSet => convert::statefulset(
            &Api::<StatefulSet>::namespaced(client.clone(), ns)
                .get(&target.name)
                .await?,
        )?,
        Kind::DaemonSet => convert::daemonset(
            &Api::<DaemonSet>::namespaced(client.clone(), ns)
                .get(&target.name)
                .await?,
        )?,
        Kind::Pod => convert::bare_pod(
            &Api::<Pod>::namespaced(client.clone(), ns)
                .get(&target.name)
                .await?,
        )?,
    })
}

/// A fresh read of one workload and its pods, right before acting on it.
pub async fn read_workload(client: &Client, target: &WorkloadRef) -> Result<Workload, kube::Error> {
    let ns = target.namespace.as_str();
    let mut w = read_controller(client, target).await?;
    if target.kind == Kind::Pod {
        return Ok(w);
    }
    let selected = ListParams::default().labels(&w.pod_selector);
    let mut listed: Vec<wire::Pod> = Vec::new();
    pages(
        client,
        &Pod::url_path(&(), Some(ns)),
        &selected,
        |p| p,
        &mut listed,
    )
    .await?;
    let rs_names: BTreeSet<String> = if target.kind == Kind::Deployment {
        let mut rs = Vec::new();
        pages(
            client,
            &ReplicaSet::url_path(&(), Some(ns)),
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
