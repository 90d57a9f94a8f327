//! The real ToolHive operator as a fixture: its CRDs, one operator process per test namespace
//! (killed on drop, its log kept under `target/toolhive-logs/` when the test fails), and
//! builders for the resources it reconciles (MCPGroup, MCPServer, VirtualMCPServer) and for the
//! backend StatefulSet its proxy runner would create.
//!
//! The operator is built by `scripts/cluster toolhive VERSION` from the module pinned in
//! `tests/cluster/toolhive-VERSION/` (cached; the CRDs of that version sit next to the binary).
//! It runs on the host with the cluster's kubeconfig, watching only the test's namespace, with
//! metrics and health probes off, no leader election and its update check off, so it reaches
//! nothing but the test API server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::{cluster, kubectl, repo_root, target_dir};
use crate::crd_gate::CrdTurn;

/// The last release whose reconcilers rebuild the pod template's annotations and compare them
/// with `maps.Equal`, so they strip `kubectl.kubernetes.io/restartedAt` (ToolHive #6344).
pub const TOOLHIVE_REVERTING: &str = "v0.44.0";
/// The first release with `PreserveKubectlRestartedAt` (PR #6378,
/// `cmd/thv-operator/pkg/controllerutil/restart.go`): it keeps the annotation.
pub const TOOLHIVE_FIXED: &str = "v0.45.0";
/// The field manager the proxy runner applies the backend StatefulSet with.
pub const RUNNER_MANAGER: &str = "toolhive-container-manager";
const GROUP: &str = "toolhive.stacklok.dev";
const VERSION: &str = "v1beta1";
/// Time for the operator's caches to sync and its controllers to start.
const STARTUP: Duration = Duration::from_secs(90);

/// A running ToolHive operator watching one namespace, or several (comma-separated).
pub struct ToolHiveOperator {
    child: Child,
    /// Where the binary and its CRDs are.
    dir: PathBuf,
    version: String,
    ns: String,
    log: PathBuf,
    /// The CRDs are cluster-wide and differ between versions: operators of different versions
    /// never overlap (across test processes); those of one version run side by side.
    _turn: CrdTurn,
}

impl std::fmt::Debug for ToolHiveOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolHiveOperator")
            .field("version", &self.version)
            .field("ns", &self.ns)
            .field("pid", &self.child.id())
            .finish()
    }
}

impl ToolHiveOperator {
    /// Builds (once) and installs the CRDs of `version`, then starts its operator for `ns` (one
    /// namespace, or several separated by commas, as `WATCH_NAMESPACE` takes them) and waits
    /// until its controllers run.
    pub async fn start(version: &str, ns: &str) -> Result<Self> {
        let turn = CrdTurn::take(version).await?;
        let dir = built(version)?;
        install_crds(&dir, version)?;
        let logs = target_dir().join("toolhive-logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let log = logs.join(format!("{ns}-{version}.log"));
        let _ = std::fs::remove_file(&log);
        let child = spawn(&dir, version, ns, &log)?;
        let mut operator = Self {
            child,
            dir,
            version: version.to_string(),
            ns: ns.to_string(),
            log,
            _turn: turn,
        };
        operator.wait_started(0).await?;
        Ok(operator)
    }

    /// Stops the operator and keeps its CRDs and its turn (no other version's test starts
    /// meanwhile), until `resume`: an operator that is down.
    pub fn pause(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the operator again after `pause`, and waits until its controllers run.
    pub async fn resume(&mut self) -> Result<()> {
        let from = self.log().len();
        self.child = spawn(&self.dir, &self.version, &self.ns, &self.log)?;
        self.wait_started(from).await
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The operator's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// controller-runtime logs "Starting workers ... controllerKind=<Kind> ..." once per
    /// controller, after its caches synced.
    async fn wait_started(&mut self, from: usize) -> Result<()> {
        let deadline = tokio::time::Instant::now() + STARTUP;
        loop {
            let log = self.log().get(from..).unwrap_or_default().to_string();
            let started = ["VirtualMCPServer", "MCPServer", "MCPGroup"]
                .iter()
                .all(|kind| {
                    let field = format!("controllerKind={kind} ");
                    log.lines()
                        .any(|l| l.contains("Starting workers") && l.contains(&field))
                });
            if started {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!(
                    "ToolHive operator {} exited at startup ({status}); log {}:\n{}",
                    self.version,
                    self.log.display(),
                    tail(&log, 30)
                );
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "ToolHive operator {} not started within {STARTUP:?}; log {}:\n{}",
                    self.version,
                    self.log.display(),
                    tail(&log, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for ToolHiveOperator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Without the operator nobody removes its finalizers, and the namespace would hang in
        // Terminating: drop them so `TestNs` can delete it.
        for ns in self.ns.split(',') {
            strip_finalizers(ns);
        }
        if std::thread::panicking() {
            eprintln!(
                "ToolHive operator {} log kept: {}",
                self.version,
                self.log.display()
            );
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// The operator process for `ns`, logging to `log` (appended: a resumed operator keeps the
/// first run's lines).
fn spawn(dir: &Path, version: &str, ns: &str, log: &Path) -> Result<Child> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    // setpriv --pdeathsig: the operator dies with the test thread that started it, even
    // when the test process is killed and no Drop runs.
    Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--"])
        .arg(dir.join("thv-operator"))
        .args([
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            "--leader-elect=false",
        ])
        .env("KUBECONFIG", &cluster().kubeconfig)
        .env("WATCH_NAMESPACE", ns)
        .env("POD_NAMESPACE", ns.split(',').next().unwrap_or(ns))
        .env("TOOLHIVE_SKIP_UPDATE_CHECK", "true")
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("starting ToolHive operator {version}"))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `scripts/cluster toolhive VERSION`: the directory holding `thv-operator` and `crds/`.
fn built(version: &str) -> Result<PathBuf> {
    let script = repo_root().join("scripts/cluster");
    // stderr inherited: a first build takes minutes and reports progress.
    let out = Command::new(&script)
        .args(["toolhive", version])
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {} toolhive {version}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} toolhive {version} failed ({})",
            script.display(),
            out.status
        );
    }
    let dir = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    if !dir.join("thv-operator").is_file() || !dir.join("crds").is_dir() {
        bail!("{} holds no thv-operator and crds/", dir.display());
    }
    Ok(dir)
}

/// Server-side applies the version's CRDs (too large for client-side apply's annotation) under
/// one field manager, so fields the other version had are removed, then waits until served.
fn install_crds(dir: &Path, version: &str) -> Result<()> {
    let crds = dir.join("crds");
    let run = |args: &[&str]| -> Result<()> {
        let out = kubectl().args(args).output().context("running kubectl")?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    };
    let path = crds.to_string_lossy().to_string();
    run(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=bouncer-testkit-toolhive",
        "-f",
        &path,
    ])
    .with_context(|| format!("installing the CRDs of ToolHive {version}"))?;
    run(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "-f",
        &path,
    ])
}

fn strip_finalizers(ns: &str) {
    let kinds = "mcpservers.toolhive.stacklok.dev,virtualmcpservers.toolhive.stacklok.dev,\
                 mcpgroups.toolhive.stacklok.dev";
    let Ok(out) = kubectl()
        .args(["-n", ns, "get", kinds, "-o", "name"])
        .output()
    else {
        return;
    };
    for name in String::from_utf8_lossy(&out.stdout).lines() {
        let _ = kubectl()
            .args(["-n", ns, "patch", name, "--type=merge"])
            .args(["-p", r#"{"metadata":{"finalizers":null}}"#])
            .output();
    }
}

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, VERSION, kind))
}

/// Creates a ToolHive resource (`kind`, with `spec`) in `ns`.
pub async fn create_resource(
    client: &Client,
    ns: &str,
    kind: &str,
    name: &str,
    spec: Value,
) -> Result<DynamicObject> {
    let ar = resource(kind);
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": kind,
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))?;
    api.create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating {kind} {ns}/{name}"))
}

/// Reads a ToolHive resource.
pub async fn get_resource(client: &Client, ns: &str, kind: &str, name: &str) -> Result<Value> {
    let ar = resource(kind);
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar);
    let obj = api
        .get(name)
        .await
        .with_context(|| format!("reading {kind} {ns}/{name}"))?;
    Ok(serde_json::to_value(obj)?)
}

/// An MCPGroup.
pub async fn mcp_group(client: &Client, ns: &str, name: &str) -> Result<DynamicObject> {
    create_resource(
        client,
        ns,
        "MCPGroup",
        name,
        json!({"description": "bouncer test"}),
    )
    .await
}

/// A VirtualMCPServer over `group` with `replicas` pods, anonymous incoming auth and discovered
/// outgoing auth (the operator's simplest example, `vmcp_simple_discovered.yaml`).
pub async fn virtual_mcp_server(
    client: &Client,
    ns: &str,
    name: &str,
    group: &str,
    replicas: i32,
) -> Result<DynamicObject> {
    let spec = json!({
        "groupRef": {"name": group},
        "replicas": replicas,
        "config": {"aggregation": {"conflictResolution": "prefix",
            "conflictResolutionConfig": {"prefixFormat": "{workload}_"}}},
        "incomingAuth": {"type": "anonymous"},
        "outgoingAuth": {"source": "discovered"},
    });
    create_resource(client, ns, "VirtualMCPServer", name, spec).await
}

/// An MCPServer (stdio) in `group` whose proxy pods carry `pod_annotations` (through the
/// operator's own `resourceOverrides.proxyDeployment.podTemplateMetadataOverrides`, so the
/// operator wants them there) and a memory limit.
pub async fn mcp_server(
    client: &Client,
    ns: &str,
    name: &str,
    group: &str,
    pod_annotations: &BTreeMap<String, String>,
) -> Result<DynamicObject> {
    let spec = json!({
        "groupRef": {"name": group},
        "image": "ghcr.io/stackloklabs/gofetch/server:1.0.0",
        "transport": "stdio",
        "proxyPort": 8080,
        "resources": {"limits": {"cpu": "100m", "memory": "512Mi"},
                      "requests": {"cpu": "10m", "memory": "16Mi"}},
        "resourceOverrides": {"proxyDeployment": {"podTemplateMetadataOverrides": {
            "annotations": pod_annotations}}},
    });
    create_resource(client, ns, "MCPServer", name, spec).await
}

/// The backend StatefulSet of MCPServer `name` as its proxy runner applies it
/// (`pkg/container/kubernetes/client.go`): named after the server, selected by `app: <name>`,
/// the runner's standard labels on it and its pods, server-side applied by
/// `toolhive-container-manager`. `pod_annotations` go on its pods (the memory model), and the
/// container gets `memory_limit`.
pub async fn apply_runner_statefulset(
    client: &Client,
    ns: &str,
    name: &str,
    pod_annotations: &BTreeMap<String, String>,
    memory_limit: &str,
) -> Result<StatefulSet> {
    let labels = json!({
        "app": name,
        "toolhive": "true",
        "toolhive-name": name,
        "toolhive-basename": name,
        "toolhive-transport": "stdio",
        "toolhive-port": "8080",
    });
    let sts = json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "serviceName": name,
            "template": {
                "metadata": {"labels": labels, "annotations": pod_annotations},
                "spec": {
                    "restartPolicy": "Always",
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "mcp",
                        "image": "ghcr.io/stackloklabs/gofetch/server:1.0.0",
                        "resources": {"requests": {"cpu": "1m", "memory": "8Mi"},
                                      "limits": {"memory": memory_limit}},
                    }],
                },
            },
        },
    });
    let params = PatchParams::apply(RUNNER_MANAGER).force();
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .patch(name, &params, &Patch::Apply(&sts))
        .await
        .with_context(|| format!("applying statefulset {ns}/{name} as {RUNNER_MANAGER}"))
}
