//! The pod template's restartedAt owned by `kubectl apply --server-side`: an applier like
//! Flux, so the same gate holds the restart back before anything is written.

use bouncer_testkit::{RESTARTED_AT, TestNs, client};

use crate::flux::{
    APP, MEMORY_POLICY, PINNED, PODS, assert_held_back, generation, managers, manifest,
    owners_of_restarted_at, web_ready,
};
use crate::harness::{
    Policies, audit_mark, bouncer, deployment, kubectl_apply, patches_of, pod_uids, policy,
    restarted_at_of,
};
use crate::revert::evictions;

#[tokio::test]
async fn a_restart_kubectl_apply_server_side_pins_is_never_written() {
    let client = client().await;
    let ns = TestNs::new(&client, "pin-ssa").await;
    let n = ns.name();
    kubectl_apply(
        &["-n", n, "--server-side"],
        &manifest(&[(RESTARTED_AT, PINNED)]),
    );
    web_ready(&client, n, String::new).await;
    let owners = managers(&client, n).await;
    assert_eq!(owners_of_restarted_at(&owners), ["kubectl"], "{owners:?}");
    let applied = generation(&deployment(&client, n, APP).await);
    let uids = pod_uids(&client, n, PODS).await;
    let policies = Policies::new(&[("p.yaml", &policy("web", n, "{app: web}", MEMORY_POLICY))]);

    let mark = audit_mark();
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    let row = run.row(APP);
    assert_held_back(row, "restartPinned", "kubectl");
    assert_eq!(patches_of(mark, n), Vec::<String>::new(), "no write at all");
    assert!(evictions(mark, n).is_empty(), "nothing evicted");
    assert_eq!(generation(&deployment(&client, n, APP).await), applied);
    assert_eq!(pod_uids(&client, n, PODS).await, uids);
    assert_eq!(
        restarted_at_of(&client, n, APP).await.as_deref(),
        Some(PINNED)
    );
}
