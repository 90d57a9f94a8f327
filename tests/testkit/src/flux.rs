//! The real Flux controllers as a fixture: source-controller and kustomize-controller (pinned
//! release, their own CRDs), one pair per test, reconciling one Kustomization from a Git
//! repository the test commits to and serves on loopback ([`GitServer`]).
//!
//! The controllers are built by `scripts/cluster flux` from the wrapper modules pinned in
//! `tests/cluster/flux-<version>/` (cached; the CRDs sit next to the binaries). They run on the
//! host with the cluster's kubeconfig, metrics off, health probes and the artifact server on
//! loopback, and watch only objects labelled with the test's shard ([`SHARD_LABEL`], Flux's own
//! sharding flag), so the pairs of tests running at once never reconcile each other's objects.
//! Their log is kept under `target/flux-logs/` when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::{cluster, kubectl, repo_root, target_dir};
use crate::git::{BRANCH, GitServer};

/// The release of both controllers, as pinned in `tests/cluster/flux-<version>/`.
pub const FLUX_VERSION: &str = "v1.9.6";
/// The field manager kustomize-controller applies with.
pub const FLUX_MANAGER: &str = "kustomize-controller";
/// The label both controllers select their objects by (`--watch-label-selector`).
pub const SHARD_LABEL: &str = "sharding.fluxcd.io/key";
/// The annotation that asks a Flux object for a reconcile now.
pub const REQUESTED_AT: &str = "reconcile.fluxcd.io/requestedAt";
/// The one GitRepository and Kustomization of a test, both named so.
pub const NAME: &str = "app";
const STARTUP: Duration = Duration::from_secs(120);
const RECONCILE: Duration = Duration::from_secs(120);

/// A Kustomization's reconcile that a test requested: how long it took and what kustomize
/// controller reported.
#[derive(Debug, Clone)]
pub struct Reconciled {
    pub took: Duration,
    pub revision: String,
}

/// Both controllers for one test namespace, and its Git repository.
pub struct Flux {
    source: Child,
    kustomize: Child,
    dir: PathBuf,
    ns: String,
    git: GitServer,
}

impl std::fmt::Debug for Flux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flux").field("ns", &self.ns).finish()
    }
}

impl Flux {
    /// Builds (once) and installs the CRDs, commits `files` to a new repository, starts both
    /// controllers for `ns`, and creates the GitRepository and the Kustomization (`interval`,
    /// pruning, everything applied into `ns`), then waits until Git's first commit is applied.
    pub async fn start(
        client: &Client,
        ns: &str,
        files: &[(&str, &str)],
        interval: &str,
    ) -> Result<Self> {
        let bin = built()?;
        install_crds(&bin)?;
        let dir = target_dir().join("flux-logs").join(ns);
        let git = GitServer::start(&dir.join("git"))?;
        let revision = git.commit(files, "first")?;
        let storage = dir.join("storage");
        std::fs::create_dir_all(&storage)?;
        let (storage_port, health) = (free_port()?, free_port()?);
        let storage_addr = format!("127.0.0.1:{storage_port}");
        let source = spawn(
            &bin,
            "source-controller",
            ns,
            &dir,
            &[
                format!("--health-addr=127.0.0.1:{health}"),
                format!("--storage-path={}", storage.display()),
                format!("--storage-addr={storage_addr}"),
                format!("--storage-adv-addr={storage_addr}"),
            ],
        )?;
        let kustomize = spawn(
            &bin,
            "kustomize-controller",
            ns,
            &dir,
            &[format!("--health-addr=127.0.0.1:{}", free_port()?)],
        )?;
        let mut flux = Self {
            source,
            kustomize,
            dir,
            ns: ns.to_string(),
            git,
        };
        flux.wait_started().await?;
        flux.create_objects(client, interval).await?;
        flux.wait_applied(client, &revision).await?;
        Ok(flux)
    }

    pub fn git(&self) -> &GitServer {
        &self.git
    }

    /// Both logs so far, for a failing assertion's message.
    pub fn logs(&self) -> String {
        ["source-controller", "kustomize-controller"]
            .iter()
            .map(|c| format!("--- {c}\n{}", tail(&self.log(c), 20)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn log(&self, controller: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{controller}.log"))).unwrap_or_default()
    }

    /// True while both processes run.
    pub fn is_running(&mut self) -> bool {
        matches!(self.source.try_wait(), Ok(None)) && matches!(self.kustomize.try_wait(), Ok(None))
    }

    /// Commits `files` and has Flux apply them now: the source fetched, then the Kustomization
    /// reconciled at that revision.
    pub async fn push(
        &self,
        client: &Client,
        files: &[(&str, &str)],
        message: &str,
    ) -> Result<Reconciled> {
        let revision = self.git.commit(files, message)?;
        let token = request(client, &self.ns, "GitRepository", &token()).await?;
        wait_for(client, &self.ns, "GitRepository", RECONCILE, |o| {
            o.pointer("/status/lastHandledReconcileAt") == Some(&json!(token))
                && o.pointer("/status/artifact/revision")
                    .and_then(Value::as_str)
                    .is_some_and(|r| r.ends_with(&revision))
        })
        .await
        .with_context(|| {
            format!(
                "source-controller did not fetch {revision}\n{}",
                self.logs()
            )
        })?;
        self.reconcile_at(client, Some(&revision)).await
    }

    /// Asks the Kustomization for a reconcile now and waits until kustomize-controller handled
    /// it and is Ready.
    pub async fn reconcile(&self, client: &Client) -> Result<Reconciled> {
        self.reconcile_at(client, None).await
    }

    async fn reconcile_at(&self, client: &Client, revision: Option<&str>) -> Result<Reconciled> {
        let started = Instant::now();
        let token = request(client, &self.ns, "Kustomization", &token()).await?;
        let obj = wait_for(client, &self.ns, "Kustomization", RECONCILE, |o| {
            o.pointer("/status/lastHandledReconcileAt") == Some(&json!(token))
                && applied(o, revision)
        })
        .await
        .with_context(|| {
            format!(
                "kustomize-controller did not handle {token}\n{}",
                self.logs()
            )
        })?;
        Ok(Reconciled {
            took: started.elapsed(),
            revision: str_at(&obj, "/status/lastAppliedRevision"),
        })
    }

    /// Sets the Kustomization's `spec.suspend`.
    pub async fn suspend(&self, client: &Client, suspend: bool) -> Result<()> {
        api(client, &self.ns, "Kustomization")
            .patch(
                NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"suspend": suspend}})),
            )
            .await
            .context("suspending the Kustomization")?;
        Ok(())
    }

    /// The Kustomization as the API server holds it.
    pub async fn kustomization(&self, client: &Client) -> Result<Value> {
        let obj = api(client, &self.ns, "Kustomization").get(NAME).await?;
        Ok(serde_json::to_value(obj)?)
    }

    async fn wait_applied(&self, client: &Client, revision: &str) -> Result<()> {
        wait_for(client, &self.ns, "Kustomization", STARTUP, |o| {
            applied(o, Some(revision))
        })
        .await
        .with_context(|| format!("Flux did not apply {revision}\n{}", self.logs()))?;
        Ok(())
    }

    async fn create_objects(&self, client: &Client, interval: &str) -> Result<()> {
        let labels = json!({SHARD_LABEL: self.ns});
        let repo = json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
            "metadata": {"name": NAME, "namespace": self.ns, "labels": labels},
            "spec": {"interval": "10m", "url": self.git.url(), "ref": {"branch": BRANCH}},
        });
        let kustomization = json!({
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
            "metadata": {"name": NAME, "namespace": self.ns, "labels": labels},
            // retryInterval: a failed reconcile (one was seen to lose its own build directory
            // under a loaded machine) is tried again in seconds, not at the next `interval`.
            "spec": {"interval": interval, "retryInterval": "5s", "path": "./", "prune": true,
                     "targetNamespace": self.ns,
                     "sourceRef": {"kind": "GitRepository", "name": NAME}},
        });
        let params = PatchParams::apply("bouncer-testkit").force();
        for (kind, obj) in [("GitRepository", repo), ("Kustomization", kustomization)] {
            api(client, &self.ns, kind)
                .patch(NAME, &params, &Patch::Apply(&obj))
                .await
                .with_context(|| format!("creating {kind} {}/{NAME}", self.ns))?;
        }
        Ok(())
    }

    /// controller-runtime logs "Starting workers" once per controller after its caches synced.
    async fn wait_started(&mut self) -> Result<()> {
        let deadline = Instant::now() + STARTUP;
        loop {
            let started = |c: &str, kind: &str| {
                self.log(c).lines().any(|l| {
                    l.contains("Starting workers")
                        && l.contains(&format!("\"controllerKind\":\"{kind}\""))
                })
            };
            if started("source-controller", "GitRepository")
                && started("kustomize-controller", "Kustomization")
            {
                return Ok(());
            }
            if !self.is_running() || Instant::now() > deadline {
                bail!("Flux {FLUX_VERSION} did not start\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Flux {
    fn drop(&mut self) {
        for c in [&mut self.source, &mut self.kustomize] {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Without the controllers nobody removes their finalizers, and the namespace would hang
        // in Terminating.
        let _ = kubectl()
            .args([
                "-n",
                &self.ns,
                "patch",
                "kustomization",
                NAME,
                "--type=merge",
            ])
            .args(["-p", r#"{"metadata":{"finalizers":null}}"#])
            .output();
        let _ = kubectl()
            .args([
                "-n",
                &self.ns,
                "patch",
                "gitrepository",
                NAME,
                "--type=merge",
            ])
            .args(["-p", r#"{"metadata":{"finalizers":null}}"#])
            .output();
        if std::thread::panicking() {
            eprintln!("Flux logs kept: {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Applied at `revision` (any, when None) and Ready.
fn applied(o: &Value, revision: Option<&str>) -> bool {
    let ready = o
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
    let at = str_at(o, "/status/lastAppliedRevision");
    ready && !at.is_empty() && revision.is_none_or(|r| at.ends_with(r))
}

fn str_at(o: &Value, pointer: &str) -> String {
    o.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn resource(kind: &str) -> ApiResource {
    let (group, version) = match kind {
        "GitRepository" => ("source.toolkit.fluxcd.io", "v1"),
        _ => ("kustomize.toolkit.fluxcd.io", "v1"),
    };
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

fn api(client: &Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &resource(kind))
}

/// Sets the reconcile-request annotation to `token`, which the controller copies into
/// `status.lastHandledReconcileAt` once it handled the request.
async fn request(client: &Client, ns: &str, kind: &str, token: &str) -> Result<String> {
    let patch = json!({"metadata": {"annotations": {REQUESTED_AT: token}}});
    api(client, ns, kind)
        .patch(NAME, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .with_context(|| format!("requesting a reconcile of {kind} {ns}/{NAME}"))?;
    Ok(token.to_string())
}

async fn wait_for(
    client: &Client,
    ns: &str,
    kind: &str,
    timeout: Duration,
    done: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let deadline = Instant::now() + timeout;
    let api = api(client, ns, kind);
    let mut last = Value::Null;
    while Instant::now() < deadline {
        if let Ok(obj) = api.get(NAME).await {
            last = serde_json::to_value(obj)?;
            if done(&last) {
                return Ok(last);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!(
        "{kind} {ns}/{NAME} not done within {timeout:?}; status: {:#}",
        last["status"]
    )
}

fn spawn(bin: &Path, controller: &str, ns: &str, dir: &Path, extra: &[String]) -> Result<Child> {
    let log = dir.join(format!("{controller}.log"));
    let file =
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    // setpriv --pdeathsig: the controller dies with the test thread that started it, even when
    // the test process is killed and no Drop runs.
    Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--"])
        .arg(bin.join(controller))
        .args([
            "--metrics-addr=0",
            "--log-level=info",
            "--log-encoding=json",
        ])
        .arg(format!("--watch-label-selector={SHARD_LABEL}={ns}"))
        .args(extra)
        .env("KUBECONFIG", &cluster().kubeconfig)
        .env("RUNTIME_NAMESPACE", ns)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("starting {controller}"))
}

/// A reconcile request's value: any string the object did not hold before.
fn token() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("bouncer-test-{}", now.as_nanos())
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `scripts/cluster flux`: the directory holding both binaries and `crds/`.
fn built() -> Result<PathBuf> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    if let Some(dir) = DIR.get() {
        return Ok(dir.clone());
    }
    let script = repo_root().join("scripts/cluster");
    // stderr inherited: a first build takes minutes and reports progress.
    let out = Command::new(&script)
        .arg("flux")
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {} flux", script.display()))?;
    if !out.status.success() {
        bail!("{} flux failed ({})", script.display(), out.status);
    }
    let dir = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    if !dir.join("kustomize-controller").is_file() || !dir.join("crds").is_dir() {
        bail!("{} holds no Flux controllers and crds/", dir.display());
    }
    Ok(DIR.get_or_init(|| dir).clone())
}

/// Server-side applies the CRDs (too large for client-side apply's annotation), then waits until
/// they are served.
fn install_crds(bin: &Path) -> Result<()> {
    let crds = bin.join("crds").to_string_lossy().to_string();
    for args in [
        vec![
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=bouncer-testkit-flux",
            "-f",
            &crds,
        ],
        vec![
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            &crds,
        ],
    ] {
        let out = kubectl().args(&args).output().context("running kubectl")?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(())
}
