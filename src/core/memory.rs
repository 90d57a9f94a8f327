//! The memory trigger: per-pod usage against an absolute or percent-of-limit threshold, from one
//! metrics-server sample. The triggers that read history are in `trend`.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::core::model::{MetricsState, PodSample, Workload};
use crate::core::policy::{MemoryTrigger, Threshold};
use crate::core::schedule::{Window, in_windows};

/// The workload's highest pod, as the report shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryReading {
    pub pod: String,
    pub usage: u64,
    /// The threshold that pod is held to (None without a memory trigger, or without a limit).
    pub threshold: Option<u64>,
    /// Pods without metrics; they cannot trigger.
    pub missing: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum MemoryState {
    Over {
        pod: String,
        usage: u64,
        threshold: u64,
    },
    Below {
        usage: u64,
        threshold: u64,
    },
    OutsideWindow,
    /// No pod of the workload has metrics.
    NoMetrics,
    /// percentOfLimit, but no pod has a memory limit.
    NoLimit,
    Unavailable(String),
}

pub struct Evaluation {
    pub state: MemoryState,
    /// usage / threshold of the highest pod, for ordering by urgency.
    pub ratio: Option<f64>,
}

struct PodUsage<'a> {
    pod: &'a PodSample,
    usage: u64,
    threshold: Option<u64>,
}

fn usages<'a>(trigger: Option<&MemoryTrigger>, w: &'a Workload) -> (Vec<PodUsage<'a>>, usize) {
    let container = trigger.and_then(|t| t.container.as_deref());
    let mut out = Vec::new();
    let mut missing = 0;
    for pod in &w.pods {
        let containers: Vec<_> = pod
            .containers
            .iter()
            .filter(|c| container.is_none_or(|name| *c.name == *name))
            .collect();
        let usage: Option<u64> = if pod.has_metrics && !containers.is_empty() {
            containers.iter().map(|c| c.usage).sum()
        } else {
            None
        };
        let Some(usage) = usage else {
            missing += 1;
            continue;
        };
        let threshold = threshold_of(trigger.and_then(|t| t.threshold), limit_of(pod, container));
        out.push(PodUsage {
            pod,
            usage,
            threshold,
        });
    }
    (out, missing)
}

/// A pod-level limit bounds the whole pod, and any container without a limit of its own.
pub(crate) fn limit_of(pod: &PodSample, container: Option<&str>) -> Option<u64> {
    let containers: Vec<_> = pod
        .containers
        .iter()
        .filter(|c| container.is_none_or(|name| *c.name == *name))
        .collect();
    match (container, containers.as_slice()) {
        (_, []) => None,
        (Some(_), [c]) => c.limit.or(pod.limit),
        _ => pod
            .limit
            .or_else(|| containers.iter().map(|c| c.limit).sum()),
    }
}

pub(crate) fn threshold_of(threshold: Option<Threshold>, limit: Option<u64>) -> Option<u64> {
    match threshold? {
        Threshold::Bytes(b) => Some(b),
        Threshold::PercentOfLimit(p) => limit.map(|l| (l as f64 * p / 100.0).floor() as u64),
    }
}

fn ratio(u: &PodUsage) -> Option<f64> {
    u.threshold.map(|t| u.usage as f64 / t.max(1) as f64)
}

/// The highest pod: by usage/threshold where thresholds exist, else by usage.
fn highest<'a, 'b>(all: &'b [PodUsage<'a>]) -> Option<&'b PodUsage<'a>> {
    all.iter().max_by(|a, b| {
        ratio(a)
            .unwrap_or(-1.0)
            .total_cmp(&ratio(b).unwrap_or(-1.0))
            .then(a.usage.cmp(&b.usage))
            .then(b.pod.name.cmp(&a.pod.name))
    })
}

/// The workload's memory against the policy's trigger, from one pass over its pods: the reading
/// the report shows (also without a trigger), and the trigger's evaluation (None when the
/// policy has no memory trigger).
pub fn assess(
    trigger: Option<&MemoryTrigger>,
    windows: &[Window],
    w: &Workload,
    metrics: &MetricsState,
    now: DateTime<Utc>,
) -> (Option<MemoryReading>, Option<Evaluation>) {
    let (all, missing) = usages(trigger, w);
    let top = highest(&all);
    let reading = top.map(|u| MemoryReading {
        pod: u.pod.name.clone(),
        usage: u.usage,
        threshold: u.threshold,
        missing,
    });
    // `sustained` replaces the one-sample threshold; growth or predict alone have none.
    if trigger.is_none_or(|t| t.threshold.is_none() || t.history.sustained.is_some()) {
        return (reading, None);
    }
    let ratio = top.and_then(ratio);
    let state = if let MetricsState::Unavailable(why) = metrics {
        MemoryState::Unavailable(why.clone())
    } else if all.is_empty() {
        MemoryState::NoMetrics
    } else if let Some(u) = top.filter(|u| u.threshold.is_some()) {
        let threshold = u.threshold.unwrap_or(u64::MAX);
        if u.usage <= threshold {
            MemoryState::Below {
                usage: u.usage,
                threshold,
            }
        } else if !in_windows(windows, now) {
            MemoryState::OutsideWindow
        } else {
            MemoryState::Over {
                pod: u.pod.name.clone(),
                usage: u.usage,
                threshold,
            }
        }
    } else {
        MemoryState::NoLimit
    };
    (reading, Some(Evaluation { state, ratio }))
}
