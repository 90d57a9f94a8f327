//! A policy's own switches in a real run: `spec.dryRun` plans and reports but writes nothing for
//! its workloads, `spec.suspend` is not evaluated, and neither holds back an armed policy.

use std::time::Duration;

use bouncer_testkit::{TestNs, client, deployment};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;

use crate::harness::{
    EVERY_MINUTE, Policies, audit_mark, audit_since, bouncer, deploy, next_minute, policy,
    restarted_at_of,
};

/// resourceVersions of the Deployment `name` and of its pods (label app=NAME).
async fn versions(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String)> {
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("get deployment");
    let mut out = vec![(
        format!("deploy/{name}"),
        d.metadata.resource_version.expect("a resourceVersion"),
    )];
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={name}")))
        .await
        .expect("list pods");
    assert!(!pods.items.is_empty(), "{name} has pods");
    for p in pods {
        out.push((
            format!("pod/{}", p.metadata.name.expect("a name")),
            p.metadata.resource_version.expect("a resourceVersion"),
        ));
    }
    out.sort();
    out
}

/// Three due Deployments, one per policy: the armed policy's is bounced; the dry-run policy's is
/// reported `dryRun` (and counted in the summary) and the suspended policy's `suspended`; neither
/// of those two changes in any way (resourceVersions of the Deployment and its pods, no
/// restartedAt, no Event, no write request by bouncer that names them in the audit log).
#[tokio::test]
async fn dry_run_and_suspended_policies_write_nothing_while_an_armed_one_bounces() {
    let client = client().await;
    let ns = TestNs::new(&client, "modes").await;
    let n = ns.name();
    for name in ["armed", "trial", "paused"] {
        deploy(&client, n, deployment(name, 1, &[("app", name)])).await;
    }
    let doc = |name: &str, extra: &str| policy(name, n, &format!("{{app: {name}}}"), extra);
    let policies = Policies::new(&[
        (
            "armed.yaml",
            &doc("armed", &format!("{EVERY_MINUTE}  allowDowntime: true\n")),
        ),
        (
            "trial.yaml",
            &doc(
                "trial",
                &format!("{EVERY_MINUTE}  allowDowntime: true\n  dryRun: true\n"),
            ),
        ),
        (
            "paused.yaml",
            &doc(
                "paused",
                &format!("{EVERY_MINUTE}  allowDowntime: true\n  suspend: true\n"),
            ),
        ),
    ]);
    // Every pod started before the cron's last fire: all three are due by schedule.
    next_minute(Duration::from_secs(1)).await;
    let before_trial = versions(&client, n, "trial").await;
    let before_paused = versions(&client, n, "paused").await;
    let mark = audit_mark();

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    assert_eq!(run.bounced(), ["armed"], "{:#}", run.report);
    assert!(restarted_at_of(&client, n, "armed").await.is_some());

    let trial = run.row("trial");
    assert_eq!(trial["decision"], "dryRun", "{trial:#}");
    assert_eq!(trial["dryRun"], true, "{trial:#}");
    assert!(
        trial["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("dry run (policy spec.dryRun), would bounce: schedule")),
        "{trial:#}"
    );
    assert_eq!(run.report["summary"]["dryRun"], 1, "{:#}", run.report);
    let paused = run.row("paused");
    assert_eq!(paused["decision"], "skip", "{paused:#}");
    assert_eq!(paused["reasonCode"], "suspended", "{paused:#}");
    assert_eq!(
        run.report["suspendedPolicies"],
        serde_json::json!(["paused"])
    );
    assert_eq!(run.row("armed")["dryRun"], false);

    for (name, before) in [("trial", before_trial), ("paused", before_paused)] {
        assert_eq!(versions(&client, n, name).await, before, "{name} changed");
        assert_eq!(restarted_at_of(&client, n, name).await, None, "{name}");
        let events = Api::<Event>::namespaced(client.clone(), n)
            .list(&ListParams::default())
            .await
            .expect("list events");
        let about: Vec<_> = events
            .items
            .iter()
            .filter(|e| e.reporting_controller.as_deref() == Some("bouncer.dev/bouncer"))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect();
        assert!(about.is_empty(), "{name}: {about:#?}");
    }
    let writes: Vec<String> = audit_since(mark)
        .into_iter()
        .filter(|e| !matches!(e["verb"].as_str(), Some("get" | "list" | "watch")))
        .filter(|e| e["objectRef"]["namespace"] == n)
        .map(|e| {
            format!(
                "{} {}/{}",
                e["verb"].as_str().unwrap_or_default(),
                e["objectRef"]["resource"].as_str().unwrap_or_default(),
                e["objectRef"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert!(!writes.is_empty(), "the armed bounce's writes are audited");
    let touched: Vec<&String> = writes
        .iter()
        .filter(|w| w.contains("/trial") || w.contains("/paused"))
        .collect();
    assert!(
        touched.is_empty(),
        "writes for dry-run or suspended: {touched:?}"
    );
}
