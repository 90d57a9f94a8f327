//! Restarts by eviction, one pod at a time: an app that keeps bare pods under fixed names (mcpd),
//! and the evictions' own rules (order, replacement, the budget's answers) shared with the
//! ToolHive tests, where the real operator reverts restartedAt and bouncer evicts instead.

use std::time::Duration;

use bouncer_testkit::{BarePodApp, TestNs, client, pod_template, wait_pods_ready};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;

use crate::harness::{
    Policies, audit_mark, audit_since, audit_time, audited, bouncer, next_minute, pod_uids, pods,
    policy, ready_since,
};

const READY: Duration = Duration::from_secs(180);
pub(crate) use crate::harness::EVERY_MINUTE;

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
    assert!(
        evictions(mark, n).is_empty(),
        "nothing evicted without allowDowntime"
    );

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
    let evicted = evictions(mark, n);
    let names: Vec<&str> = evicted.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, ["mcpd-0", "mcpd-1"]);
    assert_one_at_a_time(&evicted, &after);
    assert!(!pods(&client, n, "app=mcpd").await.is_empty());
}

fn pod_uids_of(pods: &[Pod]) -> Vec<String> {
    let mut uids: Vec<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
    uids.sort();
    uids
}

/// Eviction answers of the API server to bouncer since `mark` in `ns`: (pod, HTTP code).
pub(crate) fn eviction_answers(mark: u64, ns: &str) -> Vec<(String, i64)> {
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
