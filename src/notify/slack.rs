//! The chat message of a run, as a Slack incoming webhook takes it (Block Kit, with a plain-text
//! `text` that notifications and chat tools without Block Kit show): who ran where, the summary,
//! and one line per workload in the bounce queue or held back by its circuit breaker.

use serde_json::{Value, json};

use crate::report::{Mode, Report, Row};

/// Slack drops a section over 3000 characters; the rest is in the Job's log.
const SECTION_LIMIT: usize = 2900;
/// Lines in the plain-text fallback; Slack cuts a message's `text` at 40,000 characters.
const TEXT_LINES: usize = 50;
/// Longest reason kept on a line: an error can be long, a chat line should not be.
const REASON_LIMIT: usize = 300;

/// Slack's three control characters; everything else in mrkdwn and `text` is shown as written.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn cut(s: &str, limit: usize) -> String {
    match s.char_indices().nth(limit) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// What happened to a queued workload, in words.
fn verb(decision: &str) -> &str {
    match decision {
        "bounce" => "would bounce",
        crate::report::DRY_RUN => "dry run, would bounce",
        "revertedEvicted" => "reverted, then evicted",
        "notAttempted" => "not attempted",
        // The only skips the message shows: due workloads their circuit breaker held back.
        "skip" => "breaker open",
        other => other,
    }
}

pub(super) struct Line {
    verb: String,
    workload: String,
    /// `in 2.1s`, `after 90.0s`, or nothing.
    took: Option<String>,
    trigger: String,
    reason: Option<String>,
}

pub(super) fn line(row: &Row) -> Line {
    let decision = row.decision.as_str();
    let took = row.duration_seconds.map(|s| match decision {
        "bounced" | "revertedEvicted" => format!("in {s:.1}s"),
        _ => format!("after {s:.1}s"),
    });
    let trigger = row
        .triggers
        .iter()
        .map(|t| t.detail.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let reason = match decision {
        "failed" | "reverted" | "revertedEvicted" | "superseded" | "skipped" | "interrupted"
        | "skip" => {
            let r = row.reason.trim_start_matches("interrupted: ");
            (!r.is_empty()).then(|| cut(r, REASON_LIMIT))
        }
        _ => None,
    };
    Line {
        verb: verb(decision).to_string(),
        workload: row.workload.to_string(),
        took,
        trigger,
        reason,
    }
}

impl Line {
    /// e.g. `bounced deployment/shop/api in 2.1s | memory (api-0 1.6Gi > 1.5Gi)`, unescaped.
    pub(super) fn words(&self) -> String {
        let mut s = format!("{} {}", self.verb, self.workload);
        if let Some(t) = &self.took {
            s.push(' ');
            s.push_str(t);
        }
        let trigger = Some(&self.trigger).filter(|t| !t.is_empty());
        for part in [trigger, self.reason.as_ref()].into_iter().flatten() {
            s.push_str(" | ");
            s.push_str(part);
        }
        s
    }

    /// e.g. `- bounced deployment/shop/api in 2.1s | memory (api-0 1.6Gi &gt; 1.5Gi)`.
    fn plain(&self) -> String {
        escape(&format!("- {}", self.words()))
    }
}

pub(super) fn title(cluster: Option<&str>) -> String {
    match cluster {
        Some(c) => format!("bouncer on {c}"),
        None => "bouncer".to_string(),
    }
}

/// The message for one run. `cluster` names the cluster (`--cluster-name`), if set.
pub fn message(report: &Report, cluster: Option<&str>) -> Value {
    let summary = crate::report::summary_line(report);
    let lines: Vec<Line> = report
        .rows
        .iter()
        .filter(|r| super::notable(r))
        .map(line)
        .collect();
    let run = match report.mode {
        Mode::Run => "run",
        Mode::DryRun => "run --dry-run",
        Mode::Plan => "plan",
    };
    let mut text = format!("{}: {summary}", title(cluster));
    for l in lines.iter().take(TEXT_LINES) {
        text.push('\n');
        text.push_str(&l.plain());
    }
    if lines.len() > TEXT_LINES {
        text.push_str(&format!("\n... and {} more", lines.len() - TEXT_LINES));
    }
    let mut blocks = vec![
        json!({"type": "header", "text": {"type": "plain_text", "text": cut(&title(cluster), 140)}}),
        json!({"type": "section", "text": {"type": "mrkdwn", "text": escape(&summary)}}),
    ];
    let mut section = String::new();
    for (i, l) in lines.iter().enumerate() {
        let mut item = format!("• *{}* `{}`", l.verb, l.workload);
        if let Some(t) = &l.took {
            item.push_str(&format!(" {t}"));
        }
        if !l.trigger.is_empty() {
            item.push_str(&format!(" · {}", escape(&l.trigger)));
        }
        if let Some(r) = &l.reason {
            item.push_str(&format!("\n    {}", escape(r)));
        }
        if section.len() + item.len() + 1 > SECTION_LIMIT {
            section.push_str(&format!(
                "\n… and {} more (see the report in the Job's log)",
                lines.len() - i
            ));
            break;
        }
        if !section.is_empty() {
            section.push('\n');
        }
        section.push_str(&item);
    }
    if !section.is_empty() {
        blocks.push(json!({"type": "section", "text": {"type": "mrkdwn", "text": section}}));
    }
    let mut context = format!("bouncer {run} · {}", report.generated_at);
    if let Some(c) = cluster {
        context = format!("cluster {} · {context}", escape(c));
    }
    blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]}));
    json!({"text": text, "blocks": blocks})
}

#[cfg(test)]
#[path = "slack_tests.rs"]
mod tests;
