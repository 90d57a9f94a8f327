//! `spec.dryRun` and `spec.suspend` in the planner.

use super::tests::*;
use super::*;

fn dry(mut p: Policy) -> Policy {
    p.dry_run = true;
    p
}

fn dry_names(p: &Plan) -> Vec<String> {
    p.dry_run.iter().map(|b| b.target.name.clone()).collect()
}

#[test]
fn a_dry_run_policy_is_planned_as_usual_and_queues_nothing() {
    let mut policy = dry(over(policy("trial", "x"), 100));
    policy.max_per_run = Some(2);
    let p = run(&[policy], &leaky(3));
    assert!(p.bounces.is_empty(), "{:?}", names(&p));
    // Its own maxPerRun holds, so the report shows what arming it would do.
    assert_eq!(dry_names(&p), ["w3", "w2"]);
    assert_eq!(reason_of(&p, "w1").code(), "policyCap");
    assert!(p.dry_run_policies.contains("trial"));
}

#[test]
fn the_armed_policy_acts_on_a_workload_both_select_whatever_the_names() {
    // "a-trial" sorts (and would be visited) before "b-armed".
    let p = run(
        &[
            dry(over(policy("a-trial", "x"), 100)),
            over(policy("b-armed", "x"), 100),
        ],
        &leaky(2),
    );
    assert_eq!(names(&p), ["w2", "w1"]);
    assert!(p.bounces.iter().all(|b| b.policy == "b-armed"));
    assert!(p.dry_run.is_empty());
    let claimed: Vec<_> = p.skips.iter().filter(|s| s.policy == "a-trial").collect();
    assert_eq!(claimed.len(), 2);
    assert!(claimed.iter().all(|s| s.reason
        == SkipReason::Claimed {
            policy: "b-armed".into()
        }));
}

#[test]
fn dry_run_rows_take_no_place_of_the_global_cap() {
    let armed = over(policy("b-armed", "y"), 100);
    let inv = inventory(vec![
        deployment("a", "w1", "x", vec![pod("p1", "x", OLD, Some(900))]),
        deployment("a", "w2", "x", vec![pod("p2", "x", OLD, Some(800))]),
        deployment("a", "v1", "y", vec![pod("q1", "y", OLD, Some(200))]),
        deployment("a", "v2", "y", vec![pod("q2", "y", OLD, Some(150))]),
    ]);
    let policies = [dry(over(policy("a-trial", "x"), 100)), armed];
    let p = plan(&policies, &inv, t(NOW), &Limits::max_bounces(2));
    // The dry-run workloads are more urgent, yet both armed bounces go ahead.
    assert_eq!(names(&p), ["v1", "v2"]);
    assert_eq!(dry_names(&p), ["w1", "w2"]);
}

#[test]
fn two_dry_run_policies_on_one_workload_claim_it_once() {
    let p = run(
        &[
            dry(over(policy("a-trial", "x"), 100)),
            dry(over(policy("b-trial", "x"), 100)),
        ],
        &leaky(1),
    );
    assert_eq!(dry_names(&p), ["w1"]);
    assert_eq!(
        reason_of(&p, "w1"),
        &SkipReason::ClaimedInDryRun {
            policy: "a-trial".into()
        }
    );
}

#[test]
fn a_suspended_policy_is_not_evaluated_and_lists_what_it_selects() {
    let mut suspended = over(policy("paused", "x"), 100);
    suspended.suspend = true;
    let p = run(&[suspended], &leaky(2));
    assert!(p.bounces.is_empty() && p.dry_run.is_empty());
    assert_eq!(p.skips.len(), 2);
    assert!(p.skips.iter().all(|s| s.reason == SkipReason::Suspended));
    assert!(p.suspended_policies.contains("paused"));
    // It claims nothing: another policy bounces the same workloads.
    let mut suspended = over(policy("a-paused", "x"), 100);
    suspended.suspend = true;
    let p = run(&[suspended, over(policy("b-armed", "x"), 100)], &leaky(2));
    assert_eq!(names(&p), ["w2", "w1"]);
}
