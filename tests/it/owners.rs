//! Whose pods a bounce touches and waits for: an eviction's replacement is a pod of the same
//! owner (not any pod with the same labels), and a pod that anything owns is not a bare pod.

use std::time::Duration;

use bouncer_testkit::{
    Kind, TestNs, client, create, deployment, pod_template, wait_pods_ready, wait_rollout_complete,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::ObjectMeta;

use crate::harness::{Policies, audit_mark, bouncer, next_minute, pod_uids, pods, policy};
use crate::revert::{EVERY_MINUTE, assert_one_at_a_time, evictions};

const READY: Duration = Duration::from_secs(180);
/// How long a replacement takes to become Ready (the KWOK stage's start delay).
const SLOW_START: &str = "15s";

/// A bare pod labelled `labels`, Ready.
async fn bare_pod(client: &Client, ns: &str, name: &str, labels: &[(&str, &str)]) -> Pod {
    let template = pod_template(labels);
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..template.metadata.unwrap_or_default()
        },
        spec: template.spec,
        ..Default::default()
    };
    create(client, ns, &pod).await.expect("create pod")
}

/// A canary (a bare pod with the Deployment's labels, Ready all along) must not stand in for the
/// evicted pod's replacement: the next pod is evicted only once the Deployment's own new pod is
/// Ready, 15 s after it starts. Counting every pod the selector matches, the canary made the
/// count look restored as soon as the evicted pod was gone, and the second pod went before the
/// first one's replacement was Ready.
#[tokio::test]
async fn an_eviction_waits_for_its_own_replacement_not_a_canary() {
    let client = client().await;
    let ns = TestNs::new(&client, "evict-canary").await;
    let n = ns.name();
    let labels = [("app", "web")];
    let mut web = deployment("web", 2, &labels);
    let template = &mut web.spec.as_mut().unwrap().template;
    template.metadata.as_mut().unwrap().annotations = Some(
        [(
            "bouncer.dev/test-start-delay".to_string(),
            SLOW_START.to_string(),
        )]
        .into(),
    );
    create(&client, n, &web).await.expect("create deployment");
    bare_pod(&client, n, "canary", &labels).await;
    wait_rollout_complete(&client, Kind::Deployment, n, "web", READY)
        .await
        .expect("deployment ready");
    wait_pods_ready(&client, n, "app=web", 3, READY)
        .await
        .expect("pods ready");
    let extra = format!("    kinds: [Deployment]\n{EVERY_MINUTE}  restart: {{method: evict}}\n");
    let policies = Policies::new(&[("p.yaml", &policy("evict-web", n, "{app: web}", &extra))]);
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.bounced(), ["web"], "{:#}", run.report);
    assert_eq!(run.row("web")["method"], "evict");
    assert_eq!(run.row("canary")["reasonCode"], "kindNotSelected");
    let after = wait_pods_ready(&client, n, "app=web", 3, READY)
        .await
        .expect("pods ready");
    assert!(
        after
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some("canary")),
        "the canary is left alone"
    );
    let evicted = evictions(mark, n);
    assert_eq!(evicted.len(), 2, "{evicted:?}");
    assert!(evicted.iter().all(|(p, _)| p.starts_with("web-")));
    assert_one_at_a_time(&evicted, &after);
    let gap = evicted[1].1 - evicted[0].1;
    assert!(
        gap >= chrono::Duration::seconds(14),
        "the second eviction came {gap} after the first, before a {SLOW_START} start"
    );
    eprintln!(
        "evictions {:.1}s apart (replacement start {SLOW_START}, a canary Ready all along)",
        gap.as_seconds_f64()
    );
}

/// A pod whose only ownerReference is not a controller's (here a ConfigMap as its
/// garbage-collection parent) is owned, not bare: a `kinds: [Pod]` policy reports it as an
/// unsupported owner and never evicts it.
#[tokio::test]
async fn a_pod_owned_without_a_controller_is_not_a_bare_pod() {
    let client = client().await;
    let ns = TestNs::new(&client, "owned-pod").await;
    let n = ns.name();
    let parent = ConfigMap {
        metadata: ObjectMeta {
            name: Some("parent".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let parent = create(&client, n, &parent).await.expect("create configmap");
    let mut template = pod_template(&[("app", "held")]);
    let mut meta = template.metadata.take().unwrap_or_default();
    meta.name = Some("held".into());
    meta.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "parent".into(),
        uid: parent.metadata.uid.clone().expect("uid"),
        controller: None,
        block_owner_deletion: None,
    }]);
    let held = Pod {
        metadata: meta,
        spec: template.spec,
        ..Default::default()
    };
    create(&client, n, &held).await.expect("create pod");
    let before = wait_pods_ready(&client, n, "app=held", 1, READY)
        .await
        .expect("pod ready");
    let extra = format!(
        "    kinds: [Pod]\n{EVERY_MINUTE}  allowDowntime: true\n  restart: {{timeout: 10s}}\n"
    );
    let policies = Policies::new(&[("p.yaml", &policy("held", n, "{app: held}", &extra))]);
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    let row = run.row("held");
    assert_eq!(row["decision"], "skip", "{row:#}");
    assert_eq!(row["reasonCode"], "unsupportedOwner", "{row:#}");
    assert_eq!(
        row["reason"], "unsupported owner ConfigMap parent",
        "{row:#}"
    );
    assert!(run.bounced().is_empty(), "{:#}", run.report);
    assert_eq!(
        pod_uids(&client, n, "app=held").await,
        [before[0].metadata.uid.clone().unwrap()]
    );
    assert_eq!(pods(&client, n, "app=held").await.len(), 1);
    assert!(evictions(mark, n).is_empty(), "nothing evicted");
}
