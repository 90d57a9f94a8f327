//! Memory history and blockers from a real Prometheus (Debian's), fed hours of samples for the
//! test cluster's real pods by `promtool tsdb create-blocks-from openmetrics`: a one-sample spike
//! is not sustained, a steady leak grows too fast, a projected OOM before the next window bounces
//! while a later one waits, a firing alert blocks, and a Prometheus that is down turns the history
//! triggers off while schedules still work. The queries per run do not grow with the workloads.

use std::time::Duration;

use bouncer_testkit::{
    Kind, Prometheus, TestNs, client, create, deployment, wait_rollout_complete,
};
use chrono::{Timelike, Utc};
use kube::Client;

use futures::StreamExt;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::harness::{Policies, bouncer, bouncer_env, bouncer_events, next_minute, pods, policy};

/// Each Prometheus query's latency in the log.
const LOG: &str = "info,bouncer::cluster::prometheus=debug";

const READY: Duration = Duration::from_secs(180);
const MI: f64 = (1u64 << 20) as f64;

/// `bouncer explain TARGET` as text, as on-call reads it.
async fn explain_text(target: &str, policies: &Policies, url: &str) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bouncer"))
        .args(["explain", target, "--prometheus-url", url, "--policies"])
        .arg(policies.path())
        .env("KUBECONFIG", &bouncer_testkit::cluster().kubeconfig)
        .output()
        .await
        .expect("bouncer starts");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Deploys one single-replica Deployment labelled `app=NAME` and returns its pod's name.
async fn deploy(client: &Client, ns: &str, name: &str) -> String {
    create(client, ns, &deployment(name, 1, &[("app", name)]))
        .await
        .unwrap();
    wait_rollout_complete(client, Kind::Deployment, ns, name, READY)
        .await
        .unwrap();
    pods(client, ns, &format!("app={name}")).await[0]
        .metadata
        .name
        .clone()
        .unwrap()
}

/// OpenMetrics text: for each (pod, MiB at minutes-ago), a sample every 15 s over the last 70
/// minutes, ending now.
fn openmetrics(ns: &str, series: &[(&str, &dyn Fn(f64) -> f64)]) -> String {
    let now = Utc::now().timestamp();
    let mut text = String::from("# TYPE container_memory_working_set_bytes gauge\n");
    for (pod, mib) in series {
        for i in (0..=70 * 4).rev() {
            let ago = i as f64 / 4.0;
            text.push_str(&format!(
                "container_memory_working_set_bytes{{namespace=\"{ns}\",pod=\"{pod}\",container=\"app\"}} {} {}\n",
                (mib(ago) * MI).round(),
                now - i * 15
            ));
        }
    }
    text.push_str("# EOF\n");
    text
}

/// A window every day from `from_h` to `to_h` hours from now (UTC, whole hours).
fn window_in(from_h: u32, to_h: u32) -> String {
    let h = Utc::now().hour();
    format!(
        "  windows: [{{days: [Mon, Tue, Wed, Thu, Fri, Sat, Sun], from: \"{:02}:00\", to: \"{:02}:00\"}}]\n",
        (h + from_h) % 24,
        (h + to_h) % 24
    )
}

#[tokio::test]
async fn history_triggers_decide_on_real_prometheus_history() {
    let client = client().await;
    let ns = TestNs::new(&client, "promhist").await;
    let n = ns.name();
    let spike = deploy(&client, n, "spike").await;
    let steady = deploy(&client, n, "steady").await;
    let leak = deploy(&client, n, "leak").await;
    let soon = deploy(&client, n, "soon").await;
    let later = deploy(&client, n, "later").await;
    let history = openmetrics(
        n,
        &[
            // 100Mi, with one 2Gi sample five minutes ago.
            (&spike, &|ago| if ago == 5.0 { 2048.0 } else { 100.0 }),
            // Over 512Mi for the whole window.
            (&steady, &|_| 700.0),
            // 100 MiB/h.
            (&leak, &|ago| 300.0 - ago * 100.0 / 60.0),
            // 200 MiB/h from 424 MiB: 1Gi in 3 hours.
            (&soon, &|ago| 424.0 - ago * 200.0 / 60.0),
            // 50 MiB/h from 424 MiB: 1Gi in 12 hours.
            (&later, &|ago| 424.0 - ago * 50.0 / 60.0),
        ],
    );
    let prometheus = Prometheus::start_with_history(&[], "groups: []\n", Some(&history))
        .await
        .expect("prometheus starts");

    let sustained = "  triggers:\n    memory: {above: 512Mi, sustained: 10m}\n  cooldown: 1s\n";
    let growth = "  triggers:\n    memory: {growth: {above: 50Mi, per: 1h}}\n  cooldown: 1s\n";
    // The next window opens in 6 hours: the soon OOM (3h) cannot wait, the later one (12h) can.
    let predict = format!(
        "  triggers:\n    memory: {{above: 1Gi, predict: {{before: 1h}}}}\n  cooldown: 1s\n{}",
        window_in(6, 7)
    );
    let policies = Policies::new(&[
        ("spike.yaml", &policy("spike", n, "{app: spike}", sustained)),
        (
            "steady.yaml",
            &policy("steady", n, "{app: steady}", sustained),
        ),
        ("leak.yaml", &policy("leak", n, "{app: leak}", growth)),
        ("soon.yaml", &policy("soon", n, "{app: soon}", &predict)),
        ("later.yaml", &policy("later", n, "{app: later}", &predict)),
    ]);
    let url = prometheus.url();
    let args = ["plan", "--prometheus-url", url.as_str()];
    let ranges = prometheus
        .requests_served("/api/v1/query_range")
        .await
        .unwrap();
    // The pods' start counts as a restart: past the policies' 1 s cooldown (whole seconds) the
    // history alone decides.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = std::time::Instant::now();
    let plan = bouncer_env(&args, &policies, n, &[("BOUNCER_LOG", LOG)]).await;
    let took = started.elapsed();
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    eprintln!("plan with Prometheus history: {took:?}");
    for line in plan
        .stderr
        .lines()
        .filter(|l| l.contains("Prometheus query"))
    {
        eprintln!("{line}");
    }

    let spiked = plan.row("spike");
    assert_eq!(spiked["decision"], "skip", "{spiked:#}");
    let reason = spiked["reason"].as_str().unwrap();
    assert!(
        reason.contains("memory.sustained: ") && reason.contains("went down to 100Mi <= 512Mi"),
        "{reason}"
    );
    let steady_row = plan.row("steady");
    assert_eq!(steady_row["decision"], "bounce", "{steady_row:#}");
    assert_eq!(steady_row["triggers"][0]["type"], "memorySustained");

    let leaked = plan.row("leak");
    assert_eq!(leaked["decision"], "bounce", "{leaked:#}");
    assert_eq!(leaked["triggers"][0]["type"], "memoryGrowth");
    let detail = leaked["triggers"][0]["detail"].as_str().unwrap();
    assert!(detail.contains("MiB/h > 50.0 MiB/h over 1h"), "{detail}");

    let soon_row = plan.row("soon");
    assert_eq!(soon_row["decision"], "bounce", "{soon_row:#}");
    assert_eq!(soon_row["triggers"][0]["type"], "memoryPredict");
    let detail = soon_row["triggers"][0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("outside the windows, before the next window opens at"),
        "{detail}"
    );
    let later_row = plan.row("later");
    assert_eq!(later_row["decision"], "skip", "{later_row:#}");
    let reason = later_row["reason"].as_str().unwrap();
    assert!(reason.contains("waits for the window"), "{reason}");

    // One range query for every workload; 1,000 more workloads in the namespace ask no more
    // (scaled to zero: the planner still selects each by its template, as "no pods").
    let after_one = prometheus
        .requests_served("/api/v1/query_range")
        .await
        .unwrap();
    assert_eq!(after_one - ranges, 1.0);
    futures::stream::iter(0..1000)
        .for_each_concurrent(16, |i| {
            let client = client.clone();
            async move {
                let name = format!("more-{i}");
                create(
                    &client,
                    n,
                    &deployment(&name, 0, &[("app", "leak"), ("more", "x")]),
                )
                .await
                .unwrap();
            }
        })
        .await;
    let started = std::time::Instant::now();
    let more = bouncer_env(&args, &policies, n, &[("BOUNCER_LOG", LOG)]).await;
    eprintln!("plan with 1,005 workloads: {:?}", started.elapsed());
    assert_eq!(more.code, 0, "{}", more.stderr);
    assert!(more.rows().len() >= 1005, "{}", more.rows().len());
    for line in more
        .stderr
        .lines()
        .filter(|l| l.contains("Prometheus query"))
    {
        eprintln!("{line}");
    }
    let after_more = prometheus
        .requests_served("/api/v1/query_range")
        .await
        .unwrap();
    assert_eq!(after_more - after_one, 1.0);
    assert_eq!(
        prometheus.requests_served("/api/v1/query").await.unwrap(),
        0.0
    );

    // `explain` shows each history trigger with its numbers, as the plan decided.
    for (name, trigger, result) in [
        ("spike", "memory.sustained", "notFired"),
        ("steady", "memory.sustained", "fired"),
        ("leak", "memory.growth", "fired"),
        ("soon", "memory.predict", "fired"),
        ("later", "memory.predict", "notFired"),
    ] {
        let target = format!("deploy/{n}/{name}");
        let e = bouncer(
            &["explain", &target, "--prometheus-url", url.as_str()],
            &policies,
            n,
        )
        .await;
        assert_eq!(e.code, 0, "{}", e.stderr);
        let steps = e.report["policies"][0]["steps"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            steps
                .iter()
                .any(|s| s["step"] == trigger && s["result"] == result),
            "{name}: no {trigger} step {result}: {:#}",
            e.report
        );
        let text = explain_text(&target, &policies, url.as_str()).await;
        eprintln!("$ bouncer explain {target}\n{text}");
    }
}

#[tokio::test]
async fn a_firing_alert_blocks_and_a_dead_prometheus_turns_history_off() {
    let client = client().await;
    let ns = TestNs::new(&client, "promblock").await;
    let n = ns.name();
    deploy(&client, n, "nightly").await;
    deploy(&client, n, "leaky").await;
    let rules = "groups:\n- name: t\n  rules:\n  - alert: AlwaysFiring\n    expr: vector(1)\n";
    let prometheus = Prometheus::start(&[], rules)
        .await
        .expect("prometheus starts");
    prometheus
        .wait_for(r#"ALERTS{alertstate="firing"}"#, READY, |r| !r.is_empty())
        .await
        .unwrap();
    let schedule = r#"  triggers:
    schedule: {cron: "* * * * *", startingDeadline: 10m}
  cooldown: 1s
  blockWhen: {prometheus: 'ALERTS{alertstate="firing"}'}
"#;
    let growth = "  triggers:\n    memory: {growth: {above: 1Mi, per: 1h}}\n  cooldown: 1s\n";
    let policies = Policies::new(&[
        (
            "nightly.yaml",
            &policy("nightly", n, "{app: nightly}", schedule),
        ),
        ("leaky.yaml", &policy("leaky", n, "{app: leaky}", growth)),
    ]);
    next_minute(Duration::from_secs(1)).await;

    let url = prometheus.url();
    // The wait above asked too: count from here.
    let queries = prometheus.requests_served("/api/v1/query").await.unwrap();
    let blocked = bouncer(&["plan", "--prometheus-url", url.as_str()], &policies, n).await;
    assert_eq!(blocked.code, 0, "{}", blocked.stderr);
    let row = blocked.row("nightly");
    assert_eq!(row["reasonCode"], "blocked", "{row:#}");
    assert_eq!(row["reason"], "blocked by blockWhen: AlwaysFiring");
    let asked = prometheus.requests_served("/api/v1/query").await.unwrap() - queries;
    assert_eq!(asked, 1.0);
    let target = format!("deploy/{n}/nightly");
    let text = explain_text(&target, &policies, url.as_str()).await;
    assert!(
        text.contains("blocked by blockWhen: AlwaysFiring"),
        "{text}"
    );
    eprintln!("$ bouncer explain {target}\n{text}");

    // A run tells the held-back workload with a Warning Event (a plan wrote none), once an
    // hour: a second run right after writes no second one; the Lease remembers when.
    assert!(
        bouncer_events(&client, n, "nightly", "BounceBlocked")
            .await
            .is_empty()
    );
    for _ in 0..2 {
        let run = bouncer(&["run", "--prometheus-url", url.as_str()], &policies, n).await;
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert_eq!(run.row("nightly")["reasonCode"], "blocked");
    }
    let events = bouncer_events(&client, n, "nightly", "BounceBlocked").await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        events[0].note.as_deref(),
        Some("not bounced by policy nightly: blocked by blockWhen: AlwaysFiring")
    );
    let lease = Api::<Lease>::namespaced(client.clone(), n)
        .get("bouncer")
        .await
        .expect("the run Lease");
    let told: serde_json::Value =
        serde_json::from_str(&lease.metadata.annotations.expect("annotations")["bouncer.dev/told"])
            .expect("told is JSON");
    assert!(
        told[format!("BounceBlocked/deployment/{n}/nightly")].is_string(),
        "{told:#}"
    );

    // Nothing listens there: the blocker fails closed, the history trigger is off, and a
    // schedule without a blocker still bounces.
    let dead = "http://127.0.0.1:9";
    let down = bouncer(&["plan", "--prometheus-url", dead], &policies, n).await;
    assert_eq!(down.code, 0, "{}", down.stderr);
    let row = down.row("nightly");
    assert_eq!(row["reasonCode"], "blockerFailed", "{row:#}");
    let reason = down.row("leaky")["reason"].as_str().unwrap().to_string();
    assert!(
        reason.starts_with("not due: memory.growth: off: Prometheus history unavailable:"),
        "{reason}"
    );
    for name in ["nightly", "leaky"] {
        let target = format!("deploy/{n}/{name}");
        let text = explain_text(&target, &policies, dead).await;
        eprintln!("$ bouncer explain {target}   # Prometheus down\n{text}");
    }
    let unblocked = Policies::new(&[(
        "nightly.yaml",
        &policy(
            "nightly",
            n,
            "{app: nightly}",
            "  triggers:\n    schedule: {cron: \"* * * * *\", startingDeadline: 10m}\n    memory: {growth: {above: 1Mi, per: 1h}}\n  cooldown: 1s\n",
        ),
    )]);
    let schedules = bouncer(&["run", "--prometheus-url", dead], &unblocked, n).await;
    assert_eq!(schedules.code, 0, "{}", schedules.stderr);
    let row = schedules.row("nightly");
    assert_eq!(row["decision"], "bounced", "{row:#}");
    assert_eq!(row["triggers"][0]["type"], "schedule");
}
