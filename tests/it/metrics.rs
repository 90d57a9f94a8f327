//! Memory as the real metrics-server reports it: pods it has no numbers for, native sidecars and
//! pod-level limits, each decided by `bouncer plan` against the live aggregated metrics API.

use std::time::Duration;

use bouncer_testkit::{Kind, wait_pod_memory, wait_rollout_complete};
use bouncer_testkit::{PodTemplateExt, TestNs, client, create, deployment, pod_memory};
use kube::Client;

use crate::harness::{Bounced, Policies, bouncer, pods, policy};

const READY: Duration = Duration::from_secs(180);
const MI: u64 = 1 << 20;

async fn deploy(client: &Client, ns: &str, d: k8s_openapi::api::apps::v1::Deployment) -> String {
    let name = d.metadata.name.clone().unwrap();
    create(client, ns, &d).await.unwrap();
    wait_rollout_complete(client, Kind::Deployment, ns, &name, READY)
        .await
        .unwrap();
    pods(client, ns, &format!("app={name}"))
        .await
        .remove(0)
        .metadata
        .name
        .unwrap()
}

/// Waits until metrics-server reports the pod, so its node has been scraped since every pod of
/// the test started.
async fn measured(client: &Client, ns: &str, pod: &str) -> u64 {
    wait_pod_memory(client, ns, pod, READY, |m| m.is_some())
        .await
        .expect("metrics-server reports the pod")
        .expect("metrics")
        .bytes
}

fn threshold(run: &Bounced, workload: &str) -> Option<u64> {
    run.row(workload)["memory"]["threshold"].as_u64()
}

/// A running pod metrics-server reports nothing for (a zero working set is dropped as an
/// incomplete sample, as a pod not scraped yet has none) is "metrics missing": it never
/// triggers a bounce, while a pod beside it with numbers does.
#[tokio::test]
async fn a_pod_without_metrics_is_reported_missing_and_never_bounced() {
    let client = client().await;
    let ns = TestNs::new(&client, "nometricsyet").await;
    let n = ns.name();
    let tier = [("tier", "mcp")];
    let silent = deploy(
        &client,
        n,
        deployment("silent", 1, &[("app", "silent"), tier[0]]).with_memory("0", "0"),
    )
    .await;
    let loud = deploy(
        &client,
        n,
        deployment("loud", 1, &[("app", "loud"), tier[0]]).with_memory("512Mi", "0"),
    )
    .await;
    assert!(measured(&client, n, &loud).await >= 512 * MI);
    // Scraped (the other pod on the same nodes has numbers), yet nothing for this one.
    assert_eq!(pod_memory(&client, n, &silent).await.unwrap(), None);

    let policies = Policies::new(&[(
        "mem.yaml",
        &policy(
            "mem",
            n,
            "{tier: mcp}",
            "  triggers:\n    memory: {above: 128Mi}\n  cooldown: 1s\n",
        ),
    )]);
    let plan = bouncer(&["plan"], &policies, n).await;
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    assert_eq!(plan.row("loud")["decision"], "bounce", "{:#}", plan.report);
    let row = plan.row("silent");
    assert_eq!(
        (row["decision"].as_str(), row["reasonCode"].as_str()),
        (Some("skip"), Some("notDue")),
        "{row:#}"
    );
    assert!(
        row["reason"].as_str().unwrap().contains("metrics missing"),
        "{row:#}"
    );
    assert!(plan.report["metricsUnavailable"].is_null());
}

/// A native sidecar (an init container with `restartPolicy: Always`) belongs to the pod's
/// memory, and `container:` may name one container. KWOK v0.8 (the test cluster's nodes) serves
/// kubelet metrics for `spec.containers` only, so metrics-server has no number for the sidecar
/// here: the pod's sum is then unknown, "metrics missing", never a bounce, even though the app
/// container alone is over 85% of its own limit; naming the app container bounces on its number.
#[tokio::test]
async fn a_native_sidecar_counts_in_the_pod_and_its_missing_number_never_bounces() {
    let client = client().await;
    let ns = TestNs::new(&client, "sidecar").await;
    let n = ns.name();
    // app 300Mi of its 256Mi limit (85%: 217.6Mi); the pod with its sidecar has 512Mi.
    let pod = deploy(
        &client,
        n,
        deployment("mcp", 1, &[("app", "mcp")])
            .with_sidecar("proxy")
            .with_memory_limit(Some("256Mi"))
            .with_memory("300Mi", "0"),
    )
    .await;
    let spec = pods(&client, n, "app=mcp").await.remove(0).spec.unwrap();
    let sidecar = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    let reported = wait_pod_memory(&client, n, &pod, READY, |m| m.is_some())
        .await
        .unwrap()
        .unwrap();
    let names: Vec<&str> = reported
        .containers
        .iter()
        .map(|(c, _)| c.as_str())
        .collect();
    assert_eq!(
        names,
        ["app"],
        "metrics-server reports no sidecar on KWOK nodes"
    );

    let plan_with = |memory: &str| {
        let extra = format!("  triggers:\n    memory: {memory}\n  cooldown: 1s\n");
        Policies::new(&[("p.yaml", &policy("p", n, "{app: mcp}", &extra))])
    };
    let whole = bouncer(&["plan"], &plan_with("{percentOfLimit: 85}"), n).await;
    let row = whole.row("mcp");
    assert_eq!(row["decision"], "skip", "{row:#}");
    assert!(
        row["reason"].as_str().unwrap().contains("metrics missing"),
        "{row:#}"
    );
    let side = bouncer(&["plan"], &plan_with("{above: 1Mi, container: proxy}"), n).await;
    let row = side.row("mcp");
    assert_eq!(row["decision"], "skip", "{row:#}");
    assert!(
        row["reason"].as_str().unwrap().contains("metrics missing"),
        "{row:#}"
    );
    let app = bouncer(
        &["plan"],
        &plan_with("{percentOfLimit: 85, container: app}"),
        n,
    )
    .await;
    assert_eq!(app.row("mcp")["decision"], "bounce", "{:#}", app.report);
    assert_eq!(threshold(&app, "mcp"), Some(256 * MI * 85 / 100));
}

/// A pod-level memory limit (`spec.resources.limits`, PodLevelResources, served by v1.34+) is
/// the pod's limit when its containers set none: `percentOfLimit` applies to it instead of
/// skipping with "no memory limit".
#[tokio::test]
async fn a_pod_level_memory_limit_is_the_pods_limit() {
    let client = client().await;
    let ns = TestNs::new(&client, "podlimit").await;
    let n = ns.name();
    let pod = deploy(
        &client,
        n,
        deployment("pl", 1, &[("app", "pl")])
            .with_pod_memory_limit("512Mi")
            .with_memory("480Mi", "0"),
    )
    .await;
    let served = pods(&client, n, "app=pl").await.remove(0).spec.unwrap();
    assert!(
        served.resources.is_some(),
        "the server dropped spec.resources: PodLevelResources is off"
    );
    measured(&client, n, &pod).await;
    let policies = Policies::new(&[(
        "pct.yaml",
        &policy(
            "pct",
            n,
            "{app: pl}",
            "  triggers:\n    memory: {percentOfLimit: 85}\n  cooldown: 1s\n",
        ),
    )]);
    let plan = bouncer(&["plan"], &policies, n).await;
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    assert_eq!(plan.row("pl")["decision"], "bounce", "{:#}", plan.report);
    assert_eq!(threshold(&plan, "pl"), Some(435 * MI + MI * 2 / 10));
}
