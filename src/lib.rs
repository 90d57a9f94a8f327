//! bouncer: bounces leaky Kubernetes workloads one at a time, as `kubectl rollout restart` does,
//! and proves each bounce. Three layers: the pure [`core`] decides, the [`cluster`] edge talks to
//! the API server, and the shell (this module, [`cli`], [`execute`], [`report`], [`notify`])
//! wires the data flow: policies -> snapshot -> plan -> execute -> report -> notify.

pub mod cli;
pub mod cluster;
pub mod core;
pub mod error;
pub mod execute;
pub mod http_text;
pub mod notify;
pub mod progress;
pub mod report;

use std::path::Path;
use std::process::ExitCode;

use chrono::{DateTime, Utc};
use kube::Client;
use tokio::sync::watch;

pub use crate::error::{Error, exit_with};

use crate::cli::{Cli, Command, Env, LogFormat, Settings};
use crate::cluster::error::ClusterError;
use crate::cluster::lock::{self, Stop};
use crate::cluster::snapshot;
use crate::core::{explain as explainer, gitops, mark, model, plan, policy};
use crate::report::{Format, Mode};

/// Exit codes: 0 ok (also "nothing due" and "lock held"), 1 a bounce failed or the run halted,
/// 2 invalid input or settings, 3 cluster unreachable or forbidden. A command returns `Ok` or
/// `Failed` from its report; an [`Error`] chooses its own in [`Error::exit_status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Ok = 0,
    Failed = 1,
    Invalid = 2,
    Cluster = 3,
}

impl From<ExitStatus> for ExitCode {
    fn from(s: ExitStatus) -> ExitCode {
        ExitCode::from(s as u8)
    }
}

fn clock() -> DateTime<Utc> {
    Utc::now()
}

fn init_logging(format: LogFormat, filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,kube=warn,tower=warn,hyper=warn")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.with_target(false).compact().try_init(),
    };
}

/// Runs one command. `host` names this run in the lock (the pod name in a cluster);
/// `log_filter` is BOUNCER_LOG as read in `main`.
pub async fn main(cli: Cli, env: Env, host: String, log_filter: Option<String>) -> ExitStatus {
    match command(cli, env, host, log_filter).await {
        Ok(status) => status,
        Err(error) => exit_with(&error),
    }
}

async fn command(
    cli: Cli,
    env: Env,
    host: String,
    log_filter: Option<String>,
) -> Result<ExitStatus, Error> {
    let filter = cli.log.filter(log_filter);
    let log_format = cli.log.log_format.or(env.log_format);
    let (flags, mode, target) = match cli.command {
        Command::Plan { flags } => (flags, Mode::Plan, None),
        Command::Run { dry_run, flags } => {
            let mode = if dry_run { Mode::DryRun } else { Mode::Run };
            (flags, mode, None)
        }
        Command::Explain { flags, target } => (flags, Mode::Plan, Some(target)),
        offline => {
            init_logging(log_format.unwrap_or(LogFormat::Text), &filter);
            return offline_command(offline, env);
        }
    };
    let dry_run_flag = mode == Mode::DryRun;
    let flags = cli::Flags {
        log_format: cli.log.log_format,
        ..flags
    };
    let settings = Settings::merge(flags, env, dry_run_flag)?;
    init_logging(settings.log_format, &filter);
    match (target, mode) {
        (Some(target), _) => explain(&settings, &target).await,
        // BOUNCER_DRY_RUN=true makes a run a dry run too.
        (None, Mode::Run) if settings.dry_run => plan_and_run(&settings, Mode::DryRun, &host).await,
        (None, mode) => plan_and_run(&settings, mode, &host).await,
    }
}

/// The commands that never talk to a cluster.
fn offline_command(command: Command, env: Env) -> Result<ExitStatus, Error> {
    match command {
        Command::Schema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&policy::json_schema()).expect("schema serializes")
            );
            Ok(ExitStatus::Ok)
        }
        Command::Completion { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "bouncer", &mut std::io::stdout());
            Ok(ExitStatus::Ok)
        }
        Command::Version { output } => {
            let v = cli::version::VERSION;
            match output {
                cli::VersionFormat::Text => print!("{v}"),
                cli::VersionFormat::Json => {
                    println!("{}", serde_json::to_string_pretty(&v).expect("JSON"))
                }
            }
            Ok(ExitStatus::Ok)
        }
        Command::Validate { paths, output } => {
            let paths = if paths.is_empty() {
                env.policies
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| vec![std::path::PathBuf::from("policies")])
            } else {
                paths
            };
            let result = policy::load_paths(&paths)
                .map(|ps| ps.into_iter().map(|p| p.name).collect::<Vec<_>>());
            // Errors as text go to stderr, as every other error; JSON and annotations are the
            // output a CI step reads, on stdout.
            match result {
                Err(errors) if output == cli::ValidateFormat::Text => Err(Error::Policies(errors)),
                result => {
                    let read = |f: &str| std::fs::read_to_string(f).ok();
                    print!("{}", cli::validate::render(&result, output, read));
                    result
                        .map(|_| ExitStatus::Ok)
                        .map_err(Error::PoliciesListed)
                }
            }
        }
        Command::Plan { .. } | Command::Run { .. } | Command::Explain { .. } => {
            unreachable!("cluster commands are run by main")
        }
    }
}

/// `bouncer explain`: the plan's snapshot and planner, no Lease, no writes.
async fn explain(settings: &Settings, words: &[String]) -> Result<ExitStatus, Error> {
    // A malformed target is refused before any cluster call; its namespace may need the
    // kubeconfig's, so it is resolved again once connected.
    cli::target::resolve(words, &settings.namespaces, "default")?;
    let policies = policy::load_paths(&settings.policies)?;
    let clients =
        cluster::connect(settings.kubeconfig.as_deref(), settings.context.as_deref()).await?;
    let current = clients.api.default_namespace().to_string();
    let target = cli::target::resolve(words, &settings.namespaces, &current)?;
    let lease_ns = settings.lease_namespace.clone();
    let clients_triple = (&clients.api, &clients.lists, &clients.metrics);
    let Observed {
        inventory,
        prometheus,
        now,
        ..
    } = observe(settings, clients_triple, &policies, &lease_ns).await?;
    let limits = plan::Limits {
        max_bounces: settings.max_bounces,
        rollout_timeout: settings.rollout_timeout,
    };
    let plan = plan::plan_with(&policies, &inventory, &prometheus, now, &limits);
    let Some(mut explanation) =
        explainer::explain(&target, &policies, &inventory, &prometheus, &plan)
    else {
        return Err(Error::NotFound { target });
    };
    // Only context: a workload that cannot be read again is explained without it.
    match cluster::gitops::facts(&clients.api, &target).await {
        Ok(facts) => explanation.gitops = gitops::assess(&facts),
        Err(e) => eprintln!("bouncer: explain: GitOps check of {target} skipped: {e}"),
    }
    match settings.output {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&explanation).expect("explanation serializes")
        ),
        Format::Yaml => print!(
            "{}",
            serde_yaml_ng::to_string(&explanation).expect("explanation serializes")
        ),
        Format::Table | Format::Markdown => print!("{}", explainer::text(&explanation)),
    }
    Ok(ExitStatus::Ok)
}

async fn plan_and_run(settings: &Settings, mode: Mode, host: &str) -> Result<ExitStatus, Error> {
    // Policies first: invalid input must fail before anything touches the cluster.
    let policies = policy::load_paths(&settings.policies)?;
    let clients =
        cluster::connect(settings.kubeconfig.as_deref(), settings.context.as_deref()).await?;
    let cluster::Clients {
        api: client,
        lists,
        metrics,
    } = clients;
    let (stop_tx, stop_rx) = watch::channel(None);
    let signals = tokio::spawn(stop_on_signal(stop_tx.clone()));

    let mut lease = None;
    let lease_ns = settings.lease_namespace.clone();
    if mode == Mode::Run {
        let ns = lease_ns.clone();
        let identity = format!("{host}-{}", std::process::id());
        match lock::acquire(
            &client,
            &ns,
            &settings.lease_name,
            &identity,
            clock,
            stop_tx.clone(),
        )
        .await
        {
            Ok(lock::Acquired::Held(guard)) => lease = Some(guard),
            Ok(lock::Acquired::Busy { holder }) => {
                eprintln!(
                    "bouncer: another run holds the lock {ns}/{} ({holder}); nothing to do",
                    settings.lease_name
                );
                signals.abort();
                return Ok(ExitStatus::Ok);
            }
            Err(e) => return Err(e.into()),
        }
    }

    let status = run_locked(
        settings,
        mode,
        &client,
        (lists, metrics),
        &policies,
        (lease.as_deref(), &lease_ns),
        stop_rx,
    )
    .await;
    if let Some(guard) = lease {
        guard.release().await;
    }
    signals.abort();
    status
}

/// What a run decides from: the cluster snapshot with bare pods' attempt marks and, where a
/// policy needs it, Prometheus, read together at `now`.
struct Observed {
    inventory: model::Inventory,
    prometheus: core::history::Prometheus,
    bare_marks: Result<mark::BareMarks, lock::LeaseError>,
    now: DateTime<Utc>,
}

async fn observe(
    settings: &Settings,
    (client, lists, metrics): (&Client, &Client, &Client),
    policies: &[policy::Policy],
    lease_ns: &str,
) -> Result<Observed, ClusterError> {
    let needs = core::history::needs(policies, &settings.namespaces);
    // Bare pods' attempt marks live on the run Lease (in a run, read after taking it, so they
    // are current); read only when a policy may bounce bare pods (a plan is otherwise LISTs
    // only), alongside the snapshot rather than a round trip before it.
    let bare_marks = async {
        if policies.iter().any(|p| p.kinds.contains(&model::Kind::Pod)) {
            lock::read_bare_marks(client, lease_ns, &settings.lease_name).await
        } else {
            Ok(mark::BareMarks::new())
        }
    };
    // Prometheus is read alongside the snapshot, at the same instant the plan is made for.
    let now = clock();
    let (inventory, prometheus, bare_marks) = futures::future::join3(
        snapshot::snapshot(
            lists,
            metrics,
            &settings.namespaces,
            &policy::label_keys(policies),
        ),
        cluster::prometheus::read(settings.prometheus.as_ref(), &needs, now),
        bare_marks,
    )
    .await;
    Ok(Observed {
        inventory: inventory?.with_bare_marks(&bare_marks),
        prometheus,
        bare_marks,
        now,
    })
}

async fn run_locked(
    settings: &Settings,
    mode: Mode,
    client: &Client,
    (lists, metrics): (Client, Client),
    policies: &[policy::Policy],
    (lease, lease_ns): (Option<&lock::LeaseGuard>, &str),
    stop: watch::Receiver<Stop>,
) -> Result<ExitStatus, Error> {
    let started = std::time::Instant::now();
    let Observed {
        inventory,
        prometheus,
        bare_marks,
        now,
    } = observe(settings, (client, &lists, &metrics), policies, lease_ns).await?;
    // Their connections (and the read buffers the LISTs grew) close: nothing reads through
    // them again. Closing is the clients' and connections' own tasks' work, which run while
    // this one yields: a few turns let them finish before the plan is made.
    drop((lists, metrics));
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    let plan = plan::plan_with(
        policies,
        &inventory,
        &prometheus,
        now,
        &plan::Limits {
            max_bounces: settings.max_bounces,
            rollout_timeout: settings.rollout_timeout,
        },
    );
    // The pods and workloads are not needed past the plan: the executor reads afresh.
    drop(inventory);
    let outcomes = if mode == Mode::Run {
        let mut edge = execute::Kube {
            client: client.clone(),
            lease,
            bare_marks: bare_marks.unwrap_or_default(),
            prometheus: settings.prometheus.as_ref(),
            clock,
            halt_at: std::env::var("BOUNCER_TEST_HALT_AT").ok(),
            pause_before: std::env::var("BOUNCER_TEST_PAUSE_BEFORE")
                .ok()
                .and_then(|v| execute::pause_before(&v)),
        };
        let budget = (settings.rollout_timeout, settings.verify_settle);
        let outcomes = execute::execute(&plan, policies, &mut edge, budget, &stop).await;
        // A due workload held back by its open breaker or its blockWhen is told on the workload,
        // at most once an hour while it lasts (a dry run and a plan write nothing).
        if let Some(guard) = lease {
            let skips = || {
                let skips = plan.skips.iter();
                skips.map(|s| (&s.target, s.policy.as_str(), &s.reason))
            };
            let now = clock();
            let notices = guard
                .tell(|told| core::notice::notices(skips(), told, now))
                .await;
            for n in &notices {
                let warning = cluster::events::Severity::Warning;
                cluster::events::emit(client, &n.target, n.reason, &n.note, warning, clock()).await;
            }
        }
        Some(outcomes)
    } else {
        None
    };
    let report = report::build(plan, mode, outcomes.as_deref());
    let halted = outcomes.iter().flatten().any(|o| o.status.halts());
    let run = notify::Run {
        finished: clock(),
        duration: started.elapsed(),
        succeeded: !halted,
    };
    let sent = notify::deliver(&settings.notify, &report, run).await;
    let one_line = settings.log_format == LogFormat::Json;
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    let printed = notify::write(&mut stdout, &report, &sent, settings.output, one_line)
        .and_then(|()| std::io::Write::flush(&mut stdout));
    drop(stdout);
    if let Err(e) = printed {
        eprintln!("bouncer: failed to write the report to standard output: {e}");
    }
    if let Some(path) = &settings.report
        && let Err(e) = std::fs::File::create(path).and_then(|f| {
            let mut file = std::io::BufWriter::new(f);
            notify::write(&mut file, &report, &sent, format_for(path), false)?;
            std::io::Write::flush(&mut file)
        })
    {
        eprintln!(
            "bouncer: failed to write the report to {}: {e}",
            path.display()
        );
    }
    Ok(if halted {
        ExitStatus::Failed
    } else {
        ExitStatus::Ok
    })
}

fn format_for(path: &Path) -> Format {
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => Format::Json,
        Some("yaml" | "yml") => Format::Yaml,
        Some("md" | "markdown") => Format::Markdown,
        _ => Format::Table,
    }
}

/// SIGTERM (a Job being stopped) or Ctrl-C: finish nothing new, report, exit.
async fn stop_on_signal(stop: watch::Sender<Stop>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return;
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    };
    tracing::warn!("{name}: finishing the report without starting or waiting on more bounces");
    let _ = stop.send(Some(format!("the run received {name}")));
}
