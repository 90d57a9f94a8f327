//! Tests of the notification settings, the webhook decision and the report with its
//! `notifications`; the fixtures here serve the payload tests of slack and pushgateway too.

use std::time::Duration;

use super::*;
use crate::core::model::{Kind, WorkloadRef};
use crate::report::{Row, Summary, TriggerRow};

/// `n` rows of the bounce queue, workload-001 onwards in one namespace, each `decision`.
pub(super) fn queue(n: usize, decision: &str) -> Vec<Row> {
    (1..=n)
        .map(|i| {
            let name = format!("workload-{i:03}");
            let mut b = row(Some(i), "p", Kind::Deployment, "namespace", &name);
            b.decision = decision.into();
            b
        })
        .collect()
}

pub(super) fn row(order: Option<usize>, policy: &str, kind: Kind, ns: &str, name: &str) -> Row {
    let workload = WorkloadRef {
        kind,
        namespace: ns.into(),
        name: name.into(),
    };
    let decision = if order.is_some() { "bounce" } else { "skip" };
    Row::new(order, policy, &workload, 1, None, decision)
}

fn trigger(kind: &'static str, detail: &str) -> Vec<TriggerRow> {
    vec![TriggerRow {
        kind,
        detail: detail.into(),
    }]
}

/// A run that bounced one workload, had the next one reverted by its operator (which halted the
/// queue) and skipped two.
pub(super) fn report() -> Report {
    let mut bounced = row(
        Some(1),
        "mcp-servers-memory",
        Kind::StatefulSet,
        "toolhive",
        "fetch-backend",
    );
    bounced.triggers = trigger("memory", "memory (fetch-backend-0 486Mi > 435Mi)");
    bounced.decision = "bounced".into();
    bounced.reason = "memory (fetch-backend-0 486Mi > 435Mi)".into();
    bounced.duration_seconds = Some(2.04);
    bounced.verification = Some("restartedAt intact, 1/1 pods new and ready".into());
    let mut reverted = row(
        Some(2),
        "vmcp-nightly",
        Kind::Deployment,
        "toolhive-system",
        "vmcp-main",
    );
    reverted.triggers = trigger("schedule", "schedule (fired 2026-12-03T03:00:00Z)");
    reverted.decision = "reverted".into();
    reverted.reason = "restartedAt was reverted by thv-operator (now: removed)".into();
    reverted.duration_seconds = Some(3.12);
    let mut not_attempted = row(Some(3), "leaky-api", Kind::Deployment, "shop", "leaky-api");
    not_attempted.triggers = trigger("memory", "memory (leaky-api-1 1.1Gi > 1Gi)");
    not_attempted.decision = "notAttempted".into();
    not_attempted.reason = "not attempted: an earlier bounce halted the queue".into();
    let mut not_due = row(
        None,
        "mcp-servers-memory",
        Kind::Deployment,
        "toolhive",
        "fetch",
    );
    not_due.reason_code = Some("notDue".into());
    not_due.reason = "not due: memory 33.1Mi <= 1741Mi".into();
    let mut cooldown = row(
        None,
        "mcp-servers-memory",
        Kind::Deployment,
        "toolhive",
        "github",
    );
    cooldown.reason_code = Some("cooldown".into());
    cooldown.reason =
        "cooldown: restarted 2026-12-03T01:10:00Z, due again after 2026-12-03T07:10:00Z".into();
    Report {
        api_version: "bouncer.dev/v1alpha1",
        kind: "BounceReport",
        mode: Mode::Run,
        generated_at: "2026-12-03T03:00:05Z".into(),
        summary: Summary {
            planned: 3,
            bounced: 1,
            failed: 1,
            skipped: 2,
            not_attempted: 1,
            superseded: 0,
            dry_run: 0,
        },
        metrics_unavailable: None,
        suspended_policies: vec![],
        rows: vec![bounced, reverted, not_attempted, not_due, cooldown],
    }
}

/// A run with nothing due.
pub(super) fn quiet_report() -> Report {
    let mut r = report();
    r.rows.retain(|row| row.order.is_none());
    r.summary = Summary {
        skipped: 2,
        ..Default::default()
    };
    r
}

fn merge(flags: NotifyFlags, env: Env) -> Result<Settings, SettingsError> {
    Settings::merge(flags, env)
}

#[test]
fn defaults_notify_nobody() {
    let s = merge(NotifyFlags::default(), Env::default()).unwrap();
    assert_eq!(s, Settings::default());
    assert!(s.targets().is_empty());
    assert_eq!(s.on, NotifyOn::Changes);
    assert_eq!((s.timeout, s.retries), (Duration::from_secs(5), 2));
}

#[test]
fn flags_win_over_env() {
    let flags = NotifyFlags {
        cluster_name: Some("prod-eu".into()),
        notify_on: Some(NotifyOn::Always),
        notify_timeout: Some(Duration::from_secs(1)),
        notify_retries: Some(0),
        pushgateway_url: Some("http://pg.flag:9091".into()),
        ..Default::default()
    };
    let env = Env {
        cluster_name: Some("staging".into()),
        notify_on: Some("changes".into()),
        notify_timeout: Some("9s".into()),
        notify_retries: Some("4".into()),
        pushgateway_url: Some("http://pg.env:9091".into()),
        ..Default::default()
    };
    let s = merge(flags, env).unwrap();
    assert_eq!(s.cluster_name.as_deref(), Some("prod-eu"));
    assert_eq!(s.on, NotifyOn::Always);
    assert_eq!((s.timeout, s.retries), (Duration::from_secs(1), 0));
    assert_eq!(s.pushgateway_url.unwrap().as_str(), "http://pg.flag:9091/");
    let env = Env {
        cluster_name: Some(" staging ".into()),
        notify_on: Some("Always".into()),
        notify_timeout: Some("9s".into()),
        notify_retries: Some("4".into()),
        ..Default::default()
    };
    let s = merge(NotifyFlags::default(), env).unwrap();
    assert_eq!(s.cluster_name.as_deref(), Some("staging"));
    assert_eq!(s.on, NotifyOn::Always);
    assert_eq!((s.timeout, s.retries), (Duration::from_secs(9), 4));
}

#[test]
fn webhook_urls_come_from_a_file_or_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("slack-url");
    std::fs::write(&file, "https://hooks.slack.com/services/T0/B0/xyz\n").unwrap();
    let env = Env {
        notify_slack_url_file: Some(file.clone()),
        notify_webhook_url: Some("http://127.0.0.1:8080/report".into()),
        ..Default::default()
    };
    let s = merge(NotifyFlags::default(), env).unwrap();
    assert_eq!(
        s.slack_url.as_ref().unwrap().0.as_str(),
        "https://hooks.slack.com/services/T0/B0/xyz"
    );
    assert_eq!(
        s.webhook_url.as_ref().unwrap().0.as_str(),
        "http://127.0.0.1:8080/report"
    );
    // The flag's file wins over both variables.
    let other = dir.path().join("other");
    std::fs::write(&other, "https://chat.example/hook").unwrap();
    let flags = NotifyFlags {
        notify_slack_url_file: Some(other),
        ..Default::default()
    };
    let env = Env {
        notify_slack_url_file: Some(file),
        notify_slack_url: Some("https://ignored.example/".into()),
        ..Default::default()
    };
    let s = merge(flags, env).unwrap();
    assert_eq!(s.slack_url.unwrap().0.as_str(), "https://chat.example/hook");
}

#[test]
fn secret_urls_are_never_printed() {
    let secret = "hooks.slack.com/services/T0/B0/s3cr3t";
    let env = Env {
        notify_slack_url: Some(secret.into()),
        ..Default::default()
    };
    let err = merge(NotifyFlags::default(), env).unwrap_err();
    assert!(
        matches!(&err, SettingsError::SecretUrl { setting, problem: UrlProblem::NotAUrl(_) }
            if setting == "BOUNCER_NOTIFY_SLACK_URL"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "BOUNCER_NOTIFY_SLACK_URL: not an http:// or https:// URL (the value is not shown: it is \
         a secret)"
    );
    assert!(!format!("{err:?}").contains("s3cr3t"), "{err:?}");
    let env = Env {
        notify_webhook_url: Some(format!("https://{secret}")),
        ..Default::default()
    };
    let s = merge(NotifyFlags::default(), env).unwrap();
    let debug = format!("{s:?}");
    assert!(!debug.contains("s3cr3t"), "{debug}");
    assert!(debug.contains("https://hooks.slack.com/..."), "{debug}");
}

#[test]
fn bad_notify_settings_name_the_variable() {
    let refused = |env: Env| merge(NotifyFlags::default(), env).unwrap_err();
    let err = refused(Env {
        notify_on: Some("sometimes".into()),
        ..Default::default()
    });
    assert!(matches!(&err, SettingsError::NotifyOn { value } if value == "sometimes"));
    assert_eq!(
        err.to_string(),
        "BOUNCER_NOTIFY_ON: \"sometimes\" is not one of changes, always"
    );
    let err = refused(Env {
        notify_timeout: Some("soon".into()),
        ..Default::default()
    });
    assert!(matches!(&err, SettingsError::Timeout { value, .. } if value == "soon"));
    assert!(
        err.to_string()
            .starts_with("BOUNCER_NOTIFY_TIMEOUT: \"soon\" is not a duration (e.g. 5s): "),
        "{err}"
    );
    let err = refused(Env {
        notify_timeout: Some("0s".into()),
        ..Default::default()
    });
    assert!(matches!(err, SettingsError::ZeroTimeout));
    assert_eq!(
        err.to_string(),
        "--notify-timeout / BOUNCER_NOTIFY_TIMEOUT: must be positive"
    );
    let err = refused(Env {
        notify_retries: Some("-1".into()),
        ..Default::default()
    });
    assert!(matches!(&err, SettingsError::Retries { value, .. } if value == "-1"));
    assert_eq!(
        err.to_string(),
        "BOUNCER_NOTIFY_RETRIES: \"-1\" is not a whole number"
    );
    let err = refused(Env {
        notify_retries: Some("6".into()),
        ..Default::default()
    });
    assert!(matches!(
        err,
        SettingsError::TooManyRetries { retries: 6, max: 5 }
    ));
    assert_eq!(
        err.to_string(),
        "--notify-retries / BOUNCER_NOTIFY_RETRIES: 6 is too many (at most 5)"
    );
    let err = refused(Env {
        pushgateway_url: Some("pushgateway:9091".into()),
        ..Default::default()
    });
    assert!(
        matches!(&err, SettingsError::Url { setting, problem: UrlProblem::NotHttp }
            if setting == "BOUNCER_PUSHGATEWAY_URL"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "BOUNCER_PUSHGATEWAY_URL: must be an http:// or https:// URL"
    );
    let err = merge(
        NotifyFlags {
            pushgateway_url: Some("not a url".into()),
            ..Default::default()
        },
        Env::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, SettingsError::Url { setting, problem: UrlProblem::NotAUrl(_) }
            if setting == "--pushgateway-url"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "--pushgateway-url: not a URL: relative URL without a base"
    );
    let err = refused(Env {
        notify_webhook_url: Some("ftp://example.com/x".into()),
        ..Default::default()
    });
    assert!(
        matches!(&err, SettingsError::SecretUrl { setting, problem: UrlProblem::NotHttp }
            if setting == "BOUNCER_NOTIFY_WEBHOOK_URL"),
        "{err:?}"
    );
    let err = refused(Env {
        notify_webhook_url: Some("https://a.example/".into()),
        notify_webhook_url_file: Some("/nonexistent".into()),
        ..Default::default()
    });
    assert!(matches!(
        err,
        SettingsError::BothSet {
            var: "NOTIFY_WEBHOOK_URL"
        }
    ));
    assert_eq!(
        err.to_string(),
        "BOUNCER_NOTIFY_WEBHOOK_URL and BOUNCER_NOTIFY_WEBHOOK_URL_FILE are both set; set one"
    );
    let err = refused(Env {
        notify_slack_url_file: Some("/nonexistent/slack".into()),
        ..Default::default()
    });
    assert!(
        matches!(&err, SettingsError::ReadFile { setting, path, .. }
            if setting == "BOUNCER_NOTIFY_SLACK_URL_FILE"
                && path.as_os_str() == "/nonexistent/slack"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("BOUNCER_NOTIFY_SLACK_URL_FILE: cannot read /nonexistent/slack: "),
        "{err}"
    );
    // The flag's file is named by the flag.
    let err = merge(
        NotifyFlags {
            notify_teams_url_file: Some("/nonexistent/teams".into()),
            ..Default::default()
        },
        Env::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, SettingsError::ReadFile { setting, .. }
            if setting == "--notify-teams-url-file"),
        "{err:?}"
    );
}

#[test]
fn webhooks_hear_about_runs_with_a_queue_unless_told_always() {
    assert!(worth_sending(&report(), NotifyOn::Changes));
    assert!(!worth_sending(&quiet_report(), NotifyOn::Changes));
    assert!(worth_sending(&quiet_report(), NotifyOn::Always));
}

#[test]
fn the_json_webhook_gets_the_report_as_output_json_prints_it() {
    let r = report();
    assert_eq!(
        webhook_body(&r),
        crate::report::render(&r, Format::Json, true)
    );
}

fn deliveries() -> Vec<Delivery> {
    vec![
        Delivery {
            target: Target::Slack,
            status: DeliveryStatus::Sent,
            attempts: 1,
            detail: None,
        },
        Delivery {
            target: Target::Webhook,
            status: DeliveryStatus::Failed,
            attempts: 3,
            detail: Some("HTTP 500 Internal Server Error: boom".into()),
        },
        Delivery {
            target: Target::Pushgateway,
            status: DeliveryStatus::NotSent,
            attempts: 0,
            detail: Some("nothing was due (notify on: changes)".into()),
        },
    ]
}

#[test]
fn the_summary_says_how_each_delivery_went() {
    assert_eq!(summary_line(&[]), None);
    assert_eq!(
        summary_line(&deliveries()).unwrap(),
        "notifications: slack sent; webhook failed after 3 attempts: HTTP 500 Internal Server \
         Error: boom; pushgateway not sent: nothing was due (notify on: changes)"
    );
}

#[test]
fn the_report_carries_its_notifications() {
    let r = report();
    for format in [Format::Table, Format::Json, Format::Markdown] {
        assert_eq!(
            render(&r, &[], format, false),
            crate::report::render(&r, format, false)
        );
    }
    let json: serde_json::Value =
        serde_json::from_str(&render(&r, &deliveries(), Format::Json, true)).unwrap();
    let plain: serde_json::Value = serde_json::from_str(&webhook_body(&r)).unwrap();
    let mut without = json.clone();
    without.as_object_mut().unwrap().remove("notifications");
    assert_eq!(without, plain);
    assert_eq!(
        json["notifications"],
        serde_json::json!([
            {"target": "slack", "status": "sent", "attempts": 1, "detail": null},
            {"target": "webhook", "status": "failed", "attempts": 3,
             "detail": "HTTP 500 Internal Server Error: boom"},
            {"target": "pushgateway", "status": "notSent", "attempts": 0,
             "detail": "nothing was due (notify on: changes)"},
        ])
    );
    let table = render(&r, &deliveries(), Format::Table, false);
    let last = table.lines().last().unwrap();
    assert!(
        last.starts_with("notifications: slack sent; webhook failed"),
        "{table}"
    );
    assert!(table.starts_with(&crate::report::table(&r)));
    let md = render(&r, &deliveries(), Format::Markdown, false);
    assert!(md.ends_with("|\n\nnotifications: slack sent; webhook failed after 3 attempts: HTTP 500 Internal Server Error: boom; pushgateway not sent: nothing was due (notify on: changes)\n"), "{md}");
}

#[test]
fn the_variables_reach_the_settings_beside_the_others() {
    let vars = [
        ("BOUNCER_MAX_BOUNCES", "3"),
        ("BOUNCER_POLICIES", "a,b"),
        ("BOUNCER_CLUSTER_NAME", "prod-eu"),
        ("BOUNCER_NOTIFY_RETRIES", "1"),
        ("BOUNCER_NOTIFY_ON", "always"),
        ("BOUNCER_PUSHGATEWAY_URL", "http://pg:9091"),
        ("BOUNCER_LOG", "debug"),
    ];
    let env: crate::cli::Env = envy::prefixed("BOUNCER_")
        .from_iter(vars.map(|(k, v)| (k.to_string(), v.to_string())))
        .unwrap();
    assert_eq!(env.max_bounces, Some(3));
    assert_eq!(env.policies.as_ref().map(Vec::len), Some(2));
    let s = crate::cli::Settings::merge(crate::cli::Flags::default(), env, false).unwrap();
    assert_eq!(s.max_bounces, 3);
    assert_eq!(s.notify.cluster_name.as_deref(), Some("prod-eu"));
    assert_eq!((s.notify.retries, s.notify.on), (1, NotifyOn::Always));
    assert!(s.notify.pushgateway_url.is_some());
}
