//! The run lock: a coordination.k8s.io/v1 Lease held and renewed for the whole run, so two
//! overlapping runs never bounce at once. An expired lease (its holder gone) is taken over.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;

use super::error::ClusterError;
use super::retry::with_retries;
use crate::core::literals::{BARE_ATTEMPTS_ANNOTATION, TOLD_ANNOTATION};
use crate::core::mark::{Attempt, BareMarks, MarkDecodeError, decode_bare, merge_bare};
use crate::core::notice::Told;

/// The run Lease's other uses than taking it (which `ClusterError::Lease` reports): the bare
/// pods' marks it holds.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("failed to read the Lease {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// The bare pods' marks are unreadable: each bare pod is skipped, naming this.
    #[error(
        "annotation {} of the Lease {namespace}/{name}: {source}",
        BARE_ATTEMPTS_ANNOTATION
    )]
    BareMarks {
        namespace: String,
        name: String,
        #[source]
        source: MarkDecodeError,
    },
    #[error("failed to update the Lease {name} with the attempt on pod {pod}: {source}")]
    RecordBare {
        /// `namespace/name`.
        pod: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Why one renewal failed; the run retries while the lease is surely still its own.
#[derive(Debug, thiserror::Error)]
enum RenewError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// What watching a held lease ended with.
enum Expiry {
    /// Unrenewed for its duration (or released): this run may take it over.
    Expired(Box<Lease>),
    /// Its holder is alive (it renewed, or another run took it), or it was deleted meanwhile.
    Held { holder: String },
}

/// Why the run must stop (SIGTERM, the lock lost); `None` while it may go on.
pub type Stop = Option<String>;

/// Seconds a holder has to renew before others may take the lease over.
pub const LEASE_SECONDS: i32 = 30;

pub enum Acquired {
    Held(Box<LeaseGuard>),
    /// Someone else holds a live lease.
    Busy {
        holder: String,
    },
}

pub struct LeaseGuard {
    api: Api<Lease>,
    name: String,
    identity: String,
    renewer: tokio::task::JoinHandle<()>,
}

fn micro(t: DateTime<Utc>) -> MicroTime {
    MicroTime(
        k8s_openapi::jiff::Timestamp::from_microsecond(t.timestamp_micros()).unwrap_or_default(),
    )
}

/// The part of a Lease the election compares, as client-go compares its record: any change
/// (a renewal, a new holder) proves the holder alive, whatever times it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub holder: Option<String>,
    pub duration_seconds: i32,
    pub acquire_time: Option<i64>,
    pub renew_time: Option<i64>,
    pub transitions: Option<i32>,
}

impl Record {
    pub fn of(spec: &LeaseSpec) -> Record {
        Record {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            duration_seconds: spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS),
            acquire_time: spec.acquire_time.as_ref().map(|t| t.0.as_microsecond()),
            renew_time: spec.renew_time.as_ref().map(|t| t.0.as_microsecond()),
            transitions: spec.lease_transitions,
        }
    }
}

/// A record and when (on this machine's monotonic clock) it was first seen unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub record: Record,
    pub since: Instant,
}

/// client-go's observation: the time restarts whenever the record differs from the last one.
pub fn observe(previous: Option<Observed>, record: Record, now: Instant) -> Observed {
    match previous {
        Some(p) if p.record == record => p,
        _ => Observed { record, since: now },
    }
}

/// client-go's rule: a lease is free when it has no holder, or when its record has not changed
/// for its duration as observed here. The holder's renewTime is never compared with our clock:
/// a skewed clock on either machine must not let a second run take over a live lease.
pub fn expired(observed: &Observed, now: Instant) -> bool {
    let duration = Duration::from_secs(observed.record.duration_seconds.max(0) as u64);
    observed.record.holder.is_none() || now.saturating_duration_since(observed.since) >= duration
}

/// How often a run waiting on a held lease re-reads it. client-go's elector polls the same way
/// (its retryPeriod); a GET by name is also all the Role grants on the Lease (no list/watch).
const OBSERVE_EVERY: Duration = Duration::from_secs(2);

/// Re-reads a held lease until its record changes or it expires by [`expired`]; returns the
/// lease to take over (its resourceVersion makes the replace a compare-and-swap), or the live
/// holder.
async fn wait_expired(
    api: &Api<Lease>,
    name: &str,
    mut lease: Lease,
) -> Result<Expiry, kube::Error> {
    let record = |l: &Lease| Record::of(&l.spec.clone().unwrap_or_default());
    let mut observed = observe(None, record(&lease), Instant::now());
    if !expired(&observed, Instant::now()) {
        tracing::info!(
            "the run lock {name} is held by {}; waiting up to {}s to see whether it is renewed",
            observed.record.holder.as_deref().unwrap_or_default(),
            observed.record.duration_seconds
        );
    }
    loop {
        if expired(&observed, Instant::now()) {
            return Ok(Expiry::Expired(Box::new(lease)));
        }
        let holder = observed.record.holder.clone().unwrap_or_default();
        tokio::time::sleep(OBSERVE_EVERY).await;
        let Some(fresh) = api.get_opt(name).await? else {
            let holder = format!("{holder} (the lease was deleted meanwhile)");
            return Ok(Expiry::Held { holder });
        };
        let before = observed.since;
        observed = observe(Some(observed), record(&fresh), Instant::now());
        lease = fresh;
        // A changed record proves its holder alive. A release while we wait counts too: that run
        // did this tick's work, and a second run right after it would only re-plan it.
        if observed.since != before {
            let holder = observed.record.holder.clone().unwrap_or(holder);
            return Ok(Expiry::Held { holder });
        }
    }
}

/// Tries once to take the lease. `lost` is set when a renewal fails, so the run stops bouncing.
pub async fn acquire(
    client: &Client,
    namespace: &str,
    name: &str,
    identity: &str,
    clock: fn() -> DateTime<Utc>,
    lost: watch::Sender<Stop>,
) -> Result<Acquired, ClusterError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let err = |source| ClusterError::Lease {
        namespace: namespace.into(),
        name: name.into(),
        source,
    };
    let now = clock();
    let spec = LeaseSpec {
        holder_identity: Some(identity.into()),
        lease_duration_seconds: Some(LEASE_SECONDS),
        acquire_time: Some(micro(now)),
        renew_time: Some(micro(now)),
        ..Default::default()
    };
    let taken = match api.get_opt(name).await.map_err(err)? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => true,
                Err(kube::Error::Api(s)) if s.code == 409 => false,
                Err(e) => return Err(err(e)),
            }
        }
        Some(lease) => {
            let mut lease = match wait_expired(&api, name, lease).await.map_err(err)? {
                Expiry::Expired(lease) => *lease,
                Expiry::Held { holder } => return Ok(Acquired::Busy { holder }),
            };
            let current = lease.spec.clone().unwrap_or_default();
            let now = clock();
            let spec = LeaseSpec {
                acquire_time: Some(micro(now)),
                renew_time: Some(micro(now)),
                ..spec
            };
            let transitions = current.lease_transitions.unwrap_or(0) + 1;
            lease.spec = Some(LeaseSpec {
                lease_transitions: Some(transitions),
                ..spec
            });
            // The resourceVersion from the read makes this a compare-and-swap: of two runs
            // taking over at once, one gets 409.
            match api.replace(name, &PostParams::default(), &lease).await {
                Ok(_) => true,
                Err(kube::Error::Api(s)) if s.code == 409 => false,
                Err(e) => return Err(err(e)),
            }
        }
    };
    if !taken {
        let holder = api
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .unwrap_or_else(|| "another run".into());
        return Ok(Acquired::Busy { holder });
    }
    let renewer = tokio::spawn(renew(
        api.clone(),
        name.to_string(),
        identity.to_string(),
        clock,
        lost,
    ));
    Ok(Acquired::Held(Box::new(LeaseGuard {
        api,
        name: name.into(),
        identity: identity.into(),
        renewer,
    })))
}

/// How often the holder renews: a sixth of the lease, so that renewals failing for a while (an
/// API server restart takes 10-20 s) still leave time to succeed before the lease runs out.
const RENEW_EVERY: Duration = Duration::from_secs((LEASE_SECONDS / 6) as u64);
/// A renewal that takes longer than this counts as failed (a half-dead server can hang requests).
const RENEW_TIMEOUT: Duration = Duration::from_secs(5);
/// The run stops once its last successful renewal is this old: the lease is still ours for the
/// rest of its duration, so no other run can have started bouncing yet.
const GIVE_UP_AFTER: Duration = Duration::from_secs((LEASE_SECONDS - 5) as u64);

/// After a failed renewal: how soon to try again, or None when the run must stop because the
/// lease could expire before another renewal lands.
fn retry_after(since_renewed: Duration) -> Option<Duration> {
    let left = GIVE_UP_AFTER
        .checked_sub(since_renewed)
        .filter(|d| !d.is_zero())?;
    Some(left.min(Duration::from_secs(1)))
}

async fn renew(
    api: Api<Lease>,
    name: String,
    identity: String,
    clock: fn() -> DateTime<Utc>,
    lost: watch::Sender<Stop>,
) {
    let mut renewed = tokio::time::Instant::now();
    let mut wait = RENEW_EVERY;
    loop {
        tokio::time::sleep(wait).await;
        let attempt_started = tokio::time::Instant::now();
        let attempt = async {
            let mut lease = api.get(&name).await?;
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(identity.as_str()) {
                let holder = spec.holder_identity.clone();
                return Ok(Some(holder.unwrap_or_else(|| "nobody".into())));
            }
            spec.renew_time = Some(micro(clock()));
            api.replace(&name, &PostParams::default(), &lease)
                .await
                .map(|_| None)
        };
        let result = match tokio::time::timeout(RENEW_TIMEOUT, attempt).await {
            Ok(r) => r.map_err(RenewError::from),
            Err(_) => Err(RenewError::Timeout(RENEW_TIMEOUT)),
        };
        match result {
            Ok(None) => {
                renewed = attempt_started;
                wait = RENEW_EVERY;
            }
            Ok(Some(holder)) => {
                let why = format!("the run lock (Lease {name}) was taken over by {holder}");
                tracing::error!("{why}; stopping");
                let _ = lost.send(Some(why));
                return;
            }
            // Keep retrying while the lease is surely still ours: a blip or an API server restart
            // must not abort a bounce whose rollout is progressing fine.
            Err(e) => {
                let since = renewed.elapsed();
                match retry_after(since) {
                    Some(next) => {
                        tracing::warn!(
                            "renewing the run lock {name} failed ({since:?} after the last renewal): {e}; retrying"
                        );
                        wait = next;
                    }
                    None => {
                        tracing::error!(
                            "cannot renew the run lock {name} for {since:?}: {e}; stopping before it expires"
                        );
                        let _ = lost.send(Some(format!(
                            "the run lock (Lease {name}) could not be renewed for {}: {e}",
                            humantime::format_duration(Duration::from_secs(since.as_secs()))
                        )));
                        return;
                    }
                }
            }
        }
    }
}

/// Bare pods' attempt marks, from the run Lease's annotation (a missing Lease has none). Read in
/// every mode: plan and dry run must decide as a run would.
pub async fn read_bare_marks(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<BareMarks, LeaseError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = with_retries(&format!("read the Lease {namespace}/{name}"), || {
        api.get_opt(name)
    })
    .await
    .map_err(|source| LeaseError::Read {
        namespace: namespace.into(),
        name: name.into(),
        source,
    })?;
    let text = lease.and_then(|l| l.metadata.annotations?.remove(BARE_ATTEMPTS_ANNOTATION));
    match text {
        None => Ok(BareMarks::new()),
        Some(text) => decode_bare(&text).map_err(|source| LeaseError::BareMarks {
            namespace: namespace.into(),
            name: name.into(),
            source,
        }),
    }
}

impl LeaseGuard {
    /// Read-modify-write of one annotation of the Lease: `change` maps its value (None when
    /// absent) to the new one (None removes it) and a result; an unchanged value writes nothing.
    /// A 409 from a concurrent renewal is retried, calling `change` again on the fresh value.
    async fn update_annotation<T>(
        &self,
        key: &str,
        change: impl Fn(Option<&str>) -> (Option<String>, T),
    ) -> Result<T, kube::Error> {
        let name = self.name.as_str();
        with_retries(&format!("update {key} on the Lease {name}"), || async {
            let mut lease = self.api.get(name).await?;
            let annotations = lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            let (value, out) = change(annotations.get(key).map(String::as_str));
            if value.as_ref() == annotations.get(key) {
                return Ok(out);
            }
            match value {
                Some(v) => annotations.insert(key.to_string(), v),
                None => annotations.remove(key),
            };
            self.api
                .replace(name, &PostParams::default(), &lease)
                .await?;
            Ok(out)
        })
        .await
    }

    /// Records a bare pod's attempt on the Lease. Returns the marks as written.
    pub async fn record_bare(
        &self,
        key: String,
        attempt: &Attempt,
    ) -> Result<BareMarks, LeaseError> {
        self.update_annotation(BARE_ATTEMPTS_ANNOTATION, |text| {
            // An unreadable map made the planner skip every bare pod; starting afresh is safe.
            let marks = text.and_then(|t| decode_bare(t).ok()).unwrap_or_default();
            let marks = merge_bare(marks, key.clone(), attempt);
            (
                Some(serde_json::to_string(&marks).unwrap_or_default()),
                marks,
            )
        })
        .await
        .map_err(|source| LeaseError::RecordBare {
            pod: key,
            name: self.name.clone(),
            source,
        })
    }

    /// The Events to record now, as `decide` picks them from what the Lease says was told when
    /// (`core::notice::notices`), with what it returns to remember recorded in the same write.
    /// An unreadable annotation reads as nothing told, and a Lease that cannot be updated leaves
    /// every notice due: the worst case is one Event too many, never a missing one.
    pub async fn tell<N>(&self, decide: impl Fn(&Told) -> (Vec<N>, Told)) -> Vec<N> {
        let outcome = self
            .update_annotation(TOLD_ANNOTATION, |text| {
                let told = text
                    .and_then(|t| serde_json::from_str(t).ok())
                    .unwrap_or_default();
                let (due, next) = decide(&told);
                let value = (!next.is_empty()).then(|| serde_json::to_string(&next));
                (value.and_then(Result::ok), due)
            })
            .await;
        outcome.unwrap_or_else(|e| {
            tracing::warn!("{TOLD_ANNOTATION} on the Lease {}: {e}", self.name);
            decide(&Told::new()).0
        })
    }

    /// Gives the lease up so the next run need not wait for it to expire.
    pub async fn release(self) {
        self.renewer.abort();
        if let Ok(mut lease) = self.api.get(&self.name).await {
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() == Some(self.identity.as_str()) {
                spec.holder_identity = None;
                spec.renew_time = None;
                if let Err(e) = self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    tracing::warn!("releasing the run lock {}: {e}", self.name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts a person reads when the Lease's marks cannot be used: which Lease, which
    /// annotation or pod, and the answer.
    #[test]
    fn lease_failures_name_the_lease_and_what_was_wrong() {
        let unreadable = LeaseError::BareMarks {
            namespace: "bouncer".into(),
            name: "bouncer".into(),
            source: decode_bare("{").unwrap_err(),
        };
        assert_eq!(
            unreadable.to_string(),
            "annotation bouncer.dev/bare-pod-attempts of the Lease bouncer/bouncer: EOF while \
             parsing an object at line 1 column 1"
        );
        let api = || {
            kube::Error::Api(Box::new(kube::core::Status {
                code: 403,
                message: "leases.coordination.k8s.io \"bouncer\" is forbidden".into(),
                reason: "Forbidden".into(),
                ..Default::default()
            }))
        };
        let record = LeaseError::RecordBare {
            pod: "shop/mcp".into(),
            name: "bouncer".into(),
            source: api(),
        };
        assert!(
            record.to_string().starts_with(
                "failed to update the Lease bouncer with the attempt on pod shop/mcp: ApiError: \
                 leases.coordination.k8s.io \"bouncer\" is forbidden: Forbidden"
            ),
            "{record}"
        );
        let read = LeaseError::Read {
            namespace: "bouncer".into(),
            name: "bouncer".into(),
            source: api(),
        };
        assert!(
            matches!(&read, LeaseError::Read { source: kube::Error::Api(s), .. } if s.code == 403)
        );
        assert!(
            read.to_string()
                .starts_with("failed to read the Lease bouncer/bouncer: ")
        );
        assert_eq!(
            RenewError::Timeout(RENEW_TIMEOUT).to_string(),
            "no answer within 5s"
        );
    }

    #[test]
    fn failed_renewals_are_retried_until_the_lease_could_lapse() {
        assert_eq!(
            retry_after(Duration::from_secs(5)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            retry_after(Duration::from_millis(24_500)),
            Some(Duration::from_millis(500))
        );
        assert_eq!(retry_after(GIVE_UP_AFTER), None);
        assert_eq!(retry_after(Duration::from_secs(60)), None);
        // Renewing well inside the lease leaves room for an API server restart between renewals.
        assert!(
            RENEW_EVERY * 3 < GIVE_UP_AFTER
                && GIVE_UP_AFTER < Duration::from_secs(LEASE_SECONDS as u64)
        );
    }

    #[test]
    fn a_lease_expires_after_its_duration_since_the_last_renewal() {
        let spec = |holder: Option<&str>| LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(30),
            renew_time: Some(micro("2026-01-01T03:00:00Z".parse().unwrap())),
            ..Default::default()
        };
        // "Since the last renewal" as this machine observed it (client-go's rule).
        let t0 = Instant::now();
        let seen = observe(None, Record::of(&spec(Some("other"))), t0);
        assert!(!expired(&seen, t0 + Duration::from_secs(10)));
        assert!(expired(&seen, t0 + Duration::from_secs(600)));
        let released = observe(None, Record::of(&spec(None)), t0);
        assert!(expired(&released, t0), "a released lease is free");
    }

    /// Safety case 7: expiry is client-go's rule, a function of the records observed and this
    /// machine's monotonic clock only. A holder whose clock is 10 minutes behind ours keeps its
    /// live lease; an unchanged record expires after the lease duration observed here; any
    /// change restarts the count.
    #[test]
    fn case7_lease_expiry_is_by_locally_observed_record_change() {
        let renewed: DateTime<Utc> = "2026-01-01T02:50:00Z".parse().unwrap();
        let record = |holder: Option<&str>, renewed: DateTime<Utc>| {
            Record::of(&LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(30),
                renew_time: Some(micro(renewed)),
                ..Default::default()
            })
        };
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // First seen now: its renewTime (10 minutes "old" by our clock) does not matter.
        let seen = observe(None, record(Some("other"), renewed), t0);
        assert!(
            !expired(&seen, at(0)),
            "a skewed live holder was taken over"
        );
        assert!(!expired(&seen, at(29)));
        // Renewed at 20 s (its clock still behind): the count starts again.
        let renewed_again = observe(
            Some(seen.clone()),
            record(Some("other"), renewed + chrono::Duration::seconds(5)),
            at(20),
        );
        assert_eq!(renewed_again.since, at(20));
        assert!(!expired(&renewed_again, at(45)));
        assert!(expired(&renewed_again, at(50)));
        // Unchanged for the lease duration as observed here: expired.
        let same = observe(Some(seen), record(Some("other"), renewed), at(31));
        assert_eq!(same.since, t0);
        assert!(expired(&same, at(31)));
        // A released lease is free at once.
        assert!(expired(&observe(None, record(None, renewed), t0), t0));
    }
}
