//! A run's reach: a policy must name what it selects (a selector of only negative requirements
//! matches nearly every pod of the cluster and is refused before any request), and every run
//! takes the one shared Lease, wherever the kubeconfig's context points.

use std::time::Duration;

use bouncer_testkit::{Kind, TestNs, client, create, deployment, wait_rollout_complete};
use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::harness::{
    Bounced, Policies, audit_mark, audit_since, bouncer, keep_patching, micro, next_minute, policy,
    restarted_at_of,
};
use crate::revert::EVERY_MINUTE;

const READY: Duration = Duration::from_secs(180);

async fn deploy(client: &Client, ns: &str, name: &str) {
    let d = deployment(name, 1, &[("app", name)]);
    create(client, ns, &d).await.expect("create deployment");
    wait_rollout_complete(client, Kind::Deployment, ns, name, READY)
        .await
        .expect("deployment ready");
}

/// `spec.target.selector` of only `NotIn` / `DoesNotExist` matches every pod without those
/// labels: `validate`, `plan` and `run` refuse it with exit 2, naming the file and the field, and
/// bouncer sends the API server no request at all, though a pod it would match is due.
#[tokio::test]
async fn a_selector_of_only_negative_requirements_is_refused_before_any_request() {
    let client = client().await;
    let ns = TestNs::new(&client, "negative").await;
    let n = ns.name();
    deploy(&client, n, "web").await;
    let text = format!(
        "apiVersion: bouncer.dev/v1alpha1\nkind: BouncePolicy\nmetadata: {{name: everything}}\nspec:\n  \
         target:\n    namespaces: [{n}]\n    selector:\n      matchExpressions:\n      \
         - {{key: tier, operator: NotIn, values: [canary]}}\n      - {{key: debug, operator: DoesNotExist}}\n\
         {EVERY_MINUTE}  allowDowntime: true\n"
    );
    let policies = Policies::new(&[("negative.yaml", &text)]);
    next_minute(Duration::from_secs(1)).await;
    let mark = audit_mark();
    let validate = std::process::Command::new(env!("CARGO_BIN_EXE_bouncer"))
        .arg("validate")
        .arg(policies.path())
        .output()
        .expect("bouncer starts");
    let mut runs = vec![("validate", Bounced::from(validate))];
    for cmd in ["plan", "run"] {
        runs.push((cmd, bouncer(&[cmd], &policies, n).await));
    }
    for (cmd, out) in &runs {
        assert_eq!(out.code, 2, "{cmd}: {}{}", out.stdout, out.stderr);
        let msg = &out.stderr;
        assert!(msg.contains("negative.yaml"), "{cmd}: {msg}");
        assert!(msg.contains("spec.target.selector:"), "{cmd}: {msg}");
        assert!(msg.contains("only NotIn/DoesNotExist"), "{cmd}: {msg}");
    }
    assert_eq!(restarted_at_of(&client, n, "web").await, None);
    // Other tests' runs go on meanwhile: these would have read the policy's namespace (its
    // pods, its workloads) and taken the Lease there.
    let requests: Vec<_> = audit_since(mark)
        .into_iter()
        .filter(|e| e["objectRef"]["namespace"] == n)
        .collect();
    assert!(requests.is_empty(), "no request: {requests:#?}");
}

/// A kubeconfig copy whose current context's namespace is `ns`: a person's laptop pointed at
/// some other namespace than the CronJob's.
fn kubeconfig_in(ns: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let cluster = bouncer_testkit::cluster();
    let path = dir.join("kubeconfig");
    std::fs::copy(&cluster.kubeconfig, &path).expect("copy kubeconfig");
    let out = std::process::Command::new(&cluster.kubectl)
        .arg(format!("--kubeconfig={}", path.display()))
        .args(["config", "set-context", "--current", "--namespace", ns])
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// `bouncer run` as a person runs it: no lease namespace set, the context's namespace `ns`.
async fn run_from_laptop(
    kubeconfig: &std::path::Path,
    policies: &Policies,
    lease: &str,
) -> Bounced {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_bouncer"))
        .arg("run")
        .arg("--policies")
        .arg(policies.path())
        .args(["--output", "json", "--rollout-timeout", "90s"])
        .env("KUBECONFIG", kubeconfig)
        .env("BOUNCER_LEASE_NAME", lease)
        .env("BOUNCER_VERIFY_SETTLE", "1s")
        .env_remove("BOUNCER_LEASE_NAMESPACE")
        .output()
        .await
        .expect("bouncer starts")
        .into()
}

/// The namespace every run's Lease lives in unless told otherwise (the chart's install
/// namespace in docs/install.md); shared by the tests, so it is created if missing and never
/// deleted.
const SHARED: &str = "bouncer";

async fn shared_namespace(client: &Client) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(SHARED.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating namespace {SHARED}: {e}"),
    }
}

/// Deletes the test's Lease from the shared namespace however the test ends.
struct DropLease(&'static str);

impl Drop for DropLease {
    fn drop(&mut self) {
        let _ = bouncer_testkit::kubectl()
            .args([
                "-n",
                SHARED,
                "delete",
                "lease",
                self.0,
                "--ignore-not-found",
            ])
            .output();
    }
}

/// A run from a laptop whose kubeconfig context points at another namespace takes the same
/// Lease as the CronJob (namespace `bouncer`, whatever the context says): while the CronJob's
/// run holds it, the laptop's run bounces nothing; once free, the laptop's run takes that very
/// Lease and none in its context's namespace.
#[tokio::test]
async fn a_run_from_another_context_takes_the_cronjobs_lease() {
    let client = client().await;
    let ns = TestNs::new(&client, "lease-ns").await;
    let n = ns.name();
    shared_namespace(&client).await;
    deploy(&client, n, "web").await;
    let policies = Policies::new(&[("p.yaml", &policy("web", n, "{app: web}", EVERY_MINUTE))]);
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = kubeconfig_in(n, dir.path());
    // Its own Lease name: tests run at once, and the namespace is shared.
    let lease_name: &'static str = Box::leak(format!("{n}-lock").into_boxed_str());
    let held = |renewed: DateTime<Utc>| {
        json!({"spec": {"holderIdentity": "cronjob-run", "leaseDurationSeconds": 30, "leaseTransitions": 0,
            "acquireTime": micro(renewed), "renewTime": micro(renewed)}})
    };
    let mut lease: Lease = serde_json::from_value(held(Utc::now())).unwrap();
    lease.metadata.name = Some(lease_name.into());
    let shared = Api::<Lease>::namespaced(client.clone(), SHARED);
    let _cleanup = DropLease(lease_name);
    shared
        .create(&PostParams::default(), &lease)
        .await
        .expect("create lease");
    next_minute(Duration::from_secs(1)).await;

    let renewing = keep_patching(shared.clone(), lease_name, move || held(Utc::now()));
    let busy = run_from_laptop(&kubeconfig, &policies, lease_name).await;
    renewing.abort();
    assert_eq!(busy.code, 0, "{}", busy.stderr);
    let named = format!("holds the lock {SHARED}/{lease_name}");
    assert!(busy.stderr.contains(&named), "{}", busy.stderr);
    assert!(busy.stderr.contains("cronjob-run"), "{}", busy.stderr);
    assert_eq!(
        restarted_at_of(&client, n, "web").await,
        None,
        "bounced beside the CronJob's run"
    );

    // Released, as a finished run leaves it: the laptop's run takes it, in the same namespace.
    let released = json!({"spec": {"holderIdentity": null}});
    shared
        .patch(
            lease_name,
            &PatchParams::default(),
            &Patch::Merge(&released),
        )
        .await
        .expect("release lease");
    let run = run_from_laptop(&kubeconfig, &policies, lease_name).await;
    assert_eq!(
        run.code, 0,
        "stderr: {}\nreport: {:#}",
        run.stderr, run.report
    );
    assert_eq!(run.bounced(), ["web"], "{:#}", run.report);
    let taken = shared.get(lease_name).await.expect("the shared lease");
    let transitions = taken.spec.and_then(|s| s.lease_transitions);
    assert_eq!(transitions, Some(1), "taken by the laptop's run");
    let own = Api::<Lease>::namespaced(client.clone(), n)
        .get_opt(lease_name)
        .await;
    assert!(
        own.expect("get lease").is_none(),
        "no Lease in the context's namespace"
    );
}
