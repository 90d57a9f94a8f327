//! The shared test cluster (started once per process), per-test clients, kubectl, and `TestNs`:
//! a fresh labelled namespace per test that is dumped on panic and deleted on success.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::await_condition;
use kube::{Api, Client, Config};
use rand::Rng;

use crate::TEST_NAMESPACE_LABEL;

/// Where the test cluster is: its kubeconfig and a kubectl that matches its version.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub kubeconfig: PathBuf,
    /// The kubectl to use: the one `scripts/cluster` built (same version as the server), or the
    /// one on PATH when an external cluster is used and nothing was built.
    pub kubectl: PathBuf,
}

impl Cluster {
    /// The directory of the cluster's binaries (kubectl among them), for tests that run other
    /// tools with it first on PATH.
    pub fn bin_dir(&self) -> &Path {
        self.kubectl.parent().unwrap_or(Path::new(""))
    }
}

/// The repository root, known at compile time because this crate lives inside it.
pub fn repo_root() -> PathBuf {
    // Looked up at run time first: a build cache shared between checkouts keeps the compile-time
    // path of whichever checkout built this crate, which may be gone.
    let candidates = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        std::env::current_dir().ok(),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))),
    ];
    candidates
        .into_iter()
        .flatten()
        .find_map(|start| {
            start
                .ancestors()
                .find(|d| d.join("scripts/cluster").is_file())
                .map(Path::to_path_buf)
        })
        .expect("run from within the repository (no scripts/cluster above it)")
}

/// The Cargo target directory of the running binary: `CARGO_TARGET_DIR`, else the nearest
/// ancestor of the executable holding Cargo's `CACHEDIR.TAG`, else `<repo>/target`.
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.ancestors()
                .find(|d| d.join("CACHEDIR.TAG").is_file())
                .map(Path::to_path_buf)
        })
        .unwrap_or_else(|| repo_root().join("target"))
}

/// The cluster for this test process. The first call starts it (or reuses a running one:
/// `scripts/cluster up` holds a lock and is idempotent), later calls return the cached answer.
/// With `BOUNCER_TEST_KUBECONFIG` set, that cluster is used and nothing is started.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    // The failure is cached too: otherwise every test would rerun a doomed `cluster up`.
    match CLUSTER.get_or_init(|| start_cluster().map_err(|e| format!("{e:#}"))) {
        Ok(c) => c,
        Err(e) => panic!("test setup: no cluster: {e}"),
    }
}

fn start_cluster() -> Result<Cluster> {
    let script = repo_root().join("scripts/cluster");
    let built_kubectl = script_output(&script, "bin")
        .map(|dir| PathBuf::from(dir.trim()).join("kubectl"))
        .ok()
        .filter(|p| p.is_file());
    if let Some(kc) = std::env::var_os("BOUNCER_TEST_KUBECONFIG") {
        let kubectl = built_kubectl.unwrap_or_else(|| PathBuf::from("kubectl"));
        return Ok(Cluster {
            kubeconfig: PathBuf::from(kc),
            kubectl,
        });
    }
    // stderr is inherited so a first-time build (minutes) shows its progress instead of hanging.
    let status = Command::new(&script)
        .arg("up")
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {} up", script.display()))?;
    if !status.success() {
        bail!("{} up failed ({status})", script.display());
    }
    let env = script_output(&script, "env")?;
    let kubeconfig = env
        .lines()
        .find_map(|l| l.strip_prefix("export KUBECONFIG="))
        .context("`scripts/cluster env` printed no KUBECONFIG")?;
    let kubectl = match built_kubectl {
        Some(k) => k,
        None => PathBuf::from(script_output(&script, "bin")?.trim()).join("kubectl"),
    };
    Ok(Cluster {
        kubeconfig: PathBuf::from(kubeconfig.trim()),
        kubectl,
    })
}

fn script_output(script: &Path, arg: &str) -> Result<String> {
    let out = Command::new(script)
        .arg(arg)
        .output()
        .with_context(|| format!("running {} {arg}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} {arg} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// A new client for the test cluster. Each test builds its own because each `#[tokio::test]` has
/// its own runtime and a client's connections belong to the runtime that made them.
pub async fn client() -> Client {
    let c = cluster();
    let kubeconfig = Kubeconfig::read_from(&c.kubeconfig)
        .unwrap_or_else(|e| panic!("test setup: reading {}: {e}", c.kubeconfig.display()));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("test setup: kubeconfig {}: {e}", c.kubeconfig.display()));
    Client::try_from(config).unwrap_or_else(|e| panic!("test setup: building a client: {e}"))
}

/// kubectl (the cluster's version) with `--kubeconfig` already set.
pub fn kubectl() -> Command {
    let c = cluster();
    let mut cmd = Command::new(&c.kubectl);
    cmd.arg(format!("--kubeconfig={}", c.kubeconfig.display()));
    cmd
}

/// A fresh namespace `bt-<area>-<random>` for one test.
///
/// On drop during a panic it writes a dump of the namespace to `target/test-dumps/<ns>.txt` and
/// keeps the namespace; otherwise it deletes the namespace without waiting (deletion takes a few
/// seconds and nothing depends on it). `BOUNCER_TEST_KEEP=1` keeps every namespace.
#[derive(Debug)]
pub struct TestNs {
    name: String,
}

impl TestNs {
    /// Creates the namespace and waits for its `default` ServiceAccount: until the controller
    /// manager makes it, the API server rejects every pod (bare pods would fail outright, where
    /// a controller would merely retry).
    pub async fn new(client: &Client, area: &str) -> Self {
        let suffix: String = {
            let mut rng = rand::rng();
            (0..6)
                .map(|_| {
                    char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)])
                })
                .collect()
        };
        let name = format!("bt-{area}-{suffix}");
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(TEST_NAMESPACE_LABEL.to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("test setup: creating namespace {name}: {e}"));
        // Until the controller manager makes the `default` ServiceAccount, pods are rejected.
        let sa = Api::<ServiceAccount>::namespaced(client.clone(), &name);
        let ready = tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(sa, "default", |o: Option<&ServiceAccount>| o.is_some()),
        )
        .await;
        if !matches!(ready, Ok(Ok(_))) {
            panic!(
                "test setup: namespace {name} got no usable default ServiceAccount within 60s: {ready:?}"
            );
        }
        Self { name }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Writes the namespace's state to `target/test-dumps/<ns>.txt` and returns the path.
    pub fn dump(&self) -> Result<PathBuf> {
        let dir = target_dir().join("test-dumps");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{}.txt", self.name));
        let ns = self.name.as_str();
        let pods = "{range .items[*]}{.metadata.name}  uid={.metadata.uid}  phase={.status.phase}  \
                    start={.status.startTime}  deleting={.metadata.deletionTimestamp}\n  \
                    annotations={.metadata.annotations}\n  owners={.metadata.ownerReferences[*].name}\n{end}";
        let pods = format!("jsonpath={pods}");
        let sections: [(&str, Vec<&str>); 4] = [
            (
                "pods: name, uid, phase, start, annotations, owners",
                vec!["get", "pods", "-o", &pods],
            ),
            (
                "kubectl get all,events -o yaml",
                vec!["get", "all,events", "-o", "yaml"],
            ),
            (
                "kubectl get podmetrics -o yaml",
                vec!["get", "podmetrics.metrics.k8s.io", "-o", "yaml"],
            ),
            (
                "kubectl get controllerrevisions,replicasets -o wide",
                vec!["get", "controllerrevisions,replicasets", "-o", "wide"],
            ),
        ];
        let mut text = format!("# dump of namespace {ns}\n");
        for (title, args) in sections {
            let _ = writeln!(text, "\n## {title}");
            match kubectl().arg("-n").arg(ns).args(&args).output() {
                Ok(out) => {
                    text.push_str(&String::from_utf8_lossy(&out.stdout));
                    text.push_str(&String::from_utf8_lossy(&out.stderr));
                }
                Err(e) => {
                    let _ = writeln!(text, "(kubectl failed to start: {e})");
                }
            }
        }
        std::fs::write(&path, text)?;
        Ok(path)
    }
}

/// One line on the nodes (Ready condition, taints) and the machine's load average.
fn cluster_health() -> String {
    let nodes = "jsonpath={range .items[*]}{.metadata.name} \
                 ready={.status.conditions[?(@.type==\"Ready\")].status} \
                 taints={.spec.taints[*].key}; {end}";
    let nodes = match kubectl().args(["get", "nodes", "-o", nodes]).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
        Err(e) => format!("kubectl failed to start: {e}"),
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "cluster at the failure: nodes: {} load average: {}",
        nodes.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

impl Drop for TestNs {
    fn drop(&mut self) {
        if std::thread::panicking() {
            match self.dump() {
                Ok(path) => eprintln!("namespace {} kept; dump: {}", self.name, path.display()),
                Err(e) => eprintln!("namespace {} kept; dump failed: {e:#}", self.name),
            }
            // A stalled rollout may be the cluster's fault, not the code's: a node whose lease
            // stopped being renewed is NotReady and tainted unreachable. Say so next to the failure.
            eprintln!("{}", cluster_health());
            return;
        }
        if std::env::var_os("BOUNCER_TEST_KEEP").is_some_and(|v| v == "1") {
            eprintln!("namespace {} kept (BOUNCER_TEST_KEEP=1)", self.name);
            return;
        }
        let out = kubectl()
            .args(["delete", "namespace", &self.name, "--wait=false"])
            .output();
        if let Err(e) = out {
            eprintln!("deleting namespace {}: {e}", self.name);
        }
    }
}
