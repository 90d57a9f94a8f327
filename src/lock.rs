//! The run lock: a coordination.k8s.io/v1 Lease held and renewed for the whole run, so two
//! overlapping runs never bounce at once. An expired lease (its holder gone) is taken over.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;

use crate::error::ClusterError;
use crate::execute::Stop;

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

fn expired(spec: &LeaseSpec, now: DateTime<Utc>) -> bool {
    if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
        return true;
    }
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref());
    let Some(renewed) = renewed else { return true };
    let renewed = DateTime::from_timestamp_micros(renewed.0.as_microsecond()).unwrap_or_default();
    let duration =
        chrono::Duration::seconds(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS) as i64);
    now > renewed + duration
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
        Some(mut lease) => {
            let current = lease.spec.clone().unwrap_or_default();
            if !expired(&current, now) {
                return Ok(Acquired::Busy {
                    holder: current.holder_identity.unwrap_or_default(),
                });
            }
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
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {RENEW_TIMEOUT:?}")),
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

impl LeaseGuard {
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
        let now: DateTime<Utc> = "2026-01-01T03:00:00Z".parse().unwrap();
        let spec = |holder: Option<&str>, renewed: DateTime<Utc>| LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(30),
            renew_time: Some(micro(renewed)),
            ..Default::default()
        };
        assert!(!expired(
            &spec(Some("other"), now - chrono::Duration::seconds(10)),
            now
        ));
        assert!(expired(
            &spec(Some("other"), now - chrono::Duration::minutes(10)),
            now
        ));
        assert!(expired(&spec(None, now), now), "a released lease is free");
    }
}
