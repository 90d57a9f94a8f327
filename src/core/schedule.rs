//! Schedule maths: cron in a time zone, the stateless "due" rule, and memory-trigger windows.
//!
//! Cron expressions are standard 5-field cron as Kubernetes CronJobs read them: day-of-week 0-7
//! (0 and 7 are Sunday), month and day names, and when both day-of-month and day-of-week are
//! restricted a day matches if EITHER does. Fires are computed on the wall clock of the zone:
//! - a local time that the spring-forward gap skips does not fire that day (a 02:30 job in
//!   Europe/Berlin does not run on the last Sunday of March), as the `cron` crate does in a zone;
//! - a local time that occurs twice at fall-back fires once, at its first occurrence (the `cron`
//!   crate would yield both), so no fold can make a workload due twice in one night.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::Duration;

use chrono::{
    DateTime, Datelike, LocalResult, NaiveDateTime, Offset, TimeDelta, TimeZone, Timelike, Utc,
};
use chrono_tz::Tz;

/// Why a cron expression was refused. The messages do not repeat the expression: the policy
/// error quotes it after its field.
#[derive(Debug, thiserror::Error)]
pub enum CronError {
    #[error("unsupported macro {text:?} (use @hourly, @daily, @weekly, @monthly or @yearly)")]
    UnsupportedMacro { text: String },
    #[error("a time zone inside the expression is not supported: use timeZone")]
    TimeZoneInside,
    #[error("expected 5 fields (minute hour day-of-month month day-of-week), got {got}")]
    FieldCount { got: usize },
    #[error("{field} step {step:?} must be a positive number")]
    Step { field: &'static str, step: String },
    #[error("{field} range {range} runs backwards")]
    Backwards { field: &'static str, range: String },
    #[error("{field} {value} out of range {min}-{max}")]
    OutOfRange {
        field: &'static str,
        value: u32,
        min: u32,
        max: u32,
    },
    #[error("{field} has an empty value")]
    Empty { field: &'static str },
    #[error("{field} {text:?} is not a number{}", name_hint(names))]
    NotANumber {
        field: &'static str,
        text: String,
        /// The names the field accepts besides numbers (months, days of the week).
        names: &'static [&'static str],
    },
    #[error("never fires: no date matches the day-of-month and month")]
    NeverFires,
    /// The cron crate refused what this module built from valid fields: a bug here, not in the
    /// policy, but still a refusal rather than a schedule that might fire wrongly.
    #[error("the cron library refused the expression: {source}")]
    Library {
        #[source]
        source: cron::error::Error,
    },
}

/// A validated schedule trigger.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The expression as the user wrote it (5 fields, or a macro such as @daily).
    pub expr: String,
    pub time_zone: Tz,
    pub starting_deadline: Duration,
    /// Evaluated on naive wall-clock times (as if UTC); two entries when day-of-month and
    /// day-of-week are both restricted, because cron ORs them and the crate ANDs them.
    crons: Vec<cron::Schedule>,
}

/// What the schedule says about one workload at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleVerdict {
    /// The latest fire is within the starting deadline and the workload has pods from before it.
    Due { fired: DateTime<Utc> },
    /// Every pod started at or after the latest fire (a re-run, a manual restart, a fresh deploy).
    AlreadyRestarted { fired: DateTime<Utc> },
    /// bouncer's mark says it attempted this fire (whatever came of it): one attempt per fire.
    AlreadyAttempted {
        fired: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    /// The latest fire is older than the starting deadline (e.g. a missed night).
    Missed { fired: DateTime<Utc> },
    /// The workload has no pods (or none with a start time): there is nothing to restart.
    NoPods { fired: DateTime<Utc> },
    /// The schedule has never fired before `now` (cannot happen for real crons; kept total).
    NotYet,
}

impl Schedule {
    /// Parses `expr` (standard 5-field cron, or @hourly/@daily/@midnight/@weekly/@monthly/
    /// @yearly/@annually). The error says what is wrong, without repeating the expression.
    pub fn new(expr: &str, time_zone: Tz, starting_deadline: Duration) -> Result<Self, CronError> {
        let crons = parse_cron(expr)?;
        Ok(Schedule {
            expr: expr.to_owned(),
            time_zone,
            starting_deadline,
            crons,
        })
    }

    /// The latest fire time <= now, evaluated in the schedule's time zone.
    pub fn last_fire(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // The crate searches backwards field by field, so sparse schedules (yearly) cost no more
        // than dense ones. Wall-clock times after `now` can still be earlier instants when a
        // fall-back happened in the last day, so start the search that much later.
        let offset = |t: DateTime<Utc>| t.with_timezone(&self.time_zone).offset().fix();
        let fold = (offset(now - TimeDelta::days(1)).local_minus_utc()
            - offset(now).local_minus_utc())
        .max(0);
        let local_now = whole_seconds(now.with_timezone(&self.time_zone).naive_local());
        let start = naive_as_utc(local_now + TimeDelta::seconds(i64::from(fold) + 1));
        self.crons
            .iter()
            .filter_map(|cron| {
                cron.after(&start)
                    .rev()
                    .filter_map(|wall| self.instant(wall.naive_utc()))
                    .find(|fire| *fire <= now)
            })
            .max()
    }

    /// The next fire time > now.
    pub fn next_fire(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local_now = whole_seconds(now.with_timezone(&self.time_zone).naive_local());
        let start = naive_as_utc(local_now);
        self.crons
            .iter()
            .filter_map(|cron| {
                cron.after(&start)
                    .filter_map(|wall| self.instant(wall.naive_utc()))
                    .find(|fire| *fire > now)
            })
            .min()
    }

    /// The stateless rule. `oldest_start`: start time of the workload's oldest pod (None: no
    /// pods, never due). Checked in this order: NotYet, NoPods, AlreadyRestarted (a restart after
    /// the fire settles it however late), Missed, Due. The deadline is inclusive.
    pub fn verdict(
        &self,
        now: DateTime<Utc>,
        oldest_start: Option<DateTime<Utc>>,
    ) -> ScheduleVerdict {
        let Some(fired) = self.last_fire(now) else {
            return ScheduleVerdict::NotYet;
        };
        let Some(oldest_start) = oldest_start else {
            return ScheduleVerdict::NoPods { fired };
        };
        if oldest_start >= fired {
            return ScheduleVerdict::AlreadyRestarted { fired };
        }
        let deadline = TimeDelta::from_std(self.starting_deadline).unwrap_or(TimeDelta::MAX);
        if now - fired > deadline {
            ScheduleVerdict::Missed { fired }
        } else {
            ScheduleVerdict::Due { fired }
        }
    }

    /// The instant a wall-clock fire happens: None inside a spring-forward gap, the first
    /// occurrence inside a fall-back fold.
    fn instant(&self, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
        match self.time_zone.from_local_datetime(&wall) {
            LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Some(t.with_timezone(&Utc)),
            LocalResult::None => None,
        }
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.expr, self.time_zone)
    }
}

/// A weekly window in a time zone, e.g. Mon-Fri 01:00-05:00 Europe/Berlin. `to` < `from` wraps
/// past midnight (the day is the day the window opens).
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub days: Vec<chrono::Weekday>,
    pub from: chrono::NaiveTime,
    pub to: chrono::NaiveTime,
    pub time_zone: chrono_tz::Tz,
}

/// True when `now` falls in any window (no windows: always). Each window is read in its own zone;
/// `from` is inclusive, `to` exclusive; a window with `to` < `from` belongs to the day it opens
/// and ends the next day. `from` == `to` (which the loader rejects) is an empty window.
pub fn in_windows(windows: &[Window], now: DateTime<Utc>) -> bool {
    windows.is_empty()
        || windows.iter().any(|w| {
            let local = now.with_timezone(&w.time_zone);
            let (day, time) = (local.weekday(), local.time());
            if w.from <= w.to {
                w.days.contains(&day) && w.from <= time && time < w.to
            } else {
                (w.days.contains(&day) && time >= w.from)
                    || (w.days.contains(&day.pred()) && time < w.to)
            }
        })
}

/// The windows' openings from the day before `now` for eight days, as merged `[open, close)`
/// instants in order: what the prediction needs to know how long waiting for a window would take.
/// A local time that a DST gap skips is read one hour later (02:30 as 03:30).
pub fn window_spans(windows: &[Window], now: DateTime<Utc>) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    let mut spans = Vec::new();
    for w in windows {
        let today = now.with_timezone(&w.time_zone).date_naive();
        for offset in -1..=8 {
            let day = today + chrono::Duration::days(offset);
            if !w.days.contains(&day.weekday()) {
                continue;
            }
            let close_day = if w.to <= w.from {
                day + chrono::Duration::days(1)
            } else {
                day
            };
            let (Some(open), Some(close)) = (
                local_instant(w.time_zone, day.and_time(w.from)),
                local_instant(w.time_zone, close_day.and_time(w.to)),
            ) else {
                continue;
            };
            if open < close {
                spans.push((open, close));
            }
        }
    }
    spans.sort();
    let mut merged: Vec<(DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    for (open, close) in spans {
        match merged.last_mut() {
            Some(last) if open <= last.1 => last.1 = last.1.max(close),
            _ => merged.push((open, close)),
        }
    }
    merged
}

fn local_instant(zone: chrono_tz::Tz, naive: NaiveDateTime) -> Option<DateTime<Utc>> {
    (0..=2)
        .find_map(|h| {
            zone.from_local_datetime(&(naive + chrono::Duration::hours(h)))
                .earliest()
        })
        .map(|t| t.with_timezone(&Utc))
}

fn naive_as_utc(naive: NaiveDateTime) -> DateTime<Utc> {
    Utc.from_utc_datetime(&naive)
}

/// The cron crate steps in whole seconds; a fractional `now` would shift its search by one.
fn whole_seconds(naive: NaiveDateTime) -> NaiveDateTime {
    naive.with_nanosecond(0).unwrap_or(naive)
}

/// One 5-field position: its name for messages, its range, and the names it accepts.
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const fn field(name: &'static str, min: u32, max: u32, names: &'static [&'static str]) -> Field {
    Field {
        name,
        min,
        max,
        names,
    }
}

const MINUTE: Field = field("minute", 0, 59, &[]);
const HOUR: Field = field("hour", 0, 23, &[]);
const DAY_OF_MONTH: Field = field("day-of-month", 1, 31, &[]);
const MONTHS: &[&str] = &[
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const MONTH: Field = field("month", 1, 12, MONTHS);
const DAY_OF_WEEK: Field = field(
    "day-of-week",
    0,
    7,
    &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
);

/// A parsed field: None for an unrestricted `*`/`?`, else the values it allows.
type Values = Option<BTreeSet<u32>>;

fn parse_cron(expr: &str) -> Result<Vec<cron::Schedule>, CronError> {
    let expanded = match expr.trim() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        other if other.starts_with('@') => {
            return Err(CronError::UnsupportedMacro {
                text: other.to_string(),
            });
        }
        other if other.starts_with("TZ=") || other.starts_with("CRON_TZ=") => {
            return Err(CronError::TimeZoneInside);
        }
        other => other,
    };
    let fields: Vec<&str> = expanded.split_whitespace().collect();
    let [minute, hour, dom, month, dow] = fields[..] else {
        return Err(CronError::FieldCount { got: fields.len() });
    };
    let minute = parse_field(minute, &MINUTE)?;
    let hour = parse_field(hour, &HOUR)?;
    let dom = parse_field(dom, &DAY_OF_MONTH)?;
    let month = parse_field(month, &MONTH)?;
    // Cron's Sunday is 0 or 7; the crate counts 1 (Sunday) to 7 (Saturday).
    let dow = parse_field(dow, &DAY_OF_WEEK)?.map(|days| days.iter().map(|d| d % 7 + 1).collect());
    let build = |dom: &Values, dow: &Values| {
        let text = format!(
            "0 {} {} {} {} {}",
            list(&minute),
            list(&hour),
            list(dom),
            list(&month),
            list(dow)
        );
        cron::Schedule::from_str(&text).map_err(|source| CronError::Library { source })
    };
    let crons = match (&dom, &dow) {
        (Some(_), Some(_)) => vec![build(&dom, &None)?, build(&None, &dow)?],
        _ => vec![build(&dom, &dow)?],
    };
    // Without a year field a schedule fires every few years at most (Feb 29) or never.
    let probe = naive_as_utc(NaiveDateTime::default());
    if crons.iter().all(|cron| cron.after(&probe).next().is_none()) {
        return Err(CronError::NeverFires);
    }
    Ok(crons)
}

fn list(values: &Values) -> String {
    match values {
        None => "*".into(),
        Some(set) => set.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
    }
}

fn parse_field(text: &str, field: &Field) -> Result<Values, CronError> {
    if text == "*" || (text == "?" && matches!(field.name, "day-of-month" | "day-of-week")) {
        return Ok(None);
    }
    let mut values = BTreeSet::new();
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => match step.parse::<u32>() {
                Ok(step) if step > 0 => (range, Some(step)),
                _ => {
                    return Err(CronError::Step {
                        field: field.name,
                        step: step.to_string(),
                    });
                }
            },
            None => (item, None),
        };
        let (low, high) = match range.split_once('-') {
            _ if range == "*" => (field.min, field.max),
            Some((low, high)) => (parse_value(low, field)?, parse_value(high, field)?),
            // "5/15" means from 5 to the end of the range in steps of 15.
            None if step.is_some() => (parse_value(range, field)?, field.max),
            None => {
                let value = parse_value(range, field)?;
                (value, value)
            }
        };
        if low > high {
            return Err(CronError::Backwards {
                field: field.name,
                range: range.to_string(),
            });
        }
        values.extend((low..=high).step_by(step.unwrap_or(1) as usize));
    }
    Ok(Some(values))
}

fn parse_value(text: &str, field: &Field) -> Result<u32, CronError> {
    if let Some(index) = field
        .names
        .iter()
        .position(|name| name.eq_ignore_ascii_case(text))
    {
        return Ok(index as u32 + field.min);
    }
    match text.parse::<u32>() {
        Ok(value) if (field.min..=field.max).contains(&value) => Ok(value),
        Ok(value) => Err(CronError::OutOfRange {
            field: field.name,
            value,
            min: field.min,
            max: field.max,
        }),
        Err(_) if text.is_empty() => Err(CronError::Empty { field: field.name }),
        Err(_) => Err(CronError::NotANumber {
            field: field.name,
            text: text.to_string(),
            names: field.names,
        }),
    }
}

fn name_hint(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        names => format!(" or one of {}", names.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{NaiveTime, Weekday};

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn tz(name: &str) -> Tz {
        name.parse().unwrap()
    }

    fn schedule(expr: &str, zone: &str) -> Schedule {
        Schedule::new(expr, tz(zone), Duration::from_secs(2 * 3600))
            .unwrap_or_else(|e| panic!("{expr}: {e}"))
    }

    #[test]
    fn rejects_bad_expressions_with_the_reason() {
        use CronError::*;
        let refused =
            |expr: &str| Schedule::new(expr, Tz::UTC, Duration::from_secs(60)).unwrap_err();
        for (expr, want) in [
            ("0 25 * * *", ("hour", 25, 0, 23)),
            ("60 * * * *", ("minute", 60, 0, 59)),
            ("0 0 * * 8", ("day-of-week", 8, 0, 7)),
            ("0 0 0 * *", ("day-of-month", 0, 1, 31)),
            ("0 0 * 13 *", ("month", 13, 1, 12)),
        ] {
            let err = refused(expr);
            assert!(
                matches!(err, OutOfRange { field, value, min, max }
                    if (field, value, min, max) == want),
                "{expr:?}: {err:?}"
            );
        }
        for expr in ["* * * *", "0 0 3 * * *", ""] {
            assert!(matches!(refused(expr), FieldCount { .. }), "{expr:?}");
        }
        assert!(
            matches!(refused("0 0 * foo *"), NotANumber { field: "month", ref text, .. }
                if text == "foo")
        );
        assert!(
            matches!(refused("*/0 * * * *"), Step { field: "minute", ref step } if step == "0")
        );
        assert!(
            matches!(refused("0 5-1 * * *"), Backwards { field: "hour", ref range }
                if range == "5-1")
        );
        assert!(matches!(
            refused("0 3 * * MON-"),
            Empty {
                field: "day-of-week"
            }
        ));
        assert!(matches!(refused("0 0 30 2 *"), NeverFires));
        assert!(matches!(refused("@reboot"), UnsupportedMacro { ref text } if text == "@reboot"));
        assert!(matches!(refused("@every 1h"), UnsupportedMacro { .. }));
        assert!(matches!(
            refused("CRON_TZ=Europe/Berlin 0 3 * * *"),
            TimeZoneInside
        ));
        assert!(matches!(
            refused("? 3 * * *"),
            NotANumber {
                field: "minute",
                ..
            }
        ));
        // The words a person reads after the field and the expression.
        for (expr, text) in [
            ("0 25 * * *", "hour 25 out of range 0-23"),
            (
                "0 0 * foo *",
                "month \"foo\" is not a number or one of jan, feb, mar, apr, may, jun, jul, aug, sep, oct, nov, dec",
            ),
            ("? 3 * * *", "minute \"?\" is not a number"),
            (
                "0 0 3 * * *",
                "expected 5 fields (minute hour day-of-month month day-of-week), got 6",
            ),
            ("*/0 * * * *", "minute step \"0\" must be a positive number"),
            ("0 5-1 * * *", "hour range 5-1 runs backwards"),
            ("0 3 * * MON-", "day-of-week has an empty value"),
            (
                "0 0 30 2 *",
                "never fires: no date matches the day-of-month and month",
            ),
            (
                "@reboot",
                "unsupported macro \"@reboot\" (use @hourly, @daily, @weekly, @monthly or @yearly)",
            ),
            (
                "TZ=UTC 0 3 * * *",
                "a time zone inside the expression is not supported: use timeZone",
            ),
        ] {
            assert_eq!(refused(expr).to_string(), text, "{expr:?}");
        }
        let library = CronError::Library {
            source: cron::Schedule::from_str("x").unwrap_err(),
        };
        assert!(
            library
                .to_string()
                .starts_with("the cron library refused the expression: "),
            "{library}"
        );
        let valid = [
            "0 3 * * *",
            "*/15 * * * *",
            "0 3 * * mon-FRI",
            "0 3 1,15 * ?",
            "@daily",
        ];
        for expr in valid.into_iter().chain(["5/15 1-5/2 * JAN-mar 7"]) {
            assert!(
                Schedule::new(expr, Tz::UTC, Duration::from_secs(60)).is_ok(),
                "{expr}"
            );
        }
    }

    /// (cron, zone, now, latest fire <= now, next fire > now)
    #[rustfmt::skip]
    const FIRES: &[(&str, &str, &str, &str, &str)] = &[
        ("0 3 * * *", "Europe/Berlin", "2024-06-10T12:00:00Z", "2024-06-10T01:00:00Z", "2024-06-11T01:00:00Z"),
        // A fire exactly at `now` is the latest fire, not the next one.
        ("0 3 * * *", "Europe/Berlin", "2024-01-10T02:00:00Z", "2024-01-10T02:00:00Z", "2024-01-11T02:00:00Z"),
        ("0 3 * * *", "Europe/Berlin", "2024-01-10T01:59:59.999Z", "2024-01-09T02:00:00Z", "2024-01-10T02:00:00Z"),
        ("30 22 * * *", "America/New_York", "2024-07-04T01:00:00Z", "2024-07-03T02:30:00Z", "2024-07-04T02:30:00Z"),
        ("0 3 * * *", "Asia/Kolkata", "2024-05-01T00:00:00Z", "2024-04-30T21:30:00Z", "2024-05-01T21:30:00Z"),
        ("5/20 * * * *", "UTC", "2024-05-01T10:50:00Z", "2024-05-01T10:45:00Z", "2024-05-01T11:05:00Z"),
        ("@hourly", "UTC", "2024-05-01T10:59:59.999Z", "2024-05-01T10:00:00Z", "2024-05-01T11:00:00Z"),
        ("@yearly", "UTC", "2024-12-31T23:59:59Z", "2024-01-01T00:00:00Z", "2025-01-01T00:00:00Z"),
        ("0 0 29 2 *", "UTC", "2027-06-01T00:00:00Z", "2024-02-29T00:00:00Z", "2028-02-29T00:00:00Z"),
        // Day-of-week counts from Sunday = 0 (7 too), as in crontab.
        ("0 3 * * 1-5", "UTC", "2024-06-09T12:00:00Z", "2024-06-07T03:00:00Z", "2024-06-10T03:00:00Z"),
        ("0 3 * * 0", "UTC", "2024-06-10T00:00:00Z", "2024-06-09T03:00:00Z", "2024-06-16T03:00:00Z"),
        ("0 3 * * 7", "UTC", "2024-06-10T00:00:00Z", "2024-06-09T03:00:00Z", "2024-06-16T03:00:00Z"),
        ("@weekly", "UTC", "2024-06-10T00:00:00Z", "2024-06-09T00:00:00Z", "2024-06-16T00:00:00Z"),
        // Both day fields restricted: the 13th OR a Friday.
        ("0 3 13 * 5", "UTC", "2024-06-13T12:00:00Z", "2024-06-13T03:00:00Z", "2024-06-14T03:00:00Z"),
        ("0 3 13 * 5", "UTC", "2024-06-12T12:00:00Z", "2024-06-07T03:00:00Z", "2024-06-13T03:00:00Z"),
        // Spring forward (Berlin, 2024-03-31 02:00 -> 03:00): 02:30 does not exist that day.
        ("30 2 * * *", "Europe/Berlin", "2024-03-31T10:00:00Z", "2024-03-30T01:30:00Z", "2024-04-01T00:30:00Z"),
        // Fall back (Berlin, 2024-10-27 03:00 -> 02:00): 02:30 fires at its first occurrence only,
        // also when asked during the repeated hour.
        ("30 2 * * *", "Europe/Berlin", "2024-10-27T01:45:00Z", "2024-10-27T00:30:00Z", "2024-10-28T01:30:00Z"),
        ("30 2 * * *", "Europe/Berlin", "2024-10-27T01:15:00Z", "2024-10-27T00:30:00Z", "2024-10-28T01:30:00Z"),
        ("30 2 * * *", "Europe/Berlin", "2024-10-27T00:45:00Z", "2024-10-27T00:30:00Z", "2024-10-28T01:30:00Z"),
        // An hourly job skips the repeated hour (its wall-clock times already fired once).
        ("0 * * * *", "Europe/Berlin", "2024-10-27T01:30:00Z", "2024-10-27T00:00:00Z", "2024-10-27T02:00:00Z"),
        ("30 2 * * *", "America/New_York", "2024-03-10T12:00:00Z", "2024-03-09T07:30:00Z", "2024-03-11T06:30:00Z"),
        ("30 1 * * *", "America/New_York", "2024-11-03T06:45:00Z", "2024-11-03T05:30:00Z", "2024-11-04T06:30:00Z"),
    ];

    #[test]
    fn latest_and_next_fire_in_time_zones() {
        for (expr, zone, now, last, next) in FIRES {
            let s = schedule(expr, zone);
            assert_eq!(
                s.last_fire(at(now)),
                Some(at(last)),
                "last_fire {expr} {zone} at {now}"
            );
            assert_eq!(
                s.next_fire(at(now)),
                Some(at(next)),
                "next_fire {expr} {zone} at {now}"
            );
        }
    }

    /// The search must agree with the definition checked minute by minute: a fire is a minute
    /// whose wall-clock time matches and that is that wall time's first occurrence.
    #[test]
    fn last_fire_agrees_with_a_minute_by_minute_scan_around_transitions() {
        let is_fire = |s: &Schedule, t: DateTime<Utc>| {
            let wall = t.with_timezone(&s.time_zone).naive_local();
            s.crons.iter().any(|c| c.includes(naive_as_utc(wall))) && s.instant(wall) == Some(t)
        };
        let cases = [
            ("Europe/Berlin", "2024-03-30T18:00:00Z"),
            ("Europe/Berlin", "2024-10-26T18:00:00Z"),
            ("America/New_York", "2024-11-02T20:00:00Z"),
            ("Asia/Kolkata", "2024-06-01T00:00:00Z"),
        ];
        for (zone, from) in cases {
            for expr in [
                "30 2 * * *",
                "0 * * * *",
                "*/20 1-3 * * *",
                "15 0,2 * * 0,6",
            ] {
                let s = schedule(expr, zone);
                for step in 0..40 {
                    let now = at(from)
                        + TimeDelta::minutes(step * 37)
                        + TimeDelta::seconds(step % 3 * 20);
                    let mut t = now.with_second(0).unwrap().with_nanosecond(0).unwrap();
                    while !is_fire(&s, t) {
                        t -= TimeDelta::minutes(1);
                    }
                    assert_eq!(s.last_fire(now), Some(t), "{expr} {zone} at {now}");
                }
            }
        }
    }

    const NIGHTLY_FIRE: &str = "2024-06-10T01:00:00Z"; // 03:00 Europe/Berlin (CEST)

    #[test]
    fn stateless_verdicts() {
        use ScheduleVerdict::*;
        let s = schedule("0 3 * * *", "Europe/Berlin");
        let fired = at(NIGHTLY_FIRE);
        let old = Some(at("2024-06-01T00:00:00Z"));
        let next_night = Some(at("2024-06-10T01:10:00Z"));
        #[rustfmt::skip]
        let cases = [
            ("first run after the fire", "2024-06-10T01:05:00Z", old, Due { fired }),
            ("deadline is inclusive", "2024-06-10T03:00:00Z", old, Due { fired }),
            ("one second past the deadline", "2024-06-10T03:00:01Z", old, Missed { fired }),
            ("missed night, run at noon", "2024-06-10T10:00:00Z", old, Missed { fired }),
            ("re-run after the bounce", "2024-06-10T01:20:00Z", Some(at("2024-06-10T01:10:00Z")), AlreadyRestarted { fired }),
            ("fresh deploy after the fire", "2024-06-10T02:00:00Z", Some(at("2024-06-10T01:45:00Z")), AlreadyRestarted { fired }),
            ("pod started exactly at the fire", "2024-06-10T01:30:00Z", Some(fired), AlreadyRestarted { fired }),
            ("restarted by hand after the deadline", "2024-06-10T10:00:00Z", Some(at("2024-06-10T09:00:00Z")), AlreadyRestarted { fired }),
            ("no pods", "2024-06-10T01:05:00Z", None, NoPods { fired }),
            ("next night after a bounce", "2024-06-11T01:10:00Z", next_night, Due { fired: at("2024-06-11T01:00:00Z") }),
        ];
        for (name, now, oldest, want) in cases {
            assert_eq!(s.verdict(at(now), oldest), want, "{name}");
        }
        assert_eq!(s.verdict(DateTime::UNIX_EPOCH, old), NotYet);
    }

    /// Runs every 5 minutes through a night, bouncing whenever the verdict is Due; returns the
    /// times it bounced.
    fn simulate_night(s: &Schedule, from: &str, hours: i64) -> Vec<DateTime<Utc>> {
        let mut oldest = at("2024-01-01T00:00:00Z");
        let mut bounced = Vec::new();
        let mut now = at(from);
        while now < at(from) + TimeDelta::hours(hours) {
            if let ScheduleVerdict::Due { .. } = s.verdict(now, Some(oldest)) {
                bounced.push(now);
                oldest = now + TimeDelta::minutes(1);
            }
            now += TimeDelta::minutes(5);
        }
        bounced
    }

    #[test]
    fn fall_back_night_bounces_once() {
        let s = schedule("30 2 * * *", "Europe/Berlin");
        assert_eq!(
            simulate_night(&s, "2024-10-26T20:00:00Z", 10),
            vec![at("2024-10-27T00:30:00Z")]
        );
        // The repeated 02:30 (CET) right after the bounce does not make it due again.
        let after_bounce = Some(at("2024-10-27T00:35:00Z"));
        assert!(matches!(
            s.verdict(at("2024-10-27T01:31:00Z"), after_bounce),
            ScheduleVerdict::AlreadyRestarted { .. }
        ));
        let ny = schedule("30 1 * * *", "America/New_York");
        assert_eq!(
            simulate_night(&ny, "2024-11-03T02:00:00Z", 10),
            vec![at("2024-11-03T05:30:00Z")]
        );
    }

    #[test]
    fn spring_forward_night_skips_a_job_in_the_gap() {
        let in_gap = schedule("30 2 * * *", "Europe/Berlin");
        assert_eq!(
            simulate_night(&in_gap, "2024-03-30T20:00:00Z", 10),
            Vec::<DateTime<Utc>>::new()
        );
        let after_gap = schedule("0 3 * * *", "Europe/Berlin");
        assert_eq!(
            simulate_night(&after_gap, "2024-03-30T20:00:00Z", 10),
            vec![at("2024-03-31T01:00:00Z")]
        );
    }

    fn window(days: &[Weekday], from: &str, to: &str, zone: &str) -> Window {
        let time = |s: &str| NaiveTime::parse_from_str(s, "%H:%M").unwrap();
        Window {
            days: days.to_vec(),
            from: time(from),
            to: time(to),
            time_zone: tz(zone),
        }
    }

    #[test]
    fn windows_by_day_and_time_in_their_zone() {
        use Weekday::*;
        let weeknights = window(
            &[Mon, Tue, Wed, Thu, Fri],
            "01:00",
            "05:00",
            "Europe/Berlin",
        );
        let saturday_late = window(&[Sat], "22:00", "02:00", "UTC");
        let kolkata_monday = window(&[Mon], "00:00", "06:00", "Asia/Kolkata");
        let empty = window(&[Mon, Sun], "03:00", "03:00", "UTC");
        let cases = [
            (&weeknights, "2024-06-09T23:00:00Z", true), // Mon 01:00 CEST, `from` inclusive
            (&weeknights, "2024-06-10T02:59:59Z", true), // Mon 04:59:59
            (&weeknights, "2024-06-10T03:00:00Z", false), // Mon 05:00, `to` exclusive
            (&weeknights, "2024-06-08T00:00:00Z", false), // Sat 02:00
            (&weeknights, "2024-01-08T00:30:00Z", true), // Mon 01:30 CET in winter
            (&saturday_late, "2024-06-08T23:00:00Z", true),
            (&saturday_late, "2024-06-09T01:59:00Z", true), // Sunday morning belongs to Saturday
            (&saturday_late, "2024-06-09T02:00:00Z", false),
            (&saturday_late, "2024-06-09T22:30:00Z", false), // Sunday night is not listed
            (&saturday_late, "2024-06-08T01:00:00Z", false), // Friday's night is not listed
            (&kolkata_monday, "2024-06-09T19:00:00Z", true), // Mon 00:30 IST, still Sunday in UTC
            (&kolkata_monday, "2024-06-10T01:00:00Z", false),
            (&empty, "2024-06-10T03:00:00Z", false),
        ];
        for (w, now, want) in cases {
            let one = std::slice::from_ref(w);
            assert_eq!(in_windows(one, at(now)), want, "{w:?} at {now}");
        }
        assert!(in_windows(&[], at("2024-06-08T12:00:00Z")));
        let both = [weeknights.clone(), saturday_late.clone()];
        assert!(in_windows(&both, at("2024-06-08T23:00:00Z")));
        assert!(in_windows(&both, at("2024-06-09T23:30:00Z")));
        assert!(!in_windows(&both, at("2024-06-09T12:00:00Z")));
    }

    #[test]
    fn window_spans_are_merged_instants_across_midnight_and_dst() {
        use Weekday::{Sat, Sun};
        let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        // Saturday 22:00 to Sunday 02:00 and Sunday 01:00-03:00 overlap: one span.
        let windows = [
            window(&[Sat], "22:00", "02:00", "UTC"),
            window(&[Sun], "01:00", "03:00", "UTC"),
        ];
        let spans = window_spans(&windows, at("2024-06-08T12:00:00Z"));
        assert!(spans.contains(&(at("2024-06-08T22:00:00Z"), at("2024-06-09T03:00:00Z"))));
        assert!(spans.windows(2).all(|p| p[0].1 < p[1].0), "{spans:?}");
        // 02:30 does not exist in Berlin on 2024-03-31: the window opens at 03:30 CEST.
        let berlin = [window(&[Sun], "02:30", "04:00", "Europe/Berlin")];
        let spans = window_spans(&berlin, at("2024-03-30T12:00:00Z"));
        assert_eq!(
            spans[0],
            (at("2024-03-31T01:30:00Z"), at("2024-03-31T02:00:00Z"))
        );
    }
}
