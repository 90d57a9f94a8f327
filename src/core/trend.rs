//! The memory triggers that read Prometheus history instead of one sample: over the threshold
//! for a whole window (`sustained`), a least-squares slope faster than a rate (`growth`), and the
//! line's projection to the threshold or the limit (`predict`), which applies the windows its own
//! way. Missing, stale or too few samples never make a workload due.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::core::history::{self, History, QueryError};
use crate::core::literals::rfc3339;
use crate::core::memory::{limit_of, threshold_of};
use crate::core::model::{PodSample, Workload};
use crate::core::policy::MemoryTrigger;
use crate::core::quantity::format_bytes;
use crate::core::reasons::{PredictCase, Trigger, Waiting};
use crate::core::schedule::{Window, in_windows, window_spans};

/// The history triggers' verdicts for one workload: those that fired, and why the others did not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryVerdicts {
    pub fired: Vec<Trigger>,
    pub waiting: Vec<Waiting>,
}

/// A pod's working set (its selected containers summed) over time, oldest first.
fn pod_series(
    history: &History,
    namespace: &str,
    pod: &str,
    container: Option<&str>,
) -> Vec<(f64, f64)> {
    let Some(series) = history.pods.get(&(namespace.to_string(), pod.to_string())) else {
        return Vec::new();
    };
    let selected: Vec<_> = series
        .iter()
        .filter(|s| container.is_none_or(|name| s.container == name))
        .collect();
    // A sum is only a sum where every container has a sample: a missing one would read as a dip.
    let mut sums: std::collections::BTreeMap<i64, (f64, usize)> = Default::default();
    for s in &selected {
        for &(t, v) in &s.samples {
            let e = sums.entry((t * 1000.0).round() as i64).or_default();
            e.0 += v;
            e.1 += 1;
        }
    }
    sums.into_iter()
        .filter(|(_, (_, n))| *n == selected.len())
        .map(|(ms, (v, _))| (ms as f64 / 1000.0, v))
        .collect()
}

fn human(d: &Duration) -> humantime::FormattedDuration {
    humantime::format_duration(*d)
}

/// Seconds between samples as a whole-second span (what the messages show).
fn span(seconds: f64) -> Duration {
    Duration::from_secs(seconds.max(0.0).round() as u64)
}

/// Why a pod's history cannot be assessed by a trigger: it never makes the workload due.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NoHistory {
    #[error("no memory limit")]
    NoLimit,
    /// `predict` projects to the threshold, else to the limit: it has neither.
    #[error("no memory limit and no threshold to project to")]
    NoTarget,
    #[error("no samples in the last {}", human(window))]
    NoSamples { window: Duration },
    /// The pod may be gone, or Prometheus stopped scraping it.
    #[error("stale: the last sample is {} old", human(age))]
    Stale { age: Duration },
    #[error("too few samples ({found} in the last {}, need {need})", human(window))]
    TooFew {
        found: usize,
        window: Duration,
        need: usize,
    },
    #[error("history covers {} of the {} window", human(covers), human(window))]
    Short { covers: Duration, window: Duration },
    /// `sustained` needs the whole window: a gap could hide a dip.
    #[error("a {} gap in the samples", human(gap))]
    Gap { gap: Duration },
    /// No line fits samples that all share one instant.
    #[error("samples at one instant")]
    OneInstant,
}

/// Why a projected OOM does not make the workload due now (see `predict_case`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NotYet {
    #[error("after the {} horizon", human(before))]
    AfterHorizon { before: Duration },
    #[error(
        "after the next window ends at {} and the {} horizon",
        rfc3339(*next_window_ends),
        human(before)
    )]
    AfterNextWindow {
        next_window_ends: DateTime<Utc>,
        before: Duration,
    },
    #[error(
        "after the next window opens at {}: waits for the window",
        rfc3339(*next_window_opens)
    )]
    WaitsForWindow { next_window_opens: DateTime<Utc> },
    #[error("no window opens in the next week")]
    NoWindowSoon,
}

/// The samples of the last `window`, if there are enough of them and they are recent: a history
/// that does not cover the window is "too few samples", never a bounce.
fn covered(
    all: &[(f64, f64)],
    now: f64,
    window: Duration,
    step: Duration,
    min: usize,
    whole: bool,
) -> Result<&[(f64, f64)], NoHistory> {
    let (seconds, step) = (window.as_secs_f64(), step.as_secs_f64());
    let first = all.partition_point(|(t, _)| *t < now - seconds - step / 2.0);
    let last = all.partition_point(|(t, _)| *t <= now + step / 2.0);
    let inside = &all[first..last.max(first)];
    let slack = (2.0 * step).max(120.0);
    let (Some(&(oldest, _)), Some(&(newest, _))) = (inside.first(), inside.last()) else {
        return Err(NoHistory::NoSamples { window });
    };
    if now - newest > slack {
        return Err(NoHistory::Stale {
            age: span(now - newest),
        });
    }
    if inside.len() < min {
        return Err(NoHistory::TooFew {
            found: inside.len(),
            window,
            need: min,
        });
    }
    let need = if whole {
        seconds - slack
    } else {
        seconds / 2.0
    };
    if newest - oldest < need {
        return Err(NoHistory::Short {
            covers: span(newest - oldest),
            window,
        });
    }
    if whole
        && let Some(gap) = inside
            .windows(2)
            .map(|p| p[1].0 - p[0].0)
            .find(|gap| *gap > slack)
    {
        return Err(NoHistory::Gap { gap: span(gap) });
    }
    Ok(inside)
}

/// A least-squares line through the samples: bytes per second, and its value at `now`.
fn fit(samples: &[(f64, f64)], now: f64) -> Option<(f64, f64)> {
    let n = samples.len() as f64;
    let mean_t = samples.iter().map(|s| s.0).sum::<f64>() / n;
    let mean_v = samples.iter().map(|s| s.1).sum::<f64>() / n;
    let var: f64 = samples.iter().map(|s| (s.0 - mean_t).powi(2)).sum();
    if var <= 0.0 {
        return None;
    }
    let cov: f64 = samples
        .iter()
        .map(|s| (s.0 - mean_t) * (s.1 - mean_v))
        .sum();
    let slope = cov / var;
    Some((slope, mean_v + slope * (now - mean_t)))
}

const MIN_SUSTAINED_SAMPLES: usize = 3;
/// A line through fewer points is noise.
const MIN_FIT_SAMPLES: usize = 5;

/// Bytes per second as MiB per hour.
fn mib_per_hour(bytes_per_second: f64) -> f64 {
    bytes_per_second * 3600.0 / (1u64 << 20) as f64
}

/// The per-pod results of one trigger, reduced to the workload's: the best firing pod, else why
/// none fired (the pod closest to firing, else the first pod without enough history).
struct Best {
    fired: Option<(f64, Trigger)>,
    closest: Option<(f64, String)>,
    no_history: Option<String>,
}

impl Best {
    fn new() -> Self {
        Best {
            fired: None,
            closest: None,
            no_history: None,
        }
    }
    fn fire(&mut self, score: f64, t: Trigger) {
        if self.fired.as_ref().is_none_or(|(s, _)| score > *s) {
            self.fired = Some((score, t));
        }
    }
    fn wait(&mut self, score: f64, why: String) {
        if self.closest.as_ref().is_none_or(|(s, _)| score > *s) {
            self.closest = Some((score, why));
        }
    }
    fn missing(&mut self, pod: &str, why: NoHistory) {
        self.no_history.get_or_insert(format!("{pod}: {why}"));
    }
    fn verdict(self, trigger: &'static str, windows_open: bool, out: &mut HistoryVerdicts) {
        let detail = match (self.fired, self.closest, self.no_history) {
            (Some((_, t)), _, _) if windows_open => return out.fired.push(t),
            (Some((_, t)), _, _) => format!("{t}, but outside the windows"),
            (None, Some((_, why)), _) => why,
            (None, None, Some(why)) => format!("not enough history ({why})"),
            (None, None, None) => "no pod to assess".into(),
        };
        out.waiting.push(Waiting { trigger, detail });
    }
}

/// The history triggers of `trigger` for one workload. Without history (no Prometheus, or it
/// failed) each is off with the reason; `predict` applies the windows its own way (see
/// `predict_case`), the others only fire inside them.
pub fn assess_history(
    trigger: Option<&MemoryTrigger>,
    windows: &[Window],
    w: &Workload,
    history: &Result<History, QueryError>,
    now: DateTime<Utc>,
) -> HistoryVerdicts {
    let mut out = HistoryVerdicts::default();
    let Some(trigger) = trigger else {
        return out;
    };
    let h = &trigger.history;
    let names = [
        h.sustained.map(|_| "sustained"),
        h.growth.as_ref().map(|_| "growth"),
        h.predict.as_ref().map(|_| "predict"),
    ];
    let history = match history {
        Ok(history) => history,
        Err(why) => {
            for trigger in names.into_iter().flatten() {
                // A query that failed says so; one never sent says why (not configured).
                let detail = if why.was_sent() {
                    format!("off: Prometheus history unavailable: {why}")
                } else {
                    format!("off: {why}")
                };
                out.waiting.push(Waiting { trigger, detail });
            }
            return out;
        }
    };
    let container = trigger.container.as_deref();
    let now_s = history::seconds(now);
    let open = in_windows(windows, now);
    let mut pods: Vec<&PodSample> = w.pods.iter().collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    let series: Vec<_> = pods
        .iter()
        .map(|p| {
            let limit = limit_of(p, container);
            let samples = pod_series(history, &w.target.namespace, &p.name, container);
            (p, limit, samples)
        })
        .collect();

    if let Some(window) = h.sustained {
        let mut best = Best::new();
        for (pod, limit, samples) in &series {
            let Some(threshold) = threshold_of(trigger.threshold, *limit) else {
                best.missing(&pod.name, NoHistory::NoLimit);
                continue;
            };
            match covered(
                samples,
                now_s,
                window,
                history.step,
                MIN_SUSTAINED_SAMPLES,
                true,
            ) {
                Err(why) => best.missing(&pod.name, why),
                Ok(inside) => {
                    let low = inside.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
                    let score = low / threshold.max(1) as f64;
                    if low > threshold as f64 {
                        best.fire(
                            score,
                            Trigger::MemorySustained {
                                pod: pod.name.clone(),
                                lowest: low as u64,
                                threshold,
                                window,
                                samples: inside.len(),
                            },
                        );
                    } else {
                        best.wait(
                            score,
                            format!(
                                "{} went down to {} <= {} in the last {} ({} samples)",
                                pod.name,
                                format_bytes(low as u64),
                                format_bytes(threshold),
                                human(&window),
                                inside.len()
                            ),
                        );
                    }
                }
            }
        }
        best.verdict("sustained", open, &mut out);
    }

    if let Some(g) = &h.growth {
        let mut best = Best::new();
        let above = mib_per_hour(g.above as f64 / g.per.as_secs_f64());
        for (pod, _, samples) in &series {
            let fitted = covered(
                samples,
                now_s,
                g.window,
                history.step,
                MIN_FIT_SAMPLES,
                false,
            )
            .and_then(|inside| {
                fit(inside, now_s)
                    .map(|(slope, _)| (slope, inside.len()))
                    .ok_or(NoHistory::OneInstant)
            });
            match fitted {
                Err(why) => best.missing(&pod.name, why),
                Ok((slope, n)) => {
                    let rate = mib_per_hour(slope);
                    if rate > above {
                        best.fire(
                            rate,
                            Trigger::MemoryGrowth {
                                pod: pod.name.clone(),
                                mib_per_hour: rate,
                                above_mib_per_hour: above,
                                window: g.window,
                                samples: n,
                            },
                        );
                    } else {
                        best.wait(
                            rate,
                            format!(
                                "{} {:+.1} MiB/h <= {above:.1} MiB/h over {} ({n} samples)",
                                pod.name,
                                rate,
                                human(&g.window)
                            ),
                        );
                    }
                }
            }
        }
        best.verdict("growth", open, &mut out);
    }

    if let Some(p) = &h.predict {
        let spans = window_spans(windows, now);
        let mut best = Best::new();
        for (pod, limit, samples) in &series {
            let Some(target) = threshold_of(trigger.threshold, *limit).or(*limit) else {
                best.missing(&pod.name, NoHistory::NoTarget);
                continue;
            };
            let fitted = covered(
                samples,
                now_s,
                p.window,
                history.step,
                MIN_FIT_SAMPLES,
                false,
            )
            .and_then(|inside| {
                fit(inside, now_s)
                    .map(|f| (f, inside.len()))
                    .ok_or(NoHistory::OneInstant)
            });
            let ((slope, at_now), n) = match fitted {
                Err(why) => {
                    best.missing(&pod.name, why);
                    continue;
                }
                Ok(f) => f,
            };
            let rate = mib_per_hour(slope);
            if slope <= 0.0 {
                best.wait(
                    f64::NEG_INFINITY,
                    format!(
                        "{} is not growing ({rate:+.1} MiB/h over {}, {n} samples)",
                        pod.name,
                        human(&p.window)
                    ),
                );
                continue;
            }
            let seconds = ((target as f64 - at_now) / slope).clamp(0.0, 100.0 * 366.0 * 86400.0);
            let projected = now + chrono::Duration::milliseconds((seconds * 1000.0) as i64);
            let case = predict_case(&spans, now, projected, p.before);
            // The sooner the projected OOM, the more urgent.
            let score = -seconds;
            match case {
                Ok(case) => best.fire(
                    score,
                    Trigger::MemoryPredict {
                        pod: pod.name.clone(),
                        projected,
                        target,
                        mib_per_hour: rate,
                        case,
                    },
                ),
                Err(why) => best.wait(
                    score,
                    format!(
                        "{} reaches {} at {} ({rate:+.1} MiB/h), {why}",
                        pod.name,
                        format_bytes(target),
                        rfc3339(projected)
                    ),
                ),
            }
        }
        // The prediction applies the windows itself.
        best.verdict("predict", true, &mut out);
    }
    out
}

/// When a projected OOM makes a workload due. Without windows: within `before`. Inside a window:
/// before the next window ends (waiting for it would risk the OOM) or within `before`. Outside:
/// only before the next window opens, because waiting would mean the OOM; else it waits for the
/// window.
fn predict_case(
    spans: &[(DateTime<Utc>, DateTime<Utc>)],
    now: DateTime<Utc>,
    projected: DateTime<Utc>,
    before: Duration,
) -> Result<PredictCase, NotYet> {
    let horizon = now + chrono::Duration::from_std(before).unwrap_or(chrono::TimeDelta::MAX);
    if spans.is_empty() {
        return if projected <= horizon {
            Ok(PredictCase::Horizon { before })
        } else {
            Err(NotYet::AfterHorizon { before })
        };
    }
    match spans
        .iter()
        .position(|(open, close)| *open <= now && now < *close)
    {
        Some(i) => {
            let next_close = spans.get(i + 1).map(|s| s.1);
            match next_close {
                Some(close) if projected < close => Ok(PredictCase::InsideWindow {
                    next_window_ends: close,
                }),
                _ if projected <= horizon => Ok(PredictCase::Horizon { before }),
                Some(close) => Err(NotYet::AfterNextWindow {
                    next_window_ends: close,
                    before,
                }),
                None => Err(NotYet::AfterHorizon { before }),
            }
        }
        None => match spans.iter().find(|(open, _)| *open > now) {
            Some(&(open, _)) if projected < open => Ok(PredictCase::OutsideWindow {
                next_window_opens: open,
            }),
            Some(&(open, _)) => Err(NotYet::WaitsForWindow {
                next_window_opens: open,
            }),
            None => Err(NotYet::NoWindowSoon),
        },
    }
}

#[cfg(test)]
#[path = "trend_tests.rs"]
pub(crate) mod tests;
