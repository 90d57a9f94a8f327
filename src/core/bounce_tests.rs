//! Every transition of the bounce machine, driven by a scripted cluster.

use std::collections::{BTreeSet, VecDeque};

use super::*;
use crate::core::action::{Context, EdgeError};
use crate::core::history::Prometheus;
use crate::core::model::{Kind, McpServerRef, Pdb, ToolhiveRestart, WorkloadRef};
use crate::core::plan::tests::{NOW, OLD, deployment, pod, policy, t};
use crate::core::policy::{OnRevert, RestartMethod};
use crate::core::selector::Selector;
use crate::core::toolhive::McpServerState;
use crate::core::verify::Reverters;

pub(crate) fn fresh(w: &Workload) -> Box<Fresh> {
    Box::new(Fresh {
        workload: w.clone(),
        context: Some(Context {
            excluded_namespaces: BTreeSet::new(),
            pdbs: vec![],
            prometheus: Prometheus::off(crate::core::history::QueryError::NotConfigured),
        }),
    })
}

pub(crate) fn web(replicas: usize) -> Workload {
    let pods = (0..replicas)
        .map(|i| pod(&format!("web-{i}"), "web", OLD, Some(100)))
        .collect();
    deployment("shop", "web", "web", pods)
}

pub(crate) fn bounce_of(w: &Workload, p: &Policy) -> Bounce {
    Bounce {
        policy: p.name.clone(),
        target: w.target.clone(),
        method: Method::Rollout,
        instead: None,
        triggers: vec![],
        pods: w.pods.len(),
        memory: None,
        group: None,
        seen_restarted_at: w.restarted_at,
        seen_uid: w.uid.clone(),
        timeout: None,
        on_revert: p.restart.on_revert,
        allow_downtime: p.allow_downtime,
        cooldown: p.cooldown,
    }
}

/// The workload after a rollout: the annotation written, every pod new.
fn rolled(w: &Workload, written: &str) -> Workload {
    let mut after = w.clone();
    after.restarted_at = Some(t(written));
    for p in &mut after.pods {
        p.uid = format!("{}-new", p.uid).into();
    }
    after
}

/// A scripted cluster: each kind of action has its answers, in order; past them, the default.
#[derive(Default)]
struct Script {
    reads: VecDeque<Result<Box<Fresh>, EdgeError>>,
    patch: Option<Result<(String, String), EdgeError>>,
    rollouts: VecDeque<Result<(), Failure>>,
    operator: Option<Result<McpServerState, EdgeError>>,
    request: Option<Result<(), EdgeError>>,
    acted: Option<Result<(String, String), Failure>>,
    evictions: VecDeque<Result<(), Failure>>,
    marks: VecDeque<Result<Option<String>, EdgeError>>,
    reverters: Vec<String>,
    /// The first action this matches is answered `Stopped`, and the run's stop is set from then.
    stop_at: Option<fn(&Action) -> bool>,
}

const WRITTEN: &str = "2026-03-10T03:30:00Z";

impl Script {
    fn answer(&mut self, a: &Action) -> Observation {
        match a {
            Action::Read { .. } => Observation::Read(
                self.reads
                    .pop_front()
                    .unwrap_or_else(|| Err(other("no more reads scripted"))),
            ),
            Action::Patch { .. } => Observation::Patched(
                self.patch
                    .clone()
                    .unwrap_or(Ok((WRITTEN.into(), "10".into()))),
            ),
            Action::Mark { .. } => {
                Observation::Marked(self.marks.pop_front().unwrap_or(Ok(Some("11".into()))))
            }
            Action::ReadOperator { .. } => Observation::Operator(
                self.operator
                    .clone()
                    .unwrap_or_else(|| Ok(server_state(None))),
            ),
            Action::RequestOperatorRestart { .. } => {
                Observation::Requested(self.request.clone().unwrap_or(Ok(())))
            }
            Action::Withdraw { .. } => Observation::Withdrawn(Ok(())),
            Action::Evict { .. } => {
                Observation::Evicted(self.evictions.pop_front().unwrap_or(Ok(())))
            }
            Action::Wait(Stage::Rollout { .. }) => {
                Observation::RolledOut(self.rollouts.pop_front().unwrap_or(Ok(())))
            }
            Action::Wait(Stage::OperatorActed { .. }) => Observation::OperatorActed(
                self.acted
                    .clone()
                    .unwrap_or(Ok((WRITTEN.into(), "12".into()))),
            ),
            Action::Wait(Stage::Replaced { .. }) => Observation::Replaced(Ok(())),
            Action::Sleep { .. } => Observation::Slept,
            Action::FindReverters { .. } => Observation::Reverters(Reverters {
                managers: self.reverters.clone(),
                wrote_after: true,
            }),
            Action::Emit(_) => Observation::Emitted,
            Action::Done(_) | Action::Finished => unreachable!("not carried out"),
        }
    }
}

/// A scripted edge's failures, by the class the edge would give them.
pub(crate) fn other(message: &str) -> EdgeError {
    EdgeError::Other {
        message: message.into(),
    }
}

fn forbidden() -> EdgeError {
    EdgeError::Forbidden {
        message: "forbidden".into(),
    }
}

fn unreachable(message: &str) -> EdgeError {
    EdgeError::Unreachable {
        message: message.into(),
    }
}

fn server_state(strategy: Option<&str>) -> McpServerState {
    McpServerState {
        name: "web".into(),
        uid: "server-uid".into(),
        strategy: strategy.map(Into::into),
        last_processed: None,
        resource_version: "7".into(),
        restarted_at: None,
        requested_by_bouncer: false,
    }
}

/// A ten-minute budget and `settle`.
fn limits(p: &Policy, settle: Duration) -> Limits<'_> {
    Limits {
        policy: p,
        timeout: Duration::from_secs(600),
        settle,
    }
}

/// Runs one bounce to its end: the actions it asked for, and its outcome.
fn run(b: &Bounce, p: &Policy, mut script: Script) -> (Vec<Action>, Outcome) {
    let limits = limits(p, Duration::ZERO);
    let mut m = Machine::new(b, limits);
    let mut seen = Observation::Begin;
    let mut stop: Option<&str> = None;
    let mut actions = Vec::new();
    for _ in 0..100 {
        let a = m.step(seen, t(NOW), stop);
        if let Action::Done(outcome) = a {
            return (actions, *outcome);
        }
        seen = match script.stop_at {
            Some(at) if at(&a) => {
                script.stop_at = None;
                stop = Some("the run received SIGTERM");
                Observation::Stopped
            }
            _ => script.answer(&a),
        };
        actions.push(a);
    }
    panic!("the bounce did not end within 100 steps: {actions:?}");
}

/// Short names of the actions, to compare sequences.
fn kinds(actions: &[Action]) -> Vec<&'static str> {
    actions
        .iter()
        .map(|a| match a {
            Action::Read { context: true, .. } => "read",
            Action::Read { context: false, .. } => "verify-read",
            Action::Patch { .. } => "patch",
            Action::Mark { .. } => "mark",
            Action::ReadOperator { .. } => "read-operator",
            Action::RequestOperatorRestart { .. } => "request",
            Action::Withdraw { .. } => "withdraw",
            Action::Evict { .. } => "evict",
            Action::Wait(Stage::Rollout { .. }) => "wait-rollout",
            Action::Wait(Stage::OperatorActed { .. }) => "wait-operator",
            Action::Wait(Stage::Replaced { .. }) => "wait-replaced",
            Action::Sleep { .. } => "sleep",
            Action::FindReverters { .. } => "reverters",
            Action::Emit(e) => match e.kind {
                EventKind::Bounced => "event-bounced",
                EventKind::Failed => "event-failed",
                EventKind::Reverted => "event-reverted",
                EventKind::Superseded => "event-superseded",
            },
            Action::Done(_) | Action::Finished => "done",
        })
        .collect()
}

fn writes(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| {
            matches!(
                a,
                Action::Patch { .. }
                    | Action::Mark { .. }
                    | Action::RequestOperatorRestart { .. }
                    | Action::Evict { .. }
            )
        })
        .count()
}

fn final_mark(actions: &[Action]) -> Option<AttemptOutcome> {
    actions.iter().rev().find_map(|a| match a {
        Action::Mark { attempt, .. } => Some(attempt.outcome),
        _ => None,
    })
}

use crate::core::mark::AttemptOutcome;

#[test]
fn a_rollout_is_patched_waited_verified_marked_and_told() {
    let (p, w) = (policy("p", "web"), web(2));
    let after = rolled(&w, WRITTEN);
    let script = Script {
        reads: [Ok(fresh(&w)), Ok(fresh(&after))].into(),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(
        kinds(&actions),
        [
            "read",
            "patch",
            "wait-rollout",
            "verify-read",
            "event-bounced"
        ]
    );
    assert_eq!(out.status, Status::Bounced);
    assert_eq!(out.written.as_deref(), Some(WRITTEN));
    // The mark rode on the restart patch: one write for the whole bounce.
    assert_eq!(writes(&actions), 1);
    assert_eq!(
        out.verification.as_deref(),
        Some("restartedAt intact, 2/2 pods new and ready")
    );
}

#[test]
fn a_settle_longer_than_the_rollout_sleeps_before_verifying() {
    let (p, w) = (policy("p", "web"), web(2));
    let b = bounce_of(&w, &p);
    let limits = limits(&p, Duration::from_secs(5));
    let mut m = Machine::new(&b, limits);
    let now = t(NOW);
    assert!(matches!(
        m.step(Observation::Begin, now, None),
        Action::Read { .. }
    ));
    assert!(matches!(
        m.step(Observation::Read(Ok(fresh(&w))), now, None),
        Action::Patch { .. }
    ));
    let wait = m.step(
        Observation::Patched(Ok((WRITTEN.into(), "3".into()))),
        now,
        None,
    );
    assert!(matches!(wait, Action::Wait(Stage::Rollout { from: Some(ref v), .. }) if v == "3"));
    match m.step(Observation::RolledOut(Ok(())), now, None) {
        Action::Sleep { until } => assert_eq!(until, now + chrono::TimeDelta::seconds(5)),
        other => panic!("expected the settle, got {other:?}"),
    }
    assert!(matches!(
        m.step(Observation::Slept, now, None),
        Action::Read { context: false, .. }
    ));
}

#[test]
fn a_gate_failing_on_the_fresh_read_skips_with_no_write() {
    let p = policy("p", "web");
    let mut w = web(2);
    w.uid = Some("0b6f1c2e-5d4a-4e8b-9c3d-7f2a1b0c9d8e".into());
    let b = bounce_of(&w, &p);
    let mut recreated = w.clone();
    recreated.uid = Some("5f0c2a9e-1b7d-4c3e-8a6f-2d9e4b1c7a30".into());
    let mut paused = w.clone();
    paused.paused = true;
    let mut excluded = fresh(&w);
    excluded
        .context
        .as_mut()
        .unwrap()
        .excluded_namespaces
        .insert("shop".into());
    let mut restarted = w.clone();
    restarted.restarted_at = Some(t("2026-03-10T03:00:00Z"));
    // Its namespace's deletion began after the plan.
    let mut deleting = w.clone();
    deleting.deleting = Some(crate::core::model::Deleting::Namespace);
    let cases: Vec<(Result<Box<Fresh>, EdgeError>, SkipReason)> = vec![
        (Ok(fresh(&paused)), SkipReason::Paused),
        (
            Ok(fresh(&deleting)),
            SkipReason::BeingDeleted(crate::core::model::Deleting::Namespace),
        ),
        (Ok(excluded), SkipReason::NamespaceExcluded),
        (Ok(fresh(&restarted)), SkipReason::RestartedMeanwhile),
        (
            Ok(fresh(&recreated)),
            SkipReason::Replaced {
                was: "0b6f1c2e-5d4a-4e8b-9c3d-7f2a1b0c9d8e".into(),
                now: Some("5f0c2a9e-1b7d-4c3e-8a6f-2d9e4b1c7a30".into()),
            },
        ),
        (
            Err(EdgeError::NotFound {
                message: "gone".into(),
            }),
            SkipReason::ReadFailed {
                error: "gone".into(),
            },
        ),
    ];
    for (read, want) in cases {
        let script = Script {
            reads: [read].into(),
            ..Script::default()
        };
        let (actions, out) = run(&b, &p, script);
        assert_eq!(kinds(&actions), ["read"], "{want:?}");
        assert_eq!(out.status, Status::Skipped(want));
        assert!(out.attempt.is_none());
    }
}

#[test]
fn a_fresh_read_without_its_context_is_a_skip() {
    let (p, w) = (policy("p", "web"), web(2));
    let mut bare = fresh(&w);
    bare.context = None;
    let script = Script {
        reads: [Ok(bare)].into(),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(writes(&actions), 0);
    assert!(matches!(
        out.status,
        Status::Skipped(SkipReason::ReadFailed { .. })
    ));
}

#[test]
fn a_budget_exhausted_since_the_plan_stops_an_eviction_bounce() {
    let mut p = policy("p", "web");
    p.restart.method = RestartMethod::Evict;
    let w = web(2);
    let mut read = fresh(&w);
    read.context.as_mut().unwrap().pdbs.push(Pdb {
        namespace: "shop".into(),
        name: "web-pdb".into(),
        selector: Selector {
            match_labels: [("app".to_string(), "web".to_string())].into(),
            match_expressions: vec![],
        },
        disruptions_allowed: 0,
    });
    let script = Script {
        reads: [Ok(read)].into(),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(writes(&actions), 0);
    assert_eq!(
        out.status,
        Status::Skipped(SkipReason::PdbBlocks {
            name: "web-pdb".into()
        })
    );
}

#[test]
fn a_stop_during_the_fresh_read_starts_nothing() {
    let (p, w) = (policy("p", "web"), web(2));
    let b = bounce_of(&w, &p);
    let limits = limits(&p, Duration::ZERO);
    let mut m = Machine::new(&b, limits);
    m.step(Observation::Begin, t(NOW), None);
    let a = m.step(Observation::Read(Ok(fresh(&w))), t(NOW), Some("SIGTERM"));
    let Action::Done(out) = a else {
        panic!("expected the end, got {a:?}")
    };
    assert_eq!(out.status, Status::Interrupted("SIGTERM".into()));
}

#[test]
fn failures_after_the_restart_are_marked_and_told() {
    let (p, w) = (policy("p", "web"), web(2));
    let timed_out = Failure::new(FailureCode::RolloutTimedOut, "did not complete");
    let half = {
        let mut after = rolled(&w, WRITTEN);
        after.pods[0].uid = w.pods[0].uid.clone();
        after
    };
    let cases = vec![
        (
            Script {
                reads: [Ok(fresh(&w))].into(),
                patch: Some(Err(forbidden())),
                ..Script::default()
            },
            FailureCode::PatchFailed,
        ),
        (
            Script {
                reads: [Ok(fresh(&w))].into(),
                rollouts: [Err(timed_out)].into(),
                ..Script::default()
            },
            FailureCode::RolloutTimedOut,
        ),
        (
            Script {
                reads: [Ok(fresh(&w)), Err(unreachable("timeout"))].into(),
                ..Script::default()
            },
            FailureCode::VerifyReadFailed,
        ),
        (
            Script {
                reads: [Ok(fresh(&w)), Ok(fresh(&half))].into(),
                ..Script::default()
            },
            FailureCode::VerifyFailed,
        ),
    ];
    for (script, code) in cases {
        let (actions, out) = run(&bounce_of(&w, &p), &p, script);
        let Status::Failed(f) = &out.status else {
            panic!("{code:?}: {:?}", out.status)
        };
        assert_eq!(f.code, code);
        assert_eq!(
            &kinds(&actions)[actions.len() - 2..],
            ["mark", "event-failed"]
        );
        assert_eq!(final_mark(&actions), Some(AttemptOutcome::Failed));
    }
}

/// Every write of a bounce (the restart patch, the marks of a failure, of an eviction bounce)
/// is conditional on the UID of the object the fresh read judged.
#[test]
fn every_write_is_for_the_object_the_fresh_read_judged() {
    let p = policy("p", "web");
    let mut w = web(2);
    w.uid = Some("0b6f1c2e-5d4a-4e8b-9c3d-7f2a1b0c9d8e".into());
    let timed_out = Failure::new(FailureCode::RolloutTimedOut, "did not complete");
    let mut evict = bounce_of(&w, &p);
    evict.method = Method::Evict;
    let mut evict_policy = p.clone();
    evict_policy.restart.method = RestartMethod::Evict;
    let runs = [
        run(
            &bounce_of(&w, &p),
            &p,
            Script {
                reads: [Ok(fresh(&w)), Ok(fresh(&rolled(&w, WRITTEN)))].into(),
                ..Script::default()
            },
        ),
        run(
            &bounce_of(&w, &p),
            &p,
            Script {
                reads: [Ok(fresh(&w))].into(),
                rollouts: [Err(timed_out)].into(),
                ..Script::default()
            },
        ),
        run(
            &evict,
            &evict_policy,
            Script {
                reads: [Ok(fresh(&w))].into(),
                ..Script::default()
            },
        ),
    ];
    for (actions, out) in &runs {
        let uids: Vec<_> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Patch { uid, .. } | Action::Mark { uid, .. } => Some(uid.clone()),
                _ => None,
            })
            .collect();
        assert!(!uids.is_empty(), "{:?}: {:?}", out.status, kinds(actions));
        assert!(uids.iter().all(|u| *u == w.uid), "{uids:?}");
    }
}

#[test]
fn new_pods_not_yet_ready_are_waited_for_once_more() {
    let (p, w) = (policy("p", "web"), web(2));
    let mut unready = rolled(&w, WRITTEN);
    unready.pods[1].ready = false;
    let script = Script {
        reads: [
            Ok(fresh(&w)),
            Ok(fresh(&unready)),
            Ok(fresh(&rolled(&w, WRITTEN))),
        ]
        .into(),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(
        kinds(&actions)[..6],
        [
            "read",
            "patch",
            "wait-rollout",
            "verify-read",
            "wait-rollout",
            "verify-read"
        ]
    );
    assert_eq!(out.status, Status::Bounced);
}

/// Overtaken: a `kubectl rollout restart` lands while bouncer waits on its own rollout. The
/// result is `superseded`, told and marked, with no revert lookup, no eviction and no halt.
#[test]
fn a_restart_after_bouncer_s_supersedes_it_and_does_not_halt() {
    let (p, w) = (policy("p", "web"), web(2));
    let later = "2026-03-10T03:30:04Z";
    let script = Script {
        reads: [Ok(fresh(&w)), Ok(fresh(&rolled(&w, later)))].into(),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(
        kinds(&actions),
        [
            "read",
            "patch",
            "wait-rollout",
            "verify-read",
            "mark",
            "event-superseded"
        ]
    );
    assert_eq!(
        out.status,
        Status::Superseded {
            found: later.into()
        }
    );
    assert!(!out.status.halts() && !out.status.bounced());
    assert_eq!(final_mark(&actions), Some(AttemptOutcome::Superseded));
    assert!(
        !AttemptOutcome::Superseded.failed(),
        "not counted by the breaker"
    );
    assert_eq!(
        out.verification.as_deref(),
        Some(
            "restartedAt is now 2026-03-10T03:30:04Z, a restart after bouncer's \
             (2026-03-10T03:30:00Z): the pods roll under it; nothing more is done to the workload"
        )
    );
}

fn reverted(w: &Workload) -> Workload {
    // The owner put its own template back: the annotation gone, the old pods back.
    w.clone()
}

#[test]
fn a_revert_with_on_revert_fail_is_named_and_touches_nothing_more() {
    let (p, w) = (policy("p", "web"), web(2));
    let script = Script {
        reads: [Ok(fresh(&w)), Ok(fresh(&reverted(&w)))].into(),
        reverters: vec!["operator".into()],
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(
        kinds(&actions),
        [
            "read",
            "patch",
            "wait-rollout",
            "verify-read",
            "reverters",
            "event-reverted",
            "mark"
        ]
    );
    assert_eq!(
        out.status,
        Status::Reverted {
            managers: vec!["operator".into()]
        }
    );
    assert_eq!(final_mark(&actions), Some(AttemptOutcome::Reverted));
}

#[test]
fn a_revert_with_on_revert_evict_evicts_the_old_pods_one_at_a_time_after_the_gates() {
    let mut p = policy("p", "web");
    p.restart.on_revert = OnRevert::Evict;
    let w = web(2);
    let script = Script {
        reads: [
            Ok(fresh(&w)),
            Ok(fresh(&reverted(&w))),
            Ok(fresh(&reverted(&w))),
        ]
        .into(),
        reverters: vec!["operator".into()],
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(
        kinds(&actions)[4..],
        [
            "reverters",
            "event-reverted",
            "read",
            "evict",
            "wait-replaced",
            "evict",
            "wait-replaced",
            "mark"
        ]
    );
    let evicted: Vec<_> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Evict { pod, .. } => Some(pod.name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(evicted, ["web-0", "web-1"]);
    assert!(matches!(out.status, Status::RevertedEvicted { .. }));
}

#[test]
fn a_reverted_singleton_without_allow_downtime_is_not_evicted() {
    let mut p = policy("p", "web");
    p.restart.on_revert = OnRevert::Evict;
    let w = web(1);
    let script = Script {
        reads: [Ok(fresh(&w)), Ok(fresh(&w)), Ok(fresh(&w))].into(),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert!(!kinds(&actions).contains(&"evict"), "{actions:?}");
    assert!(matches!(out.status, Status::Reverted { .. }));
    let note = out.verification.unwrap();
    assert!(note.contains("nothing evicted"), "{note}");
    // With allowDowntime the same revert is followed by the eviction.
    p.allow_downtime = true;
    let script = Script {
        reads: [Ok(fresh(&w)), Ok(fresh(&w)), Ok(fresh(&w))].into(),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert!(kinds(&actions).contains(&"evict"));
    assert!(matches!(out.status, Status::RevertedEvicted { .. }));
}

#[test]
fn an_eviction_bounce_marks_first_and_evicts_every_pod_one_at_a_time() {
    let mut p = policy("p", "web");
    p.restart.method = RestartMethod::Evict;
    let w = web(3);
    let script = Script {
        reads: [Ok(fresh(&w))].into(),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(
        kinds(&actions),
        [
            "read",
            "mark",
            "evict",
            "wait-replaced",
            "evict",
            "wait-replaced",
            "evict",
            "wait-replaced",
            "mark",
            "event-bounced"
        ]
    );
    assert_eq!(out.status, Status::Bounced);
    assert_eq!(out.method, Method::Evict);
}

#[test]
fn no_mark_no_eviction_and_a_refused_eviction_fails() {
    let mut p = policy("p", "web");
    p.restart.method = RestartMethod::Evict;
    let w = web(2);
    let script = Script {
        reads: [Ok(fresh(&w))].into(),
        marks: [Err(forbidden())].into(),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert!(!kinds(&actions).contains(&"evict"));
    let Status::Failed(f) = &out.status else {
        panic!("{:?}", out.status)
    };
    assert_eq!(f.code, FailureCode::MarkFailed);
    assert_eq!(
        f.detail,
        "could not record the attempt mark: forbidden; nothing was evicted"
    );

    let refused = Failure::new(FailureCode::EvictionRefused, "429 until the timeout");
    let script = Script {
        reads: [Ok(fresh(&w))].into(),
        evictions: [Err(refused)].into(),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(kinds(&actions).iter().filter(|k| **k == "evict").count(), 1);
    assert!(matches!(&out.status, Status::Failed(f) if f.code == FailureCode::EvictionRefused));
}

fn mcp_proxy() -> Workload {
    let mut w = web(2);
    w.toolhive = ToolhiveRestart {
        server: Some(Box::new(McpServerRef {
            api_version: "toolhive.stacklok.dev/v1beta1".into(),
            name: "web".into(),
            uid: "server-uid".into(),
        })),
        restarted_at: None,
    };
    w
}

fn toolhive_policy() -> Policy {
    let mut p = policy("p", "web");
    p.restart.method = RestartMethod::Toolhive;
    p
}

#[test]
fn a_toolhive_restart_is_asked_conditionally_then_followed_and_verified() {
    let (p, w) = (toolhive_policy(), mcp_proxy());
    let mut after = rolled(&w, WRITTEN);
    after.toolhive.restarted_at = Some(WRITTEN.into());
    let script = Script {
        reads: [Ok(fresh(&w)), Ok(fresh(&after))].into(),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(
        kinds(&actions),
        [
            "read",
            "read-operator",
            "mark",
            "request",
            "wait-operator",
            "wait-rollout",
            "verify-read",
            "mark",
            "event-bounced"
        ]
    );
    assert_eq!(final_mark(&actions), Some(AttemptOutcome::Bounced));
    let request = actions
        .iter()
        .find_map(|a| match a {
            Action::RequestOperatorRestart {
                resource_version, ..
            } => Some(resource_version.as_str()),
            _ => None,
        })
        .unwrap();
    assert_eq!(request, "7", "conditional on the state read before asking");
    assert_eq!(out.status, Status::Bounced);
}

#[test]
fn a_toolhive_server_set_to_restart_immediately_is_never_asked() {
    let (p, w) = (toolhive_policy(), mcp_proxy());
    let script = Script {
        reads: [Ok(fresh(&w))].into(),
        operator: Some(Ok(server_state(Some("immediate")))),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(writes(&actions), 0);
    assert!(matches!(
        out.status,
        Status::Skipped(SkipReason::RestartStrategy { .. })
    ));
}

#[test]
fn a_toolhive_request_is_withdrawn_on_every_way_out_before_the_operator_acts() {
    let (p, w) = (toolhive_policy(), mcp_proxy());
    let no_restart = Failure::new(FailureCode::OperatorNoRestart, "not rolled");
    let cases: Vec<(&str, Script)> = vec![
        (
            "the answer to the request was lost",
            Script {
                request: Some(Err(unreachable("connection reset"))),
                ..Script::default()
            },
        ),
        (
            "the operator did not act",
            Script {
                acted: Some(Err(no_restart)),
                ..Script::default()
            },
        ),
        (
            "the run was stopped while waiting for the operator",
            Script {
                stop_at: Some(|a| matches!(a, Action::Wait(Stage::OperatorActed { .. }))),
                ..Script::default()
            },
        ),
    ];
    for (case, mut script) in cases {
        script.reads = [Ok(fresh(&w))].into();
        let (actions, out) = run(&bounce_of(&w, &p), &p, script);
        let k = kinds(&actions);
        let request = k.iter().position(|a| *a == "request").expect(case);
        assert_eq!(
            k[request + 1..]
                .iter()
                .filter(|a| **a == "withdraw")
                .count(),
            1,
            "{case}: {k:?}"
        );
        assert!(out.status.halts(), "{case}: {:?}", out.status);
    }
}

#[test]
fn a_stop_during_a_rollout_ends_it_interrupted_and_marked() {
    let (p, w) = (policy("p", "web"), web(2));
    let script = Script {
        reads: [Ok(fresh(&w))].into(),
        stop_at: Some(|a| matches!(a, Action::Wait(Stage::Rollout { .. }))),
        ..Script::default()
    };
    let (actions, out) = run(&bounce_of(&w, &p), &p, script);
    assert_eq!(kinds(&actions), ["read", "patch", "wait-rollout", "mark"]);
    assert!(matches!(out.status, Status::Interrupted(_)));
    assert_eq!(final_mark(&actions), Some(AttemptOutcome::Interrupted));
}

#[test]
fn an_answer_to_another_action_fails_closed() {
    let (p, w) = (policy("p", "web"), web(2));
    let b = bounce_of(&w, &p);
    let limits = limits(&p, Duration::ZERO);
    let mut m = Machine::new(&b, limits);
    m.step(Observation::Begin, t(NOW), None);
    // A rollout's answer where the fresh read was asked for: the failure is told, nothing else.
    let a = m.step(Observation::RolledOut(Ok(())), t(NOW), None);
    assert!(
        matches!(&a, Action::Emit(e) if e.kind == EventKind::Failed),
        "{a:?}"
    );
    let a = m.step(Observation::Emitted, t(NOW), None);
    let Action::Done(out) = a else {
        panic!("expected the end, got {a:?}")
    };
    assert!(matches!(&out.status, Status::Failed(f) if f.code == FailureCode::Internal));
}

#[test]
fn the_bounce_targets_only_its_own_workload() {
    let (p, w) = (policy("p", "web"), web(2));
    let script = Script {
        reads: [Ok(fresh(&w)), Ok(fresh(&rolled(&w, WRITTEN)))].into(),
        ..Script::default()
    };
    let (actions, _) = run(&bounce_of(&w, &p), &p, script);
    let target = WorkloadRef {
        kind: Kind::Deployment,
        namespace: "shop".into(),
        name: "web".into(),
    };
    for a in &actions {
        let t = match a {
            Action::Read { target, .. }
            | Action::Patch { target, .. }
            | Action::Mark { target, .. }
            | Action::Emit(Event { target, .. }) => target,
            Action::Wait(Stage::Rollout { target, .. }) => target,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(t, &target);
    }
}

/// The API server refuses a write named for the UID the fresh read found (409): the name changed
/// hands in between. Nothing was written or disrupted, so it is a skip (`replaced`), which does
/// not halt the queue, not a failed bounce, for the restart patch and for a controller's mark
/// before its evictions alike.
#[test]
fn a_write_refused_for_its_uid_is_a_replaced_skip() {
    let mut w = web(2);
    w.uid = Some("0b6f1c2e-5d4a-4e8b-9c3d-7f2a1b0c9d8e".into());
    let conflict = || EdgeError::Conflict {
        message: "Precondition failed: UID in precondition".into(),
    };
    let rollout = policy("p", "web");
    let mut evict = rollout.clone();
    evict.restart.method = RestartMethod::Evict;
    let scripts = [
        (
            &rollout,
            Script {
                reads: [Ok(fresh(&w))].into(),
                patch: Some(Err(conflict())),
                ..Script::default()
            },
        ),
        (
            &evict,
            Script {
                reads: [Ok(fresh(&w))].into(),
                marks: [Err(conflict())].into(),
                ..Script::default()
            },
        ),
    ];
    for (p, script) in scripts {
        let (actions, out) = run(&bounce_of(&w, p), p, script);
        assert!(
            !actions.iter().any(|a| matches!(a, Action::Evict { .. })),
            "{actions:?}"
        );
        let want = SkipReason::Replaced {
            was: "0b6f1c2e-5d4a-4e8b-9c3d-7f2a1b0c9d8e".into(),
            now: None,
        };
        assert_eq!(out.status, Status::Skipped(want.clone()));
        assert_eq!(
            want.to_string(),
            "deleted and recreated since the fresh read: the API server refused the write for UID 0b6f1c2e-5d4a-4e8b-9c3d-7f2a1b0c9d8e, so nothing was written; the next run judges the new one"
        );
    }
}
