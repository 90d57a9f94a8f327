//! Safety round 3 on the real API server: a StatefulSet whose `maxUnavailable` takes every pod
//! at once (hole 1), a rollout under an exhausted PodDisruptionBudget (hole 3), override
//! annotations below the policy's floor (hole 7) and `bouncer.dev/exclude` values other than
//! "true" (hole 8). Each workload here was bounced before its fix.

use std::time::Duration;

use bouncer_testkit::{
    PodTemplateExt, TestNs, client, create, deployment, statefulset, wait_pod_memory,
    wait_pods_ready,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::harness::{
    EVERY_MINUTE, Policies, apply, bouncer, deploy, next_minute, pod_uids, pods, policy,
    restarted_at_of, statefulset as get_statefulset,
};

const READY: Duration = Duration::from_secs(180);

fn with_strategy(mut d: Deployment, surge: i32, unavailable: i32) -> Deployment {
    d.spec.as_mut().unwrap().strategy = Some(
        serde_json::from_value(json!({"type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}))
        .unwrap(),
    );
    d
}

fn annotated(mut d: Deployment, pairs: &[(&str, &str)]) -> Deployment {
    d.metadata.annotations = Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    d
}

fn skipped(run: &crate::harness::Bounced, name: &str, code: &str) {
    let row = run.row(name);
    assert_eq!(
        (row["decision"].as_str(), row["reasonCode"].as_str()),
        (Some("skip"), Some(code)),
        "{name}: {row:#}"
    );
}

/// Hole 1: a StatefulSet of two with `maxUnavailable: 2` restarts both pods at once (the
/// controller honours it with the MaxUnavailableStatefulSet feature, which the test cluster
/// enables): no pod stays ready, so without `allowDowntime` it is skipped `downtime`, never
/// patched. Before the fix bouncer assumed one pod at a time and rolled it.
#[tokio::test]
async fn hole1_statefulset_max_unavailable_is_the_real_bound() {
    let client = client().await;
    let ns = TestNs::new(&client, "r3-sts").await;
    let n = ns.name();
    let mut s = statefulset("all", 2, &[("app", "all"), ("r3", "sts")]);
    s.spec.as_mut().unwrap().update_strategy = Some(
        serde_json::from_value(
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}),
        )
        .unwrap(),
    );
    create(&client, n, &s).await.expect("create statefulset");
    let served = get_statefulset(&client, n, "all").await;
    let kept = served
        .spec
        .and_then(|s| s.update_strategy?.rolling_update?.max_unavailable);
    assert!(
        kept.is_some(),
        "the API server dropped maxUnavailable: it needs --feature-gates=MaxUnavailableStatefulSet=true (scripts/cluster sets it)"
    );
    wait_pods_ready(&client, n, "app=all", 2, READY)
        .await
        .expect("statefulset pods ready");
    let policies = Policies::new(&[("p.yaml", &policy("sts", n, "{r3: sts}", EVERY_MINUTE))]);
    next_minute(Duration::from_secs(1)).await;
    let before = pod_uids(&client, n, "app=all").await;

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    skipped(&run, "all", "downtime");
    assert_eq!(
        get_statefulset(&client, n, "all")
            .await
            .template_annotation(bouncer_testkit::RESTARTED_AT),
        None,
        "the StatefulSet was patched"
    );
    assert_eq!(pod_uids(&client, n, "app=all").await, before);
}

/// Waits until the disruption controller has counted the budget's pods: its status is what
/// bouncer reads, and an uncounted one would block for the wrong reason.
async fn wait_budget(client: &Client, ns: &str, name: &str, healthy: i32) -> PodDisruptionBudget {
    let api = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns);
    let deadline = tokio::time::Instant::now() + READY;
    loop {
        let pdb = api.get(name).await.expect("get the budget");
        let status = pdb.status.clone().unwrap_or_default();
        if status.current_healthy == Some(healthy) && status.observed_generation.is_some() {
            return pdb;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "budget {name} not counted: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Hole 3: two Deployments of two pods, each covered by a budget with `minAvailable: 2` (no
/// disruption allowed). The one whose rollout takes a pod away first (maxUnavailable 1,
/// maxSurge 0) is skipped `pdbBlocks` and never patched; the surge-only one (maxUnavailable 0,
/// maxSurge 1) removes an old pod only once its replacement is available, so it is bounced.
/// Before the fix the budget was read only for evictions and both were rolled.
#[tokio::test]
async fn hole3_a_rollout_that_takes_pods_away_respects_an_exhausted_budget() {
    let client = client().await;
    let ns = TestNs::new(&client, "r3-pdb").await;
    let n = ns.name();
    for (name, surge, unavailable) in [("taking", 0, 1), ("surging", 1, 0)] {
        let d = deployment(name, 2, &[("app", name), ("r3", "pdb")]);
        deploy(&client, n, with_strategy(d, surge, unavailable)).await;
        apply(&format!(
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: {name}, namespace: {n}}}\n\
             spec: {{minAvailable: 2, selector: {{matchLabels: {{app: {name}}}}}}}\n"
        ));
    }
    for name in ["taking", "surging"] {
        let pdb = wait_budget(&client, n, name, 2).await;
        assert_eq!(pdb.status.unwrap().disruptions_allowed, Some(0), "{name}");
    }
    let policies = Policies::new(&[("p.yaml", &policy("pdb", n, "{r3: pdb}", EVERY_MINUTE))]);
    next_minute(Duration::from_secs(1)).await;
    let before = pod_uids(&client, n, "app=taking").await;

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    skipped(&run, "taking", "pdbBlocks");
    assert!(
        run.row("taking")["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("PodDisruptionBudget taking"),
        "{:#}",
        run.row("taking")
    );
    assert_eq!(run.bounced(), ["surging"], "{:#}", run.report);
    assert_eq!(restarted_at_of(&client, n, "taking").await, None);
    assert_eq!(pod_uids(&client, n, "app=taking").await, before);
}

/// Hole 7: with no `spec.overrides` bounds, `bouncer.dev/memory-above: "1"` (a pod at 64Mi
/// against the policy's 1Gi) and `bouncer.dev/cooldown: 1s` (pods younger than the policy's 1h)
/// are refused (`invalidOverride`) and bounce nothing; a higher threshold is taken as written,
/// and a policy that bounds its cooldown at 1s lets the same annotation through. Before the fix
/// both of the first two were bounced.
#[tokio::test]
async fn hole7_overrides_loosen_only_within_the_policys_bounds() {
    let client = client().await;
    let ns = TestNs::new(&client, "r3-floor").await;
    let n = ns.name();
    let workloads = [
        ("tiny", "memory", ("bouncer.dev/memory-above", "1")),
        ("careful", "memory", ("bouncer.dev/memory-above", "4Gi")),
        ("hasty", "cooldown", ("bouncer.dev/cooldown", "1s")),
        ("allowed", "bounded", ("bouncer.dev/cooldown", "1s")),
    ];
    for (name, group, annotation) in workloads {
        let d = deployment(name, 1, &[("app", name), ("r3", group)]).with_memory("64Mi", "0");
        deploy(&client, n, annotated(d, &[annotation])).await;
    }
    for name in ["tiny", "careful"] {
        let pod = pods(&client, n, &format!("app={name}")).await.remove(0);
        let pod = pod.metadata.name.unwrap_or_default();
        wait_pod_memory(&client, n, &pod, READY, |m| m.is_some())
            .await
            .expect("metrics-server reports the pod")
            .expect("metrics present");
    }
    let schedule =
        "  triggers:\n    schedule: {cron: \"* * * * *\", startingDeadline: 5m}\n  cooldown: 1h\n";
    let policies = Policies::new(&[
        (
            "memory.yaml",
            &policy(
                "memory",
                n,
                "{r3: memory}",
                "  triggers:\n    memory: {above: 1Gi}\n  cooldown: 1s\n",
            ),
        ),
        (
            "cooldown.yaml",
            &policy("cooldown", n, "{r3: cooldown}", schedule),
        ),
        (
            "bounded.yaml",
            &policy(
                "bounded",
                n,
                "{r3: bounded}",
                &format!("{schedule}  overrides: {{minCooldown: 1s}}\n"),
            ),
        ),
    ]);
    next_minute(Duration::from_secs(1)).await;

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    assert_eq!(run.bounced(), ["allowed"], "{:#}", run.report);
    for (name, annotation, floor) in [
        ("tiny", "bouncer.dev/memory-above=\"1\"", "below 1Gi"),
        ("hasty", "bouncer.dev/cooldown=\"1s\"", "below 1h"),
    ] {
        skipped(&run, name, "invalidOverride");
        let reason = run.row(name)["reason"].as_str().unwrap_or_default();
        assert!(
            reason.starts_with(&format!("invalid override: {annotation}: {floor}")),
            "{reason}"
        );
    }
    skipped(&run, "careful", "notDue");
    assert_eq!(run.row("careful")["memory"]["threshold"], 4u64 << 30);
    for name in ["tiny", "careful", "hasty"] {
        assert_eq!(
            restarted_at_of(&client, n, name).await,
            None,
            "{name} was patched"
        );
    }
}

/// Hole 8: `bouncer.dev/exclude` values "True", "yes" and "1" on a workload, and "yes" on a
/// namespace, opt out (fail closed), each named in the reason and warned about; only "false"
/// (the control) is bounced. Before the fix only the exact "true" excluded.
#[tokio::test]
async fn hole8_any_exclude_value_but_false_opts_out() {
    let client = client().await;
    let ns = TestNs::new(&client, "r3-excl").await;
    let other = TestNs::new(&client, "r3-exns").await;
    let (n, o) = (ns.name(), other.name());
    let exclude = json!({"metadata": {"annotations": {"bouncer.dev/exclude": "yes"}}});
    Api::<Namespace>::all(client.clone())
        .patch(o, &PatchParams::default(), &Patch::Merge(&exclude))
        .await
        .expect("annotate the namespace");
    let values = [
        ("capital", "True"),
        ("yes", "yes"),
        ("one", "1"),
        ("control", "false"),
    ];
    for (name, value) in values {
        let d = deployment(name, 1, &[("app", name), ("r3", "exclude")]);
        deploy(&client, n, annotated(d, &[("bouncer.dev/exclude", value)])).await;
    }
    deploy(
        &client,
        o,
        deployment("elsewhere", 1, &[("app", "elsewhere"), ("r3", "exclude")]),
    )
    .await;
    let policies = Policies::new(&[(
        "p.yaml",
        &policy("excl", &format!("{n}, {o}"), "{r3: exclude}", EVERY_MINUTE),
    )]);
    next_minute(Duration::from_secs(1)).await;

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}\n{:#}", run.stderr, run.report);
    assert_eq!(run.bounced(), ["control"], "{:#}", run.report);
    for (name, value) in &values[..3] {
        skipped(&run, name, "excluded");
        let reason = run.row(name)["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains(&format!("bouncer.dev/exclude={value:?}"))
                && reason.contains("fail closed"),
            "{reason}"
        );
        assert!(
            run.stderr.contains(&format!(
                "deployment/{n}/{name} is annotated bouncer.dev/exclude={value:?}"
            )),
            "no warning for {name}: {}",
            run.stderr
        );
        assert_eq!(restarted_at_of(&client, n, name).await, None, "{name}");
    }
    skipped(&run, "elsewhere", "namespaceExcluded");
    assert!(
        run.stderr.contains(&format!(
            "namespace {o} is annotated bouncer.dev/exclude=\"yes\""
        )),
        "{}",
        run.stderr
    );
    assert_eq!(restarted_at_of(&client, o, "elsewhere").await, None);
}
