//! metrics.k8s.io emulation: the PodMetrics CRD, a per-pod memory model driven by annotations,
//! and the emulator task that keeps PodMetrics in step with running pods.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::time::MissedTickBehavior;

use crate::{
    BackgroundTask, MEMORY_BASE, MEMORY_CONTAINER, MEMORY_LEAK_PER_MINUTE, count, is_conflict,
    is_not_found,
};

const CRD_NAME: &str = "pods.metrics.k8s.io";
const FIELD_MANAGER: &str = "bouncer-metrics-emulator";
const DEFAULT_BASE: u64 = 16 << 20;
/// What containers other than the modelled one report, small enough never to trigger anything.
const OTHER_CONTAINER: u64 = 4 << 20;

/// The PodMetrics resource as the CRD serves it (same URL as metrics-server's aggregated API).
pub fn pod_metrics_resource() -> ApiResource {
    ApiResource {
        group: "metrics.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "metrics.k8s.io/v1beta1".into(),
        kind: "PodMetrics".into(),
        plural: "pods".into(),
    }
}

/// Installs the PodMetrics CRD (idempotent) and returns once `/apis/metrics.k8s.io/v1beta1/pods`
/// answers a list, so a caller can read metrics right away.
pub async fn install_metrics_crd(client: &Client) -> Result<()> {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            // Required for CRDs in *.k8s.io groups; "unapproved" is the documented opt-out.
            "annotations": {"api-approved.kubernetes.io": "unapproved, testing only"},
        },
        "spec": {
            "group": "metrics.k8s.io",
            "scope": "Namespaced",
            "names": {"plural": "pods", "singular": "podmetrics", "kind": "PodMetrics", "listKind": "PodMetricsList"},
            "versions": [{
                "name": "v1beta1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    }))?;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(e) if is_conflict(&e) => {}
        Err(e) => return Err(e).context("creating the PodMetrics CRD"),
    }
    tokio::time::timeout(
        Duration::from_secs(60),
        await_condition(crds, CRD_NAME, conditions::is_crd_established()),
    )
    .await
    .context("PodMetrics CRD not established within 60s")??;
    // Established comes slightly before the handler serves the URL; discovery has no watch.
    let metrics = Api::<DynamicObject>::all_with(client.clone(), &pod_metrics_resource());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match metrics.list(&ListParams::default().limit(1)).await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(e).context("listing /apis/metrics.k8s.io/v1beta1/pods");
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Parses a Kubernetes quantity (`128Mi`, `1.5Gi`, `500M`, `100m`, `1e3`) to a whole number,
/// rounding down: memory is counted in bytes.
pub fn parse_quantity(q: &str) -> Result<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let (mul, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1_000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: u32 = s[1..]
                .parse()
                .map_err(|_| anyhow!("bad exponent in quantity {q:?}"))?;
            (
                10u128
                    .checked_pow(exp)
                    .ok_or_else(|| anyhow!("quantity {q:?} too large"))?,
                1,
            )
        }
        _ => bail!("unknown suffix {suffix:?} in quantity {q:?}"),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() {
        bail!("no number in quantity {q:?}");
    }
    let digits: u128 = format!("{int}{frac}")
        .parse()
        .map_err(|_| anyhow!("bad number in quantity {q:?}"))?;
    let scale = 10u128.pow(u32::try_from(frac.len())?);
    u64::try_from(digits * mul / (scale * div)).map_err(|_| anyhow!("quantity {q:?} too large"))
}

/// The modelled memory of each container of a pod at `now`, or `None` when the pod gets no
/// metrics (not Running, no start time yet). Errors name a bad annotation.
///
/// The modelled container uses `base + leak_per_minute * age`, to the byte, with the age in
/// whole seconds (the resolution of `status.startTime` and of the written timestamp), so the
/// value can be recomputed exactly from what the PodMetrics object shows.
pub fn model_usage(pod: &Pod, now: Timestamp) -> Result<Option<Vec<(String, u64)>>> {
    let Some(status) = &pod.status else {
        return Ok(None);
    };
    if status.phase.as_deref() != Some("Running") {
        return Ok(None);
    }
    let Some(start) = &status.start_time else {
        return Ok(None);
    };
    let annotations = pod.annotations();
    let quantity = |key: &str, default: u64| match annotations.get(key) {
        Some(v) => parse_quantity(v).with_context(|| format!("annotation {key}")),
        None => Ok(default),
    };
    let base = quantity(MEMORY_BASE, DEFAULT_BASE)?;
    let leak = quantity(MEMORY_LEAK_PER_MINUTE, 0)?;
    let names: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| c.name.as_str())
        .collect();
    let carrier = match annotations.get(MEMORY_CONTAINER) {
        Some(c) if names.contains(&c.as_str()) => c.as_str(),
        Some(c) => bail!("annotation {MEMORY_CONTAINER} names {c:?}, not a container of the pod"),
        None => names.first().copied().unwrap_or_default(),
    };
    let age = u128::try_from((now.as_second() - start.0.as_second()).max(0))?;
    let modelled = u64::try_from(u128::from(base) + u128::from(leak) * age / 60)?;
    let usage = names
        .iter()
        .map(|n| {
            (
                n.to_string(),
                if *n == carrier {
                    modelled
                } else {
                    OTHER_CONTAINER
                },
            )
        })
        .collect();
    Ok(Some(usage))
}

/// Memory of a pod as its PodMetrics object reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMemory {
    /// Sum of the containers' `usage.memory`.
    pub bytes: u64,
    pub timestamp: Timestamp,
    pub containers: Vec<(String, u64)>,
}

fn read_pod_memory(obj: &DynamicObject) -> Result<PodMemory> {
    let timestamp = obj.data["timestamp"]
        .as_str()
        .context("PodMetrics without timestamp")?
        .parse()?;
    let mut containers = Vec::new();
    for c in obj.data["containers"]
        .as_array()
        .context("PodMetrics without containers")?
    {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        let memory = parse_quantity(
            c["usage"]["memory"]
                .as_str()
                .context("container without usage.memory")?,
        )?;
        containers.push((name, memory));
    }
    Ok(PodMemory {
        bytes: containers.iter().map(|(_, m)| m).sum(),
        timestamp,
        containers,
    })
}

/// The pod's current PodMetrics, or `None` when there are none.
pub async fn pod_memory(client: &Client, ns: &str, pod: &str) -> Result<Option<PodMemory>> {
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &pod_metrics_resource());
    match api.get_opt(pod).await? {
        Some(obj) => Ok(Some(read_pod_memory(&obj)?)),
        None => Ok(None),
    }
}

/// Watches the pod's PodMetrics until `cond` holds (`None` = no metrics object) and returns
/// the state that satisfied it.
pub async fn wait_pod_memory(
    client: &Client,
    ns: &str,
    pod: &str,
    timeout: Duration,
    mut cond: impl FnMut(Option<&PodMemory>) -> bool,
) -> Result<Option<PodMemory>> {
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &pod_metrics_resource());
    let mut last = None;
    let wait = async {
        let mut stream = std::pin::pin!(watcher::watch_object(api, pod));
        while let Some(obj) = stream.next().await {
            let memory = obj?.as_ref().map(read_pod_memory).transpose()?;
            if cond(memory.as_ref()) {
                return Ok(memory);
            }
            last = memory;
        }
        bail!("PodMetrics watch ended")
    };
    match tokio::time::timeout(timeout, wait).await {
        Ok(r) => r,
        Err(_) => {
            bail!("PodMetrics {ns}/{pod}: condition not met within {timeout:?}; last seen {last:?}")
        }
    }
}

/// Writes PodMetrics for the running pods of one namespace (or all) about every `interval`
/// and deletes those of pods that are gone or no longer Running.
#[derive(Clone)]
pub struct MetricsEmulator {
    client: Client,
    namespace: Option<String>,
    interval: Duration,
}

impl MetricsEmulator {
    /// An emulator for every namespace, refreshing every second.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            namespace: None,
            interval: Duration::from_secs(1),
        }
    }

    /// Limits the emulator to one namespace, so parallel tests never touch each other's metrics.
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = Some(ns.into());
        self
    }

    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Installs the CRD, then runs the emulator as a task; the first PodMetrics appear within
    /// about one interval of a pod becoming Running. `actions()` counts PodMetrics writes.
    pub async fn spawn(self) -> Result<BackgroundTask> {
        install_metrics_crd(&self.client).await?;
        let actions = Arc::new(AtomicUsize::new(0));
        let counter = actions.clone();
        Ok(BackgroundTask::spawn(actions, async move {
            if let Err(e) = self.sync_forever(&counter).await {
                tracing::error!("metrics emulator stopped: {e:#}");
            }
        }))
    }

    /// Installs the CRD and runs in the foreground until the pod watch fails for good.
    pub async fn run(self) -> Result<()> {
        install_metrics_crd(&self.client).await?;
        self.sync_forever(&AtomicUsize::new(0)).await
    }

    fn pods_api(&self) -> Api<Pod> {
        match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    fn metrics_api(&self, ns: Option<&str>) -> Api<DynamicObject> {
        let ar = pod_metrics_resource();
        match ns.or(self.namespace.as_deref()) {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }

    async fn sync_forever(&self, actions: &AtomicUsize) -> Result<()> {
        let (store, writer) = reflector::store::<Pod>();
        let pods = reflector(writer, watcher(self.pods_api(), watcher::Config::default()))
            .default_backoff()
            .touched_objects();
        let mut pods = std::pin::pin!(pods);
        // Leftovers from an earlier run count as written so they are cleaned up too.
        let mut written: HashSet<(String, String)> = self
            .metrics_api(None)
            .list(&ListParams::default())
            .await
            .context("listing existing PodMetrics")?
            .items
            .iter()
            .map(|m| (m.namespace().unwrap_or_default(), m.name_any()))
            .collect();
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                event = pods.next() => match event {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => tracing::warn!("metrics emulator: pod watch: {e}"),
                    None => bail!("pod watch ended"),
                },
                _ = tick.tick() => {
                    // Never await readiness here: the store only fills while `pods` is polled.
                    let ready = tokio::time::timeout(Duration::ZERO, store.wait_until_ready()).await;
                    if matches!(ready, Ok(Ok(()))) {
                        self.sync_once(&store.state(), &mut written, actions).await;
                    }
                }
            }
        }
    }

    async fn sync_once(
        &self,
        pods: &[Arc<Pod>],
        written: &mut HashSet<(String, String)>,
        actions: &AtomicUsize,
    ) {
        let now =
            Timestamp::from_second(Timestamp::now().as_second()).expect("now is a valid timestamp");
        let mut live = HashSet::new();
        for pod in pods {
            let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
            let usage = match model_usage(pod, now) {
                Ok(Some(usage)) => usage,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!("metrics emulator: pod {ns}/{name}: {e:#}");
                    continue;
                }
            };
            let containers: Vec<Value> = usage
                .iter()
                .map(|(c, bytes)| json!({"name": c, "usage": {"cpu": "1m", "memory": bytes.to_string()}}))
                .collect();
            // metrics-server copies the pod's labels, which makes `kubectl top pod -l` work.
            let body = json!({
                "apiVersion": "metrics.k8s.io/v1beta1",
                "kind": "PodMetrics",
                "metadata": {"name": name, "namespace": ns, "labels": pod.labels()},
                "timestamp": now.to_string(),
                "window": "30s",
                "containers": containers,
            });
            let params = PatchParams::apply(FIELD_MANAGER).force();
            match self
                .metrics_api(Some(&ns))
                .patch(&name, &params, &Patch::Apply(&body))
                .await
            {
                Ok(_) => count(actions),
                // A namespace being deleted refuses writes; its pods are about to go anyway.
                Err(e) => tracing::debug!("metrics emulator: writing PodMetrics {ns}/{name}: {e}"),
            }
            live.insert((ns, name));
        }
        let stale: Vec<_> = written.difference(&live).cloned().collect();
        for (ns, name) in stale {
            match self
                .metrics_api(Some(&ns))
                .delete(&name, &DeleteParams::default())
                .await
            {
                Ok(_) => {
                    count(actions);
                    written.remove(&(ns, name));
                }
                Err(e) if is_not_found(&e) => {
                    written.remove(&(ns, name));
                }
                Err(e) => tracing::debug!("metrics emulator: deleting PodMetrics {ns}/{name}: {e}"),
            }
        }
        written.extend(live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("16Mi").unwrap(), 16 << 20);
        assert_eq!(parse_quantity("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_quantity("500M").unwrap(), 500_000_000);
        assert_eq!(parse_quantity("1500m").unwrap(), 1);
        assert_eq!(parse_quantity("1e3").unwrap(), 1000);
        assert_eq!(parse_quantity("123").unwrap(), 123);
        assert!(parse_quantity("12Zi").is_err());
        assert!(parse_quantity("Mi").is_err());
    }

    fn pod(annotations: &[(&str, &str)], start: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": annotations.iter().cloned().collect::<std::collections::BTreeMap<_, _>>()},
            "spec": {"containers": [{"name": "app"}, {"name": "sidecar"}]},
            "status": {"phase": phase, "startTime": start},
        }))
        .unwrap()
    }

    #[test]
    fn leak_grows_with_age_to_the_byte() {
        let p = pod(
            &[(MEMORY_LEAK_PER_MINUTE, "60Mi")],
            "2025-01-01T00:00:00Z",
            "Running",
        );
        let at = |s: &str| model_usage(&p, s.parse().unwrap()).unwrap().unwrap();
        assert_eq!(
            at("2025-01-01T00:00:00Z"),
            vec![("app".into(), 16 << 20), ("sidecar".into(), 4 << 20)]
        );
        assert_eq!(at("2025-01-01T00:00:02Z")[0].1, (16 << 20) + (2 << 20));
        assert_eq!(at("2025-01-01T00:00:01Z")[0].1, (16 << 20) + (1 << 20));
    }

    #[test]
    fn named_container_carries_the_model() {
        let p = pod(
            &[(MEMORY_BASE, "100Mi"), (MEMORY_CONTAINER, "sidecar")],
            "2025-01-01T00:00:00Z",
            "Running",
        );
        let usage = model_usage(&p, "2025-01-01T01:00:00Z".parse().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(
            usage,
            vec![("app".into(), 4 << 20), ("sidecar".into(), 100 << 20)]
        );
        let bad = pod(
            &[(MEMORY_CONTAINER, "nope")],
            "2025-01-01T00:00:00Z",
            "Running",
        );
        assert!(model_usage(&bad, Timestamp::now()).is_err());
    }

    #[test]
    fn pods_not_running_get_no_metrics() {
        let p = pod(&[], "2025-01-01T00:00:00Z", "Pending");
        assert_eq!(model_usage(&p, Timestamp::now()).unwrap(), None);
    }
}
