//! Settings: flags, else `BOUNCER_*` environment variables (envy), else defaults, merged once.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{Flags, LogFormat};
use crate::report::Format;

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
    pub fn from_env() -> Result<Env, String> {
        let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
        super::env_check::unknown(names, &super::env_check::known(OWN_VARIABLES))?;
        envy::prefixed("BOUNCER_")
            .from_env::<Env>()
            .map_err(|e| match e {
                envy::Error::Custom(msg) => {
                    format!("invalid BOUNCER_* environment variable: {msg}")
                }
                envy::Error::MissingValue(v) => format!("missing BOUNCER_{}", v.to_uppercase()),
            })
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

fn duration(var: &str, value: Option<String>, default: Duration) -> Result<Duration, String> {
    match value {
        None => Ok(default),
        Some(v) => humantime::parse_duration(&v)
            .map_err(|e| format!("{var}: {v:?} is not a duration (e.g. 10m): {e}")),
    }
}

impl Settings {
    pub fn merge(flags: Flags, env: Env, dry_run_flag: bool) -> Result<Settings, String> {
        let non_empty = |v: Vec<String>| if v.is_empty() { None } else { Some(v) };
        let prometheus = prometheus(&flags, &env)?;
        let max_bounces = flags.max_bounces.or(env.max_bounces).unwrap_or(10);
        if max_bounces == 0 {
            return Err("--max-bounces / BOUNCER_MAX_BOUNCES: must be at least 1".into());
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
            return Err("--rollout-timeout / BOUNCER_ROLLOUT_TIMEOUT: must be positive".into());
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
) -> Result<Option<crate::cluster::prometheus::Settings>, String> {
    const NAME: &str = "--prometheus-url / BOUNCER_PROMETHEUS_URL";
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
        return Err("--prometheus-timeout / BOUNCER_PROMETHEUS_TIMEOUT: must be positive".into());
    }
    let Some(url) = url else {
        if bearer_token_file.is_some() || ca_file.is_some() {
            return Err(format!(
                "{NAME}: needed with a Prometheus bearer token or CA file"
            ));
        }
        return Ok(None);
    };
    let url = reqwest::Url::parse(url.trim())
        .map_err(|e| format!("{NAME}: {url:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("{NAME}: {url} must be an http:// or https:// URL"));
    }
    // Anyone on the path could read a token sent in clear and query Prometheus as bouncer.
    if bearer_token_file.is_some() && url.scheme() != "https" {
        return Err(format!(
            "--prometheus-bearer-token-file / BOUNCER_PROMETHEUS_BEARER_TOKEN_FILE: a bearer \
             token is sent only over https, but {NAME} is {url}"
        ));
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
        for (env, want) in [
            (
                Env {
                    prometheus_url: Some("prometheus:9090".into()),
                    ..Default::default()
                },
                "BOUNCER_PROMETHEUS_URL",
            ),
            (
                Env {
                    prometheus_bearer_token_file: Some("/token".into()),
                    ..Default::default()
                },
                "needed with a Prometheus bearer token",
            ),
            (
                Env {
                    prometheus_url: Some("http://prometheus.monitoring:9090".into()),
                    prometheus_bearer_token_file: Some("/token".into()),
                    ..Default::default()
                },
                "BOUNCER_PROMETHEUS_BEARER_TOKEN_FILE: a bearer token is sent only over https, \
                 but --prometheus-url / BOUNCER_PROMETHEUS_URL is http://prometheus.monitoring:9090/",
            ),
            (
                Env {
                    prometheus_url: Some("http://p:9090".into()),
                    prometheus_timeout: Some("soon".into()),
                    ..Default::default()
                },
                "BOUNCER_PROMETHEUS_TIMEOUT",
            ),
        ] {
            let err = Settings::merge(Flags::default(), env, false).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
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
        let env = Env {
            rollout_timeout: Some("soon".into()),
            ..Default::default()
        };
        let err = Settings::merge(Flags::default(), env, false).unwrap_err();
        assert!(err.contains("BOUNCER_ROLLOUT_TIMEOUT"), "{err}");
        let env = Env {
            max_bounces: Some(0),
            ..Default::default()
        };
        assert!(
            Settings::merge(Flags::default(), env, false)
                .unwrap_err()
                .contains("BOUNCER_MAX_BOUNCES")
        );
    }
}
