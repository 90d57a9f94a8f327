//! Command line (clap): the commands, their flags grouped by topic, and the help text. Settings
//! merge in [`settings`]; unknown `BOUNCER_*` variables are refused in [`env_check`].

pub mod env_check;
pub mod settings;
pub mod target;
pub mod validate;
pub mod version;

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

pub use settings::{DEFAULT_LEASE_NAMESPACE, Env, Settings};

use crate::report::Format;

const EXIT_CODES: &str = "\
Exit codes:
  0  ok (also: nothing due, another run holds the lock)
  1  a bounce failed or the run halted; explain: workload not found
  2  invalid input or settings (policies, flags, BOUNCER_* variables); nothing was changed
  3  cluster unreachable or forbidden";

const EXAMPLES: &str = "\
Examples:
  bouncer validate policies/                    check policy files offline
  bouncer validate -o github policies/          errors as pull request annotations
  bouncer plan -n shop -o markdown              what a run would do in namespace shop
  bouncer run --dry-run --context staging       plan and report, change nothing
  bouncer explain deploy/web -n shop            why deployment shop/web would (not) bounce
  bouncer completion bash > /etc/bash_completion.d/bouncer";

#[derive(Debug, Parser)]
#[command(
    name = "bouncer",
    version,
    about = "Bounces leaky Kubernetes workloads one at a time, the way kubectl rollout restart does, and proves it.",
    after_help = format!("{EXAMPLES}\n\n{EXIT_CODES}\n\nSettings: flags, else BOUNCER_* environment variables, else defaults; an unknown BOUNCER_* variable is an error."),
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub log: LogFlags,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check policy files offline (files or directories; many `---` documents per file).
    #[command(after_help = format!("Examples:\n  bouncer validate policies/ extra.yaml\n  bouncer validate -o json policies/\n  bouncer validate -o github policies/   (GitHub Actions annotations on the policy lines)\n\n{EXIT_CODES}"))]
    Validate {
        /// Files or directories [env: BOUNCER_POLICIES, comma-separated] [default: policies]
        paths: Vec<PathBuf>,
        /// How to print the result: text, json, or github (workflow commands that annotate the
        /// pull request's lines)
        #[arg(long, short, value_enum, default_value_t = ValidateFormat::Text)]
        output: ValidateFormat,
    },
    /// Read-only report of what a run would do and why.
    #[command(after_help = format!("Examples:\n  bouncer plan\n  bouncer plan -n shop -n web -o json\n\n{EXIT_CODES}"))]
    Plan {
        #[command(flatten)]
        flags: Flags,
    },
    /// Bounce what is due, one workload at a time (the CronJob entrypoint).
    #[command(after_help = format!("Examples:\n  bouncer run --dry-run\n  bouncer run --policies /etc/bouncer/policies --log-format json\n\n{EXIT_CODES}"))]
    Run {
        /// Plan and report, change nothing [env: BOUNCER_DRY_RUN=true]
        #[arg(long, help_heading = "Run")]
        dry_run: bool,
        #[command(flatten)]
        flags: Flags,
    },
    /// Why a workload would or would not be bounced now: every policy that selects it, each
    /// trigger and gate with its numbers, and the decision (read-only).
    #[command(after_help = format!("Examples:\n  bouncer explain deploy/web -n shop\n  bouncer explain sts db -n shop -o json\n  bouncer explain deployment/shop/web        (KIND/NAMESPACE/NAME)\n\n{EXIT_CODES}"))]
    Explain {
        /// The workload as kubectl names it: KIND/NAME or KIND NAME with -n (the kubeconfig
        /// context's namespace without it), or KIND/NAMESPACE/NAME. Kinds: deploy, deployment,
        /// sts, statefulset, ds, daemonset, po, pod
        #[arg(num_args = 1..=2, required = true, value_name = "TARGET")]
        target: Vec<String>,
        #[command(flatten)]
        flags: Flags,
    },
    /// Print the JSON Schema of a policy document.
    Schema,
    /// Print a shell completion script.
    #[command(
        after_help = "Examples:\n  bouncer completion bash > /etc/bash_completion.d/bouncer\n  bouncer completion zsh > \"${fpath[1]}/_bouncer\"\n  bouncer completion fish > ~/.config/fish/completions/bouncer.fish"
    )]
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the version, git commit, build date and the Kubernetes API version it was built against.
    Version {
        /// text or json
        #[arg(long, short, value_enum, default_value_t = VersionFormat::Text)]
        output: VersionFormat,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ValidateFormat {
    Text,
    Json,
    Github,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VersionFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// Logging, for every command.
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Logging")]
pub struct LogFlags {
    /// More log detail: -v debug, -vv trace (bouncer's own logs)
    #[arg(short, long, global = true, action = ArgAction::Count, conflicts_with = "log_level")]
    pub verbose: u8,
    /// Log level [default: info; BOUNCER_LOG takes a full tracing filter]
    #[arg(long, global = true, value_enum)]
    pub log_level: Option<LogLevel>,
    /// Log format on stderr [env: BOUNCER_LOG_FORMAT] [default: text]
    #[arg(long, global = true)]
    pub log_format: Option<LogFormat>,
}

impl LogFlags {
    /// The tracing filter: flags, else BOUNCER_LOG (`from_env`), else info with the client
    /// libraries at warn.
    pub fn filter(&self, from_env: Option<String>) -> String {
        let level = match (self.verbose, self.log_level) {
            (_, Some(level)) => Some(level),
            (0, None) => None,
            (1, None) => Some(LogLevel::Debug),
            (_, None) => Some(LogLevel::Trace),
        };
        let quiet = "kube=warn,tower=warn,hyper=warn";
        match level {
            None => from_env.unwrap_or_else(|| format!("info,{quiet}")),
            Some(LogLevel::Error) => "error".into(),
            Some(LogLevel::Warn) => "warn".into(),
            Some(LogLevel::Info) => format!("info,{quiet}"),
            Some(LogLevel::Debug) => format!("info,bouncer=debug,{quiet}"),
            Some(LogLevel::Trace) => format!("info,bouncer=trace,{quiet}"),
        }
    }
}

/// The flags of the commands that read the cluster (plan, run, explain).
#[derive(Debug, Default, Args)]
pub struct Flags {
    /// Path to the kubeconfig file [env: BOUNCER_KUBECONFIG] [default: KUBECONFIG, ~/.kube/config, or in-cluster]
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context [env: BOUNCER_CONTEXT] [default: current context, or in-cluster]
    #[arg(long, help_heading = "Cluster")]
    pub context: Option<String>,
    /// Only this namespace (repeatable) [default: all]
    #[arg(short = 'n', long, value_name = "NAMESPACE", help_heading = "Cluster")]
    pub namespace: Vec<String>,
    /// Only these namespaces (comma-separated) [env: BOUNCER_NAMESPACES] [default: all]
    #[arg(long, value_delimiter = ',', help_heading = "Cluster")]
    pub namespaces: Vec<String>,
    /// Namespace of the run lock (a Lease); the chart's CronJob sets its own [env: BOUNCER_LEASE_NAMESPACE] [default: bouncer]
    #[arg(long, help_heading = "Cluster")]
    pub lease_namespace: Option<String>,
    /// Name of the run lock Lease [env: BOUNCER_LEASE_NAME] [default: bouncer]
    #[arg(long, help_heading = "Cluster")]
    pub lease_name: Option<String>,
    /// Policy files or directories [env: BOUNCER_POLICIES, comma-separated] [default: policies]
    #[arg(long, value_name = "PATH", help_heading = "Policies")]
    pub policies: Vec<PathBuf>,
    /// Most bounces per run, over all policies [env: BOUNCER_MAX_BOUNCES] [default: 10]
    #[arg(long, help_heading = "Policies")]
    pub max_bounces: Option<usize>,
    /// Rollout timeout for policies that set none, e.g. 10m [env: BOUNCER_ROLLOUT_TIMEOUT] [default: 10m]
    #[arg(long, value_parser = humantime::parse_duration, help_heading = "Policies")]
    pub rollout_timeout: Option<Duration>,
    /// Report format on stdout [env: BOUNCER_OUTPUT] [default: table]
    #[arg(long, short, help_heading = "Output")]
    pub output: Option<Format>,
    /// Also write the report to this file (format from its extension: .json, .yaml, .md, else table) [env: BOUNCER_REPORT]
    #[arg(long, value_name = "FILE", help_heading = "Output")]
    pub report: Option<PathBuf>,
    /// Prometheus for memory history (sustained, growth, predict) and blockWhen, e.g. http://prometheus.monitoring:9090 [env: BOUNCER_PROMETHEUS_URL] [default: none: those triggers are off, blockers block]
    #[arg(long, value_name = "URL", help_heading = "Prometheus")]
    pub prometheus_url: Option<String>,
    /// Bearer token for Prometheus, read from this file at each run [env: BOUNCER_PROMETHEUS_BEARER_TOKEN_FILE]
    #[arg(long, value_name = "FILE", help_heading = "Prometheus")]
    pub prometheus_bearer_token_file: Option<PathBuf>,
    /// PEM CA bundle for a Prometheus served over TLS [env: BOUNCER_PROMETHEUS_CA_FILE] [default: the system roots]
    #[arg(long, value_name = "FILE", help_heading = "Prometheus")]
    pub prometheus_ca_file: Option<PathBuf>,
    /// Per Prometheus query, e.g. 10s [env: BOUNCER_PROMETHEUS_TIMEOUT] [default: 10s]
    #[arg(long, value_parser = humantime::parse_duration, help_heading = "Prometheus")]
    pub prometheus_timeout: Option<Duration>,
    #[command(flatten, next_help_heading = "Notifications")]
    pub notify: crate::notify::NotifyFlags,
    /// The global --log-format, set by the shell before the merge.
    #[arg(skip)]
    pub log_format: Option<LogFormat>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from([&["bouncer"], args].concat())
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn namespaces_come_from_n_and_namespaces_together() {
        let Command::Plan { flags } =
            parse(&["plan", "-n", "a", "--namespace", "b", "--namespaces", "c,d"])
                .unwrap()
                .command
        else {
            panic!("plan");
        };
        let s = Settings::merge(flags, Env::default(), false).unwrap();
        assert_eq!(s.namespaces, ["a", "b", "c", "d"]);
    }

    #[test]
    fn cluster_flags_only_where_a_cluster_is_read() {
        for cmd in ["validate", "schema", "version"] {
            for flag in ["--context", "--kubeconfig", "--namespace", "--policies"] {
                let err = parse(&[cmd, flag, "x"]).unwrap_err();
                assert_eq!(
                    err.kind(),
                    clap::error::ErrorKind::UnknownArgument,
                    "{cmd} {flag}"
                );
            }
        }
        for cmd in [&["plan"][..], &["run"], &["explain", "deploy/web"]] {
            let args = [cmd, &["--context", "c", "--kubeconfig", "k", "-o", "yaml"]].concat();
            parse(&args).unwrap();
        }
        // Logging is everywhere.
        parse(&["validate", "-vv"]).unwrap();
        parse(&["schema", "--log-format", "json"]).unwrap();
    }

    #[test]
    fn log_filters() {
        let flags = |args: &[&str]| parse(&[&["schema"], args].concat()).unwrap().log;
        let quiet = "kube=warn,tower=warn,hyper=warn";
        assert_eq!(flags(&[]).filter(None), format!("info,{quiet}"));
        assert_eq!(flags(&[]).filter(Some("debug".into())), "debug");
        assert_eq!(
            flags(&["-v"]).filter(Some("warn".into())),
            format!("info,bouncer=debug,{quiet}")
        );
        assert_eq!(
            flags(&["-vv"]).filter(None),
            format!("info,bouncer=trace,{quiet}")
        );
        assert_eq!(flags(&["--log-level", "error"]).filter(None), "error");
        assert!(parse(&["schema", "-v", "--log-level", "info"]).is_err());
    }

    #[test]
    fn explain_takes_kubectl_forms() {
        for args in [
            &["explain", "deploy/web", "-n", "shop"][..],
            &["explain", "deploy", "web", "-n", "shop"],
            &["explain", "deploy/shop/web"],
        ] {
            let Command::Explain { target, .. } = parse(args).unwrap().command else {
                panic!("explain");
            };
            assert!(!target.is_empty());
        }
        assert!(parse(&["explain"]).is_err());
        assert!(parse(&["explain", "a", "b", "c"]).is_err());
    }
}
