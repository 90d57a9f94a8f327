//! What a run tells the world at its end, received for real: the chat message and the JSON
//! report by local HTTP servers, the metrics by Debian's Pushgateway, and the chart's alert
//! rules evaluated by Debian's Prometheus scraping it. A webhook that fails or hangs changes
//! neither the bounce nor the exit code.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bouncer_testkit::{
    Answer, Kind, PodTemplateExt, Prometheus, Pushgateway, Receiver, Sample, TestNs, client,
    create, deployment, wait_pod_memory, wait_rollout_complete,
};
use chrono::{DateTime, Utc};
use kube::Client;
use serde_json::Value;

use crate::harness::{Bounced, Policies, bouncer_env, pods, policy, stuck_on_restart};

const READY: Duration = Duration::from_secs(180);

/// A one-replica Deployment at 300Mi, measured by metrics-server, a quiet one beside it, and a
/// policy that bounces above 128Mi: a run bounces the first for real and skips the second.
async fn leaky(client: &Client, ns: &str) -> Policies {
    for (name, memory) in [("web", "300Mi"), ("calm", "16Mi")] {
        let d = deployment(name, 1, &[("app", name), ("tier", "notify")]).with_memory(memory, "0");
        create(client, ns, &d).await.unwrap();
    }
    for name in ["web", "calm"] {
        wait_rollout_complete(client, Kind::Deployment, ns, name, READY)
            .await
            .unwrap();
        let pod = pods(client, ns, &format!("app={name}")).await.remove(0);
        let pod = pod.metadata.name.unwrap();
        wait_pod_memory(client, ns, &pod, READY, |m| m.is_some())
            .await
            .expect("metrics-server reports the pod");
    }
    let extra = "  triggers:\n    memory: {above: 128Mi}\n  cooldown: 1s\n";
    Policies::new(&[(
        "web.yaml",
        &policy("web-memory", ns, "{tier: notify}", extra),
    )])
}

fn notifications(run: &Bounced) -> BTreeMap<String, Value> {
    run.report["notifications"]
        .as_array()
        .unwrap_or_else(|| panic!("no notifications in {:#}", run.report))
        .iter()
        .map(|n| (n["target"].as_str().unwrap().to_string(), n.clone()))
        .collect()
}

/// The samples of the group job=bouncer, cluster=`cluster`, by name and labels (grouping
/// labels and the Pushgateway's own `instance` left out).
fn group(samples: &[Sample], cluster: &str) -> BTreeMap<String, f64> {
    samples
        .iter()
        .filter(|s| s.labels.get("job").map(String::as_str) == Some("bouncer"))
        .filter(|s| s.labels.get("cluster").map(String::as_str) == Some(cluster))
        .filter(|s| s.name.starts_with("bouncer_"))
        .map(|s| {
            let labels: Vec<String> = s
                .labels
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "job" | "cluster" | "instance"))
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let key = if labels.is_empty() {
                s.name.clone()
            } else {
                format!("{}{{{}}}", s.name, labels.join(","))
            };
            (key, s.value)
        })
        .collect()
}

fn timestamp(t: f64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis((t * 1000.0) as i64).unwrap()
}

/// A real bounce, then the chat message, the JSON report and the metrics as their receivers
/// got them, field by field.
#[tokio::test]
async fn a_bounce_reaches_the_chat_the_json_webhook_and_the_pushgateway() {
    let client = client().await;
    let ns = TestNs::new(&client, "notify").await;
    let n = ns.name();
    let policies = leaky(&client, n).await;
    let chat = Receiver::start(Answer::Status(200)).await;
    let hook = Receiver::start(Answer::Status(200)).await;
    let teams = Receiver::start(Answer::Status(200)).await;
    let teams_url = teams.url("/webhookb2/tenant/IncomingWebhook/secret");
    let gateway = Pushgateway::start().await.expect("Pushgateway");
    let cluster = format!("dev-{n}");
    let (slack_url, hook_url) = (chat.url("/services/T0/B0/secret"), hook.url("/reports"));
    let before = Utc::now();
    let run = bouncer_env(
        &["run"],
        &policies,
        n,
        &[
            ("BOUNCER_CLUSTER_NAME", &cluster),
            ("BOUNCER_NOTIFY_SLACK_URL", &slack_url),
            ("BOUNCER_NOTIFY_WEBHOOK_URL", &hook_url),
            ("BOUNCER_NOTIFY_TEAMS_URL", &teams_url),
            ("BOUNCER_PUSHGATEWAY_URL", &gateway.url()),
        ],
    )
    .await;
    let after = Utc::now();
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    assert_eq!(run.bounced(), ["web"], "{:#}", run.report);
    let row = run.row("web");
    let sent = notifications(&run);
    for target in ["slack", "teams", "webhook", "pushgateway"] {
        assert_eq!(
            sent[target]["status"], "sent",
            "{target}: {:#}",
            sent[target]
        );
        assert_eq!(sent[target]["attempts"], 1, "{target}");
    }
    assert!(
        !run.stderr.contains("secret"),
        "a webhook URL was logged: {}",
        run.stderr
    );

    // The chat message: one POST of Block Kit JSON with its plain-text fallback.
    let got = chat.requests();
    assert_eq!(got.len(), 1, "{got:#?}");
    let req = &got[0];
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("POST", "/services/T0/B0/secret")
    );
    assert_eq!(req.headers["content-type"], "application/json");
    assert!(
        req.headers["user-agent"].starts_with("bouncer/"),
        "{:?}",
        req.headers
    );
    let message = req.json();
    eprintln!(
        "chat message:\n{}",
        serde_json::to_string_pretty(&message).unwrap()
    );
    assert_eq!(run.row("calm")["reasonCode"], "notDue");
    let summary = "1 bounced, 0 failed, 0 not attempted, 1 skipped";
    let duration = row["durationSeconds"].as_f64().unwrap();
    let trigger = row["triggers"][0]["detail"].as_str().unwrap();
    assert!(
        trigger.starts_with("memory (web-") && trigger.ends_with(" > 128Mi)"),
        "{trigger}"
    );
    let escaped = trigger.replace('>', "&gt;");
    let text: Vec<&str> = message["text"].as_str().unwrap().lines().collect();
    assert_eq!(text[0], format!("bouncer on {cluster}: {summary}"));
    assert_eq!(
        text[1],
        format!("- bounced deployment/{n}/web in {duration:.1}s | {escaped}")
    );
    assert_eq!(text.len(), 2, "{text:#?}");
    let blocks = message["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 4, "{message:#}");
    assert_eq!(blocks[0]["type"], "header");
    assert_eq!(blocks[0]["text"]["type"], "plain_text");
    assert_eq!(blocks[0]["text"]["text"], format!("bouncer on {cluster}"));
    assert_eq!(blocks[1]["type"], "section");
    assert_eq!(blocks[1]["text"]["type"], "mrkdwn");
    assert_eq!(blocks[1]["text"]["text"], summary);
    assert_eq!(
        blocks[2]["text"]["text"],
        format!("• *bounced* `deployment/{n}/web` in {duration:.1}s · {escaped}")
    );
    assert_eq!(blocks[3]["type"], "context");
    assert_eq!(
        blocks[3]["elements"][0]["text"],
        format!(
            "cluster {cluster} · bouncer run · {}",
            run.report["generatedAt"].as_str().unwrap()
        )
    );

    // The Teams message: one POST of an Adaptive Card in a message envelope, the same lines.
    let got = teams.requests();
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(
        (got[0].method.as_str(), got[0].path.as_str()),
        ("POST", "/webhookb2/tenant/IncomingWebhook/secret")
    );
    assert_eq!(got[0].headers["content-type"], "application/json");
    let card = got[0].json();
    assert_eq!(card["type"], "message", "{card:#}");
    let attachment = &card["attachments"][0];
    assert_eq!(
        attachment["contentType"],
        "application/vnd.microsoft.card.adaptive"
    );
    assert_eq!(attachment["content"]["type"], "AdaptiveCard");
    assert_eq!(attachment["content"]["version"], "1.4");
    let body: Vec<&str> = attachment["content"]["body"]
        .as_array()
        .expect("a card body")
        .iter()
        .map(|b| b["text"].as_str().expect("text blocks"))
        .collect();
    assert_eq!(
        body,
        [
            format!("bouncer on {cluster}"),
            summary.to_string(),
            format!("- bounced deployment/{n}/web in {duration:.1}s | {trigger}"),
            format!(
                "cluster {cluster} · bouncer run · {}",
                run.report["generatedAt"].as_str().unwrap()
            ),
        ]
    );

    // The JSON webhook: the report as stdout has it, without the notifications being sent.
    let got = hook.requests();
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(
        (got[0].method.as_str(), got[0].path.as_str()),
        ("POST", "/reports")
    );
    assert_eq!(got[0].headers["content-type"], "application/json");
    let mut printed = run.report.clone();
    printed.as_object_mut().unwrap().remove("notifications");
    assert_eq!(got[0].json(), printed);
    assert_eq!(got[0].json()["kind"], "BounceReport");

    // The metrics, as the Pushgateway holds them.
    let samples = gateway.samples().await.expect("Pushgateway metrics");
    let m = group(&samples, &cluster);
    eprintln!("Pushgateway group job=bouncer cluster={cluster}: {m:#?}");
    assert_eq!(m["bouncer_last_run_success"], 1.0);
    assert_eq!(m["bouncer_last_run_planned"], 1.0);
    assert_eq!(m["bouncer_last_run_dry_run"], 0.0);
    assert_eq!(
        m["bouncer_last_run_bounces{policy=web-memory,result=bounced}"],
        1.0
    );
    assert_eq!(m["bouncer_last_run_skips{reason=notDue}"], 1.0, "calm");
    assert_eq!(
        m["bouncer_metrics_source_available{source=metrics.k8s.io}"],
        1.0
    );
    let skips: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("bouncer_last_run_skips{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(skips, run.report["summary"]["skipped"].as_f64().unwrap());
    assert_eq!(
        m.keys()
            .filter(|k| k.starts_with("bouncer_last_run_skips{"))
            .count(),
        bouncer::notify::pushgateway::SKIP_REASONS.len()
    );
    let last_run = timestamp(m["bouncer_last_run_timestamp_seconds"]);
    assert!(
        before <= last_run && last_run <= after,
        "{before} {last_run} {after}"
    );
    assert_eq!(
        m["bouncer_last_success_timestamp_seconds"],
        m["bouncer_last_run_timestamp_seconds"]
    );
    let took = m["bouncer_last_run_duration_seconds"];
    assert!(
        took >= duration && took <= (after - before).as_seconds_f64(),
        "{took}"
    );
    // The Pushgateway's own record of the push.
    assert!(
        samples
            .iter()
            .any(|s| s.name == "push_time_seconds" && s.labels.get("cluster") == Some(&cluster)),
        "no push_time_seconds for the group"
    );
}

/// A chat webhook answering 500 and a JSON webhook that never answers: the bounce happens, the
/// exit code is 0, each is tried 1 + retries times within its timeout, and the report says so.
#[tokio::test]
async fn a_failing_and_a_hanging_webhook_change_nothing_but_are_reported() {
    let client = client().await;
    let ns = TestNs::new(&client, "notifyfail").await;
    let n = ns.name();
    let policies = leaky(&client, n).await;
    let chat = Receiver::start(Answer::Status(500)).await;
    let hook = Receiver::start(Answer::Hang).await;
    let started = Instant::now();
    let run = bouncer_env(
        &["run"],
        &policies,
        n,
        &[
            ("BOUNCER_NOTIFY_SLACK_URL", &chat.url("/hook")),
            ("BOUNCER_NOTIFY_WEBHOOK_URL", &hook.url("/hook")),
            ("BOUNCER_NOTIFY_TIMEOUT", "1s"),
            ("BOUNCER_NOTIFY_RETRIES", "1"),
        ],
    )
    .await;
    let took = started.elapsed();
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    assert_eq!(run.bounced(), ["web"], "{:#}", run.report);
    assert_eq!(run.report["summary"]["bounced"], 1);
    let sent = notifications(&run);
    assert_eq!(sent.len(), 2, "{sent:#?}");
    assert_eq!(sent["slack"]["status"], "failed");
    assert_eq!(sent["slack"]["attempts"], 2);
    assert_eq!(
        sent["slack"]["detail"],
        "HTTP 500 Internal Server Error: receiver says no"
    );
    assert_eq!(sent["webhook"]["status"], "failed");
    assert_eq!(sent["webhook"]["attempts"], 2);
    assert_eq!(sent["webhook"]["detail"], "timed out after 1s");
    assert_eq!(chat.requests().len(), 2, "1 + 1 retry");
    assert_eq!(hook.requests().len(), 2, "1 + 1 retry");
    // Both ran at once: two 1 s attempts and a 0.5 s pause, not four seconds and more.
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert!(
        run.stderr.contains("notification failed"),
        "the failure is logged: {}",
        run.stderr
    );
    // The table says it too, on its last line (here in the --report file).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.txt");
    let table = bouncer_env(
        &["run"],
        &policies,
        n,
        &[
            ("BOUNCER_NOTIFY_SLACK_URL", &chat.url("/hook")),
            ("BOUNCER_NOTIFY_ON", "always"),
            ("BOUNCER_NOTIFY_RETRIES", "0"),
            ("BOUNCER_REPORT", file.to_str().unwrap()),
        ],
    )
    .await;
    assert_eq!(table.code, 0, "{}", table.stderr);
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        text.lines().last().unwrap(),
        "notifications: slack failed after 1 attempt: HTTP 500 Internal Server Error: receiver says no",
        "{text}"
    );
    assert!(text.starts_with("POLICY "), "{text}");
}

fn firing(result: &[Value], alert: &str, cluster: &str) -> bool {
    result.iter().any(|s| {
        s["metric"]["alertname"] == alert
            && s["metric"]["alertstate"] == "firing"
            && s["metric"]["cluster"] == cluster
    })
}

/// The chart's alert rules (the file its PrometheusRule is rendered from), evaluated by a real
/// Prometheus on what real runs pushed: a failed run fires "no successful run" (none has ever
/// succeeded) and "bounce failed"; a good run resolves both; and without runs, "no successful
/// run" fires again once the last success is older than the threshold.
#[tokio::test]
async fn the_charts_alerts_fire_after_a_failed_run_and_resolve_after_a_good_one() {
    let client = client().await;
    let ns = TestNs::new(&client, "notifyalert").await;
    let n = ns.name();
    const THRESHOLD: u64 = 12;
    let rules = std::fs::read_to_string(
        bouncer_testkit::repo_root().join("helm/bouncer/files/prometheus-rules.yaml"),
    )
    .expect("the chart's rules file")
    .replace("NO_SUCCESS_SECONDS", &THRESHOLD.to_string());
    let gateway = Pushgateway::start().await.expect("Pushgateway");
    let prometheus = Prometheus::start(&[gateway.target()], &rules)
        .await
        .expect("Prometheus");
    let health = prometheus.rules().await.unwrap();
    let loaded = &health["data"]["groups"][0]["rules"];
    assert_eq!(loaded.as_array().map(Vec::len), Some(3), "{health:#}");
    let chat = Receiver::start(Answer::Status(500)).await;

    // A bounce that cannot complete: its surge pod never schedules, the 5 s timeout fails it.
    // Memory triggers it, as soon as metrics-server has measured its pods.
    let stuck = stuck_on_restart(&client, "stuck", &[("app", "stuck")])
        .await
        .with_memory("300Mi", "0");
    create(&client, n, &stuck).await.unwrap();
    wait_rollout_complete(&client, Kind::Deployment, n, "stuck", READY)
        .await
        .unwrap();
    for pod in pods(&client, n, "app=stuck").await {
        let name = pod.metadata.name.unwrap();
        wait_pod_memory(&client, n, &name, READY, |m| m.is_some())
            .await
            .expect("metrics-server reports the pod");
    }
    let extra =
        "  triggers:\n    memory: {above: 128Mi}\n  cooldown: 1s\n  restart: {timeout: 5s}\n";
    let policies = Policies::new(&[("stuck.yaml", &policy("stuck", n, "{app: stuck}", extra))]);
    let cluster = format!("dev-{n}");
    let env = [
        ("BOUNCER_CLUSTER_NAME", cluster.as_str()),
        ("BOUNCER_PUSHGATEWAY_URL", &gateway.url()),
        ("BOUNCER_NOTIFY_SLACK_URL", &chat.url("/hook")),
        ("BOUNCER_NOTIFY_RETRIES", "0"),
    ];
    let failed = bouncer_env(&["run"], &policies, n, &env).await;
    assert_eq!(
        failed.code, 1,
        "the exit code stays 1: {}\n{:#}",
        failed.stderr, failed.report
    );
    assert_eq!(
        failed.queue(),
        [("stuck".to_string(), "failed".to_string())]
    );
    assert_eq!(notifications(&failed)["slack"]["status"], "failed");
    let message = chat.requests()[0].json();
    eprintln!(
        "chat message of the failed run:\n{}",
        serde_json::to_string_pretty(&message).unwrap()
    );
    assert!(
        message["text"].as_str().unwrap().starts_with(&format!(
            "bouncer on {cluster}: 0 bounced, 1 failed, 0 not attempted, 0 skipped\n- failed deployment/{n}/stuck after "
        )),
        "{message:#}"
    );
    assert_eq!(notifications(&failed)["pushgateway"]["status"], "sent");
    let m = group(&gateway.samples().await.unwrap(), &cluster);
    assert_eq!(m["bouncer_last_run_success"], 0.0);
    assert_eq!(
        m["bouncer_last_run_bounces{policy=stuck,result=failed}"],
        1.0
    );
    assert!(
        !m.contains_key("bouncer_last_success_timestamp_seconds"),
        "{m:#?}"
    );

    let wait = Duration::from_secs(30);
    let alerts = "ALERTS{alertstate=\"firing\"}";
    prometheus
        .wait_for(alerts, wait, |r| {
            firing(r, "BouncerNoSuccessfulRun", &cluster)
                && firing(r, "BouncerBounceFailed", &cluster)
        })
        .await
        .expect("both alerts fire after the failed run");
    let bounce_alert = prometheus
        .query("ALERTS{alertname=\"BouncerBounceFailed\",alertstate=\"firing\"}")
        .await
        .unwrap();
    assert_eq!(bounce_alert[0]["metric"]["policy"], "stuck");
    assert_eq!(bounce_alert[0]["metric"]["result"], "failed");

    // The next run finds the rollout still stuck and skips it: a good run, exit 0.
    let good = bouncer_env(&["run"], &policies, n, &env).await;
    assert_eq!(good.code, 0, "{}\n{:#}", good.stderr, good.report);
    assert_eq!(good.report["summary"]["failed"], 0);
    assert_eq!(notifications(&good)["slack"]["status"], "notSent");
    assert_eq!(
        chat.requests().len(),
        1,
        "only the failed run was worth a message"
    );
    let good_at = Instant::now();
    let m = group(&gateway.samples().await.unwrap(), &cluster);
    assert_eq!(m["bouncer_last_run_success"], 1.0);
    assert!(m.contains_key("bouncer_last_success_timestamp_seconds"));
    assert!(
        !m.keys().any(|k| k.starts_with("bouncer_last_run_bounces")),
        "{m:#?}"
    );
    prometheus
        .wait_for(alerts, wait, |r| {
            !firing(r, "BouncerNoSuccessfulRun", &cluster)
                && !firing(r, "BouncerBounceFailed", &cluster)
        })
        .await
        .expect("both alerts resolve after the good run");
    let resolved_after = good_at.elapsed();
    assert!(
        resolved_after < Duration::from_secs(THRESHOLD),
        "resolved only after {resolved_after:?}"
    );

    // No more runs: once the last success is older than the threshold, it fires again.
    prometheus
        .wait_for(alerts, Duration::from_secs(THRESHOLD + 30), |r| {
            firing(r, "BouncerNoSuccessfulRun", &cluster)
        })
        .await
        .expect("no successful run for longer than the threshold fires");
    assert!(
        good_at.elapsed() >= Duration::from_secs(THRESHOLD),
        "fired before the threshold: {:?}",
        good_at.elapsed()
    );
}
