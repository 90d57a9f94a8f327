//! The executor: bounces the plan strictly one workload at a time (fresh read, re-check, restart,
//! wait, verify, event) and halts the queue on the first failure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::Client;
use tokio::sync::watch;

use crate::cluster::events::{self, Severity};
use crate::cluster::evict::{self, EvictError};
use crate::cluster::lock::{LeaseGuard, Stop};
use crate::cluster::retry::with_retries;
use crate::cluster::snapshot::read_workload;
use crate::cluster::watch::{self as rollout, WaitError};
use crate::cluster::{kinds, restart, revert, toolhive};
use crate::core::group::Group;
use crate::core::literals::{
    REASON_BOUNCED, REASON_FAILED, REASON_REVERTED, TOOLHIVE_RESTARTED_AT,
};
use crate::core::mark::{Attempt, AttemptMark, BareMarks, bare_key};
use crate::core::model::{Kind, Pdb, Workload, WorkloadRef};
use crate::core::outcome::{Failure, FailureCode, Outcome, Status, attempt_outcome};
use crate::core::overrides;
use crate::core::plan::{self, Bounce, Method, Plan};
use crate::core::policy::{OnRevert, Policy};
use crate::core::reasons::SkipReason;
use crate::core::verify::{self, Verdict, annotation_label, restart_annotation};

fn wait_failure(e: WaitError) -> Failure {
    let code = match e {
        WaitError::Timeout { .. } => FailureCode::RolloutTimedOut,
        WaitError::Failed { .. } => FailureCode::RolloutFailed,
        WaitError::Deleted { .. } => FailureCode::WorkloadDeleted,
        WaitError::NotRolled { .. } => FailureCode::OperatorNoRestart,
    };
    Failure::new(code, e.to_string())
}

fn evict_failure(e: EvictError) -> Failure {
    let code = match e {
        EvictError::Refused { .. } => FailureCode::EvictionRefused,
        EvictError::NoReplacement { .. } => FailureCode::NoReplacement,
        EvictError::Api(_) => FailureCode::EvictionFailed,
    };
    Failure::new(code, e.to_string())
}

pub struct Executor<'a> {
    pub client: Client,
    pub policies: BTreeMap<&'a str, &'a Policy>,
    pub pdbs: &'a [Pdb],
    /// Where bare pods' attempt marks are written (the run's Lease), and what it held.
    pub lease: Option<&'a LeaseGuard>,
    pub bare_marks: BareMarks,
    pub excluded_namespaces: &'a BTreeSet<String>,
    pub default_timeout: Duration,
    /// Least time between the patch and the verification, so a reverting owner can show itself.
    pub settle: Duration,
    pub clock: fn() -> DateTime<Utc>,
    /// Set, with the reason, when the run must stop.
    pub stop: watch::Receiver<Stop>,
}

/// A restart on the pod template, as the verification checks it.
#[derive(Clone, Copy)]
struct Restart<'a> {
    method: Method,
    /// The annotation's value that proves it.
    written: &'a str,
    /// When bouncer wrote it (or asked for it).
    at: DateTime<Utc>,
    /// The pods from before, by UID.
    old: &'a BTreeSet<String>,
}

enum Step<T> {
    Done(T),
    Stopped,
}

impl Executor<'_> {
    pub async fn execute(&mut self, plan: &Plan) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        let mut halted = false;
        // A restart group's member that was not bounced: the rest of its group is left alone.
        let mut held: Option<(&Group, WorkloadRef)> = None;
        let total = plan.bounces.len();
        for (i, bounce) in plan.bounces.iter().enumerate() {
            let mut outcome = Outcome {
                policy: bounce.policy.clone(),
                target: bounce.target.clone(),
                method: bounce.method,
                status: Status::NotAttempted(None),
                started: None,
                patched_at: None,
                completed_at: None,
                finished: None,
                verification: None,
                written: None,
                attempt: None,
                last_confirmed: None,
            };
            if !halted && self.stop.borrow().is_some() {
                // Asked to stop between two bounces: the first one left out is reported as
                // interrupted, so the report and the exit code say the queue was not finished.
                halted = true;
                outcome.status = self.interrupted();
            }
            let group_held = match (&held, &bounce.group) {
                (Some((g, member)), Some(mine)) if *g == mine => Some(member.clone()),
                _ => None,
            };
            if let Some(member) = group_held.filter(|_| !halted) {
                outcome.status = Status::NotAttempted(Some(member));
            } else if !halted {
                tracing::info!(workload = %bounce.target, policy = %bounce.policy, "bounce {}/{total}", i + 1);
                outcome.started = Some((self.clock)());
                self.bounce(bounce, &mut outcome).await;
                outcome.finished = Some((self.clock)());
                halted = outcome.status.halts();
                if let (Some(g), false) = (&bounce.group, outcome.status.bounced()) {
                    held = Some((g, bounce.target.clone()));
                }
                tracing::info!(workload = %bounce.target, status = outcome.status.code(), "bounce {}/{total} done", i + 1);
            }
            outcomes.push(outcome);
        }
        for outcome in &mut outcomes {
            self.confirm(outcome).await;
        }
        outcomes
    }

    async fn bounce(&mut self, b: &Bounce, out: &mut Outcome) {
        let policy = self.policies[b.policy.as_str()];
        let deadline = tokio::time::Instant::now() + self.timeout(b);
        let mut fresh = match self.read(&b.target).await {
            Ok(w) => w,
            Err(error) => return out.status = Status::Skipped(SkipReason::ReadFailed { error }),
        };
        if fresh.target.kind == Kind::Pod {
            let key = bare_key(&fresh.target.namespace, &fresh.target.name);
            fresh.attempt = self
                .bare_marks
                .get(&key)
                .map_or(AttemptMark::None, |a| AttemptMark::Seen(a.clone()));
        }
        let now = (self.clock)();
        let recheck = plan::identity_gates(policy, &fresh, self.excluded_namespaces)
            .and_then(|()| {
                if fresh.restarted_at != b.seen_restarted_at {
                    Err(SkipReason::RestartedMeanwhile)
                } else {
                    Ok(())
                }
            })
            // The workload's override annotations as they are now, not as the plan saw them.
            .and_then(|()| overrides::effective(policy, &fresh))
            .and_then(|p| {
                plan::cooldown(&p, &fresh, now)?;
                plan::preflight(&p, &fresh, self.pdbs)
            });
        let method = match recheck {
            Ok(method) => method,
            Err(reason) => return out.status = Status::Skipped(reason),
        };
        // The fresh read takes a moment; a stop (SIGTERM, or the lock lost) that came meanwhile
        // must not be followed by a new restart.
        if self.stop.borrow().is_some() {
            return out.status = self.interrupted();
        }
        out.method = method;
        let attempt = Attempt::new((self.clock)(), &b.policy, method);
        out.attempt = Some(attempt.clone());
        out.status = match method {
            Method::Rollout => self.rollout(b, &fresh, deadline, &attempt, out).await,
            Method::Evict => self.evict_marked(&fresh, deadline, &attempt, out).await,
            Method::Toolhive => self.toolhive(b, &fresh, deadline, &attempt, out).await,
        };
        // Eviction and ToolHive bounces wrote their mark on its own, so they record the outcome
        // too (a ToolHive skip came before its mark). A rollout's mark rode on the restart patch
        // (one write per bounce, as the benchmark and the tests count); it stays `started`, and
        // the outcome is in the Event and the report.
        if let Status::Skipped(_) = out.status {
            out.attempt = None;
        }
        if method != Method::Rollout && out.attempt.is_some() {
            self.record(
                &b.target,
                &attempt.with_outcome(attempt_outcome(&out.status)),
            )
            .await
            .unwrap_or_else(|e| tracing::warn!("{e}"));
        }
        let now = (self.clock)();
        match &out.status {
            Status::Bounced => {
                let note = format!(
                    "restarted by policy {} ({})",
                    b.policy,
                    out.verification.as_deref().unwrap_or("verified")
                );
                events::emit(
                    &self.client,
                    &b.target,
                    REASON_BOUNCED,
                    &note,
                    Severity::Normal,
                    now,
                )
                .await;
            }
            Status::Failed(why) => {
                events::emit(
                    &self.client,
                    &b.target,
                    REASON_FAILED,
                    &why.detail,
                    Severity::Warning,
                    now,
                )
                .await;
            }
            _ => {}
        }
    }

    async fn read(&self, target: &WorkloadRef) -> Result<Workload, String> {
        with_retries(&format!("read {target}"), || {
            read_workload(&self.client, target)
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// Eviction of a workload's pods, after its attempt mark is durable: no mark, no eviction.
    async fn evict_marked(
        &mut self,
        fresh: &Workload,
        deadline: tokio::time::Instant,
        attempt: &Attempt,
        out: &mut Outcome,
    ) -> Status {
        if let Err(e) = self.record(&fresh.target, attempt).await {
            return Status::Failed(Failure::new(
                FailureCode::MarkFailed,
                format!("{e}; nothing was evicted"),
            ));
        }
        let before: BTreeSet<String> = fresh.pods.iter().map(|p| p.uid.clone()).collect();
        match self.evict_all(fresh, &before, deadline, out).await {
            Ok(Step::Done(n)) => {
                out.verification = Some(format!("{n} pods replaced one at a time"));
                Status::Bounced
            }
            Ok(Step::Stopped) => self.interrupted(),
            Err(e) => Status::Failed(e),
        }
    }

    /// Writes an attempt mark: on the controller's metadata, or for a bare pod on the Lease.
    async fn record(&mut self, target: &WorkloadRef, attempt: &Attempt) -> Result<(), String> {
        if target.kind != Kind::Pod {
            return restart::patch_mark(&self.client, target, attempt)
                .await
                .map(drop)
                .map_err(|e| format!("could not record the attempt mark: {e}"));
        }
        let Some(lease) = self.lease else {
            return Err(format!("no run lock to record the attempt on {target} in"));
        };
        let key = bare_key(&target.namespace, &target.name);
        self.bare_marks = lease.record_bare(key, attempt).await?;
        Ok(())
    }

    async fn rollout(
        &mut self,
        b: &Bounce,
        fresh: &Workload,
        deadline: tokio::time::Instant,
        attempt: &Attempt,
        out: &mut Outcome,
    ) -> Status {
        let old: BTreeSet<String> = fresh.pods.iter().map(|p| p.uid.clone()).collect();
        let at = (self.clock)();
        out.patched_at = Some(at);
        let patched = match restart::patch_restarted_at(&self.client, &b.target, at, attempt).await
        {
            Ok(p) => p,
            Err(e) => return Status::Failed(Failure::new(FailureCode::PatchFailed, e.to_string())),
        };
        let written = patched.value.clone();
        out.written = Some(written.clone());
        tracing::info!(workload = %b.target, "patched kubectl.kubernetes.io/restartedAt={written}; waiting for the rollout");
        let start = rollout::Start {
            workload: &patched.workload,
            resource_version: &patched.resource_version,
        };
        let restart = Restart {
            method: Method::Rollout,
            written: &written,
            at,
            old: &old,
        };
        self.follow_and_verify(b, restart, start, deadline, out)
            .await
    }

    /// `restart.method: toolhive`: the mark on the Deployment, then the restart request on the
    /// MCPServer that owns it; the operator writes its own annotation on the pod template, and
    /// from there the rollout is followed and verified like bouncer's own.
    async fn toolhive(
        &mut self,
        b: &Bounce,
        fresh: &Workload,
        deadline: tokio::time::Instant,
        attempt: &Attempt,
        out: &mut Outcome,
    ) -> Status {
        let ns = b.target.namespace.as_str();
        let Some(server) = fresh.toolhive.server.clone() else {
            let error = "no MCPServer controls it any more".to_string();
            return Status::Skipped(SkipReason::ReadFailed { error });
        };
        let state = match toolhive::read(&self.client, ns, &server).await {
            Ok(s) => s,
            Err(e) => {
                let error = e.to_string();
                return Status::Skipped(SkipReason::ReadFailed { error });
            }
        };
        let at = (self.clock)();
        let value = match crate::core::toolhive::restart_request(&state, fresh, at) {
            Ok(v) => v,
            Err(reason) => return Status::Skipped(reason),
        };
        // As for an eviction: no restart without its mark.
        let (marked, version) = match restart::patch_mark(&self.client, &b.target, attempt).await {
            Ok(m) => m,
            Err(e) => {
                return Status::Failed(Failure::new(
                    FailureCode::MarkFailed,
                    format!(
                        "could not record the attempt mark: {e}; the MCPServer was not asked to restart"
                    ),
                ));
            }
        };
        let old: BTreeSet<String> = fresh.pods.iter().map(|p| p.uid.clone()).collect();
        out.patched_at = Some(at);
        if let Err(e) = toolhive::request_restart(&self.client, ns, &server, &value).await {
            return Status::Failed(Failure::new(FailureCode::PatchFailed, e.to_string()));
        }
        let by = format!("MCPServer {ns}/{}", server.name);
        tracing::info!(workload = %b.target, "annotated {by} {TOOLHIVE_RESTARTED_AT}={value}; waiting for its operator to roll the Deployment");
        let before = marked.toolhive.restarted_at.clone();
        let start = rollout::Start {
            workload: &marked,
            resource_version: &version,
        };
        let rolled = rollout::wait_rolled(
            &self.client,
            &b.target,
            (deadline, self.timeout(b)),
            start,
            &by,
            |w| w.toolhive.restarted_at.is_some() && w.toolhive.restarted_at != before,
        );
        let (seen, seen_version) = match self.until_stopped(rolled).await {
            Step::Stopped => return self.interrupted(),
            Step::Done(Err(e)) => {
                let failure = wait_failure(e);
                // Not acted on yet: it must not restart the server later, unobserved.
                return Status::Failed(
                    match toolhive::withdraw(&self.client, ns, &server, &value).await {
                        Ok(()) => failure.after_detail("the restart request was withdrawn"),
                        Err(e) => failure.after_detail(&e.to_string()),
                    },
                );
            }
            Step::Done(Ok(seen)) => seen,
        };
        let written = seen.toolhive.restarted_at.clone().unwrap_or_default();
        out.written = Some(written.clone());
        tracing::info!(workload = %b.target, "the operator wrote {TOOLHIVE_RESTARTED_AT}={written}; waiting for the rollout");
        let start = rollout::Start {
            workload: &seen,
            resource_version: &seen_version,
        };
        let restart = Restart {
            method: Method::Toolhive,
            written: &written,
            at,
            old: &old,
        };
        self.follow_and_verify(b, restart, start, deadline, out)
            .await
    }

    /// From a restart written to the pod template (by bouncer, or by an owner asked to): waits
    /// for the rollout by kubectl's rules, gives a reverting owner `settle` to show itself, and
    /// verifies that the annotation is intact and every pod new.
    async fn follow_and_verify(
        &mut self,
        b: &Bounce,
        restart: Restart<'_>,
        start: rollout::Start<'_>,
        deadline: tokio::time::Instant,
        out: &mut Outcome,
    ) -> Status {
        let Restart {
            method,
            written,
            at,
            old,
        } = restart;
        let budget = (deadline, self.timeout(b));
        let waited = self
            .until_stopped(rollout::wait(&self.client, &b.target, budget, start))
            .await;
        match waited {
            Step::Stopped => return self.interrupted(),
            Step::Done(Err(e)) => return Status::Failed(wait_failure(e)),
            Step::Done(Ok(())) => out.completed_at = Some((self.clock)()),
        }
        // Give a reverting owner `settle` after the patch to show itself; rollouts usually take
        // longer than that, so the next bounce normally starts right after completion.
        let since_patch = ((self.clock)() - at).to_std().unwrap_or_default();
        if let Some(rest) = self.settle.checked_sub(since_patch)
            && let Step::Stopped = self
                .until_stopped(tokio::time::sleep_until(
                    deadline.min(tokio::time::Instant::now() + rest),
                ))
                .await
        {
            return self.interrupted();
        }
        let mut after = match self.read(&b.target).await {
            Ok(w) => w,
            Err(e) => {
                return Status::Failed(Failure::new(
                    FailureCode::VerifyReadFailed,
                    format!("verification read failed: {e}"),
                ));
            }
        };
        let mut verdict = verify::check(&after, method, written, old);
        // Every pod is new but some are not ready yet: an autoscaler added them during the
        // settle. Wait (within the same budget) for kubectl's rule to hold again, then re-check.
        if let Verdict::Incomplete { old: 0, .. } = verdict {
            let start = rollout::Start {
                workload: &after,
                resource_version: "0",
            };
            let again = rollout::wait(&self.client, &b.target, (deadline, self.timeout(b)), start);
            match self.until_stopped(again).await {
                Step::Stopped => return self.interrupted(),
                Step::Done(Err(e)) => return Status::Failed(wait_failure(e)),
                Step::Done(Ok(())) => {}
            }
            after = match self.read(&b.target).await {
                Ok(w) => w,
                Err(e) => {
                    return Status::Failed(Failure::new(
                        FailureCode::VerifyReadFailed,
                        format!("verification read failed: {e}"),
                    ));
                }
            };
            verdict = verify::check(&after, method, written, old);
        }
        match verdict {
            Verdict::Verified { pods } => {
                out.verification = Some(format!(
                    "{} intact, {pods}/{pods} pods new and ready",
                    annotation_label(method)
                ));
                Status::Bounced
            }
            Verdict::Incomplete { detail, .. } => {
                out.verification = Some(detail.clone());
                Status::Failed(Failure::new(
                    FailureCode::VerifyFailed,
                    format!("rollout completed but verification failed: {detail}"),
                ))
            }
            Verdict::Reverted { found } => {
                self.reverted(b, &after, restart, found, deadline, out)
                    .await
            }
        }
    }

    async fn reverted(
        &mut self,
        b: &Bounce,
        after: &Workload,
        restart: Restart<'_>,
        found: Option<String>,
        deadline: tokio::time::Instant,
        out: &mut Outcome,
    ) -> Status {
        let reverters = revert::reverters(&self.client, &b.target, restart.at).await;
        let by = reverters.to_string();
        let managers = reverters.managers;
        let found = found.unwrap_or_else(|| "removed".into());
        let note = format!(
            "{} was reverted by {by} (now: {found}); onRevert: {}",
            annotation_label(restart.method),
            b.on_revert.as_str()
        );
        out.verification = Some(note.clone());
        tracing::warn!(workload = %b.target, "{note}");
        events::emit(
            &self.client,
            &b.target,
            REASON_REVERTED,
            &note,
            Severity::Warning,
            (self.clock)(),
        )
        .await;
        if b.on_revert == OnRevert::Fail {
            return Status::Reverted { managers };
        }
        // Pods the rollout already replaced are left alone: only those from before the bounce go.
        match self.evict_all(after, restart.old, deadline, out).await {
            Ok(Step::Done(n)) => {
                out.verification = Some(format!("{note}; {n} pods evicted one at a time"));
                Status::RevertedEvicted { managers }
            }
            Ok(Step::Stopped) => self.interrupted(),
            Err(e) => Status::Failed(e.after(&format!("{note}; eviction failed"))),
        }
    }

    /// Evicts the workload's pods that existed before the bounce began (`before`, by UID) one at
    /// a time, each followed by a wait for its replacement, all before `deadline`. Returns how
    /// many were evicted.
    async fn evict_all(
        &mut self,
        w: &Workload,
        before: &BTreeSet<String>,
        deadline: tokio::time::Instant,
        out: &mut Outcome,
    ) -> Result<Step<usize>, Failure> {
        let live: Vec<_> = w.pods.iter().filter(|p| !p.deleting).collect();
        let want = live.len().max(1);
        let mut pods: Vec<_> = live
            .into_iter()
            .filter(|p| before.contains(&p.uid))
            .collect();
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        let evicted = pods.len();
        let replacement = evict::Replacement::of(w);
        for pod in pods {
            tracing::info!(workload = %w.target, "evicting pod {} ({})", pod.name, evict::EVICTION_API);
            out.patched_at.get_or_insert_with(self.clock);
            let ns = w.target.namespace.as_str();
            let step = self
                .until_stopped(evict::evict(
                    &self.client,
                    ns,
                    &pod.name,
                    &pod.uid,
                    deadline,
                ))
                .await;
            match step {
                Step::Stopped => return Ok(Step::Stopped),
                Step::Done(r) => r.map_err(evict_failure)?,
            }
            let replaced = evict::wait_replaced(
                &self.client,
                ns,
                (&pod.name, &pod.uid),
                replacement,
                want,
                deadline,
            );
            match self.until_stopped(replaced).await {
                Step::Stopped => return Ok(Step::Stopped),
                Step::Done(r) => r.map_err(evict_failure)?,
            }
        }
        out.completed_at = Some((self.clock)());
        Ok(Step::Done(evicted))
    }

    /// The run's last word on a verified rollout, right before the report: one more read of the
    /// workload's pod template. An owner that reverted restartedAt after the verification (its
    /// pods now restart a second time) is caught here and named.
    async fn confirm(&mut self, out: &mut Outcome) {
        let (Status::Bounced, Method::Rollout | Method::Toolhive, Some(written)) =
            (&out.status, out.method, out.written.clone())
        else {
            return;
        };
        let target = out.target.clone();
        let now = match with_retries(&format!("re-check {target}"), || {
            kinds::get(&self.client, &target)
        })
        .await
        {
            Ok(now) => now,
            Err(e) => {
                out.status = Status::Failed(Failure::new(
                    FailureCode::RecheckFailed,
                    format!(
                        "bounced and verified, but the final re-check of restartedAt failed: {e}"
                    ),
                ));
                return;
            }
        };
        let found = restart_annotation(out.method, &now);
        if found.as_deref() == Some(written.as_str()) {
            out.last_confirmed = Some((self.clock)());
            return;
        }
        let since = out.patched_at.unwrap_or_else(self.clock);
        let reverters = revert::reverters(&self.client, &target, since).await;
        let found = found.unwrap_or_else(|| "removed".to_string());
        let note = format!(
            "{} was reverted after the bounce was verified, by {reverters} (now: {found}); \
             its pods restart again under the owner's template",
            annotation_label(out.method)
        );
        tracing::warn!(workload = %target, "{note}");
        events::emit(
            &self.client,
            &target,
            REASON_REVERTED,
            &note,
            Severity::Warning,
            (self.clock)(),
        )
        .await;
        out.verification = Some(note);
        out.status = Status::Reverted {
            managers: reverters.managers,
        };
    }

    /// One budget for the whole bounce: rollout, settle, verification and any eviction.
    fn timeout(&self, b: &Bounce) -> Duration {
        b.timeout.unwrap_or(self.default_timeout)
    }

    fn interrupted(&self) -> Status {
        Status::Interrupted(self.stop.borrow().clone().unwrap_or_default())
    }

    async fn until_stopped<T>(&self, fut: impl std::future::Future<Output = T>) -> Step<T> {
        let mut stop = self.stop.clone();
        let stopped = async move {
            // A dropped sender means nobody can ask us to stop any more: wait forever.
            if stop.wait_for(|s| s.is_some()).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            v = fut => Step::Done(v),
            () = stopped => Step::Stopped,
        }
    }
}
