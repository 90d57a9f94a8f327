//! bouncer's durable mark of its last bounce attempt on a workload (time, policy, method,
//! outcome): what makes the cooldown, and the schedule, honour an attempt whatever its method and
//! outcome, where pod start times and restartedAt alone forget a failed or evicting bounce.
//!
//! Controllers carry it as the metadata annotation `bouncer.dev/last-attempt`, which rolls
//! nothing (metadata is not part of the pod template). A bare pod's mark must survive the pod it
//! describes, so bare pods' marks live on the run Lease, keyed `namespace/name`.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};

use crate::core::literals::ATTEMPT_ANNOTATION;
pub use crate::core::model::{Attempt, AttemptMark, AttemptOutcome};
use crate::core::model::{Inventory, Kind, Method};

impl Attempt {
    pub fn new(time: DateTime<Utc>, policy: &str, method: Method) -> Attempt {
        Attempt {
            time,
            policy: policy.to_string(),
            method,
            outcome: AttemptOutcome::Started,
        }
    }

    pub fn with_outcome(&self, outcome: AttemptOutcome) -> Attempt {
        Attempt {
            outcome,
            ..self.clone()
        }
    }

    /// The annotation value: one line of JSON; milliseconds, so attempts within a second order.
    pub fn encode(&self) -> String {
        serde_json::json!({
            "time": self.time.to_rfc3339_opts(SecondsFormat::Millis, true),
            "policy": self.policy,
            "method": self.method,
            "outcome": self.outcome,
        })
        .to_string()
    }

    pub fn decode(text: &str) -> Result<Attempt, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }
}

impl AttemptMark {
    /// A controller's mark from its metadata annotations.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> AttemptMark {
        match annotations.get(ATTEMPT_ANNOTATION) {
            None => AttemptMark::None,
            Some(text) => match Attempt::decode(text) {
                Ok(a) => AttemptMark::Seen(a),
                Err(e) => AttemptMark::Unreadable(format!("{text:?}: {e}")),
            },
        }
    }

    pub fn time(&self) -> Option<DateTime<Utc>> {
        match self {
            AttemptMark::Seen(a) => Some(a.time),
            _ => None,
        }
    }
}

/// Bare pods' marks on the Lease: one annotation holding `{"ns/name": attempt, ...}`.
pub type BareMarks = BTreeMap<String, Attempt>;

/// Marks older than this are dropped when the Lease's map is rewritten, so it stays small; a
/// cooldown longer than this is not honoured for bare pods (documented in the README).
pub const BARE_MARK_RETENTION: chrono::TimeDelta = chrono::TimeDelta::days(30);

pub fn bare_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

pub fn decode_bare(text: &str) -> Result<BareMarks, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// The map with `key` set to `attempt` and marks past the retention dropped (relative to the
/// newest attempt, so no clock is read here).
pub fn merge_bare(mut marks: BareMarks, key: String, attempt: &Attempt) -> BareMarks {
    let horizon = attempt.time - BARE_MARK_RETENTION;
    marks.retain(|_, a| a.time >= horizon);
    marks.insert(key, attempt.clone());
    marks
}

impl Inventory {
    /// Gives each bare pod its mark from the Lease (or, when the Lease could not be read, an
    /// unreadable mark, so bare pods are skipped rather than bounced without their history).
    pub fn with_bare_marks(mut self, marks: &Result<BareMarks, String>) -> Inventory {
        for w in self
            .workloads
            .iter_mut()
            .filter(|w| w.target.kind == Kind::Pod)
        {
            w.attempt = match marks {
                Ok(m) => m
                    .get(&bare_key(&w.target.namespace, &w.target.name))
                    .map_or(AttemptMark::None, |a| AttemptMark::Seen(a.clone())),
                Err(e) => AttemptMark::Unreadable(e.clone()),
            };
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Method;

    fn attempt() -> Attempt {
        Attempt::new(
            "2026-01-01T03:00:00.250Z".parse().unwrap(),
            "nightly",
            Method::Evict,
        )
    }

    #[test]
    fn marks_round_trip_and_bad_ones_are_unreadable() {
        let a = attempt().with_outcome(AttemptOutcome::Failed);
        let text = a.encode();
        assert_eq!(
            text,
            r#"{"method":"evict","outcome":"failed","policy":"nightly","time":"2026-01-01T03:00:00.250Z"}"#
        );
        assert_eq!(Attempt::decode(&text), Ok(a.clone()));
        let annotations = |v: &str| [(ATTEMPT_ANNOTATION.to_string(), v.to_string())].into();
        assert_eq!(
            AttemptMark::from_annotations(&annotations(&text)),
            AttemptMark::Seen(a)
        );
        assert!(matches!(
            AttemptMark::from_annotations(&annotations("yesterday")),
            AttemptMark::Unreadable(_)
        ));
        assert_eq!(
            AttemptMark::from_annotations(&BTreeMap::new()),
            AttemptMark::None
        );
    }

    #[test]
    fn bare_marks_keep_the_newest_and_drop_expired_ones() {
        let mut old = attempt();
        old.time -= chrono::TimeDelta::days(31);
        let marks = merge_bare(BareMarks::new(), bare_key("a", "gone"), &old);
        let marks = merge_bare(marks, bare_key("a", "mcp"), &attempt());
        assert_eq!(marks.keys().collect::<Vec<_>>(), ["a/mcp"]);
        let text = serde_json::to_string(&marks).unwrap();
        assert_eq!(decode_bare(&text), Ok(marks));
    }
}
