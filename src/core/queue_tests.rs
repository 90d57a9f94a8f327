//! The queue machine: one bounce at a time, halts, stops, groups, and earlier restarts confirmed.

use std::collections::BTreeMap;

use super::*;
use crate::core::action::Stage;
use crate::core::bounce::tests::{bounce_of, fresh, web};
use crate::core::model::Workload;
use crate::core::plan::tests::{NOW, OLD, deployment, pod, policy, t};
use crate::core::verify::Reverters;

const WRITTEN: &str = "2026-03-10T03:30:00Z";

fn named(ns: &str, name: &str, n: usize) -> Workload {
    let pods = (0..n)
        .map(|i| pod(&format!("{name}-{i}"), "web", OLD, Some(100)))
        .collect();
    deployment(ns, name, "web", pods)
}

/// A cluster where every workload rolls and verifies, but for the tweaks a test sets.
struct Fake {
    workloads: BTreeMap<String, Workload>,
    /// Workloads whose rollout times out.
    failing: Vec<String>,
    /// Reads of each workload so far.
    reads: BTreeMap<String, usize>,
    log: Vec<String>,
    stop_after_first: bool,
}

impl Fake {
    fn new(ws: &[Workload]) -> Fake {
        Fake {
            workloads: ws
                .iter()
                .map(|w| (w.target.name.clone(), w.clone()))
                .collect(),
            failing: vec![],
            reads: BTreeMap::new(),
            log: vec![],
            stop_after_first: false,
        }
    }

    fn answer(&mut self, a: &Action) -> Observation {
        let name = |t: &WorkloadRef| t.name.clone();
        match a {
            Action::Read { target, .. } => {
                let n = name(target);
                *self.reads.entry(n.clone()).or_default() += 1;
                let w = self.workloads[&n].clone();
                self.log.push(format!("read {n}"));
                Observation::Read(Ok(fresh(&w)))
            }
            Action::Patch { target, .. } => {
                let n = name(target);
                self.log.push(format!("patch {n}"));
                let w = self.workloads.get_mut(&n).unwrap();
                w.restarted_at = Some(t(WRITTEN));
                for p in &mut w.pods {
                    p.uid = format!("{}-new", p.uid).into();
                }
                Observation::Patched(Ok((WRITTEN.into(), "1".into())))
            }
            Action::Wait(Stage::Rollout { target, .. }) => {
                let n = name(target);
                if self.failing.contains(&n) {
                    Observation::RolledOut(Err(Failure::new(FailureCode::RolloutTimedOut, "slow")))
                } else {
                    Observation::RolledOut(Ok(()))
                }
            }
            Action::Mark { .. } => Observation::Marked(Ok(Some("2".into()))),
            Action::Emit(e) => {
                self.log
                    .push(format!("event {:?} {}", e.kind, e.target.name));
                Observation::Emitted
            }
            Action::FindReverters { .. } => Observation::Reverters(Reverters {
                managers: vec!["flux".into()],
                wrote_after: true,
            }),
            other => panic!("not scripted: {other:?}"),
        }
    }
}

fn run(bounces: &[Bounce], policies: &[Policy], fake: &mut Fake) -> Vec<Outcome> {
    let by_name: BTreeMap<&str, &Policy> = policies.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut q = Queue::new(bounces, &by_name, Duration::from_secs(600), Duration::ZERO);
    let mut seen = Observation::Begin;
    let mut stop = None;
    for _ in 0..500 {
        let a = q.step(seen, t(NOW), stop);
        if let Action::Finished = a {
            return q.outcomes();
        }
        seen = fake.answer(&a);
        if fake.stop_after_first && matches!(a, Action::Emit(_)) {
            stop = Some("SIGTERM");
        }
    }
    panic!("the queue did not finish: {:?}", fake.log);
}

fn statuses(outcomes: &[Outcome]) -> Vec<&'static str> {
    outcomes.iter().map(|o| o.status.code()).collect()
}

#[test]
fn bounces_run_one_at_a_time_in_plan_order() {
    let p = policy("p", "web");
    let ws = [named("a", "one", 2), named("a", "two", 2)];
    let bounces: Vec<_> = ws.iter().map(|w| bounce_of(w, &p)).collect();
    let mut fake = Fake::new(&ws);
    let out = run(&bounces, &[p], &mut fake);
    assert_eq!(statuses(&out), ["bounced", "bounced"]);
    let patches: Vec<_> = fake.log.iter().filter(|l| l.starts_with("patch")).collect();
    assert_eq!(patches, ["patch one", "patch two"]);
    // The second patch comes only after the first bounce's Event.
    let first_event = fake
        .log
        .iter()
        .position(|l| l.contains("Bounced one"))
        .unwrap();
    let second_patch = fake.log.iter().position(|l| l == "patch two").unwrap();
    assert!(first_event < second_patch, "{:?}", fake.log);
}

#[test]
fn a_failure_halts_the_queue() {
    let p = policy("p", "web");
    let ws = [named("a", "one", 2), named("a", "two", 2)];
    let bounces: Vec<_> = ws.iter().map(|w| bounce_of(w, &p)).collect();
    let mut fake = Fake::new(&ws);
    fake.failing.push("one".into());
    let out = run(&bounces, &[p], &mut fake);
    assert_eq!(statuses(&out), ["failed", "notAttempted"]);
    assert!(!fake.log.contains(&"patch two".to_string()));
}

#[test]
fn a_stop_between_bounces_interrupts_the_next_and_leaves_the_rest() {
    let p = policy("p", "web");
    let ws = [
        named("a", "one", 2),
        named("a", "two", 2),
        named("a", "three", 2),
    ];
    let bounces: Vec<_> = ws.iter().map(|w| bounce_of(w, &p)).collect();
    let mut fake = Fake::new(&ws);
    fake.stop_after_first = true;
    let out = run(&bounces, &[p], &mut fake);
    assert_eq!(statuses(&out), ["bounced", "interrupted", "notAttempted"]);
}

#[test]
fn an_earlier_restart_is_confirmed_before_the_next_one_starts() {
    let p = policy("p", "web");
    let ws = [named("a", "one", 2), named("a", "two", 2)];
    let bounces: Vec<_> = ws.iter().map(|w| bounce_of(w, &p)).collect();
    let mut fake = Fake::new(&ws);
    let out = run(&bounces, &[p], &mut fake);
    // Read before acting, the verification, then the confirmation: all before `two` starts.
    let second_patch = fake.log.iter().position(|l| l == "patch two").unwrap();
    let reads_before = fake.log[..second_patch]
        .iter()
        .filter(|l| *l == "read one")
        .count();
    assert_eq!(reads_before, 3, "{:?}", fake.log);
    assert!(out[0].last_confirmed.is_some());
}

/// Bounces `one` then `two`, `edit` applied to what the confirmation after `one`'s verification
/// (its second read without context) finds; the outcomes, and the cluster's log.
fn run_with_confirmation(edit: impl Fn(&mut Workload)) -> (Vec<Outcome>, Vec<String>) {
    let p = policy("p", "web");
    let ws = [named("a", "one", 2), named("a", "two", 2)];
    let bounces: Vec<_> = ws.iter().map(|w| bounce_of(w, &p)).collect();
    let by_name: BTreeMap<&str, &Policy> = [("p", &p)].into();
    let mut q = Queue::new(&bounces, &by_name, Duration::from_secs(600), Duration::ZERO);
    let mut fake = Fake::new(&ws);
    let mut seen = Observation::Begin;
    let mut reads_of_one = 0;
    let outcomes = loop {
        let a = q.step(seen, t(NOW), None);
        if let Action::Finished = a {
            break q.outcomes();
        }
        seen = fake.answer(&a);
        if let Action::Read {
            target,
            context: false,
            ..
        } = &a
            && target.name == "one"
        {
            reads_of_one += 1;
            if reads_of_one == 2
                && let Observation::Read(Ok(f)) = &mut seen
            {
                edit(&mut f.workload);
            }
        }
    };
    assert!(reads_of_one >= 2, "no confirmation read: {:?}", fake.log);
    (outcomes, fake.log)
}

#[test]
fn a_revert_found_by_the_confirmation_halts_the_rest() {
    // An owner took restartedAt away.
    let (outcomes, log) = run_with_confirmation(|w| w.restarted_at = None);
    assert_eq!(statuses(&outcomes), ["reverted", "notAttempted"]);
    assert!(!log.contains(&"patch two".to_string()), "{log:?}");
    assert!(log.iter().any(|l| l == "event Reverted one"));
}

/// A restart after the verified bounce (kubectl rollout restart) is not a revert: the bounce
/// stands, the note says so, and the queue goes on.
#[test]
fn a_later_restart_found_by_the_confirmation_is_no_revert() {
    let later = t(NOW) + chrono::TimeDelta::seconds(1);
    let (outcomes, log) = run_with_confirmation(|w| w.restarted_at = Some(later));
    assert_eq!(statuses(&outcomes), ["bounced", "bounced"]);
    assert!(log.contains(&"patch two".to_string()), "{log:?}");
    let note = outcomes[0].verification.as_deref().unwrap_or_default();
    assert!(note.contains("restarted again since"), "{note}");
}

#[test]
fn a_group_is_checked_whole_before_its_first_member_acts() {
    let mut p = policy("p", "web");
    p.group_by = Some("app".into());
    let backend = named("a", "backend", 1);
    let mut proxy = named("a", "proxy", 2);
    let mut group_bounces: Vec<_> = [&backend, &proxy]
        .iter()
        .map(|w| bounce_of(w, &p))
        .collect();
    let group = crate::core::group::Group {
        label: "app".into(),
        value: "web".into(),
    };
    for b in &mut group_bounces {
        b.group = Some(group.clone());
    }
    // The proxy was paused after the plan: the backend must not be bounced without it.
    proxy.paused = true;
    let mut fake = Fake::new(&[backend, proxy]);
    let out = run(&group_bounces, &[p], &mut fake);
    assert_eq!(statuses(&out), ["notAttempted", "skipped"]);
    assert!(
        !fake.log.iter().any(|l| l.starts_with("patch")),
        "{:?}",
        fake.log
    );
    assert_eq!(
        out[0].status,
        Status::NotAttempted(Some(out[1].target.clone()))
    );
}

#[test]
fn groups_of_the_same_label_in_two_namespaces_are_two_groups() {
    let mut p = policy("p", "web");
    p.group_by = Some("app".into());
    let mut held = named("a", "held", 1);
    let free = named("b", "free", 1);
    let group = crate::core::group::Group {
        label: "app".into(),
        value: "web".into(),
    };
    let mut bounces: Vec<_> = [&held, &free].iter().map(|w| bounce_of(w, &p)).collect();
    for b in &mut bounces {
        b.group = Some(group.clone());
    }
    held.paused = true;
    let mut fake = Fake::new(&[held, free]);
    let out = run(&bounces, &[p], &mut fake);
    assert_eq!(statuses(&out), ["skipped", "bounced"]);
}

#[test]
fn an_empty_plan_finishes_at_once() {
    let p = policy("p", "web");
    let mut fake = Fake::new(&[web(1)]);
    assert!(run(&[], &[p], &mut fake).is_empty());
}
