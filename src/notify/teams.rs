//! The chat message of a run for Microsoft Teams: an Adaptive Card in the message envelope that
//! Teams incoming webhooks and Workflows ("when a Teams webhook request is received") take. The
//! same lines as the Slack message: who ran where, the summary, and one line per workload in the
//! bounce queue, would-be bounce of a dry-run policy, or held back by its circuit breaker.

use serde_json::{Value, json};

use super::slack::{line, title};
use crate::report::{Mode, Report};

/// Teams refuses a message over 28 KB; the lines stop well before, the rest is in the Job's log.
const BODY_LIMIT: usize = 20_000;
const LINES: usize = 50;

fn text(text: &str) -> Value {
    json!({"type": "TextBlock", "text": text, "wrap": true})
}

/// The message for one run. `cluster` names the cluster (`--cluster-name`), if set.
pub fn message(report: &Report, cluster: Option<&str>) -> Value {
    let lines: Vec<String> = report
        .rows
        .iter()
        .filter(|r| super::notable(r))
        .map(|r| line(r).words())
        .collect();
    let run = match report.mode {
        Mode::Run => "run",
        Mode::DryRun => "run --dry-run",
        Mode::Plan => "plan",
    };
    let mut body = vec![
        json!({"type": "TextBlock", "text": title(cluster), "size": "Medium", "weight": "Bolder",
               "wrap": true}),
        text(&crate::report::summary_line(report)),
    ];
    let mut size = 0;
    for (i, l) in lines.iter().enumerate() {
        if i == LINES || size + l.len() > BODY_LIMIT {
            body.push(text(&format!(
                "... and {} more (see the report in the Job's log)",
                lines.len() - i
            )));
            break;
        }
        size += l.len();
        body.push(
            json!({"type": "TextBlock", "text": format!("- {l}"), "wrap": true,
                         "spacing": "None"}),
        );
    }
    let mut context = format!("bouncer {run} · {}", report.generated_at);
    if let Some(c) = cluster {
        context = format!("cluster {c} · {context}");
    }
    body.push(
        json!({"type": "TextBlock", "text": context, "wrap": true, "isSubtle": true,
                     "size": "Small"}),
    );
    json!({
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "contentUrl": null,
            "content": {
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": "1.4",
                "body": body,
                "msteams": {"width": "Full"},
            },
        }],
    })
}

#[cfg(test)]
#[path = "teams_tests.rs"]
mod tests;
