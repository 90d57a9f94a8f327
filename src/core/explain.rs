//! `bouncer explain`: for one workload, every policy that selects it, each trigger, gate and the
//! cooldown with their numbers, and the decision. Built from the planner's own functions and the
//! plan itself, so the explanation cannot drift from what a run would do.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::core::gates::{identity_gates, preflight, since_restart};
use crate::core::gitops::GitOps;
use crate::core::group;
use crate::core::history::Prometheus;
use crate::core::literals::rfc3339;
use crate::core::mark::AttemptMark;
use crate::core::memory;
use crate::core::model::{Inventory, Kind, Workload, WorkloadRef};
use crate::core::overrides;
use crate::core::plan::{Plan, blocker, schedule_verdict, selects};
use crate::core::policy::{Policy, Threshold};
use crate::core::quantity::format_bytes;
use crate::core::reasons::{memory_text, schedule_text};
use crate::core::trend;

/// Why a `KIND/NAMESPACE/NAME` target was refused; each message starts with the target as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("{text:?}: expected KIND/NAMESPACE/NAME, e.g. deploy/toolhive-system/vmcp-main")]
    Shape { text: String },
    #[error("{text:?}: unknown kind {kind:?} (deploy, sts, ds or pod)")]
    UnknownKind { text: String, kind: String },
    #[error("{text:?}: the namespace and the name must not be empty")]
    Empty { text: String },
}

/// Parses `KIND/NAMESPACE/NAME` as kubectl spells kinds: `deploy`, `deployment(s)`, `sts`,
/// `statefulset(s)`, `ds`, `daemonset(s)`, `po`, `pod(s)`, any case.
pub fn parse_target(text: &str) -> Result<WorkloadRef, TargetError> {
    let parts: Vec<&str> = text.split('/').collect();
    let [kind, namespace, name] = parts.as_slice() else {
        return Err(TargetError::Shape { text: text.into() });
    };
    let kind = match kind.to_ascii_lowercase().as_str() {
        "deploy" | "deployment" | "deployments" => Kind::Deployment,
        "sts" | "statefulset" | "statefulsets" => Kind::StatefulSet,
        "ds" | "daemonset" | "daemonsets" => Kind::DaemonSet,
        "po" | "pod" | "pods" => Kind::Pod,
        other => {
            return Err(TargetError::UnknownKind {
                text: text.into(),
                kind: other.into(),
            });
        }
    };
    if namespace.is_empty() || name.is_empty() {
        return Err(TargetError::Empty { text: text.into() });
    }
    Ok(WorkloadRef {
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub workload: WorkloadRef,
    pub generated_at: String,
    pub pods: usize,
    /// How many policies were loaded; `policies` lists those that select the workload.
    pub policies_loaded: usize,
    pub policies: Vec<PolicyExplanation>,
    /// What a run now would do with it, over all policies.
    pub decision: String,
    /// The GitOps controller that manages it and whether a restart will hold
    /// ([`gitops::assess`](crate::core::gitops::assess)); None when none does or it was not read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gitops: Option<GitOps>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyExplanation {
    pub policy: String,
    pub source: String,
    pub steps: Vec<Step>,
    /// `bounce` or `skip`, as in the report.
    pub decision: String,
    /// The skip's reasonCode; None for a bounce.
    pub reason_code: Option<String>,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub step: &'static str,
    pub result: Outcome,
    pub detail: String,
}

/// `pass`: the step allows a bounce; `fail`: it stops one; `fired`/`notFired`: a trigger;
/// `info`: context only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    Pass,
    Fail,
    Fired,
    NotFired,
    Info,
}

/// Explains `target` under `policies`; `plan` is the planner's result over the same inventory
/// and `now`. None when the inventory does not hold the workload.
pub fn explain(
    target: &WorkloadRef,
    policies: &[Policy],
    inventory: &Inventory,
    prometheus: &Prometheus,
    plan: &Plan,
) -> Option<Explanation> {
    let w = inventory.workloads.iter().find(|w| &w.target == target)?;
    let now = plan.now;
    let mut selecting: Vec<&Policy> = policies.iter().filter(|p| selects(p, w)).collect();
    selecting.sort_by(|a, b| a.name.cmp(&b.name));
    let explained: Vec<PolicyExplanation> = selecting
        .iter()
        .map(|p| policy_explanation(p, w, (inventory, prometheus), plan, now))
        .collect();
    let decision = match plan.bounces.iter().position(|b| &b.target == target) {
        Some(i) => format!(
            "bounce #{} of {} by policy {}",
            i + 1,
            plan.bounces.len(),
            plan.bounces[i].policy
        ),
        None if explained.is_empty() => "not selected by any policy: never bounced".into(),
        None => "not bounced by this run".into(),
    };
    Some(Explanation {
        workload: target.clone(),
        generated_at: rfc3339(now),
        pods: w.pods.len(),
        policies_loaded: policies.len(),
        policies: explained,
        decision,
        gitops: None,
    })
}

fn step(step: &'static str, result: Outcome, detail: impl Into<String>) -> Step {
    Step {
        step,
        result,
        detail: detail.into(),
    }
}

fn gate<T>(name: &'static str, r: &Result<T, impl ToString>, ok: impl Into<String>) -> Step {
    match r {
        Ok(_) => step(name, Outcome::Pass, ok),
        Err(e) => step(name, Outcome::Fail, e.to_string()),
    }
}

fn policy_explanation(
    base: &Policy,
    w: &Workload,
    (inv, prometheus): (&Inventory, &Prometheus),
    plan: &Plan,
    now: DateTime<Utc>,
) -> PolicyExplanation {
    let mut steps = vec![step(
        "selected",
        Outcome::Info,
        format!("selector {} matches its pods", base.selector),
    )];
    let gates = identity_gates(base, w, &inv.excluded_namespaces);
    steps.push(gate(
        "opt-outs",
        &gates,
        format!(
            "not excluded; {} is one of the policy's kinds",
            w.target.kind
        ),
    ));
    let effective = overrides::effective(base, w);
    let overridden = matches!(effective, Ok(std::borrow::Cow::Owned(_)));
    steps.push(gate(
        "overrides",
        &effective,
        if overridden {
            "the workload's annotations set its threshold or cooldown"
        } else {
            "none"
        },
    ));
    let policy = effective
        .map(|p| p.into_owned())
        .unwrap_or_else(|_| base.clone());

    if let Some(trigger) = &policy.memory {
        let (reading, eval) = memory::assess(Some(trigger), &policy.windows, w, &inv.metrics, now);
        let threshold = match trigger.threshold {
            Some(Threshold::Bytes(b)) => format!("above {}", format_bytes(b)),
            Some(Threshold::PercentOfLimit(p)) => format!("{p}% of the memory limit"),
            None => "none, history triggers only".into(),
        };
        // A trigger with only history rules (sustained replaces the one-sample threshold) has
        // no one-sample reading: its steps follow.
        let (result, text) = match eval.map(|e| e.state) {
            Some(state @ memory::MemoryState::Over { .. }) => (Outcome::Fired, memory_text(&state)),
            Some(state) => (Outcome::NotFired, memory_text(&state)),
            None => (Outcome::Info, "no one-sample threshold".to_string()),
        };
        let missing = reading
            .as_ref()
            .filter(|r| r.missing > 0)
            .map(|r| format!("; {} pod(s) without metrics", r.missing))
            .unwrap_or_default();
        steps.push(step(
            "memory",
            result,
            format!("{text} (threshold: {threshold}{missing})"),
        ));
    }
    let history = trend::assess_history(
        policy.memory.as_ref(),
        &policy.windows,
        w,
        &prometheus.history,
        now,
    );
    // One name per history rule, whether it fired or waits.
    let rule = |name: &str| match name {
        "memorySustained" | "sustained" => "memory.sustained",
        "memoryGrowth" | "growth" => "memory.growth",
        "memoryPredict" | "predict" => "memory.predict",
        _ => "memory.history",
    };
    for t in &history.fired {
        steps.push(step(rule(t.code()), Outcome::Fired, t.to_string()));
    }
    for waiting in &history.waiting {
        let detail = waiting.detail.clone();
        steps.push(step(rule(waiting.trigger), Outcome::NotFired, detail));
    }
    if policy.block_when.is_some() {
        steps.push(gate(
            "blockWhen",
            &blocker(&policy, prometheus),
            "the query has no results",
        ));
    }
    if let Some(schedule) = &policy.schedule {
        let verdict = schedule_verdict(schedule, w, now);
        let fired = matches!(verdict, crate::core::schedule::ScheduleVerdict::Due { .. });
        let next = schedule
            .next_fire(now)
            .map(|t| format!("; next fire {}", rfc3339(t)))
            .unwrap_or_default();
        steps.push(step(
            "schedule",
            if fired {
                Outcome::Fired
            } else {
                Outcome::NotFired
            },
            format!("{}{next}", schedule_text(&verdict)),
        ));
    }
    steps.push(match &w.attempt {
        AttemptMark::None => step("last attempt", Outcome::Info, "none recorded"),
        AttemptMark::Seen(h) => {
            let earlier = h.entries().count().saturating_sub(1);
            let (failures, _) = crate::core::breaker::failures(h);
            step(
                "last attempt",
                Outcome::Info,
                match h.latest() {
                    Some(a) => {
                        let mut text = format!(
                            "{} by policy {} (method {}, outcome {})",
                            rfc3339(a.time),
                            a.policy,
                            format!("{:?}", a.method).to_lowercase(),
                            format!("{:?}", a.outcome).to_lowercase()
                        );
                        if earlier > 0 {
                            text.push_str(&format!("; {earlier} earlier kept"));
                        }
                        if failures > 0 {
                            text.push_str(&format!("; {failures} failed in a row"));
                        }
                        text
                    }
                    None => "none recorded".to_string(),
                },
            )
        }
        AttemptMark::Unreadable(e) => step("last attempt", Outcome::Fail, e.clone()),
    });
    steps.push(gate(
        "cooldown",
        &since_restart(&policy, w, now),
        format!(
            "{} since the last restart or attempt has passed",
            humantime::format_duration(policy.cooldown)
        ),
    ));
    steps.push(gate(
        "past attempts",
        &crate::core::breaker::gates(&policy, w, now),
        match &policy.breaker {
            Some(b) => format!(
                "not backing off after failures; fewer than {} bounces within {} (breaker)",
                b.max_bounces,
                humantime::format_duration(b.per)
            ),
            None => "not backing off after failures; no breaker".to_string(),
        },
    ));
    let preflight = preflight(&policy, w, &inv.pdbs);
    let method = preflight
        .as_ref()
        .map(|m| format!("ready to bounce by {m:?}").to_lowercase())
        .unwrap_or_default();
    steps.push(gate("pre-flight", &preflight, method));
    if policy.group_by.is_some() {
        steps.push(step(
            "group",
            Outcome::Info,
            match group::of(&policy, w) {
                Some(g) => format!("{g}: bounced with the other workloads of its group"),
                None => "no group label: bounced alone".into(),
            },
        ));
    }

    let (decision, reason_code, reason) = match plan
        .bounces
        .iter()
        .position(|b| b.target == w.target && b.policy == base.name)
    {
        Some(i) => {
            let b = &plan.bounces[i];
            let triggers: Vec<String> = b.triggers.iter().map(ToString::to_string).collect();
            (
                "bounce".to_string(),
                None,
                format!("#{} in the queue; {}", i + 1, triggers.join("; ")),
            )
        }
        None => match plan
            .skips
            .iter()
            .find(|s| s.target == w.target && s.policy == base.name)
        {
            Some(s) => (
                "skip".to_string(),
                Some(s.reason.code().to_string()),
                s.reason.to_string(),
            ),
            None => ("skip".to_string(), None, "not in the plan".to_string()),
        },
    };
    PolicyExplanation {
        policy: base.name.clone(),
        source: base.source.clone(),
        steps,
        decision,
        reason_code,
        reason,
    }
}

/// The explanation as text, one line per step.
pub fn text(e: &Explanation) -> String {
    let mut out = format!(
        "{}: {} pod(s); selected by {} of {} policies ({})\n",
        e.workload,
        e.pods,
        e.policies.len(),
        e.policies_loaded,
        e.generated_at
    );
    for p in &e.policies {
        out.push_str(&format!("\npolicy {} ({})\n", p.policy, p.source));
        for s in &p.steps {
            let mark = match s.result {
                Outcome::Pass => "ok",
                Outcome::Fail => "NO",
                Outcome::Fired => "fired",
                Outcome::NotFired => "-",
                Outcome::Info => "",
            };
            out.push_str(&format!("  {:<16} {:<6} {}\n", s.step, mark, s.detail));
        }
        let code = p
            .reason_code
            .as_ref()
            .map(|c| format!(" [{c}]"))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {:<16} {:<6} {}\n",
            "decision",
            format!("{}{code}", p.decision),
            p.reason
        ));
    }
    if let Some(g) = &e.gitops {
        let verdict = if g.restart_holds { "holds" } else { "UNDONE" };
        out.push_str(&format!(
            "\ngitops: managed by {}; a restart {verdict}: {}\n",
            g.controller, g.detail
        ));
    }
    out.push_str(&format!("\ndecision: {}\n", e.decision));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::plan::tests::{OLD, deployment, inventory, nightly, over, pod, policy, t};
    use crate::core::plan::{Limits, plan};

    #[test]
    fn targets_parse_as_kubectl_spells_kinds() {
        let r = parse_target("deploy/toolhive-system/vmcp-main").unwrap();
        assert_eq!(r.to_string(), "deployment/toolhive-system/vmcp-main");
        assert_eq!(parse_target("STS/a/b").unwrap().kind, Kind::StatefulSet);
        assert_eq!(
            parse_target("daemonsets/a/b").unwrap().kind,
            Kind::DaemonSet
        );
        assert_eq!(parse_target("po/a/b").unwrap().kind, Kind::Pod);
        let shape = |text: &str| TargetError::Shape { text: text.into() };
        for (bad, want) in [
            ("deploy/a", shape("deploy/a")),
            ("a/b/c/d", shape("a/b/c/d")),
            (
                "job/a/b",
                TargetError::UnknownKind {
                    text: "job/a/b".into(),
                    kind: "job".into(),
                },
            ),
            (
                "deploy//b",
                TargetError::Empty {
                    text: "deploy//b".into(),
                },
            ),
        ] {
            assert_eq!(parse_target(bad), Err(want), "{bad}");
        }
        assert_eq!(
            parse_target("Job/a/b").unwrap_err().to_string(),
            "\"Job/a/b\": unknown kind \"job\" (deploy, sts, ds or pod)"
        );
        assert_eq!(
            parse_target("deploy/a//b").unwrap_err().to_string(),
            "\"deploy/a//b\": expected KIND/NAMESPACE/NAME, e.g. deploy/toolhive-system/vmcp-main"
        );
        assert_eq!(
            parse_target("po/a/").unwrap_err().to_string(),
            "\"po/a/\": the namespace and the name must not be empty"
        );
    }

    #[test]
    fn every_selecting_policy_shows_its_triggers_gates_and_decision() {
        let mut w = deployment("a", "api", "x", vec![pod("api-0", "x", OLD, Some(900))]);
        w.restarted_at = Some(t("2026-03-10T03:00:00Z"));
        let inv = inventory(vec![w]);
        let memory = over(policy("mem", "x"), 500);
        let night = nightly(policy("night", "x"));
        let other = policy("other", "y");
        let policies = [memory, night, other];
        let p = plan(
            &policies,
            &inv,
            t("2026-03-10T03:30:00Z"),
            &Limits::max_bounces(10),
        );
        let target = parse_target("deploy/a/api").unwrap();
        let off = Prometheus::off(crate::core::history::QueryError::NotConfigured);
        let e = explain(&target, &policies, &inv, &off, &p).unwrap();
        assert_eq!((e.policies.len(), e.policies_loaded), (2, 3));
        let mem = &e.policies[0];
        let step = |p: &PolicyExplanation, name: &str| {
            p.steps
                .iter()
                .find(|s| s.step == name)
                .unwrap_or_else(|| panic!("no {name} step: {p:#?}"))
                .clone()
        };
        assert_eq!(step(mem, "memory").result, Outcome::Fired);
        assert!(
            step(mem, "memory").detail.contains("900Mi > 500Mi"),
            "{mem:#?}"
        );
        // Restarted 30 minutes ago, cooldown 1h: the cooldown stops it, and says until when.
        let cool = step(mem, "cooldown");
        assert_eq!(cool.result, Outcome::Fail);
        assert!(cool.detail.contains("2026-03-10T04:00:00Z"), "{cool:?}");
        assert_eq!(
            (mem.decision.as_str(), mem.reason_code.as_deref()),
            ("skip", Some("cooldown"))
        );
        let night = &e.policies[1];
        // The 03:00 fire is due (its pods are older), and the same cooldown holds it back.
        assert_eq!(step(night, "schedule").result, Outcome::Fired);
        assert_eq!(
            step(night, "schedule").detail,
            "schedule (fired 2026-03-10T03:00:00Z); next fire 2026-03-11T03:00:00Z"
        );
        assert_eq!(night.reason_code.as_deref(), Some("cooldown"));
        assert_eq!(e.decision, "not bounced by this run");
        let text = text(&e);
        assert!(text.starts_with("deployment/a/api: 1 pod(s); selected by 2 of 3 policies"));
        assert!(
            text.contains("  decision         skip [cooldown] cooldown: restarted"),
            "{text}"
        );
        assert!(
            explain(
                &parse_target("sts/a/api").unwrap(),
                &policies,
                &inv,
                &off,
                &p
            )
            .is_none()
        );
    }
}
