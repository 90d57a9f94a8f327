//! The executor: runs the queue machine (`core::queue`) to its end, carrying out each action it
//! asks for through the cluster edge and handing back what it saw. It decides nothing: which
//! bounce, which gate, which wait, what a revert or a stop means is all the machine's.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::Client;
use tokio::sync::watch;

use crate::cluster::error::ClusterError;
use crate::cluster::events::{self, Severity};
use crate::cluster::evict::{self, EvictError, Replacement};
use crate::cluster::lock::{LeaseGuard, Stop};
use crate::cluster::prometheus;
use crate::cluster::retry::with_retries;
use crate::cluster::snapshot::{read_context, read_workload};
use crate::cluster::watch::{self as rollout, WaitError};
use crate::cluster::{restart, revert, toolhive};
use crate::core::action::{Action, Context, EdgeError, EventKind, Fresh, Observation, Stage};
use crate::core::history::{self, Needs};
use crate::core::in_flight::LeftRequest;
use crate::core::literals::{
    REASON_BOUNCED, REASON_FAILED, REASON_REQUEST_WITHDRAWN, REASON_REVERTED, REASON_SUPERSEDED,
};
use crate::core::mark::{AttemptMark, AttemptOutcome, BareMarks, bare_key};
use crate::core::model::{Kind, Uid, Workload, WorkloadRef};
use crate::core::outcome::{Failure, FailureCode, Outcome, Status};
use crate::core::plan::Plan;
use crate::core::policy::Policy;
use crate::core::queue::Queue;
use crate::progress;

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

/// What the machine sees of an edge failure: its text, classified by the API server's answer
/// found in its chain of causes.
fn seen(e: impl Error + 'static) -> EdgeError {
    edge_error(e.to_string(), &e)
}

/// `message` for the report, classified by `cause`'s chain: the first client error in it decides
/// (a wrapped one names the object; the class is the server's answer, or no answer at all).
fn edge_error(message: String, cause: &(dyn Error + 'static)) -> EdgeError {
    let client = std::iter::successors(Some(cause), |e| (*e).source())
        .find_map(|e| e.downcast_ref::<kube::Error>());
    match client {
        Some(kube::Error::Api(s)) => match s.code {
            404 => EdgeError::NotFound { message },
            409 => EdgeError::Conflict { message },
            401 | 403 => EdgeError::Forbidden { message },
            status => EdgeError::Api { status, message },
        },
        Some(kube::Error::HyperError(_) | kube::Error::Service(_)) => {
            EdgeError::Unreachable { message }
        }
        _ => EdgeError::Other { message },
    }
}

/// What the bounce machine asks of the cluster, as one call per action: the executor's loop
/// drives any implementation, so tests can script the observations.
pub trait Cluster {
    fn carry_out(&mut self, action: &Action) -> impl Future<Output = Observation>;
}

/// Runs the queue to its end. A stop (SIGTERM, a lost lock) cuts short whatever waits; the
/// machine decides what follows (a restart request withdrawn, the rest not attempted).
pub async fn drive(
    mut queue: Queue<'_>,
    cluster: &mut impl Cluster,
    clock: fn() -> DateTime<Utc>,
    stop: &watch::Receiver<Stop>,
) -> Vec<Outcome> {
    let mut seen = Observation::Begin;
    let mut announced = 0;
    loop {
        let why = stop.borrow().clone();
        let before = queue.in_progress().map(|(i, total, _)| (i, total));
        let action = queue.step(seen, clock(), why.as_deref());
        let now = queue.in_progress();
        if let Some((i, total)) = before.filter(|(i, _)| now.is_none_or(|(n, ..)| n != *i))
            && let Some(o) = queue.last_outcome()
        {
            tracing::info!(workload = %o.target, status = o.status.code(), "bounce {i}/{total} done");
        }
        if let Some((i, total, b)) = now.filter(|(i, ..)| *i != announced) {
            announced = i;
            tracing::info!(workload = %b.target, policy = %b.policy, "bounce {i}/{total}");
        }
        if let Action::Finished = action {
            return queue.outcomes();
        }
        log(&action);
        seen = if action.interruptible() {
            until_stopped(stop, cluster.carry_out(&action))
                .await
                .unwrap_or(Observation::Stopped)
        } else {
            cluster.carry_out(&action).await
        };
        if let (Action::Patch { target, .. }, Observation::Patched(Ok((written, _)))) =
            (&action, &seen)
        {
            tracing::info!(workload = %target, "patched kubectl.kubernetes.io/restartedAt={written}; waiting for the rollout");
        }
    }
}

fn log(action: &Action) {
    match action {
        Action::RequestOperatorRestart {
            target,
            server,
            value,
            ..
        } => tracing::info!(
            workload = %target,
            "asking MCPServer {} for a restart ({value}); waiting for its operator", server.name
        ),
        Action::Evict { target, pod, .. } => {
            tracing::info!(workload = %target, "evicting pod {} ({})", pod.name, evict::EVICTION_API)
        }
        _ => {}
    }
}

async fn until_stopped<T>(stop: &watch::Receiver<Stop>, fut: impl Future<Output = T>) -> Option<T> {
    let mut stop = stop.clone();
    let stopped = async move {
        // A dropped sender means nobody can ask us to stop any more: wait forever.
        if stop.wait_for(|s| s.is_some()).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        v = fut => Some(v),
        () = stopped => None,
    }
}

/// The cluster edge of a run: the API server, the run's Lease (bare pods' marks) and, for the
/// blockers re-checked before each bounce, Prometheus.
pub struct Kube<'a> {
    pub client: Client,
    pub lease: Option<&'a LeaseGuard>,
    pub bare_marks: BareMarks,
    pub prometheus: Option<&'a prometheus::Settings>,
    pub clock: fn() -> DateTime<Utc>,
    /// `BOUNCER_TEST_HALT_AT`: the step (`Action::step`) at which the run stops doing anything
    /// (after a write, before a wait) and hangs, holding its Lease, so a fault test can SIGKILL
    /// it exactly there. Never set in production.
    pub halt_at: Option<String>,
    /// `BOUNCER_TEST_PAUSE_BEFORE=STEP=DURATION`: the run waits that long before carrying out
    /// that step, then goes on, so a fault test can take the API server away exactly under that
    /// request. Never set in production.
    pub pause_before: Option<(String, Duration)>,
}

/// `STEP=DURATION` of `BOUNCER_TEST_PAUSE_BEFORE`, e.g. `patch=20s`; anything else is ignored
/// with a warning (a test hook, not a setting).
pub fn pause_before(value: &str) -> Option<(String, Duration)> {
    let parsed = value
        .split_once('=')
        .and_then(|(step, d)| Some((step.to_string(), humantime::parse_duration(d).ok()?)));
    if parsed.is_none() {
        tracing::warn!("BOUNCER_TEST_PAUSE_BEFORE={value:?} is not STEP=DURATION: ignored");
    }
    parsed
}

/// The executor for a plan: its queue machine over the `Kube` edge.
pub async fn execute(
    plan: &Plan,
    policies: &[Policy],
    edge: &mut Kube<'_>,
    (default_timeout, settle): (Duration, Duration),
    stop: &watch::Receiver<Stop>,
) -> Vec<Outcome> {
    for left in &plan.left_requests {
        if let Err(e) = edge.withdraw_left(left).await {
            let why = format!(
                "{e}: no bounce starts while the operator may still act on it (the next run tries again)"
            );
            tracing::error!(workload = %left.target, "{why}");
            return plan
                .bounces
                .iter()
                .map(|b| Outcome {
                    status: Status::Interrupted(why.clone()),
                    ..crate::core::recheck::planned(b)
                })
                .collect();
        }
    }
    let by_name: BTreeMap<&str, &Policy> = policies.iter().map(|p| (p.name.as_str(), p)).collect();
    let queue = Queue::new(&plan.bounces, &by_name, default_timeout, settle);
    let clock = edge.clock;
    drive(queue, edge, clock, stop).await
}

impl Cluster for Kube<'_> {
    async fn carry_out(&mut self, action: &Action) -> Observation {
        let step = action.step();
        let halt = step.filter(|s| self.halt_at.as_deref() == Some(*s));
        if let (Some(step), Some((at, pause))) = (step, &self.pause_before)
            && step == at
        {
            eprintln!("bouncer: paused before {step} (BOUNCER_TEST_PAUSE_BEFORE)");
            tokio::time::sleep(*pause).await;
        }
        let waits = matches!(action, Action::Wait(_) | Action::Sleep { .. });
        if let Some(step) = halt.filter(|_| waits) {
            halted(step).await;
        }
        let seen = self.carry(action).await;
        if let Some(step) = halt {
            halted(step).await;
        }
        seen
    }
}

async fn halted(step: &str) {
    eprintln!("bouncer: halted at {step} (BOUNCER_TEST_HALT_AT)");
    std::future::pending::<()>().await;
}

impl Kube<'_> {
    async fn carry(&mut self, action: &Action) -> Observation {
        match action {
            Action::Read {
                target,
                context,
                block_when,
            } => Observation::Read(self.read(target, *context, block_when.as_deref()).await),
            Action::Patch {
                target,
                uid,
                at,
                mark,
            } => Observation::Patched(
                restart::patch_restarted_at(&self.client, target, uid.as_ref(), *at, mark)
                    .await
                    .map(|p| (p.value, p.resource_version))
                    .map_err(seen),
            ),
            Action::Mark {
                target,
                uid,
                attempt,
                history,
            } => {
                let marked = self.mark(target, uid.as_ref(), attempt, history).await;
                if let Err(e) = &marked {
                    tracing::warn!(workload = %target, "could not record the attempt mark: {e}");
                }
                Observation::Marked(marked)
            }
            Action::ReadOperator { target, server } => Observation::Operator(
                toolhive::read(&self.client, &target.namespace, server)
                    .await
                    .map_err(seen),
            ),
            Action::RequestOperatorRestart {
                target,
                server,
                value,
                resource_version,
            } => Observation::Requested(
                toolhive::request_restart(
                    &self.client,
                    &target.namespace,
                    server,
                    value,
                    resource_version,
                )
                .await
                .map_err(seen),
            ),
            Action::Withdraw {
                target,
                server,
                value,
            } => Observation::Withdrawn(
                toolhive::withdraw(&self.client, &target.namespace, server, value)
                    .await
                    .map_err(seen),
            ),
            Action::Evict {
                target,
                pod,
                deadline,
            } => Observation::Evicted(
                evict::evict(
                    &self.client,
                    &target.namespace,
                    &pod.name,
                    &pod.uid,
                    self.instant(*deadline),
                )
                .await
                .map_err(evict_failure),
            ),
            Action::Wait(stage) => self.wait(stage).await,
            Action::Sleep { until } => {
                tokio::time::sleep_until(self.instant(*until)).await;
                Observation::Slept
            }
            Action::FindReverters { target, since } => {
                Observation::Reverters(revert::reverters(&self.client, target, *since).await)
            }
            Action::Emit(event) => {
                let (reason, severity) = match event.kind {
                    EventKind::Bounced => (REASON_BOUNCED, Severity::Normal),
                    EventKind::Failed => (REASON_FAILED, Severity::Warning),
                    EventKind::Reverted => (REASON_REVERTED, Severity::Warning),
                    EventKind::Superseded => (REASON_SUPERSEDED, Severity::Normal),
                };
                if severity == Severity::Warning {
                    tracing::warn!(workload = %event.target, "{}", event.note);
                }
                let now = (self.clock)();
                events::emit(
                    &self.client,
                    &event.target,
                    reason,
                    &event.note,
                    severity,
                    now,
                )
                .await;
                Observation::Emitted
            }
            Action::Done(_) | Action::Finished => Observation::Begin,
        }
    }
}

impl Kube<'_> {
    /// Withdraws the restart request an interrupted run left on an MCPServer (past its
    /// timeout, unanswered), as that run would have at its timeout: only while the server
    /// still holds bouncer's unprocessed request (`core::toolhive::left_value`), by a patch
    /// that tests the value first. Then the attempt is recorded `interrupted`, so the next run
    /// does not find it again, and a Warning Event tells it on the workload.
    async fn withdraw_left(&mut self, left: &LeftRequest) -> Result<(), EdgeError> {
        let (target, server) = (&left.target, &left.server);
        let by = format!("MCPServer {}/{}", target.namespace, server.name);
        let state = toolhive::read(&self.client, &target.namespace, server)
            .await
            .map_err(seen)?;
        let asked = crate::core::literals::rfc3339(left.attempt.time);
        let note = match crate::core::toolhive::left_value(&state, server) {
            Some(value) => {
                toolhive::withdraw(&self.client, &target.namespace, server, &value)
                    .await
                    .map_err(seen)?;
                format!(
                    "withdrew the restart request {value} on {by} that an earlier run asked at {asked} and was stopped before the operator acted; the operator did not act within the bounce's timeout"
                )
            }
            None => format!(
                "an earlier run asked {by} for a restart at {asked} and was stopped before the operator acted; the MCPServer no longer holds that request unprocessed, so nothing was withdrawn"
            ),
        };
        tracing::warn!(workload = %target, "{note}");
        let attempt = left.attempt.with_outcome(AttemptOutcome::Interrupted);
        let history = left.mark.recorded(&attempt);
        if let Err(e) = self
            .mark(target, left.uid.as_ref(), &attempt, &history)
            .await
        {
            // The request is gone either way; the next run finds nothing to withdraw and
            // records the attempt then.
            tracing::warn!(workload = %target, "could not record the attempt mark: {e}");
        }
        let now = (self.clock)();
        events::emit(
            &self.client,
            target,
            REASON_REQUEST_WITHDRAWN,
            &note,
            Severity::Warning,
            now,
        )
        .await;
        Ok(())
    }

    /// A wall-clock deadline as the runtime's instant.
    fn instant(&self, at: DateTime<Utc>) -> tokio::time::Instant {
        let left = (at - (self.clock)()).to_std().unwrap_or_default();
        tokio::time::Instant::now() + left
    }

    async fn read(
        &self,
        target: &WorkloadRef,
        context: bool,
        block_when: Option<&str>,
    ) -> Result<Box<Fresh>, EdgeError> {
        let what = format!("read {target}");
        let workload = with_retries(&what, || read_workload(&self.client, target));
        let context = async {
            if !context {
                return Ok(None);
            }
            let ns = &target.namespace;
            let what = format!("read namespace {ns} and its disruption budgets");
            let read = with_retries(&what, || read_context(&self.client, ns));
            let needs = Needs {
                blockers: block_when
                    .map(str::to_string)
                    .into_iter()
                    .collect::<BTreeSet<_>>(),
                ..Needs::default()
            };
            let answers = async {
                if needs.blockers.is_empty() {
                    history::Prometheus::off(history::QueryError::NotRun)
                } else {
                    prometheus::read(self.prometheus, &needs, (self.clock)()).await
                }
            };
            let (read, prometheus) = futures::join!(read, answers);
            let (namespaces, pdbs) =
                read.map_err(|e| edge_error(format!("failed to {what}: {e}"), &e))?;
            Ok::<_, EdgeError>(Some((namespaces, pdbs, prometheus)))
        };
        let (workload, context) = futures::join!(workload, context);
        let mut workload = workload.map_err(|source| {
            seen(ClusterError::Read {
                target: target.clone(),
                source,
            })
        })?;
        self.with_bare_mark(&mut workload);
        let context = context?.map(|(namespaces, pdbs, prometheus)| {
            namespaces.mark_deleting(&mut workload);
            Context {
                excluded_namespaces: namespaces.excluded,
                pdbs,
                prometheus,
            }
        });
        Ok(Box::new(Fresh { workload, context }))
    }

    /// A bare pod's mark is on the Lease, as this run last wrote or read it.
    fn with_bare_mark(&self, w: &mut Workload) {
        if w.target.kind == Kind::Pod {
            let key = bare_key(&w.target.namespace, &w.target.name);
            w.attempt = self.bare_marks.get(&key).map_or(AttemptMark::None, |a| {
                AttemptMark::Seen(Box::new(a.clone()))
            });
        }
    }

    /// Writes an attempt mark: on the controller's metadata, or for a bare pod on the Lease.
    async fn mark(
        &mut self,
        target: &WorkloadRef,
        uid: Option<&Uid>,
        attempt: &crate::core::mark::Attempt,
        history: &crate::core::mark::AttemptHistory,
    ) -> Result<Option<String>, EdgeError> {
        if target.kind != Kind::Pod {
            return restart::patch_mark(&self.client, target, uid, history)
                .await
                .map(|(_, version)| Some(version))
                .map_err(seen);
        }
        let Some(lease) = self.lease else {
            let message = format!("no run lock to record the attempt on {target} in");
            return Err(EdgeError::Other { message });
        };
        let key = bare_key(&target.namespace, &target.name);
        // The Lease is bouncer's own lock, not the pod: whatever refused its update (a conflict
        // with another writer included) says nothing about the pod the machine acts on.
        self.bare_marks = lease
            .record_bare(key, attempt)
            .await
            .map_err(|e| EdgeError::Other {
                message: e.to_string(),
            })?;
        Ok(None)
    }

    async fn wait(&self, stage: &Stage) -> Observation {
        match stage {
            Stage::Rollout {
                target,
                from,
                deadline,
                timeout,
            } => {
                let until = self.instant(*deadline);
                let wait = rollout::wait(&self.client, target, (until, *timeout), from.as_deref());
                let what = format!("the rollout of {target}");
                Observation::RolledOut(
                    progress::logged(wait, &what, until)
                        .await
                        .map_err(wait_failure),
                )
            }
            Stage::OperatorActed {
                target,
                server,
                before,
                from,
                deadline,
                timeout,
            } => {
                let by = format!("MCPServer {}/{}", target.namespace, server.name);
                let until = self.instant(*deadline);
                let acted = rollout::wait_rolled(
                    &self.client,
                    target,
                    (until, *timeout),
                    from.as_deref().unwrap_or_default(),
                    &by,
                    |w| w.toolhive.restarted_at.is_some() && w.toolhive.restarted_at != *before,
                );
                let what = format!("the operator of {by} to restart {target}");
                let acted = progress::logged(acted, &what, until).await;
                Observation::OperatorActed(
                    acted
                        .map(|(w, version)| (w.toolhive.restarted_at.unwrap_or_default(), version))
                        .map_err(wait_failure),
                )
            }
            Stage::Replaced {
                target,
                pod,
                owners,
                selector,
                want,
                deadline,
            } => {
                let replacement = match target.kind {
                    Kind::Pod => Replacement::Named,
                    _ => Replacement::Owned { owners, selector },
                };
                let until = self.instant(*deadline);
                let replaced = evict::wait_replaced(
                    &self.client,
                    &target.namespace,
                    (&pod.name, &pod.uid),
                    replacement,
                    *want,
                    until,
                );
                let what = format!(
                    "a replacement of evicted pod {}/{} ({want} ready pods of {target})",
                    target.namespace, pod.name
                );
                Observation::Replaced(
                    progress::logged(replaced, &what, until)
                        .await
                        .map_err(evict_failure),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: message.into(),
            reason: "Conflict".into(),
            ..Default::default()
        }))
    }

    fn web() -> WorkloadRef {
        WorkloadRef {
            kind: Kind::Deployment,
            namespace: "shop".into(),
            name: "web".into(),
        }
    }

    #[test]
    fn an_edge_failure_is_classified_by_the_answer_under_its_message() {
        let patch = |code| {
            seen(ClusterError::Patch {
                target: web(),
                source: answer(code, "nope"),
            })
        };
        assert!(matches!(patch(404), EdgeError::NotFound { .. }));
        assert!(matches!(patch(409), EdgeError::Conflict { .. }));
        assert!(matches!(patch(403), EdgeError::Forbidden { .. }));
        assert!(matches!(patch(401), EdgeError::Forbidden { .. }));
        assert!(matches!(patch(422), EdgeError::Api { status: 422, .. }));
        // The client's own error, not wrapped, is classified the same way.
        assert!(matches!(
            seen(answer(409, "nope")),
            EdgeError::Conflict { .. }
        ));
        let not_json = serde_json::from_str::<u8>("x").unwrap_err();
        assert!(matches!(
            seen(kube::Error::SerdeError(not_json)),
            EdgeError::Other { .. }
        ));
    }

    /// The report reads the edge's own message: the action and the object, then the answer.
    #[test]
    fn an_edge_failure_keeps_the_message_that_names_the_object() {
        let e = seen(ClusterError::Patch {
            target: web(),
            source: answer(409, "the object has been modified"),
        });
        let text = e.to_string();
        assert!(
            text.starts_with(
                "failed to patch deployment/shop/web: ApiError: the object has been modified: Conflict"
            ),
            "{text}"
        );
        // A fresh read's failure names the workload, which the client's own error does not.
        let read = seen(ClusterError::Read {
            target: web(),
            source: answer(404, "deployments.apps \"web\" not found"),
        });
        assert!(matches!(&read, EdgeError::NotFound { .. }));
        assert!(
            read.to_string().starts_with(
                "failed to read deployment/shop/web: ApiError: deployments.apps \"web\" not found"
            ),
            "{read}"
        );
    }
}
