//! Owners that fight the restart: an operator that reverts restartedAt (ToolHive <= v0.44.0, and
//! its fixed mode), and an app that keeps bare pods under fixed names (mcpd), restarted by
//! eviction one pod at a time.

use std::time::Duration;

use bouncer_testkit::{
    BarePodApp, Kind, RevertMode, RevertingOperator, TestNs, client, create, deployment,
    pod_template, wait_pods_ready, wait_rollout_complete,
};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;

use crate::harness::{
    Policies, audit_mark, audit_since, audit_time, audited, bouncer, bouncer_events, next_minute,
    pod_uids, pods, policy, ready_since, restarted_at_of,
};

const READY: Duration = Duration::from_secs(180);
const EVERY_MINUTE: &str =
    "  triggers:\n    schedule: {cron: \"* * * * *\", startingDeadline: 5m}\n  cooldown: 1s\n";

/// The operator's Deployment `owned` (2 replicas) and, created after it so it queues second, a
/// plain Deployment `plain`; both selected by one policy with `restart` set to `restart`.
async fn operator_and_plain(
    client: &Client,
    ns: &str,
    mode: RevertMode,
    restart: &str,
) -> (bouncer_testkit::BackgroundTask, Policies) {
    let owned = deployment("owned", 2, &[("app", "owned"), ("revert", "yes")]);
    let operator = RevertingOperator::spawn(client.clone(), ns, owned, mode)
        .await
        .expect("operator starts");
    wait_rollout_complete(client, Kind::Deployment, ns, "owned", READY)
        .await
        .expect("owned ready");
    create(
        client,
        ns,
        &deployment("plain", 1, &[("app", "plain"), ("revert", "yes")]),
    )
    .await
    .unwrap();
    wait_rollout_complete(client, Kind::Deployment, ns, "plain", READY)
        .await
        .expect("plain ready");
    let extra = format!("{EVERY_MINUTE}  restart: {restart}\n");
    let policies = Policies::new(&[(
        "p.yaml",
        &policy("toolhive", ns, "{revert: \"yes\"}", &extra),
    )]);
    next_minute(Duration::from_secs(1)).await;
    (operator, policies)
}

/// ToolHive <= v0.44.0 with `onRevert: fail`: the revert is detected, named, recorded as a
/// BounceReverted Event, and halts the run before the next workload.
#[tokio::test]
async fn reverted_restart_fails_and_names_the_operator() {
    let client = client().await;
    let ns = TestNs::new(&client, "revert-fail").await;
    let n = ns.name();
    let (operator, policies) =
        operator_and_plain(&client, n, RevertMode::Strict, "{onRevert: fail}").await;
    let plain_pods = pod_uids(&client, n, "app=plain").await;

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 1,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(
        run.queue(),
        [
            ("owned".to_string(), "reverted".to_string()),
            ("plain".to_string(), "notAttempted".to_string())
        ]
    );
    let row = run.row("owned");
    for field in ["reason", "verification"] {
        assert!(
            row[field].as_str().unwrap().contains("toolhive-operator"),
            "{field} names the reverter: {row:#}"
        );
    }
    assert!(operator.actions() >= 1, "the operator reverted");
    assert_eq!(
        restarted_at_of(&client, n, "owned").await,
        None,
        "the revert stands"
    );
    let events = bouncer_events(&client, n, "owned", "BounceReverted").await;
    assert_eq!(events.len(), 1, "one BounceReverted Event");
    assert!(
        events[0]
            .note
            .as_deref()
            .unwrap()
            .contains("toolhive-operator"),
        "{:?}",
        events[0].note
    );
    assert_eq!(
        events[0].regarding.as_ref().unwrap().kind.as_deref(),
        Some("Deployment")
    );
    assert_eq!(
        restarted_at_of(&client, n, "plain").await,
        None,
        "plain was patched after the halt"
    );
    assert_eq!(pod_uids(&client, n, "app=plain").await, plain_pods);
}

/// Evictions of `pods` in `ns` that bouncer made since `mark`, oldest first (pod name, time).
pub(crate) fn evictions(mark: u64, ns: &str) -> Vec<(String, DateTime<Utc>)> {
    let log = audit_since(mark);
    audited(&log, "create", "pods/eviction", ns)
        .into_iter()
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_i64()
                .is_some_and(|c| c < 300)
        })
        .map(|e| {
            (
                e["objectRef"]["name"].as_str().unwrap().to_string(),
                audit_time(e),
            )
        })
        .collect()
}

/// One pod at a time: every eviction after the first came no earlier than the moment a
/// replacement created after the previous eviction was Ready (the server's whole seconds).
pub(crate) fn assert_one_at_a_time(evicted: &[(String, DateTime<Utc>)], now: &[Pod]) {
    for pair in evicted.windows(2) {
        let (previous, next) = (pair[0].1, pair[1].1);
        let created_after = |p: &&Pod| {
            p.metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|t| crate::harness::time(t) >= previous - chrono::Duration::seconds(1))
        };
        let first_ready = now
            .iter()
            .filter(created_after)
            .filter_map(ready_since)
            .min()
            .expect("a replacement was Ready");
        let next_s = DateTime::from_timestamp(next.timestamp(), 0).unwrap();
        assert!(
            first_ready <= next_s,
            "eviction at {next} before the previous replacement was Ready ({first_ready})"
        );
    }
}

/// ToolHive <= v0.44.0 with `onRevert: evict`: after the revert every pod is evicted, one at a
/// time, and replaced; the run succeeds.
#[tokio::test]
async fn reverted_restart_is_followed_by_evictions_one_at_a_time() {
    let client = client().await;
    let ns = TestNs::new(&client, "revert-evict").await;
    let n = ns.name();
    let (_operator, policies) =
        operator_and_plain(&client, n, RevertMode::Strict, "{onRevert: evict}").await;
    let before = pod_uids(&client, n, "app=owned").await;
    let mark = audit_mark();

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(
        run.queue(),
        [
            ("owned".to_string(), "revertedEvicted".to_string()),
            ("plain".to_string(), "bounced".to_string())
        ]
    );
    assert!(
        run.row("owned")["reason"]
            .as_str()
            .unwrap()
            .contains("toolhive-operator"),
        "{:#}",
        run.row("owned")
    );
    let after = wait_pods_ready(&client, n, "app=owned", 2, READY)
        .await
        .unwrap();
    for p in &after {
        assert!(
            !before.contains(p.metadata.uid.as_ref().unwrap()),
            "pod {:?} survived",
            p.metadata.name
        );
    }
    assert_eq!(
        bouncer_events(&client, n, "owned", "BounceReverted")
            .await
            .len(),
        1
    );
    if let Some(mark) = mark {
        let evicted = evictions(mark, n);
        assert_eq!(evicted.len(), 2, "{evicted:?}");
        let names: Vec<&str> = evicted.iter().map(|(p, _)| p.as_str()).collect();
        assert_ne!(names[0], names[1], "two different pods evicted");
        assert_one_at_a_time(&evicted, &after);
    }
}

/// ToolHive after the fix keeps restartedAt: an ordinary verified bounce, with a Bounced Event.
#[tokio::test]
async fn an_operator_that_keeps_restarted_at_is_bounced() {
    let client = client().await;
    let ns = TestNs::new(&client, "revert-keep").await;
    let n = ns.name();
    let (_operator, policies) =
        operator_and_plain(&client, n, RevertMode::KeepRestartedAt, "{onRevert: fail}").await;
    let before = pod_uids(&client, n, "app=owned").await;

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.bounced(), ["owned", "plain"]);
    let row = run.row("owned");
    assert!(
        row["verification"]
            .as_str()
            .unwrap()
            .starts_with("restartedAt intact, 2/2 pods new"),
        "{row:#}"
    );
    assert_eq!(
        restarted_at_of(&client, n, "owned").await.as_deref(),
        row["patchedAt"].as_str()
    );
    let after = pod_uids(&client, n, "app=owned").await;
    assert!(
        after.iter().all(|u| !before.contains(u)),
        "{before:?} -> {after:?}"
    );
    assert_eq!(
        bouncer_events(&client, n, "owned", "Bounced").await.len(),
        1
    );
    assert!(
        bouncer_events(&client, n, "owned", "BounceReverted")
            .await
            .is_empty()
    );
}

fn uid_of(pods: &[Pod], name: &str) -> String {
    let pod = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .expect("pod present");
    pod.metadata.uid.clone().unwrap()
}

/// mcpd-style bare pods: skipped for downtime unless the policy allows it; then each is evicted
/// through policy/v1 and recreated under its name with a new
/// UID, the second eviction only after the first pod's replacement was Ready.
#[tokio::test]
async fn bare_pods_are_evicted_one_at_a_time() {
    let client = client().await;
    let ns = TestNs::new(&client, "bare").await;
    let n = ns.name();
    let _app = BarePodApp::spawn(
        client.clone(),
        n,
        "mcpd",
        2,
        pod_template(&[("app", "mcpd")]),
    )
    .await
    .expect("app starts");
    let before = wait_pods_ready(&client, n, "app=mcpd", 2, READY)
        .await
        .unwrap();
    let strict = Policies::new(&[(
        "p.yaml",
        &policy(
            "mcpd",
            n,
            "{app: mcpd}",
            &format!("    kinds: [Pod]\n{EVERY_MINUTE}"),
        ),
    )]);
    let allowed = Policies::new(&[(
        "p.yaml",
        &policy(
            "mcpd",
            n,
            "{app: mcpd}",
            &format!("    kinds: [Pod]\n{EVERY_MINUTE}  allowDowntime: true\n"),
        ),
    )]);
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();

    let skipped = bouncer(&["run"], &strict, n).await;
    assert_eq!(
        skipped.code, 0,
        "stderr: {}\nreport: {:#}",
        skipped.stderr, skipped.report
    );
    for name in ["mcpd-0", "mcpd-1"] {
        let row = skipped.row(name);
        assert_eq!(
            (row["decision"].as_str(), row["reasonCode"].as_str()),
            (Some("skip"), Some("downtime")),
            "{row:#}"
        );
    }
    assert_eq!(pod_uids(&client, n, "app=mcpd").await, pod_uids_of(&before));
    if let Some(mark) = mark {
        assert!(
            evictions(mark, n).is_empty(),
            "nothing evicted without allowDowntime"
        );
    }

    let mark = audit_mark();
    let run = bouncer(&["run"], &allowed, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.bounced(), ["mcpd-0", "mcpd-1"], "{:#}", run.report);
    for name in ["mcpd-0", "mcpd-1"] {
        assert_eq!(run.row(name)["method"], "evict");
        assert!(
            run.stderr
                .contains(&format!("evicting pod {name} (policy/v1)")),
            "{}",
            run.stderr
        );
    }
    let after = wait_pods_ready(&client, n, "app=mcpd", 2, READY)
        .await
        .unwrap();
    for name in ["mcpd-0", "mcpd-1"] {
        assert_ne!(
            uid_of(&after, name),
            uid_of(&before, name),
            "{name} was recreated"
        );
    }
    if let Some(mark) = mark {
        let evicted = evictions(mark, n);
        let names: Vec<&str> = evicted.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["mcpd-0", "mcpd-1"]);
        assert_one_at_a_time(&evicted, &after);
    }
    assert!(!pods(&client, n, "app=mcpd").await.is_empty());
}

fn pod_uids_of(pods: &[Pod]) -> Vec<String> {
    let mut uids: Vec<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
    uids.sort();
    uids
}

/// Eviction answers of the API server to bouncer since `mark` in `ns`: (pod, HTTP code).
fn eviction_answers(mark: u64, ns: &str) -> Vec<(String, i64)> {
    let log = audit_since(mark);
    audited(&log, "create", "pods/eviction", ns)
        .into_iter()
        .map(|e| {
            (
                e["objectRef"]["name"].as_str().unwrap().to_string(),
                e["responseStatus"]["code"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// The eviction path under a PodDisruptionBudget that allows no disruption (the planner does not
/// gate `onRevert: evict`, the Eviction API does): a 429 is retried until the bounce's timeout,
/// then the bounce fails as refused (in time, whatever the client retries by itself); on the
/// next run the budget is relaxed while bouncer retries, and the evictions go through one at a
/// time.
#[tokio::test]
async fn pdb_refusals_are_retried_until_the_budget_allows_or_the_timeout() {
    let client = client().await;
    let ns = TestNs::new(&client, "pdb-retry").await;
    let n = ns.name();
    let owned = deployment("owned", 2, &[("app", "owned"), ("revert", "yes")]);
    let _operator = RevertingOperator::spawn(client.clone(), n, owned, RevertMode::Strict)
        .await
        .expect("operator starts");
    wait_rollout_complete(&client, Kind::Deployment, n, "owned", READY)
        .await
        .expect("owned ready");
    let pdb = |min: i32| {
        format!(
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: owned, namespace: {n}}}\n\
             spec: {{minAvailable: {min}, selector: {{matchLabels: {{app: owned}}}}}}\n"
        )
    };
    crate::harness::apply(&pdb(2));
    let with_timeout = |t: &str| {
        let extra = format!("{EVERY_MINUTE}  restart: {{onRevert: evict, timeout: {t}}}\n");
        Policies::new(&[("p.yaml", &policy("owned", n, "{app: owned}", &extra))])
    };
    next_minute(Duration::from_secs(1)).await;
    let before = pod_uids(&client, n, "app=owned").await;
    let mark = audit_mark().expect("this test reads the budget's answers from the audit log");

    let started = std::time::Instant::now();
    let blocked = bouncer(&["run"], &with_timeout("20s"), n).await;
    let took = started.elapsed();
    assert_eq!(
        blocked.code, 1,
        "stderr: {}\nreport: {:#}",
        blocked.stderr, blocked.report
    );
    let row = blocked.row("owned");
    assert_eq!(row["decision"], "failed", "{row:#}");
    let reason = row["reason"].as_str().unwrap();
    assert!(reason.contains("was refused until the timeout"), "{reason}");
    // The client's own 429 retries (with a backoff of minutes) must not stretch the timeout.
    assert!(
        took < Duration::from_secs(75),
        "a 20s bounce timeout took {took:?}"
    );
    assert_eq!(
        bouncer_events(&client, n, "owned", "BounceFailed")
            .await
            .len(),
        1
    );
    let answers = eviction_answers(mark, n);
    assert!(
        answers.len() > 1 && answers.iter().all(|(_, code)| *code == 429),
        "{answers:?}"
    );
    assert_eq!(
        pod_uids(&client, n, "app=owned").await,
        before,
        "nothing was evicted"
    );

    // The failed bounce marked this fire as attempted (never repeated): the next fire is due.
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark().unwrap();
    let patient = with_timeout("3m");
    let mut running = crate::harness::spawn_bouncer(&["run"], &patient, n, &[]);
    // The audit log is a file: poll it until the budget has said no at least once.
    let refused = async {
        while !eviction_answers(mark, n)
            .iter()
            .any(|(_, code)| *code == 429)
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    if tokio::time::timeout(READY, refused).await.is_err() {
        running.start_kill().unwrap();
        let run = crate::harness::finish(running).await;
        panic!("no eviction was refused: {}\n{:#}", run.stderr, run.report);
    }
    crate::harness::apply(&pdb(1));
    let run = crate::harness::finish(running).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(
        run.row("owned")["decision"],
        "revertedEvicted",
        "{:#}",
        run.report
    );
    let after = wait_pods_ready(&client, n, "app=owned", 2, READY)
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
