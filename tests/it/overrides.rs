//! Per-workload overrides on the real cluster: a workload's own annotations set its memory
//! threshold, and a bad value is a skip naming the annotation, never a bounce.

use std::collections::BTreeMap;
use std::time::Duration;

use bouncer_testkit::{
    Kind, PodTemplateExt, TestNs, client, create, deployment, wait_pod_memory,
    wait_rollout_complete,
};

use crate::harness::{
    Policies, bouncer, deployment as get_deployment, deployment_restarted_at, pods, policy,
};

const READY: Duration = Duration::from_secs(120);

#[tokio::test]
async fn annotations_set_the_threshold_and_a_bad_one_is_a_skip() {
    let client = client().await;
    let ns = TestNs::new(&client, "overrides").await;
    let n = ns.name();
    // Steady usage (no leak); the policy's threshold is 256Mi.
    for (name, usage, above) in [
        ("plain", "300Mi", None),
        ("raised", "300Mi", Some("1Gi")),
        ("lowered", "200Mi", Some("128Mi")),
        ("broken", "300Mi", Some("lots")),
    ] {
        let mut d = deployment(name, 1, &[("app", name), ("tier", "mcp")]).with_memory(usage, "0");
        if let Some(above) = above {
            d.metadata.annotations = Some(BTreeMap::from([(
                "bouncer.dev/memory-above".to_string(),
                above.to_string(),
            )]));
        }
        create(&client, n, &d).await.expect("create deployment");
        wait_rollout_complete(&client, Kind::Deployment, n, name, READY)
            .await
            .expect("deployment ready");
        let pod = pods(&client, n, &format!("app={name}")).await.remove(0);
        let pod = pod.metadata.name.clone().unwrap_or_default();
        wait_pod_memory(&client, n, &pod, READY, |m| m.is_some())
            .await
            .expect("metrics-server reports the pod")
            .expect("metrics present");
    }
    let policies = Policies::new(&[(
        "memory.yaml",
        &policy(
            "mem",
            n,
            "{tier: mcp}",
            // "lowered" goes below the policy's threshold: the policy allows that far.
            "  triggers:\n    memory: {above: 256Mi}\n  cooldown: 1s\n  overrides: {minMemoryAbove: 128Mi}\n",
        ),
    )]);

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    let mut bounced = run.bounced();
    bounced.sort();
    assert_eq!(bounced, ["lowered", "plain"], "{:#}", run.report);
    assert_eq!(run.row("lowered")["memory"]["threshold"], 128 << 20);
    assert_eq!(run.row("raised")["reasonCode"], "notDue");
    assert_eq!(run.row("raised")["memory"]["threshold"], 1 << 30);
    let broken = run.row("broken");
    assert_eq!(broken["reasonCode"], "invalidOverride", "{broken:#}");
    assert!(
        broken["reason"]
            .as_str()
            .unwrap_or_default()
            .starts_with("invalid override: bouncer.dev/memory-above=\"lots\": "),
        "{broken:#}"
    );
    for name in ["raised", "broken"] {
        let d = get_deployment(&client, n, name).await;
        assert!(deployment_restarted_at(&d).is_none(), "{name} was patched");
    }
}
