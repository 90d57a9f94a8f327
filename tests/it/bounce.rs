//! End to end on the real control plane: policies -> plan -> one-at-a-time verified restarts -> report.

use std::time::Duration;

use bouncer_testkit::{
    PodTemplateExt, TestNs, client, create, deployment, mcp_server, model_usage, wait_pod_memory,
    wait_pods_ready, wait_rollout_complete,
};
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::ListParams;

use crate::harness::{
    Policies, bouncer, deployment as get_deployment, deployment_restarted_at, next_minute, pods,
    policy, ready_since, rollout_restart, written_by,
};

const READY: Duration = Duration::from_secs(90);

async fn deploy(client: &kube::Client, ns: &str, d: Deployment) {
    let name = d.metadata.name.clone().unwrap();
    create(client, ns, &d).await.expect("create deployment");
    wait_rollout_complete(client, bouncer_testkit::Kind::Deployment, ns, &name, READY)
        .await
        .expect("deployment ready");
}

/// Three due workloads are bounced in order, each patch written only after the previous rollout
/// completed; a second run, and a run after a manual `kubectl rollout restart`, bounce nothing.
#[tokio::test]
async fn nightly_bounces_one_at_a_time_and_only_once() {
    let client = client().await;
    let ns = TestNs::new(&client, "nightly").await;
    for name in ["n1", "n2", "n3"] {
        deploy(
            &client,
            ns.name(),
            deployment(name, 2, &[("app", name), ("bounce", "nightly")]),
        )
        .await;
    }
    let policies = Policies::new(&[(
        "nightly.yaml",
        &policy(
            "nightly",
            ns.name(),
            "{bounce: nightly}",
            "  triggers:\n    schedule: {cron: \"* * * * *\", startingDeadline: 5m}\n  cooldown: 1s\n",
        ),
    )]);
    // The every-minute cron must fire after the pods started, as a nightly one would.
    next_minute(Duration::from_secs(1)).await;

    let run = bouncer(&["run"], &policies, ns.name()).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    let queue = run.queue();
    assert_eq!(queue.len(), 3, "{queue:?}");
    assert!(queue.iter().all(|(_, d)| d == "bounced"), "{queue:?}");

    // Proof of one at a time from the server's own clocks: every new pod of bounce i was Ready
    // no later than bouncer's patch of bounce i+1 (whole seconds), and the report agrees to the ms.
    let mut previous_ready: Option<DateTime<Utc>> = None;
    let mut previous_completed: Option<DateTime<Utc>> = None;
    for (name, _) in &queue {
        let d = get_deployment(&client, ns.name(), name).await;
        let written = deployment_restarted_at(&d).expect("restartedAt written");
        let patched = written_by(&d.metadata, "bouncer").expect("bouncer is a field manager");
        if let Some(ready) = previous_ready {
            assert!(
                patched >= ready,
                "{name} patched at {patched} before the previous rollout was ready at {ready}"
            );
        }
        let row = run.row(name);
        let patched_ms: DateTime<Utc> = row["patchedAt"].as_str().unwrap().parse().unwrap();
        if let Some(done) = previous_completed {
            assert!(
                patched_ms >= done,
                "{name}: report patchedAt {patched_ms} < previous completedAt {done}"
            );
        }
        assert!(
            row["verification"]
                .as_str()
                .unwrap()
                .contains("2/2 pods new"),
            "{row:#}"
        );
        let fresh = pods(&client, ns.name(), &format!("app={name}")).await;
        assert_eq!(fresh.len(), 2);
        for p in &fresh {
            let started =
                crate::harness::time(p.status.as_ref().unwrap().start_time.as_ref().unwrap());
            assert!(
                started >= patched - chrono::Duration::seconds(1),
                "{name}: pod started {started} before patch {patched}"
            );
        }
        previous_ready = fresh.iter().filter_map(ready_since).max();
        previous_completed = Some(row["completedAt"].as_str().unwrap().parse().unwrap());
        assert_eq!(
            written,
            row["patchedAt"].as_str().unwrap(),
            "annotation value is the RFC3339 bounce time"
        );
    }

    // Stateless: right after, nothing is due (all pods started after the last fire).
    let again = bouncer(&["run"], &policies, ns.name()).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(again.queue().is_empty(), "{:#}", again.report);
    assert_eq!(again.report["summary"]["skipped"], 3);

    // A manual `kubectl rollout restart` counts as a restart too.
    rollout_restart(ns.name(), "n1");
    wait_rollout_complete(
        &client,
        bouncer_testkit::Kind::Deployment,
        ns.name(),
        "n1",
        READY,
    )
    .await
    .unwrap();
    let after_manual = bouncer(&["run"], &policies, ns.name()).await;
    assert!(after_manual.queue().is_empty(), "{:#}", after_manual.report);
}

/// Only workloads whose pods exceed the threshold are bounced, and their memory drops after.
#[tokio::test]
async fn memory_threshold_bounces_only_the_leaky_ones() {
    let client = client().await;
    let ns = TestNs::new(&client, "memory").await;
    let leaky = |name: &str| {
        deployment(name, 1, &[("app", name), ("tier", "mcp")]).with_memory("16Mi", "1200Mi")
    };
    deploy(&client, ns.name(), leaky("leak-a")).await;
    deploy(&client, ns.name(), leaky("leak-b")).await;
    deploy(
        &client,
        ns.name(),
        deployment("steady", 1, &[("app", "steady"), ("tier", "mcp")]).with_memory("64Mi", "0"),
    )
    .await;
    let policies = Policies::new(&[(
        "memory.yaml",
        &policy(
            "mem",
            ns.name(),
            "{tier: mcp}",
            "  triggers:\n    memory: {above: 256Mi}\n  cooldown: 1s\n",
        ),
    )]);
    // 1200Mi/min from 16Mi passes 256Mi after ~12 s; metrics-server has a new pod's first
    // sample some 20 s after it starts.
    let mut before = Vec::new();
    for name in ["leak-a", "leak-b"] {
        let pod = pods(&client, ns.name(), &format!("app={name}"))
            .await
            .remove(0);
        let pod_name = pod.metadata.name.clone().unwrap();
        wait_pod_memory(
            &client,
            ns.name(),
            &pod_name,
            Duration::from_secs(120),
            |m| m.is_some_and(|m| m.bytes > 300 << 20),
        )
        .await
        .expect("leak grows past the threshold")
        .expect("metrics present");
        before.push((name, pod));
    }

    let plan = bouncer(&["plan"], &policies, ns.name()).await;
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    let mut planned: Vec<String> = plan.queue().into_iter().map(|(n, _)| n).collect();
    planned.sort();
    assert_eq!(planned, ["leak-a", "leak-b"]);
    assert_eq!(plan.row("steady")["reasonCode"], "notDue");

    let run = bouncer(&["run"], &policies, ns.name()).await;
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    let mut bounced = run.bounced();
    bounced.sort();
    assert_eq!(bounced, ["leak-a", "leak-b"]);
    assert_eq!(run.row("steady")["decision"], "skip");
    assert!(deployment_restarted_at(&get_deployment(&client, ns.name(), "steady").await).is_none());

    // The restart reset the leak: metrics-server's first sample of the new pod is below what
    // the old pod would have had at that moment.
    for (name, old_pod) in before {
        let pod = pods(&client, ns.name(), &format!("app={name}"))
            .await
            .remove(0);
        let new_name = pod.metadata.name.clone().unwrap();
        assert_ne!(
            Some(&new_name),
            old_pod.metadata.name.as_ref(),
            "{name} has a new pod"
        );
        let m = wait_pod_memory(
            &client,
            ns.name(),
            &new_name,
            Duration::from_secs(120),
            |m| m.is_some(),
        )
        .await
        .unwrap()
        .expect("metrics for the new pod");
        let old_then: u64 = model_usage(&old_pod, m.timestamp)
            .unwrap()
            .expect("the old pod was running")
            .iter()
            .map(|(_, b)| b)
            .sum();
        assert!(
            m.bytes < old_then,
            "{name}: memory {} after the bounce, the old pod would have {old_then}",
            m.bytes
        );
    }
}

/// `plan` and `run --dry-run` write nothing: no resourceVersion changes, no Events, no Lease,
/// and no write request from bouncer's user agent in the API server's audit log.
#[tokio::test]
async fn plan_and_dry_run_make_zero_writes() {
    let client = client().await;
    let ns = TestNs::new(&client, "dryrun").await;
    deploy(&client, ns.name(), deployment("web", 2, &[("app", "web")])).await;
    let policies = Policies::new(&[(
        "p.yaml",
        &policy(
            "web",
            ns.name(),
            "{app: web}",
            "  triggers:\n    schedule: {cron: \"* * * * *\"}\n  cooldown: 1s\n",
        ),
    )]);
    next_minute(Duration::from_secs(1)).await;
    let before = resource_versions(&client, ns.name()).await;
    let mark = crate::harness::audit_mark();

    let plan = bouncer(&["plan"], &policies, ns.name()).await;
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    assert_eq!(
        plan.queue(),
        vec![("web".to_string(), "bounce".to_string())]
    );
    let dry = bouncer(&["run", "--dry-run"], &policies, ns.name()).await;
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert_eq!(dry.report["mode"], "dryRun");
    assert_eq!(dry.queue(), vec![("web".to_string(), "bounce".to_string())]);

    assert_eq!(
        resource_versions(&client, ns.name()).await,
        before,
        "no object changed"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), ns.name());
    assert!(
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|e| e.reporting_controller.as_deref() != Some("bouncer.dev/bouncer"))
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), ns.name());
    assert!(
        leases
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no lease taken"
    );
    let (reads, writes) = audit_requests_since(mark, ns.name());
    assert!(reads > 0, "the audit log shows bouncer's reads");
    assert_eq!(writes, Vec::<String>::new(), "bouncer made write requests");
}

async fn resource_versions(client: &kube::Client, ns: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for d in Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        out.push((
            format!("deploy/{}", d.metadata.name.unwrap()),
            d.metadata.resource_version.unwrap(),
        ));
    }
    for p in Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        out.push((
            format!("pod/{}", p.metadata.name.unwrap()),
            p.metadata.resource_version.unwrap(),
        ));
    }
    out.sort();
    out
}

/// (read requests, write requests as "verb uri") made by bouncer's user agent after `mark` in
/// namespace `ns` (other tests run bouncer at the same time, elsewhere).
pub fn audit_requests_since(mark: u64, ns: &str) -> (usize, Vec<String>) {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(crate::harness::audit_log().unwrap()).unwrap();
    file.seek(SeekFrom::Start(mark)).unwrap();
    let mut text = String::new();
    file.read_to_string(&mut text).unwrap();
    let mut reads = 0;
    let mut writes = Vec::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if !event["userAgent"]
            .as_str()
            .is_some_and(|ua| ua.starts_with("bouncer/"))
        {
            continue;
        }
        // Plan-time LISTs span all namespaces (no namespace in objectRef); writes are namespaced.
        let namespace = event["objectRef"]["namespace"].as_str();
        if namespace.is_some_and(|n| n != ns) {
            continue;
        }
        match event["verb"].as_str().unwrap_or_default() {
            "get" | "list" | "watch" => reads += 1,
            verb => writes.push(format!(
                "{verb} {}",
                event["requestURI"].as_str().unwrap_or_default()
            )),
        }
    }
    (reads, writes)
}

/// A ToolHive-shaped MCPServer (proxy Deployment + backend StatefulSet) is bounced and both
/// rollouts are verified.
#[tokio::test]
async fn toolhive_mcp_server_pair_is_bounced_and_verified() {
    let client = client().await;
    let ns = TestNs::new(&client, "mcp").await;
    let server = mcp_server("github");
    server
        .create(&client, ns.name())
        .await
        .expect("create MCPServer pair");
    wait_rollout_complete(
        &client,
        bouncer_testkit::Kind::Deployment,
        ns.name(),
        "github",
        READY,
    )
    .await
    .unwrap();
    wait_rollout_complete(
        &client,
        bouncer_testkit::Kind::StatefulSet,
        ns.name(),
        "github-backend",
        READY,
    )
    .await
    .unwrap();
    wait_pods_ready(&client, ns.name(), "toolhive-name=github", 2, READY)
        .await
        .unwrap();
    let policies = Policies::new(&[(
        "mcp.yaml",
        &policy(
            "mcp-github",
            ns.name(),
            "{toolhive: \"true\", toolhive-name: github}",
            "    kinds: [Deployment, StatefulSet]\n  triggers:\n    schedule: {cron: \"* * * * *\"}\n  cooldown: 1s\n  allowDowntime: true\n",
        ),
    )]);
    next_minute(Duration::from_secs(1)).await;
    let run = bouncer(&["run"], &policies, ns.name()).await;
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    let mut bounced: Vec<(String, String)> = run
        .rows()
        .into_iter()
        .filter(|r| r["decision"] == "bounced")
        .map(|r| {
            (
                r["workload"]["kind"].as_str().unwrap().to_string(),
                crate::harness::name(r),
            )
        })
        .collect();
    bounced.sort();
    assert_eq!(
        bounced,
        [
            ("Deployment".to_string(), "github".to_string()),
            ("StatefulSet".to_string(), "github-backend".to_string())
        ]
    );
    for r in run
        .rows()
        .into_iter()
        .filter(|r| r["decision"] == "bounced")
    {
        assert!(
            r["verification"]
                .as_str()
                .unwrap()
                .starts_with("restartedAt intact"),
            "{r:#}"
        );
    }
    let sts = crate::harness::statefulset(&client, ns.name(), "github-backend").await;
    let template = sts
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .annotations
        .unwrap();
    assert!(template.contains_key(bouncer_testkit::RESTARTED_AT));
}

/// One due workload of each kind bouncer restarts (Deployment, StatefulSet, DaemonSet; the
/// kinds a policy covers by default) is bounced by the same run, each verified: restartedAt
/// intact on its template and every pod new.
#[tokio::test]
async fn a_workload_of_each_kind_is_bounced_and_verified() {
    use bouncer_testkit::{Kind, daemonset, statefulset};
    let client = client().await;
    let ns = TestNs::new(&client, "kinds").await;
    let n = ns.name();
    let labels = |app: &'static str| [("app", app), ("bounce", "kinds")];
    create(&client, n, &deployment("web", 2, &labels("web")))
        .await
        .unwrap();
    create(&client, n, &statefulset("db", 2, &labels("db")))
        .await
        .unwrap();
    create(&client, n, &daemonset("agent", &labels("agent")))
        .await
        .unwrap();
    for (kind, name) in [
        (Kind::Deployment, "web"),
        (Kind::StatefulSet, "db"),
        (Kind::DaemonSet, "agent"),
    ] {
        wait_rollout_complete(&client, kind, n, name, READY)
            .await
            .unwrap_or_else(|e| panic!("{name} ready: {e:#}"));
    }
    let before: Vec<String> = pods(&client, n, "bounce=kinds")
        .await
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let policies = Policies::new(&[(
        "kinds.yaml",
        &policy(
            "kinds",
            n,
            "{bounce: kinds}",
            "  triggers:\n    schedule: {cron: \"* * * * *\", startingDeadline: 5m}\n  cooldown: 1s\n",
        ),
    )]);
    next_minute(Duration::from_secs(1)).await;
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    let mut bounced = run.bounced();
    bounced.sort();
    assert_eq!(bounced, ["agent", "db", "web"], "{:#}", run.report);
    for name in ["agent", "db", "web"] {
        let row = run.row(name);
        assert_eq!(row["method"], "rollout", "{row:#}");
        let verification = row["verification"].to_string();
        assert!(verification.contains("restartedAt intact"), "{row:#}");
    }
    let after = pods(&client, n, "bounce=kinds").await;
    assert_eq!(after.len(), before.len());
    assert!(
        after
            .iter()
            .all(|p| !before.contains(p.metadata.uid.as_ref().unwrap())),
        "every pod replaced"
    );
}
