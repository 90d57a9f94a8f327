//! Golden tests of the chat message.

use serde_json::json;

use super::*;
use crate::core::model::Kind;
use crate::notify::tests::{queue, quiet_report, report, row};

#[test]
fn golden_message_of_a_run() {
    let m = message(&report(), Some("prod-eu"));
    let want = json!({
        "text": "bouncer on prod-eu: 1 bounced, 1 failed, 1 not attempted, 2 skipped\n\
                 - bounced statefulset/toolhive/fetch-backend in 2.0s | memory (fetch-backend-0 486Mi &gt; 435Mi)\n\
                 - reverted deployment/toolhive-system/vmcp-main after 3.1s | schedule (fired 2026-12-03T03:00:00Z) | restartedAt was reverted by thv-operator (now: removed)\n\
                 - not attempted deployment/shop/leaky-api | memory (leaky-api-1 1.1Gi &gt; 1Gi)",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": "bouncer on prod-eu"}},
            {"type": "section", "text": {"type": "mrkdwn",
                "text": "1 bounced, 1 failed, 1 not attempted, 2 skipped"}},
            {"type": "section", "text": {"type": "mrkdwn",
                "text": "• *bounced* `statefulset/toolhive/fetch-backend` in 2.0s · memory (fetch-backend-0 486Mi &gt; 435Mi)\n\
                         • *reverted* `deployment/toolhive-system/vmcp-main` after 3.1s · schedule (fired 2026-12-03T03:00:00Z)\n    \
                         restartedAt was reverted by thv-operator (now: removed)\n\
                         • *not attempted* `deployment/shop/leaky-api` · memory (leaky-api-1 1.1Gi &gt; 1Gi)"}},
            {"type": "context", "elements": [{"type": "mrkdwn",
                "text": "cluster prod-eu · bouncer run · 2026-12-03T03:00:05Z"}]},
        ],
    });
    assert_eq!(m, want, "{}", serde_json::to_string_pretty(&m).unwrap());
}

#[test]
fn without_a_cluster_name_the_message_names_none() {
    let m = message(&quiet_report(), None);
    assert_eq!(
        m["text"],
        "bouncer: 0 bounced, 0 failed, 0 not attempted, 2 skipped"
    );
    let blocks = m["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 3, "no line section without a queue: {m:#}");
    assert_eq!(blocks[0]["text"]["text"], "bouncer");
    assert_eq!(
        blocks[2]["elements"][0]["text"],
        "bouncer run · 2026-12-03T03:00:05Z"
    );
}

#[test]
fn a_dry_run_says_what_it_would_bounce() {
    let mut r = report();
    r.mode = Mode::DryRun;
    for row in r.rows.iter_mut().filter(|r| r.order.is_some()) {
        row.decision = "bounce".into();
        row.duration_seconds = None;
    }
    r.summary.planned = 3;
    let m = message(&r, Some("staging"));
    let text = m["text"].as_str().unwrap();
    assert!(
        text.starts_with(
            "bouncer on staging: 3 to bounce, 2 skipped (dry run: nothing was changed)\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("\n- would bounce deployment/toolhive-system/vmcp-main | schedule (fired 2026-12-03T03:00:00Z)\n"),
        "{text}"
    );
    assert!(
        m["blocks"][3]["elements"][0]["text"]
            .as_str()
            .unwrap()
            .contains("bouncer run --dry-run")
    );
}

#[test]
fn failures_carry_their_reason_escaped_and_cut() {
    let mut r = report();
    let mut failed = row(Some(4), "p", Kind::Deployment, "ns", "web");
    failed.decision = "failed".into();
    failed.duration_seconds = Some(90.0);
    failed.reason = format!("rollout stuck: <pending> & {}", "x".repeat(400));
    r.rows.insert(3, failed);
    let m = message(&r, None);
    let text = m["text"].as_str().unwrap();
    let line = text.lines().find(|l| l.contains("ns/web")).unwrap();
    assert!(
        line.starts_with(
            "- failed deployment/ns/web after 90.0s | rollout stuck: &lt;pending&gt; &amp; xxx"
        ),
        "{line}"
    );
    assert!(line.ends_with("x..."), "{line}");
    assert!(line.len() < 400, "{}", line.len());
}

#[test]
fn a_long_queue_is_cut_to_what_slack_shows() {
    let mut r = report();
    r.rows = queue(100, "bounced");
    for b in &mut r.rows {
        b.duration_seconds = Some(1.5);
    }
    let m = message(&r, None);
    let section = m["blocks"][2]["text"]["text"].as_str().unwrap();
    assert!(section.len() <= 3000, "{}", section.len());
    assert!(
        section.ends_with("more (see the report in the Job's log)"),
        "{section}"
    );
    let text = m["text"].as_str().unwrap();
    assert_eq!(text.lines().count(), 52);
    assert!(
        text.ends_with("\n- bounced deployment/namespace/workload-050 in 1.5s\n... and 50 more"),
        "{text}"
    );
}

/// A due workload its circuit breaker held back needs a person: the message names it with the
/// reason, and a run with nothing else to say is still sent under `--notify-on changes`.
#[test]
fn an_open_breaker_is_a_line_and_worth_sending() {
    let mut r = quiet_report();
    let mut s = row(None, "leaks", Kind::Deployment, "shop", "api");
    s.decision = "skip".into();
    s.reason_code = Some("breakerOpen".into());
    s.reason = "circuit breaker open: 3 bounces within 1day (breaker.maxBounces 3); closes after 2026-12-03T09:00:00Z".into();
    r.rows.push(s);
    assert!(crate::notify::worth_sending(
        &r,
        crate::notify::NotifyOn::Changes
    ));
    let m = message(&r, None);
    let text = m["text"].as_str().unwrap();
    assert!(
        text.ends_with(
            "\n- breaker open deployment/shop/api | circuit breaker open: 3 bounces within 1day (breaker.maxBounces 3); closes after 2026-12-03T09:00:00Z"
        ),
        "{text}"
    );
    let blocks = m["blocks"].as_array().unwrap();
    assert!(
        blocks[2]["text"]["text"]
            .as_str()
            .unwrap()
            .starts_with("• *breaker open* `deployment/shop/api`"),
        "{m:#}"
    );
}
