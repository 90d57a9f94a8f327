//! Long waits say what they wait for: a log line every [`PERIOD`] with the time spent and the
//! time left, so a stuck rollout is not silent until its timeout.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How often a wait reports.
pub const PERIOD: Duration = Duration::from_secs(30);

/// Runs `wait` to its end, calling `tick(elapsed, remaining)` every `period` while it runs.
/// `deadline` is when the wait gives up (for the time left).
pub async fn with_ticks<T>(
    wait: impl Future<Output = T>,
    period: Duration,
    deadline: Instant,
    mut tick: impl FnMut(Duration, Duration),
) -> T {
    let started = Instant::now();
    let mut ticks = tokio::time::interval_at(started + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(wait);
    loop {
        tokio::select! {
            done = &mut wait => return done,
            now = ticks.tick() => tick(now - started, deadline.saturating_duration_since(now)),
        }
    }
}

/// [`with_ticks`] at [`PERIOD`], logging `still waiting for {what}` at info.
pub async fn logged<T>(wait: impl Future<Output = T>, what: &str, deadline: Instant) -> T {
    with_ticks(wait, PERIOD, deadline, |elapsed, remaining| {
        tracing::info!(
            "still waiting for {what}: {} elapsed, {} left before the timeout",
            seconds(elapsed),
            seconds(remaining)
        );
    })
    .await
}

fn seconds(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_ticks_every_period_with_elapsed_and_remaining_time() {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(100);
        let mut seen = Vec::new();
        let out = with_ticks(
            async {
                tokio::time::sleep(Duration::from_secs(95)).await;
                "done"
            },
            PERIOD,
            deadline,
            |elapsed, remaining| seen.push((elapsed.as_secs(), remaining.as_secs())),
        )
        .await;
        assert_eq!(out, "done");
        assert_eq!(seen, [(30, 70), (60, 40), (90, 10)]);
        // A short wait says nothing.
        let mut quiet = 0;
        with_ticks(async {}, PERIOD, deadline, |_, _| quiet += 1).await;
        assert_eq!(quiet, 0);
        assert_eq!(seconds(Duration::from_millis(90_500)), "1m 30s");
    }
}
