//! Validation of one parsed document: turns a `RawPolicy` into a `Policy`, applying defaults and
//! recording every problem (not just the first) with its field path and value. apiVersion and
//! kind are checked on the untyped document first, so a foreign object gets one clear error.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{NaiveTime, Weekday};
use chrono_tz::Tz;
use serde_yaml_ng::Value;

use super::check::Check;
use super::raw::{
    RawBreaker, RawGrowth, RawMemory, RawPolicy, RawPredict, RawRestart, RawSchedule, RawSelector,
    RawTarget, RawWindow,
};
use super::{API_VERSION, KIND, Selector, Threshold, Window};
use super::{
    Breaker, MemoryTrigger, OnRevert, Operator, Policy, Requirement, Restart, RestartMethod,
};
use super::{Growth, HistoryTriggers, Predict};
use super::{bytes_value, duration_value, percent_value};
use crate::core::model::Kind;
use crate::core::schedule::Schedule;
use crate::core::selector::{
    dns1123_label_problem, dns1123_subdomain_problem, label_key_problem, label_value_problem,
};

const DEFAULT_STARTING_DEADLINE: Duration = Duration::from_secs(2 * 3600);
const DEFAULT_COOLDOWN: Duration = Duration::from_secs(3600);
const DEFAULT_PREDICT_WINDOW: Duration = Duration::from_secs(3600);
/// A window needs a handful of samples to mean anything, and history is read once per run: one
/// query over days of pods would be slow for Prometheus and large for bouncer.
const MIN_HISTORY_WINDOW: Duration = Duration::from_secs(60);
const MAX_HISTORY_WINDOW: Duration = Duration::from_secs(7 * 86400);

/// The validated policy, or None when any problem was recorded in `check`.
pub(super) fn validate(raw: RawPolicy, check: &mut Check) -> Option<Policy> {
    let RawPolicy { metadata, spec, .. } = raw;
    if let Some(problem) = dns1123_subdomain_problem(&metadata.name) {
        check.bad("metadata.name", &metadata.name, problem);
    }
    labels(check, "metadata.labels", &metadata.labels, true);
    labels(check, "metadata.annotations", &metadata.annotations, false);

    let (namespaces, selector, kinds, group_by) = target(check, spec.target);
    let triggers = spec.triggers;
    if triggers.schedule.is_none() && triggers.memory.is_none() {
        check.at("spec.triggers", "no trigger: set schedule, memory or both");
    }
    let has_memory = triggers.memory.is_some();
    let schedule = triggers.schedule.map(|s| schedule(check, s));
    let memory = triggers.memory.map(|m| memory(check, m));
    if !spec.windows.is_empty() && !has_memory {
        check.at(
            "spec.windows",
            "windows only gate the memory trigger, and this policy has none",
        );
    }
    // Windows default to the schedule's zone so "03:00" means the same clock in both places.
    let window_zone = match &schedule {
        Some(Some(s)) => s.time_zone,
        _ => Tz::UTC,
    };
    let windows: Vec<Option<Window>> = spec
        .windows
        .into_iter()
        .enumerate()
        .map(|(i, w)| window(check, i, w, window_zone))
        .collect();
    let cooldown = duration(
        check,
        "spec.cooldown",
        spec.cooldown.as_deref(),
        DEFAULT_COOLDOWN,
    );
    if spec.max_per_run == Some(0) {
        check.error(
            Some("spec.maxPerRun".into()),
            Some("0".into()),
            "must be at least 1 (omit it for no limit)",
        );
    }
    let restart = restart(check, spec.restart);
    let overrides = super::bounds::overrides(
        check,
        spec.overrides,
        memory.as_ref().map(|m| m.as_ref().map(|m| m.threshold)),
        cooldown,
    );
    let block_when = spec.block_when.map(|b| b.prometheus);
    if block_when.as_ref().is_some_and(|q| q.trim().is_empty()) {
        check.at(
            "spec.blockWhen.prometheus",
            "must be a PromQL query, not empty",
        );
    }
    let breaker = spec.breaker.map(|b| breaker(check, b));

    if check.failed() {
        return None;
    }
    Some(Policy {
        name: metadata.name,
        source: format!("{} (document {})", check.file(), check.document()),
        namespaces,
        selector: selector?,
        kinds,
        group_by,
        schedule: match schedule {
            Some(parsed) => Some(parsed?),
            None => None,
        },
        memory: match memory {
            Some(parsed) => Some(parsed?),
            None => None,
        },
        windows: windows.into_iter().collect::<Option<_>>()?,
        cooldown: cooldown?,
        max_per_run: spec.max_per_run,
        allow_downtime: spec.allow_downtime.unwrap_or(false),
        dry_run: spec.dry_run.unwrap_or(false),
        suspend: spec.suspend.unwrap_or(false),
        restart: restart?,
        block_when,
        overrides: overrides?,
        breaker: match breaker {
            Some(parsed) => Some(parsed?),
            None => None,
        },
    })
}

/// `spec.breaker`: bounded by what the attempt mark keeps, so every bounce it counts is there.
fn breaker(check: &mut Check, raw: RawBreaker) -> Option<Breaker> {
    const FIELD: &str = "spec.breaker";
    let max = crate::core::mark::MAX_ATTEMPTS as u32;
    let max_bounces = if (1..=max).contains(&raw.max_bounces) {
        Some(raw.max_bounces)
    } else {
        check.error(
            Some(format!("{FIELD}.maxBounces")),
            Some(raw.max_bounces.to_string()),
            format!("must be 1 to {max} (the attempt mark keeps the last {max})"),
        );
        None
    };
    let per = duration(
        check,
        &format!("{FIELD}.per"),
        Some(&raw.per),
        Duration::ZERO,
    )?;
    let retention = crate::core::mark::RETENTION.to_std().unwrap_or_default();
    if per > retention {
        check.bad(
            format!("{FIELD}.per"),
            &raw.per,
            "must be at most 30d (the attempt mark keeps 30 days)",
        );
        return None;
    }
    Some(Breaker {
        max_bounces: max_bounces?,
        per,
    })
}

fn labels(check: &mut Check, field: &str, map: &BTreeMap<String, String>, check_values: bool) {
    for (key, value) in map {
        if let Some(problem) = label_key_problem(key) {
            check.bad(field, key, problem);
        }
        if let Some(problem) = label_value_problem(value).filter(|_| check_values) {
            check.bad(format!("{field}[{key}]"), value, problem);
        }
    }
}

type Target = (Vec<String>, Option<Selector>, Vec<Kind>, Option<String>);

fn target(check: &mut Check, target: RawTarget) -> Target {
    let mut namespaces = Vec::new();
    for (i, ns) in target.namespaces.into_iter().flatten().enumerate() {
        if let Some(problem) = dns1123_label_problem(&ns) {
            check.bad(format!("spec.target.namespaces[{i}]"), &ns, problem);
        } else if !namespaces.contains(&ns) {
            namespaces.push(ns);
        }
    }
    let selector = selector(check, target.selector);
    let kinds = match target.kinds {
        None => Kind::CONTROLLERS.to_vec(),
        Some(list) if list.is_empty() => {
            check.at(
                "spec.target.kinds",
                "must list at least one kind (omit it for Deployment, StatefulSet and DaemonSet)",
            );
            Vec::new()
        }
        Some(list) => list.into_iter().fold(Vec::new(), |mut kinds, kind| {
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
            kinds
        }),
    };
    if let Some((key, problem)) = target
        .group_by
        .as_ref()
        .and_then(|key| Some((key, label_key_problem(key)?)))
    {
        check.bad("spec.target.groupBy", key, problem);
    }
    (namespaces, selector, kinds, target.group_by)
}

fn selector(check: &mut Check, raw: RawSelector) -> Option<Selector> {
    const FIELD: &str = "spec.target.selector";
    labels(
        check,
        &format!("{FIELD}.matchLabels"),
        &raw.match_labels,
        true,
    );
    let mut match_expressions = Vec::new();
    for (i, req) in raw.match_expressions.into_iter().enumerate() {
        let field = format!("{FIELD}.matchExpressions[{i}]");
        if let Some(problem) = label_key_problem(&req.key) {
            check.bad(format!("{field}.key"), &req.key, problem);
        }
        let needs_values = matches!(req.operator, Operator::In | Operator::NotIn);
        match (needs_values, req.values.is_empty()) {
            (true, true) => check.at(
                format!("{field}.values"),
                format!("{:?} needs at least one value", req.operator),
            ),
            (false, false) => check.at(
                format!("{field}.values"),
                format!("{:?} takes no values", req.operator),
            ),
            _ => {}
        }
        for (j, value) in req.values.iter().enumerate() {
            if let Some(problem) = label_value_problem(value) {
                check.bad(format!("{field}.values[{j}]"), value, problem);
            }
        }
        match_expressions.push(Requirement {
            key: req.key,
            operator: req.operator,
            values: req.values,
        });
    }
    let selector = Selector {
        match_labels: raw.match_labels,
        match_expressions,
    };
    if selector.is_empty() {
        check.at(
            FIELD,
            "matchLabels and matchExpressions are both empty; a policy must not match every pod",
        );
        return None;
    }
    if !selector.has_positive() {
        check.at(
            FIELD,
            "only NotIn/DoesNotExist requirements match every pod without those labels, nearly \
             the whole cluster: add a matchLabels entry or an In/Exists expression",
        );
        return None;
    }
    Some(selector)
}

fn schedule(check: &mut Check, raw: RawSchedule) -> Option<Schedule> {
    const FIELD: &str = "spec.triggers.schedule";
    let zone = time_zone(
        check,
        &format!("{FIELD}.timeZone"),
        raw.time_zone.as_deref(),
        Tz::UTC,
    );
    let deadline = duration(
        check,
        &format!("{FIELD}.startingDeadline"),
        raw.starting_deadline.as_deref(),
        DEFAULT_STARTING_DEADLINE,
    );
    let parsed = Schedule::new(
        &raw.cron,
        zone.unwrap_or(Tz::UTC),
        deadline.unwrap_or_default(),
    );
    match parsed {
        Err(problem) => {
            check.bad(format!("{FIELD}.cron"), &raw.cron, problem);
            None
        }
        Ok(schedule) => zone.and(deadline).map(|_| schedule),
    }
}

fn memory(check: &mut Check, raw: RawMemory) -> Option<MemoryTrigger> {
    const FIELD: &str = "spec.triggers.memory";
    let history_alone = raw.growth.is_some() || raw.predict.is_some();
    let threshold = match (raw.above, raw.percent_of_limit) {
        (Some(above), None) => match bytes_value(&above.0) {
            Ok(bytes) => Some(Some(Threshold::Bytes(bytes))),
            Err(problem) => {
                check.bad(format!("{FIELD}.above"), &above.0, problem);
                None
            }
        },
        (None, Some(percent)) => match percent_value(percent) {
            Ok(percent) => Some(Some(Threshold::PercentOfLimit(percent))),
            Err(problem) => {
                check.error(
                    Some(format!("{FIELD}.percentOfLimit")),
                    Some(percent.to_string()),
                    problem,
                );
                None
            }
        },
        (None, None) if history_alone => Some(None),
        (above, _) => {
            let which = if above.is_some() { "both" } else { "neither" };
            check.at(
                FIELD,
                format!("set exactly one of above and percentOfLimit (found {which})"),
            );
            None
        }
    };
    if let Some(container) = &raw.container
        && let Some(problem) = dns1123_label_problem(container)
    {
        check.bad(format!("{FIELD}.container"), container, problem);
    }
    let sustained = match raw.sustained.as_deref() {
        None => Some(None),
        Some(text) => history_window(check, &format!("{FIELD}.sustained"), text).map(Some),
    };
    if raw.sustained.is_some() && matches!(threshold, Some(None)) {
        check.at(
            format!("{FIELD}.sustained"),
            "needs a threshold to be over: set above or percentOfLimit",
        );
    }
    let growth = match raw.growth {
        None => Some(None),
        Some(g) => growth(check, g).map(Some),
    };
    let predict = match raw.predict {
        None => Some(None),
        Some(p) => predict(check, p).map(Some),
    };
    Some(MemoryTrigger {
        threshold: threshold?,
        container: raw.container,
        history: HistoryTriggers {
            sustained: sustained?,
            growth: growth?,
            predict: predict?,
        },
    })
}

/// A duration that a history trigger reads back over.
fn history_window(check: &mut Check, field: &str, text: &str) -> Option<Duration> {
    let d = duration(check, field, Some(text), Duration::ZERO)?;
    if d < MIN_HISTORY_WINDOW {
        check.bad(
            field,
            text,
            "must be at least 1m (a window needs several samples)",
        );
        None
    } else if d > MAX_HISTORY_WINDOW {
        check.bad(
            field,
            text,
            "must be at most 7d (history is read in one query per run)",
        );
        None
    } else {
        Some(d)
    }
}

fn growth(check: &mut Check, raw: RawGrowth) -> Option<Growth> {
    const FIELD: &str = "spec.triggers.memory.growth";
    let above = match bytes_value(&raw.above.0) {
        Ok(bytes) => Some(bytes),
        Err(problem) => {
            check.bad(format!("{FIELD}.above"), &raw.above.0, problem);
            None
        }
    };
    let per = duration(
        check,
        &format!("{FIELD}.per"),
        Some(&raw.per),
        Duration::ZERO,
    );
    let window = match (raw.window.as_deref(), per) {
        (Some(text), _) => history_window(check, &format!("{FIELD}.window"), text),
        (None, Some(per)) if per < MIN_HISTORY_WINDOW || per > MAX_HISTORY_WINDOW => {
            check.bad(
                format!("{FIELD}.per"),
                &raw.per,
                "is also the default window: set window (1m to 7d) for a rate per this unit",
            );
            None
        }
        (None, per) => per,
    };
    Some(Growth {
        above: above?,
        per: per?,
        window: window?,
    })
}

fn predict(check: &mut Check, raw: RawPredict) -> Option<Predict> {
    const FIELD: &str = "spec.triggers.memory.predict";
    let before = duration(
        check,
        &format!("{FIELD}.before"),
        Some(&raw.before),
        Duration::ZERO,
    );
    let window = match raw.window.as_deref() {
        None => Some(DEFAULT_PREDICT_WINDOW),
        Some(text) => history_window(check, &format!("{FIELD}.window"), text),
    };
    Some(Predict {
        before: before?,
        window: window?,
    })
}

fn window(check: &mut Check, index: usize, raw: RawWindow, default_zone: Tz) -> Option<Window> {
    let field = format!("spec.windows[{index}]");
    if raw.days.is_empty() {
        check.at(format!("{field}.days"), "must list at least one day");
    }
    let mut days = Vec::new();
    for (i, day) in raw.days.iter().enumerate() {
        match weekday(day) {
            Some(d) if days.contains(&d) => {}
            Some(d) => days.push(d),
            None => check.bad(
                format!("{field}.days[{i}]"),
                day,
                "not a day: use Mon..Sun or a full day name",
            ),
        }
    }
    let from = clock(check, &format!("{field}.from"), &raw.from);
    let to = clock(check, &format!("{field}.to"), &raw.to);
    if from.is_some() && from == to {
        check.bad(
            format!("{field}.to"),
            &raw.to,
            "equals from: the window would be empty",
        );
    }
    let time_zone = time_zone(
        check,
        &format!("{field}.timeZone"),
        raw.time_zone.as_deref(),
        default_zone,
    );
    Some(Window {
        days,
        from: from?,
        to: to?,
        time_zone: time_zone?,
    })
}

fn restart(check: &mut Check, raw: Option<RawRestart>) -> Option<Restart> {
    let raw = raw.unwrap_or(RawRestart {
        method: None,
        timeout: None,
        on_revert: None,
    });
    let timeout = match raw.timeout.as_deref() {
        None => None,
        Some(text) => Some(duration(
            check,
            "spec.restart.timeout",
            Some(text),
            Duration::ZERO,
        )?),
    };
    Some(Restart {
        method: raw.method.unwrap_or(RestartMethod::Auto),
        timeout,
        on_revert: raw.on_revert.unwrap_or(OnRevert::Fail),
    })
}

fn duration(
    check: &mut Check,
    field: &str,
    text: Option<&str>,
    default: Duration,
) -> Option<Duration> {
    let Some(text) = text else {
        return Some(default);
    };
    match duration_value(text) {
        Ok(d) => Some(d),
        Err(problem) => {
            check.bad(field, text, problem);
            None
        }
    }
}

fn time_zone(check: &mut Check, field: &str, text: Option<&str>, default: Tz) -> Option<Tz> {
    let Some(text) = text else {
        return Some(default);
    };
    let zone = text.parse::<Tz>().ok();
    if zone.is_none() {
        check.bad(
            field,
            text,
            "unknown time zone: use an IANA name such as \"Europe/Berlin\" or \"UTC\"",
        );
    }
    zone
}

fn clock(check: &mut Check, field: &str, text: &str) -> Option<NaiveTime> {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| {
        text.get(range)
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
    };
    let parsed = match (bytes.len(), bytes.get(2), digits(0..2), digits(3..5)) {
        (5, Some(b':'), Some(h), Some(m)) => {
            NaiveTime::from_hms_opt(h.parse().ok()?, m.parse().ok()?, 0)
        }
        _ => None,
    };
    if parsed.is_none() {
        check.bad(
            field,
            text,
            "not a time: use HH:MM on a 24-hour clock, 00:00 to 23:59",
        );
    }
    parsed
}

fn weekday(text: &str) -> Option<Weekday> {
    Some(match text.to_ascii_lowercase().as_str() {
        "mon" | "monday" => Weekday::Mon,
        "tue" | "tuesday" => Weekday::Tue,
        "wed" | "wednesday" => Weekday::Wed,
        "thu" | "thursday" => Weekday::Thu,
        "fri" | "friday" => Weekday::Fri,
        "sat" | "saturday" => Weekday::Sat,
        "sun" | "sunday" => Weekday::Sun,
        _ => return None,
    })
}

/// apiVersion and kind, checked first: a document of another kind is reported as such only.
pub(super) fn header_ok(value: &Value, check: &mut Check) -> bool {
    if !value.is_mapping() {
        check.error(
            None,
            None,
            format!("expected a {KIND} mapping, found {}", type_name(value)),
        );
        return false;
    }
    let mut ok = true;
    for (field, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        match value.get(field) {
            Some(Value::String(got)) if got == want => {}
            Some(got) => {
                let shown = got
                    .as_str()
                    .map_or_else(|| type_name(got).to_owned(), |s| format!("{s:?}"));
                check.error(Some(field.into()), Some(shown), format!("must be {want:?}"));
                ok = false;
            }
            None => {
                check.error(
                    Some(field.into()),
                    None,
                    format!("required field is missing (must be {want:?})"),
                );
                ok = false;
            }
        }
    }
    ok
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value as Json, json};

    use crate::core::policy::parse_str;

    use crate::core::policy::example_document as base;

    /// Each case breaks one thing in a valid policy and must yield exactly that one error.
    #[test]
    fn each_problem_is_reported_with_field_and_value() {
        type Break = fn(&mut Json);
        #[rustfmt::skip]
        let cases: &[(&str, Break)] = &[
            (r#"spec.triggers.schedule.cron: "0 25 * * *": hour 25 out of range 0-23"#, |d| d["spec"]["triggers"]["schedule"]["cron"] = json!("0 25 * * *")),
            (r#"spec.triggers.schedule.timeZone: "Mars/Olympus": unknown time zone"#, |d| d["spec"]["triggers"]["schedule"]["timeZone"] = json!("Mars/Olympus")),
            (r#"spec.triggers.schedule.startingDeadline: "0s": must be longer than zero"#, |d| d["spec"]["triggers"]["schedule"]["startingDeadline"] = json!("0s")),
            (r#"spec.cooldown: "-1h": not a duration"#, |d| d["spec"]["cooldown"] = json!("-1h")),
            ("spec.triggers.memory: set exactly one of above and percentOfLimit (found both)", |d| d["spec"]["triggers"]["memory"]["percentOfLimit"] = json!(80)),
            ("spec.triggers.memory: set exactly one of above and percentOfLimit (found neither)", |d| d["spec"]["triggers"]["memory"] = json!({})),
            ("spec.triggers.memory.percentOfLimit: 150: must be more than 0 and at most 100", |d| d["spec"]["triggers"]["memory"] = json!({"percentOfLimit": 150})),
            ("spec.triggers.memory.percentOfLimit: 0: must be more than 0", |d| d["spec"]["triggers"]["memory"] = json!({"percentOfLimit": 0})),
            (r#"spec.triggers.memory.above: "0": must be more than 0 bytes"#, |d| d["spec"]["triggers"]["memory"]["above"] = json!(0)),
            (r#"spec.triggers.memory.above: "1GB": unknown suffix"#, |d| d["spec"]["triggers"]["memory"]["above"] = json!("1GB")),
            (r#"spec.triggers.memory.container: "App": must be a DNS-1123 label"#, |d| d["spec"]["triggers"]["memory"]["container"] = json!("App")),
            ("spec.triggers: no trigger", |d| d["spec"]["triggers"] = json!({})),
            ("spec.triggers.memory.sustained: needs a threshold to be over", |d| d["spec"]["triggers"]["memory"] = json!({"sustained": "15m", "predict": {"before": "2h"}})),
            (r#"spec.triggers.memory.sustained: "10s": must be at least 1m"#, |d| d["spec"]["triggers"]["memory"]["sustained"] = json!("10s")),
            (r#"spec.triggers.memory.growth.per: "fast": not a duration"#, |d| d["spec"]["triggers"]["memory"]["growth"] = json!({"above": "50Mi", "per": "fast"})),
            (r#"spec.triggers.memory.growth.above: "1GB": unknown suffix"#, |d| d["spec"]["triggers"]["memory"]["growth"] = json!({"above": "1GB", "per": "1h"})),
            (r#"spec.triggers.memory.growth.per: "10s": is also the default window"#, |d| d["spec"]["triggers"]["memory"]["growth"] = json!({"above": "1Mi", "per": "10s"})),
            (r#"spec.triggers.memory.predict.window: "30d": must be at most 7d"#, |d| d["spec"]["triggers"]["memory"]["predict"] = json!({"before": "2h", "window": "30d"})),
            (r#"spec.triggers.memory.predict.before: "0h": must be longer than zero"#, |d| d["spec"]["triggers"]["memory"]["predict"] = json!({"before": "0h"})),
            ("spec.triggers.memory.predict.before: required field is missing", |d| d["spec"]["triggers"]["memory"]["predict"] = json!({"window": "1h"})),
            ("spec.blockWhen.prometheus: must be a PromQL query, not empty", |d| d["spec"]["blockWhen"] = json!({"prometheus": " "})),
            ("spec.windows: windows only gate the memory trigger", |d| {
                d["spec"]["triggers"]["memory"] = Json::Null;
                d["spec"]["windows"] = json!([{"days": ["Mon"], "from": "01:00", "to": "02:00"}]);
            }),
            (r#"spec.windows[0].days[1]: "Mo": not a day"#, |d| d["spec"]["windows"] = json!([{"days": ["Sun", "Mo"], "from": "01:00", "to": "02:00"}])),
            ("spec.windows[0].days: must list at least one day", |d| d["spec"]["windows"] = json!([{"days": [], "from": "01:00", "to": "02:00"}])),
            (r#"spec.windows[0].from: "1:00": not a time"#, |d| d["spec"]["windows"] = json!([{"days": ["Mon"], "from": "1:00", "to": "02:00"}])),
            (r#"spec.windows[0].to: "24:00": not a time"#, |d| d["spec"]["windows"] = json!([{"days": ["Mon"], "from": "01:00", "to": "24:00"}])),
            (r#"spec.windows[0].to: "01:00": equals from"#, |d| d["spec"]["windows"] = json!([{"days": ["Mon"], "from": "01:00", "to": "01:00"}])),
            ("spec.maxPerRun: 0: must be at least 1", |d| d["spec"]["maxPerRun"] = json!(0)),
            ("spec.breaker.maxBounces: 0: must be 1 to 10", |d| d["spec"]["breaker"] = json!({"maxBounces": 0, "per": "24h"})),
            ("spec.breaker.maxBounces: 11: must be 1 to 10", |d| d["spec"]["breaker"] = json!({"maxBounces": 11, "per": "24h"})),
            (r#"spec.breaker.per: "31d": must be at most 30d"#, |d| d["spec"]["breaker"] = json!({"maxBounces": 3, "per": "31d"})),
            (r#"spec.breaker.per: "often": not a duration"#, |d| d["spec"]["breaker"] = json!({"maxBounces": 3, "per": "often"})),
            ("spec.breaker.per: required field is missing", |d| d["spec"]["breaker"] = json!({"maxBounces": 3})),
            (r#"spec.restart.timeout: "0m": must be longer than zero"#, |d| d["spec"]["restart"] = json!({"timeout": "0m"})),
            ("spec.target.selector: matchLabels and matchExpressions are both empty", |d| d["spec"]["target"]["selector"] = json!({})),
            ("spec.target.selector: only NotIn/DoesNotExist requirements match every pod", |d| d["spec"]["target"]["selector"] = json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["canary"]}, {"key": "debug", "operator": "DoesNotExist"}]})),
            ("spec.target.selector.matchExpressions[0].values: In needs at least one value", |d| d["spec"]["target"]["selector"]["matchExpressions"] = json!([{"key": "tier", "operator": "In"}])),
            ("spec.target.selector.matchExpressions[0].values: Exists takes no values", |d| d["spec"]["target"]["selector"]["matchExpressions"] = json!([{"key": "tier", "operator": "Exists", "values": ["x"]}])),
            (r#"spec.target.selector.matchLabels: "-app": label key name part must"#, |d| d["spec"]["target"]["selector"]["matchLabels"] = json!({"-app": "web"})),
            (r#"spec.target.selector.matchLabels[app]: "web shop": label value must"#, |d| d["spec"]["target"]["selector"]["matchLabels"] = json!({"app": "web shop"})),
            (r#"spec.target.namespaces[1]: "Shop": must be a DNS-1123 label"#, |d| d["spec"]["target"]["namespaces"] = json!(["shop", "Shop"])),
            (r#"spec.target.groupBy: "toolhive name": label key name part must"#, |d| d["spec"]["target"]["groupBy"] = json!("toolhive name")),
            ("spec.target.kinds: must list at least one kind", |d| d["spec"]["target"]["kinds"] = json!([])),
            ("spec.target.kinds[1]: unknown variant `Job`", |d| d["spec"]["target"]["kinds"] = json!(["Deployment", "Job"])),
            (r#"metadata.name: "Web_1": must be a DNS-1123 subdomain"#, |d| d["metadata"]["name"] = json!("Web_1")),
            ("metadata.name: required field is missing", |d| d["metadata"] = json!({"labels": {"a": "b"}})),
            (r#"apiVersion: "bouncer.dev/v1": must be "bouncer.dev/v1alpha1""#, |d| d["apiVersion"] = json!("bouncer.dev/v1")),
            // A foreign object gets one error, not one per field it does not share with ours.
            (r#"kind: "Deployment": must be "BouncePolicy""#, |d| d["kind"] = json!("Deployment")),
            ("spec.triggers.shedule: unknown field, expected `schedule` or `memory`", |d| d["spec"]["triggers"]["shedule"] = json!({"cron": "@daily"})),
            ("spec.allowDowntime: invalid type: string \"yes\", expected a boolean", |d| d["spec"]["allowDowntime"] = json!("yes")),
        ];
        for (want, break_it) in cases {
            let mut doc = base();
            break_it(&mut doc);
            let text = serde_yaml_ng::to_string(&doc).unwrap();
            let err = parse_str("t.yaml", &text).expect_err(want);
            let got: Vec<String> = err.errors.iter().map(ToString::to_string).collect();
            assert_eq!(got.len(), 1, "{want}: {got:#?}");
            assert!(got[0].contains(want), "want {want:?}\n got {:?}", got[0]);
        }
    }
}
