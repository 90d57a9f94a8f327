//! Table-driven tests of the planner on plain data.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::*;
use crate::core::model::{
    ContainerSample, Deleting, MetricsState, Pdb, PodSample, RolloutStatus, Unsupported,
    UpdateStrategy,
};
use crate::core::policy::{MemoryTrigger, Restart, RestartMethod, Selector, Threshold};
use crate::core::schedule::Schedule;

pub(crate) const MI: u64 = 1 << 20;

pub(crate) fn t(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(crate) fn policy(name: &str, app: &str) -> Policy {
    Policy {
        name: name.into(),
        source: "test.yaml".into(),
        namespaces: vec![],
        selector: Selector {
            match_labels: labels(&[("app", app)]),
            match_expressions: vec![],
        },
        kinds: Kind::ALL.to_vec(),
        group_by: None,
        schedule: None,
        memory: None,
        windows: vec![],
        cooldown: Duration::from_secs(3600),
        max_per_run: None,
        allow_downtime: false,
        dry_run: false,
        suspend: false,
        restart: Restart {
            method: RestartMethod::Auto,
            timeout: None,
            on_revert: OnRevert::Fail,
        },
        block_when: None,
        overrides: Default::default(),
        breaker: None,
    }
}

pub(crate) fn nightly(mut p: Policy) -> Policy {
    p.schedule =
        Some(Schedule::new("0 3 * * *", chrono_tz::UTC, Duration::from_secs(7200)).unwrap());
    p
}

pub(crate) fn over(mut p: Policy, mib: u64) -> Policy {
    p.memory = Some(MemoryTrigger {
        threshold: Some(Threshold::Bytes(mib * MI)),
        container: None,
        history: Default::default(),
    });
    p
}

pub(crate) fn pod(name: &str, app: &str, started: &str, usage_mib: Option<u64>) -> PodSample {
    PodSample {
        name: name.into(),
        uid: format!("uid-{name}").into(),
        labels: labels(&[("app", app)]).into(),
        started: Some(t(started)),
        ready: true,
        deleting: false,
        containers: vec![ContainerSample {
            name: "main".into(),
            usage: usage_mib.map(|m| m * MI),
            limit: Some(1024 * MI),
        }],
        limit: None,
        has_metrics: usage_mib.is_some(),
    }
}

pub(crate) fn deployment(ns: &str, name: &str, app: &str, pods: Vec<PodSample>) -> Workload {
    let n = pods.len() as i32;
    Workload {
        target: WorkloadRef {
            kind: Kind::Deployment,
            namespace: ns.into(),
            name: name.into(),
        },
        uid: None,
        template_labels: labels(&[("app", app)]).into(),
        pod_selector: format!("app={app}"),
        pod_owners: Vec::new(),
        annotations: BTreeMap::new(),
        attempt: Default::default(),
        restarted_at: None,
        template_spec: None,
        restart_owners: None,
        paused: false,
        strategy: UpdateStrategy::RollingUpdate,
        status: RolloutStatus {
            generation: 1,
            observed_generation: 1,
            desired: n,
            current: n,
            updated: n,
            ready: n,
            available: n,
            ..Default::default()
        },
        rolling: Default::default(),
        pods,
        mirror: false,
        deleting: None,
        toolhive: Default::default(),
    }
}

pub(crate) fn inventory(workloads: Vec<Workload>) -> Inventory {
    Inventory {
        workloads,
        unsupported: vec![],
        excluded_namespaces: BTreeSet::new(),
        pdbs: vec![],
        metrics: MetricsState::Available,
    }
}

pub(crate) const NOW: &str = "2026-03-10T03:30:00Z";
pub(crate) const OLD: &str = "2026-03-09T10:00:00Z";

pub(crate) fn run(policies: &[Policy], inv: &Inventory) -> Plan {
    plan(policies, inv, t(NOW), &Limits::max_bounces(10))
}

pub(crate) fn names(p: &Plan) -> Vec<String> {
    p.bounces.iter().map(|b| b.target.name.clone()).collect()
}

pub(crate) fn reason_of<'a>(p: &'a Plan, name: &str) -> &'a SkipReason {
    &p.skips
        .iter()
        .find(|s| s.target.name == name)
        .unwrap_or_else(|| panic!("{name} not skipped: {p:#?}"))
        .reason
}

#[test]
fn nightly_bounces_every_due_workload_and_reports_the_rest() {
    let inv = inventory(vec![
        deployment("a", "web", "web", vec![pod("web-1", "web", OLD, Some(100))]),
        deployment(
            "a",
            "fresh",
            "web",
            vec![pod("fresh-1", "web", "2026-03-10T03:10:00Z", Some(100))],
        ),
        deployment(
            "a",
            "other",
            "other",
            vec![pod("other-1", "other", OLD, None)],
        ),
    ]);
    let p = run(&[nightly(policy("n", "web"))], &inv);
    assert_eq!(names(&p), vec!["web"]);
    assert!(matches!(p.bounces[0].triggers[0], Trigger::Schedule { .. }));
    // Started after the 03:00 fire: a re-run or a fresh deploy is never bounced again.
    assert!(matches!(reason_of(&p, "fresh"), SkipReason::NotDue(_)));
    // Not selected at all: not in the plan.
    assert!(p.skips.iter().all(|s| s.target.name != "other"));
}

#[test]
fn memory_bounces_only_workloads_over_the_threshold_most_urgent_first() {
    let inv = inventory(vec![
        deployment("a", "small", "x", vec![pod("s-1", "x", OLD, Some(300))]),
        deployment(
            "a",
            "big",
            "x",
            vec![
                pod("b-1", "x", OLD, Some(900)),
                pod("b-2", "x", OLD, Some(100)),
            ],
        ),
        deployment("a", "mid", "x", vec![pod("m-1", "x", OLD, Some(600))]),
        deployment("a", "blind", "x", vec![pod("n-1", "x", OLD, None)]),
    ]);
    let p = run(&[over(policy("m", "x"), 512)], &inv);
    assert_eq!(names(&p), vec!["big", "mid"]);
    assert_eq!(p.bounces[0].memory.as_ref().unwrap().pod, "b-1");
    assert!(
        matches!(reason_of(&p, "small"), SkipReason::NotDue(n) if matches!(n.memory, Some(MemoryState::Below { .. })))
    );
    // Missing metrics never mean "bounce".
    assert!(
        matches!(reason_of(&p, "blind"), SkipReason::NotDue(n) if n.memory == Some(MemoryState::NoMetrics))
    );
}

#[test]
fn percent_of_limit_and_named_container() {
    let mut p = policy("m", "x");
    p.memory = Some(MemoryTrigger {
        threshold: Some(Threshold::PercentOfLimit(80.0)),
        container: Some("main".into()),
        history: Default::default(),
    });
    let mut hot = pod("hot-1", "x", OLD, Some(900));
    hot.containers.push(ContainerSample {
        name: "sidecar".into(),
        usage: Some(10 * MI),
        limit: None,
    });
    let mut nolimit = pod("nl-1", "x", OLD, Some(900));
    nolimit.containers[0].limit = None;
    let inv = inventory(vec![
        deployment("a", "hot", "x", vec![hot]),
        deployment("a", "cool", "x", vec![pod("c-1", "x", OLD, Some(700))]),
        deployment("a", "nolimit", "x", vec![nolimit]),
    ]);
    let plan = run(&[p], &inv);
    assert_eq!(names(&plan), vec!["hot"]);
    assert!(
        matches!(reason_of(&plan, "nolimit"), SkipReason::NotDue(n) if n.memory == Some(MemoryState::NoLimit))
    );
}

#[test]
fn pod_level_limit_and_sidecar_limits_set_percent_of_limit() {
    let mut p = policy("m", "x");
    p.memory = Some(MemoryTrigger {
        threshold: Some(Threshold::PercentOfLimit(85.0)),
        container: None,
        history: Default::default(),
    });
    // 900Mi of a 1Gi container: over 85% alone, under 85% with a 1Gi native sidecar beside it.
    let mut with_sidecar = pod("s-1", "x", OLD, Some(900));
    with_sidecar.containers.push(ContainerSample {
        name: "proxy".into(),
        usage: Some(10 * MI),
        limit: Some(1024 * MI),
    });
    // No container limit, a pod-level 1Gi one: the pod's limit, not "no memory limit".
    let mut pod_level = pod("pl-1", "x", OLD, Some(900));
    pod_level.containers[0].limit = None;
    pod_level.limit = Some(1024 * MI);
    let inv = inventory(vec![
        deployment("a", "sidecar", "x", vec![with_sidecar]),
        deployment("a", "podlevel", "x", vec![pod_level]),
    ]);
    let plan = run(&[p], &inv);
    assert_eq!(names(&plan), vec!["podlevel"]);
    assert!(matches!(
        reason_of(&plan, "sidecar"),
        SkipReason::NotDue(n) if matches!(n.memory, Some(MemoryState::Below { threshold, .. }) if threshold == 2048 * MI * 85 / 100)
    ));
}

#[test]
fn a_named_sidecar_without_numbers_never_triggers() {
    let mut p = over(policy("m", "x"), 1);
    p.memory.as_mut().unwrap().container = Some("proxy".into());
    let mut hot = pod("h-1", "x", OLD, Some(900));
    hot.containers.push(ContainerSample {
        name: "proxy".into(),
        usage: None,
        limit: None,
    });
    let plan = run(
        &[p],
        &inventory(vec![deployment("a", "hot", "x", vec![hot])]),
    );
    assert!(names(&plan).is_empty());
    assert!(
        matches!(reason_of(&plan, "hot"), SkipReason::NotDue(n) if n.memory == Some(MemoryState::NoMetrics))
    );
}

#[test]
fn metrics_unavailable_turns_memory_off_but_not_schedules() {
    let mut inv = inventory(vec![
        deployment("a", "leaky", "x", vec![pod("l-1", "x", OLD, None)]),
        deployment("a", "nightly", "y", vec![pod("n-1", "y", OLD, None)]),
    ]);
    inv.metrics = MetricsState::Unavailable("metrics.k8s.io is not served".into());
    let p = run(
        &[over(policy("m", "x"), 100), nightly(policy("n", "y"))],
        &inv,
    );
    assert_eq!(names(&p), vec!["nightly"]);
    assert!(
        matches!(reason_of(&p, "leaky"), SkipReason::NotDue(n) if matches!(n.memory, Some(MemoryState::Unavailable(_))))
    );
}

#[test]
fn cooldown_counts_from_restarted_at_or_the_oldest_pod() {
    let mut recent = deployment("a", "recent", "x", vec![pod("r-1", "x", OLD, Some(900))]);
    recent.restarted_at = Some(t("2026-03-10T03:00:00Z"));
    let young = deployment(
        "a",
        "young",
        "x",
        vec![pod("y-1", "x", "2026-03-10T03:20:00Z", Some(900))],
    );
    let inv = inventory(vec![
        recent,
        young,
        deployment("a", "due", "x", vec![pod("d-1", "x", OLD, Some(900))]),
    ]);
    let p = run(&[over(policy("m", "x"), 512)], &inv);
    assert_eq!(names(&p), vec!["due"]);
    assert!(matches!(
        reason_of(&p, "recent"),
        SkipReason::Cooldown { .. }
    ));
    assert!(matches!(
        reason_of(&p, "young"),
        SkipReason::Cooldown { .. }
    ));
}

#[test]
fn preflight_gates_skip_with_reasons() {
    let mk = |name: &str| {
        deployment(
            "a",
            name,
            "x",
            vec![pod(&format!("{name}-1"), "x", OLD, Some(900))],
        )
    };
    let mut paused = mk("paused");
    paused.paused = true;
    let mut rolling = mk("rolling");
    rolling.status.generation = 2;
    // The controller's status says available, but the pod itself is not ready (a fresher fact).
    let mut unavailable = mk("unavailable");
    unavailable.pods[0].ready = false;
    let mut single = mk("single");
    single.rolling.max_unavailable = Some(crate::core::model::IntOrPercent::Int(1));
    let mut excluded = mk("excluded");
    excluded
        .annotations
        .insert("bouncer.dev/exclude".into(), "true".into());
    let mut sts = mk("ondelete");
    sts.target.kind = Kind::StatefulSet;
    sts.strategy = UpdateStrategy::OnDelete;
    let mut excluded_ns = mk("inexcluded");
    excluded_ns.target.namespace = "quiet".into();
    let mut deleted = mk("deleted");
    deleted.deleting = Some(Deleting::Workload);
    let mut in_deleted_ns = mk("indeleted");
    in_deleted_ns.deleting = Some(Deleting::Namespace);
    let mut inv = inventory(vec![
        paused,
        rolling,
        unavailable,
        single,
        excluded,
        sts,
        excluded_ns,
        deleted,
        in_deleted_ns,
    ]);
    inv.excluded_namespaces.insert("quiet".into());
    let mut p = over(policy("m", "x"), 512);
    p.restart.method = RestartMethod::Rollout;
    let plan = run(&[p], &inv);
    assert!(plan.bounces.is_empty(), "{:?}", names(&plan));
    type Check = fn(&SkipReason) -> bool;
    let cases: [(&str, Check); 9] = [
        ("paused", |r| *r == SkipReason::Paused),
        ("rolling", |r| {
            matches!(r, SkipReason::RolloutInProgress { .. })
        }),
        ("unavailable", |r| {
            matches!(r, SkipReason::NotAvailable { .. })
        }),
        ("single", |r| *r == SkipReason::Downtime),
        ("excluded", |r| matches!(r, SkipReason::Excluded { .. })),
        ("ondelete", |r| *r == SkipReason::OnDelete),
        ("inexcluded", |r| *r == SkipReason::NamespaceExcluded),
        ("deleted", |r| {
            *r == SkipReason::BeingDeleted(Deleting::Workload)
        }),
        ("indeleted", |r| {
            *r == SkipReason::BeingDeleted(Deleting::Namespace)
        }),
    ];
    for (name, ok) in cases {
        assert!(
            ok(reason_of(&plan, name)),
            "{name}: {}",
            reason_of(&plan, name)
        );
    }
}

#[test]
fn bare_pods_and_ondelete_use_eviction_and_respect_pdbs() {
    let mut bare = deployment("a", "mcp-1", "x", vec![pod("mcp-1", "x", OLD, Some(900))]);
    bare.target.kind = Kind::Pod;
    let mut sts = deployment(
        "a",
        "db",
        "x",
        vec![
            pod("db-0", "x", OLD, Some(900)),
            pod("db-1", "x", OLD, Some(900)),
        ],
    );
    sts.target.kind = Kind::StatefulSet;
    sts.strategy = UpdateStrategy::OnDelete;
    let inv = inventory(vec![bare.clone(), sts.clone()]);
    let plan = run(&[over(policy("m", "x"), 512)], &inv);
    // A bare pod has no second replica: downtime unless allowed.
    assert_eq!(names(&plan), vec!["db"]);
    assert_eq!(plan.bounces[0].method, Method::Evict);
    assert_eq!(*reason_of(&plan, "mcp-1"), SkipReason::Downtime);

    let mut p = over(policy("m", "x"), 512);
    p.allow_downtime = true;
    let mut inv = inventory(vec![bare, sts]);
    inv.pdbs.push(Pdb {
        namespace: "a".into(),
        name: "db-pdb".into(),
        selector: Selector {
            match_labels: labels(&[("app", "x")]),
            match_expressions: vec![],
        },
        disruptions_allowed: 0,
    });
    let plan = run(&[p], &inv);
    assert!(plan.bounces.is_empty());
    assert_eq!(
        *reason_of(&plan, "db"),
        SkipReason::PdbBlocks {
            name: "db-pdb".into()
        }
    );
}

/// `n` Deployments w1..wN in namespace a, each one old pod over 500 MiB (wN the most).
pub(crate) fn leaky(n: u64) -> Inventory {
    inventory(
        (1..=n)
            .map(|i| {
                deployment(
                    "a",
                    &format!("w{i}"),
                    "x",
                    vec![pod(&format!("p{i}"), "x", OLD, Some(500 + i))],
                )
            })
            .collect(),
    )
}

#[test]
fn caps_and_one_bounce_per_workload_across_policies() {
    let inv = leaky(5);
    let mut capped = over(policy("a-capped", "x"), 100);
    capped.max_per_run = Some(2);
    let other = over(policy("b-other", "x"), 100);
    let p = plan(&[capped, other], &inv, t(NOW), &Limits::max_bounces(3));
    // Most urgent first: w5 has the highest usage.
    assert_eq!(names(&p), vec!["w5", "w4", "w3"]);
    assert_eq!(
        p.bounces.iter().filter(|b| b.policy == "a-capped").count(),
        2
    );
    let all_skips: Vec<_> = p
        .skips
        .iter()
        .map(|s| (s.target.name.as_str(), s.reason.code()))
        .collect();
    assert!(all_skips.contains(&("w3", "policyCap")), "{all_skips:?}");
    assert!(all_skips.contains(&("w5", "claimed")), "{all_skips:?}");
    assert!(all_skips.contains(&("w2", "globalCap")), "{all_skips:?}");
    // Every selected (policy, workload) pair appears exactly once.
    assert_eq!(p.bounces.len() + p.skips.len(), 10);
}

#[test]
fn unsupported_owners_and_unlisted_kinds_are_reported() {
    let mut inv = inventory(vec![deployment(
        "a",
        "web",
        "x",
        vec![pod("w-1", "x", OLD, Some(900))],
    )]);
    inv.unsupported.push(Unsupported {
        namespace: "a".into(),
        pod: "job-abc".into(),
        owner_kind: "Job".into(),
        owner_name: "nightly-job".into(),
        labels: labels(&[("app", "x")]),
    });
    let mut p = over(policy("m", "x"), 512);
    p.kinds = vec![Kind::StatefulSet];
    let plan = run(&[p], &inv);
    assert!(plan.bounces.is_empty());
    assert_eq!(
        *reason_of(&plan, "web"),
        SkipReason::KindNotSelected {
            kind: Kind::Deployment
        }
    );
    assert_eq!(
        *reason_of(&plan, "job-abc"),
        SkipReason::UnsupportedOwner {
            kind: "Job".into(),
            name: "nightly-job".into()
        }
    );
}

/// An OnDelete StatefulSet of `n` pods (all at the current template unless changed).
pub(crate) fn statefulset(name: &str, n: usize, strategy: UpdateStrategy) -> Workload {
    let pods = (0..n)
        .map(|i| pod(&format!("{name}-{i}"), "x", OLD, Some(900)))
        .collect();
    let mut s = deployment("a", name, "x", pods);
    s.target.kind = Kind::StatefulSet;
    s.strategy = strategy;
    s
}

/// Safety case 2: a policy that does not list `Pod` never evicts a bare pod, even with
/// `allowDowntime: true` (nothing may recreate it).
#[test]
fn case2_bare_pods_only_when_listed() {
    let text = "apiVersion: bouncer.dev/v1alpha1\nkind: BouncePolicy\nmetadata: {name: web}\nspec:\n  target: {selector: {matchLabels: {app: x}}}\n  triggers: {memory: {above: 512Mi}}\n  allowDowntime: true\n";
    let parsed = crate::core::policy::parse_str("p.yaml", text).unwrap();
    let mut orphan = deployment("a", "orphan", "x", vec![pod("orphan", "x", OLD, Some(900))]);
    orphan.target.kind = Kind::Pod;
    let plan = run(&parsed, &inventory(vec![orphan.clone()]));
    assert!(plan.bounces.is_empty(), "{:?}", names(&plan));
    assert_eq!(reason_of(&plan, "orphan").code(), "kindNotSelected");
    let mut listed = parsed[0].clone();
    listed.kinds.push(Kind::Pod);
    assert_eq!(names(&run(&[listed], &inventory(vec![orphan]))), ["orphan"]);
}

/// Safety case 3: eviction never rolls out a template change nobody has rolled out yet.
#[test]
fn case3_pending_template_is_not_rolled_out_by_eviction() {
    let mut sts = statefulset("db", 3, UpdateStrategy::OnDelete);
    sts.status.updated = 1;
    let mut ds = statefulset("agent", 2, UpdateStrategy::OnDelete);
    ds.target.kind = Kind::DaemonSet;
    ds.status.updated = 0;
    let current = statefulset("ok", 2, UpdateStrategy::OnDelete);
    let plan = run(
        &[over(policy("m", "x"), 512)],
        &inventory(vec![sts, ds, current]),
    );
    assert_eq!(names(&plan), ["ok"]);
    for name in ["db", "agent"] {
        let reason = reason_of(&plan, name);
        assert_eq!(reason.code(), "pendingTemplate", "{name}: {reason}");
        assert!(reason.to_string().contains("current template"), "{reason}");
    }
}

/// Safety case 4 (planning): a partitioned StatefulSet is skipped with a reason, never
/// patched (the patch would roll only ordinals >= partition and leave the rest old forever).
#[test]
fn case4_partition_is_skipped_with_a_reason() {
    // As served (see the cluster edge's conversion test): fully rolled out, partition 2.
    let mut part = statefulset("db", 3, UpdateStrategy::RollingUpdate);
    part.status.rolling_update = crate::core::model::StsRollingUpdate::Set { partition: Some(2) };
    part.status.current_revision = Some("r1".into());
    part.status.update_revision = Some("r1".into());
    let plan = run(&[over(policy("m", "x"), 512)], &inventory(vec![part]));
    assert!(plan.bounces.is_empty(), "{:?}", names(&plan));
    let reason = reason_of(&plan, "db");
    assert_eq!(reason.code(), "partitioned", "{reason}");
    assert!(reason.to_string().contains("partition 2"), "{reason}");
}

/// Safety case 1 (planning): bouncer's attempt mark on the workload's metadata is honoured by
/// the cooldown and by the schedule (one attempt per fire), whatever its method and outcome.
#[test]
fn case1_attempt_mark_is_honoured_by_cooldown_and_schedule() {
    // An OnDelete StatefulSet of two pods carrying the mark as its metadata annotation.
    let served = |mark: &str| {
        let mut w = statefulset("db", 2, UpdateStrategy::OnDelete);
        let annotations = labels(&[("bouncer.dev/last-attempt", mark)]);
        w.attempt = crate::core::mark::AttemptMark::from_annotations(&annotations);
        w.annotations = annotations;
        w.pods = vec![pod("db-0", "x", OLD, None), pod("db-1", "x", OLD, None)];
        w
    };
    let mark = |time: &str| {
        format!(r#"{{"time":"{time}","policy":"n","method":"evict","outcome":"failed"}}"#)
    };
    let mut p = nightly(policy("n", "x"));
    p.cooldown = Duration::from_secs(60);
    // Failed eviction at 03:05 for the 03:00 fire; cooldown passed, pods still old: not again.
    let plan = run(
        &[p.clone()],
        &inventory(vec![served(&mark("2026-03-10T03:05:00Z"))]),
    );
    assert!(plan.bounces.is_empty(), "{:?}", names(&plan));
    let reason = reason_of(&plan, "db").to_string();
    assert!(reason.contains("already attempted"), "{reason}");
    // Within the cooldown of the mark (whatever triggers): cooldown.
    let mut memory = over(policy("m", "x"), 1);
    memory.cooldown = Duration::from_secs(3600);
    let mut hot = served(&mark("2026-03-10T03:10:00Z"));
    hot.pods = vec![
        pod("db-0", "x", OLD, Some(900)),
        pod("db-1", "x", OLD, Some(900)),
    ];
    let plan = run(&[memory], &inventory(vec![hot]));
    assert_eq!(reason_of(&plan, "db").code(), "cooldown");
    // A mark from before the fire does not hold it back; an unreadable one is a skip.
    assert_eq!(
        names(&run(
            &[p.clone()],
            &inventory(vec![served(&mark("2026-03-09T03:05:00Z"))])
        )),
        ["db"]
    );
    let bad = run(&[p], &inventory(vec![served("yesterday")]));
    assert_eq!(reason_of(&bad, "db").code(), "badAttemptMark");
}

/// Fault 1 at `request`: a run killed right after asking ToolHive's operator for a restart of
/// `a` (its MCPServer's restarted-at) left a request the operator may act on at any moment.
/// Within the bounce's timeout it holds every other bounce back (`bounceInFlight`), although
/// `a`'s Deployment has not moved; once the operator has acted (the template's restarted-at
/// as late as the attempt) it is judged by its rollout, as any. Past the timeout, unanswered,
/// it is left: `a` is skipped `requestLeft` and the plan lists it for the run to withdraw,
/// and `b` goes on.
#[test]
fn a_toolhive_request_an_earlier_run_left_holds_the_queue_then_is_withdrawn() {
    use crate::core::mark::{Attempt, AttemptHistory, AttemptMark};
    use crate::core::model::{McpServerRef, ToolhiveRestart};
    let p = over(policy("mem", "web"), 100);
    let b = deployment("shop", "b", "web", vec![pod("b-1", "web", OLD, Some(900))]);
    let a = |asked: &str, acted: Option<&str>| {
        let mut a = deployment("shop", "a", "web", vec![pod("a-1", "web", OLD, Some(900))]);
        let attempt = Attempt::new(t(asked), "mem", Method::Toolhive);
        a.attempt = AttemptMark::Seen(Box::new(AttemptHistory::of(&attempt)));
        a.toolhive = ToolhiveRestart {
            server: Some(Box::new(McpServerRef {
                api_version: "toolhive.stacklok.dev/v1beta1".into(),
                name: "a".into(),
                uid: "uid-a".into(),
            })),
            restarted_at: acted.map(Into::into),
        };
        a
    };
    let cases = [
        // (asked, the template's restarted-at, b bounced, a left)
        ("2026-03-10T03:28:00.400Z", None, false, false),
        // An earlier restart's value is no answer to this request.
        (
            "2026-03-10T03:28:00.400Z",
            Some("2026-03-10T03:00:00Z"),
            false,
            false,
        ),
        // The operator acted (in the request's second) and the rollout is complete.
        (
            "2026-03-10T03:28:00.400Z",
            Some("2026-03-10T03:28:00Z"),
            true,
            false,
        ),
        ("2026-03-10T03:15:00Z", None, true, true),
        ("2026-03-10T03:15:00Z", Some("not a time"), true, true),
        (
            "2026-03-10T03:15:00Z",
            Some("2026-03-10T03:15:02Z"),
            true,
            false,
        ),
    ];
    for (asked, acted, bounced, left) in cases {
        let plan = run(
            std::slice::from_ref(&p),
            &inventory(vec![a(asked, acted), b.clone()]),
        );
        let case = (asked, acted);
        assert_eq!(names(&plan) == ["b"], bounced, "{case:?}: {plan:#?}");
        if !bounced {
            assert_eq!(reason_of(&plan, "b").code(), "bounceInFlight", "{case:?}");
        }
        assert_eq!(plan.left_requests.len(), usize::from(left), "{case:?}");
        if left {
            let l = &plan.left_requests[0];
            assert_eq!((l.target.name.as_str(), l.server.name.as_str()), ("a", "a"));
            assert_eq!(l.attempt.time, t(asked));
            assert_eq!(
                reason_of(&plan, "a"),
                &SkipReason::RequestLeft {
                    server: "shop/a".into(),
                    since: t(asked),
                },
                "{case:?}"
            );
        } else {
            assert_ne!(reason_of(&plan, "a").code(), "requestLeft", "{case:?}");
        }
    }
}

/// Fault 1: a run killed after its restart patch left `a` rolling (its mark `started`, its new
/// pods not yet available). The next run starts no bounce beside it: `b`, due, is skipped
/// `bounceInFlight` naming `a`. Once `a` has rolled out, or its bounce's timeout has passed, `b`
/// is bounced again. A rollout nobody marked holds nothing back.
#[test]
fn a_bounce_an_earlier_run_left_in_flight_holds_every_other_bounce() {
    use crate::core::mark::{Attempt, AttemptHistory, AttemptMark};
    let p = over(policy("mem", "web"), 100);
    let b = deployment("shop", "b", "web", vec![pod("b-1", "web", OLD, Some(900))]);
    let a = |started: &str, available: i32, marked: bool| {
        let mut a = deployment("shop", "a", "web", vec![pod("a-1", "web", OLD, Some(900))]);
        if marked {
            let attempt = Attempt::new(t(started), "mem", Method::Rollout);
            a.attempt = AttemptMark::Seen(Box::new(AttemptHistory::of(&attempt)));
        }
        a.status.available = available;
        a
    };
    let cases = [
        // (a's mark, a's available replicas, marked, b bounced)
        ("2026-03-10T03:28:00Z", 0, true, false),
        ("2026-03-10T03:28:00Z", 1, true, true),
        // Its timeout (10m, the default) has passed: a failed rollout is not waited on forever.
        ("2026-03-10T03:15:00Z", 0, true, true),
        ("2026-03-10T03:28:00Z", 0, false, true),
    ];
    for (started, available, marked, bounced) in cases {
        let plan = run(
            std::slice::from_ref(&p),
            &inventory(vec![a(started, available, marked), b.clone()]),
        );
        let case = (started, available, marked);
        assert_eq!(
            names(&plan).contains(&"b".to_string()),
            bounced,
            "{case:?}: {plan:#?}"
        );
        if !bounced {
            assert_eq!(
                reason_of(&plan, "b"),
                &SkipReason::InFlight {
                    target: a(started, available, marked).target,
                    since: t(started),
                    until: t("2026-03-10T03:38:00Z"),
                },
                "{case:?}"
            );
            assert_eq!(
                reason_of(&plan, "b").to_string(),
                "the bounce of deployment/shop/a that an earlier run started at 2026-03-10T03:28:00Z has not finished rolling: no other bounce starts beside it (until it completes, or its timeout passes at 2026-03-10T03:38:00Z)"
            );
        }
    }
    // Rolling under another installation's policy (a name this run has not loaded), or under
    // a policy of this run that no longer selects it: not this queue's to wait for.
    for (name, app) in [("theirs", "web"), ("mem", "api")] {
        let mut other = a("2026-03-10T03:28:00Z", 0, false);
        let attempt = Attempt::new(t("2026-03-10T03:28:00Z"), name, Method::Rollout);
        other.attempt = AttemptMark::Seen(Box::new(AttemptHistory::of(&attempt)));
        other.template_labels = labels(&[("app", app)]).into();
        for p in &mut other.pods {
            p.labels = labels(&[("app", app)]).into();
        }
        let plan = run(std::slice::from_ref(&p), &inventory(vec![other, b.clone()]));
        assert_eq!(names(&plan), ["b"], "{name} {app}: {plan:#?}");
    }
}
