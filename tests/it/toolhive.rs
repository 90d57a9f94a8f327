//! The real ToolHive operator: v0.44.0, which reverts `restartedAt`, and v0.45.0, the first
//! release that keeps it, reconciling real MCPGroup / VirtualMCPServer / MCPServer resources,
//! bounced with the example policies in `policies/`.
//!
//! The policies are adapted in their namespace and their cooldown only: a production cooldown
//! (hours) counts from the oldest pod's start and would hold back these minutes-old pods, as
//! `scripts/demo` explains. The nightly schedule cannot fire during a test; the policies' memory
//! triggers do, from the memory model's pod annotations.

use bouncer_testkit::PodTemplateExt as _;
use std::collections::BTreeMap;
use std::time::Duration;

use bouncer_testkit::toolhive::{
    apply_runner_statefulset, mcp_group, mcp_server, virtual_mcp_server,
};
use bouncer_testkit::{
    Kind, MEMORY_BASE, TOOLHIVE_FIXED, TOOLHIVE_REVERTING, TestNs, ToolHiveOperator, client,
    create, kubectl, repo_root, wait_pod_memory, wait_pods_ready, wait_rollout_complete,
};
use chrono::{DateTime, Utc};
use kube::Client;
use serde_json::Value;

use crate::harness::{
    Bounced, Policies, audit_all_since, audit_mark, audit_since, audit_time, audited, bouncer,
    bouncer_events, deployment, finish, next_minute, pod_uids, pods, policy, restarted_at_of,
    spawn_bouncer,
};
use crate::revert::{EVERY_MINUTE, assert_one_at_a_time, eviction_answers, evictions};

const READY: Duration = Duration::from_secs(180);
const VMCP: &str = "vmcp-main";
const VMCP_PODS: &str = "app.kubernetes.io/instance=vmcp-main";
const MI: u64 = 1 << 20;

/// `policies/<file>` with its namespace list and cooldown replaced (see the module comment);
/// panics if the file no longer has them, so the test cannot drift from the example silently.
fn example_policy(file: &str, from_ns: &str, ns: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join("policies").join(file))
        .unwrap_or_else(|e| panic!("reading policies/{file}: {e}"));
    let from = format!("namespaces: [{from_ns}]");
    assert!(text.contains(&from), "policies/{file} has no `{from}`");
    let text = text.replace(&from, &format!("namespaces: [{ns}]"));
    let cooldown: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  cooldown: "))
        .collect();
    assert_eq!(cooldown.len(), 1, "policies/{file}: one spec.cooldown");
    text.replace(cooldown[0], "  cooldown: 1s")
}

/// Sets the memory model's base on running pods (the model reads pod annotations on every
/// scrape), without touching the pod template the operator owns.
fn set_pod_memory(ns: &str, pods: &[k8s_openapi::api::core::v1::Pod], base: &str) {
    for p in pods {
        let name = p.metadata.name.as_deref().expect("pod name");
        let out = kubectl()
            .args(["-n", ns, "annotate", "pod", name, "--overwrite"])
            .arg(format!("{MEMORY_BASE}={base}"))
            .output()
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

async fn wait_over(
    client: &Client,
    ns: &str,
    pods: &[k8s_openapi::api::core::v1::Pod],
    bytes: u64,
) {
    for p in pods {
        let name = p.metadata.name.as_deref().expect("pod name");
        wait_pod_memory(client, ns, name, READY, |m| {
            m.is_some_and(|m| m.bytes > bytes)
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    }
}

/// Panics with the operator's log tail when `result` failed.
fn or_log<T>(result: anyhow::Result<T>, operator: &ToolHiveOperator) -> T {
    result.unwrap_or_else(|e| {
        let log = operator.log();
        let tail: Vec<&str> = log.lines().rev().take(25).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!(
            "{e:#}\noperator {} log tail:\n{}",
            operator.version(),
            tail.join("\n")
        )
    })
}

/// An operator of `version` for `ns` and the VirtualMCPServer `vmcp-main` (2 replicas, group
/// `main`), its pods over the vmcp-nightly policy's 1536Mi, and that policy.
async fn vmcp_over_threshold(
    client: &Client,
    ns: &str,
    version: &str,
) -> (ToolHiveOperator, Policies) {
    let (operator, pods) = vmcp(client, ns, version).await;
    set_pod_memory(ns, &pods, "1600Mi");
    wait_over(client, ns, &pods, 1536 * MI).await;
    let policy = example_policy("vmcp-nightly.yaml", "toolhive-system", ns);
    (operator, Policies::new(&[("vmcp-nightly.yaml", &policy)]))
}

/// An operator of `version` for `ns` and the VirtualMCPServer `vmcp-main` (2 replicas, group
/// `main`) it reconciles, with its ready pods.
async fn vmcp(
    client: &Client,
    ns: &str,
    version: &str,
) -> (ToolHiveOperator, Vec<k8s_openapi::api::core::v1::Pod>) {
    let operator = ToolHiveOperator::start(version, ns)
        .await
        .unwrap_or_else(|e| panic!("operator {version}: {e:#}"));
    or_log(mcp_group(client, ns, "main").await, &operator);
    or_log(
        virtual_mcp_server(client, ns, VMCP, "main", 2).await,
        &operator,
    );
    let ready = wait_rollout_complete(client, Kind::Deployment, ns, VMCP, READY).await;
    or_log(ready, &operator);
    let pods = or_log(
        wait_pods_ready(client, ns, VMCP_PODS, 2, READY).await,
        &operator,
    );
    (operator, pods)
}

/// Field managers other than bouncer and kube-controller-manager that own part of the
/// Deployment's pod-template annotations, read from its managedFields.
async fn template_annotation_owners(client: &Client, ns: &str, name: &str) -> Vec<String> {
    let d = deployment(client, ns, name).await;
    let mut owners: Vec<String> = d
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| {
            let f = e.fields_v1.as_ref().map(|f| &f.0);
            f.and_then(|f| f.pointer("/f:spec/f:template/f:metadata/f:annotations"))
                .is_some()
        })
        .filter_map(|e| e.manager.clone())
        .filter(|m| m != "bouncer" && m != "kube-controller-manager")
        .collect();
    owners.sort();
    owners.dedup();
    owners
}

/// The one operator that reverted `name`'s restart, read from managedFields (never assumed), after
/// checking that bouncer's one BounceReverted Event names it; with that Event.
async fn reverter(
    client: &Client,
    ns: &str,
    name: &str,
) -> (String, k8s_openapi::api::events::v1::Event) {
    let owners = template_annotation_owners(client, ns, name).await;
    assert_eq!(
        owners.len(),
        1,
        "one operator owns the template annotations: {owners:?}"
    );
    let manager = owners.into_iter().next().unwrap();
    let mut events = bouncer_events(client, ns, name, "BounceReverted").await;
    assert_eq!(events.len(), 1, "one BounceReverted Event");
    let event = events.remove(0);
    assert!(
        event.note.as_deref().unwrap().contains(manager.as_str()),
        "the Event names {manager}: {:?}",
        event.note
    );
    (manager, event)
}

/// How long after bouncer's patch of deployment `name` another client (not a built-in
/// controller) wrote it, from the audit log: (milliseconds, user agent).
fn rewrite_after_patch(mark: u64, ns: &str, name: &str) -> Option<(i64, String)> {
    let log = audit_all_since(mark);
    let writes: Vec<&Value> = audited(&log, "patch", "deployments", ns)
        .into_iter()
        .chain(audited(&log, "update", "deployments", ns))
        .filter(|e| e["objectRef"]["name"] == name)
        .collect();
    let is_bouncer = |e: &Value| {
        e["userAgent"]
            .as_str()
            .is_some_and(|u| u.starts_with("bouncer/"))
    };
    let patched: DateTime<Utc> = writes
        .iter()
        .filter(|e| is_bouncer(e))
        .map(|e| audit_time(e))
        .min()?;
    writes
        .iter()
        .filter(|e| !is_bouncer(e))
        .filter(|e| {
            !e["userAgent"]
                .as_str()
                .unwrap_or_default()
                .starts_with("kube-controller-manager")
        })
        .map(|e| {
            (
                audit_time(e),
                e["userAgent"].as_str().unwrap_or_default().to_string(),
            )
        })
        .filter(|(t, _)| *t >= patched)
        .min()
        .map(|(t, ua)| ((t - patched).num_milliseconds(), ua))
}

fn report(run: &Bounced) -> String {
    format!("stderr: {}\nreport: {:#}", run.stderr, run.report)
}

/// `bouncer run` that also writes the table report, printed for the real examples in
/// docs/toolhive.md.
async fn run_with_table(policies: &Policies, ns: &str, title: &str) -> Bounced {
    let dir = tempfile::tempdir().expect("temp dir");
    let table = dir.path().join("report.txt");
    let path = table.to_string_lossy().to_string();
    let run = bouncer(&["run", "--report", &path], policies, ns).await;
    let text = std::fs::read_to_string(&table).unwrap_or_default();
    eprintln!("{title}: table report\n{text}");
    run
}

/// ToolHive v0.44.0: the vMCP's bounce is reverted by the operator, which the report and the
/// BounceReverted Event name as found in managedFields; `onRevert: evict` then replaces both
/// pods, one at a time.
#[tokio::test]
async fn toolhive_v0_44_reverts_the_vmcp_bounce_and_bouncer_evicts() {
    let client = client().await;
    let ns = TestNs::new(&client, "th-revert").await;
    let n = ns.name();
    let (mut operator, policies) = vmcp_over_threshold(&client, n, TOOLHIVE_REVERTING).await;
    let before = pod_uids(&client, n, VMCP_PODS).await;
    let mark = audit_mark();

    let run = run_with_table(&policies, n, TOOLHIVE_REVERTING).await;
    assert_eq!(run.code, 0, "{}", report(&run));
    assert_eq!(
        run.queue(),
        [(VMCP.to_string(), "revertedEvicted".to_string())],
        "{}",
        report(&run)
    );
    assert!(operator.is_running(), "the operator survived");
    let (manager, _) = reverter(&client, n, VMCP).await;
    let row = run.row(VMCP);
    assert!(
        row["reason"].as_str().unwrap().contains(manager.as_str()),
        "the report names {manager}: {row:#}"
    );
    assert_eq!(
        restarted_at_of(&client, n, VMCP).await,
        None,
        "the revert stands"
    );
    let after = wait_pods_ready(&client, n, VMCP_PODS, 2, READY)
        .await
        .unwrap();
    for p in &after {
        assert!(
            !before.contains(p.metadata.uid.as_ref().unwrap()),
            "pod {:?} survived",
            p.metadata.name
        );
    }
    let evicted = evictions(mark, n);
    assert_eq!(evicted.len(), 2, "{evicted:?}");
    assert_ne!(evicted[0].0, evicted[1].0, "two different pods evicted");
    assert_one_at_a_time(&evicted, &after);
    let (ms, agent) =
        rewrite_after_patch(mark, n, VMCP).expect("the operator rewrote the Deployment");
    eprintln!(
        "toolhive {TOOLHIVE_REVERTING}: field manager {manager}; reverted {ms} ms after the patch \
         (user agent {agent}); bounce {}s: {}",
        row["durationSeconds"], row["reason"]
    );
}

/// ToolHive v0.45.0 keeps `restartedAt`: the same bounce sticks and is verified, with one patch.
#[tokio::test]
async fn toolhive_v0_45_keeps_the_vmcp_bounce() {
    let client = client().await;
    let ns = TestNs::new(&client, "th-fixed").await;
    let n = ns.name();
    let (mut operator, policies) = vmcp_over_threshold(&client, n, TOOLHIVE_FIXED).await;
    let before = pod_uids(&client, n, VMCP_PODS).await;
    let mark = audit_mark();

    let run = run_with_table(&policies, n, TOOLHIVE_FIXED).await;
    assert_eq!(run.code, 0, "{}", report(&run));
    assert_eq!(run.bounced(), [VMCP], "{}", report(&run));
    assert!(operator.is_running(), "the operator survived");
    let row = run.row(VMCP);
    assert!(
        row["verification"]
            .as_str()
            .unwrap()
            .starts_with("restartedAt intact, 2/2 pods new"),
        "{row:#}"
    );
    assert_eq!(
        restarted_at_of(&client, n, VMCP).await.as_deref(),
        row["patchedAt"].as_str()
    );
    let after = pod_uids(&client, n, VMCP_PODS).await;
    assert!(
        after.iter().all(|u| !before.contains(u)),
        "{before:?} -> {after:?}"
    );
    assert_eq!(bouncer_events(&client, n, VMCP, "Bounced").await.len(), 1);
    assert!(
        bouncer_events(&client, n, VMCP, "BounceReverted")
            .await
            .is_empty()
    );
    let log = audit_since(mark);
    assert_eq!(
        audited(&log, "patch", "deployments", n).len(),
        1,
        "exactly one patch"
    );
    assert!(evictions(mark, n).is_empty(), "nothing evicted");
    eprintln!(
        "toolhive {TOOLHIVE_FIXED}: bounce verified in {}s; operator write after the patch: {:?}",
        row["durationSeconds"],
        rewrite_after_patch(mark, n, VMCP)
    );
}

fn row_of<'a>(run: &'a Bounced, kind: &str, name: &str) -> &'a Value {
    run.rows()
        .into_iter()
        .find(|r| r["workload"]["kind"] == kind && r["workload"]["name"] == name)
        .unwrap_or_else(|| panic!("no row for {kind} {name}: {}", report(run)))
}

/// Two MCPServers of the real operator, `fetch` and `github`, each a proxy Deployment (the
/// operator's) and a backend StatefulSet (as its runner applies it); `backend` goes on the
/// StatefulSets' pods. The fetch proxy is modelled at 470Mi of its 512Mi limit (92%, over the
/// policy's 85%), everything else at 40Mi. Returns the operator (kept running) and the proxy's
/// pods once metrics-server reports them over the threshold.
async fn two_mcp_servers(
    client: &Client,
    n: &str,
    backend: &BTreeMap<String, String>,
) -> ToolHiveOperator {
    let operator = ToolHiveOperator::start(TOOLHIVE_FIXED, n)
        .await
        .unwrap_or_else(|e| panic!("operator: {e:#}"));
    or_log(mcp_group(client, n, "tools").await, &operator);
    let base = |q: &str| BTreeMap::from([(MEMORY_BASE.to_string(), q.to_string())]);
    or_log(
        mcp_server(client, n, "fetch", "tools", &base("470Mi")).await,
        &operator,
    );
    or_log(
        mcp_server(client, n, "github", "tools", &base("40Mi")).await,
        &operator,
    );
    let mut annotations = base("40Mi");
    annotations.extend(backend.clone());
    for name in ["fetch", "github"] {
        let sts = apply_runner_statefulset(client, n, name, &annotations, "512Mi").await;
        or_log(sts, &operator);
    }
    for (kind, name) in [
        (Kind::Deployment, "fetch"),
        (Kind::Deployment, "github"),
        (Kind::StatefulSet, "fetch"),
        (Kind::StatefulSet, "github"),
    ] {
        or_log(
            wait_rollout_complete(client, kind, n, name, READY).await,
            &operator,
        );
    }
    let proxy = or_log(
        wait_pods_ready(client, n, PROXY_PODS, 1, READY).await,
        &operator,
    );
    let labels = proxy[0].metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        (
            labels.get("toolhive").map(String::as_str),
            labels.get("app.kubernetes.io/name").map(String::as_str)
        ),
        (Some("true"), Some("mcpserver")),
        "the operator labels the proxy pods: {labels:?}"
    );
    wait_over(client, n, &proxy, 512 * MI * 85 / 100).await;
    operator
}

/// fetch's proxy pods (the operator's labels) and backend pods (the runner's).
const PROXY_PODS: &str = "app.kubernetes.io/instance=fetch,toolhive-name=fetch";
const BACKEND_PODS: &str = "toolhive-basename=fetch";

/// The mcp-servers-memory policy selects an MCPServer's proxy pods by the labels the operator
/// puts on them (`toolhive`, `toolhive-name`) and the backend StatefulSet's by the runner's, and
/// restarts the MCP server whose proxy is over 85% of its limit as one group: the backend
/// StatefulSet first, then the proxy Deployment, which then connects to the new backend.
#[tokio::test]
async fn toolhive_mcp_server_bounced_on_memory_as_one_group_backend_first() {
    let client = client().await;
    let ns = TestNs::new(&client, "th-memory").await;
    let n = ns.name();
    let _operator = two_mcp_servers(&client, n, &BTreeMap::new()).await;
    let policy = example_policy("mcp-servers-memory.yaml", "toolhive", n);
    let policies = Policies::new(&[("mcp-servers-memory.yaml", &policy)]);
    let proxy_before = pod_uids(&client, n, PROXY_PODS).await;
    let backend_before = pod_uids(&client, n, BACKEND_PODS).await;

    let run = run_with_table(&policies, n, "MCPServer group").await;
    assert_eq!(run.code, 0, "{}", report(&run));
    let queue: Vec<(&str, &str, &str)> = run
        .rows()
        .into_iter()
        .filter(|r| !r["order"].is_null())
        .map(|r| {
            (
                r["workload"]["kind"].as_str().unwrap_or_default(),
                r["workload"]["name"].as_str().unwrap_or_default(),
                r["decision"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        queue,
        [
            ("StatefulSet", "fetch", "bounced"),
            ("Deployment", "fetch", "bounced")
        ],
        "{}",
        report(&run)
    );
    let backend = row_of(&run, "StatefulSet", "fetch");
    let proxy = row_of(&run, "Deployment", "fetch");
    assert_eq!(backend["triggers"][0]["type"], "group", "{backend:#}");
    assert_eq!(proxy["triggers"][0]["type"], "memory", "{proxy:#}");
    for row in [backend, proxy] {
        assert_eq!(row["group"], "toolhive-name=fetch", "{row:#}");
    }
    // One after the other: the proxy is patched only once the backend's rollout completed.
    let completed = time_of(backend, "completedAt");
    assert!(
        completed <= time_of(proxy, "patchedAt"),
        "{backend:#} {proxy:#}"
    );
    for kind in ["Deployment", "StatefulSet"] {
        let row = row_of(&run, kind, "github");
        assert_eq!(row["decision"], "skip", "{kind} github is not due: {row:#}");
        assert_eq!(row["reasonCode"], "notDue", "{row:#}");
        assert_eq!(row["group"], "toolhive-name=github", "{row:#}");
    }
    for (pods, before) in [(PROXY_PODS, proxy_before), (BACKEND_PODS, backend_before)] {
        let after = pod_uids(&client, n, pods).await;
        assert!(
            after.iter().all(|u| !before.contains(u)),
            "{pods}: {before:?} -> {after:?}"
        );
    }
    eprintln!(
        "toolhive {TOOLHIVE_FIXED}: MCPServer restarted as one group: backend in {}s, then proxy in {}s",
        backend["durationSeconds"], proxy["durationSeconds"]
    );
}

/// A group is halted as a whole: when its backend's rollout fails (its new pod starts slower
/// than the policy's timeout), the proxy is not restarted, and the report says why.
#[tokio::test]
async fn toolhive_mcp_server_group_is_halted_when_its_backend_fails() {
    let client = client().await;
    let ns = TestNs::new(&client, "th-group-fail").await;
    let n = ns.name();
    let slow = BTreeMap::from([(
        "bouncer.dev/test-start-delay".to_string(),
        "20s".to_string(),
    )]);
    let _operator = two_mcp_servers(&client, n, &slow).await;
    let policy = example_policy("mcp-servers-memory.yaml", "toolhive", n);
    let evict = "  restart: {onRevert: evict}\n";
    assert!(
        policy.contains(evict),
        "policies/mcp-servers-memory.yaml: {evict}"
    );
    let policy = policy.replace(evict, "  restart: {onRevert: evict, timeout: 5s}\n");
    let policies = Policies::new(&[("mcp-servers-memory.yaml", &policy)]);
    let proxy_before = pod_uids(&client, n, PROXY_PODS).await;

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 1, "{}", report(&run));
    let backend = row_of(&run, "StatefulSet", "fetch");
    let proxy = row_of(&run, "Deployment", "fetch");
    assert_eq!(backend["decision"], "failed", "{backend:#}");
    assert_eq!(backend["reasonCode"], "rolloutTimedOut", "{backend:#}");
    assert_eq!(proxy["decision"], "notAttempted", "{proxy:#}");
    assert!(proxy["patchedAt"].is_null(), "{proxy:#}");
    assert_eq!(pod_uids(&client, n, PROXY_PODS).await, proxy_before);
    assert_eq!(
        restarted_at_of(&client, n, "fetch").await,
        None,
        "the proxy Deployment was not patched"
    );
}

fn time_of(row: &Value, field: &str) -> DateTime<Utc> {
    row[field]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no {field}: {row:#}"))
}

const CR_RESTARTED_AT: &str = "mcpserver.toolhive.stacklok.dev/restarted-at";
const CR_PROCESSED: &str = "mcpserver.toolhive.stacklok.dev/last-processed-restart";
const CR_STRATEGY: &str = "mcpserver.toolhive.stacklok.dev/restart-strategy";

/// A policy that restarts fetch's proxy through its MCPServer (`restart.method: toolhive`) once
/// it is over 85% of its memory limit, each bounce within `timeout`.
fn toolhive_method_policy(ns: &str, timeout: &str) -> String {
    format!(
        r#"apiVersion: bouncer.dev/v1alpha1
kind: BouncePolicy
metadata: {{name: mcp-proxy-toolhive}}
spec:
  target:
    namespaces: [{ns}]
    selector: {{matchLabels: {{app.kubernetes.io/name: mcpserver, toolhive-name: fetch}}}}
    kinds: [Deployment]
  triggers: {{memory: {{percentOfLimit: 85}}}}
  cooldown: 1s
  # The proxy runs one replica: evicting it after a revert is allowed downtime.
  allowDowntime: true
  restart: {{method: toolhive, onRevert: evict, timeout: {timeout}}}
"#
    )
}

/// The operator of `version` with the MCPServer fetch (its backend StatefulSet applied as the
/// runner would), its proxy modelled at 470Mi of its 512Mi limit and reported so.
async fn mcp_server_over_threshold(client: &Client, n: &str, version: &str) -> ToolHiveOperator {
    let operator = ToolHiveOperator::start(version, n)
        .await
        .unwrap_or_else(|e| panic!("operator {version}: {e:#}"));
    or_log(mcp_group(client, n, "tools").await, &operator);
    let base = |q: &str| BTreeMap::from([(MEMORY_BASE.to_string(), q.to_string())]);
    or_log(
        mcp_server(client, n, "fetch", "tools", &base("470Mi")).await,
        &operator,
    );
    // v0.45.0 restarts a proxy whose backend StatefulSet is missing: create it first.
    let sts = apply_runner_statefulset(client, n, "fetch", &base("40Mi"), "512Mi").await;
    or_log(sts, &operator);
    for kind in [Kind::Deployment, Kind::StatefulSet] {
        let done = wait_rollout_complete(client, kind, n, "fetch", READY).await;
        or_log(done, &operator);
    }
    let proxy = or_log(
        wait_pods_ready(client, n, PROXY_PODS, 1, READY).await,
        &operator,
    );
    wait_over(client, n, &proxy, 512 * MI * 85 / 100).await;
    operator
}

fn annotate_mcp_server(ns: &str, annotation: &str) {
    let out = kubectl()
        .args(["-n", ns, "annotate", "--overwrite"])
        .args(["mcpserver.toolhive.stacklok.dev", "fetch", annotation])
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn mcp_server_annotations(client: &Client, ns: &str, op: &ToolHiveOperator) -> Value {
    let cr = bouncer_testkit::toolhive::get_resource(client, ns, "MCPServer", "fetch").await;
    or_log(cr, op)["metadata"]["annotations"].clone()
}

/// `restart.method: toolhive` on the fixed release: bouncer asks the MCPServer for a rolling
/// restart, the operator rolls its proxy Deployment, and bouncer verifies that rollout by the
/// operator's own annotation; bouncer never writes the pod template. An MCPServer that asks
/// for the `immediate` strategy (the operator deletes every pod at once) is not asked at all,
/// and a request the operator does not act on within the timeout is withdrawn.
#[tokio::test]
async fn toolhive_v0_45_restarts_an_mcp_server_through_its_resource() {
    let client = client().await;
    let ns = TestNs::new(&client, "th-method").await;
    let n = ns.name();
    let mut operator = mcp_server_over_threshold(&client, n, TOOLHIVE_FIXED).await;
    let policy = toolhive_method_policy(n, "2m");
    let policies = Policies::new(&[("mcp-proxy-toolhive.yaml", &policy)]);
    let before = pod_uids(&client, n, PROXY_PODS).await;

    annotate_mcp_server(n, &format!("{CR_STRATEGY}=immediate"));
    let refused = bouncer(&["run"], &policies, n).await;
    assert_eq!(refused.code, 0, "{}", report(&refused));
    let row = refused.row("fetch");
    assert_eq!(row["decision"], "skipped", "{row:#}");
    assert_eq!(row["reasonCode"], "restartStrategy", "{row:#}");
    let annotations = mcp_server_annotations(&client, n, &operator).await;
    assert!(annotations[CR_RESTARTED_AT].is_null(), "{annotations:#}");
    assert_eq!(pod_uids(&client, n, PROXY_PODS).await, before);
    annotate_mcp_server(n, &format!("{CR_STRATEGY}-"));

    // No operator to act on the request: the bounce fails within its timeout and takes the
    // request back, so the server is not restarted later, unobserved.
    operator.pause();
    let short = toolhive_method_policy(n, "5s");
    let unanswered = bouncer(
        &["run"],
        &Policies::new(&[("mcp-proxy-toolhive.yaml", &short)]),
        n,
    )
    .await;
    assert_eq!(unanswered.code, 1, "{}", report(&unanswered));
    let row = unanswered.row("fetch");
    assert_eq!(row["reasonCode"], "operatorNoRestart", "{row:#}");
    assert!(
        row["reason"]
            .as_str()
            .unwrap()
            .ends_with("the restart request was withdrawn"),
        "{row:#}"
    );
    let annotations = mcp_server_annotations(&client, n, &operator).await;
    assert!(annotations[CR_RESTARTED_AT].is_null(), "{annotations:#}");
    assert_eq!(pod_uids(&client, n, PROXY_PODS).await, before);

    // Stopped (SIGTERM) while it waits for the operator: the request is withdrawn all the same,
    // so no operator acts on it later, with whatever strategy the resource has by then. (First
    // the backoff after the failed bounce: twice the 1 s cooldown.)
    tokio::time::sleep(Duration::from_secs(3)).await;
    let running = spawn_bouncer(&["run"], &policies, n, &[]);
    let asked = tokio::time::timeout(READY, async {
        loop {
            if mcp_server_annotations(&client, n, &operator).await[CR_RESTARTED_AT].is_string() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        asked.is_ok(),
        "bouncer never asked the MCPServer for a restart"
    );
    let pid = running.id().expect("bouncer is running").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(killed.success(), "kill -TERM {pid}");
    let stopped = finish(running).await;
    assert_eq!(stopped.code, 1, "{}", report(&stopped));
    assert_eq!(
        stopped.row("fetch")["decision"],
        "interrupted",
        "{}",
        report(&stopped)
    );
    let annotations = mcp_server_annotations(&client, n, &operator).await;
    assert!(
        annotations[CR_RESTARTED_AT].is_null(),
        "withdrawn: {annotations:#}"
    );
    assert_eq!(pod_uids(&client, n, PROXY_PODS).await, before);

    let resumed = operator.resume().await;
    or_log(resumed, &operator);
    // The interrupted attempt's 1 s cooldown.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mark = audit_mark();
    let run = run_with_table(&policies, n, "restart.method: toolhive, v0.45.0").await;
    assert_eq!(run.code, 0, "{}", report(&run));
    assert_eq!(run.bounced(), ["fetch"], "{}", report(&run));
    let row = run.row("fetch");
    assert_eq!(row["method"], "toolhive", "{row:#}");
    assert!(
        row["verification"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{CR_RESTARTED_AT} intact, 1/1 pods new")),
        "{row:#}"
    );
    // The operator acted on bouncer's request and marked it processed.
    let annotations = mcp_server_annotations(&client, n, &operator).await;
    assert!(annotations[CR_RESTARTED_AT].is_string(), "{annotations:#}");
    assert_eq!(
        annotations[CR_RESTARTED_AT], annotations[CR_PROCESSED],
        "{annotations:#}"
    );
    let template = deployment(&client, n, "fetch").await;
    assert!(template.template_annotation(CR_RESTARTED_AT).is_some());
    assert_eq!(
        restarted_at_of(&client, n, "fetch").await,
        None,
        "bouncer did not write the pod template"
    );
    let after = pod_uids(&client, n, PROXY_PODS).await;
    assert!(
        after.iter().all(|u| !before.contains(u)),
        "{before:?} -> {after:?}"
    );
    assert_eq!(
        bouncer_events(&client, n, "fetch", "Bounced").await.len(),
        1
    );
    let log = audit_since(mark);
    assert_eq!(
        audited(&log, "patch", "mcpservers", n).len(),
        1,
        "one request"
    );
    // The attempt mark on the Deployment's metadata, before the request and with the
    // outcome after it; the pod template is the operator's alone (restartedAt above).
    assert_eq!(audited(&log, "patch", "deployments", n).len(), 2);
    assert!(evictions(mark, n).is_empty(), "nothing evicted");
    eprintln!(
        "toolhive {TOOLHIVE_FIXED}: restart through the MCPServer verified in {}s",
        row["durationSeconds"]
    );
}

/// Fault 1 at `request`: a run SIGKILLed right after asking the MCPServer for a restart
/// (`BOUNCER_TEST_HALT_AT=request`), with the operator paused, leaves a request nobody follows.
/// The next run, past the bounce's timeout, withdraws it before any bounce (`requestLeft`, a
/// Warning Event), so the operator, once back, does not restart the server unobserved; the
/// run after that bounces it, verified.
#[tokio::test]
async fn toolhive_a_request_a_killed_run_left_is_withdrawn_by_the_next_run() {
    let client = client().await;
    let ns = TestNs::new(&client, "th-left").await;
    let n = ns.name();
    let mut operator = mcp_server_over_threshold(&client, n, TOOLHIVE_FIXED).await;
    let policy = toolhive_method_policy(n, "20s");
    let policies = Policies::new(&[("mcp-proxy-toolhive.yaml", &policy)]);
    let before = pod_uids(&client, n, PROXY_PODS).await;
    operator.pause();
    crate::faults::killed_at("request", &policies, n).await;
    let asked = mcp_server_annotations(&client, n, &operator).await;
    assert!(asked[CR_RESTARTED_AT].is_string(), "{asked:#}");

    // The dead run's Lease (30 s) outlasts the 20 s timeout: the next run takes it over with
    // the request left behind.
    let mark = audit_mark();
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}", report(&run));
    let row = run.row("fetch");
    assert_eq!(row["reasonCode"], "requestLeft", "{row:#}");
    let annotations = mcp_server_annotations(&client, n, &operator).await;
    assert!(
        annotations[CR_RESTARTED_AT].is_null(),
        "withdrawn: {annotations:#}"
    );
    let log = audit_since(mark);
    assert_eq!(
        audited(&log, "patch", "mcpservers", n).len(),
        1,
        "one withdrawal, no new request"
    );
    let events = bouncer_events(&client, n, "fetch", "BounceRequestWithdrawn").await;
    assert_eq!(events.len(), 1, "one BounceRequestWithdrawn Event");
    assert!(
        events[0]
            .note
            .as_deref()
            .is_some_and(|note| note.contains(asked[CR_RESTARTED_AT].as_str().unwrap())),
        "the Event names the request: {:?}",
        events[0].note
    );

    // Back, the operator finds nothing to act on; the interrupted attempt's backoff (twice
    // the 1 s cooldown) passes, and the next run asks anew and follows the restart through.
    let resumed = operator.resume().await;
    or_log(resumed, &operator);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        pod_uids(&client, n, PROXY_PODS).await,
        before,
        "the withdrawn request restarted nothing"
    );
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}", report(&run));
    assert_eq!(run.bounced(), ["fetch"], "{}", report(&run));
    let after = pod_uids(&client, n, PROXY_PODS).await;
    assert!(
        after.iter().all(|u| !before.contains(u)),
        "{before:?} -> {after:?}"
    );
}

/// v0.44.0 undoes its own MCPServer restart like kubectl's: the template annotation it writes is
/// removed by its next reconcile (`maps.Equal`) before the rollout completes. bouncer sees the
/// operator's restart vanish, names the operator, and evicts the proxy's pod instead.
#[tokio::test]
async fn toolhive_v0_44_undoes_its_own_restart_and_bouncer_evicts() {
    let client = client().await;
    let ns = TestNs::new(&client, "th-method-old").await;
    let n = ns.name();
    let operator = mcp_server_over_threshold(&client, n, TOOLHIVE_REVERTING).await;
    let policy = toolhive_method_policy(n, "2m");
    let policies = Policies::new(&[("mcp-proxy-toolhive.yaml", &policy)]);
    let (before, before_names): (Vec<String>, Vec<String>) = pods(&client, n, PROXY_PODS)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.uid.zip(p.metadata.name))
        .unzip();
    let mark = audit_mark();

    let run = run_with_table(&policies, n, "restart.method: toolhive, v0.44.0").await;
    assert_eq!(run.code, 0, "{}", report(&run));
    assert_eq!(
        run.queue(),
        [("fetch".to_string(), "revertedEvicted".to_string())],
        "{}",
        report(&run)
    );
    let row = run.row("fetch");
    assert_eq!(row["method"], "toolhive", "{row:#}");
    let (manager, _) = reverter(&client, n, "fetch").await;
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("{CR_RESTARTED_AT} was reverted by {manager}")),
        "{row:#}"
    );
    let annotations = mcp_server_annotations(&client, n, &operator).await;
    assert_eq!(
        annotations[CR_RESTARTED_AT], annotations[CR_PROCESSED],
        "the operator processed the request: {annotations:#}"
    );
    let template = deployment(&client, n, "fetch").await;
    assert_eq!(template.template_annotation(CR_RESTARTED_AT), None);
    let after = pod_uids(&client, n, PROXY_PODS).await;
    assert!(
        after.iter().all(|u| !before.contains(u)),
        "{before:?} -> {after:?}"
    );
    // The proxy's one pod is replaced once: evicted by bouncer or, when the Deployment's
    // roll back to the reverted template already took it, deleted by that roll (bouncer
    // then finds no old pod left to evict).
    let evicted = evictions(mark, n);
    let all = audit_all_since(mark);
    let rolled: Vec<&str> = audited(&all, "delete", "pods", n)
        .into_iter()
        // The ReplicaSet controller's request, not KWOK's final delete of an evicted pod.
        .filter(|e| {
            e["userAgent"]
                .as_str()
                .is_some_and(|ua| ua.starts_with("kube-controller-manager/"))
        })
        .filter_map(|e| e["objectRef"]["name"].as_str())
        .filter(|name| before_names.iter().any(|b| b == name))
        .collect();
    assert_eq!(
        evicted.len() + rolled.len(),
        1,
        "evicted {evicted:?}, deleted by the roll back {rolled:?}"
    );
    eprintln!(
        "toolhive {TOOLHIVE_REVERTING}: restart through the MCPServer reverted by {manager}; {}s: {reason}",
        row["durationSeconds"]
    );
}

/// v0.44.0 with `onRevert: fail`: the revert of the vMCP's bounce is detected, the operator named
/// (from managedFields) in the report and a BounceReverted Event, and the run halts before the
/// next workload, a plain Deployment the same policy selects (less over its threshold, so it
/// queues second), which is left untouched.
#[tokio::test]
async fn toolhive_v0_44_revert_with_on_revert_fail_halts_the_run() {
    let client = client().await;
    let ns = TestNs::new(&client, "th-revert-fail").await;
    let n = ns.name();
    let (operator, pods) = vmcp(&client, n, TOOLHIVE_REVERTING).await;
    set_pod_memory(n, &pods, "1600Mi");
    let labels = [
        ("app.kubernetes.io/name", "virtualmcpserver"),
        ("app.kubernetes.io/instance", "plain"),
    ];
    let plain = bouncer_testkit::deployment("plain", 1, &labels).with_memory("1560Mi", "0");
    or_log(create(&client, n, &plain).await.map(drop), &operator);
    let ready = wait_rollout_complete(&client, Kind::Deployment, n, "plain", READY).await;
    or_log(ready, &operator);
    let plain_selector = "app.kubernetes.io/instance=plain";
    let plain_ready = wait_pods_ready(&client, n, plain_selector, 1, READY).await;
    let plain_ready = or_log(plain_ready, &operator);
    wait_over(&client, n, &pods, 1536 * MI).await;
    wait_over(&client, n, &plain_ready, 1536 * MI).await;
    let extra =
        "  triggers: {memory: {above: 1536Mi}}\n  cooldown: 1s\n  restart: {onRevert: fail}\n";
    let selector = "{app.kubernetes.io/name: virtualmcpserver}";
    let policies = Policies::new(&[("p.yaml", &policy("vmcp", n, selector, extra))]);
    let plain_pods = pod_uids(&client, n, plain_selector).await;

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 1, "{}", report(&run));
    assert_eq!(
        run.queue(),
        [
            (VMCP.to_string(), "reverted".to_string()),
            ("plain".to_string(), "notAttempted".to_string())
        ],
        "{}",
        report(&run)
    );
    let (manager, event) = reverter(&client, n, VMCP).await;
    let row = run.row(VMCP);
    for field in ["reason", "verification"] {
        assert!(
            row[field].as_str().unwrap().contains(manager.as_str()),
            "{field} names the reverter {manager}: {row:#}"
        );
    }
    assert_eq!(
        restarted_at_of(&client, n, VMCP).await,
        None,
        "the revert stands"
    );
    assert_eq!(
        event.regarding.as_ref().unwrap().kind.as_deref(),
        Some("Deployment")
    );
    assert_eq!(
        restarted_at_of(&client, n, "plain").await,
        None,
        "plain was not patched"
    );
    assert_eq!(pod_uids(&client, n, plain_selector).await, plain_pods);
}

/// The eviction after v0.44.0's revert passes the gates of an eviction bounce: under a
/// PodDisruptionBudget that allows no disruption the row is `reverted` and nothing is evicted
/// (no eviction is even asked); once the budget allows one, the next fire's revert is followed
/// by the vMCP's pods going one at a time.
#[tokio::test]
async fn toolhive_v0_44_evictions_after_a_revert_respect_the_disruption_budget() {
    let client = client().await;
    let ns = TestNs::new(&client, "th-pdb").await;
    let n = ns.name();
    let (_operator, _) = vmcp(&client, n, TOOLHIVE_REVERTING).await;
    let pdb = |min: i32| {
        format!(
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: vmcp, namespace: {n}}}\n\
             spec: {{minAvailable: {min}, selector: {{matchLabels: {{app.kubernetes.io/instance: {VMCP}}}}}}}\n"
        )
    };
    crate::harness::apply(&pdb(2));
    let with_timeout = |t: &str| {
        let extra = format!("{EVERY_MINUTE}  restart: {{onRevert: evict, timeout: {t}}}\n");
        let selector = format!("{{app.kubernetes.io/instance: {VMCP}}}");
        Policies::new(&[("p.yaml", &policy("vmcp", n, &selector, &extra))])
    };
    next_minute(Duration::from_secs(1)).await;
    let before = pod_uids(&client, n, VMCP_PODS).await;
    let mark = audit_mark();

    let blocked = bouncer(&["run"], &with_timeout("60s"), n).await;
    assert_eq!(blocked.code, 1, "{}", report(&blocked));
    let row = blocked.row(VMCP);
    assert_eq!(row["decision"], "reverted", "{row:#}");
    let verification = row["verification"].as_str().unwrap();
    assert!(
        verification.contains("nothing evicted") && verification.contains("vmcp"),
        "{verification}"
    );
    assert!(
        eviction_answers(mark, n).is_empty(),
        "an eviction was asked"
    );
    assert_eq!(
        bouncer_events(&client, n, VMCP, "BounceReverted")
            .await
            .len(),
        1
    );

    // The budget allows one disruption now: the next fire's revert is followed by evictions.
    crate::harness::apply(&pdb(1));
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();
    let run = bouncer(&["run"], &with_timeout("3m"), n).await;
    assert_eq!(run.code, 0, "{}", report(&run));
    assert_eq!(
        run.row(VMCP)["decision"],
        "revertedEvicted",
        "{}",
        report(&run)
    );
    let after = wait_pods_ready(&client, n, VMCP_PODS, 2, READY)
        .await
        .unwrap();
    assert!(
        after
            .iter()
            .all(|p| !before.contains(p.metadata.uid.as_ref().unwrap())),
        "every pod replaced"
    );
    let answers = eviction_answers(mark, n);
    assert!(
        answers.iter().all(|(_, code)| *code == 429 || *code < 300),
        "{answers:?}"
    );
    assert_one_at_a_time(&evictions(mark, n), &after);
}
