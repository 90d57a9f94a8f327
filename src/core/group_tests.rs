//! Restart groups in the planner: who joins, who holds, the order and the caps.

use super::tests::{OLD, deployment, inventory, names, over, pod, policy, reason_of, run, t};
use super::*;
use crate::core::group::Group;
use std::sync::Arc;

/// A workload of MCP server `server` (its pod template labelled `toolhive-name: server`), one
/// pod using `usage` MiB; a StatefulSet has two (one alone would be downtime).
fn member(kind: Kind, ns: &str, name: &str, server: &str, usage: u64) -> Workload {
    let replicas = if kind == Kind::StatefulSet { 2 } else { 1 };
    let pods = (0..replicas)
        .map(|i| pod(&format!("{name}-{i}"), "x", OLD, Some(usage)))
        .collect();
    let mut w = deployment(ns, name, "x", pods);
    w.target.kind = kind;
    Arc::make_mut(&mut w.template_labels).insert("toolhive-name".into(), server.into());
    w
}

/// Over 500Mi, grouped by `toolhive-name`.
fn grouped() -> Policy {
    let mut p = over(policy("mcp", "x"), 500);
    p.group_by = Some("toolhive-name".into());
    p
}

fn group(value: &str) -> Option<Group> {
    Some(Group {
        label: "toolhive-name".into(),
        value: value.into(),
    })
}

#[test]
fn a_due_member_bounces_its_group_backend_first_in_one_slot() {
    let inv = inventory(vec![
        member(Kind::Deployment, "mcp", "fetch", "fetch", 900),
        member(Kind::StatefulSet, "mcp", "fetch", "fetch", 100),
        member(Kind::Deployment, "mcp", "github", "github", 100),
    ]);
    let mut p = grouped();
    p.max_per_run = Some(1);
    let plan = run(&[p], &inv);
    let order: Vec<_> = plan.bounces.iter().map(|b| b.target.kind).collect();
    assert_eq!(order, [Kind::StatefulSet, Kind::Deployment], "{plan:#?}");
    assert_eq!(names(&plan), ["fetch", "fetch"]);
    assert!(plan.bounces.iter().all(|b| b.group == group("fetch")));
    let backend = &plan.bounces[0];
    assert_eq!(backend.triggers.len(), 1);
    assert_eq!(
        backend.triggers[0].to_string(),
        "group (deployment/mcp/fetch is due)"
    );
    assert_eq!(backend.triggers[0].code(), "group");
    assert_eq!(plan.bounces[1].triggers[0].code(), "memory");
    // The group took one slot of maxPerRun 1; github is not due and is not held by it.
    assert_eq!(reason_of(&plan, "github").code(), "notDue");
}

#[test]
fn a_member_that_cannot_be_bounced_holds_the_whole_group() {
    let mut busy = member(Kind::StatefulSet, "mcp", "fetch", "fetch", 100);
    busy.pods[0].ready = false;
    let inv = inventory(vec![
        member(Kind::Deployment, "mcp", "fetch", "fetch", 900),
        busy,
    ]);
    let plan = run(&[grouped()], &inv);
    assert!(plan.bounces.is_empty(), "{plan:#?}");
    let held: Vec<_> = plan
        .skips
        .iter()
        .map(|s| (s.target.kind, s.reason.code(), s.group.clone()))
        .collect();
    assert_eq!(
        held,
        [
            (Kind::Deployment, "groupHeld", group("fetch")),
            (Kind::StatefulSet, "notAvailable", group("fetch")),
        ]
    );
    assert!(
        plan.skips[0]
            .reason
            .to_string()
            .starts_with("group held by statefulset/mcp/fetch: not fully available (1/2 ready)"),
        "{}",
        plan.skips[0].reason
    );
}

#[test]
fn a_member_in_cooldown_holds_the_group_even_when_not_due() {
    let mut fresh = member(Kind::StatefulSet, "mcp", "fetch", "fetch", 100);
    fresh.restarted_at = Some(t("2026-03-10T03:00:00Z"));
    let inv = inventory(vec![
        member(Kind::Deployment, "mcp", "fetch", "fetch", 900),
        fresh,
    ]);
    let plan = run(&[grouped()], &inv);
    assert!(plan.bounces.is_empty(), "{plan:#?}");
    assert_eq!(
        plan.skips
            .iter()
            .map(|s| s.reason.code())
            .collect::<Vec<_>>(),
        ["groupHeld", "cooldown"]
    );
}

#[test]
fn groups_are_per_namespace_and_value_and_counted_once_for_the_global_cap() {
    let inv = inventory(vec![
        member(Kind::Deployment, "a", "fetch", "fetch", 900),
        member(Kind::StatefulSet, "a", "fetch", "fetch", 100),
        // Same value, another namespace: another group.
        member(Kind::Deployment, "b", "fetch", "fetch", 800),
        member(Kind::StatefulSet, "b", "fetch", "fetch", 100),
    ]);
    let plan = plan(
        &[grouped()],
        &inv,
        t(super::tests::NOW),
        &Limits::max_bounces(1),
    );
    let bounced: Vec<_> = plan.bounces.iter().map(|b| b.target.to_string()).collect();
    assert_eq!(bounced, ["statefulset/a/fetch", "deployment/a/fetch"]);
    let capped: Vec<_> = plan
        .skips
        .iter()
        .map(|s| (s.target.to_string(), s.reason.code()))
        .collect();
    assert_eq!(
        capped,
        [
            ("deployment/b/fetch".to_string(), "globalCap"),
            ("statefulset/b/fetch".to_string(), "globalCap"),
        ]
    );
}

#[test]
fn no_due_member_means_plain_skips_and_an_unlabelled_workload_is_alone() {
    let mut loner = member(Kind::Deployment, "mcp", "other", "x", 900);
    Arc::make_mut(&mut loner.template_labels).remove("toolhive-name");
    let inv = inventory(vec![
        member(Kind::Deployment, "mcp", "fetch", "fetch", 100),
        member(Kind::StatefulSet, "mcp", "fetch", "fetch", 100),
        loner,
    ]);
    let plan = run(&[grouped()], &inv);
    assert_eq!(names(&plan), ["other"]);
    assert_eq!(plan.bounces[0].group, None);
    assert!(
        plan.skips
            .iter()
            .all(|s| s.reason.code() == "notDue" && s.group == group("fetch"))
    );
}

#[test]
fn a_kind_the_policy_does_not_bounce_is_left_out_of_the_group() {
    let inv = inventory(vec![
        member(Kind::Deployment, "mcp", "fetch", "fetch", 900),
        member(Kind::StatefulSet, "mcp", "fetch", "fetch", 100),
    ]);
    let mut p = grouped();
    p.kinds = vec![Kind::Deployment];
    let plan = run(&[p], &inv);
    assert_eq!(plan.bounces.len(), 1);
    assert_eq!(plan.bounces[0].target.kind, Kind::Deployment);
    assert_eq!(reason_of(&plan, "fetch").code(), "kindNotSelected");
}

#[test]
fn a_member_claimed_by_another_policy_holds_the_group() {
    let inv = inventory(vec![
        member(Kind::Deployment, "mcp", "fetch", "fetch", 900),
        member(Kind::StatefulSet, "mcp", "fetch", "fetch", 950),
    ]);
    // "a-first" sorts first and bounces the StatefulSet alone (it is the more urgent).
    let mut alone = over(policy("a-first", "x"), 500);
    alone.kinds = vec![Kind::StatefulSet];
    let plan = run(&[alone, grouped()], &inv);
    let bounced: Vec<_> = plan
        .bounces
        .iter()
        .map(|b| (b.policy.as_str(), b.target.to_string()))
        .collect();
    assert_eq!(bounced, [("a-first", "statefulset/mcp/fetch".to_string())]);
    let mcp: Vec<_> = plan
        .skips
        .iter()
        .filter(|s| s.policy == "mcp")
        .map(|s| (s.target.kind, s.reason.to_string()))
        .collect();
    assert_eq!(
        mcp,
        [
            (
                Kind::Deployment,
                "group held by statefulset/mcp/fetch: bounced this run by policy a-first"
                    .to_string()
            ),
            (
                Kind::StatefulSet,
                "bounced this run by policy a-first".to_string()
            ),
        ]
    );
}

/// A group a run left half restarted (the backend bounced, the proxy skipped on its fresh read)
/// is finished by the next run though the backend is in its cooldown; a group whose members
/// were all restarted since is not.
#[test]
fn a_half_restarted_group_is_finished_on_the_next_run() {
    use crate::core::mark::{Attempt, AttemptHistory, AttemptMark, AttemptOutcome};
    let bounced = t("2026-03-10T03:00:00Z");
    let mut backend = member(Kind::StatefulSet, "mcp", "fetch", "fetch", 100);
    for pod in &mut backend.pods {
        pod.started = Some(bounced + chrono::TimeDelta::seconds(20));
    }
    backend.attempt = AttemptMark::Seen(Box::new(AttemptHistory::of(&Attempt {
        time: bounced,
        policy: "mcp".into(),
        method: Method::Rollout,
        outcome: AttemptOutcome::Started,
        template: None,
    })));
    let proxy = member(Kind::Deployment, "mcp", "fetch", "fetch", 100);
    let mut p = grouped();
    p.cooldown = std::time::Duration::from_secs(6 * 3600);
    let plan = run(
        &[p.clone()],
        &inventory(vec![backend.clone(), proxy.clone()]),
    );
    assert_eq!(names(&plan), ["fetch"], "{plan:#?}");
    assert_eq!(plan.bounces[0].target.kind, Kind::Deployment);
    assert_eq!(
        plan.bounces[0].triggers[0].to_string(),
        "group (statefulset/mcp/fetch is due)"
    );
    // The backend itself is not due again: it only starts the group's bounce.
    assert_eq!(reason_of(&plan, "fetch").code(), "notDue");

    // A pod's start is written in whole seconds, the mark to the millisecond: a pod created in
    // the mark's own second is newer than the mark.
    let mut same_second = backend.clone();
    same_second.attempt = AttemptMark::Seen(Box::new(AttemptHistory::of(&Attempt {
        time: bounced + chrono::TimeDelta::milliseconds(68),
        policy: "mcp".into(),
        method: Method::Rollout,
        outcome: AttemptOutcome::Started,
        template: None,
    })));
    same_second.pods[0].started = Some(bounced);
    let plan = run(&[p.clone()], &inventory(vec![same_second, proxy.clone()]));
    assert_eq!(names(&plan), ["fetch"], "{plan:#?}");

    // The proxy restarted after the backend's bounce: the group is whole, nothing is due.
    let mut whole = proxy;
    whole.pods[0].started = Some(bounced + chrono::TimeDelta::seconds(90));
    let plan = run(&[p.clone()], &inventory(vec![backend.clone(), whole]));
    assert!(plan.bounces.is_empty(), "{plan:#?}");

    // A mark of another policy, or of a bounce that did not restart the pods, starts nothing.
    let mut other = backend;
    other.pods[0].started = Some(t(OLD));
    let plan = run(
        &[p],
        &inventory(vec![
            other,
            member(Kind::Deployment, "mcp", "fetch", "fetch", 100),
        ]),
    );
    assert!(plan.bounces.is_empty(), "{plan:#?}");
}
