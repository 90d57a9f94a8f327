//! `restart.method: toolhive` asks an MCPServer's operator to restart the Deployment it named
//! after the server. Any other Deployment can claim the server as its controller (an
//! ownerReference is whatever its creator writes); bouncer must not turn such a claim into a
//! restart of the real proxy, which the policy never selected, gated or marked.

use bouncer_testkit::PodTemplateExt as _;
use std::collections::BTreeMap;
use std::time::Duration;

use bouncer_testkit::toolhive::{apply_runner_statefulset, get_resource, mcp_group, mcp_server};
use bouncer_testkit::{
    Kind, TOOLHIVE_FIXED, TestNs, ToolHiveOperator, client, create, deployment,
    wait_rollout_complete,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::harness::{
    Policies, audit_mark, audit_since, audited, bouncer, deployment as get_deployment, next_minute,
    pod_uids,
};
use crate::revert::EVERY_MINUTE;

const READY: Duration = Duration::from_secs(180);
const CR_RESTARTED_AT: &str = "mcpserver.toolhive.stacklok.dev/restarted-at";
const PROXY_PODS: &str = "app.kubernetes.io/instance=fetch,toolhive-name=fetch";

fn or_log<T>(result: anyhow::Result<T>, operator: &ToolHiveOperator) -> T {
    result.unwrap_or_else(|e| {
        let log = operator.log();
        let tail: Vec<&str> = log.lines().rev().take(25).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!("{e:#}\noperator log tail:\n{}", tail.join("\n"))
    })
}

/// The real operator (v0.45.0) runs MCPServer fetch and its proxy Deployment `fetch`. A second
/// Deployment, `forged`, names fetch as its controller with fetch's real UID and is due under a
/// `restart.method: toolhive` policy. bouncer skips it (`notOperatorOwned`) and writes nothing:
/// asking fetch for a restart would have had the operator roll the real proxy, which no policy
/// selected.
#[tokio::test]
async fn toolhive_a_forged_owner_reference_never_restarts_the_mcp_server() {
    let client = client().await;
    let ns = TestNs::new(&client, "th-forged").await;
    let n = ns.name();
    let operator = ToolHiveOperator::start(TOOLHIVE_FIXED, n)
        .await
        .unwrap_or_else(|e| panic!("operator {TOOLHIVE_FIXED}: {e:#}"));
    or_log(mcp_group(&client, n, "tools").await, &operator);
    let server = or_log(
        mcp_server(&client, n, "fetch", "tools", &BTreeMap::new()).await,
        &operator,
    );
    // v0.45.0 restarts a proxy whose backend StatefulSet is missing: create it first.
    let sts = apply_runner_statefulset(&client, n, "fetch", &BTreeMap::new(), "512Mi").await;
    or_log(sts, &operator);
    let proxy = wait_rollout_complete(&client, Kind::Deployment, n, "fetch", READY).await;
    or_log(proxy, &operator);

    let mut forged = deployment("forged", 1, &[("app", "forged")]);
    forged.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "toolhive.stacklok.dev/v1beta1".into(),
        kind: "MCPServer".into(),
        name: "fetch".into(),
        uid: server.metadata.uid.clone().expect("uid"),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    create(&client, n, &forged)
        .await
        .expect("create deployment");
    let done = wait_rollout_complete(&client, Kind::Deployment, n, "forged", READY).await;
    or_log(done, &operator);
    let proxy_pods = pod_uids(&client, n, PROXY_PODS).await;
    assert_eq!(proxy_pods.len(), 1, "the real proxy runs");
    let policy = format!(
        "apiVersion: bouncer.dev/v1alpha1\nkind: BouncePolicy\nmetadata: {{name: forged}}\nspec:\n  \
         target:\n    namespaces: [{n}]\n    selector: {{matchLabels: {{app: forged}}}}\n    \
         kinds: [Deployment]\n{EVERY_MINUTE}  restart: {{method: toolhive, timeout: 20s}}\n"
    );
    let policies = Policies::new(&[("forged.yaml", &policy)]);
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    let row = run.row("forged");
    assert_eq!(row["decision"], "skip", "{row:#}");
    assert_eq!(row["reasonCode"], "notOperatorOwned", "{row:#}");
    assert_eq!(
        row["reason"],
        "not the proxy Deployment of MCPServer fetch: the operator's proxy Deployment carries the server's name",
        "{row:#}"
    );
    let cr = or_log(
        get_resource(&client, n, "MCPServer", "fetch").await,
        &operator,
    );
    let annotations = &cr["metadata"]["annotations"];
    assert!(annotations[CR_RESTARTED_AT].is_null(), "{annotations:#}");
    let proxy = get_deployment(&client, n, "fetch").await;
    assert_eq!(
        proxy.template_annotation(CR_RESTARTED_AT),
        None,
        "not rolled"
    );
    assert_eq!(pod_uids(&client, n, PROXY_PODS).await, proxy_pods);
    let log = audit_since(mark);
    for resource in ["mcpservers", "deployments", "pods/eviction"] {
        let writes: Vec<_> = ["patch", "update", "create"]
            .iter()
            .flat_map(|verb| audited(&log, verb, resource, n))
            .collect();
        assert!(writes.is_empty(), "{resource}: {writes:#?}");
    }
}
