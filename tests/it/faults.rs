//! Faults around a run: SIGTERM mid-wait, two runs at once, a stale lock, metrics.k8s.io
//! forbidden or down (metrics-server stopped), and the API server restarting while bouncer waits
//! on a rollout.

use std::time::{Duration, Instant};

use bouncer_testkit::{PodTemplateExt, TestNs, client, deployment, kubectl, wait_pod_memory};
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::harness::{
    EVERY_MINUTE, Policies, apply, audit_mark, bouncer, bouncer_env, deploy, every_minute, finish,
    keep_patching, kubectl_ok, micro, next_minute, node_ready, patches_of, pod_uids, pods, policy,
    restarted_at_of, spawn_bouncer, stuck_on_restart, time, wait_restarted_at, written_by,
};

const READY: Duration = Duration::from_secs(180);

async fn lease(client: &Client, ns: &str) -> Lease {
    Api::<Lease>::namespaced(client.clone(), ns)
        .get("bouncer")
        .await
        .expect("the lease exists")
}

/// SIGTERM while bouncer waits on a rollout that cannot finish: it stops waiting at once, reports
/// the bounce as interrupted, exits 1 and releases the lock; the next run leaves the workload
/// alone for its cooldown instead of bouncing it again.
#[tokio::test]
async fn sigterm_interrupts_the_wait_and_the_next_run_respects_the_cooldown() {
    let client = client().await;
    let ns = TestNs::new(&client, "sigterm").await;
    let n = ns.name();
    deploy(
        &client,
        n,
        stuck_on_restart(&client, "stuck", &[("app", "stuck")]).await,
    )
    .await;
    let extra =
        "  triggers:\n    schedule: {cron: \"* * * * *\", startingDeadline: 5m}\n  cooldown: 1m\n";
    let policies = Policies::new(&[("p.yaml", &policy("killed", n, "{app: stuck}", extra))]);
    // Due and out of its cooldown once the pods are a minute old (a fire passed since they started).
    let oldest = pods(&client, n, "app=stuck")
        .await
        .iter()
        .filter_map(|p| p.status.as_ref()?.start_time.as_ref().map(time))
        .min();
    let ready_at = oldest.expect("pods started") + chrono::Duration::seconds(62);
    tokio::time::sleep((ready_at - Utc::now()).to_std().unwrap_or_default()).await;
    let before = pod_uids(&client, n, "app=stuck").await;

    let running = spawn_bouncer(&["run"], &policies, n, &[]);
    let written = wait_restarted_at(&client, n, "stuck", READY).await;
    let pid = running.id().expect("bouncer is running").to_string();
    let killed = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -TERM {pid}");
    let run = finish(running).await;
    let took = killed.elapsed();

    assert!(
        took < Duration::from_secs(10),
        "bouncer took {took:?} to stop"
    );
    assert_eq!(
        run.code, 1,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    let row = run.row("stuck");
    assert_eq!(row["decision"], "interrupted", "{row:#}");
    assert_eq!(
        row["reason"], "interrupted: the run received SIGTERM",
        "{row:#}"
    );
    assert_eq!(row["patchedAt"].as_str(), Some(written.as_str()));
    assert_eq!(
        lease(&client, n).await.spec.unwrap().holder_identity,
        None,
        "the lock was released"
    );

    let mark = audit_mark();
    let next = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        next.code, 0,
        "stderr: {}\nreport: {:#}",
        next.stderr, next.report
    );
    let row = next.row("stuck");
    assert_eq!(
        (row["decision"].as_str(), row["reasonCode"].as_str()),
        (Some("skip"), Some("cooldown")),
        "{row:#}"
    );
    assert!(
        row["reason"].as_str().unwrap().contains(&written),
        "cooldown counts from our restartedAt: {row:#}"
    );
    assert_eq!(restarted_at_of(&client, n, "stuck").await, Some(written));
    // Besides the surge pod that never schedules, the old pods are all still there, serving.
    let now = pod_uids(&client, n, "app=stuck").await;
    assert!(
        before.iter().all(|u| now.contains(u)),
        "old pods replaced: {before:?} -> {now:?}"
    );
    assert_eq!(patches_of(mark, n), Vec::<String>::new());
}

/// Two runs started at the same moment: one takes the lock and bounces, the other sees the lock
/// held and exits 0 without touching anything; every workload is patched exactly once.
#[tokio::test]
async fn two_runs_at_once_patch_each_workload_once() {
    let client = client().await;
    let ns = TestNs::new(&client, "twice").await;
    let n = ns.name();
    let policies = every_minute(&client, n, "twice", &["c1", "c2"]).await;
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();

    let (a, b) = (
        spawn_bouncer(&["run"], &policies, n, &[]),
        spawn_bouncer(&["run"], &policies, n, &[]),
    );
    let (a, b) = tokio::join!(finish(a), finish(b));
    assert_eq!((a.code, b.code), (0, 0), "a: {}\nb: {}", a.stderr, b.stderr);
    let (winner, loser) = if a.bounced().is_empty() {
        (b, a)
    } else {
        (a, b)
    };
    assert_eq!(winner.bounced(), ["c1", "c2"], "{:#}", winner.report);
    assert!(
        loser.stderr.contains("another run holds the lock"),
        "stderr: {}\nstdout: {}",
        loser.stderr,
        loser.stdout
    );
    assert!(
        loser.queue().is_empty(),
        "the loser reported bounces: {}",
        loser.stdout
    );
    for name in ["c1", "c2"] {
        assert!(
            restarted_at_of(&client, n, name).await.is_some(),
            "{name} not bounced"
        );
    }
    assert_eq!(
        patches_of(mark, n),
        ["c1", "c2"],
        "each workload patched exactly once"
    );
}

/// A live lease of another holder (renewing) is respected; once it stops changing (the holder
/// died without releasing it) the next run takes it over after its duration, and bounces.
#[tokio::test]
async fn a_stale_lease_is_taken_over_and_a_live_one_is_respected() {
    let client = client().await;
    let ns = TestNs::new(&client, "lease").await;
    let n = ns.name();
    deploy(&client, n, deployment("web", 1, &[("app", "web")])).await;
    let policies = Policies::new(&[("p.yaml", &policy("web", n, "{app: web}", EVERY_MINUTE))]);
    let held = |renewed: DateTime<Utc>| {
        json!({"spec": {"holderIdentity": "crashed-run-1", "leaseDurationSeconds": 30, "leaseTransitions": 0,
            "acquireTime": micro(renewed), "renewTime": micro(renewed)}})
    };
    let mut live: Lease = serde_json::from_value(held(Utc::now())).unwrap();
    live.metadata.name = Some("bouncer".into());
    let leases = Api::<Lease>::namespaced(client.clone(), n);
    leases
        .create(&PostParams::default(), &live)
        .await
        .expect("create lease");
    next_minute(Duration::from_secs(1)).await;
    // Renewed just now, as a live holder would keep doing.
    leases
        .patch(
            "bouncer",
            &PatchParams::default(),
            &Patch::Merge(held(Utc::now())),
        )
        .await
        .unwrap();

    // Renewing: by client-go's rule only an unchanged record expires, whatever its renewTime.
    let renewing = keep_patching(leases.clone(), "bouncer", move || held(Utc::now()));
    let busy = bouncer(&["run"], &policies, n).await;
    renewing.abort();
    assert_eq!(busy.code, 0, "{}", busy.stderr);
    assert!(
        busy.stderr.contains("crashed-run-1"),
        "names the holder: {}",
        busy.stderr
    );
    assert_eq!(
        restarted_at_of(&client, n, "web").await,
        None,
        "bounced under someone else's lock"
    );

    let stale = Utc::now() - chrono::Duration::minutes(10);
    leases
        .patch(
            "bouncer",
            &PatchParams::default(),
            &Patch::Merge(held(stale)),
        )
        .await
        .unwrap();
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.bounced(), ["web"]);
    let spec = lease(&client, n).await.spec.unwrap();
    assert_eq!(spec.lease_transitions, Some(1), "taken over once");
    assert_eq!(spec.holder_identity, None, "released at the end");
}

/// Another run taking the lock over while a bounce waits (what a run sees after being cut off
/// from the API server past the lease's lifetime): this run stops at once, names the reason in the
/// report, starts nothing more, exits 1, and leaves the new holder's lease alone.
#[tokio::test]
async fn losing_the_lock_mid_run_stops_the_run_and_says_why() {
    let client = client().await;
    let ns = TestNs::new(&client, "lock-lost").await;
    let n = ns.name();
    let stuck = stuck_on_restart(&client, "a-stuck", &[("app", "a-stuck"), ("lock", "yes")]).await;
    deploy(&client, n, stuck).await;
    deploy(
        &client,
        n,
        deployment("b-next", 1, &[("app", "b-next"), ("lock", "yes")]),
    )
    .await;
    let policies = Policies::new(&[(
        "p.yaml",
        &policy("lock", n, "{lock: \"yes\"}", EVERY_MINUTE),
    )]);
    next_minute(Duration::from_secs(1)).await;
    let next_pods = pod_uids(&client, n, "app=b-next").await;

    let running = spawn_bouncer(&["run"], &policies, n, &[]);
    wait_restarted_at(&client, n, "a-stuck", READY).await;
    let taken = Instant::now();
    Api::<Lease>::namespaced(client.clone(), n)
        .patch(
            "bouncer",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "other-run-2"}})),
        )
        .await
        .expect("take the lease over");
    let run = finish(running).await;

    // Renewals come every 5 s; the run stops at the first one after the takeover.
    assert!(
        taken.elapsed() < Duration::from_secs(20),
        "bouncer took {:?} to notice",
        taken.elapsed()
    );
    assert_eq!(
        run.code, 1,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(
        run.queue(),
        [
            ("a-stuck".to_string(), "interrupted".to_string()),
            ("b-next".to_string(), "notAttempted".to_string())
        ]
    );
    assert_eq!(
        run.row("a-stuck")["reason"],
        "interrupted: the run lock (Lease bouncer) was taken over by other-run-2"
    );
    assert_eq!(restarted_at_of(&client, n, "b-next").await, None);
    assert_eq!(pod_uids(&client, n, "app=b-next").await, next_pods);
    assert_eq!(
        lease(&client, n)
            .await
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("other-run-2"),
        "the new holder keeps the lock"
    );
}

/// Deletes the cluster-scoped RBAC objects a test made, also when it fails.
struct ClusterRbac(String);

impl Drop for ClusterRbac {
    fn drop(&mut self) {
        let objects = format!("clusterrole/{0},clusterrolebinding/{0}", self.0);
        let _ = kubectl()
            .args(["delete", &objects, "--ignore-not-found", "--wait=false"])
            .output();
    }
}

/// A ServiceAccount that may do everything bouncer needs in `ns` except read pod metrics, like
/// the Helm chart's per-namespace mode (namespaces are read cluster-wide).
fn restricted_identity(ns: &str) -> ClusterRbac {
    let name = format!("{ns}-bouncer");
    apply(&format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: bouncer, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: bouncer, namespace: {ns}}}
rules:
- {{apiGroups: [""], resources: [pods], verbs: [get, list, watch]}}
- {{apiGroups: [apps], resources: [replicasets, statefulsets, daemonsets], verbs: [get, list, watch]}}
- {{apiGroups: [apps], resources: [deployments], verbs: [get, list, watch, patch]}}
- {{apiGroups: [policy], resources: [poddisruptionbudgets], verbs: [list]}}
- {{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}}
- {{apiGroups: [events.k8s.io], resources: [events], verbs: [create]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: bouncer, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: bouncer}}
subjects: [{{kind: ServiceAccount, name: bouncer, namespace: {ns}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {name}}}
rules:
- {{apiGroups: [""], resources: [namespaces], verbs: [list]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {name}}}
subjects: [{{kind: ServiceAccount, name: bouncer, namespace: {ns}}}]
"#
    ));
    ClusterRbac(name)
}

/// A kubeconfig for the ServiceAccount `bouncer` of `ns`, with a bound token from the
/// TokenRequest API (what `kubectl create token` asks for) and the test cluster's server and CA.
async fn service_account_kubeconfig(ns: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let out = kubectl()
        .args(["-n", ns, "create", "token", "bouncer", "--duration=1h"])
        .output()
        .expect("kubectl create token");
    assert!(
        out.status.success(),
        "kubectl create token: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let admin = kube::config::Kubeconfig::read_from(&bouncer_testkit::cluster().kubeconfig)
        .expect("read kubeconfig");
    let cluster = admin.clusters[0].cluster.clone().expect("a cluster entry");
    let mut entry = json!({"server": cluster.server});
    if let Some(ca) = cluster.certificate_authority {
        entry["certificate-authority"] = json!(ca);
    }
    if let Some(data) = cluster.certificate_authority_data {
        entry["certificate-authority-data"] = json!(data);
    }
    let config = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "test", "cluster": entry}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": "sa", "namespace": ns}}],
    });
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_json::to_string(&config).unwrap()).unwrap();
    path
}

/// `mem` (512Mi, over the memory policy's 128Mi) and `sched` (a schedule policy's target), both
/// running; returns `mem`'s pod once metrics-server reports it.
async fn memory_and_schedule_workloads(client: &Client, n: &str) -> String {
    deploy(
        client,
        n,
        deployment("mem", 1, &[("app", "mem")]).with_memory("512Mi", "0"),
    )
    .await;
    deploy(client, n, deployment("sched", 1, &[("app", "sched")])).await;
    let mem_pod = pods(client, n, "app=mem")
        .await
        .remove(0)
        .metadata
        .name
        .unwrap();
    wait_pod_memory(client, n, &mem_pod, READY, |m| m.is_some())
        .await
        .expect("metrics for mem");
    mem_pod
}

fn memory_and_schedule_policies(n: &str) -> Policies {
    Policies::new(&[
        (
            "mem.yaml",
            &policy(
                "mem",
                n,
                "{app: mem}",
                "  triggers:\n    memory: {above: 128Mi}\n  cooldown: 1s\n",
            ),
        ),
        (
            "sched.yaml",
            &policy("sched", n, "{app: sched}", EVERY_MINUTE),
        ),
    ])
}

/// Without metrics the memory policy is skipped as "metrics unavailable" and `mem` untouched,
/// while the schedule policy bounced `sched`.
async fn assert_memory_off_schedule_bounced(
    client: &Client,
    n: &str,
    run: &crate::harness::Bounced,
    mem_pods: &[String],
) {
    let row = run.row("mem");
    assert_eq!(
        (row["decision"].as_str(), row["reasonCode"].as_str()),
        (Some("skip"), Some("notDue")),
        "{row:#}"
    );
    assert!(
        row["reason"]
            .as_str()
            .unwrap()
            .contains("metrics unavailable"),
        "{row:#}"
    );
    assert_eq!(run.bounced(), ["sched"], "{:#}", run.report);
    assert_eq!(restarted_at_of(client, n, "mem").await, None);
    assert_eq!(pod_uids(client, n, "app=mem").await, mem_pods);
}

/// An identity that may not list pods.metrics.k8s.io: the memory policy is skipped with
/// "metrics unavailable" (never bounced on missing data), a schedule policy still bounces.
#[tokio::test]
async fn forbidden_metrics_skip_memory_policies_but_schedules_still_bounce() {
    let client = client().await;
    let ns = TestNs::new(&client, "nometrics").await;
    let n = ns.name();
    memory_and_schedule_workloads(&client, n).await;
    let _rbac = restricted_identity(n);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = service_account_kubeconfig(n, dir.path()).await;
    let policies = memory_and_schedule_policies(n);
    next_minute(Duration::from_secs(1)).await;
    // With metrics readable the memory policy would fire: the skip below is the permission's doing.
    let admin = bouncer(&["plan", "--namespaces", n], &policies, n).await;
    assert_eq!(admin.row("mem")["decision"], "bounce", "{:#}", admin.report);
    let mem_pods = pod_uids(&client, n, "app=mem").await;

    let env = [("KUBECONFIG", kubeconfig.to_str().unwrap())];
    let run = bouncer_env(&["run", "--namespaces", n], &policies, n, &env).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert!(
        run.report["metricsUnavailable"]
            .as_str()
            .is_some_and(|m| m.contains("forbidden")),
        "{:#}",
        run.report
    );
    assert_memory_off_schedule_bounced(&client, n, &run, &mem_pods).await;
}

/// The API server restarts while bouncer waits on a slow rollout: the watch resumes, the bounce
/// completes and is verified, and the restartedAt patch was written exactly once.
#[tokio::test]
#[ignore = "disruptive: restarts kube-apiserver; scripts/test runs ignored tests alone"]
async fn api_server_restart_during_the_wait_is_survived() {
    let client = client().await;
    let ns = TestNs::new(&client, "apirestart").await;
    let n = ns.name();
    let mut d = deployment("steady", 3, &[("app", "steady")]);
    d.spec.as_mut().unwrap().min_ready_seconds = Some(8);
    deploy(&client, n, d).await;
    let extra = format!("{EVERY_MINUTE}  restart: {{timeout: 5m}}\n");
    let policies = Policies::new(&[("p.yaml", &policy("steady", n, "{app: steady}", &extra))]);
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();

    let mut running = spawn_bouncer(&["run"], &policies, n, &[]);
    let written = wait_restarted_at(&client, n, "steady", READY).await;
    let script = bouncer_testkit::cluster::repo_root().join("scripts/cluster");
    let restarted = tokio::task::spawn_blocking(move || {
        std::process::Command::new(script)
            .args(["restart", "kube-apiserver"])
            .status()
            .expect("scripts/cluster runs")
    })
    .await
    .unwrap();
    assert!(restarted.success(), "restarting kube-apiserver failed");
    let waited_through = running.try_wait().unwrap().is_none();
    let run = finish(running).await;
    assert!(
        waited_through,
        "bouncer finished before the API server was back: {}\n{:#}",
        run.stderr, run.report
    );

    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.bounced(), ["steady"], "{:#}", run.report);
    assert!(
        run.row("steady")["verification"]
            .as_str()
            .unwrap()
            .contains("3/3 pods new"),
        "{:#}",
        run.report
    );
    let client = bouncer_testkit::client().await;
    let after = crate::harness::deployment(&client, n, "steady").await;
    assert_eq!(
        crate::harness::deployment_restarted_at(&after),
        Some(written)
    );
    assert!(written_by(&after.metadata, "bouncer").is_some());
    assert_eq!(patches_of(mark, n), ["steady"], "patched exactly once");
}

/// etcd stops for 20 s while bouncer waits on the first of two slow rollouts: the API server
/// answers errors and the watch breaks. bouncer either resumes, verifies and goes on, or fails
/// the bounce (or stops the run) naming the cause and starts nothing more; it never panics and
/// never patches a workload twice, and its exit code says which it was.
#[tokio::test]
#[ignore = "disruptive: stops etcd; scripts/test runs ignored tests alone"]
async fn etcd_stopped_during_the_wait_is_resumed_or_failed_cleanly() {
    let client = client().await;
    let ns = TestNs::new(&client, "etcdstop").await;
    let n = ns.name();
    for name in ["a-first", "b-next"] {
        let mut d = deployment(name, 2, &[("app", name), ("etcd", "yes")]);
        d.spec.as_mut().unwrap().min_ready_seconds = Some(8);
        deploy(&client, n, d).await;
    }
    let extra = format!("{EVERY_MINUTE}  restart: {{timeout: 5m}}\n");
    let policies = Policies::new(&[("p.yaml", &policy("etcd", n, "{etcd: \"yes\"}", &extra))]);
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();
    let running = spawn_bouncer(&["run"], &policies, n, &[]);
    let (first, second) = tokio::select! {
        _ = wait_restarted_at(&client, n, "a-first", READY) => ("a-first", "b-next"),
        _ = wait_restarted_at(&client, n, "b-next", READY) => ("b-next", "a-first"),
    };
    let outage = tokio::task::spawn_blocking(|| {
        cluster_cmd(&["stop", "etcd"]);
        std::thread::sleep(Duration::from_secs(20));
        cluster_cmd(&["start", "etcd"]);
    });
    outage.await.unwrap();
    let run = finish(running).await;
    let client = bouncer_testkit::client().await;
    // Back for the tests after this one.
    let deadline = Instant::now() + Duration::from_secs(90);
    while !kubectl()
        .args(["get", "--raw", "/readyz"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(
            Instant::now() < deadline,
            "the API server did not come back"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    let row = run.row(first);
    match run.code {
        0 => {
            assert_eq!(run.bounced(), [first, second], "{:#}", run.report);
            // A verified rollout's mark rides on its one restart patch.
            assert_eq!(
                patches_of(mark, n),
                ["a-first", "b-next"],
                "each patched once"
            );
        }
        1 => {
            let decision = row["decision"].as_str().unwrap_or_default();
            assert!(
                ["failed", "interrupted"].contains(&decision),
                "{row:#}\n{}",
                run.stderr
            );
            assert!(
                !row["reason"].as_str().unwrap_or_default().is_empty(),
                "{row:#}"
            );
            assert_eq!(
                restarted_at_of(&client, n, second).await,
                None,
                "{second} was bounced after an unverified one"
            );
            // The restart, and at most the mark of its outcome: nothing of the other.
            let patches = patches_of(mark, n);
            assert!(
                (1..=2).contains(&patches.len()) && patches.iter().all(|p| p == first),
                "{patches:?}"
            );
        }
        code => panic!("exit {code}: {}\n{:#}", run.stderr, run.report),
    }
}

/// Runs `scripts/cluster ARGS` (stop/start of one component), panicking on failure.
fn cluster_cmd(args: &[&str]) {
    let script = bouncer_testkit::cluster::repo_root().join("scripts/cluster");
    let out = std::process::Command::new(script)
        .args(args)
        .output()
        .expect("run scripts/cluster");
    assert!(
        out.status.success(),
        "scripts/cluster {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the APIService v1beta1.metrics.k8s.io is Available (the aggregator can reach
/// metrics-server), as kubectl reads it.
fn metrics_api_available() -> bool {
    let out = kubectl()
        .args([
            "get",
            "apiservice",
            "v1beta1.metrics.k8s.io",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
        ])
        .output()
        .expect("kubectl get apiservice");
    String::from_utf8_lossy(&out.stdout).trim() == "True"
}

/// Stops a control plane component (`scripts/cluster stop NAME`) and starts it again when the
/// test that stopped it ends, pass or fail, so the lane's cluster is never left without it.
struct Stopped(&'static str);

impl Stopped {
    fn new(component: &'static str) -> Self {
        cluster_cmd(&["stop", component]);
        Stopped(component)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        cluster_cmd(&["start", self.0]);
    }
}

/// metrics-server is down, so the aggregated metrics.k8s.io API answers 503: the memory policy
/// is skipped with "metrics unavailable" (never bounced on missing data) while a schedule
/// policy still bounces; with metrics-server back the same memory policy fires.
#[tokio::test]
#[ignore = "disruptive: stops metrics-server; scripts/test runs ignored tests alone"]
async fn metrics_server_down_turns_memory_triggers_off_but_schedules_still_bounce() {
    let client = client().await;
    let ns = TestNs::new(&client, "msdown").await;
    let n = ns.name();
    let mem_pod = memory_and_schedule_workloads(&client, n).await;
    let policies = memory_and_schedule_policies(n);
    let mem_pods = pod_uids(&client, n, "app=mem").await;
    {
        let _down = Stopped::new("metrics-server");
        // The aggregator notices within seconds (its availability check of the APIService).
        let deadline = Instant::now() + READY;
        while metrics_api_available() {
            assert!(
                Instant::now() < deadline,
                "the metrics APIService stays Available"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        next_minute(Duration::from_secs(1)).await;
        let started = Instant::now();
        let run = bouncer(&["run", "--namespaces", n], &policies, n).await;
        assert_eq!(
            run.code, 0,
            "stderr: {}\nreport: {:#}",
            run.stderr, run.report
        );
        let why = run.report["metricsUnavailable"]
            .as_str()
            .unwrap_or_default();
        assert!(why.contains("503"), "{:#}", run.report);
        // Metrics are optional: a 503 is not retried for minutes before the run goes on.
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the run took {:?}",
            started.elapsed()
        );
        assert_memory_off_schedule_bounced(&client, n, &run, &mem_pods).await;
    }
    // Back up: the same policy now sees the pod's 512Mi and bounces it.
    wait_pod_memory(&client, n, &mem_pod, READY, |m| m.is_some())
        .await
        .expect("metrics again after metrics-server restarts");
    let run = bouncer(&["run", "--namespaces", n], &policies, n).await;
    assert!(
        run.bounced().contains(&"mem".to_string()),
        "{:#}",
        run.report
    );
}

/// Starts `bouncer run` stopped at `step` (`BOUNCER_TEST_HALT_AT`: after a write, before a
/// wait), waits until it says so, and SIGKILLs it there: no cleanup, its Lease left held.
pub(crate) async fn killed_at(step: &str, policies: &Policies, ns: &str) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = spawn_bouncer(
        &["run"],
        policies,
        ns,
        &[
            ("BOUNCER_TEST_HALT_AT", step),
            ("BOUNCER_VERIFY_SETTLE", "20s"),
        ],
    );
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let want = format!("halted at {step}");
    let halted = tokio::time::timeout(READY, async {
        let mut seen = String::new();
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if line.contains(&want) {
                return Ok(());
            }
            seen.push_str(&line);
            seen.push('\n');
        }
        Err(seen)
    })
    .await;
    match halted {
        Ok(Ok(())) => {}
        Ok(Err(stderr)) => {
            let report = child
                .wait_with_output()
                .await
                .expect("the run's output")
                .stdout;
            let report = String::from_utf8_lossy(&report);
            panic!("the run ended before halting at {step}:\n{stderr}\nreport: {report}")
        }
        Err(_) => panic!("the run did not halt at {step} within {READY:?}"),
    }
    // tokio's kill is SIGKILL.
    child.kill().await.expect("SIGKILL");
}

/// Fault 1: a run SIGKILLed at `step` of its first bounce (`a-first`), then the next run. The
/// dead run's Lease is held and unchanged: the next run waits it out (30 s), takes it over and
/// then never restarts `a-first` a second time within its cooldown. With `stuck` its rollout
/// never completes, and no other bounce starts beside it (`bounceInFlight`); otherwise, once it
/// has rolled out, the queue goes on to `b-next`.
async fn a_run_killed_at(step: &str, method: &str, stuck: bool) {
    let client = client().await;
    let ns = TestNs::new(&client, &format!("kill-{step}")).await;
    let n = ns.name();
    let labels = [("app", "a-first"), ("killed", "yes")];
    // Created first, so its pods are the oldest: the queue bounces it first.
    let first = if stuck {
        stuck_on_restart(&client, "a-first", &labels).await
    } else {
        let mut d = deployment("a-first", 2, &labels);
        d.spec.as_mut().unwrap().min_ready_seconds = Some(3);
        d
    };
    deploy(&client, n, first).await;
    // Two pods: an eviction bounce of one would be downtime.
    deploy(
        &client,
        n,
        deployment("b-next", 2, &[("app", "b-next"), ("killed", "yes")]),
    )
    .await;
    // The cooldown counts from the oldest pod's start too: the pods are made older than it
    // first, and a minute's fire has passed since they started. It outlasts the dead run's
    // Lease (30 s) and the rollout, so a second restart by the next run would be inside it.
    let cooldown = Duration::from_secs(100);
    let extra = format!(
        "  triggers:\n    schedule: {{cron: \"* * * * *\", startingDeadline: 5m}}\n  cooldown: {}s\n  restart: {{method: {method}, timeout: 5m}}\n",
        cooldown.as_secs()
    );
    let policies = Policies::new(&[("p.yaml", &policy("killed", n, "{killed: \"yes\"}", &extra))]);
    // A margin for pods whose start the node wrote a few seconds after their creation.
    tokio::time::sleep(cooldown + Duration::from_secs(10)).await;
    let mark = audit_mark();
    killed_at(step, &policies, n).await;
    let first_writes = patches_of(mark, n);
    assert!(
        !first_writes.is_empty() && first_writes.iter().all(|p| p == "a-first"),
        "{first_writes:?}"
    );
    if !stuck {
        bouncer_testkit::wait_rollout_complete(
            &client,
            bouncer_testkit::Kind::Deployment,
            n,
            "a-first",
            READY,
        )
        .await
        .expect("a-first rolls out without the dead run");
    }
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    let writes = patches_of(mark, n);
    assert_eq!(
        writes.iter().filter(|p| *p == "a-first").count(),
        first_writes.len(),
        "a-first written again within its cooldown: {writes:?}\n{:#}",
        run.report
    );
    if method == "evict" {
        let evicted = crate::revert::evictions(mark, n);
        let of_first = evicted
            .iter()
            .filter(|(p, _)| p.starts_with("a-first-"))
            .count();
        assert!(of_first <= 1, "a-first evicted again: {evicted:?}");
    }
    let row = run.row("b-next");
    if stuck {
        assert_eq!(row["reasonCode"], "bounceInFlight", "{:#}", run.report);
        assert!(
            row["reason"]
                .as_str()
                .is_some_and(|r| r.contains("a-first")),
            "{row:#}"
        );
        assert_eq!(restarted_at_of(&client, n, "b-next").await, None);
    } else {
        assert_eq!(row["decision"], "bounced", "{:#}", run.report);
    }
}

#[tokio::test]
async fn killed_after_the_patch_the_next_run_does_not_restart_it_again() {
    a_run_killed_at("patch", "rollout", false).await;
}

#[tokio::test]
async fn killed_during_the_rollout_wait_the_next_run_goes_on_once_it_rolled_out() {
    a_run_killed_at("rollout-wait", "rollout", false).await;
}

#[tokio::test]
async fn killed_during_a_stuck_rollout_the_next_run_starts_nothing_beside_it() {
    a_run_killed_at("rollout-wait", "rollout", true).await;
}

#[tokio::test]
async fn killed_during_the_settle_the_next_run_does_not_restart_it_again() {
    a_run_killed_at("settle", "rollout", false).await;
}

#[tokio::test]
async fn killed_after_the_eviction_mark_the_next_run_does_not_evict_it() {
    a_run_killed_at("mark", "evict", false).await;
}

#[tokio::test]
async fn killed_after_an_eviction_the_next_run_does_not_evict_it_again() {
    a_run_killed_at("evict", "evict", false).await;
}

/// Keeps `ns`'s Deployments from being deleted (a ValidatingAdmissionPolicy denying DELETE
/// there), so a namespace deletion stays stuck with them inside, as one waiting on a finalizer
/// or a slow webhook does; dropped, it lets the deletion finish.
struct HoldDeployments(String);

impl HoldDeployments {
    fn new(ns: &str) -> Self {
        let name = format!("hold-{ns}");
        apply(&format!(
            r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {name}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {{apiGroups: [apps], apiVersions: ["*"], resources: [deployments], operations: [DELETE]}}
  validations:
  - {{expression: "false", message: "held by the test while its namespace is being deleted"}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: {name}}}
spec:
  policyName: {name}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {{kubernetes.io/metadata.name: {ns}}}
"#
        ));
        HoldDeployments(name)
    }
}

impl Drop for HoldDeployments {
    fn drop(&mut self) {
        for kind in [
            "validatingadmissionpolicybinding",
            "validatingadmissionpolicy",
        ] {
            let _ = kubectl()
                .args(["delete", kind, &self.0, "--ignore-not-found"])
                .output();
        }
    }
}

/// Fault 6, a deletion under way: a Deployment deleted but kept by a finalizer, and one in a
/// namespace being deleted. A controller whose deletion started rolls nothing out, and the API
/// server creates no pod in a namespace being deleted, so a restart there could only stall into
/// a failed bounce (which halts the queue) and an eviction would take a pod for good. bouncer
/// skips both as `beingDeleted`, writes nothing to them, and goes on with the rest.
#[tokio::test]
async fn a_workload_or_namespace_being_deleted_is_left_alone() {
    let client = client().await;
    let ns = TestNs::new(&client, "deleting").await;
    let closing = TestNs::new(&client, "closing").await;
    let (n, c) = (ns.name(), closing.name());
    let labels = |name| [("app", name), ("deleting", "yes")];
    for name in ["held", "live"] {
        let mut d = deployment(name, 1, &labels(name));
        if name == "held" {
            d.metadata.finalizers = Some(vec!["bouncer.test/hold".into()]);
        }
        deploy(&client, n, d).await;
    }
    deploy(&client, c, deployment("inclosing", 1, &labels("inclosing"))).await;
    let deployments = Api::<Deployment>::namespaced(client.clone(), n);
    deployments
        .delete("held", &Default::default())
        .await
        .expect("delete held");
    let hold = HoldDeployments::new(c);
    kubectl_ok(&["delete", "namespace", c, "--wait=false"]);
    // The namespace controller has tried to empty it: the Deployment is still there and not
    // itself marked for deletion (the namespace is the only reason).
    let inclosing = Api::<Deployment>::namespaced(client.clone(), c);
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    let tried = |ns: Option<&k8s_openapi::api::core::v1::Namespace>| {
        let conditions = ns.and_then(|n| n.status.as_ref()?.conditions.as_ref());
        conditions.is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "NamespaceDeletionContentFailure" && c.status == "True")
        })
    };
    let stuck = tokio::time::timeout(
        READY,
        kube::runtime::wait::await_condition(namespaces, c, tried),
    )
    .await;
    assert!(
        matches!(stuck, Ok(Ok(Some(_)))),
        "namespace {c} never tried to delete its content: {stuck:?}"
    );
    let d = inclosing.get("inclosing").await.expect("inclosing kept");
    assert!(d.metadata.deletion_timestamp.is_none(), "{:?}", d.metadata);

    let policies = Policies::new(&[(
        "p.yaml",
        &policy(
            "deleting",
            &format!("{n}, {c}"),
            "{deleting: \"yes\"}",
            EVERY_MINUTE,
        ),
    )]);
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();
    let run = bouncer(&["run"], &policies, n).await;
    deployments
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release held");
    drop(hold);
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.bounced(), ["live"], "{:#}", run.report);
    for (name, why) in [
        ("held", "being deleted"),
        ("inclosing", "its namespace is being deleted"),
    ] {
        let row = run.row(name);
        assert_eq!(row["reasonCode"], "beingDeleted", "{row:#}");
        assert!(
            row["reason"].as_str().is_some_and(|r| r.contains(why)),
            "{row:#}"
        );
    }
    assert_eq!(patches_of(mark, n), ["live"]);
    assert!(patches_of(mark, c).is_empty(), "{:?}", patches_of(mark, c));
}

/// Fault 6, pods stuck terminating: the old pods of a rollout keep a finalizer nobody removes.
/// They are on their way out and serve no one (a kubelet stops their containers), so, as
/// kubectl's rules do, bouncer judges the rollout by the live pods: the bounce is verified once
/// the new pods are ready, within the rollout's bounded wait, and bouncer neither waits on the
/// stuck pods nor forces them out (they are still there, terminating, after the run).
#[tokio::test]
async fn pods_stuck_terminating_neither_hold_the_bounce_nor_get_forced() {
    let client = client().await;
    let ns = TestNs::new(&client, "stuckterm").await;
    let n = ns.name();
    let mut d = deployment("sticky", 2, &[("app", "sticky")]);
    let template = d
        .spec
        .as_mut()
        .unwrap()
        .template
        .metadata
        .get_or_insert_default();
    template.finalizers = Some(vec!["bouncer.test/hold".into()]);
    deploy(&client, n, d).await;
    let old: Vec<String> = pods(&client, n, "app=sticky")
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(old.len(), 2, "{old:?}");
    let policies = Policies::new(&[(
        "p.yaml",
        &policy("sticky", n, "{app: sticky}", EVERY_MINUTE),
    )]);
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();
    let run = bouncer(&["run"], &policies, n).await;

    let api = Api::<Pod>::namespaced(client.clone(), n);
    let all = api
        .list(&Default::default())
        .await
        .expect("list pods")
        .items;
    let stuck: Vec<String> = all
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    // Let them go before anything can fail, so the namespace can be deleted.
    for p in &all {
        let name = p.metadata.name.as_deref().unwrap_or_default();
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release pod");
    }
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.bounced(), ["sticky"], "{:#}", run.report);
    assert!(
        run.row("sticky")["verification"]
            .as_str()
            .is_some_and(|v| v.contains("2/2 pods new")),
        "{:#}",
        run.report
    );
    let (mut stuck, mut old) = (stuck, old);
    stuck.sort();
    old.sort();
    assert_eq!(stuck, old, "the old pods, still terminating");
    assert_eq!(patches_of(mark, n), ["sticky"], "patched once");
}

/// A KWOK node of a test's own, tainted so only that test's pods go there; deleted on drop.
struct OwnNode(String);

impl OwnNode {
    async fn new(client: &Client, ns: &str) -> Self {
        let name = format!("nr-{ns}");
        apply(&format!(
            r#"apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{kubernetes.io/hostname: {name}, kubernetes.io/os: linux, kubernetes.io/arch: amd64, type: kwok}}
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
    metrics.k8s.io/resource-metrics-path: /metrics/nodes/{name}/metrics/resource
spec:
  taints: [{{key: bouncer.test/only, value: "{ns}", effect: NoSchedule}}]
"#
        ));
        let nodes = Api::<Node>::all(client.clone());
        let ready = |n: Option<&Node>| n.is_some_and(node_ready);
        let ready = tokio::time::timeout(
            READY,
            kube::runtime::wait::await_condition(nodes, &name, ready),
        )
        .await;
        assert!(
            matches!(ready, Ok(Ok(Some(_)))),
            "node {name} never became Ready: {ready:?}"
        );
        OwnNode(name)
    }

    /// Takes the node's kubelet runtime down: KWOK's `node-kubelet-down` stage then reports the
    /// node NotReady (its Lease still renewed), and the node lifecycle controller taints it
    /// not-ready. Returns once the scheduler would see the taint.
    async fn not_ready(&self, client: &Client) {
        let nodes = Api::<Node>::all(client.clone());
        nodes
            .patch(
                &self.0,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"bouncer.test/kubelet-down": "true"}}}),
                ),
            )
            .await
            .expect("annotate node");
        let tainted = tokio::time::timeout(
            READY,
            kube::runtime::wait::await_condition(nodes, &self.0, |n: Option<&Node>| {
                n.is_some_and(not_ready_and_tainted)
            }),
        )
        .await;
        assert!(
            matches!(tainted, Ok(Ok(Some(_)))),
            "node {} never became NotReady and tainted: {tainted:?}",
            self.0
        );
    }

    async fn still_not_ready(&self, client: &Client) -> bool {
        let nodes = Api::<Node>::all(client.clone());
        nodes
            .get(&self.0)
            .await
            .is_ok_and(|n| not_ready_and_tainted(&n))
    }
}

fn not_ready_and_tainted(n: &Node) -> bool {
    let tainted = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == "node.kubernetes.io/not-ready" && t.effect == "NoSchedule")
        });
    !node_ready(n) && tainted
}

impl Drop for OwnNode {
    fn drop(&mut self) {
        let _ = kubectl()
            .args(["delete", "node", &self.0, "--wait=false"])
            .output();
    }
}

/// Fault 6, a node NotReady under the workload's pods: its pods still serve (the kubelet is up),
/// but the node is tainted not-ready, so a restart's new pods cannot go where the workload's
/// pods must run. bouncer's wait is bounded by the restart timeout: it fails the bounce as
/// `rolloutTimedOut` naming what did not happen and exits 1; the rollout's surge-first
/// default took no old pod away, so both still run and are ready.
#[tokio::test]
async fn a_node_not_ready_under_the_pods_bounds_the_wait_and_takes_nothing_away() {
    let client = client().await;
    let ns = TestNs::new(&client, "nodedown").await;
    let n = ns.name();
    let node = OwnNode::new(&client, n).await;
    let mut d = deployment("a-pinned", 2, &[("app", "a-pinned"), ("nodedown", "yes")]);
    let spec = d.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
    spec.node_selector = Some([("kubernetes.io/hostname".to_string(), node.0.clone())].into());
    spec.tolerations = Some(vec![k8s_openapi::api::core::v1::Toleration {
        key: Some("bouncer.test/only".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }]);
    deploy(&client, n, d).await;
    let old: Vec<String> = pods(&client, n, "app=a-pinned")
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    node.not_ready(&client).await;
    let extra = format!("{EVERY_MINUTE}  restart: {{timeout: 20s}}\n");
    let policies = Policies::new(&[(
        "p.yaml",
        &policy("nodedown", n, "{nodedown: \"yes\"}", &extra),
    )]);
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();
    let run = bouncer(&["run"], &policies, n).await;

    assert!(
        node.still_not_ready(&client).await,
        "the node came back Ready during the run: the fault did not hold"
    );
    assert_eq!(
        run.code, 1,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    let row = run.row("a-pinned");
    assert_eq!(row["decision"], "failed", "{row:#}");
    assert_eq!(row["reasonCode"], "rolloutTimedOut", "{row:#}");
    // The restart, then the mark's outcome.
    let writes = patches_of(mark, n);
    assert!(
        !writes.is_empty() && writes.iter().all(|p| p == "a-pinned"),
        "{writes:?}"
    );
    let live = pods(&client, n, "app=a-pinned").await;
    for name in &old {
        let pod = live
            .iter()
            .find(|p| p.metadata.name.as_ref() == Some(name))
            .unwrap_or_else(|| panic!("old pod {name} was taken away"));
        assert!(
            bouncer_testkit::rollout::is_pod_ready(pod),
            "old pod {name} not ready"
        );
    }
}

/// Fault 2, the API server gone under the patch: the run pauses right before its first restart
/// patch (`BOUNCER_TEST_PAUSE_BEFORE`), kube-apiserver is stopped, and the patch finds no
/// server. bouncer fails that bounce naming the cause (`patchFailed`), starts nothing more
/// (the next workload is not attempted), never panics, and exits 1; nothing was written. Once
/// the server is back, the next run bounces both, each patched once.
#[tokio::test]
#[ignore = "disruptive: stops kube-apiserver; scripts/test runs ignored tests alone"]
async fn api_server_gone_under_the_patch_fails_the_bounce_and_starts_nothing_more() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    let client = client().await;
    let ns = TestNs::new(&client, "apipatch").await;
    let n = ns.name();
    let policies = every_minute(&client, n, "apipatch", &["a-first", "b-next"]).await;
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();
    let mut child = spawn_bouncer(
        &["run"],
        &policies,
        n,
        &[("BOUNCER_TEST_PAUSE_BEFORE", "patch=15s")],
    );
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let paused = tokio::time::timeout(READY, async {
        let mut line = String::new();
        while stderr.read_line(&mut line).await.expect("read stderr") > 0 {
            if line.contains("paused before patch") {
                return true;
            }
            line.clear();
        }
        false
    })
    .await;
    assert!(
        matches!(paused, Ok(true)),
        "the run never paused before the patch"
    );
    let down = Stopped::new("kube-apiserver");
    let mut stdout = child.stdout.take().expect("stdout");
    let ended = tokio::time::timeout(READY, async {
        let mut report = String::new();
        stdout
            .read_to_string(&mut report)
            .await
            .expect("read stdout");
        let mut rest = String::new();
        stderr.read_to_string(&mut rest).await.expect("read stderr");
        (child.wait().await.expect("bouncer ends"), report, rest)
    })
    .await;
    drop(down);
    let (status, report, rest) = ended.expect("bouncer ended while the API server was down");
    assert_eq!(status.code(), Some(1), "stderr: {rest}\nreport: {report}");
    assert!(!rest.contains("panicked"), "{rest}");
    let report: serde_json::Value = serde_json::from_str(&report).expect("a JSON report");
    let row = |name: &str| {
        report["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["workload"]["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no row for {name}: {report:#}"))
    };
    let first = row("a-first");
    assert_eq!(first["decision"], "failed", "{first:#}");
    assert_eq!(first["reasonCode"], "patchFailed", "{first:#}");
    assert!(
        first["reason"]
            .as_str()
            .is_some_and(|r| r.contains("a-first")),
        "the failure names the workload: {first:#}"
    );
    assert_eq!(row("b-next")["decision"], "notAttempted", "{report:#}");

    let client = bouncer_testkit::client().await;
    for name in ["a-first", "b-next"] {
        assert_eq!(
            restarted_at_of(&client, n, name).await,
            None,
            "{name} written"
        );
    }
    // The server was down for as long as the run took to end, long enough at times for the
    // node lifecycle controller to find the nodes' Leases stale on its first pass once the
    // server is back and mark their pods NotReady (KWOK then reports them Ready again, as a
    // kubelet does). The next run is judged on a settled cluster: a pass of that controller
    // (every 5 s), then both Deployments available again.
    tokio::time::sleep(Duration::from_secs(10)).await;
    for name in ["a-first", "b-next"] {
        bouncer_testkit::wait_rollout_complete(
            &client,
            bouncer_testkit::Kind::Deployment,
            n,
            name,
            READY,
        )
        .await
        .unwrap_or_else(|e| panic!("{name} available again after the outage: {e:#}"));
    }
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.bounced(), ["a-first", "b-next"], "{:#}", run.report);
    assert_eq!(
        patches_of(mark, n),
        ["a-first", "b-next"],
        "each patched once"
    );
}
