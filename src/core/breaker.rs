//! What bouncer's past attempts on a workload say about the next one. A workload whose last
//! attempts failed or were reverted backs off: the cooldown after the latest doubles per failure
//! in a row, up to 16 times. A workload attempted `breaker.maxBounces` times within
//! `breaker.per` is not bounced again until the oldest of them leaves the window (the circuit
//! breaker), and every run that refuses it says so. Both read only the attempt mark.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::core::mark::AttemptHistory;
use crate::core::model::Workload;
use crate::core::policy::{Breaker, Policy};
use crate::core::reasons::SkipReason;

/// Doublings of the cooldown at most: after four failures in a row a workload is retried every
/// 16 cooldowns (a 1h cooldown: 2h, 4h, 8h, then every 16h) until an attempt succeeds or a
/// person clears the mark.
pub const MAX_BACKOFF_DOUBLINGS: u32 = 4;

/// Both gates, breaker first: a workload that both keeps failing and keeps being bounced needs
/// a person, and the breaker is what tells one.
pub fn gates(policy: &Policy, w: &Workload, now: DateTime<Utc>) -> Result<(), SkipReason> {
    let history = w.attempt.history();
    if new_version(&history, w.template_spec) {
        return Ok(());
    }
    breaker(policy.breaker.as_ref(), &history, now)?;
    backoff(policy.cooldown, &history, now)
}

/// The pod template's spec is no longer the one the latest attempt was made on: a new version
/// (a fixed leak, say) was rolled out since, and its bounces start a history of their own, as
/// every attempt before the latest is older still. Unknown on either side: the same version.
pub fn new_version(history: &AttemptHistory, template: Option<u64>) -> bool {
    history
        .latest()
        .and_then(|a| a.template)
        .zip(template)
        .is_some_and(|(was, is)| was != is)
}

/// Failed or reverted attempts in a row, counting back from the latest, and the latest's time.
pub fn failures(history: &AttemptHistory) -> (u32, Option<DateTime<Utc>>) {
    let streak = history.entries().take_while(|a| a.outcome.failed()).count();
    (streak as u32, history.latest().map(|a| a.time))
}

fn after(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(d)
        .ok()
        .and_then(|d| t.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Skip while the latest of `n` failed attempts in a row is younger than the cooldown times
/// 2^n (n capped at `MAX_BACKOFF_DOUBLINGS`).
pub fn backoff(
    cooldown: Duration,
    history: &AttemptHistory,
    now: DateTime<Utc>,
) -> Result<(), SkipReason> {
    let (streak, Some(last)) = failures(history) else {
        return Ok(());
    };
    if streak == 0 {
        return Ok(());
    }
    let factor = 1u32 << streak.min(MAX_BACKOFF_DOUBLINGS);
    let until = after(last, cooldown.saturating_mul(factor));
    if now < until {
        return Err(SkipReason::BackingOff {
            failures: streak,
            last,
            until,
        });
    }
    Ok(())
}

/// Skip while `max_bounces` attempts or more lie within the last `per` (every attempt counts,
/// whatever its policy, method or outcome: each one disrupted the workload or tried to).
pub fn breaker(
    breaker: Option<&Breaker>,
    history: &AttemptHistory,
    now: DateTime<Utc>,
) -> Result<(), SkipReason> {
    let Some(b) = breaker else {
        return Ok(());
    };
    let within: Vec<DateTime<Utc>> = history
        .entries()
        .map(|a| a.time)
        .filter(|t| after(*t, b.per) > now)
        .collect();
    let max = b.max_bounces as usize;
    match within.get(max.saturating_sub(1)) {
        Some(oldest_counted) if max > 0 => Err(SkipReason::BreakerOpen {
            bounces: within.len(),
            max_bounces: b.max_bounces,
            per: b.per,
            until: after(*oldest_counted, b.per),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::mark::{Attempt, AttemptOutcome};
    use crate::core::model::Method;

    const H: i64 = 3600;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_780_000_000 + secs, 0).unwrap()
    }

    /// A history from (seconds, outcome) pairs, oldest first, recorded as bouncer would.
    fn history(attempts: &[(i64, AttemptOutcome)]) -> AttemptHistory {
        attempts
            .iter()
            .fold(AttemptHistory::default(), |h, &(at, outcome)| {
                h.record(&Attempt::new(t(at), "p", Method::Rollout).with_outcome(outcome))
            })
    }

    use AttemptOutcome::{Bounced, Failed, Interrupted, Reverted, RevertedEvicted, Started};

    /// Attempts as (seconds, outcome), oldest first.
    type Attempts<'a> = &'a [(i64, AttemptOutcome)];
    /// (attempts, now, what the gate says: None when it lets the bounce go).
    type Case<'a, T> = (Attempts<'a>, i64, Option<(T, i64)>);

    #[test]
    fn failures_in_a_row_double_the_cooldown_up_to_sixteen_times() {
        let cooldown = Duration::from_secs(H as u64);
        // (attempts oldest first, now, want: None = may bounce, Some((failures, until)))
        #[rustfmt::skip]
        let cases: &[Case<u32>] = &[
            (&[], 0, None),
            (&[(0, Bounced)], H, None),
            (&[(0, Started)], H, None),
            (&[(0, Interrupted)], H, None),
            (&[(0, RevertedEvicted)], H, None),
            (&[(0, Failed)], H, Some((1, 2 * H))),
            (&[(0, Failed)], 2 * H, None),
            (&[(0, Reverted)], H, Some((1, 2 * H))),
            (&[(0, Failed), (10, Reverted)], 3 * H, Some((2, 10 + 4 * H))),
            (&[(0, Failed), (10, Failed), (20, Failed)], 7 * H, Some((3, 20 + 8 * H))),
            // Capped: five and nine failures in a row wait 16 cooldowns, not 32 or 512.
            (&[(0, Failed), (1, Failed), (2, Failed), (3, Failed), (4, Failed)], 15 * H, Some((5, 4 + 16 * H))),
            (&[(0, Failed), (1, Failed), (2, Failed), (3, Failed), (4, Failed)], 4 + 16 * H, None),
            (&[(0, Failed), (1, Failed), (2, Failed), (3, Failed), (4, Failed), (5, Failed), (6, Failed), (7, Failed), (8, Failed)], 10 * H, Some((9, 8 + 16 * H))),
            // A success ends the streak: only the failures after it count.
            (&[(0, Failed), (1, Failed), (2, Bounced), (3, Failed)], H + 10, Some((1, 3 + 2 * H))),
            (&[(0, Failed), (1, Failed), (2, Bounced)], H + 10, None),
        ];
        for (attempts, now, want) in cases {
            let got = backoff(cooldown, &history(attempts), t(*now));
            let got = match got {
                Ok(()) => None,
                Err(SkipReason::BackingOff {
                    failures,
                    last,
                    until,
                }) => {
                    assert_eq!(Some(last), history(attempts).latest().map(|a| a.time));
                    Some((failures, (until - t(0)).num_seconds()))
                }
                Err(other) => panic!("{attempts:?}: {other:?}"),
            };
            assert_eq!(got, *want, "{attempts:?} at {now}");
        }
    }

    #[test]
    fn the_breaker_opens_at_max_bounces_within_the_window() {
        let b = Breaker {
            max_bounces: 3,
            per: Duration::from_secs(24 * H as u64),
        };
        // (attempts oldest first, now, want: None = closed, Some((bounces, closes at)))
        #[rustfmt::skip]
        let cases: &[Case<usize>] = &[
            (&[], 0, None),
            (&[(0, Bounced), (H, Bounced)], 2 * H, None),
            (&[(0, Bounced), (H, Bounced), (2 * H, Bounced)], 3 * H, Some((3, 24 * H))),
            // Every outcome counts.
            (&[(0, Started), (H, Failed), (2 * H, RevertedEvicted)], 3 * H, Some((3, 24 * H))),
            // It closes when the oldest counted attempt is `per` old.
            (&[(0, Bounced), (H, Bounced), (2 * H, Bounced)], 24 * H, None),
            // Four in the window: it closes when the third newest leaves it.
            (&[(0, Bounced), (H, Bounced), (2 * H, Bounced), (3 * H, Bounced)], 23 * H, Some((4, 25 * H))),
            // Old attempts outside the window do not count.
            (&[(-48 * H, Bounced), (-30 * H, Bounced), (2 * H, Bounced), (3 * H, Bounced)], 4 * H, None),
        ];
        for (attempts, now, want) in cases {
            let got = match breaker(Some(&b), &history(attempts), t(*now)) {
                Ok(()) => None,
                Err(SkipReason::BreakerOpen {
                    bounces,
                    max_bounces: 3,
                    until,
                    ..
                }) => Some((bounces, (until - t(0)).num_seconds())),
                Err(other) => panic!("{attempts:?}: {other:?}"),
            };
            assert_eq!(got, *want, "{attempts:?} at {now}");
        }
        // No breaker configured: never open.
        let many: Vec<_> = (0..10).map(|i| (i, Bounced)).collect();
        assert_eq!(breaker(None, &history(&many), t(20)), Ok(()));
    }
}
