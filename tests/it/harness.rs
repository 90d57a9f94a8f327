//! Running the real `bouncer` binary against the test cluster, and reading what it did.

use bouncer_testkit::PodTemplateExt as _;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::Value;

/// One finished `bouncer` process.
#[derive(Debug)]
pub struct Bounced {
    pub code: i32,
    pub report: Value,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for Bounced {
    fn from(out: std::process::Output) -> Bounced {
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let report = serde_json::from_str(&stdout).unwrap_or(Value::Null);
        Bounced {
            code: out.status.code().unwrap_or(-1),
            report,
            stdout,
            stderr,
        }
    }
}

impl Bounced {
    pub fn rows(&self) -> Vec<&Value> {
        self.report["rows"]
            .as_array()
            .map(|r| r.iter().collect())
            .unwrap_or_default()
    }

    /// (workload name, decision) of every row with a queue position, in queue order.
    pub fn queue(&self) -> Vec<(String, String)> {
        self.rows()
            .into_iter()
            .filter(|r| !r["order"].is_null())
            .map(|r| {
                (
                    name(r),
                    r["decision"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    pub fn row(&self, workload: &str) -> &Value {
        self.rows()
            .into_iter()
            .find(|r| r["workload"]["name"] == workload)
            .unwrap_or_else(|| panic!("no row for {workload} in {:#}", self.report))
    }

    pub fn bounced(&self) -> Vec<String> {
        self.queue()
            .into_iter()
            .filter(|(_, d)| d == "bounced")
            .map(|(n, _)| n)
            .collect()
    }
}

pub fn name(row: &Value) -> String {
    row["workload"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A directory of policy files for one test, removed on drop.
pub struct Policies {
    dir: tempfile::TempDir,
}

impl Policies {
    pub fn new(files: &[(&str, &str)]) -> Policies {
        let dir = tempfile::tempdir().expect("temp dir");
        for (file, text) in files {
            std::fs::write(dir.path().join(file), text).expect("write policy");
        }
        Policies { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

/// Runs `bouncer ARGS --output json` with the test cluster's kubeconfig; the lease lives in `ns`.
pub async fn bouncer(args: &[&str], policies: &Policies, ns: &str) -> Bounced {
    bouncer_env(args, policies, ns, &[]).await
}

pub async fn bouncer_env(
    args: &[&str],
    policies: &Policies,
    ns: &str,
    env: &[(&str, &str)],
) -> Bounced {
    let out = command(args, policies, ns, env)
        .output()
        .await
        .expect("bouncer starts");
    Bounced::from(out)
}

pub async fn deployment(client: &Client, ns: &str, name: &str) -> Deployment {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("get deployment")
}

pub async fn statefulset(client: &Client, ns: &str, name: &str) -> StatefulSet {
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("get statefulset")
}

pub fn deployment_restarted_at(d: &Deployment) -> Option<String> {
    d.template_annotation(bouncer_testkit::RESTARTED_AT)
}

/// Pods matching `selector`, not being deleted.
pub async fn pods(client: &Client, ns: &str, selector: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

pub fn time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), 0).expect("valid time")
}

/// When the pod's Ready condition last turned True.
pub fn ready_since(p: &Pod) -> Option<DateTime<Utc>> {
    let conditions = p.status.as_ref()?.conditions.as_ref()?;
    let ready = conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    ready.last_transition_time.as_ref().map(time)
}

/// When `manager` last wrote the object (server clock, whole seconds).
pub fn written_by(meta: &kube::api::ObjectMeta, manager: &str) -> Option<DateTime<Utc>> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|e| e.manager.as_deref() == Some(manager))
        .filter_map(|e| e.time.as_ref().map(time))
        .max()
}

/// A schedule that fires every minute with a 1 s cooldown: a policy's `extra` for most tests.
pub const EVERY_MINUTE: &str =
    "  triggers:\n    schedule: {cron: \"* * * * *\", startingDeadline: 5m}\n  cooldown: 1s\n";

/// Creates a Deployment and waits for its rollout; generous, as the whole control plane shares
/// two cores with every test running at once.
pub async fn deploy(client: &Client, ns: &str, d: Deployment) {
    let name = d.metadata.name.clone().expect("a named Deployment");
    bouncer_testkit::create(client, ns, &d)
        .await
        .expect("create deployment");
    bouncer_testkit::wait_rollout_complete(
        client,
        bouncer_testkit::Kind::Deployment,
        ns,
        &name,
        Duration::from_secs(180),
    )
    .await
    .expect("deployment ready");
}

/// One-replica Deployments `names` labelled `app=NAME` and `KEY=yes`, each rolled out, and a
/// policy `KEY` selecting them on an every-minute schedule (created in this order, the first has
/// the oldest pods: the queue takes them in order).
pub async fn every_minute(client: &Client, ns: &str, key: &str, names: &[&str]) -> Policies {
    for name in names {
        deploy(
            client,
            ns,
            bouncer_testkit::deployment(name, 1, &[("app", name), (key, "yes")]),
        )
        .await;
    }
    let selector = format!("{{{key}: \"yes\"}}");
    Policies::new(&[("p.yaml", &policy(key, ns, &selector, EVERY_MINUTE))])
}

/// Waits until the wall clock passes the next whole minute plus `margin`, so a `* * * * *`
/// schedule has fired after everything created so far.
pub async fn next_minute(margin: Duration) {
    let now = Utc::now();
    let into = now.timestamp() % 60;
    let wait = Duration::from_secs((60 - into) as u64) + margin;
    tokio::time::sleep(wait).await;
}

/// A policy document in the test namespace. `extra` is YAML under `spec:` (indented 2).
pub fn policy(name: &str, ns: &str, labels: &str, extra: &str) -> String {
    format!(
        "apiVersion: bouncer.dev/v1alpha1\nkind: BouncePolicy\nmetadata:\n  name: {name}\nspec:\n  target:\n    namespaces: [{ns}]\n    selector:\n      matchLabels: {labels}\n{extra}"
    )
}

/// `bouncer ARGS --output json` against the test cluster, the lease in `ns`, with short waits.
fn command(
    args: &[&str],
    policies: &Policies,
    ns: &str,
    env: &[(&str, &str)],
) -> tokio::process::Command {
    let cluster = bouncer_testkit::cluster();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bouncer"));
    cmd.args(args)
        .arg("--policies")
        .arg(policies.path())
        .args([
            "--output",
            "json",
            "--lease-namespace",
            ns,
            "--rollout-timeout",
            "90s",
        ])
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("BOUNCER_VERIFY_SETTLE", "1s")
        .envs(env.iter().copied());
    cmd
}

/// `bouncer ARGS --output json` as `bouncer_env` runs it, but started in the background with its
/// output captured, so a test can act on the cluster (or signal it) while it runs.
pub fn spawn_bouncer(
    args: &[&str],
    policies: &Policies,
    ns: &str,
    env: &[(&str, &str)],
) -> tokio::process::Child {
    command(args, policies, ns, env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("bouncer starts")
}

/// Waits for a background `bouncer` and reads what it reported.
pub async fn finish(child: tokio::process::Child) -> Bounced {
    let out = child
        .wait_with_output()
        .await
        .expect("bouncer runs to the end");
    Bounced::from(out)
}

/// The pod template's restartedAt of a Deployment, or None when it (or the Deployment) is absent.
pub async fn restarted_at_of(client: &Client, ns: &str, name: &str) -> Option<String> {
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .expect("get deployment")?;
    deployment_restarted_at(&d)
}

/// Watches a Deployment until its pod template carries a restartedAt annotation.
pub async fn wait_restarted_at(client: &Client, ns: &str, name: &str, timeout: Duration) -> String {
    let api = Api::<Deployment>::namespaced(client.clone(), ns);
    let cond = |d: Option<&Deployment>| d.and_then(deployment_restarted_at).is_some();
    match tokio::time::timeout(
        timeout,
        kube::runtime::wait::await_condition(api, name, cond),
    )
    .await
    {
        Ok(Ok(Some(d))) => deployment_restarted_at(&d).expect("condition holds"),
        other => panic!("deployment {ns}/{name} got no restartedAt within {timeout:?}: {other:?}"),
    }
}

/// `kubectl rollout restart deployment/NAME` in `ns`, as a person runs it; panics on failure.
pub fn rollout_restart(ns: &str, name: &str) {
    kubectl_ok(&[
        "-n",
        ns,
        "rollout",
        "restart",
        &format!("deployment/{name}"),
    ]);
}

/// `kubectl set image deployment/NAME app=IMAGE`: a new version, as a pipeline rolls one out.
pub fn set_image(ns: &str, name: &str, image: &str) {
    let container = format!("app={image}");
    kubectl_ok(&[
        "-n",
        ns,
        "set",
        "image",
        &format!("deployment/{name}"),
        &container,
    ]);
}

/// `kubectl ARGS`; panics with its stderr on failure.
pub fn kubectl_ok(args: &[&str]) {
    let out = bouncer_testkit::kubectl()
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// UIDs of the pods matching `selector` (not being deleted), sorted.
pub async fn pod_uids(client: &Client, ns: &str, selector: &str) -> Vec<String> {
    let mut uids: Vec<String> = pods(client, ns, selector)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    uids.sort();
    uids
}

/// Events bouncer recorded (events.k8s.io/v1) about the object `name` in `ns` with `reason`.
pub async fn bouncer_events(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("bouncer.dev/bouncer"))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

pub fn audit_log() -> Option<PathBuf> {
    let path = bouncer_testkit::cluster()
        .kubeconfig
        .parent()?
        .join("audit.log");
    path.is_file().then_some(path)
}

/// Where the API server's audit log ends now. The tests read bouncer's requests from it (what
/// it patched, evicted, listed), so a cluster without one (an external cluster) fails them
/// rather than letting them pass unchecked.
pub fn audit_mark() -> u64 {
    audit_log()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .expect("the test cluster writes an audit log (scripts/cluster up starts one)")
}

/// Completed requests bouncer's user agent made after `mark`, as the audit log records them.
pub fn audit_since(mark: u64) -> Vec<Value> {
    audit_all_since(mark)
        .into_iter()
        .filter(|e| {
            e["userAgent"]
                .as_str()
                .is_some_and(|ua| ua.starts_with("bouncer/"))
        })
        .collect()
}

/// Completed requests of every client after `mark`, as the audit log records them.
pub fn audit_all_since(mark: u64) -> Vec<Value> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(audit_log().expect("audit log")).expect("open audit log");
    file.seek(SeekFrom::Start(mark)).expect("seek audit log");
    let mut text = String::new();
    file.read_to_string(&mut text).expect("read audit log");
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .collect()
}

/// Audit entries of `verb` on `resource` (optionally a subresource) in `ns`, oldest first.
pub fn audited<'a>(entries: &'a [Value], verb: &str, resource: &str, ns: &str) -> Vec<&'a Value> {
    let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
    entries
        .iter()
        .filter(|e| {
            e["verb"] == verb
                && e["objectRef"]["resource"] == resource
                && e["objectRef"]["namespace"] == ns
        })
        .filter(|e| e["objectRef"]["subresource"].as_str().unwrap_or_default() == sub)
        .collect()
}

/// The Deployments in `ns` bouncer patched since `mark`, one name per patch, sorted (its mark on
/// the metadata counts as a patch too).
pub fn patches_of(mark: u64, ns: &str) -> Vec<String> {
    let log = audit_since(mark);
    let mut names: Vec<String> = audited(&log, "patch", "deployments", ns)
        .iter()
        .map(|e| {
            e["objectRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    names.sort();
    names
}

/// When the API server received an audited request.
pub fn audit_time(entry: &Value) -> DateTime<Utc> {
    entry["requestReceivedTimestamp"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("audit timestamp")
}

/// `kubectl apply -f -` of a YAML (or JSON) document, for PodDisruptionBudgets and RBAC bundles
/// written as text.
pub fn apply(manifest: &str) {
    kubectl_apply(&[], manifest);
}

/// `kubectl apply ARGS -f -` of `manifest` (e.g. `-n NS --server-side`).
pub fn kubectl_apply(args: &[&str], manifest: &str) {
    use std::io::Write;
    let mut child = bouncer_testkit::kubectl()
        .arg("apply")
        .args(args)
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(manifest.as_bytes())
        .expect("write manifest");
    let out = child.wait_with_output().expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl apply {args:?} failed: {}\n{manifest}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Merge-patches a Deployment and waits until its controller observed the change.
pub async fn patch_deployment(client: &Client, ns: &str, name: &str, patch: Value) {
    let api = Api::<Deployment>::namespaced(client.clone(), ns);
    let patched = api
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await;
    let generation = patched
        .expect("patch deployment")
        .metadata
        .generation
        .unwrap_or(0);
    let observed = move |d: Option<&Deployment>| {
        d.and_then(|d| d.status.as_ref()?.observed_generation)
            .is_some_and(|g| g >= generation)
    };
    tokio::time::timeout(
        Duration::from_secs(60),
        kube::runtime::wait::await_condition(api, name, observed),
    )
    .await
    .unwrap_or_else(|_| {
        panic!("deployment {ns}/{name}: generation {generation} not observed within 60s")
    })
    .expect("watch deployment");
}

/// Ready nodes in the cluster.
pub async fn ready_nodes(client: &Client) -> i32 {
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&ListParams::default())
        .await;
    let ready = nodes
        .expect("list nodes")
        .items
        .into_iter()
        .filter(node_ready);
    i32::try_from(ready.count()).expect("node count")
}

/// True when the node's Ready condition is True.
pub fn node_ready(n: &k8s_openapi::api::core::v1::Node) -> bool {
    n.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// A Deployment with one replica per Ready node, kept one per node by required pod
/// anti-affinity and rolled with maxUnavailable 0: its pods run, but the surge pod of any
/// restart can never be scheduled, so every rollout of it is stuck. No node is cordoned, so
/// tests running alongside are unaffected.
pub async fn stuck_on_restart(client: &Client, name: &str, labels: &[(&str, &str)]) -> Deployment {
    let mut d = bouncer_testkit::deployment(name, ready_nodes(client).await, labels);
    let selector: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    let affinity = serde_json::json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": selector}, "topologyKey": "kubernetes.io/hostname"}]}});
    let spec = d.spec.as_mut().expect("spec");
    spec.strategy = Some(
        serde_json::from_value(serde_json::json!(
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        ))
        .expect("strategy"),
    );
    spec.template.spec.as_mut().expect("pod spec").affinity =
        Some(serde_json::from_value(affinity).expect("affinity"));
    d
}

/// Merge-patches object `name` with `patch()` every 3 s until the handle is aborted: a live
/// holder renewing its Lease.
pub fn keep_patching<K>(
    api: Api<K>,
    name: &'static str,
    patch: impl Fn() -> Value + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let params = kube::api::PatchParams::default();
            let _ = api
                .patch(name, &params, &kube::api::Patch::Merge(patch()))
                .await;
        }
    })
}

/// A Lease time as the API server writes it (RFC3339, microseconds).
pub fn micro(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}
