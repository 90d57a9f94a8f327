//! Settings: flags, else `BOUNCER_*` environment variables (envy), else defaults, merged once.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::env_check::UnknownVariable;
use super::{Flags, LogFormat};
use crate::http_text::shown_url;
use crate::notify::UrlParseError;
use crate::report::Format;

const PROMETHEUS_URL: &str = "--prometheus-url / BOUNCER_PROMETHEUS_URL";

/// A setting that was refused, from the environment or a flag; each message names the flag or
/// variable, and what was wrong with its value.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(transparent)]
    UnknownVariable(#[from] UnknownVariable),
    #[error("{}", env_text(.0))]
    Env(#[source] envy::Error),
    #[error("{var}: {value:?} is not a duration (e.g. 10m): {source}")]
    Duration {
        var: &'static str,
        value: String,
        #[source]
        source: humantime::DurationError,
    },
    #[error("--max-bounces / BOUNCER_MAX_BOUNCES: must be at least 1")]
    NoBounces,
    #[error("{setting}: must be positive")]
    NotPositive { setting: &'static str },
    #[error("{}: needed with a Prometheus bearer token or CA file", PROMETHEUS_URL)]
    PrometheusUrlNeeded,
    #[error("{}: {url:?} is not a URL: {source}", PROMETHEUS_URL)]
    PrometheusNotAUrl {
        url: String,
        #[source]
        source: UrlParseError,
    },
    /// `url` as [`shown_url`] shows it, without credentials.
    #[error("{}: {url} must be an http:// or https:// URL", PROMETHEUS_URL)]
    PrometheusNotHttp { url: String },
    #[error(
        "--prometheus-bearer-token-file / BOUNCER_PROMETHEUS_BEARER_TOKEN_FILE: a bearer token is \
         sent only over https, but {} is {url}",
        PROMETHEUS_URL
    )]
    TokenOverHttp { url: String },
    #[error(transparent)]
    Notify(#[from] crate::notify::SettingsError),
}

fn env_text(e: &envy::Error) -> String {
    match e {
        envy::Error::Custom(msg) => format!("invalid BOUNCER_* environment variable: {msg}"),
        envy::Error::MissingValue(v) => format!("missing BOUNCER_{}", v.to_uppercase()),
    }
}

/// Declares [`Env`] and the list of its own variables' names together, so the check for
/// unknown `BOUNCER_*` variables can never miss a field added here.
macro_rules! env_struct {
    ($($(#[$meta:meta])* $name:ident: $ty:ty,)*) => {
        /// `BOUNCER_*` environment variables, read once in `main`.
        #[derive(Debug, Default, Deserialize)]
        pub struct Env {
            $($(#[$meta])* pub $name: $ty,)*
            #[serde(flatten)]
            pub notify: crate::notify::Env,
        }

        /// The variables [`Env`] reads itself, lower case without the prefix.
        pub(super) const OWN_VARIABLES: &[&str] = &[$(stringify!($name)),*];
    };
}

env_struct! {
    #[serde(default)]
    policies: Option<Vec<PathBuf>>,
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    #[serde(default)]
    namespaces: Option<Vec<String>>,
    max_bounces: Option<usize>,
    output: Option<Format>,
    report: Option<PathBuf>,
    log_format: Option<LogFormat>,
    rollout_timeout: Option<String>,
    lease_namespace: Option<String>,
    lease_name: Option<String>,
    dry_run: Option<bool>,
    verify_settle: Option<String>,
    prometheus_url: Option<String>,
    prometheus_bearer_token_file: Option<PathBuf>,
    prometheus_ca_file: Option<PathBuf>,
    prometheus_timeout: Option<String>,
}

impl Env {
    /// Reads the process environment; an unknown `BOUNCER_*` variable is an error (see
    /// [`super::env_check`]).
    pub fn from_env() -> Result<Env, SettingsError> {
        let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
        super::env_check::unknown(names, &super::env_check::known(OWN_VARIABLES))?;
        envy::prefixed("BOUNCER_")
            .from_env::<Env>()
            .map_err(SettingsError::Env)
    }
}

/// Where the run lock lives unless set: a fixed namespace, the one the README and docs/install.md
/// install the chart in, never the kubeconfig context's. A person's run from a laptop must take
/// the same Lease as the CronJob, or both bounce at once and neither sees the other's bare-pod
/// marks.
pub const DEFAULT_LEASE_NAMESPACE: &str = "bouncer";

/// Effective settings after flags, environment and defaults are merged.
#[derive(Debug, Clone)]
pub struct Settings {
    pub policies: Vec<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespaces: Vec<String>,
    pub max_bounces: usize,
    pub output: Format,
    pub report: Option<PathBuf>,
    pub log_format: LogFormat,
    pub rollout_timeout: Duration,
    pub lease_namespace: String,
    pub lease_name: String,
    pub dry_run: bool,
    pub verify_settle: Duration,
    pub prometheus: Option<crate::cluster::prometheus::Settings>,
    pub notify: crate::notify::Settings,
}

fn duration(
    var: &'static str,
    value: Option<String>,
    default: Duration,
) -> Result<Duration, SettingsError> {
    match value {
        None => Ok(default),
        Some(value) => match humantime::parse_duration(&value) {
            Ok(d) => Ok(d),
            Err(source) => Err(SettingsError::Duration { var, value, source }),
        },
    }
}

impl Settings {
    pub fn merge(flags: Flags, env: Env, dry_run_flag: bool) -> Result<Settings, SettingsError> {
        let non_empty = |v: Vec<String>| if v.is_empty() { None } else { Some(v) };
        let prometheus = prometheus(&flags, &env)?;
        let max_bounces = flags.max_bounces.or(env.max_bounces).unwrap_or(10);
        if max_bounces == 0 {
            return Err(SettingsError::NoBounces);
        }
        let rollout_timeout = match flags.rollout_timeout {
            Some(d) => d,
            None => duration(
                "BOUNCER_ROLLOUT_TIMEOUT",
                env.rollout_timeout,
                Duration::from_secs(600),
            )?,
        };
        if rollout_timeout.is_zero() {
            return Err(SettingsError::NotPositive {
                setting: "--rollout-timeout / BOUNCER_ROLLOUT_TIMEOUT",
            });
        }
        Ok(Settings {
            policies: if flags.policies.is_empty() {
                env.policies
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| vec![PathBuf::from("policies")])
            } else {
                flags.policies
            },
            kubeconfig: flags.kubeconfig.or(env.kubeconfig),
            context: flags.context.or(env.context),
            namespaces: non_empty([flags.namespace, flags.namespaces].concat())
                .or(env.namespaces)
                .unwrap_or_default()
                .into_iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
            max_bounces,
            output: flags.output.or(env.output).unwrap_or(Format::Table),
            report: flags.report.or(env.report),
            log_format: flags
                .log_format
                .or(env.log_format)
                .unwrap_or(LogFormat::Text),
            rollout_timeout,
            lease_namespace: flags
                .lease_namespace
                .or(env.lease_namespace)
                .filter(|ns| !ns.trim().is_empty())
                .unwrap_or_else(|| DEFAULT_LEASE_NAMESPACE.into()),
            lease_name: flags
                .lease_name
                .or(env.lease_name)
                .unwrap_or_else(|| "bouncer".into()),
            dry_run: dry_run_flag || env.dry_run.unwrap_or(false),
            verify_settle: duration(
                "BOUNCER_VERIFY_SETTLE",
                env.verify_settle,
                Duration::from_secs(2),
            )?,
            prometheus,
            notify: crate::notify::Settings::merge(flags.notify, env.notify)?,
        })
    }
}

fn prometheus(
    flags: &Flags,
    env: &Env,
) -> Result<Option<crate::cluster::prometheus::Settings>, SettingsError> {
    let url = flags
        .prometheus_url
        .clone()
        .or(env.prometheus_url.clone())
        .filter(|u| !u.trim().is_empty());
    let bearer_token_file = flags
        .prometheus_bearer_token_file
        .clone()
        .or(env.prometheus_bearer_token_file.clone());
    let ca_file = flags
        .prometheus_ca_file
        .clone()
        .or(env.prometheus_ca_file.clone());
    let timeout = match flags.prometheus_timeout {
        Some(d) => d,
        None => duration(
            "BOUNCER_PROMETHEUS_TIMEOUT",
            env.prometheus_timeout.clone(),
            Duration::from_secs(10),
        )?,
    };
    if timeout.is_zero() {
        return Err(SettingsError::NotPositive {
            setting: "--prometheus-timeout / BOUNCER_PROMETHEUS_TIMEOUT",
        });
    }
    let Some(url) = url else {
        if bearer_token_file.is_some() || ca_file.is_some() {
            return Err(SettingsError::PrometheusUrlNeeded);
        }
        return Ok(None);
    };
    let url = match reqwest::Url::parse(url.trim()) {
        Ok(url) => url,
        Err(source) => return Err(SettingsError::PrometheusNotAUrl { url, source }),
    };
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        let url = shown_url(&url);
        return Err(SettingsError::PrometheusNotHttp { url });
    }
    // Anyone on the path could read a token sent in clear and query Prometheus as bouncer.
    if bearer_token_file.is_some() && url.scheme() != "https" {
        let url = shown_url(&url);
        return Err(SettingsError::TokenOverHttp { url });
    }
    Ok(Some(crate::cluster::prometheus::Settings {
        url,
        bearer_token_file,
        ca_file,
        timeout,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_env_and_env_over_defaults() {
        let env = Env {
            max_bounces: Some(3),
            rollout_timeout: Some("2m".into()),
            ..Default::default()
        };
        let s = Settings::merge(Flags::default(), env, false).unwrap();
        assert_eq!(s.max_bounces, 3);
        assert_eq!(s.rollout_timeout, Duration::from_secs(120));
        assert_eq!(s.policies, vec![PathBuf::from("policies")]);
        // Whatever the kubeconfig's context says: the CronJob and a person share one Lease.
        assert_eq!(s.lease_namespace, DEFAULT_LEASE_NAMESPACE);
        let env = Env {
            lease_namespace: Some("ops".into()),
            ..Default::default()
        };
        let s = Settings::merge(Flags::default(), env, false).unwrap();
        assert_eq!(s.lease_namespace, "ops");
        let flags = Flags {
            max_bounces: Some(1),
            ..Default::default()
        };
        let env = Env {
            max_bounces: Some(3),
            ..Default::default()
        };
        assert_eq!(Settings::merge(flags, env, false).unwrap().max_bounces, 1);
    }

    #[test]
    fn prometheus_settings() {
        let none = Settings::merge(Flags::default(), Env::default(), false).unwrap();
        assert_eq!(none.prometheus, None);
        let env = Env {
            prometheus_url: Some("http://prometheus.monitoring:9090/prom/".into()),
            prometheus_timeout: Some("3s".into()),
            prometheus_ca_file: Some("/ca.pem".into()),
            ..Default::default()
        };
        let s = Settings::merge(Flags::default(), env, false)
            .unwrap()
            .prometheus
            .unwrap();
        assert_eq!(s.url.as_str(), "http://prometheus.monitoring:9090/prom/");
        assert_eq!(s.timeout, Duration::from_secs(3));
        assert_eq!(s.ca_file, Some(PathBuf::from("/ca.pem")));
        let refused = |env: Env| Settings::merge(Flags::default(), env, false).unwrap_err();
        let err = refused(Env {
            prometheus_url: Some("prometheus:9090".into()),
            ..Default::default()
        });
        assert!(
            matches!(err, SettingsError::PrometheusNotHttp { .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "--prometheus-url / BOUNCER_PROMETHEUS_URL: prometheus:9090 must be an http:// or \
             https:// URL"
        );
        let err = refused(Env {
            prometheus_url: Some("http://[::1".into()),
            ..Default::default()
        });
        assert!(
            matches!(err, SettingsError::PrometheusNotAUrl { .. }),
            "{err:?}"
        );
        let err = refused(Env {
            prometheus_bearer_token_file: Some("/token".into()),
            ..Default::default()
        });
        assert!(matches!(err, SettingsError::PrometheusUrlNeeded), "{err:?}");
        assert_eq!(
            err.to_string(),
            "--prometheus-url / BOUNCER_PROMETHEUS_URL: needed with a Prometheus bearer token or \
             CA file"
        );
        let err = refused(Env {
            prometheus_url: Some("http://prometheus.monitoring:9090".into()),
            prometheus_bearer_token_file: Some("/token".into()),
            ..Default::default()
        });
        assert!(
            matches!(err, SettingsError::TokenOverHttp { .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "--prometheus-bearer-token-file / BOUNCER_PROMETHEUS_BEARER_TOKEN_FILE: a bearer token \
             is sent only over https, but --prometheus-url / BOUNCER_PROMETHEUS_URL is \
             http://prometheus.monitoring:9090"
        );
        // A password in the URL is not repeated in the message.
        let err = refused(Env {
            prometheus_url: Some("http://bouncer:hunter2@prometheus:9090".into()),
            prometheus_bearer_token_file: Some("/token".into()),
            ..Default::default()
        });
        assert!(!err.to_string().contains("hunter2"), "{err}");
        let err = refused(Env {
            prometheus_url: Some("http://p:9090".into()),
            prometheus_timeout: Some("soon".into()),
            ..Default::default()
        });
        assert!(
            matches!(
                err,
                SettingsError::Duration {
                    var: "BOUNCER_PROMETHEUS_TIMEOUT",
                    ..
                }
            ),
            "{err:?}"
        );
        let err = refused(Env {
            prometheus_timeout: Some("0s".into()),
            ..Default::default()
        });
        assert!(
            matches!(err, SettingsError::NotPositive { setting }
                if setting == "--prometheus-timeout / BOUNCER_PROMETHEUS_TIMEOUT"),
            "{err:?}"
        );
    }

    #[test]
    fn every_field_of_env_is_a_known_variable() {
        let known = super::super::env_check::known(OWN_VARIABLES);
        assert!(OWN_VARIABLES.contains(&"dry_run") && OWN_VARIABLES.contains(&"kubeconfig"));
        for name in OWN_VARIABLES {
            assert!(
                known.contains(&format!("BOUNCER_{}", name.to_uppercase())),
                "{name}"
            );
        }
        // BOUNCER_DRY_RUN is read: a typo of it is refused, the name itself is not.
        let env: Env = envy::prefixed("BOUNCER_")
            .from_iter([("BOUNCER_DRY_RUN".to_string(), "true".to_string())])
            .unwrap();
        assert!(
            Settings::merge(Flags::default(), env, false)
                .unwrap()
                .dry_run
        );
    }

    #[test]
    fn bad_settings_name_the_variable() {
        let refused = |env: Env| Settings::merge(Flags::default(), env, false).unwrap_err();
        let err = refused(Env {
            rollout_timeout: Some("soon".into()),
            ..Default::default()
        });
        assert!(
            matches!(&err, SettingsError::Duration { var: "BOUNCER_ROLLOUT_TIMEOUT", value, .. }
                if value == "soon"),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("BOUNCER_ROLLOUT_TIMEOUT: \"soon\" is not a duration (e.g. 10m): "),
            "{err}"
        );
        let err = refused(Env {
            max_bounces: Some(0),
            ..Default::default()
        });
        assert!(matches!(err, SettingsError::NoBounces));
        assert_eq!(
            err.to_string(),
            "--max-bounces / BOUNCER_MAX_BOUNCES: must be at least 1"
        );
        let err = refused(Env {
            rollout_timeout: Some("0s".into()),
            ..Default::default()
        });
        assert_eq!(
            err.to_string(),
            "--rollout-timeout / BOUNCER_ROLLOUT_TIMEOUT: must be positive"
        );
        // A notification setting's error is the notify module's, passed through.
        let err = refused(Env {
            notify: crate::notify::Env {
                notify_retries: Some("9".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        assert!(matches!(
            err,
            SettingsError::Notify(crate::notify::SettingsError::TooManyRetries { .. })
        ));
    }

    #[test]
    fn a_value_the_environment_cannot_hold_names_the_variable() {
        let err: envy::Error = envy::prefixed("BOUNCER_")
            .from_iter::<_, Env>([("BOUNCER_MAX_BOUNCES".to_string(), "many".to_string())])
            .unwrap_err();
        let err = SettingsError::Env(err);
        assert!(
            err.to_string()
                .starts_with("invalid BOUNCER_* environment variable: "),
            "{err}"
        );
        assert!(err.to_string().contains("MAX_BOUNCES"), "{err}");
        assert_eq!(
            SettingsError::Env(envy::Error::MissingValue("max_bounces")).to_string(),
            "missing BOUNCER_MAX_BOUNCES"
        );
    }
}
