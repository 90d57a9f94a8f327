//! Notifications and metrics of a finished run: settings, delivery to a Slack-compatible chat
//! webhook, a Microsoft Teams webhook, a JSON webhook and a Pushgateway, and the `notifications` part of the report.
//!
//! Everything here runs once per `run`, after the final report exists, and reads only that
//! report: a failed delivery is logged and reported, never changes what was bounced, and never
//! changes the exit code.

pub mod http;
pub mod pushgateway;
pub mod slack;
pub mod teams;

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::report::{Format, Mode, Report};

/// When the chat and JSON webhooks are sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum NotifyOn {
    /// Runs with a bounce queue: something was bounced, failed, reverted (or, in a dry run,
    /// would be bounced).
    #[default]
    Changes,
    /// Every run, also those with nothing due.
    Always,
}

#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Notifications and metrics")]
pub struct NotifyFlags {
    /// Cluster name in chat messages and the Pushgateway grouping key [env: BOUNCER_CLUSTER_NAME]
    #[arg(long, global = true)]
    pub cluster_name: Option<String>,
    /// File holding the Slack-compatible incoming webhook URL [env: BOUNCER_NOTIFY_SLACK_URL_FILE, or the URL itself in BOUNCER_NOTIFY_SLACK_URL]
    #[arg(long, global = true, value_name = "FILE")]
    pub notify_slack_url_file: Option<PathBuf>,
    /// File holding the Microsoft Teams incoming webhook (or Workflows webhook) URL [env: BOUNCER_NOTIFY_TEAMS_URL_FILE, or the URL itself in BOUNCER_NOTIFY_TEAMS_URL]
    #[arg(long, global = true, value_name = "FILE")]
    pub notify_teams_url_file: Option<PathBuf>,
    /// File holding the URL that receives the JSON report [env: BOUNCER_NOTIFY_WEBHOOK_URL_FILE, or the URL itself in BOUNCER_NOTIFY_WEBHOOK_URL]
    #[arg(long, global = true, value_name = "FILE")]
    pub notify_webhook_url_file: Option<PathBuf>,
    /// Which runs the webhooks hear about [env: BOUNCER_NOTIFY_ON] [default: changes]
    #[arg(long, global = true)]
    pub notify_on: Option<NotifyOn>,
    /// Timeout of one delivery attempt, e.g. 5s [env: BOUNCER_NOTIFY_TIMEOUT] [default: 5s]
    #[arg(long, global = true, value_parser = humantime::parse_duration)]
    pub notify_timeout: Option<Duration>,
    /// Retries of a failed delivery (timeouts, connection errors, 429 and 5xx) [env: BOUNCER_NOTIFY_RETRIES] [default: 2]
    #[arg(long, global = true)]
    pub notify_retries: Option<u32>,
    /// Pushgateway to push the run's metrics to, e.g. http://pushgateway.monitoring:9091 [env: BOUNCER_PUSHGATEWAY_URL]
    #[arg(long, global = true, value_name = "URL")]
    pub pushgateway_url: Option<String>,
}

/// The `BOUNCER_*` variables of this module. All strings: envy reaches a flattened struct
/// through serde's buffered map, which hands over every value as text.
#[derive(Debug, Default, Deserialize)]
pub struct Env {
    pub cluster_name: Option<String>,
    pub notify_slack_url: Option<String>,
    pub notify_slack_url_file: Option<PathBuf>,
    pub notify_teams_url: Option<String>,
    pub notify_teams_url_file: Option<PathBuf>,
    pub notify_webhook_url: Option<String>,
    pub notify_webhook_url_file: Option<PathBuf>,
    pub notify_on: Option<String>,
    pub notify_timeout: Option<String>,
    pub notify_retries: Option<String>,
    pub pushgateway_url: Option<String>,
}

/// A webhook URL. Its path is the credential of an incoming webhook, so it is never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(pub reqwest::Url);

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SecretUrl({}://{}/...)",
            self.0.scheme(),
            self.0.host_str().unwrap_or("")
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub cluster_name: Option<String>,
    pub slack_url: Option<SecretUrl>,
    pub teams_url: Option<SecretUrl>,
    pub webhook_url: Option<SecretUrl>,
    pub pushgateway_url: Option<reqwest::Url>,
    pub on: NotifyOn,
    pub timeout: Duration,
    pub retries: u32,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            cluster_name: None,
            slack_url: None,
            teams_url: None,
            webhook_url: None,
            pushgateway_url: None,
            on: NotifyOn::Changes,
            timeout: Duration::from_secs(5),
            retries: 2,
        }
    }
}

/// What `reqwest::Url::parse` refuses a text with (the `url` crate's error, named through
/// reqwest, which re-exports the URL type but not its error).
pub type UrlParseError = <reqwest::Url as std::str::FromStr>::Err;

/// The most retries of a delivery (see [`Settings::merge`]).
pub const MAX_RETRIES: u32 = 5;

/// Why a URL setting is not a URL bouncer can send to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    #[error("not a URL: {0}")]
    NotAUrl(#[source] UrlParseError),
    #[error("must be an http:// or https:// URL")]
    NotHttp,
}

/// A notification setting that was refused; each message names the flag or variable. A webhook
/// URL's value never appears in one (see [`SecretUrl`]).
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{setting}: {problem}")]
    Url {
        setting: String,
        #[source]
        problem: UrlProblem,
    },
    #[error("{setting}: not an http:// or https:// URL (the value is not shown: it is a secret)")]
    SecretUrl {
        setting: String,
        #[source]
        problem: UrlProblem,
    },
    #[error("BOUNCER_{var} and BOUNCER_{var}_FILE are both set; set one")]
    BothSet { var: &'static str },
    #[error("{setting}: cannot read {}: {source}", .path.display())]
    ReadFile {
        setting: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{setting}: {} is empty (it should hold the webhook URL)", .path.display())]
    EmptyFile { setting: String, path: PathBuf },
    #[error("BOUNCER_NOTIFY_ON: {value:?} is not one of changes, always")]
    NotifyOn { value: String },
    #[error("BOUNCER_NOTIFY_TIMEOUT: {value:?} is not a duration (e.g. 5s): {source}")]
    Timeout {
        value: String,
        #[source]
        source: humantime::DurationError,
    },
    #[error("--notify-timeout / BOUNCER_NOTIFY_TIMEOUT: must be positive")]
    ZeroTimeout,
    #[error("BOUNCER_NOTIFY_RETRIES: {value:?} is not a whole number")]
    Retries {
        value: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("--notify-retries / BOUNCER_NOTIFY_RETRIES: {retries} is too many (at most {max})")]
    TooManyRetries { retries: u32, max: u32 },
}

fn http_url(text: &str) -> Result<reqwest::Url, UrlProblem> {
    let url = reqwest::Url::parse(text.trim()).map_err(UrlProblem::NotAUrl)?;
    match url.scheme() {
        "http" | "https" if url.host_str().is_some() => Ok(url),
        _ => Err(UrlProblem::NotHttp),
    }
}

/// A secret URL from a file (flag, else `*_FILE`) or from the variable itself. The value is
/// never echoed in an error: a typo would otherwise print the credential to the Job's log.
fn secret_url(
    var: &'static str,
    flag_file: Option<PathBuf>,
    env_file: Option<PathBuf>,
    env_value: Option<String>,
) -> Result<Option<SecretUrl>, SettingsError> {
    let from_file = |path: PathBuf, setting: String| match std::fs::read_to_string(&path) {
        Ok(text) if text.trim().is_empty() => Err(SettingsError::EmptyFile { setting, path }),
        Ok(text) => Ok((setting, text)),
        Err(source) => Err(SettingsError::ReadFile {
            setting,
            path,
            source,
        }),
    };
    let flag = format!("--{}-file", var.to_lowercase().replace('_', "-"));
    // An empty variable is unset (as Kubernetes renders an env entry with no value); an empty
    // file is a Secret with a missing key, which is a mistake worth stopping for.
    let env_value = env_value.filter(|v| !v.trim().is_empty());
    let (setting, text) = match (flag_file, env_file, env_value) {
        (Some(path), _, _) => from_file(path, flag)?,
        (None, Some(_), Some(_)) => return Err(SettingsError::BothSet { var }),
        (None, Some(path), None) => from_file(path, format!("BOUNCER_{var}_FILE"))?,
        (None, None, Some(value)) => (format!("BOUNCER_{var}"), value),
        (None, None, None) => return Ok(None),
    };
    match http_url(&text) {
        Ok(url) => Ok(Some(SecretUrl(url))),
        Err(problem) => Err(SettingsError::SecretUrl { setting, problem }),
    }
}

impl Settings {
    pub fn merge(flags: NotifyFlags, env: Env) -> Result<Settings, SettingsError> {
        let defaults = Settings::default();
        let on = match (flags.notify_on, env.notify_on) {
            (Some(on), _) => on,
            (None, Some(value)) => match NotifyOn::from_str(value.trim(), true) {
                Ok(on) => on,
                // clap's error is a sentence for its own flag; this one names the variable.
                Err(_) => return Err(SettingsError::NotifyOn { value }),
            },
            (None, None) => defaults.on,
        };
        let timeout = match (flags.notify_timeout, env.notify_timeout) {
            (Some(d), _) => d,
            (None, Some(value)) => match humantime::parse_duration(value.trim()) {
                Ok(d) => d,
                Err(source) => return Err(SettingsError::Timeout { value, source }),
            },
            (None, None) => defaults.timeout,
        };
        if timeout.is_zero() {
            return Err(SettingsError::ZeroTimeout);
        }
        let retries = match (flags.notify_retries, env.notify_retries) {
            (Some(n), _) => n,
            (None, Some(value)) => match value.trim().parse() {
                Ok(n) => n,
                Err(source) => return Err(SettingsError::Retries { value, source }),
            },
            (None, None) => defaults.retries,
        };
        // Each attempt is bounded by the timeout; more than a few would keep a finished run's
        // pod alive past a Job's termination grace period.
        if retries > MAX_RETRIES {
            return Err(SettingsError::TooManyRetries {
                retries,
                max: MAX_RETRIES,
            });
        }
        let pushgateway = match flags.pushgateway_url {
            Some(u) => Some(("--pushgateway-url", u)),
            None => env
                .pushgateway_url
                .filter(|u| !u.trim().is_empty())
                .map(|u| ("BOUNCER_PUSHGATEWAY_URL", u)),
        };
        let pushgateway_url = match pushgateway {
            Some((setting, u)) => Some(http_url(&u).map_err(|problem| SettingsError::Url {
                setting: setting.into(),
                problem,
            })?),
            None => None,
        };
        Ok(Settings {
            cluster_name: flags
                .cluster_name
                .or(env.cluster_name)
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty()),
            slack_url: secret_url(
                "NOTIFY_SLACK_URL",
                flags.notify_slack_url_file,
                env.notify_slack_url_file,
                env.notify_slack_url,
            )?,
            teams_url: secret_url(
                "NOTIFY_TEAMS_URL",
                flags.notify_teams_url_file,
                env.notify_teams_url_file,
                env.notify_teams_url,
            )?,
            webhook_url: secret_url(
                "NOTIFY_WEBHOOK_URL",
                flags.notify_webhook_url_file,
                env.notify_webhook_url_file,
                env.notify_webhook_url,
            )?,
            pushgateway_url,
            on,
            timeout,
            retries,
        })
    }

    /// The configured delivery targets, in the order the report lists them.
    fn targets(&self) -> Vec<Target> {
        [
            (Target::Slack, self.slack_url.is_some()),
            (Target::Teams, self.teams_url.is_some()),
            (Target::Webhook, self.webhook_url.is_some()),
            (Target::Pushgateway, self.pushgateway_url.is_some()),
        ]
        .into_iter()
        .filter_map(|(target, set)| set.then_some(target))
        .collect()
    }
}

/// Where a delivery went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    Slack,
    Teams,
    Webhook,
    Pushgateway,
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Slack => "slack",
            Target::Teams => "teams",
            Target::Webhook => "webhook",
            Target::Pushgateway => "pushgateway",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum DeliveryStatus {
    Sent,
    Failed,
    /// Not sent by choice (`--notify-on changes` and a run with nothing to say).
    NotSent,
}

/// One delivery, as the report's `notifications` list shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    pub target: Target,
    pub status: DeliveryStatus,
    pub attempts: u32,
    /// Why it failed (the last attempt's error) or why it was not sent; null when sent.
    pub detail: Option<String>,
}

/// Facts about the run the report does not carry.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// When the run ended (now, as the caller's clock reads it).
    pub finished: DateTime<Utc>,
    pub duration: Duration,
    /// The run's exit status is 0.
    pub succeeded: bool,
}

/// The reason code of a workload held back by its circuit breaker: it needs a person, so the
/// notifications name it like a bounce.
pub const BREAKER_OPEN: &str = "breakerOpen";

/// A row the chat message and the `changes` rule count: the bounce queue, what dry-run
/// policies would bounce, and workloads whose circuit breaker is open.
pub fn notable(row: &crate::report::Row) -> bool {
    row.order.is_some()
        || row.decision == crate::report::DRY_RUN
        || row.reason_code.as_deref() == Some(BREAKER_OPEN)
}

/// Distinct workloads the run held back with an open circuit breaker.
pub fn breakers_open(report: &Report) -> usize {
    let open: std::collections::BTreeSet<_> = report
        .rows
        .iter()
        .filter(|r| r.reason_code.as_deref() == Some(BREAKER_OPEN))
        .map(|r| &r.workload)
        .collect();
    open.len()
}

/// True when the webhooks should hear about this run.
pub fn worth_sending(report: &Report, on: NotifyOn) -> bool {
    on == NotifyOn::Always || report.rows.iter().any(notable)
}

/// The generic webhook's body: the report exactly as `--output json` prints it on one line.
pub fn webhook_body(report: &Report) -> String {
    crate::report::render(report, Format::Json, true)
}

/// Sends the run's notifications and metrics, all at once, each with bounded retries, and says
/// how each went. A plan (`bouncer plan`) notifies nobody.
pub async fn deliver(settings: &Settings, report: &Report, run: Run) -> Vec<Delivery> {
    if report.mode == Mode::Plan || settings.targets().is_empty() {
        return Vec::new();
    }
    let sender = match http::Sender::new(settings.timeout, settings.retries) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("notifications: no HTTP client: {e}");
            let failed = |target| Delivery {
                target,
                status: DeliveryStatus::Failed,
                attempts: 0,
                detail: Some(format!("no HTTP client: {e}")),
            };
            return settings.targets().into_iter().map(failed).collect();
        }
    };
    let send = worth_sending(report, settings.on);
    let not_sent = |target| Delivery {
        target,
        status: DeliveryStatus::NotSent,
        attempts: 0,
        detail: Some("nothing was due (notify on: changes)".into()),
    };
    // A POST of JSON to a webhook URL, if configured; only when the run is worth telling.
    let post = |target: Target, url: Option<&SecretUrl>, body: &dyn Fn() -> String| {
        let request = url.map(|url| http::Request::post(&url.0, "application/json", body()));
        let sender = &sender;
        async move {
            let request = request?;
            if !send {
                return Some(not_sent(target));
            }
            Some(sender.send(target, request).await)
        }
    };
    let cluster = settings.cluster_name.as_deref();
    let slack = post(Target::Slack, settings.slack_url.as_ref(), &|| {
        slack::message(report, cluster).to_string()
    });
    let teams = post(Target::Teams, settings.teams_url.as_ref(), &|| {
        teams::message(report, cluster).to_string()
    });
    let webhook = post(Target::Webhook, settings.webhook_url.as_ref(), &|| {
        webhook_body(report)
    });
    let metrics = async {
        let base = settings.pushgateway_url.as_ref()?;
        let cluster = settings.cluster_name.as_deref().unwrap_or("");
        let request = http::Request {
            method: pushgateway::method(run.succeeded),
            url: pushgateway::group_url(base, cluster),
            content_type: pushgateway::CONTENT_TYPE,
            body: pushgateway::exposition(report, &run),
        };
        Some(sender.send(Target::Pushgateway, request).await)
    };
    let (slack, teams, webhook, metrics) = futures::join!(slack, teams, webhook, metrics);
    [slack, teams, webhook, metrics]
        .into_iter()
        .flatten()
        .collect()
}

/// One line for the table and Markdown reports, e.g. `notifications: slack sent; pushgateway
/// failed after 3 attempts: HTTP 500`.
pub fn summary_line(deliveries: &[Delivery]) -> Option<String> {
    if deliveries.is_empty() {
        return None;
    }
    let parts: Vec<String> = deliveries
        .iter()
        .map(|d| {
            let name = d.target.as_str();
            let detail = d.detail.as_deref().unwrap_or("");
            match d.status {
                DeliveryStatus::Sent => format!("{name} sent"),
                DeliveryStatus::NotSent => format!("{name} not sent: {detail}"),
                DeliveryStatus::Failed => {
                    let tries = if d.attempts == 1 {
                        "attempt"
                    } else {
                        "attempts"
                    };
                    format!("{name} failed after {} {tries}: {detail}", d.attempts)
                }
            }
        })
        .collect();
    Some(format!("notifications: {}", parts.join("; ")))
}

#[derive(Serialize)]
struct WithNotifications<'a> {
    #[serde(flatten)]
    report: &'a Report,
    notifications: &'a [Delivery],
}

/// The report as `report::render` gives it, plus how its notifications went: a `notifications`
/// list in JSON, a last line in the table and Markdown. Without notification targets it is
/// exactly `report::render`.
pub fn render(report: &Report, deliveries: &[Delivery], format: Format, one_line: bool) -> String {
    let mut out = Vec::new();
    write(&mut out, report, deliveries, format, one_line).expect("writing to memory");
    String::from_utf8(out).expect("the report is UTF-8")
}

/// [`render`] straight into `w` (stdout, the report file), JSON serialized as it is written.
pub fn write(
    w: &mut impl std::io::Write,
    report: &Report,
    deliveries: &[Delivery],
    format: Format,
    one_line: bool,
) -> std::io::Result<()> {
    let Some(line) = summary_line(deliveries) else {
        return crate::report::write(w, report, format, one_line);
    };
    if matches!(format, Format::Json | Format::Yaml) {
        let with = WithNotifications {
            report,
            notifications: deliveries,
        };
        if format == Format::Yaml {
            return crate::report::yaml(w, &with);
        }
        return crate::report::json_line(w, &with, one_line);
    }
    crate::report::write(w, report, format, one_line)?;
    if format == Format::Markdown {
        w.write_all(b"\n")?;
    }
    writeln!(w, "{line}")
}

#[cfg(test)]
mod tests;
