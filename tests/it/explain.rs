//! `bouncer explain` on the real cluster: the numbers and the decision for one workload, agreeing
//! with what `plan` decides, and not one write.

use std::time::Duration;

use bouncer_testkit::{
    Kind, PodTemplateExt, TestNs, client, create, deployment, wait_pod_memory,
    wait_rollout_complete,
};
use serde_json::Value;

use crate::harness::{Policies, audit_mark, audit_since, bouncer, pods, policy};

const READY: Duration = Duration::from_secs(120);

fn step<'a>(policy: &'a Value, name: &str) -> &'a Value {
    policy["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["step"] == name))
        .unwrap_or_else(|| panic!("no {name} step in {policy:#}"))
}

#[tokio::test]
async fn explain_shows_each_policy_trigger_and_gate_and_writes_nothing() {
    let client = client().await;
    let ns = TestNs::new(&client, "explain").await;
    let n = ns.name();
    let d = deployment("api", 2, &[("app", "api")]).with_memory("300Mi", "0");
    create(&client, n, &d).await.expect("create deployment");
    wait_rollout_complete(&client, Kind::Deployment, n, "api", READY)
        .await
        .expect("deployment ready");
    for pod in pods(&client, n, "app=api").await {
        let name = pod.metadata.name.clone().unwrap_or_default();
        wait_pod_memory(&client, n, &name, READY, |m| m.is_some())
            .await
            .expect("metrics-server reports the pod")
            .expect("metrics present");
    }
    let memory = policy(
        "mem",
        n,
        "{app: api}",
        "  triggers:\n    memory: {above: 256Mi}\n  cooldown: 1s\n",
    );
    let nightly = policy(
        "nightly",
        n,
        "{app: api}",
        "  triggers:\n    schedule: {cron: '0 3 * * *'}\n",
    );
    let elsewhere = policy(
        "other",
        n,
        "{app: web}",
        "  triggers:\n    memory: {above: 1Gi}\n",
    );
    let policies = Policies::new(&[
        ("mem.yaml", &memory),
        ("nightly.yaml", &nightly),
        ("other.yaml", &elsewhere),
    ]);
    let mark = audit_mark();

    let target = format!("deploy/{n}/api");
    let out = bouncer(&["explain", &target], &policies, n).await;
    assert_eq!(out.code, 0, "{}\n{}", out.stderr, out.stdout);
    let e = &out.report;
    assert_eq!(e["workload"]["name"], "api", "{e:#}");
    assert_eq!(
        (e["pods"].as_u64(), e["policiesLoaded"].as_u64()),
        (Some(2), Some(3))
    );
    let names: Vec<&str> = e["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["policy"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["mem", "nightly"]);
    let mem = &e["policies"][0];
    assert_eq!(step(mem, "memory")["result"], "fired", "{mem:#}");
    assert!(
        step(mem, "memory")["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("> 256Mi"),
        "{mem:#}"
    );
    assert_eq!(step(mem, "pre-flight")["result"], "pass", "{mem:#}");
    assert_eq!(mem["decision"], "bounce", "{mem:#}");
    let nightly = &e["policies"][1];
    assert_eq!(
        step(nightly, "schedule")["result"],
        "notFired",
        "{nightly:#}"
    );
    assert_eq!(nightly["reasonCode"], "notDue", "{nightly:#}");
    assert_eq!(e["decision"], "bounce #1 of 1 by policy mem", "{e:#}");

    // The plan agrees.
    let plan = bouncer(&["plan"], &policies, n).await;
    assert_eq!(plan.queue(), [("api".to_string(), "bounce".to_string())]);

    let log = audit_since(mark);
    // Other tests' runs write meanwhile in their own namespaces.
    let writes: Vec<&Value> = log
        .iter()
        .filter(|e| !matches!(e["verb"].as_str(), Some("get" | "list" | "watch")))
        .filter(|e| {
            e["objectRef"]["namespace"]
                .as_str()
                .is_none_or(|ns| ns == n)
        })
        .collect();
    assert!(writes.is_empty(), "explain and plan wrote: {writes:#?}");

    let missing = bouncer(&["explain", &format!("sts/{n}/api")], &policies, n).await;
    assert_eq!(missing.code, 1, "{}", missing.stderr);
    assert!(missing.stderr.contains("not found"), "{}", missing.stderr);
    let bad = bouncer(&["explain", "job/x/y"], &policies, n).await;
    assert_eq!(bad.code, 2, "{}", bad.stderr);
}
