//! The bounce machine on the real API server: what changes during a run (a namespace opt-out,
//! a revert after verification, a group member that became unbounceable, a revert of a
//! singleton) is seen before the next action, and never answered by more disruption.

use std::time::Duration;

use bouncer_testkit::{
    ATTEMPT_MARK, Kind, RESTARTED_AT, TestNs, client, deployment, wait_rollout_complete,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::harness::{
    EVERY_MINUTE, Policies, audit_mark, audit_since, audited, bouncer, bouncer_env, bouncer_events,
    deploy, deployment as deployment_of, finish, next_minute, patch_deployment, pod_uids, policy,
    restarted_at_of, rollout_restart, set_image, spawn_bouncer, wait_restarted_at,
};

const READY: Duration = Duration::from_secs(180);

/// A Deployment whose rollouts take a while (minReadySeconds), so a test can act during one.
fn slow(name: &str, replicas: i32, labels: &[(&str, &str)]) -> Deployment {
    let mut d = deployment(name, replicas, labels);
    d.spec.as_mut().unwrap().min_ready_seconds = Some(5);
    d
}

/// `a-first` (slow, two pods; created first, so its pods are the oldest and the queue bounces it
/// first) and `b-next` (one pod, whose manifest is returned), both labelled `LABEL: "yes"`, and a
/// policy over them on every minute; returns once the minute's fire has passed.
async fn first_and_next(client: &Client, n: &str, label: &str) -> (Policies, Deployment) {
    deploy(
        client,
        n,
        slow("a-first", 2, &[("app", "a-first"), (label, "yes")]),
    )
    .await;
    let next = deployment("b-next", 1, &[("app", "b-next"), (label, "yes")]);
    deploy(client, n, next.clone()).await;
    let selector = format!("{{{label}: \"yes\"}}");
    let policies = Policies::new(&[("p.yaml", &policy(label, n, &selector, EVERY_MINUTE))]);
    next_minute(Duration::from_secs(1)).await;
    (policies, next)
}

/// An owner that takes kubectl's restartedAt away as soon as it sees it (as a GitOps
/// controller or an operator that reconciles its template does), until aborted.
fn revert_restarts(client: &Client, ns: &str, name: &'static str) -> tokio::task::JoinHandle<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    tokio::spawn(async move {
        let remove = json!({"spec": {"template": {"metadata": {"annotations": {
            RESTARTED_AT: null
        }}}}});
        let params = PatchParams {
            field_manager: Some("owner".into()),
            ..Default::default()
        };
        loop {
            if let Ok(d) = api.get(name).await
                && d.spec
                    .as_ref()
                    .and_then(|s| s.template.metadata.as_ref())
                    .and_then(|m| m.annotations.as_ref())
                    .is_some_and(|a| a.contains_key(RESTARTED_AT))
            {
                let _ = api.patch(name, &params, &Patch::Merge(&remove)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Hole 9: the namespace opts out while the first bounce rolls; the second, planned before, is
/// skipped on its fresh read (namespaceExcluded) and never patched.
#[tokio::test]
async fn a_namespace_opt_out_during_the_run_stops_the_next_bounce() {
    let client = client().await;
    let ns = TestNs::new(&client, "optout-live").await;
    let n = ns.name();
    for name in ["first", "second"] {
        deploy(&client, n, slow(name, 2, &[("app", name), ("live", "yes")])).await;
    }
    let policies = Policies::new(&[(
        "p.yaml",
        &policy("live", n, "{live: \"yes\"}", EVERY_MINUTE),
    )]);
    next_minute(Duration::from_secs(1)).await;
    let running = spawn_bouncer(&["run"], &policies, n, &[]);
    let (bounced, left) = tokio::select! {
        _ = wait_restarted_at(&client, n, "first", READY) => ("first", "second"),
        _ = wait_restarted_at(&client, n, "second", READY) => ("second", "first"),
    };
    let exclude = json!({"metadata": {"annotations": {"bouncer.dev/exclude": "true"}}});
    Api::<Namespace>::all(client.clone())
        .patch(n, &PatchParams::default(), &Patch::Merge(&exclude))
        .await
        .unwrap();
    let run = finish(running).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.row(bounced)["decision"], "bounced", "{:#}", run.report);
    let row = run.row(left);
    assert_eq!(
        (row["decision"].as_str(), row["reasonCode"].as_str()),
        (Some("skipped"), Some("namespaceExcluded")),
        "{row:#}"
    );
    assert_eq!(
        restarted_at_of(&client, n, left).await,
        None,
        "{left} was patched"
    );
}

/// Hole 10: an owner reverts the first restart a few seconds after its rollout completed; the
/// queue sees it before the second bounce starts, halts, and the second is never patched.
#[tokio::test]
async fn a_revert_after_the_verification_halts_the_queue_before_the_next_rollout() {
    let client = client().await;
    let ns = TestNs::new(&client, "late-revert").await;
    let n = ns.name();
    let (policies, _) = first_and_next(&client, n, "late").await;
    let next_pods = pod_uids(&client, n, "app=b-next").await;
    let running = spawn_bouncer(&["run"], &policies, n, &[("BOUNCER_VERIFY_SETTLE", "10s")]);
    wait_restarted_at(&client, n, "a-first", READY).await;
    wait_rollout_complete(&client, Kind::Deployment, n, "a-first", READY)
        .await
        .expect("a-first rolled out");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reverter = revert_restarts(&client, n, "a-first");
    let run = finish(running).await;
    reverter.abort();
    assert_eq!(
        run.code, 1,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(
        run.queue(),
        [
            ("a-first".to_string(), "reverted".to_string()),
            ("b-next".to_string(), "notAttempted".to_string())
        ],
        "{:#}",
        run.report
    );
    assert_eq!(restarted_at_of(&client, n, "b-next").await, None);
    assert_eq!(pod_uids(&client, n, "app=b-next").await, next_pods);
}

/// Hole 12: a group whose second member became unbounceable during the first member's rollout
/// is finished on the next run, though the first member is in its cooldown; groups are told
/// apart by namespace.
#[tokio::test]
async fn a_half_restarted_group_is_finished_on_the_next_run() {
    let client = client().await;
    let ns = TestNs::new(&client, "half-group").await;
    let n = ns.name();
    let labels = |app: &'static str| [("app", app), ("grp", "g1")];
    deploy(&client, n, slow("a-backend", 2, &labels("a-backend"))).await;
    deploy(&client, n, deployment("b-proxy", 1, &labels("b-proxy"))).await;
    // A cooldown the pods are past at the first run, and the backend is not at the second.
    let doc = format!(
        "apiVersion: bouncer.dev/v1alpha1\nkind: BouncePolicy\nmetadata:\n  name: grouped\nspec:\n  target:\n    namespaces: [{n}]\n    selector:\n      matchLabels: {{grp: g1}}\n    groupBy: grp\n  triggers:\n    schedule: {{cron: \"* * * * *\", startingDeadline: 5m}}\n  cooldown: 75s\n"
    );
    let policies = Policies::new(&[("p.yaml", &doc)]);
    tokio::time::sleep(Duration::from_secs(75)).await;
    next_minute(Duration::from_secs(1)).await;
    let running = spawn_bouncer(&["run"], &policies, n, &[]);
    // The backend goes first (it is older and named first); the proxy is paused meanwhile.
    wait_restarted_at(&client, n, "a-backend", READY).await;
    patch_deployment(&client, n, "b-proxy", json!({"spec": {"paused": true}})).await;
    let first = finish(running).await;
    assert_eq!(
        first.row("a-backend")["decision"],
        "bounced",
        "{:#}",
        first.report
    );
    assert_eq!(
        first.row("b-proxy")["reasonCode"],
        "paused",
        "{:#}",
        first.report
    );

    patch_deployment(&client, n, "b-proxy", json!({"spec": {"paused": false}})).await;
    wait_rollout_complete(&client, Kind::Deployment, n, "b-proxy", READY)
        .await
        .expect("b-proxy resumed");
    let second = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        second.code, 0,
        "stderr: {}\nreport: {:#}",
        second.stderr, second.report
    );
    assert_eq!(second.bounced(), ["b-proxy"], "{:#}", second.report);
    // The backend, in its cooldown, does not hold the group (the old planner held it there):
    // the proxy is bounced, as the group's unfinished member or by its own next fire.
    assert_eq!(
        second.row("a-backend")["decision"],
        "skip",
        "{:#}",
        second.report
    );
}

/// Hole 2: a single-replica Deployment whose restart an owner reverts, under onRevert: evict
/// without allowDowntime, is reported reverted and its only pod is not evicted.
#[tokio::test]
async fn a_reverted_singleton_is_not_evicted_without_allow_downtime() {
    let client = client().await;
    let ns = TestNs::new(&client, "revert-single").await;
    let n = ns.name();
    deploy(&client, n, deployment("solo", 1, &[("app", "solo")])).await;
    let extra = format!("{EVERY_MINUTE}  restart: {{onRevert: evict}}\n");
    let policies = Policies::new(&[("p.yaml", &policy("solo", n, "{app: solo}", &extra))]);
    next_minute(Duration::from_secs(1)).await;
    let reverter = revert_restarts(&client, n, "solo");
    let mark = audit_mark();
    let run = bouncer_env(&["run"], &policies, n, &[]).await;
    reverter.abort();
    let row = run.row("solo");
    assert_eq!(row["decision"], "reverted", "{row:#}");
    assert!(
        row["verification"]
            .as_str()
            .unwrap_or_default()
            .contains("nothing evicted"),
        "{row:#}"
    );
    assert_eq!(run.code, 1, "stderr: {}", run.stderr);
    let log = audit_since(mark);
    assert!(
        audited(&log, "create", "pods/eviction", n).is_empty(),
        "the only pod was evicted"
    );
}

/// Overtaken: a `kubectl rollout restart` lands on the Deployment while bouncer waits on its
/// rollout. The bounce is `superseded` (neither bounced nor failed), told in a Normal Event and
/// marked so; the queue goes on to the next workload and the run exits 0.
#[tokio::test]
async fn a_restart_that_overtakes_bouncer_s_is_superseded_and_the_queue_goes_on() {
    let client = client().await;
    let ns = TestNs::new(&client, "overtaken").await;
    let n = ns.name();
    let (policies, _) = first_and_next(&client, n, "over").await;
    let running = spawn_bouncer(&["run"], &policies, n, &[("BOUNCER_VERIFY_SETTLE", "5s")]);
    let written = wait_restarted_at(&client, n, "a-first", READY).await;
    // kubectl writes whole seconds: a second later, its restart is a later one.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    rollout_restart(n, "a-first");
    let later = restarted_at_of(&client, n, "a-first")
        .await
        .expect("kubectl's restartedAt");
    assert!(later > written, "{later} after {written}");
    let run = finish(running).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(
        run.queue(),
        [
            ("a-first".to_string(), "superseded".to_string()),
            ("b-next".to_string(), "bounced".to_string())
        ],
        "{:#}",
        run.report
    );
    let row = run.row("a-first");
    assert_eq!(row["reasonCode"], "superseded", "{row:#}");
    assert!(
        row["reason"]
            .as_str()
            .is_some_and(|r| r.contains(later.as_str())),
        "{row:#}"
    );
    assert_eq!(run.report["summary"]["superseded"], 1, "{:#}", run.report);
    assert_eq!(run.report["summary"]["failed"], 0, "{:#}", run.report);
    assert_eq!(
        bouncer_events(&client, n, "a-first", "BounceSuperseded")
            .await
            .len(),
        1
    );
    let mark = deployment_of(&client, n, "a-first")
        .await
        .metadata
        .annotations
        .unwrap_or_default()
        .remove(ATTEMPT_MARK)
        .expect("the attempt mark");
    assert!(mark.contains("\"outcome\":\"superseded\""), "{mark}");
}

/// Identity: the second workload is deleted and recreated under its name (a new UID) while the
/// first one rolls. Its fresh read finds another object than the plan judged: skipped as
/// `replaced`, and the new object is neither restarted nor marked.
#[tokio::test]
async fn a_workload_recreated_during_the_run_is_skipped_and_never_written() {
    let client = client().await;
    let ns = TestNs::new(&client, "recreated").await;
    let n = ns.name();
    let (policies, next) = first_and_next(&client, n, "again").await;
    let planned = deployment_of(&client, n, "b-next").await.metadata.uid;
    let running = spawn_bouncer(&["run"], &policies, n, &[("BOUNCER_VERIFY_SETTLE", "5s")]);
    wait_restarted_at(&client, n, "a-first", READY).await;
    let api: Api<Deployment> = Api::namespaced(client.clone(), n);
    api.delete("b-next", &Default::default()).await.unwrap();
    let recreated = loop {
        match bouncer_testkit::create(&client, n, &next).await {
            Ok(d) => break d.metadata.uid,
            // Still there for a moment after the delete.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert_ne!(recreated, planned);
    let run = finish(running).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(
        run.row("a-first")["decision"],
        "bounced",
        "{:#}",
        run.report
    );
    let row = run.row("b-next");
    assert_eq!(
        (row["decision"].as_str(), row["reasonCode"].as_str()),
        (Some("skipped"), Some("replaced")),
        "{row:#}"
    );
    let after = deployment_of(&client, n, "b-next").await;
    assert_eq!(after.metadata.uid, recreated);
    assert_eq!(restarted_at_of(&client, n, "b-next").await, None);
    assert!(
        !after
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(ATTEMPT_MARK),
        "the new b-next was marked"
    );
}

/// Identity between runs: a Deployment recreated from a manifest that still carries the old
/// object's attempt mark (`kubectl get -o yaml`, delete, apply). The mark predates the object,
/// so it is not this workload's history: the breaker it would open does not hold the new one
/// back. (A cooldown could not show it: it also counts from the pods' start, after the mark.)
#[tokio::test]
async fn a_mark_copied_onto_a_recreated_workload_does_not_hold_it_back() {
    let client = client().await;
    let ns = TestNs::new(&client, "copied-mark").await;
    let n = ns.name();
    let mut d = deployment("web", 1, &[("app", "web"), ("copied", "yes")]);
    let earlier = (chrono::Utc::now() - chrono::TimeDelta::minutes(10))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mark = format!(
        r#"{{"method":"rollout","outcome":"started","policy":"copied","time":"{earlier}"}}"#
    );
    d.metadata.annotations = Some([(ATTEMPT_MARK.to_string(), mark)].into());
    deploy(&client, n, d).await;
    // A breaker the copied mark alone would hold open for the next 50 minutes.
    let policies = Policies::new(&[(
        "p.yaml",
        &policy(
            "copied",
            n,
            "{copied: \"yes\"}",
            "  triggers:\n    schedule: {cron: \"* * * * *\", startingDeadline: 5m}\n  cooldown: 1s\n  breaker: {maxBounces: 1, per: 1h}\n",
        ),
    )]);
    next_minute(Duration::from_secs(1)).await;
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.row("web")["decision"], "bounced", "{:#}", run.report);
}

/// Overtaken by a new version: `kubectl set image` lands on the Deployment while bouncer waits
/// on its rollout (restartedAt stays bouncer's). The bounce is `superseded` (the new version's
/// rollout replaced the pods), not `bounced` and not `failed`; the queue goes on.
#[tokio::test]
async fn a_new_image_while_bouncer_waits_supersedes_the_bounce() {
    let client = client().await;
    let ns = TestNs::new(&client, "new-image").await;
    let n = ns.name();
    let (policies, _) = first_and_next(&client, n, "image").await;
    let running = spawn_bouncer(&["run"], &policies, n, &[("BOUNCER_VERIFY_SETTLE", "5s")]);
    let written = wait_restarted_at(&client, n, "a-first", READY).await;
    set_image(n, "a-first", "app:v2");
    let run = finish(running).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(
        run.queue(),
        [
            ("a-first".to_string(), "superseded".to_string()),
            ("b-next".to_string(), "bounced".to_string())
        ],
        "{:#}",
        run.report
    );
    let row = run.row("a-first");
    assert!(
        row["reason"]
            .as_str()
            .is_some_and(|r| r.contains("pod template changed")),
        "{row:#}"
    );
    assert_eq!(run.report["summary"]["failed"], 0, "{:#}", run.report);
    // bouncer's restart stands; the new version rolled over it.
    assert_eq!(restarted_at_of(&client, n, "a-first").await, Some(written));
    assert_eq!(
        bouncer_events(&client, n, "a-first", "BounceSuperseded")
            .await
            .len(),
        1
    );
}
