//! The cluster snapshot: a fixed set of paged LISTs (fetched concurrently, converted object by
//! object as they stream into domain structs) and the grouping of pods under their owning
//! workloads.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::error::ClusterError;
use super::list::{first_page, pages, pages_from};
use super::shared::Shared;
use super::{convert, kinds, wire};
use crate::core::gates;
use crate::core::literals::EXCLUDE_ANNOTATION;
use crate::core::model::{
    Deleting, Inventory, Kind, MetricsState, Pdb, PodSample, Unsupported, Workload, WorkloadRef,
};
use crate::core::quantity::parse_bytes;

/// Pods on their way out (terminating, or finished) say nothing about the workload's current
/// pods: counting them would make a just-restarted workload look old again.
fn gone(p: &wire::Pod) -> bool {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    p.metadata.deletion_timestamp.is_some() || matches!(phase, Some("Succeeded" | "Failed"))
}

/// Working set per namespace -> pod -> (container, bytes), for the PodMetrics whose pod has not
/// been read yet; a pod has a container or two, for which a list is a fraction of a map.
#[derive(Default)]
struct Usage(BTreeMap<String, BTreeMap<String, Containers>>);

/// A pod's containers' working sets, by name.
type Containers = Vec<(Arc<str>, u64)>;

impl Usage {
    fn insert(&mut self, m: wire::PodMetrics, shared: &mut Shared) {
        let mut containers = Vec::with_capacity(m.containers.len());
        containers.extend(m.containers.into_iter().filter_map(|c| {
            let bytes = parse_bytes(&c.usage.memory?.0).ok()?;
            Some((shared.name(&c.name), bytes))
        }));
        let namespace = m.metadata.namespace.unwrap_or_default();
        let name = m.metadata.name.unwrap_or_default();
        self.0
            .entry(namespace)
            .or_default()
            .insert(name, containers);
    }

    fn take(&mut self, namespace: &str, pod: &str) -> Option<Containers> {
        self.0.get_mut(namespace)?.remove(pod)
    }
}

fn with_usage(sample: &mut PodSample, containers: &[(Arc<str>, u64)]) {
    sample.has_metrics = true;
    for c in &mut sample.containers {
        c.usage = containers
            .iter()
            .find(|(name, _)| *name == c.name)
            .map(|(_, bytes)| *bytes);
    }
}

/// (namespace, owner kind, owner name, owner UID): a controller's pods as the LIST names it.
type OwnerKey = (String, String, String, String);

/// The pods, grouped as the LIST streams so that a cluster's worth of them is never staged and
/// the owner is kept once per controller rather than per pod. Their metrics are joined as the
/// pods arrive; those that arrive after their pod wait in `usage` for [`group`].
#[derive(Default)]
struct Pods {
    owned: BTreeMap<OwnerKey, Vec<PodSample>>,
    /// The pods of the owner the LIST is at (it lists by name, so a controller's pods come one
    /// after the other), moved into `owned` sized exactly once its last has arrived: grown one
    /// by one, a ReplicaSet's five pods would sit in room for eight.
    run: Option<(OwnerKey, Vec<PodSample>)>,
    bare: Vec<Workload>,
    /// Pods with owners but no controller among them: not bare (something else holds them),
    /// and no controller bouncer knows would replace them.
    foreign: Vec<Unsupported>,
    usage: Usage,
    shared: Shared,
    /// The label keys kept (the policies' and the PodDisruptionBudgets'); None keeps all.
    keep: Option<BTreeSet<String>>,
}

/// Only the labels whose keys are in `keep`: a pod's other labels (most of them, and at one
/// map per StatefulSet pod most of a large cluster's memory) decide nothing.
fn retain(labels: &mut Option<BTreeMap<String, String>>, keep: &BTreeSet<String>) {
    if let Some(l) = labels
        && l.keys().any(|k| !keep.contains(k))
    {
        *l = std::mem::take(l)
            .into_iter()
            .filter(|(k, _)| keep.contains(k))
            .collect();
    }
}

impl Pods {
    fn pod(&mut self, mut p: wire::Pod) {
        if let Some(keep) = &self.keep {
            retain(&mut p.metadata.labels, keep);
        }
        let mut owners = p.metadata.owner_references.take().unwrap_or_default();
        let controller = owners.iter().position(|o| o.controller == Some(true));
        let namespace = p.metadata.namespace.take().unwrap_or_default();
        let usage = self
            .usage
            .take(&namespace, p.metadata.name.as_deref().unwrap_or_default());
        match controller {
            // A terminating bare pod stays: it is the workload, and the gates must see it.
            Some(_) if gone(&p) => {}
            Some(i) => {
                let owner = owners.swap_remove(i);
                let key = (namespace, owner.kind, owner.name, owner.uid);
                if self.run.as_ref().is_some_and(|(at, _)| *at != key) {
                    self.end_run();
                }
                let mut sample = convert::pod(p, &mut self.shared);
                if let Some(containers) = usage {
                    with_usage(&mut sample, &containers);
                }
                let (_, pods) = self.run.get_or_insert_with(|| (key, Vec::new()));
                pods.push(sample);
            }
            // Any ownerReference, controller or not (a garbage-collection parent, a custom
            // resource's), means the pod is not bare: evicting it under `kinds: [Pod]` would
            // restart what another object holds.
            None if !owners.is_empty() => {
                if !gone(&p) {
                    let owner = owners.swap_remove(0);
                    self.foreign.push(Unsupported {
                        namespace,
                        pod: p.metadata.name.unwrap_or_default(),
                        owner_kind: owner.kind,
                        owner_name: owner.name,
                        labels: p.metadata.labels.unwrap_or_default(),
                    });
                }
            }
            None => {
                p.metadata.namespace = Some(namespace);
                let mut w = convert::bare(p, &mut self.shared);
                if let Some(containers) = usage {
                    w.pods.iter_mut().for_each(|s| with_usage(s, &containers));
                }
                self.bare.push(w);
            }
        }
    }

    /// Files the pods of the owner the LIST was at.
    fn end_run(&mut self) {
        if let Some((key, mut pods)) = self.run.take() {
            let filed = self.owned.entry(key).or_default();
            if filed.is_empty() {
                pods.shrink_to_fit();
                *filed = pods;
            } else {
                // An owner whose pods the LIST's order split (another's name between them).
                filed.append(&mut pods);
                filed.shrink_to_fit();
            }
        }
    }

    fn metrics(&mut self, m: wire::PodMetrics) {
        self.usage.insert(m, &mut self.shared);
    }

    /// The metrics LIST failed, possibly after some of it was joined: no pod has metrics.
    fn forget_metrics(&mut self) {
        self.end_run();
        self.usage = Usage::default();
        let bare = self.bare.iter_mut().flat_map(|w| w.pods.iter_mut());
        for sample in self.owned.values_mut().flatten().chain(bare) {
            sample.has_metrics = false;
            sample.containers.iter_mut().for_each(|c| c.usage = None);
        }
    }
}

fn lock(pods: &Mutex<Pods>) -> std::sync::MutexGuard<'_, Pods> {
    pods.lock().unwrap_or_else(PoisonError::into_inner)
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

/// LISTs every page of one collection (`url(namespace)`), in every namespace or in each of
/// `scope`, reading each object in its slim wire form `W` and handing it to `item` at once.
async fn each<W>(
    client: &Client,
    scope: &[String],
    url: impl Fn(Option<&str>) -> String,
    mut item: impl FnMut(W),
) -> Result<(), kube::Error>
where
    W: DeserializeOwned + wire::Object,
{
    for url in urls(scope, url) {
        pages(client, &url, &ListParams::default(), &mut item).await?;
    }
    Ok(())
}

/// A collection's URL in every namespace, or one per namespace of `scope`.
fn urls(scope: &[String], url: impl Fn(Option<&str>) -> String) -> Vec<String> {
    if scope.is_empty() {
        vec![url(None)]
    } else {
        scope.iter().map(|ns| url(Some(ns))).collect()
    }
}

/// [`each`], each object converted by `f` and kept.
async fn list<W, T>(
    client: &Client,
    scope: &[String],
    url: impl Fn(Option<&str>) -> String,
    mut f: impl FnMut(W) -> T,
) -> Result<Vec<T>, kube::Error>
where
    W: DeserializeOwned + wire::Object,
{
    let mut out = Vec::new();
    each(client, scope, url, |w| out.push(f(w))).await?;
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

/// What the gates read of a namespace: whether it opted out, and whether it is being deleted.
#[derive(Debug, Default)]
pub struct Namespaces {
    pub excluded: BTreeSet<String>,
    pub deleting: BTreeSet<String>,
}

impl Namespaces {
    fn add(&mut self, n: wire::Namespace) {
        let name = n.metadata.name.unwrap_or_default();
        if n.metadata.deletion_timestamp.is_some() {
            self.deleting.insert(name.clone());
        }
        let Some(value) = n
            .metadata
            .annotations
            .and_then(|mut a| a.remove(EXCLUDE_ANNOTATION))
        else {
            return;
        };
        warn_unclear_exclude("namespace", &name, &value);
        if gates::excludes(&value) {
            self.excluded.insert(name);
        }
    }

    /// Marks the workloads of namespaces being deleted (a workload's own deletion wins: it is
    /// the more direct reason).
    pub fn mark_deleting(&self, w: &mut Workload) {
        if w.deleting.is_none() && self.deleting.contains(&w.target.namespace) {
            w.deleting = Some(Deleting::Namespace);
        }
    }
}

/// A `bouncer.dev/exclude` that is neither "true" nor "false" excludes (fail closed); the person
/// who wrote it learns so here, and a workload's skip reason says it again.
fn warn_unclear_exclude(what: &str, name: &str, value: &str) {
    if gates::unclear_exclude(value) {
        tracing::warn!(
            "{what} {name} is annotated {EXCLUDE_ANNOTATION}={value:?}, neither \"true\" nor \"false\": excluded (fail closed)"
        );
    }
}

async fn controllers(
    client: &Client,
    scope: &[String],
    kind: Kind,
    keep: &BTreeSet<String>,
) -> Result<Vec<Workload>, kube::Error> {
    let url = |ns: Option<&str>| kinds::collection(kind, ns);
    // Workloads whose kept template labels are the same share one map.
    let mut shared: BTreeSet<Arc<BTreeMap<String, String>>> = BTreeSet::new();
    list(client, scope, url, |mut c: wire::Controller| {
        if let Some(t) = c.spec.as_mut().and_then(|s| s.template.metadata.as_mut()) {
            retain(&mut t.labels, keep);
        }
        let mut w = convert::controller(kind, c);
        match shared.get(&*w.template_labels) {
            Some(same) => w.template_labels = Arc::clone(same),
            None => {
                shared.insert(Arc::clone(&w.template_labels));
            }
        }
        w
    })
    .await
}

/// Takes the snapshot. Metrics are optional (their failure is recorded, not fatal); every other
/// read failing fails the snapshot, because a partial inventory could hide a reason to skip.
/// `metrics_client` is the one for metrics.k8s.io (it does not retry: see `cluster::connect`).
/// Pods and pod templates keep only the labels in `label_keys` (`policy::label_keys`) and,
/// on pods, those the PodDisruptionBudgets select by.
pub async fn snapshot(
    client: &Client,
    metrics_client: &Client,
    scope: &[String],
    label_keys: &BTreeSet<String>,
) -> Result<Inventory, ClusterError> {
    let wrap = |what: &'static str| move |source| ClusterError::List { what, source };
    let namespaces = async {
        let mut all = Namespaces::default();
        let url = Namespace::url_path(&(), None);
        pages(client, &url, &ListParams::default(), |n| all.add(n))
            .await
            .map_err(wrap("namespaces"))?;
        Ok::<_, ClusterError>(all)
    };
    let pods = Mutex::new(Pods::default());
    let metrics = async {
        let usage = |m| lock(&pods).metrics(m);
        match each(metrics_client, scope, pod_metrics, usage).await {
            Ok(()) => MetricsState::Available,
            Err(e) => MetricsState::Unavailable(metrics_failure(&e)),
        }
    };
    // The budgets' selectors name label keys kept on the pods, so the pods are read only once
    // the budgets are in; the first pods page is requested alongside them all the same, so
    // the small LIST adds no round trip before the largest one.
    let pdbs_then_pods = async {
        let pdb_url = |ns: Option<&str>| PodDisruptionBudget::url_path(&(), ns);
        let pod_urls = urls(scope, |ns| kinds::collection(Kind::Pod, ns));
        let params = ListParams::default();
        let (pdbs, first) = futures::join!(
            list(
                client,
                scope,
                pdb_url,
                <Pdb as From<wire::PodDisruptionBudget>>::from,
            ),
            first_page::<wire::Pod>(client, &pod_urls[0], &params),
        );
        let pdbs = pdbs.map_err(wrap("poddisruptionbudgets"))?;
        let mut keep = label_keys.clone();
        keep.extend(
            pdbs.iter()
                .flat_map(|p| p.selector.keys().map(str::to_string)),
        );
        lock(&pods).keep = Some(keep);
        let mut item = |p| lock(&pods).pod(p);
        let first = first.map_err(wrap("pods"))?;
        pages_from(client, &pod_urls[0], &params, first, &mut item)
            .await
            .map_err(wrap("pods"))?;
        for url in &pod_urls[1..] {
            pages(client, url, &params, &mut item)
                .await
                .map_err(wrap("pods"))?;
        }
        Ok::<_, ClusterError>(pdbs)
    };
    let (pdbs, rs, deployments, statefulsets, daemonsets, namespaces, metrics) = futures::join!(
        pdbs_then_pods,
        async {
            list(client, scope, kinds::replicasets, rs_owner)
                .await
                .map_err(wrap("replicasets"))
        },
        async {
            controllers(client, scope, Kind::Deployment, label_keys)
                .await
                .map_err(wrap("deployments"))
        },
        async {
            controllers(client, scope, Kind::StatefulSet, label_keys)
                .await
                .map_err(wrap("statefulsets"))
        },
        async {
            controllers(client, scope, Kind::DaemonSet, label_keys)
                .await
                .map_err(wrap("daemonsets"))
        },
        namespaces,
        metrics,
    );
    let pdbs = pdbs?;
    let mut pods = pods.into_inner().unwrap_or_else(PoisonError::into_inner);
    if metrics != MetricsState::Available {
        pods.forget_metrics();
    }
    let (mut workloads, statefulsets, daemonsets) = (deployments?, statefulsets?, daemonsets?);
    // Grown from the Deployments' vector, sized once: a second vector of every workload beside
    // the first (a few hundred bytes each) was the snapshot's peak in a large cluster.
    workloads.reserve_exact(statefulsets.len() + daemonsets.len() + pods.bare.len());
    workloads.extend(statefulsets);
    workloads.extend(daemonsets);
    let (mut workloads, unsupported) = group(pods, rs?.into_iter().collect(), workloads);
    let namespaces = namespaces?;
    for w in &mut workloads {
        if let Some(value) = w.annotations.get(EXCLUDE_ANNOTATION) {
            warn_unclear_exclude("workload", &w.target.to_string(), value);
        }
        namespaces.mark_deleting(w);
    }
    Ok(Inventory {
        workloads,
        unsupported,
        excluded_namespaces: namespaces.excluded,
        pdbs,
        metrics,
    })
}

/// Puts each controller's pods under their workload: Pod→ReplicaSet→Deployment, Pod→StatefulSet,
/// Pod→DaemonSet, bare pods on their own; any other owner is reported as unsupported.
fn group(
    mut pods: Pods,
    rs_owners: BTreeMap<(String, String), Option<String>>,
    mut workloads: Vec<Workload>,
) -> (Vec<Workload>, Vec<Unsupported>) {
    pods.end_run();
    let Pods {
        owned,
        mut bare,
        foreign,
        mut usage,
        ..
    } = pods;
    // Sorted, the controllers are found by binary search: no index of their names beside them.
    // In place (targets are unique): a stable sort's scratch is half the vector again.
    workloads.sort_unstable_by(|a, b| a.target.cmp(&b.target));
    let mut unsupported = foreign;
    for ((namespace, owner_kind, owner, owner_uid), mut samples) in owned {
        for sample in &mut samples {
            if let Some(containers) = usage.take(&namespace, &sample.name) {
                with_usage(sample, &containers);
            }
        }
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
            let want = (kind, namespace.as_str(), name.as_str());
            workloads
                .binary_search_by(|w| {
                    let t = &w.target;
                    (t.kind, t.namespace.as_str(), t.name.as_str()).cmp(&want)
                })
                .ok()
        });
        match slot {
            Some(i) => {
                if owner_kind == "ReplicaSet" {
                    workloads[i].pod_owners.push(owner_uid);
                }
                let pods = &mut workloads[i].pods;
                if pods.is_empty() {
                    *pods = samples;
                } else {
                    // A Deployment mid-rollout: its ReplicaSets' pods in the LIST's order again.
                    pods.append(&mut samples);
                    pods.sort_by(|a, b| a.name.cmp(&b.name));
                }
            }
            None => unsupported.extend(samples.into_iter().map(|s| Unsupported {
                namespace: namespace.clone(),
                pod: s.name,
                owner_kind: owner_kind.clone(),
                owner_name: owner.clone(),
                labels: Arc::unwrap_or_clone(s.labels),
            })),
        }
    }
    for w in &mut bare {
        for sample in &mut w.pods {
            if let Some(containers) = usage.take(&w.target.namespace, &sample.name) {
                with_usage(sample, &containers);
            }
        }
    }
    unsupported.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    workloads.extend(bare);
    workloads.sort_unstable_by(|a, b| a.target.cmp(&b.target));
    (workloads, unsupported)
}

/// What the gates read besides a workload, afresh before each bounce: whether its namespace
/// opted out or is being deleted, and the namespace's disruption budgets.
pub async fn read_context(
    client: &Client,
    namespace: &str,
) -> Result<(Namespaces, Vec<Pdb>), kube::Error> {
    let scope = [namespace.to_string()];
    // A LIST by name: the chart grants list on namespaces, not get.
    let excluded = async {
        let url = Namespace::url_path(&(), None);
        let by_name = ListParams::default().fields(&format!("metadata.name={namespace}"));
        let mut read = Namespaces::default();
        pages(client, &url, &by_name, |n| read.add(n)).await?;
        Ok::<_, kube::Error>(read)
    };
    let pdbs = list(
        client,
        &scope,
        |ns| PodDisruptionBudget::url_path(&(), ns),
        <Pdb as From<wire::PodDisruptionBudget>>::from,
    );
    let (excluded, pdbs) = futures::join!(excluded, pdbs);
    Ok((excluded?, pdbs?))
}

/// A fresh read of one workload and its pods, right before acting on it.
pub async fn read_workload(client: &Client, target: &WorkloadRef) -> Result<Workload, kube::Error> {
    let ns = target.namespace.as_str();
    let mut w = kinds::get(client, target).await?;
    if target.kind == Kind::Pod {
        return Ok(w);
    }
    let selected = ListParams::default().labels(&w.pod_selector);
    let mut listed: Vec<wire::Pod> = Vec::new();
    let url = kinds::collection(Kind::Pod, Some(ns));
    pages(client, &url, &selected, |p| listed.push(p)).await?;
    if target.kind == Kind::Deployment {
        let url = kinds::replicasets(Some(ns));
        let owners = &mut w.pod_owners;
        pages(client, &url, &selected, |r: wire::ReplicaSet| {
            let uid = r.metadata.uid.clone().unwrap_or_default();
            if rs_owner(r).1.as_deref() == Some(target.name.as_str()) {
                owners.push(uid);
            }
        })
        .await?;
    }
    // By UID: a pod that only carries the names of the workload's controllers (one deleted and
    // created again, or a forged reference) is not its pod.
    let owners = &w.pod_owners;
    let mine = listed.into_iter().filter(|p| !gone(p)).filter(|p| {
        p.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && !o.uid.is_empty() && owners.contains(&o.uid))
    });
    let mut shared = Shared::default();
    w.pods.extend(mine.map(|p| convert::pod(p, &mut shared)));
    Ok(w)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A pod of `owner` (kind, name), or a bare pod where the kind is empty.
    fn pod(name: &str, owner: (&str, &str), labels: serde_json::Value) -> wire::Pod {
        let owners = match owner {
            ("", _) => json!([]),
            (kind, owner) => {
                json!([{"kind": kind, "name": owner, "uid": format!("uid-{owner}"), "controller": true}])
            }
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "uid": format!("u-{name}"), "labels": labels,
                         "ownerReferences": owners},
            "spec": {"containers": [{"name": "app", "resources": {"limits": {"memory": "1Gi"}}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap()
    }

    /// Pods that keep only the labels `keys`, as the snapshot sets them up.
    fn keeping(keys: &[&str]) -> Pods {
        Pods {
            keep: Some(keys.iter().map(|k| k.to_string()).collect()),
            ..Pods::default()
        }
    }

    fn metrics(name: &str, mib: u64) -> wire::PodMetrics {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop"},
            "containers": [{"name": "app", "usage": {"memory": format!("{mib}Mi")}}]
        }))
        .unwrap()
    }

    fn workload(kind: Kind, name: &str) -> Workload {
        let mut w = convert::bare(pod(name, ("", ""), json!({})), &mut Default::default());
        w.target = WorkloadRef {
            kind,
            namespace: "shop".into(),
            name: name.into(),
        };
        w.pods.clear();
        w
    }

    /// Pods stream in whatever order the LISTs interleave: metrics before or after their pod,
    /// a Deployment's ReplicaSets interleaved, an owner bouncer does not restart.
    #[test]
    fn pods_group_and_join_their_metrics_as_they_stream() {
        let web = json!({"app": "web", "pod-template-hash": "1"});
        let mut pods = Pods::default();
        pods.metrics(metrics("web-1-a", 10));
        pods.pod(pod("web-1-a", ("ReplicaSet", "web-1"), web.clone()));
        pods.pod(pod(
            "web-2-b",
            ("ReplicaSet", "web-2"),
            json!({"app": "web"}),
        ));
        pods.pod(pod("web-1-c", ("ReplicaSet", "web-1"), web));
        pods.pod(pod(
            "db-0",
            ("StatefulSet", "db"),
            json!({"app": "db", "pod-name": "db-0"}),
        ));
        pods.pod(pod(
            "db-1",
            ("StatefulSet", "db"),
            json!({"app": "db", "pod-name": "db-1"}),
        ));
        pods.pod(pod("job-x", ("Job", "job"), json!({"app": "job"})));
        pods.metrics(metrics("web-1-c", 20));
        pods.metrics(metrics("db-1", 30));

        let owners = BTreeMap::from([
            (("shop".into(), "web-1".into()), Some("web".into())),
            (("shop".into(), "web-2".into()), Some("web".into())),
        ]);
        let controllers = vec![
            workload(Kind::Deployment, "web"),
            workload(Kind::StatefulSet, "db"),
        ];
        let (workloads, unsupported) = group(pods, owners, controllers);
        let web = &workloads[0];
        assert_eq!(
            web.pod_owners,
            ["uid-web-1", "uid-web-2"],
            "its ReplicaSets"
        );
        let names: Vec<_> = web.pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["web-1-a", "web-1-c", "web-2-b"], "the LIST's order");
        let usage: Vec<_> = web.pods.iter().map(|p| p.containers[0].usage).collect();
        assert_eq!(usage, [Some(10 << 20), Some(20 << 20), None]);
        assert!(web.pods[0].has_metrics && !web.pods[2].has_metrics);
        assert!(
            Arc::ptr_eq(&web.pods[0].labels, &web.pods[1].labels),
            "one ReplicaSet's pods share their labels"
        );
        let db = &workloads[1];
        assert_eq!(db.target.kind, Kind::StatefulSet);
        assert_eq!(db.pods[1].labels["pod-name"], "db-1");
        assert_eq!(db.pods[1].containers[0].usage, Some(30 << 20));
        assert_eq!(unsupported.len(), 1);
        assert_eq!(
            (
                unsupported[0].pod.as_str(),
                unsupported[0].labels["app"].as_str()
            ),
            ("job-x", "job")
        );
    }

    /// Pods keep only the labels a policy or a budget reads: a StatefulSet's pods then share
    /// one label map too, since only the labels that name each pod differed.
    #[test]
    fn pods_keep_only_the_labels_that_decide_something() {
        let mut pods = keeping(&["app", "tier"]);
        for (name, index) in [("db-0", "0"), ("db-1", "1")] {
            let labels = json!({"app": "db", "tier": "data", "pod-name": name,
                                "apps.kubernetes.io/pod-index": index});
            pods.pod(pod(name, ("StatefulSet", "db"), labels));
        }
        let (workloads, _) = group(
            pods,
            BTreeMap::new(),
            vec![workload(Kind::StatefulSet, "db")],
        );
        let db = &workloads[0];
        let want = BTreeMap::from([
            ("app".to_string(), "db".to_string()),
            ("tier".to_string(), "data".to_string()),
        ]);
        assert_eq!(*db.pods[0].labels, want);
        assert!(Arc::ptr_eq(&db.pods[0].labels, &db.pods[1].labels));
        assert_eq!(
            db.pods.capacity(),
            2,
            "an owner's pods are filed sized exactly"
        );
    }

    /// Equal label maps and container names are one allocation across workloads too: the same
    /// app's pods in every namespace, every pod's `app` container.
    #[test]
    fn pods_of_different_workloads_share_equal_labels_and_container_names() {
        let mut pods = keeping(&["app"]);
        for (name, owner) in [("a-0", "a"), ("b-0", "b"), ("c-0", "c")] {
            let app = if owner == "c" { "other" } else { "web" };
            let labels = json!({"app": app, "pod-template-hash": owner});
            pods.pod(pod(name, ("StatefulSet", owner), labels));
        }
        let controllers = ["a", "b", "c"].map(|n| workload(Kind::StatefulSet, n));
        let (workloads, _) = group(pods, BTreeMap::new(), controllers.into());
        let [a, b, c] = [0, 1, 2].map(|i| &workloads[i].pods[0]);
        assert!(Arc::ptr_eq(&a.labels, &b.labels));
        assert!(!Arc::ptr_eq(&a.labels, &c.labels));
        assert_eq!(c.labels["app"], "other");
        assert!(Arc::ptr_eq(&a.containers[0].name, &c.containers[0].name));
        assert_eq!(&*a.containers[0].name, "app");
    }

    /// Bare pods that carry the same labels (once only those that decide something are kept)
    /// share one map, as a ReplicaSet's pods do; a bare pod with other labels has its own.
    #[test]
    fn bare_pods_with_the_same_labels_share_one_map() {
        let mut pods = keeping(&["app"]);
        for (name, app) in [("mcp-0", "mcp"), ("mcp-1", "mcp"), ("web-0", "web")] {
            pods.pod(pod(name, ("", ""), json!({"app": app, "pod-name": name})));
        }
        let (workloads, _) = group(pods, BTreeMap::new(), Vec::new());
        let labels: Vec<_> = workloads.iter().map(|w| &w.pods[0].labels).collect();
        assert_eq!(labels[0]["app"], "mcp");
        assert_eq!(labels[0].len(), 1);
        assert!(Arc::ptr_eq(labels[0], labels[1]));
        assert!(Arc::ptr_eq(labels[1], &workloads[1].template_labels));
        assert!(!Arc::ptr_eq(labels[1], labels[2]));
        assert_eq!(labels[2]["app"], "web");
    }

    /// Any ownerReference makes a pod owned: one whose owners include no controller (a
    /// garbage-collection parent, a ReplicaSet that let it go) is neither a controller's replica
    /// nor a bare pod that `kinds: [Pod]` may evict, but an unsupported owner.
    #[test]
    fn pods_with_owners_but_no_controller_are_not_bare() {
        let mut pods = Pods::default();
        for (name, kind, controller) in [
            ("held", "ConfigMap", json!(null)),
            ("released", "ReplicaSet", json!(false)),
        ] {
            let mut p = pod(name, ("", ""), json!({"app": "x"}));
            p.metadata.owner_references = Some(
                serde_json::from_value(json!([{"apiVersion": "v1", "kind": kind,
                    "name": "parent", "uid": "uid-parent", "controller": controller}]))
                .unwrap(),
            );
            pods.pod(p);
        }
        pods.pod(pod("loner", ("", ""), json!({"app": "x"})));
        let (workloads, unsupported) = group(pods, BTreeMap::new(), Vec::new());
        let bare: Vec<_> = workloads.iter().map(|w| w.target.name.as_str()).collect();
        assert_eq!(bare, ["loner"]);
        let owned: Vec<_> = unsupported
            .iter()
            .map(|u| {
                (
                    u.pod.as_str(),
                    u.owner_kind.as_str(),
                    u.labels["app"].as_str(),
                )
            })
            .collect();
        assert_eq!(
            owned,
            [("held", "ConfigMap", "x"), ("released", "ReplicaSet", "x")]
        );
    }

    /// A metrics LIST that fails part way leaves no pod with metrics.
    #[test]
    fn a_failed_metrics_list_joins_nothing() {
        let mut pods = Pods::default();
        pods.metrics(metrics("job", 10));
        pods.pod(pod("job", ("", ""), json!({})));
        pods.metrics(metrics("web-1-a", 10));
        pods.pod(pod("web-1-a", ("ReplicaSet", "web-1"), json!({})));
        pods.forget_metrics();
        let (workloads, unsupported) = group(pods, BTreeMap::new(), Vec::new());
        let bare = &workloads[0].pods[0];
        assert!(!bare.has_metrics && bare.containers[0].usage.is_none());
        assert_eq!(unsupported.len(), 1, "web-1 is not a known ReplicaSet");
    }
}
