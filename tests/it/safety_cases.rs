//! The safety review's "eight ways a bounce can still make an outage worse": the cases where the real
//! cluster matters. A failed eviction bounce is not repeated (case 1), a partitioned
//! StatefulSet is skipped and never patched (case 4), and a revert that lands after the
//! verification is caught by the run's final re-check (case 8). The pure rules (cases 2-7) are
//! unit tests next to the planner, the rollout rules, the verifier and the lock.

use std::time::Duration;

use bouncer_testkit::{TestNs, client, create, deployment, statefulset, wait_pods_ready};
use chrono::{Timelike, Utc};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::harness::{
    EVERY_MINUTE, Policies, bouncer, bouncer_events, deploy, finish, next_minute, pod_uids, policy,
    restarted_at_of, spawn_bouncer, statefulset as get_statefulset, wait_restarted_at,
};

const READY: Duration = Duration::from_secs(180);
use bouncer_testkit::ATTEMPT_MARK as ATTEMPT;

fn attempt_mark(s: &StatefulSet) -> serde_json::Value {
    let text = s
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ATTEMPT))
        .unwrap_or_else(|| panic!("no {ATTEMPT} on {:?}", s.metadata.name));
    serde_json::from_str(text).expect("the mark is JSON")
}

/// Case 1: an OnDelete StatefulSet of three, bounced by eviction; the first pod's replacement
/// outlasts the timeout (KWOK deletes a pod only after its full grace period), so the bounce
/// fails and halts. It took no longer than its timeout, and left a durable mark. The next run,
/// once the first pod is fresh again and the cooldown has passed, must not evict anything: the
/// fire was attempted. Before the fix it evicted the already-fresh first pod again.
#[tokio::test]
async fn case1_failed_eviction_not_repeated() {
    let client = client().await;
    let ns = TestNs::new(&client, "case1").await;
    let n = ns.name();
    let labels = [("app", "db"), ("case1", "yes")];
    let mut s = statefulset("db", 3, &labels);
    let spec = s.spec.as_mut().unwrap();
    spec.update_strategy = Some(serde_json::from_value(json!({"type": "OnDelete"})).unwrap());
    spec.template
        .spec
        .as_mut()
        .unwrap()
        .termination_grace_period_seconds = Some(25);
    create(&client, n, &s).await.expect("create statefulset");
    wait_pods_ready(&client, n, "app=db", 3, READY)
        .await
        .expect("statefulset pods ready");
    // Fires once an hour, at the coming minute: both runs below serve the same fire.
    let minute = (Utc::now() + chrono::Duration::minutes(1)).minute();
    let extra = format!(
        "    kinds: [StatefulSet]\n  triggers:\n    schedule: {{cron: \"{minute} * * * *\", startingDeadline: 30m}}\n  cooldown: 1s\n  restart: {{timeout: 15s}}\n"
    );
    let policies = Policies::new(&[("p.yaml", &policy("db", n, "{case1: \"yes\"}", &extra))]);
    next_minute(Duration::from_secs(2)).await;

    let first = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        first.code, 1,
        "stderr: {}\nreport: {:#}",
        first.stderr, first.report
    );
    let row = first.row("db");
    assert_eq!(
        (row["decision"].as_str(), row["method"].as_str()),
        (Some("failed"), Some("evict")),
        "{row:#}"
    );
    let took = row["durationSeconds"].as_f64().unwrap();
    assert!(
        took < 15.0 + 5.0,
        "one bounce took {took}s with a 15s timeout"
    );

    // db-0 comes back fresh; db-1 and db-2 are still from before the fire.
    let fresh = wait_pods_ready(&client, n, "app=db", 3, READY)
        .await
        .expect("db-0 replaced");
    let before = pod_uids(&client, n, "app=db").await;
    assert_eq!(fresh.len(), 3);
    let second = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        second.code, 0,
        "stderr: {}\nreport: {:#}",
        second.stderr, second.report
    );
    let row = second.row("db");
    assert_eq!(row["decision"], "skip", "{row:#}");
    assert!(
        row["reason"]
            .as_str()
            .is_some_and(|r| r.contains("already attempted")),
        "{row:#}"
    );
    assert_eq!(
        pod_uids(&client, n, "app=db").await,
        before,
        "the second run evicted a pod"
    );
    // The durable mark of the failed attempt, which the second run honoured.
    let mark = attempt_mark(&get_statefulset(&client, n, "db").await);
    assert_eq!(
        (mark["outcome"].as_str(), mark["method"].as_str()),
        (Some("failed"), Some("evict")),
        "{mark}"
    );
}

/// Case 4: a StatefulSet with `partition: 1` would have only ordinal 1 rolled; it is skipped
/// with its reason and never patched, while a control StatefulSet is bounced and verified.
#[tokio::test]
async fn case4_partition_is_skipped_and_never_patched() {
    let client = client().await;
    let ns = TestNs::new(&client, "case4").await;
    let n = ns.name();
    let mut held = statefulset("held", 2, &[("app", "held"), ("case4", "yes")]);
    held.spec.as_mut().unwrap().update_strategy = Some(
        serde_json::from_value(json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}))
            .unwrap(),
    );
    let control = statefulset("control", 2, &[("app", "control"), ("case4", "yes")]);
    for (s, selector) in [(held, "app=held"), (control, "app=control")] {
        create(&client, n, &s).await.expect("create statefulset");
        wait_pods_ready(&client, n, selector, 2, READY)
            .await
            .expect("pods ready");
    }
    let held_pods = pod_uids(&client, n, "app=held").await;
    let policies = Policies::new(&[("p.yaml", &policy("p", n, "{case4: \"yes\"}", EVERY_MINUTE))]);
    next_minute(Duration::from_secs(1)).await;
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.bounced(), ["control"], "{:#}", run.report);
    assert_eq!(
        run.row("held")["reasonCode"],
        "partitioned",
        "{:#}",
        run.report
    );
    let s = get_statefulset(&client, n, "held").await;
    let template = s.spec.unwrap().template.metadata.unwrap_or_default();
    assert!(
        !template
            .annotations
            .unwrap_or_default()
            .contains_key(bouncer_testkit::RESTARTED_AT),
        "the partitioned StatefulSet was patched"
    );
    assert_eq!(pod_uids(&client, n, "app=held").await, held_pods);
}

/// Case 8: an owner that rewrites restartedAt after the rollout completed, the settle passed and
/// the queue confirmed it (here while the next bounce runs) restarts the pods a second time. The run's final re-check
/// reports the first bounce reverted, naming the manager, and exits 1; the other bounce says
/// when it was last confirmed.
#[tokio::test]
async fn case8_late_revert_is_reported_reverted() {
    let client = client().await;
    let ns = TestNs::new(&client, "case8").await;
    let n = ns.name();
    deploy(
        &client,
        n,
        deployment("a-late", 1, &[("app", "a-late"), ("case8", "yes")]),
    )
    .await;
    // minReadySeconds keeps the second bounce busy while the first one is reverted.
    let mut slow = deployment("b-slow", 1, &[("app", "b-slow"), ("case8", "yes")]);
    slow.spec.as_mut().unwrap().min_ready_seconds = Some(12);
    deploy(&client, n, slow).await;
    let policies = Policies::new(&[("p.yaml", &policy("p", n, "{case8: \"yes\"}", EVERY_MINUTE))]);
    next_minute(Duration::from_secs(1)).await;

    let running = spawn_bouncer(&["run"], &policies, n, &[]);
    // a-late is first (oldest pods). The queue confirms it before b-slow starts (Safety rule
    // 18); the revert comes once b-slow is patched, while its rollout runs.
    wait_restarted_at(&client, n, "b-slow", READY).await;
    let revert = json!({"spec": {"template": {"metadata": {"annotations": {
        bouncer_testkit::RESTARTED_AT: "2020-01-01T00:00:00Z"}}}}});
    let params = PatchParams {
        field_manager: Some("late-operator".into()),
        ..Default::default()
    };
    Api::<Deployment>::namespaced(client.clone(), n)
        .patch("a-late", &params, &Patch::Merge(&revert))
        .await
        .expect("late revert");
    let run = finish(running).await;

    assert_eq!(
        run.code, 1,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    let late = run.row("a-late");
    assert_eq!(late["decision"], "reverted", "{late:#}");
    assert!(
        late["reason"]
            .as_str()
            .is_some_and(|r| r.contains("late-operator")),
        "{late:#}"
    );
    // Confirmed intact before b-slow started; reverted after that.
    assert!(late["lastConfirmed"].is_string(), "{late:#}");
    let other = run.row("b-slow");
    assert_eq!(other["decision"], "bounced", "{other:#}");
    assert!(other["lastConfirmed"].is_string(), "{other:#}");
    assert_eq!(
        restarted_at_of(&client, n, "a-late").await.as_deref(),
        Some("2020-01-01T00:00:00Z")
    );
    assert_eq!(
        bouncer_events(&client, n, "a-late", "BounceReverted")
            .await
            .len(),
        1
    );
}
