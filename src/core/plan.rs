//! The planner: a pure function from policies, inventory and `now` to an ordered plan in which
//! every workload a policy selects is either a bounce or a skip with its reason.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};

pub use crate::core::gates::{
    Route, admits, blocker, cooldown, identity_gates, oldest_start, safety,
};
use crate::core::group::{self, Group};
use crate::core::history::{Prometheus, QueryError};
use crate::core::in_flight::{LeftRequest, in_flight, left_requests};
use crate::core::literals::whole_seconds;
use crate::core::mark::{AttemptMark, AttemptOutcome};
use crate::core::memory::{self, Evaluation, MemoryReading, MemoryState};
pub use crate::core::model::Method;
use crate::core::model::{Inventory, Kind, Uid, Workload, WorkloadRef};
use crate::core::overrides;
use crate::core::policy::{OnRevert, Policy};
use crate::core::reasons::{NotDue, SkipReason, Trigger};
use crate::core::schedule::{Schedule, ScheduleVerdict};
use crate::core::trend::{self, HistoryVerdicts};

#[derive(Debug, Clone)]
pub struct Bounce {
    pub policy: String,
    pub target: WorkloadRef,
    pub method: Method,
    /// Why the pods are evicted where the template would have been restarted: a restart
    /// another manager would undo (`onRevert: evict`).
    pub instead: Option<SkipReason>,
    pub triggers: Vec<Trigger>,
    pub pods: usize,
    pub memory: Option<MemoryReading>,
    /// The restart group it is bounced with, if its policy groups.
    pub group: Option<Group>,
    /// The restartedAt annotation the plan saw; a different one before acting means someone
    /// else restarted the workload meanwhile.
    pub seen_restarted_at: Option<DateTime<Utc>>,
    /// The object the plan judged; another UID before acting means it was deleted and
    /// recreated under its name meanwhile.
    pub seen_uid: Option<Uid>,
    pub timeout: Option<Duration>,
    pub on_revert: OnRevert,
    pub allow_downtime: bool,
    pub cooldown: Duration,
}

#[derive(Debug, Clone)]
pub struct Skip {
    pub policy: String,
    pub target: WorkloadRef,
    pub pods: usize,
    pub memory: Option<MemoryReading>,
    pub group: Option<Group>,
    pub reason: SkipReason,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub now: DateTime<Utc>,
    /// In execution order.
    pub bounces: Vec<Bounce>,
    /// What the dry-run policies (`spec.dryRun`) would bounce, in the order they would go; the
    /// executor never sees these.
    pub dry_run: Vec<Bounce>,
    pub skips: Vec<Skip>,
    pub metrics_unavailable: Option<String>,
    /// Names of the loaded policies with `spec.dryRun` and `spec.suspend`.
    pub dry_run_policies: BTreeSet<String>,
    pub suspended_policies: BTreeSet<String>,
    /// Restart requests interrupted runs left unanswered on MCPServers past their timeout: a
    /// run withdraws them before its first bounce (their workloads are skipped, `requestLeft`).
    pub left_requests: Vec<LeftRequest>,
}

#[derive(Debug, Clone)]
pub struct Limits {
    /// Global cap on bounces per run (`--max-bounces`).
    pub max_bounces: usize,
    /// A bounce's timeout where its policy sets none (`--rollout-timeout`): how long a bounce an
    /// earlier run left in flight holds the queue back.
    pub rollout_timeout: Duration,
}

impl Limits {
    /// `--max-bounces` with the default `--rollout-timeout` (10m).
    pub fn max_bounces(max_bounces: usize) -> Limits {
        Limits {
            max_bounces,
            rollout_timeout: Duration::from_secs(600),
        }
    }
}

struct Candidate {
    bounce: Bounce,
    urgency: Option<f64>,
    oldest: Option<DateTime<Utc>>,
}

/// What the caps count as one: a workload, or a restart group with its members in order.
struct Unit {
    members: Vec<Bounce>,
    urgency: Option<f64>,
    oldest: Option<DateTime<Utc>>,
}

impl Unit {
    fn of(candidates: Vec<Candidate>) -> Unit {
        Unit {
            urgency: candidates.iter().filter_map(|c| c.urgency).reduce(f64::max),
            oldest: candidates.iter().filter_map(|c| c.oldest).min(),
            members: candidates.into_iter().map(|c| c.bounce).collect(),
        }
    }
}

/// Decides the whole run without Prometheus (history triggers off, blockers block).
pub fn plan(
    policies: &[Policy],
    inventory: &Inventory,
    now: DateTime<Utc>,
    limits: &Limits,
) -> Plan {
    let off = Prometheus::off(QueryError::NotConfigured);
    plan_with(policies, inventory, &off, now, limits)
}

/// Decides the whole run. Policies are visited by name so the result is deterministic.
pub fn plan_with(
    policies: &[Policy],
    inventory: &Inventory,
    prometheus: &Prometheus,
    now: DateTime<Utc>,
    limits: &Limits,
) -> Plan {
    let mut policies: Vec<&Policy> = policies.iter().collect();
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    let metrics_unavailable = match &inventory.metrics {
        crate::core::model::MetricsState::Available => None,
        crate::core::model::MetricsState::Unavailable(why) => Some(why.clone()),
    };

    let mut units = Vec::new();
    let mut skips = Vec::new();
    for policy in &policies {
        if policy.suspend {
            let selected = inventory.workloads.iter().filter(|w| selects(policy, w));
            skips.extend(selected.map(|w| skip(policy, w, None, SkipReason::Suspended)));
            continue;
        }
        // Each decision goes to its unit or skip at once (only restart groups' members wait
        // for the rest of their group): the decisions are never all held twice.
        let mut groups = Groups::new();
        for workload in &inventory.workloads {
            if !selects(policy, workload) {
                continue;
            }
            let decision = decision(policy, workload, inventory, prometheus, now);
            route(
                policy,
                (workload, decision),
                &mut groups,
                &mut units,
                &mut skips,
            );
        }
        group_units(policy, groups, inventory, now, &mut units, &mut skips);
        for pod in &inventory.unsupported {
            let in_scope =
                policy.namespaces.is_empty() || policy.namespaces.contains(&pod.namespace);
            if in_scope && policy.selector.matches(&pod.labels) {
                skips.push(Skip {
                    policy: policy.name.clone(),
                    target: WorkloadRef {
                        kind: Kind::Pod,
                        namespace: pod.namespace.clone(),
                        name: pod.pod.clone(),
                    },
                    pods: 1,
                    memory: None,
                    group: None,
                    reason: SkipReason::UnsupportedOwner {
                        kind: pod.owner_kind.clone(),
                        name: pod.owner_name.clone(),
                    },
                });
            }
        }
    }

    // Most urgent first: highest memory/threshold ratio, then the oldest pods, then by name.
    units.sort_by(|a, b| {
        let (x, y) = (&a.members[0], &b.members[0]);
        b.urgency
            .unwrap_or(0.0)
            .total_cmp(&a.urgency.unwrap_or(0.0))
            .then_with(|| cmp_oldest(a.oldest, b.oldest))
            .then_with(|| x.target.namespace.cmp(&y.target.namespace))
            .then_with(|| x.target.name.cmp(&y.target.name))
            .then_with(|| x.policy.cmp(&y.policy))
    });

    // Armed policies take their places first: a dry-run policy never holds back a bounce, and
    // its would-be bounces are capped on counts of their own.
    let dry: BTreeSet<String> = policies
        .iter()
        .filter(|p| p.dry_run)
        .map(|p| p.name.clone())
        .collect();
    let (dry_units, units): (Vec<Unit>, Vec<Unit>) = units
        .into_iter()
        .partition(|u| dry.contains(&u.members[0].policy));
    let mut chosen = BTreeMap::new();
    let mut bounces = cap(units, &policies, limits, &mut chosen, &mut skips);
    // A rollout an earlier run started and never saw through is still going: starting another
    // beside it would put two workloads' pods in flight at once.
    let marked = || {
        inventory.workloads.iter().filter_map(|w| {
            let name = &w.attempt.latest()?.policy;
            let p = policies.iter().find(|p| &p.name == name && selects(p, w))?;
            Some((w, *p))
        })
    };
    let left = left_requests(marked(), limits.rollout_timeout, now);
    for l in &left {
        let reason = SkipReason::RequestLeft {
            server: format!("{}/{}", l.target.namespace, l.server.name),
            since: l.attempt.time,
        };
        let (held, go): (Vec<Bounce>, Vec<Bounce>) =
            bounces.drain(..).partition(|b| b.target == l.target);
        bounces = go;
        skips.extend(held.into_iter().map(|b| skip_of(b, reason.clone())));
        for s in skips.iter_mut().filter(|s| s.target == l.target) {
            s.reason = reason.clone();
        }
    }
    if let Some(f) = in_flight(marked(), limits.rollout_timeout, now) {
        let reason = SkipReason::InFlight {
            target: f.target,
            since: f.since,
            until: f.until,
        };
        skips.extend(bounces.drain(..).map(|b| skip_of(b, reason.clone())));
    }
    let dry_run = cap(dry_units, &policies, limits, &mut chosen, &mut skips);
    skips.sort_by(|a, b| (&a.target, &a.policy).cmp(&(&b.target, &b.policy)));
    Plan {
        now,
        bounces,
        dry_run,
        skips,
        metrics_unavailable,
        dry_run_policies: dry,
        suspended_policies: policies
            .iter()
            .filter(|p| p.suspend)
            .map(|p| p.name.clone())
            .collect(),
        left_requests: left,
    }
}

/// Takes units in order while the caps allow: a workload is bounced by one policy per run (the
/// first to take it; `chosen` carries the armed policies' choices into the dry-run pass), a
/// policy's `maxPerRun` and the run's `--max-bounces` count units.
fn cap(
    units: Vec<Unit>,
    policies: &[&Policy],
    limits: &Limits,
    chosen: &mut BTreeMap<WorkloadRef, (String, bool)>,
    skips: &mut Vec<Skip>,
) -> Vec<Bounce> {
    let mut bounces: Vec<Bounce> = Vec::new();
    let mut slots = 0;
    let mut per_policy: BTreeMap<String, u32> = BTreeMap::new();
    let by_name: BTreeMap<&str, &Policy> = policies.iter().map(|p| (p.name.as_str(), *p)).collect();
    for unit in units {
        let policy = unit.members[0].policy.clone();
        let claimed = unit
            .members
            .iter()
            .find_map(|b| Some((b.target.clone(), chosen.get(&b.target)?.clone())));
        let reason = if let Some((member, (by, dry))) = claimed {
            let reason = if dry {
                SkipReason::ClaimedInDryRun { policy: by }
            } else {
                SkipReason::Claimed { policy: by }
            };
            Some((Some(member), reason))
        } else if let Some(max) = by_name[policy.as_str()]
            .max_per_run
            .filter(|max| per_policy.get(&policy).copied().unwrap_or(0) >= *max)
        {
            Some((None, SkipReason::PolicyCap { max }))
        } else if slots >= limits.max_bounces {
            let max = limits.max_bounces;
            Some((None, SkipReason::GlobalCap { max }))
        } else {
            None
        };
        match reason {
            Some((member, reason)) => skips.extend(unit.members.into_iter().map(|b| {
                let reason = match &member {
                    Some(m) if *m != b.target => SkipReason::GroupHeld {
                        member: m.clone(),
                        reason: Box::new(reason.clone()),
                    },
                    _ => reason.clone(),
                };
                skip_of(b, reason)
            })),
            None => {
                slots += 1;
                let dry = by_name[policy.as_str()].dry_run;
                *per_policy.entry(policy).or_default() += 1;
                for b in unit.members {
                    chosen.insert(b.target.clone(), (b.policy.clone(), dry));
                    bounces.push(b);
                }
            }
        }
    }
    bounces
}

fn candidate(
    policy: &Policy,
    w: &Workload,
    route: Route,
    triggers: Vec<Trigger>,
    reading: Option<MemoryReading>,
    urgency: Option<f64>,
) -> Candidate {
    Candidate {
        bounce: Bounce {
            policy: policy.name.clone(),
            target: w.target.clone(),
            method: route.method,
            instead: route.instead,
            triggers,
            pods: w.pods.len(),
            memory: reading,
            group: group::of(policy, w),
            seen_restarted_at: w.restarted_at,
            seen_uid: w.uid.clone(),
            timeout: policy.restart.timeout,
            on_revert: policy.restart.on_revert,
            allow_downtime: policy.allow_downtime,
            cooldown: policy.cooldown,
        },
        urgency,
        oldest: oldest_start(w),
    }
}

/// One policy's decision on one workload it selects: a bounce candidate, or a skip with its
/// reason. A skip is a result, not an error on its way up: boxing it would cost an allocation
/// per skipped workload, most rows of a large plan.
#[allow(clippy::result_large_err)]
fn decision(
    policy: &Policy,
    workload: &Workload,
    inventory: &Inventory,
    prometheus: &Prometheus,
    now: DateTime<Utc>,
) -> Result<Candidate, Skip> {
    // The opt-outs come first: an excluded workload is reported excluded, whatever its override
    // annotations say.
    let policy = identity_gates(policy, workload, &inventory.excluded_namespaces)
        .and_then(|()| overrides::effective(policy, workload))
        .map_err(|reason| skip(policy, workload, None, reason))?;
    let (reading, memory) = memory::assess(
        policy.memory.as_ref(),
        &policy.windows,
        workload,
        &inventory.metrics,
        now,
    );
    let history = trend::assess_history(
        policy.memory.as_ref(),
        &policy.windows,
        workload,
        &prometheus.history,
        now,
    );
    match decide(
        &policy,
        workload,
        (memory, history),
        inventory,
        prometheus,
        now,
    ) {
        Ok((route, triggers, urgency)) => Ok(candidate(
            &policy, workload, route, triggers, reading, urgency,
        )),
        Err(reason) => Err(skip(&policy, workload, reading, reason)),
    }
}

fn skip(policy: &Policy, w: &Workload, reading: Option<MemoryReading>, reason: SkipReason) -> Skip {
    Skip {
        policy: policy.name.clone(),
        target: w.target.clone(),
        pods: w.pods.len(),
        memory: reading,
        group: group::of(policy, w),
        reason,
    }
}

fn skip_of(b: Bounce, reason: SkipReason) -> Skip {
    Skip {
        policy: b.policy,
        target: b.target,
        pods: b.pods,
        memory: b.memory,
        group: b.group,
        reason,
    }
}

type Decided<'a> = (&'a Workload, Result<Candidate, Skip>);

/// One policy's restart groups (by namespace) and their members' decisions.
type Groups<'a> = BTreeMap<(String, Group), Vec<Decided<'a>>>;

/// A workload outside any group is its own unit (or skip); a group's member waits in `groups`
/// for [`group_units`].
fn route<'a>(
    policy: &Policy,
    (w, decision): Decided<'a>,
    groups: &mut Groups<'a>,
    units: &mut Vec<Unit>,
    skips: &mut Vec<Skip>,
) {
    let member = group::of(policy, w)
        .filter(|_| !matches!(&decision, Err(s) if group::leaves_out(&s.reason)));
    match (member, decision) {
        (Some(g), decision) => groups
            .entry((w.target.namespace.clone(), g))
            .or_default()
            .push((w, decision)),
        (None, Ok(c)) => units.push(Unit::of(vec![c])),
        (None, Err(s)) => skips.push(s),
    }
}

/// Turns one policy's restart groups into units: a group is a unit when one of its members is
/// due and every other member could be bounced now (a member that is not due joins the
/// bounce), and is skipped as a whole, naming the member that holds it, otherwise.
fn group_units(
    policy: &Policy,
    groups: Groups,
    inv: &Inventory,
    now: DateTime<Utc>,
    units: &mut Vec<Unit>,
    skips: &mut Vec<Skip>,
) {
    for (_, mut members) in groups {
        members.sort_by(|(a, _), (b, _)| {
            (group::rank(a.target.kind), &a.target.name)
                .cmp(&(group::rank(b.target.kind), &b.target.name))
        });
        // A group a run left half restarted is finished first: its bounced members (now in
        // their cooldown) leave it, and the members not restarted since are due with them.
        let started = unfinished(policy, &members, now);
        if let Some((_, at)) = &started {
            let (finished, rest): (Vec<_>, Vec<_>) = members.into_iter().partition(|(w, d)| {
                d.is_err() && bounced_at(policy, w).is_some_and(|t| t >= *at - GROUP_SPAN)
            });
            skips.extend(finished.into_iter().filter_map(|(_, d)| d.err()));
            members = rest;
        }
        let due = members
            .iter()
            .find_map(|(_, d)| Some(d.as_ref().ok()?.bounce.target.clone()))
            .or(started.map(|(member, _)| member));
        let Some(due) = due.filter(|_| !members.is_empty()) else {
            skips.extend(members.into_iter().filter_map(|(_, d)| d.err()));
            continue;
        };
        let mut held: Option<(WorkloadRef, SkipReason)> = None;
        let mut joined = Vec::new();
        for (w, decision) in members {
            let decision = match decision {
                Err(s) if matches!(s.reason, SkipReason::NotDue(_)) => {
                    let joins = overrides::effective(policy, w).and_then(|p| {
                        cooldown(&p, w, now)?;
                        Ok((crate::core::gates::route(&p, w, &inv.pdbs, now)?, p))
                    });
                    match joins {
                        Ok((way, p)) => {
                            let triggers = vec![Trigger::Group { due: due.clone() }];
                            Ok(candidate(&p, w, way, triggers, s.memory, None))
                        }
                        Err(reason) => Err(Skip { reason, ..s }),
                    }
                }
                other => other,
            };
            if let Err(s) = &decision {
                held.get_or_insert_with(|| (s.target.clone(), s.reason.clone()));
            }
            joined.push(decision);
        }
        let Some((member, reason)) = held else {
            units.push(Unit::of(joined.into_iter().flatten().collect()));
            continue;
        };
        skips.extend(joined.into_iter().map(|d| match d {
            Err(s) if s.target == member => s,
            d => {
                let reason = SkipReason::GroupHeld {
                    member: member.clone(),
                    reason: Box::new(reason.clone()),
                };
                match d {
                    Ok(c) => skip_of(c.bounce, reason),
                    Err(s) => Skip { reason, ..s },
                }
            }
        }));
    }
}

/// How far apart the members of one group's bounce may be marked (one run bounces them one
/// after the other, each within its timeout).
const GROUP_SPAN: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// When this policy's last bounce of `w` that restarted every pod began, from its mark (a
/// verified rollout's mark stays `started`: its pods, all newer than it, tell the rest).
fn bounced_at(policy: &Policy, w: &Workload) -> Option<DateTime<Utc>> {
    let AttemptMark::Seen(history) = &w.attempt else {
        return None;
    };
    let a = history.latest()?;
    let restarted = match a.outcome {
        AttemptOutcome::Bounced => true,
        // Pods of the old template may still be terminating: only the live ones tell. A pod's
        // start is written in whole seconds, the mark to the millisecond.
        AttemptOutcome::Started => w
            .pods
            .iter()
            .filter(|p| !p.deleting)
            .map(|p| p.started)
            .min()
            .flatten()
            .is_some_and(|t| t >= whole_seconds(a.time)),
        _ => false,
    };
    (a.policy == policy.name && restarted).then_some(a.time)
}

/// A group left half restarted: a member this policy bounced within its cooldown (not due
/// again by itself) and the time of that bounce, when another member has not been restarted
/// since.
fn unfinished(
    policy: &Policy,
    members: &[Decided],
    now: DateTime<Utc>,
) -> Option<(WorkloadRef, DateTime<Utc>)> {
    let cooldown = chrono::TimeDelta::from_std(policy.cooldown).unwrap_or(chrono::TimeDelta::MAX);
    let (member, at) = members
        .iter()
        .filter(|(_, d)| d.is_err())
        .filter_map(|(w, _)| Some((w.target.clone(), bounced_at(policy, w)?)))
        .filter(|(_, at)| now < *at + cooldown)
        .max_by_key(|(_, at)| *at)?;
    let restarted = |w: &Workload| {
        [w.restarted_at, oldest_start(w)]
            .into_iter()
            .flatten()
            .max()
    };
    let left = members.iter().any(|(w, _)| {
        bounced_at(policy, w).is_none_or(|t| t < at - GROUP_SPAN)
            && restarted(w).is_some_and(|r| r < whole_seconds(at))
    });
    left.then_some((member, at))
}

/// A workload is selected when its pod template (or any of its pods) carries matching labels.
pub fn selects(policy: &Policy, w: &Workload) -> bool {
    let in_scope = policy.namespaces.is_empty() || policy.namespaces.contains(&w.target.namespace);
    in_scope
        && (policy.selector.matches(&w.template_labels)
            || w.pods.iter().any(|p| policy.selector.matches(&p.labels)))
}

type Decision = (Route, Vec<Trigger>, Option<f64>);

fn decide(
    policy: &Policy,
    w: &Workload,
    memory: (Option<Evaluation>, HistoryVerdicts),
    inv: &Inventory,
    prometheus: &Prometheus,
    now: DateTime<Utc>,
) -> Result<Decision, SkipReason> {
    admits(policy, w, &inv.excluded_namespaces)?;
    let (triggers, urgency) = match triggers(policy, w, memory, now) {
        // A fire held back only by our own recent attempt reads as the cooldown while that
        // lasts (the reason names the attempt's time); after it, the fire stays attempted.
        Err(SkipReason::NotDue(n))
            if matches!(n.schedule, Some(ScheduleVerdict::AlreadyAttempted { .. })) =>
        {
            crate::core::gates::since_restart(policy, w, now)?;
            return Err(SkipReason::NotDue(n));
        }
        other => other?,
    };
    let route = safety(policy, w, &inv.pdbs, prometheus, now)?;
    Ok((route, triggers, urgency))
}

fn triggers(
    policy: &Policy,
    w: &Workload,
    (eval, history): (Option<Evaluation>, HistoryVerdicts),
    now: DateTime<Utc>,
) -> Result<(Vec<Trigger>, Option<f64>), SkipReason> {
    let mut fired = history.fired;
    let mut not_due = NotDue {
        history: history.waiting,
        ..NotDue::default()
    };
    let urgency = eval.as_ref().and_then(|e| e.ratio);
    if let Some(eval) = eval {
        match eval.state {
            MemoryState::Over {
                pod,
                usage,
                threshold,
            } => fired.push(Trigger::Memory {
                pod,
                usage,
                threshold,
            }),
            other => not_due.memory = Some(other),
        }
    }
    if let Some(schedule) = &policy.schedule {
        match schedule_verdict(schedule, w, now) {
            ScheduleVerdict::Due { fired: at } => fired.push(Trigger::Schedule { fired: at }),
            verdict => {
                not_due.schedule = Some(verdict);
                not_due.next = schedule.next_fire(now);
            }
        }
    }
    if fired.is_empty() {
        Err(SkipReason::NotDue(not_due))
    } else {
        Ok((fired, urgency))
    }
}

/// The schedule's verdict for `w`, with bouncer's own mark at or after the fire making it
/// attempted (it failed, or left pods old): a fire is not attempted again, whatever the cooldown.
pub fn schedule_verdict(schedule: &Schedule, w: &Workload, now: DateTime<Utc>) -> ScheduleVerdict {
    match schedule.verdict(now, oldest_start(w)) {
        ScheduleVerdict::Due { fired } if w.attempt.time().is_some_and(|t| t >= fired) => {
            ScheduleVerdict::AlreadyAttempted {
                fired,
                at: w.attempt.time().unwrap_or(fired),
            }
        }
        verdict => verdict,
    }
}

fn cmp_oldest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> std::cmp::Ordering {
    match (a, b) {
        (Some(a), Some(b)) => a.cmp(&b),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
pub(crate) mod tests;

#[cfg(test)]
#[path = "group_tests.rs"]
mod group_tests;

#[cfg(test)]
#[path = "overrides_tests.rs"]
mod overrides_tests;

#[cfg(test)]
#[path = "plan_prometheus_tests.rs"]
mod prometheus_tests;

#[cfg(test)]
#[path = "breaker_plan_tests.rs"]
mod breaker_plan_tests;

#[cfg(test)]
#[path = "dry_run_tests.rs"]
mod dry_run_tests;
