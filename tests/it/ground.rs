//! Proves the test harness is real: restarts roll new pods, metrics-server's numbers leak and reset, and
//! the bare-pod app really recreates its pods.

use std::time::Duration;

use bouncer_testkit::PodMemory;
use bouncer_testkit::{
    BarePodApp, Kind, PodTemplateExt, RESTARTED_AT, TestNs, client, create, daemonset, deployment,
    model_usage, pod_template, rollout_restart_patch, statefulset, wait_pod_memory,
    wait_pod_replaced, wait_pods_ready, wait_rollout_complete,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};

/// Generous: the whole control plane shares two cores with every test running at once.
const WAIT: Duration = Duration::from_secs(180);
const MI: u64 = 1 << 20;

fn uids(pods: &[Pod]) -> Vec<String> {
    pods.iter().filter_map(|p| p.uid()).collect()
}

/// Creates a workload of `kind`, restarts it the way kubectl does and checks that the rollout
/// completes with only new pods, each carrying the restartedAt value.
async fn restart_rolls_new_pods(kind: Kind) {
    let client = client().await;
    let ns = TestNs::new(&client, "harness").await;
    let n = ns.name();
    let labels = [("app", "roll")];
    match kind {
        Kind::Deployment => drop(
            create(&client, n, &deployment("roll", 2, &labels))
                .await
                .unwrap(),
        ),
        Kind::StatefulSet => drop(
            create(&client, n, &statefulset("roll", 2, &labels))
                .await
                .unwrap(),
        ),
        Kind::DaemonSet => drop(
            create(&client, n, &daemonset("roll", &labels))
                .await
                .unwrap(),
        ),
    }
    wait_rollout_complete(&client, kind, n, "roll", WAIT)
        .await
        .expect("initial rollout");
    let count = match kind {
        Kind::DaemonSet => {
            let ds = Api::<DaemonSet>::namespaced(client.clone(), n)
                .get("roll")
                .await
                .unwrap();
            usize::try_from(ds.status.unwrap().desired_number_scheduled).unwrap()
        }
        _ => 2,
    };
    assert!(
        count >= 1,
        "a DaemonSet must schedule on at least one KWOK node"
    );
    let before = wait_pods_ready(&client, n, "app=roll", count, WAIT)
        .await
        .expect("pods before");

    let value = rollout_restart_patch(&client, kind, n, "roll")
        .await
        .expect("restart patch");
    wait_rollout_complete(&client, kind, n, "roll", WAIT)
        .await
        .expect("rollout after restart");
    let after = wait_pods_ready(&client, n, "app=roll", count, WAIT)
        .await
        .expect("pods after");

    let old = uids(&before);
    for pod in &after {
        assert!(
            !old.contains(&pod.uid().unwrap()),
            "pod {} survived the restart",
            pod.name_any()
        );
        assert_eq!(
            pod.annotations().get(RESTARTED_AT),
            Some(&value),
            "pod {} template",
            pod.name_any()
        );
    }
}

#[tokio::test]
async fn restart_patch_rolls_a_deployment() {
    restart_rolls_new_pods(Kind::Deployment).await;
}

#[tokio::test]
async fn restart_patch_rolls_a_statefulset() {
    restart_rolls_new_pods(Kind::StatefulSet).await;
}

#[tokio::test]
async fn restart_patch_rolls_a_daemonset() {
    restart_rolls_new_pods(Kind::DaemonSet).await;
}

/// Asserts that metrics-server reports what the memory model gives at the sample's time, to
/// within two seconds of leak: KWOK evaluates the model when metrics-server scrapes, and the
/// sample's timestamp is the scrape's.
fn assert_model(pod: &Pod, m: &PodMemory, leak_per_minute: u64) {
    let model: u64 = model_usage(pod, m.timestamp)
        .unwrap()
        .expect("a running pod")
        .iter()
        .map(|(_, b)| b)
        .sum();
    let slack = leak_per_minute / 30;
    assert!(
        m.bytes.abs_diff(model) <= slack,
        "metrics-server reports {} for {}, the model {model} (slack {slack})",
        m.bytes,
        pod.name_any()
    );
}

#[tokio::test]
async fn pod_metrics_leak_and_drop_after_restart() {
    let client = client().await;
    let ns = TestNs::new(&client, "harness").await;
    let n = ns.name();
    let leaky = deployment("leaky", 1, &[("app", "leaky")]).with_memory("16Mi", "60Mi");
    create(&client, n, &leaky).await.unwrap();
    wait_rollout_complete(&client, Kind::Deployment, n, "leaky", WAIT)
        .await
        .unwrap();
    let pod = wait_pods_ready(&client, n, "app=leaky", 1, WAIT)
        .await
        .unwrap()
        .remove(0);
    let name = pod.name_any();

    let first = wait_pod_memory(&client, n, &name, WAIT, |m| m.is_some())
        .await
        .unwrap()
        .unwrap();
    // metrics-server samples every 10 s (its --metric-resolution).
    let later = first.timestamp.as_second() + 9;
    let second = wait_pod_memory(&client, n, &name, WAIT, |m| {
        m.is_some_and(|m| m.timestamp.as_second() >= later)
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        second.bytes > first.bytes,
        "no growth: {first:?} then {second:?}"
    );
    // 60Mi/min is 1Mi per second of pod age, plus 4Mi from no other container.
    assert_model(&pod, &first, 60 * MI);
    assert_model(&pod, &second, 60 * MI);
    assert!(second.bytes - first.bytes >= 9 * MI);

    rollout_restart_patch(&client, Kind::Deployment, n, "leaky")
        .await
        .unwrap();
    wait_rollout_complete(&client, Kind::Deployment, n, "leaky", WAIT)
        .await
        .expect("rollout after restart");
    let new_pod = wait_pods_ready(&client, n, "app=leaky", 1, WAIT)
        .await
        .unwrap()
        .remove(0);
    assert_ne!(new_pod.uid(), pod.uid());
    // The replaced pod's metrics go with it (at metrics-server's next scrape).
    wait_pod_memory(&client, n, &name, WAIT, |m| m.is_none())
        .await
        .expect("PodMetrics of the replaced pod gone");
    let fresh = wait_pod_memory(&client, n, &new_pod.name_any(), WAIT, |m| m.is_some())
        .await
        .unwrap()
        .unwrap();
    assert_model(&new_pod, &fresh, 60 * MI);
    let old_then: u64 = model_usage(&pod, fresh.timestamp)
        .unwrap()
        .unwrap()
        .iter()
        .map(|(_, b)| b)
        .sum();
    // The drop is the two pods' age gap at 1Mi/s: at least the 9 s between the two samples taken
    // before the restart (more on a slow machine, so no fixed larger margin).
    assert!(
        fresh.bytes + 9 * MI <= old_then,
        "no drop after restart: old pod's model {old_then}, new {fresh:?}"
    );
}

#[tokio::test]
async fn bare_pod_app_recreates_a_deleted_pod() {
    let client = client().await;
    let ns = TestNs::new(&client, "harness").await;
    let n = ns.name();
    let template = pod_template(&[("app", "mcpd")]).with_memory("32Mi", "10Mi");
    let app = BarePodApp::spawn(client.clone(), n, "mcpd", 2, template)
        .await
        .expect("app");
    let pods = wait_pods_ready(&client, n, "app=mcpd", 2, WAIT)
        .await
        .unwrap();
    assert_eq!(
        pods.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        ["mcpd-0", "mcpd-1"]
    );
    assert!(pods.iter().all(|p| p.owner_references().is_empty()));
    let old_uid = pods[0].uid().unwrap();

    Api::<Pod>::namespaced(client.clone(), n)
        .delete("mcpd-0", &DeleteParams::default())
        .await
        .unwrap();
    let replaced = wait_pod_replaced(&client, n, "mcpd-0", &old_uid, WAIT)
        .await
        .expect("pod recreated");
    assert_ne!(replaced.uid().unwrap(), old_uid);
    assert!(replaced.owner_references().is_empty());
    assert_eq!(
        replaced
            .annotations()
            .get(bouncer_testkit::MEMORY_BASE)
            .map(String::as_str),
        Some("32Mi")
    );
    assert!(
        app.actions() >= 3,
        "2 creates plus 1 recreate, got {}",
        app.actions()
    );
    wait_pods_ready(&client, n, "app=mcpd", 2, WAIT)
        .await
        .unwrap();
}
