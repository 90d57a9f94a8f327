//! The pod template's restartedAt owned by `kubectl apply --server-side`: an applier like
//! Flux, so the same gate holds the restart back before anything is written.

use std::io::Write as _;
use std::process::Stdio;

use bouncer_testkit::{RESTARTED_AT, TestNs, client};

use crate::flux::{
    APP, MEMORY_POLICY, PINNED, PODS, generation, managers, manifest, owners_of_restarted_at,
    web_ready,
};
use crate::harness::{
    Policies, audit_mark, audit_since, audited, bouncer, deployment, pod_uids, policy,
    restarted_at_of,
};
use crate::revert::evictions;

/// `kubectl apply --server-side -f -` of `manifest` in `ns`.
fn apply_server_side(ns: &str, manifest: &str) {
    let mut child = bouncer_testkit::kubectl()
        .args(["-n", ns, "apply", "--server-side", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(manifest.as_bytes())
        .expect("write the manifest");
    let out = child.wait_with_output().expect("kubectl finishes");
    assert!(
        out.status.success(),
        "kubectl apply --server-side: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_restart_kubectl_apply_server_side_pins_is_never_written() {
    let client = client().await;
    let ns = TestNs::new(&client, "pin-ssa").await;
    let n = ns.name();
    apply_server_side(n, &manifest(&[(RESTARTED_AT, PINNED)]));
    web_ready(&client, n).await;
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
    assert_eq!(
        (row["decision"].as_str(), row["reasonCode"].as_str()),
        (Some("skip"), Some("restartPinned")),
        "{row:#}"
    );
    assert_eq!(row["restartOwner"], "kubectl", "{row:#}");
    let log = audit_since(mark);
    assert!(
        audited(&log, "patch", "deployments", n).is_empty(),
        "no template write"
    );
    assert!(evictions(mark, n).is_empty(), "nothing evicted");
    assert_eq!(generation(&deployment(&client, n, APP).await), applied);
    assert_eq!(pod_uids(&client, n, PODS).await, uids);
    assert_eq!(
        restarted_at_of(&client, n, APP).await.as_deref(),
        Some(PINNED)
    );
}
