//! The real Flux controllers (source-controller and kustomize-controller, see
//! `bouncer_testkit::flux`) applying a Deployment from a Git repository served on loopback, and
//! bouncer restarting it: whether the restart survives Flux's reconciles, what Flux does to
//! `kubectl rollout restart`, a Git manifest that pins the restart annotation itself (never
//! written: evicted instead or skipped), a pin added after the run, and a suspended or pruning
//! Kustomization.
//!
//! Each test prints the reconcile timings and the field managers of the Deployment before and
//! after each reconcile (`cargo test -- --nocapture`).

use std::time::Duration;

use bouncer_testkit::{
    FLUX_MANAGER, FLUX_VERSION, Flux, Kind, PodTemplateExt as _, RESTARTED_AT, TestNs, client,
    wait_pod_memory, wait_pods_ready, wait_rollout_complete,
};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::api::ListParams;
use kube::{Api, Client};

use crate::harness::{
    Bounced, Policies, audit_mark, bouncer, bouncer_events, deployment, patches_of, pod_uids, pods,
    policy, restarted_at_of, rollout_restart,
};
use crate::revert::{assert_one_at_a_time, evictions};

const READY: Duration = Duration::from_secs(180);
pub(crate) const APP: &str = "web";
pub(crate) const PODS: &str = "app=web";
pub(crate) const MEMORY_POLICY: &str = "  triggers:\n    memory: {above: 256Mi}\n  cooldown: 1s\n";
/// A value some teams pin in Git to force a rollout on their own terms.
pub(crate) const PINNED: &str = "2026-01-01T00:00:00Z";

/// The Deployment as Git holds it: two pods using 300Mi each (over the policies' 256Mi), with
/// `pod_annotations` in the template. JSON is YAML, which kustomize reads.
pub(crate) fn manifest(pod_annotations: &[(&str, &str)]) -> String {
    let mut d = bouncer_testkit::deployment(APP, 2, &[("app", APP)]).with_memory("300Mi", "0");
    let annotations = d
        .spec
        .as_mut()
        .and_then(|s| s.template.metadata.as_mut())
        .and_then(|m| m.annotations.as_mut())
        .expect("template annotations");
    for (k, v) in pod_annotations {
        annotations.insert(k.to_string(), v.to_string());
    }
    serde_json::to_string_pretty(&d).expect("deployment serializes")
}

/// Flux for `ns` applying `web.yaml` (and `others`) at `interval`, the rollout done and the
/// pods' memory over the threshold as metrics-server reports it.
async fn flux_with_web(
    client: &Client,
    ns: &str,
    web: &str,
    others: &[(&str, &str)],
    interval: &str,
) -> Flux {
    let mut files = vec![("web.yaml", web)];
    files.extend_from_slice(others);
    let flux = Flux::start(client, ns, &files, interval)
        .await
        .unwrap_or_else(|e| panic!("Flux {FLUX_VERSION}: {e:#}"));
    web_ready(client, ns, || flux.logs()).await;
    flux
}

/// `web` rolled out, its two pods Ready and their memory over the policies' threshold as
/// metrics-server reports it (a new pod's first reading takes a scrape). `context` (e.g. Flux's
/// logs) goes with a rollout that never completes.
pub(crate) async fn web_ready(client: &Client, ns: &str, context: impl Fn() -> String) {
    wait_rollout_complete(client, Kind::Deployment, ns, APP, READY)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", context()));
    let ready = wait_pods_ready(client, ns, PODS, 2, READY).await.unwrap();
    for p in &ready {
        let name = p.metadata.name.as_deref().unwrap();
        wait_pod_memory(client, ns, name, READY, |m| {
            m.is_some_and(|m| m.bytes > 256 << 20)
        })
        .await
        .expect("memory over the threshold")
        .expect("metrics present");
    }
}

/// The Deployment's field managers: `manager/operation`, `*` marking those that own the pod
/// template's restartedAt.
pub(crate) async fn managers(client: &Client, ns: &str) -> Vec<String> {
    let d = deployment(client, ns, APP).await;
    let key = format!(
        "/f:spec/f:template/f:metadata/f:annotations/f:{}",
        RESTARTED_AT.replace('/', "~1")
    );
    d.metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|e| {
            let owns = e
                .fields_v1
                .as_ref()
                .and_then(|f| f.0.pointer(&key))
                .is_some();
            format!(
                "{}/{}{}",
                e.manager.as_deref().unwrap_or("?"),
                e.operation.as_deref().unwrap_or("?"),
                if owns { "*" } else { "" }
            )
        })
        .collect()
}

/// Managers that own the template's restartedAt (the `*` entries), names only.
pub(crate) fn owners_of_restarted_at(managers: &[String]) -> Vec<String> {
    managers
        .iter()
        .filter_map(|m| m.strip_suffix('*'))
        .map(|m| m.split('/').next().unwrap_or(m).to_string())
        .collect()
}

async fn replica_sets(client: &Client, ns: &str) -> usize {
    Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(PODS))
        .await
        .expect("list replicasets")
        .items
        .len()
}

pub(crate) fn generation(d: &Deployment) -> i64 {
    d.metadata.generation.unwrap_or_default()
}

/// A row skipped as `code` (restartPinned, revertedSince) that names `owner` in `restartOwner`.
pub(crate) fn assert_held_back(row: &serde_json::Value, code: &str, owner: &str) {
    assert_eq!(
        (row["decision"].as_str(), row["reasonCode"].as_str()),
        (Some("skip"), Some(code)),
        "{row:#}"
    );
    assert_eq!(row["restartOwner"], owner, "{row:#}");
}

/// `bouncer explain` of the Deployment: its `gitops` verdict, printed as the text form shows it.
async fn explained_gitops(policies: &Policies, ns: &str) -> serde_json::Value {
    let target = format!("deploy/{ns}/{APP}");
    let out = bouncer(&["explain", &target], policies, ns).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let gitops = out.report["gitops"].clone();
    eprintln!("flux {FLUX_VERSION}: explain {target}: gitops {gitops}");
    gitops
}

fn report(run: &Bounced, flux: &Flux) -> String {
    format!(
        "stderr: {}\nreport: {:#}\n{}",
        run.stderr,
        run.report,
        flux.logs()
    )
}

/// Flux applies the Deployment from Git; bouncer's restart is verified and stays: three
/// reconciles later the annotation holds bouncer's value, kustomize-controller never owned it,
/// and no second rollout happened. When Git later pins the key, the next run finds the late
/// revert (`revertedSince`) and does not patch again.
#[tokio::test]
async fn flux_keeps_bouncers_restart_through_reconciles() {
    let client = client().await;
    let ns = TestNs::new(&client, "flux-keep").await;
    let n = ns.name();
    // A long interval: only the reconciles the test requests happen.
    let mut flux = flux_with_web(&client, n, &manifest(&[]), &[], "1h").await;
    eprintln!(
        "flux {FLUX_VERSION}: managers after Flux's first apply: {:?}",
        managers(&client, n).await
    );
    let policies = Policies::new(&[("p.yaml", &policy("web", n, "{app: web}", MEMORY_POLICY))]);
    let gitops = explained_gitops(&policies, n).await;
    assert_eq!(gitops["controller"], "Flux");
    assert_eq!(
        gitops["source"],
        format!("{n}/app"),
        "from kustomize-controller's labels"
    );
    assert_eq!(gitops["restartHolds"], true);

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}", report(&run, &flux));
    assert_eq!(run.bounced(), [APP], "{}", report(&run, &flux));
    let row = run.row(APP);
    assert!(
        row["verification"]
            .as_str()
            .unwrap()
            .starts_with("restartedAt intact"),
        "{row:#}"
    );
    let ours = row["patchedAt"].as_str().unwrap().to_string();
    let bounced = deployment(&client, n, APP).await;
    let uids = pod_uids(&client, n, PODS).await;
    let sets = replica_sets(&client, n).await;
    let mut seen = managers(&client, n).await;
    assert_eq!(owners_of_restarted_at(&seen), ["bouncer"], "{seen:?}");

    for i in 1..=3 {
        let done = flux
            .reconcile(&client)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let after = managers(&client, n).await;
        eprintln!(
            "flux {FLUX_VERSION}: reconcile {i} of a bounced Deployment took {} ms (revision {}); managers {seen:?} -> {after:?}",
            done.took.as_millis(),
            done.revision
        );
        assert_eq!(
            restarted_at_of(&client, n, APP).await.as_deref(),
            Some(ours.as_str()),
            "reconcile {i} kept bouncer's restart"
        );
        assert_eq!(owners_of_restarted_at(&after), ["bouncer"], "{after:?}");
        seen = after;
    }
    let now = deployment(&client, n, APP).await;
    assert_eq!(generation(&now), generation(&bounced), "no second rollout");
    assert_eq!(replica_sets(&client, n).await, sets, "no new ReplicaSet");
    assert_eq!(
        pod_uids(&client, n, PODS).await,
        uids,
        "the bounced pods stay"
    );
    assert!(
        bouncer_events(&client, n, APP, "BounceReverted")
            .await
            .is_empty()
    );
    assert!(flux.is_running(), "Flux survived");

    // A revert after the run: Git starts pinning the key and Flux applies it, long after
    // bouncer verified. The next run finds Git's value where its own was, names the owner, and
    // writes nothing.
    flux.push(
        &client,
        &[("web.yaml", &manifest(&[(RESTARTED_AT, PINNED)]))],
        "pin restartedAt",
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    web_ready(&client, n, || flux.logs()).await;
    assert_eq!(
        restarted_at_of(&client, n, APP).await.as_deref(),
        Some(PINNED)
    );
    let reverted = generation(&deployment(&client, n, APP).await);
    let mark = audit_mark();
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}", report(&run, &flux));
    let row = run.row(APP);
    eprintln!(
        "flux {FLUX_VERSION}: reverted after the run, next run: {}",
        row["reason"]
    );
    assert_held_back(row, "revertedSince", FLUX_MANAGER);
    assert!(row["reason"].as_str().unwrap().contains(&ours), "{row:#}");
    assert_eq!(
        patches_of(mark, n),
        Vec::<String>::new(),
        "not patched again"
    );
    assert_eq!(generation(&deployment(&client, n, APP).await), reverted);
    let events = bouncer_events(&client, n, APP, "BounceReverted").await;
    assert_eq!(events.len(), 1, "one BounceReverted Event: {events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
}

/// `kubectl rollout restart` writes the same annotation as field manager `kubectl-rollout`,
/// which kustomize-controller takes over (it matches `kubectl` by prefix): one reconcile undoes
/// it, and the pods roll back to the template Git holds.
#[tokio::test]
async fn flux_undoes_kubectl_rollout_restart() {
    let client = client().await;
    let ns = TestNs::new(&client, "flux-kubectl").await;
    let n = ns.name();
    let flux = flux_with_web(&client, n, &manifest(&[]), &[], "1h").await;
    rollout_restart(n, APP);
    wait_rollout_complete(&client, Kind::Deployment, n, APP, READY)
        .await
        .unwrap();
    let before = managers(&client, n).await;
    assert_eq!(
        owners_of_restarted_at(&before),
        ["kubectl-rollout"],
        "{before:?}"
    );
    assert!(restarted_at_of(&client, n, APP).await.is_some());

    let done = flux
        .reconcile(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let after = managers(&client, n).await;
    eprintln!(
        "flux {FLUX_VERSION}: reconcile after kubectl rollout restart took {} ms; managers {before:?} -> {after:?}",
        done.took.as_millis()
    );
    assert_eq!(
        restarted_at_of(&client, n, APP).await,
        None,
        "Flux removed kubectl's restart"
    );
    assert!(
        !after.iter().any(|m| m.starts_with("kubectl")),
        "kustomize-controller took over kubectl's entries: {after:?}"
    );
    assert!(owners_of_restarted_at(&after).is_empty(), "{after:?}");
}

/// Git pins restartedAt, and Flux reconciles at its usual pace (none during the run). bouncer
/// reads kustomize-controller's Apply ownership before writing: the restart is never written;
/// `onRevert: evict` evicts the two pods instead, one at a time. Flux's next reconcile then has
/// nothing to undo: the template and its generation stay, and no pod rolls a second time.
#[tokio::test]
async fn a_restart_git_pins_is_never_written_and_bouncer_evicts_instead() {
    let client = client().await;
    let ns = TestNs::new(&client, "flux-pin-evict").await;
    let n = ns.name();
    let flux = flux_with_web(&client, n, &manifest(&[(RESTARTED_AT, PINNED)]), &[], "1h").await;
    let before = managers(&client, n).await;
    assert_eq!(
        owners_of_restarted_at(&before),
        [FLUX_MANAGER],
        "{before:?}"
    );
    let old = pod_uids(&client, n, PODS).await;
    let before_pods: Vec<String> = pods(&client, n, PODS)
        .await
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let sets = replica_sets(&client, n).await;
    let extra = format!("{MEMORY_POLICY}  restart: {{onRevert: evict}}\n");
    let policies = Policies::new(&[("p.yaml", &policy("web", n, "{app: web}", &extra))]);
    let gitops = explained_gitops(&policies, n).await;
    assert_eq!(
        gitops["restartHolds"], false,
        "Git pins the annotation: {gitops}"
    );
    let planned = bouncer(&["plan"], &policies, n).await;
    let row = planned.row(APP);
    assert_eq!(row["method"], "evict", "{row:#}");
    assert_eq!(row["restartOwner"], FLUX_MANAGER, "{row:#}");

    let mark = audit_mark();
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}", report(&run, &flux));
    assert_eq!(
        run.queue(),
        [(APP.to_string(), "bounced".to_string())],
        "{}",
        report(&run, &flux)
    );
    let row = run.row(APP);
    eprintln!(
        "flux {FLUX_VERSION}: Git pins restartedAt, onRevert evict: {}s: {}",
        row["durationSeconds"], row["reason"]
    );
    assert_eq!(row["method"], "evict", "{row:#}");
    assert_eq!(row["restartOwner"], FLUX_MANAGER, "{row:#}");
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason.contains("pods evicted instead of a restart") && reason.contains(FLUX_MANAGER),
        "{row:#}"
    );
    // The mark bouncer writes on the Deployment's metadata moves its generation (annotations
    // are copied to ReplicaSets); a template write would also make a new ReplicaSet.
    assert_eq!(replica_sets(&client, n).await, sets, "no template write");
    let marked = generation(&deployment(&client, n, APP).await);
    let evicted = evictions(mark, n);
    eprintln!("flux {FLUX_VERSION}: Git pins restartedAt, evictions: {evicted:?}");
    assert_eq!(evicted.len(), 2, "{evicted:?}");
    assert!(
        evicted.iter().all(|(pod, _)| before_pods.contains(pod)),
        "only pods from before the bounce were evicted: {evicted:?} of {before_pods:?}"
    );
    let now = wait_pods_ready(&client, n, PODS, 2, READY).await.unwrap();
    assert_one_at_a_time(&evicted, &now);
    let new = pod_uids(&client, n, PODS).await;
    assert!(new.iter().all(|u| !old.contains(u)), "every pod replaced");
    assert_eq!(
        restarted_at_of(&client, n, APP).await.as_deref(),
        Some(PINNED),
        "Git's value stands"
    );
    assert_eq!(
        owners_of_restarted_at(&managers(&client, n).await),
        [FLUX_MANAGER]
    );

    let done = flux
        .reconcile(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!(
        "flux {FLUX_VERSION}: reconcile after the evictions took {} ms",
        done.took.as_millis()
    );
    assert_eq!(
        generation(&deployment(&client, n, APP).await),
        marked,
        "Flux had nothing to undo"
    );
    assert_eq!(replica_sets(&client, n).await, sets, "no new ReplicaSet");
    assert_eq!(pod_uids(&client, n, PODS).await, new, "no pod rolled twice");
}

/// The same pin with `onRevert: fail`: `plan` and `run` skip the Deployment as `restartPinned`,
/// naming kustomize-controller and the Kustomization, with a Warning Event; nothing is written
/// or evicted. Once Git stops pinning the key, restarts resume and hold.
#[tokio::test]
async fn a_restart_git_pins_is_skipped_until_git_lets_go() {
    let client = client().await;
    let ns = TestNs::new(&client, "flux-pin-fail").await;
    let n = ns.name();
    let flux = flux_with_web(&client, n, &manifest(&[(RESTARTED_AT, PINNED)]), &[], "1h").await;
    let applied = generation(&deployment(&client, n, APP).await);
    let uids = pod_uids(&client, n, PODS).await;
    let extra = format!("{MEMORY_POLICY}  restart: {{onRevert: fail}}\n");
    let policies = Policies::new(&[("p.yaml", &policy("web", n, "{app: web}", &extra))]);
    let kustomization = format!("{n}/app");

    let mark = audit_mark();
    for command in ["plan", "run"] {
        let out = bouncer(&[command], &policies, n).await;
        assert_eq!(out.code, 0, "{command}: {}", report(&out, &flux));
        let row = out.row(APP);
        eprintln!(
            "flux {FLUX_VERSION}: Git pins restartedAt, {command}: {}",
            row["reason"]
        );
        assert_held_back(row, "restartPinned", FLUX_MANAGER);
        assert!(
            row["reason"].as_str().unwrap().contains(&kustomization),
            "{command}: {row:#}"
        );
    }
    assert_eq!(patches_of(mark, n), Vec::<String>::new(), "no write at all");
    assert!(evictions(mark, n).is_empty(), "nothing evicted");
    assert_eq!(generation(&deployment(&client, n, APP).await), applied);
    assert_eq!(pod_uids(&client, n, PODS).await, uids);
    let events = bouncer_events(&client, n, APP, "BounceRestartPinned").await;
    assert_eq!(events.len(), 1, "one BounceRestartPinned Event: {events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(
        events[0].note.as_deref().unwrap().contains(FLUX_MANAGER),
        "{:?}",
        events[0].note
    );

    // Git drops the key: kustomize-controller removes it with its ownership, the pods roll to
    // Git's template, and bouncer's next restart is an ordinary one.
    flux.push(
        &client,
        &[("web.yaml", &manifest(&[]))],
        "stop pinning restartedAt",
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    web_ready(&client, n, || flux.logs()).await;
    let released = managers(&client, n).await;
    assert!(owners_of_restarted_at(&released).is_empty(), "{released:?}");
    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}", report(&run, &flux));
    assert_eq!(run.bounced(), [APP], "{}", report(&run, &flux));
    let row = run.row(APP);
    assert_eq!(row["method"], "rollout", "{row:#}");
    assert!(
        row["verification"]
            .as_str()
            .unwrap()
            .starts_with("restartedAt intact"),
        "{row:#}"
    );
    let ours = row["patchedAt"].as_str().unwrap().to_string();
    flux.reconcile(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        restarted_at_of(&client, n, APP).await.as_deref(),
        Some(ours.as_str()),
        "the resumed restart holds through a reconcile"
    );
}

/// A suspended Kustomization changes nothing in the bounce; Git meanwhile drops another
/// Deployment, which Flux prunes once resumed, while bouncer's restart of `web` stays and no
/// second rollout happens.
#[tokio::test]
async fn flux_suspended_or_pruning_changes_nothing_for_bouncer() {
    let client = client().await;
    let ns = TestNs::new(&client, "flux-suspend").await;
    let n = ns.name();
    let old =
        serde_json::to_string_pretty(&bouncer_testkit::deployment("old", 1, &[("app", "old")]))
            .unwrap();
    let flux = flux_with_web(&client, n, &manifest(&[]), &[("old.yaml", &old)], "1h").await;
    flux.suspend(&client, true).await.unwrap();
    let policies = Policies::new(&[("p.yaml", &policy("web", n, "{app: web}", MEMORY_POLICY))]);

    let run = bouncer(&["run"], &policies, n).await;
    assert_eq!(run.code, 0, "{}", report(&run, &flux));
    assert_eq!(run.bounced(), [APP], "{}", report(&run, &flux));
    let ours = run.row(APP)["patchedAt"].as_str().unwrap().to_string();
    let bounced = deployment(&client, n, APP).await;
    let uids = pod_uids(&client, n, PODS).await;

    flux.suspend(&client, false).await.unwrap();
    let before = managers(&client, n).await;
    let done = flux
        .push(&client, &[("old.yaml", "")], "drop old")
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let after = managers(&client, n).await;
    eprintln!(
        "flux {FLUX_VERSION}: resumed and pruning reconcile took {} ms; managers {before:?} -> {after:?}",
        done.took.as_millis()
    );
    // The prune deletes the Deployment; the garbage collector then takes its ReplicaSet and
    // pods away, a moment later.
    let terminating = tokio::time::timeout(Duration::from_secs(60), async {
        while !pods(&client, n, "app=old")
            .await
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_some())
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    assert!(terminating.is_ok(), "the pruned Deployment's pods live on");
    let gone = Api::<Deployment>::namespaced(client.clone(), n)
        .get_opt("old")
        .await
        .unwrap();
    assert!(gone.is_none(), "Flux pruned old");
    assert_eq!(
        restarted_at_of(&client, n, APP).await.as_deref(),
        Some(ours.as_str())
    );
    assert_eq!(
        generation(&deployment(&client, n, APP).await),
        generation(&bounced)
    );
    assert_eq!(pod_uids(&client, n, PODS).await, uids, "no second rollout");
}
