//! What bouncer's past attempts say, on the real cluster (hole 11 of the third safety round): a
//! workload whose mark shows failed attempts backs off instead of being retried first as the
//! most urgent, and one bounced `breaker.maxBounces` times within `breaker.per` is flagged (a
//! `breakerOpen` skip and a Warning Event), not bounced again. Marks are written by hand on the
//! Deployments' metadata (and, for a bare pod, on the run Lease), in the format of
//! single-attempt marks from before the history and in the history's own.

use std::time::Duration;

use bouncer_testkit::{
    Answer, BarePodApp, Kind, PodTemplateExt, Pushgateway, Receiver, TestNs, client, create,
    deployment, pod_template, wait_pod_memory, wait_pods_ready, wait_rollout_complete,
};
use chrono::{DateTime, SecondsFormat, Timelike, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::harness::{
    Policies, bouncer, bouncer_env, bouncer_events, deployment as get_deployment,
    deployment_restarted_at, patch_deployment, pod_uids, pods, policy, set_image,
};

const READY: Duration = Duration::from_secs(120);
use bouncer_testkit::ATTEMPT_MARK as MARK;

fn ms(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A mark as bouncer wrote them before it kept a history: one attempt.
fn single(t: DateTime<Utc>, outcome: &str) -> String {
    json!({"time": ms(t), "policy": "mem", "method": "rollout", "outcome": outcome}).to_string()
}

/// One-replica Deployments using a steady `usage` each, Ready and reported by metrics-server.
async fn leaky(client: &Client, ns: &str, workloads: &[(&str, &str)]) {
    for (name, usage) in workloads {
        let d = deployment(name, 1, &[("app", name), ("tier", "leaky")]).with_memory(usage, "0");
        create(client, ns, &d).await.expect("create deployment");
    }
    for (name, _) in workloads {
        wait_rollout_complete(client, Kind::Deployment, ns, name, READY)
            .await
            .expect("deployment ready");
        let pod = pods(client, ns, &format!("app={name}")).await.remove(0);
        let pod = pod.metadata.name.clone().unwrap_or_default();
        wait_pod_memory(client, ns, &pod, READY, |m| m.is_some())
            .await
            .expect("metrics-server reports the pod")
            .expect("metrics present");
    }
}

async fn mark(client: &Client, ns: &str, name: &str, value: &str) {
    let patch = json!({"metadata": {"annotations": {MARK: value}}});
    patch_deployment(client, ns, name, patch).await;
}

/// Three workloads over the threshold, the most urgent first: `failing` (its last attempt, in
/// the old single-attempt format, failed), `failing-long` (four failures in a row, in the
/// history's format) and `healthy` (its last attempt bounced). With a 20s cooldown, 25s after
/// the marks the cooldown has passed for all three; the failures double it (40s) and multiply
/// it by 16 (320s). Only `healthy` is bounced; the others are skipped `backingOff`, saying so,
/// and never patched. Before the fix `failing` was bounced first, as the most urgent.
#[tokio::test]
async fn a_failing_workload_backs_off_and_the_next_one_is_bounced() {
    let client = client().await;
    let ns = TestNs::new(&client, "backoff").await;
    let n = ns.name();
    leaky(
        &client,
        n,
        &[
            ("failing", "500Mi"),
            ("failing-long", "400Mi"),
            ("healthy", "300Mi"),
        ],
    )
    .await;
    let t1 = Utc::now();
    mark(&client, n, "failing", &single(t1, "failed")).await;
    let earlier: Vec<_> = (1..4)
        .map(|i| json!([ms(t1 - chrono::Duration::seconds(i)), "failed"]))
        .collect();
    let long = json!({"time": ms(t1), "policy": "mem", "method": "rollout", "outcome": "reverted",
        "earlier": earlier});
    mark(&client, n, "failing-long", &long.to_string()).await;
    mark(&client, n, "healthy", &single(t1, "bounced")).await;
    let policies = Policies::new(&[(
        "memory.yaml",
        &policy(
            "mem",
            n,
            "{tier: leaky}",
            "  triggers:\n    memory: {above: 256Mi}\n  cooldown: 20s\n",
        ),
    )]);
    let wait = (t1 + chrono::Duration::seconds(25) - Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(wait).await;

    assert!(
        Utc::now() < t1 + chrono::Duration::seconds(35),
        "the setup outlasted the shortest backoff; the run would prove nothing"
    );
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    assert_eq!(run.bounced(), ["healthy"], "{:#}", run.report);
    for (name, failures) in [
        ("failing", "1 failed or reverted attempt in a row"),
        ("failing-long", "4 failed or reverted attempts in a row"),
    ] {
        let row = run.row(name);
        assert_eq!(row["reasonCode"], "backingOff", "{row:#}");
        let reason = row["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(failures), "{row:#}");
        let d = get_deployment(&client, n, name).await;
        assert!(deployment_restarted_at(&d).is_none(), "{name} was patched");
    }
    // The bounce recorded its attempt in the history the mark already held.
    let d = get_deployment(&client, n, "healthy").await;
    let text = d
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MARK))
        .expect("mark");
    let mark: serde_json::Value = serde_json::from_str(text).expect("the mark is JSON");
    assert_eq!(mark["method"], "rollout", "{mark}");
    assert_eq!(mark["earlier"], json!([[ms(t1), "bounced"]]), "{mark}");
}

/// `breaker: {maxBounces: 2, per: 1h}`: `busy` was attempted twice in the last hour (the
/// history's format), `calm` once (the old format). Both are over the threshold and out of
/// their cooldown; `calm` is bounced, `busy` is skipped `breakerOpen` with one Warning Event
/// `BounceBreakerOpen` and is never patched; the chat message names it and the Pushgateway
/// counts it. A plan afterwards writes no second Event. Before the fix the policy's `breaker`
/// was an unknown field.
#[tokio::test]
async fn a_workload_at_its_breaker_limit_is_flagged_not_bounced() {
    let client = client().await;
    let ns = TestNs::new(&client, "breaker").await;
    let n = ns.name();
    leaky(&client, n, &[("busy", "400Mi"), ("calm", "300Mi")]).await;
    let now = Utc::now();
    let busy = json!({"time": ms(now - chrono::Duration::seconds(5)), "policy": "mem",
        "method": "rollout", "outcome": "bounced",
        "earlier": [[ms(now - chrono::Duration::minutes(20)), "bounced"]]});
    mark(&client, n, "busy", &busy.to_string()).await;
    mark(
        &client,
        n,
        "calm",
        &single(now - chrono::Duration::seconds(5), "bounced"),
    )
    .await;
    let policies = Policies::new(&[(
        "memory.yaml",
        &policy(
            "mem",
            n,
            "{tier: leaky}",
            "  triggers:\n    memory: {above: 256Mi}\n  cooldown: 1s\n  breaker: {maxBounces: 2, per: 1h}\n",
        ),
    )]);

    let chat = Receiver::start(Answer::Status(200)).await;
    let gateway = Pushgateway::start().await.expect("Pushgateway");
    let cluster = format!("dev-{n}");
    let env = [
        ("BOUNCER_CLUSTER_NAME", cluster.as_str()),
        ("BOUNCER_NOTIFY_SLACK_URL", &chat.url("/services/T0/B0/x")),
        ("BOUNCER_PUSHGATEWAY_URL", &gateway.url()),
    ];
    let run = bouncer_env(&["run"], &policies, n, &env).await;
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    assert_eq!(run.bounced(), ["calm"], "{:#}", run.report);
    let row = run.row("busy");
    assert_eq!(row["reasonCode"], "breakerOpen", "{row:#}");
    let reason = row["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with(
            "circuit breaker open: 2 bounces within 1h (breaker.maxBounces 2); closes after "
        ),
        "{row:#}"
    );
    let d = get_deployment(&client, n, "busy").await;
    assert!(deployment_restarted_at(&d).is_none(), "busy was patched");
    let events = bouncer_events(&client, n, "busy", "BounceBreakerOpen").await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    let note = events[0].note.as_deref().unwrap_or_default();
    assert!(
        note.starts_with("not bounced by policy mem: circuit breaker open"),
        "{note}"
    );

    // The chat message names it, and the Pushgateway counts it.
    let got = chat.requests();
    assert_eq!(got.len(), 1, "{got:#?}");
    let text = got[0].json()["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let line = format!("\n- breaker open deployment/{n}/busy | circuit breaker open: 2 bounces");
    assert!(text.contains(&line), "{text}");
    let samples = gateway.samples().await.expect("Pushgateway metrics");
    let ours = |name: &str, reason: Option<&str>| {
        samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| s.labels.get("cluster") == Some(&cluster))
            .filter(|s| {
                reason.is_none_or(|r| s.labels.get("reason").map(String::as_str) == Some(r))
            })
            .map(|s| s.value)
            .collect::<Vec<f64>>()
    };
    assert_eq!(ours("bouncer_last_run_breakers_open", None), [1.0]);
    assert_eq!(ours("bouncer_last_run_skips", Some("breakerOpen")), [1.0]);

    // A plan says the same and writes nothing.
    let plan = bouncer(&["plan"], &policies, n).await;
    assert_eq!(
        plan.row("busy")["reasonCode"],
        "breakerOpen",
        "{:#}",
        plan.report
    );
    assert_eq!(
        bouncer_events(&client, n, "busy", "BounceBreakerOpen")
            .await
            .len(),
        1
    );
}

/// A bare pod's mark lives on the run Lease: one whose entry there (in the format from before
/// the history) shows a failed attempt 5s before this minute's fire is due again by its
/// schedule (the mark is older than the fire) and out of its 20s cooldown 25s after the mark,
/// but backs off (40s): skipped `backingOff`, not evicted, and nothing is recorded on the Lease.
/// Before the fix the pod was evicted again.
#[tokio::test]
async fn a_bare_pod_whose_lease_mark_shows_a_failure_backs_off() {
    let client = client().await;
    let ns = TestNs::new(&client, "barebackoff").await;
    let n = ns.name();
    let _app = BarePodApp::spawn(
        client.clone(),
        n,
        "mcpd",
        1,
        pod_template(&[("app", "mcpd")]),
    )
    .await
    .expect("app starts");
    wait_pods_ready(&client, n, "app=mcpd", 1, READY)
        .await
        .expect("bare pod ready");
    let before = pod_uids(&client, n, "app=mcpd").await;
    // The coming minute's fire, at least a few seconds away (the pod started before it).
    let now = Utc::now();
    let mut fire = now
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .unwrap()
        + chrono::Duration::minutes(1);
    if fire - now < chrono::Duration::seconds(3) {
        fire += chrono::Duration::minutes(1);
    }
    let t1 = fire - chrono::Duration::seconds(5);
    let marks = json!({ format!("{n}/mcpd-0"): serde_json::from_str::<serde_json::Value>(&single(t1, "failed")).unwrap() });
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("bouncer".into()),
            annotations: Some(
                [(
                    "bouncer.dev/bare-pod-attempts".to_string(),
                    marks.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: None,
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), n);
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("create the Lease");
    let policies = Policies::new(&[(
        "p.yaml",
        &policy(
            "mcpd",
            n,
            "{app: mcpd}",
            "    kinds: [Pod]\n  triggers:\n    schedule: {cron: \"* * * * *\", startingDeadline: 5m}\n  cooldown: 20s\n  allowDowntime: true\n",
        ),
    )]);
    let wait = (t1 + chrono::Duration::seconds(25) - Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(wait).await;
    assert!(
        Utc::now() < t1 + chrono::Duration::seconds(35),
        "the setup outlasted the backoff; the run would prove nothing"
    );

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    let row = run.row("mcpd-0");
    assert_eq!(row["reasonCode"], "backingOff", "{row:#}");
    assert_eq!(
        pod_uids(&client, n, "app=mcpd").await,
        before,
        "the pod was evicted"
    );
    let kept = leases.get("bouncer").await.expect("the Lease");
    let text = kept
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("bouncer.dev/bare-pod-attempts"))
        .expect("the marks");
    let kept: serde_json::Value = serde_json::from_str(text).expect("JSON");
    assert_eq!(kept, marks, "nothing was recorded");
}

/// The one pod of `app`, Ready (the old ones gone) and reported by metrics-server.
async fn settled(client: &Client, ns: &str, app: &str) {
    let pod = wait_pods_ready(client, ns, &format!("app={app}"), 1, READY)
        .await
        .expect("one ready pod")
        .remove(0);
    let pod = pod.metadata.name.unwrap_or_default();
    wait_pod_memory(client, ns, &pod, READY, |m| m.is_some())
        .await
        .expect("metrics-server reports the pod")
        .expect("metrics present");
}

/// Fault 5: `breaker: {maxBounces: 1, per: 1h}` opens after a real bounce (its mark records the
/// pod template's spec digest), and holds the next run back; a new image (`kubectl set image`,
/// a fixed leak) starts the breaker over, so the run after it bounces the new version.
#[tokio::test]
async fn a_new_image_resets_the_breaker() {
    let client = client().await;
    let ns = TestNs::new(&client, "new-version").await;
    let n = ns.name();
    leaky(&client, n, &[("web", "300Mi")]).await;
    let policies = Policies::new(&[(
        "memory.yaml",
        &policy(
            "mem",
            n,
            "{tier: leaky}",
            "  triggers:\n    memory: {above: 256Mi}\n  cooldown: 1s\n  breaker: {maxBounces: 1, per: 1h}\n",
        ),
    )]);
    let first = bouncer(&["run"], &policies, n).await;
    assert_eq!(first.code, 0, "{}\n{:#}", first.stderr, first.report);
    assert_eq!(first.bounced(), ["web"], "{:#}", first.report);
    let d = get_deployment(&client, n, "web").await;
    let text = d.metadata.annotations.as_ref().and_then(|a| a.get(MARK));
    assert!(
        text.is_some_and(|t| t.contains("\"template\":\"")),
        "the mark keeps the template's digest: {text:?}"
    );
    settled(&client, n, "web").await;
    let held = bouncer(&["run"], &policies, n).await;
    assert_eq!(held.code, 0, "{}\n{:#}", held.stderr, held.report);
    assert_eq!(
        held.row("web")["reasonCode"],
        "breakerOpen",
        "{:#}",
        held.report
    );

    set_image(n, "web", "app:v2");
    wait_rollout_complete(&client, Kind::Deployment, n, "web", READY)
        .await
        .expect("the new version rolled out");
    settled(&client, n, "web").await;
    let fresh = bouncer(&["run"], &policies, n).await;
    assert_eq!(fresh.code, 0, "{}\n{:#}", fresh.stderr, fresh.report);
    assert_eq!(fresh.bounced(), ["web"], "{:#}", fresh.report);
}
