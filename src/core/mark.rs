//! bouncer's durable mark of its last bounce attempts on a workload (time, policy, method,
//! outcome): what makes the cooldown, the schedule, the backoff after failures and the circuit
//! breaker honour an attempt whatever its method and outcome, where pod start times and
//! restartedAt alone forget a failed or evicting bounce.
//!
//! Controllers carry it as the metadata annotation `bouncer.dev/last-attempt`, which rolls
//! nothing (metadata is not part of the pod template). A bare pod's mark must survive the pod it
//! describes, so bare pods' marks live on the run Lease, keyed `namespace/name`.
//!
//! The value is the latest attempt as one JSON object, as it always was, plus `earlier`: up to
//! nine older attempts as `[time, outcome]`, newest first. A mark written before the history
//! existed is a history of one; a history of one is written exactly as such a mark was.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::core::literals::ATTEMPT_ANNOTATION;
pub use crate::core::model::{Attempt, AttemptHistory, AttemptMark, AttemptOutcome, PastAttempt};
use crate::core::model::{Inventory, Kind, Method};

/// Attempts a mark keeps, the latest included: enough for any `breaker.maxBounces` (validated
/// against it) while a mark stays well under a kilobyte.
pub const MAX_ATTEMPTS: usize = 10;

/// Earlier attempts older than this before the latest are dropped when the mark is rewritten,
/// and bare pods' marks older than this are dropped from the Lease: a `breaker.per` longer than
/// this could not be counted (validated against it), and a cooldown longer than this is not
/// honoured for bare pods (documented in docs/safety.md, rule 1).
pub const RETENTION: chrono::TimeDelta = chrono::TimeDelta::days(30);

impl Attempt {
    pub fn new(time: DateTime<Utc>, policy: &str, method: Method) -> Attempt {
        Attempt {
            time,
            policy: policy.to_string(),
            method,
            outcome: AttemptOutcome::Started,
            template: None,
        }
    }

    /// The attempt, made on the pod template whose spec has this digest.
    pub fn on_template(self, template: Option<u64>) -> Attempt {
        Attempt { template, ..self }
    }

    pub fn with_outcome(&self, outcome: AttemptOutcome) -> Attempt {
        Attempt {
            outcome,
            ..self.clone()
        }
    }
}

impl AttemptOutcome {
    /// An attempt that left the workload as it was or worse (it failed, or its owner reverted
    /// it and nothing evicted the pods): trying again at once would most likely do the same.
    /// `started` is not one: a rollout's mark keeps it whatever came of the rollout.
    pub fn failed(self) -> bool {
        matches!(self, AttemptOutcome::Failed | AttemptOutcome::Reverted)
    }
}

/// Milliseconds, so attempts within a second order.
fn millis(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The mark as stored. `deny_unknown_fields`: a hand-edited mark with a typo is unreadable (the
/// planner skips the workload), not silently a history without the misspelt part.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    time: DateTime<Utc>,
    policy: String,
    method: Method,
    outcome: AttemptOutcome,
    /// Hex, as written by `to_json`.
    #[serde(default)]
    template: Option<String>,
    #[serde(default)]
    earlier: Vec<(DateTime<Utc>, AttemptOutcome)>,
}

impl AttemptHistory {
    /// The history of one attempt.
    pub fn of(attempt: &Attempt) -> AttemptHistory {
        AttemptHistory {
            latest: Some(attempt.clone()),
            earlier: Vec::new(),
        }
    }

    pub fn latest(&self) -> Option<&Attempt> {
        self.latest.as_ref()
    }

    /// Every attempt kept, newest first.
    pub fn entries(&self) -> impl Iterator<Item = PastAttempt> + '_ {
        self.latest
            .iter()
            .map(|a| PastAttempt {
                time: a.time,
                outcome: a.outcome,
            })
            .chain(self.earlier.iter().copied())
    }

    /// The history with `attempt` recorded: a new attempt becomes the latest; the same attempt
    /// again (same time and policy: its outcome, written after its start) replaces it. Earlier
    /// attempts past `RETENTION` before the newest, and beyond `MAX_ATTEMPTS`, are dropped, so
    /// the mark stays bounded however often it is rewritten.
    pub fn record(&self, attempt: &Attempt) -> AttemptHistory {
        let mut earlier = self.earlier.clone();
        match &self.latest {
            Some(l) if l.time == attempt.time && l.policy == attempt.policy => {}
            Some(l) => earlier.push(PastAttempt {
                time: l.time,
                outcome: l.outcome,
            }),
            None => {}
        }
        AttemptHistory {
            latest: Some(attempt.clone()),
            earlier,
        }
        .bounded()
    }

    fn bounded(mut self) -> AttemptHistory {
        if let Some(latest) = &self.latest {
            let horizon = latest.time - RETENTION;
            self.earlier
                .retain(|p| p.time >= horizon && p.time <= latest.time);
        }
        self.earlier.sort_by_key(|p| std::cmp::Reverse(p.time));
        self.earlier.truncate(MAX_ATTEMPTS - 1);
        self
    }

    /// The annotation value: one line of JSON (see the module's comment).
    pub fn encode(&self) -> String {
        self.to_json().to_string()
    }

    fn to_json(&self) -> serde_json::Value {
        let Some(a) = &self.latest else {
            return serde_json::Value::Null;
        };
        let mut v = serde_json::json!({
            "time": millis(a.time),
            "policy": a.policy,
            "method": a.method,
            "outcome": a.outcome,
        });
        if let Some(t) = a.template {
            v["template"] = format!("{t:016x}").into();
        }
        if !self.earlier.is_empty() {
            v["earlier"] = self
                .earlier
                .iter()
                .map(|p| serde_json::json!([millis(p.time), p.outcome]))
                .collect();
        }
        v
    }

    pub fn decode(text: &str) -> Result<AttemptHistory, MarkDecodeError> {
        Ok(serde_json::from_str(text)?)
    }
}

impl Serialize for AttemptHistory {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl<'de> Deserialize<'de> for AttemptHistory {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = Wire::deserialize(d)?;
        let template = match w.template.as_deref() {
            None => None,
            Some(hex) => Some(u64::from_str_radix(hex, 16).map_err(|_| {
                serde::de::Error::custom(format!("template: {hex:?} is not a hex digest"))
            })?),
        };
        Ok(AttemptHistory {
            latest: Some(Attempt {
                time: w.time,
                policy: w.policy,
                method: w.method,
                outcome: w.outcome,
                template,
            }),
            earlier: w
                .earlier
                .into_iter()
                .map(|(time, outcome)| PastAttempt { time, outcome })
                .collect(),
        }
        // A hand-written mark is held to the same bounds as bouncer's own.
        .bounded())
    }
}

impl AttemptMark {
    /// A controller's mark from its metadata annotations.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> AttemptMark {
        match annotations.get(ATTEMPT_ANNOTATION) {
            None => AttemptMark::None,
            Some(text) => match AttemptHistory::decode(text) {
                Ok(h) => AttemptMark::Seen(Box::new(h)),
                Err(e) => AttemptMark::Unreadable(format!("{text:?}: {e}")),
            },
        }
    }

    /// The mark of an object `created` at that time: a latest attempt from before then (and
    /// more than a minute of clock skew before) was written on an earlier object of the same
    /// name, and came with its manifest; the new object has no history, so that mark neither
    /// holds it back nor makes it due. Only for marks kept on the object itself: a bare pod's
    /// mark is on the Lease precisely to outlive the pod.
    pub fn written_since(self, created: Option<DateTime<Utc>>) -> AttemptMark {
        let skew = chrono::TimeDelta::minutes(1);
        match (&self, created) {
            (AttemptMark::Seen(_), Some(created))
                if self.time().is_some_and(|t| t + skew < created) =>
            {
                AttemptMark::None
            }
            _ => self,
        }
    }

    /// The latest attempt, read in place (the planner asks it of every workload).
    pub fn latest(&self) -> Option<&Attempt> {
        match self {
            AttemptMark::Seen(h) => h.latest(),
            _ => None,
        }
    }

    /// When the latest attempt began.
    pub fn time(&self) -> Option<DateTime<Utc>> {
        self.latest().map(|a| a.time)
    }

    /// The attempts the mark holds (none when there is no mark or it is unreadable: the planner
    /// skips an unreadable one before anything reads its history).
    pub fn history(&self) -> AttemptHistory {
        match self {
            AttemptMark::Seen(h) => (**h).clone(),
            _ => AttemptHistory::default(),
        }
    }

    /// What the edge writes for `attempt`: this mark's history with the attempt recorded.
    pub fn recorded(&self, attempt: &Attempt) -> AttemptHistory {
        self.history().record(attempt)
    }
}

/// A mark annotation bouncer cannot read (edited by hand, cut short, or not JSON): serde's
/// message says where and what, which is all a person needs to fix it.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct MarkDecodeError(#[from] serde_json::Error);

/// Bare pods' marks on the Lease: one annotation holding `{"ns/name": mark, ...}`.
pub type BareMarks = BTreeMap<String, AttemptHistory>;

pub fn bare_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

pub fn decode_bare(text: &str) -> Result<BareMarks, MarkDecodeError> {
    Ok(serde_json::from_str(text)?)
}

/// The map with `attempt` recorded in `key`'s history and marks whose latest attempt is past
/// the retention dropped (relative to this attempt, so no clock is read here).
pub fn merge_bare(mut marks: BareMarks, key: String, attempt: &Attempt) -> BareMarks {
    let horizon = attempt.time - RETENTION;
    marks.retain(|_, h| h.latest().is_some_and(|a| a.time >= horizon));
    let history = marks.get(&key).cloned().unwrap_or_default().record(attempt);
    marks.insert(key, history);
    marks
}

impl Inventory {
    /// Gives each bare pod its mark from the Lease (or, when the Lease could not be read, an
    /// unreadable mark, so bare pods are skipped rather than bounced without their history).
    /// Only the failure's text is kept: the skip reports it, and the core cannot name the
    /// edge's error.
    pub fn with_bare_marks<E: std::fmt::Display>(
        mut self,
        marks: &Result<BareMarks, E>,
    ) -> Inventory {
        for w in self
            .workloads
            .iter_mut()
            .filter(|w| w.target.kind == Kind::Pod)
        {
            w.attempt = match marks {
                Ok(m) => m
                    .get(&bare_key(&w.target.namespace, &w.target.name))
                    .map_or(AttemptMark::None, |h| {
                        AttemptMark::Seen(Box::new(h.clone()))
                    }),
                Err(e) => AttemptMark::Unreadable(e.to_string()),
            };
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::model::Method;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    fn attempt() -> Attempt {
        Attempt::new(at("2026-01-01T03:00:00.250Z"), "nightly", Method::Evict)
    }

    fn annotations(v: &str) -> BTreeMap<String, String> {
        [(ATTEMPT_ANNOTATION.to_string(), v.to_string())].into()
    }

    #[test]
    fn marks_round_trip_and_bad_ones_are_unreadable() {
        let a = attempt().with_outcome(AttemptOutcome::Failed);
        let h = AttemptHistory::of(&a);
        let text = h.encode();
        // A history of one is written exactly as a single-attempt mark always was.
        assert_eq!(
            text,
            r#"{"method":"evict","outcome":"failed","policy":"nightly","time":"2026-01-01T03:00:00.250Z"}"#
        );
        assert_eq!(AttemptHistory::decode(&text).unwrap(), h.clone());
        assert_eq!(
            AttemptMark::from_annotations(&annotations(&text)),
            AttemptMark::Seen(Box::new(h))
        );
        // The template's digest round-trips as hex; one that is not hex is unreadable.
        let on = AttemptHistory::of(&a.clone().on_template(Some(0xfeed)));
        assert!(
            on.encode().contains(r#""template":"000000000000feed""#),
            "{}",
            on.encode()
        );
        assert_eq!(AttemptHistory::decode(&on.encode()).unwrap(), on);
        for bad in [
            r#"{"method":"evict","outcome":"failed","policy":"p","time":"2026-01-01T03:00:00Z","template":"xyz"}"#,
            "yesterday",
            r#"{"method":"evict","outcome":"failed","policy":"p","time":"2026-01-01T03:00:00Z","erlier":[]}"#,
            r#"{"method":"evict","outcome":"failed","policy":"p","time":"2026-01-01T03:00:00Z","earlier":[["soon","failed"]]}"#,
        ] {
            assert!(
                matches!(
                    AttemptMark::from_annotations(&annotations(bad)),
                    AttemptMark::Unreadable(_)
                ),
                "{bad}"
            );
        }
        assert_eq!(
            AttemptMark::from_annotations(&BTreeMap::new()),
            AttemptMark::None
        );
    }

    /// Deleted and recreated with the old manifest: a mark from before the object existed is
    /// not its history; one written since (or within the clock skew) is, and an unreadable one
    /// still fails closed.
    #[test]
    fn a_mark_older_than_its_object_came_with_a_copied_manifest() {
        let seen = AttemptMark::Seen(Box::new(AttemptHistory::of(&attempt())));
        let bounced = at("2026-01-01T03:00:00.250Z");
        for (created, kept) in [
            (None, true),
            (Some(at("2025-12-01T00:00:00Z")), true),
            (Some(bounced), true),
            (Some(bounced + chrono::TimeDelta::seconds(59)), true),
            (Some(bounced + chrono::TimeDelta::seconds(61)), false),
            (Some(at("2026-02-01T00:00:00Z")), false),
        ] {
            let want = if kept {
                seen.clone()
            } else {
                AttemptMark::None
            };
            assert_eq!(seen.clone().written_since(created), want, "{created:?}");
        }
        let bad = AttemptMark::Unreadable("x".into());
        assert_eq!(
            bad.clone().written_since(Some(at("2027-01-01T00:00:00Z"))),
            bad
        );
    }

    /// Marks written before the history existed (one attempt, second or millisecond times)
    /// decode as a history of one.
    #[test]
    fn old_single_attempt_marks_decode_as_a_history_of_one() {
        for (text, time, outcome) in [
            (
                r#"{"method":"rollout","outcome":"started","policy":"p","time":"2026-01-01T03:00:00.000Z"}"#,
                "2026-01-01T03:00:00Z",
                AttemptOutcome::Started,
            ),
            (
                r#"{"time":"2026-01-01T03:00:00Z","policy":"p","method":"evict","outcome":"reverted"}"#,
                "2026-01-01T03:00:00Z",
                AttemptOutcome::Reverted,
            ),
        ] {
            let h = AttemptHistory::decode(text).unwrap();
            let entries: Vec<_> = h.entries().collect();
            assert_eq!(
                entries,
                [PastAttempt {
                    time: at(time),
                    outcome
                }],
                "{text}"
            );
        }
    }

    #[test]
    fn history_records_newest_first_replaces_an_outcome_and_stays_bounded() {
        let t0 = at("2026-01-01T00:00:00Z");
        let mut h = AttemptHistory::default();
        // One attempt an hour for a day, each started then finished: 24 attempts, 48 writes.
        for i in 0..24 {
            let a = Attempt::new(t0 + chrono::TimeDelta::hours(i), "p", Method::Rollout);
            h = h.record(&a);
            h = h.record(&a.with_outcome(AttemptOutcome::Failed));
        }
        let entries: Vec<_> = h.entries().collect();
        assert_eq!(entries.len(), MAX_ATTEMPTS);
        assert_eq!(entries[0].time, t0 + chrono::TimeDelta::hours(23));
        assert!(entries.windows(2).all(|w| w[0].time > w[1].time));
        assert!(entries.iter().all(|e| e.outcome == AttemptOutcome::Failed));
        let text = h.encode();
        assert!(text.len() < 600, "{} bytes: {text}", text.len());
        assert_eq!(AttemptHistory::decode(&text).unwrap(), h.clone());

        // A month later, only the new attempt is left.
        let late = Attempt::new(
            t0 + RETENTION + chrono::TimeDelta::days(1),
            "p",
            Method::Evict,
        );
        assert_eq!(h.record(&late).entries().count(), 1);
    }

    #[test]
    fn a_hand_written_long_history_is_cut_to_the_bound() {
        let earlier: Vec<String> = (0..50)
            .map(|i| format!(r#"["2026-01-01T02:{i:02}:00Z","failed"]"#))
            .collect();
        let text = format!(
            r#"{{"method":"evict","outcome":"failed","policy":"p","time":"2026-01-01T03:00:00Z","earlier":[{}]}}"#,
            earlier.join(",")
        );
        let h = AttemptHistory::decode(&text).unwrap();
        let entries: Vec<_> = h.entries().collect();
        assert_eq!(entries.len(), MAX_ATTEMPTS);
        assert_eq!(entries[1].time, at("2026-01-01T02:49:00Z"));
    }

    #[test]
    fn bare_marks_keep_the_newest_and_drop_expired_ones() {
        let mut old = attempt();
        old.time -= chrono::TimeDelta::days(31);
        let marks = merge_bare(BareMarks::new(), bare_key("a", "gone"), &old);
        let marks = merge_bare(marks, bare_key("a", "mcp"), &attempt());
        let marks = merge_bare(
            marks,
            bare_key("a", "mcp"),
            &attempt().with_outcome(AttemptOutcome::Bounced),
        );
        assert_eq!(marks.keys().collect::<Vec<_>>(), ["a/mcp"]);
        assert_eq!(marks["a/mcp"].entries().count(), 1);
        let text = serde_json::to_string(&marks).unwrap();
        assert_eq!(decode_bare(&text).unwrap(), marks);
        // A Lease written before the history existed.
        let old_lease = r#"{"a/mcp":{"method":"evict","outcome":"bounced","policy":"p","time":"2026-01-01T03:00:00.000Z"}}"#;
        assert_eq!(
            decode_bare(old_lease).unwrap()["a/mcp"].entries().count(),
            1
        );
    }
}
