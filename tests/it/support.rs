//! Running the real `bouncer` binary against the test cluster, and reading what it did.

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

impl Bounced {
    pub fn rows(&self) -> Vec<&Value> {
        self.report["rows"].as_array().map(|r| r.iter().collect()).unwrap_or_default()
    }

    /// (workload name, decision) of every row with a queue position, in queue order.
    pub fn queue(&self) -> Vec<(String, String)> {
        self.rows()
            .into_iter()
            .filter(|r| !r["order"].is_null())
            .map(|r| (name(r), r["decision"].as_str().unwrap_or_default().to_string()))
            .collect()
    }

    pub fn row(&self, workload: &str) -> &Value {
        self.rows()
            .into_iter()
            .find(|r| r["workload"]["name"] == workload)
            .unwrap_or_else(|| panic!("no row for {workload} in {:#}", self.report))
    }

    pub fn bounced(&self) -> Vec<String> {
        self.queue().into_iter().filter(|(_, d)| d == "bounced").map(|(n, _)| n).collect()
    }
}

pub fn name(row: &Value) -> String {
    row["workload"]["name"].as_str().unwrap_or_default().to_string()
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

pub async fn bouncer_env(args: &[&str], policies: &Policies, ns: &str, env: &[(&str, &str)]) -> Bounced {
    let cluster = bouncer_testkit::cluster();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bouncer"))
        .args(args)
        .arg("--policies")
        .arg(policies.path())
        .args(["--output", "json", "--lease-namespace", ns, "--rollout-timeout", "90s"])
        .env("KUBECONFIG", &cluster.kubeconfig)
        .env("BOUNCER_VERIFY_SETTLE", "1s")
        .envs(env.iter().copied())
        .output()
        .await
        .expect("bouncer starts");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    Bounced { code: out.status.code().unwrap_or(-1), report, stdout, stderr }
}

pub async fn deployment(client: &Client, ns: &str, name: &str) -> Deployment {
    Api::<Deployment>::namespaced(client.clone(), ns).get(name).await.expect("get deployment")
}

pub async fn statefulset(client: &Client, ns: &str, name: &str) -> StatefulSet {
    Api::<StatefulSet>::namespaced(client.clone(), ns).get(name).await.expect("get statefulset")
}

pub fn restarted_at(template_annotations: Option<&std::collections::BTreeMap<String, String>>) -> Option<String> {
    template_annotations.and_then(|a| a.get(bouncer_testkit::RESTARTED_AT)).cloned()
}

pub fn deployment_restarted_at(d: &Deployment) -> Option<String> {
    restarted_at(d.spec.as_ref()?.template.metadata.as_ref()?.annotations.as_ref())
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
    let ready = conditions.iter().find(|c| c.type_ == "Ready" && c.status == "True")?;
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
