//! Golden tests of the Teams message.

use serde_json::json;

use super::*;
use crate::core::model::Kind;
use crate::notify::tests::{queue, quiet_report, report, row};

fn body(m: &Value) -> &Vec<Value> {
    assert_eq!(m["type"], "message", "{m:#}");
    let attachments = m["attachments"].as_array().expect("attachments");
    assert_eq!(attachments.len(), 1, "{m:#}");
    assert_eq!(
        attachments[0]["contentType"],
        "application/vnd.microsoft.card.adaptive"
    );
    let card = &attachments[0]["content"];
    assert_eq!(card["type"], "AdaptiveCard");
    assert_eq!(card["version"], "1.4");
    card["body"].as_array().expect("a card body")
}

#[test]
fn golden_message_of_a_run() {
    let m = message(&report(), Some("prod-eu"));
    let want = json!({
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "contentUrl": null,
            "content": {
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": "1.4",
                "msteams": {"width": "Full"},
                "body": [
                    {"type": "TextBlock", "text": "bouncer on prod-eu", "size": "Medium",
                     "weight": "Bolder", "wrap": true},
                    {"type": "TextBlock", "wrap": true,
                     "text": "1 bounced, 1 failed, 1 not attempted, 2 skipped"},
                    {"type": "TextBlock", "wrap": true, "spacing": "None",
                     "text": "- bounced statefulset/toolhive/fetch-backend in 2.0s | memory (fetch-backend-0 486Mi > 435Mi)"},
                    {"type": "TextBlock", "wrap": true, "spacing": "None",
                     "text": "- reverted deployment/toolhive-system/vmcp-main after 3.1s | schedule (fired 2026-12-03T03:00:00Z) | restartedAt was reverted by thv-operator (now: removed)"},
                    {"type": "TextBlock", "wrap": true, "spacing": "None",
                     "text": "- not attempted deployment/shop/leaky-api | memory (leaky-api-1 1.1Gi > 1Gi)"},
                    {"type": "TextBlock", "wrap": true, "isSubtle": true, "size": "Small",
                     "text": "cluster prod-eu · bouncer run · 2026-12-03T03:00:05Z"},
                ],
            },
        }],
    });
    assert_eq!(m, want, "{}", serde_json::to_string_pretty(&m).unwrap());
}

#[test]
fn a_quiet_run_has_no_lines_and_names_no_cluster_unless_told() {
    let m = message(&quiet_report(), None);
    let body = body(&m);
    assert_eq!(body.len(), 3, "{m:#}");
    assert_eq!(body[0]["text"], "bouncer");
    assert_eq!(body[2]["text"], "bouncer run · 2026-12-03T03:00:05Z");
}

#[test]
fn a_dry_run_policy_row_says_what_it_would_bounce() {
    let mut r = quiet_report();
    let mut d = row(None, "trial", Kind::Deployment, "shop", "api");
    d.decision = crate::report::DRY_RUN.into();
    d.dry_run = true;
    r.rows.push(d);
    let m = message(&r, None);
    let body = body(&m);
    assert_eq!(
        body[2]["text"],
        "- dry run, would bounce deployment/shop/api"
    );
}

#[test]
fn a_long_queue_stays_far_below_what_teams_takes() {
    let mut r = report();
    r.rows = queue(300, "failed");
    for b in &mut r.rows {
        b.reason = "x".repeat(400);
    }
    let m = message(&r, None);
    // Teams refuses a message over 28 KB.
    assert!(m.to_string().len() < 28 * 1024, "{}", m.to_string().len());
    let body = body(&m);
    let last = body[body.len() - 2]["text"].as_str().unwrap();
    assert!(
        last.starts_with("... and ") && last.ends_with(" more (see the report in the Job's log)"),
        "{last}"
    );
}
