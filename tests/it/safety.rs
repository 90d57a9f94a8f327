//! "Never make an outage worse": every pre-flight gate skips with its reason and touches nothing,
//! the fresh read right before acting catches a change made after the plan, and a stuck rollout
//! halts the queue.

use bouncer_testkit::PodTemplateExt as _;
use std::collections::BTreeMap;
use std::time::Duration;

use bouncer_testkit::rollout::wait_list;
use bouncer_testkit::{
    TestNs, client, create, deployment, pod_template, statefulset, wait_pods_ready,
};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;

use crate::harness::{
    EVERY_MINUTE, Policies, apply, audit_mark, audit_since, audited, bouncer, bouncer_events,
    deploy, finish, next_minute, patch_deployment, patches_of, pod_uids, policy, restarted_at_of,
    spawn_bouncer, statefulset as get_statefulset, stuck_on_restart, wait_restarted_at,
};

/// Generous: the whole control plane shares two cores with every test running at once.
const READY: Duration = Duration::from_secs(180);

fn on_delete(mut s: StatefulSet) -> StatefulSet {
    let spec = s.spec.as_mut().unwrap();
    spec.update_strategy = Some(serde_json::from_value(json!({"type": "OnDelete"})).unwrap());
    s
}

async fn sts(client: &Client, ns: &str, s: StatefulSet, selector: &str) {
    let replicas = s.spec.as_ref().unwrap().replicas.unwrap() as usize;
    create(client, ns, &s).await.expect("create statefulset");
    wait_pods_ready(client, ns, selector, replicas, READY)
        .await
        .expect("statefulset pods ready");
}

/// One run over a workload per gate (plus a control that is bounced): each gated workload is
/// reported as a skip with its reason code, and none of them is patched, evicted or restarted.
#[tokio::test]
async fn every_gate_skips_and_touches_nothing() {
    let client = client().await;
    let ns = TestNs::new(&client, "gates").await;
    let other = TestNs::new(&client, "gates-excl").await;
    let (n, o) = (ns.name(), other.name());
    let exclude = json!({"metadata": {"annotations": {"bouncer.dev/exclude": "true"}}});
    Api::<Namespace>::all(client.clone())
        .patch(o, &PatchParams::default(), &Patch::Merge(&exclude))
        .await
        .unwrap();

    let gate = |app: &'static str| [("app", app), ("gate", "yes")];
    deploy(&client, n, deployment("control", 1, &gate("control"))).await;
    deploy(&client, n, deployment("paused", 1, &gate("paused"))).await;
    deploy(&client, n, deployment("rolling", 1, &gate("rolling"))).await;
    let mut optout = deployment("optout", 1, &gate("optout"));
    optout.metadata.annotations =
        Some([("bouncer.dev/exclude".to_string(), "true".to_string())].into());
    deploy(&client, n, optout).await;
    deploy(&client, o, deployment("elsewhere", 1, &gate("elsewhere"))).await;
    sts(
        &client,
        n,
        statefulset("single", 1, &gate("single")),
        "app=single",
    )
    .await;
    sts(
        &client,
        n,
        on_delete(statefulset("guarded", 2, &gate("guarded"))),
        "app=guarded",
    )
    .await;
    sts(
        &client,
        n,
        on_delete(statefulset(
            "ondelete",
            1,
            &[("app", "ondelete"), ("gate", "rollout")],
        )),
        "app=ondelete",
    )
    .await;
    apply(&format!(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: guarded, namespace: {n}}}\n\
         spec: {{minAvailable: 2, selector: {{matchLabels: {{app: guarded}}}}}}\n"
    ));
    let mut job_pod = pod_template(&gate("batch"));
    job_pod.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    let job = Job {
        metadata: ObjectMeta {
            name: Some("batch".into()),
            ..Default::default()
        },
        spec: Some(JobSpec {
            template: job_pod,
            backoff_limit: Some(0),
            ..Default::default()
        }),
        ..Default::default()
    };
    create(&client, n, &job).await.expect("create job");
    wait_list(
        Api::<Pod>::namespaced(client.clone(), n),
        watcher::Config::default().labels("app=batch"),
        READY,
        "job pod",
        |p| (!p.is_empty()).then_some(()),
    )
    .await
    .unwrap();

    // Put the two Deployments into the states their gates look for.
    patch_deployment(&client, n, "paused", json!({"spec": {"paused": true}})).await;
    let nowhere = json!({"spec": {"template": {"spec": {"nodeSelector": {"bouncer.dev/no-such-node": "true"}}}}});
    patch_deployment(&client, n, "rolling", nowhere).await;

    let policies = Policies::new(&[
        (
            "gates.yaml",
            &policy(
                "gates",
                &format!("{n}, {o}"),
                "{gate: \"yes\"}",
                EVERY_MINUTE,
            ),
        ),
        (
            "rollout.yaml",
            &policy(
                "rollout-only",
                n,
                "{gate: rollout}",
                &format!("{EVERY_MINUTE}  restart: {{method: rollout}}\n"),
            ),
        ),
    ]);
    next_minute(Duration::from_secs(1)).await;
    let mut before = BTreeMap::new();
    for app in [
        "paused", "rolling", "optout", "single", "guarded", "ondelete", "batch",
    ] {
        before.insert(app, pod_uids(&client, n, &format!("app={app}")).await);
    }
    let elsewhere_before = pod_uids(&client, o, "app=elsewhere").await;
    let mark = audit_mark();

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.bounced(), ["control"], "{:#}", run.report);
    let expected = [
        ("paused", "paused"),
        ("rolling", "rolloutInProgress"),
        ("optout", "excluded"),
        ("elsewhere", "namespaceExcluded"),
        ("single", "downtime"),
        ("guarded", "pdbBlocks"),
        ("ondelete", "onDelete"),
    ];
    for (name, code) in expected {
        let row = run.row(name);
        assert_eq!(
            (row["decision"].as_str(), row["reasonCode"].as_str()),
            (Some("skip"), Some(code)),
            "{row:#}"
        );
    }
    let job_row = run
        .rows()
        .into_iter()
        .find(|r| r["reasonCode"] == "unsupportedOwner")
        .expect("a row for the Job's pod");
    assert_eq!(job_row["workload"]["kind"], "Pod");
    assert!(
        job_row["reason"].as_str().unwrap().contains("Job batch"),
        "{job_row:#}"
    );

    // The cluster agrees: only the control carries a restartedAt, every other pod is the same pod.
    assert!(restarted_at_of(&client, n, "control").await.is_some());
    for name in ["paused", "rolling", "optout"] {
        assert_eq!(
            restarted_at_of(&client, n, name).await,
            None,
            "{name} was patched"
        );
    }
    assert_eq!(
        restarted_at_of(&client, o, "elsewhere").await,
        None,
        "elsewhere was patched"
    );
    for name in ["single", "guarded", "ondelete"] {
        assert_eq!(
            get_statefulset(&client, n, name)
                .await
                .template_annotation(bouncer_testkit::RESTARTED_AT),
            None,
            "{name} was patched"
        );
    }
    for (app, uids) in &before {
        assert_eq!(
            &pod_uids(&client, n, &format!("app={app}")).await,
            uids,
            "pods of {app} changed"
        );
    }
    assert_eq!(
        pod_uids(&client, o, "app=elsewhere").await,
        elsewhere_before
    );
    assert_eq!(
        patches_of(mark, n),
        ["control"],
        "bouncer patched only the control"
    );
    let log = audit_since(mark);
    assert!(audited(&log, "patch", "statefulsets", n).is_empty());
    assert!(
        audited(&log, "create", "pods/eviction", n).is_empty(),
        "bouncer evicted a pod"
    );
    assert!(
        log.iter()
            .all(|e| e["objectRef"]["namespace"] != o || e["verb"] == "get" || e["verb"] == "list")
    );
}

/// The plan is only a plan: a Deployment paused while the bounce before it runs is re-checked on
/// a fresh read, reported as skipped (paused) and never patched.
#[tokio::test]
async fn fresh_read_catches_a_pause_made_during_the_run() {
    let client = client().await;
    let ns = TestNs::new(&client, "recheck").await;
    let n = ns.name();
    // minReadySeconds makes each rollout last long enough to act while it runs.
    for name in ["first", "second"] {
        let mut d = deployment(name, 2, &[("app", name), ("recheck", "yes")]);
        d.spec.as_mut().unwrap().min_ready_seconds = Some(5);
        deploy(&client, n, d).await;
    }
    let policies = Policies::new(&[(
        "p.yaml",
        &policy("recheck", n, "{recheck: \"yes\"}", EVERY_MINUTE),
    )]);
    next_minute(Duration::from_secs(1)).await;
    let plan = bouncer(&["plan"], &policies, n).await;
    assert_eq!(plan.queue().len(), 2, "both are due: {:#}", plan.report);
    let mark = audit_mark();

    let running = spawn_bouncer(&["run"], &policies, n, &[]);
    // Whichever the queue puts first gets patched first; pause the other one right then.
    let (bounced, paused) = tokio::select! {
        _ = wait_restarted_at(&client, n, "first", READY) => ("first", "second"),
        _ = wait_restarted_at(&client, n, "second", READY) => ("second", "first"),
    };
    let paused_pods = pod_uids(&client, n, &format!("app={paused}")).await;
    patch_deployment(&client, n, paused, json!({"spec": {"paused": true}})).await;
    let run = finish(running).await;

    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.row(bounced)["decision"], "bounced", "{:#}", run.report);
    let row = run.row(paused);
    assert_eq!(
        (row["decision"].as_str(), row["reasonCode"].as_str()),
        (Some("skipped"), Some("paused")),
        "{row:#}"
    );
    assert!(row["patchedAt"].is_null(), "{row:#}");
    assert_eq!(
        restarted_at_of(&client, n, paused).await,
        None,
        "{paused} was patched after it was paused"
    );
    assert_eq!(
        pod_uids(&client, n, &format!("app={paused}")).await,
        paused_pods
    );
    assert_eq!(patches_of(mark, n), [bounced]);
}

/// A rollout that cannot progress (its surge pod can never be scheduled) fails the bounce on the
/// progress deadline; the queue halts, the next workload is not attempted, and the failure is
/// recorded as a BounceFailed Event. Exit code 1.
#[tokio::test]
async fn a_stuck_rollout_fails_and_halts_the_queue() {
    let client = client().await;
    let ns = TestNs::new(&client, "stuck").await;
    let n = ns.name();
    let mut stuck =
        stuck_on_restart(&client, "a-stuck", &[("app", "a-stuck"), ("halt", "yes")]).await;
    stuck.spec.as_mut().unwrap().progress_deadline_seconds = Some(10);
    deploy(&client, n, stuck).await;
    // Created after, and named after: the queue puts it second either way.
    deploy(
        &client,
        n,
        deployment("b-next", 1, &[("app", "b-next"), ("halt", "yes")]),
    )
    .await;
    // The policy timeout is only a backstop; the progress deadline should trip first.
    let extra = format!("{EVERY_MINUTE}  restart: {{timeout: 75s}}\n");
    let policies = Policies::new(&[("p.yaml", &policy("halt", n, "{halt: \"yes\"}", &extra))]);
    next_minute(Duration::from_secs(1)).await;
    let next_pods = pod_uids(&client, n, "app=b-next").await;
    let mark = audit_mark();

    let started = std::time::Instant::now();
    let run = bouncer(&["run"], &policies, n).await;
    let took = started.elapsed();
    assert_eq!(
        run.code, 1,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(
        run.queue(),
        [
            ("a-stuck".to_string(), "failed".to_string()),
            ("b-next".to_string(), "notAttempted".to_string())
        ]
    );
    let reason = run.row("a-stuck")["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("progress deadline") || reason.contains("did not complete within"),
        "{reason}"
    );
    assert!(
        took < Duration::from_secs(150),
        "the failed bounce took {took:?}"
    );
    assert_eq!(run.report["summary"]["notAttempted"], 1);

    assert!(restarted_at_of(&client, n, "a-stuck").await.is_some());
    assert_eq!(
        restarted_at_of(&client, n, "b-next").await,
        None,
        "b-next was patched after the halt"
    );
    assert_eq!(pod_uids(&client, n, "app=b-next").await, next_pods);
    let failed = bouncer_events(&client, n, "a-stuck", "BounceFailed").await;
    assert_eq!(failed.len(), 1, "one BounceFailed Event on a-stuck");
    assert_eq!(failed[0].type_.as_deref(), Some("Warning"));
    assert!(
        bouncer_events(&client, n, "b-next", "Bounced")
            .await
            .is_empty()
    );
    // The restart and, once it failed, the failure in its attempt mark; never retried.
    assert_eq!(
        patches_of(mark, n),
        ["a-stuck", "a-stuck"],
        "a-stuck's restart and its failure's mark, never retried"
    );
}
