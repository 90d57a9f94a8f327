//! bouncer: bounces leaky Kubernetes workloads one at a time, as `kubectl rollout restart` does,
//! and proves each bounce. Three layers: the pure [`core`] decides, the [`cluster`] edge talks to
//! the API server, and the shell (this module, [`cli`], [`execute`], [`report`], [`notify`])
//! wires the data flow: policies -> snapshot -> plan -> execute -> report -> notify.

pub mod cli;
pub mod cluster;
pub mod core;
pub mod execute;
pub mod notify;
pub mod report;

use std::path::Path;
use std::process::ExitCode;

use chrono::{DateTime, Utc};
use kube::Client;
use tokio::sync::watch;

use crate::cli::{Cli, Command, Env, LogFormat, Settings};
use crate::cluster::error::ClusterError;
use crate::cluster::lock::{self, Stop};
use crate::cluster::snapshot;
use crate::core::{explain as explainer, mark, model, plan, policy};
use crate::report::{Format, Mode};

/// Exit codes: 0 ok (also "nothing due" and "lock held"), 1 a bounce failed or the run halted,
/// 2 invalid input or settings, 3 cluster unreachable or forbidden.
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

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BOUNCER_LOG").unwrap_or_else(|_| {
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

/// Runs one command. `host` names this run in the lock (the pod name in a cluster).
pub async fn main(cli: Cli, env: Env, host: String) -> ExitStatus {
    let dry_run_flag = matches!(cli.command, Command::Run { dry_run: true });
    let settings = match Settings::merge(cli.flags, env, dry_run_flag) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bouncer: {e}");
            return ExitStatus::Invalid;
        }
    };
    init_logging(settings.log_format);
    match cli.command {
        Command::Schema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&policy::json_schema()).expect("schema serializes")
            );
            ExitStatus::Ok
        }
        Command::Validate { paths } => {
            let paths = if paths.is_empty() {
                settings.policies.clone()
            } else {
                paths
            };
            match policy::load_paths(&paths) {
                Ok(policies) => {
                    let names: Vec<&str> = policies.iter().map(|p| p.name.as_str()).collect();
                    println!("{} valid policies: {}", policies.len(), names.join(", "));
                    ExitStatus::Ok
                }
                Err(e) => {
                    eprintln!("bouncer: invalid policies:\n{e}");
                    ExitStatus::Invalid
                }
            }
        }
        Command::Plan => plan_and_run(&settings, Mode::Plan, &host).await,
        Command::Explain { target } => explain(&settings, &target).await,
        Command::Run { .. } => {
            let mode = if settings.dry_run {
                Mode::DryRun
            } else {
                Mode::Run
            };
            plan_and_run(&settings, mode, &host).await
        }
    }
}

/// `bouncer explain`: the plan's snapshot and planner, no Lease, no writes.
async fn explain(settings: &Settings, target: &str) -> ExitStatus {
    let target = match explainer::parse_target(target) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("bouncer: explain: {e}");
            return ExitStatus::Invalid;
        }
    };
    let policies = match policy::load_paths(&settings.policies) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bouncer: invalid policies:\n{e}");
            return ExitStatus::Invalid;
        }
    };
    let clients = match cluster::connect(settings.context.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bouncer: {e}");
            return ExitStatus::Cluster;
        }
    };
    let lease_ns = settings.lease_namespace.clone();
    let clients_pair = (&clients.api, &clients.metrics);
    let Observed {
        inventory,
        prometheus,
        now,
        ..
    } = match observe(settings, clients_pair, &policies, &lease_ns).await {
        Ok(seen) => seen,
        Err(status) => return status,
    };
    let limits = plan::Limits {
        max_bounces: settings.max_bounces,
    };
    let plan = plan::plan_with(&policies, &inventory, &prometheus, now, &limits);
    let Some(explanation) = explainer::explain(&target, &policies, &inventory, &prometheus, &plan)
    else {
        eprintln!(
            "bouncer: explain: {target} not found (no such workload in the namespaces bouncer reads, or no pod of it is running)"
        );
        return ExitStatus::Failed;
    };
    match settings.output {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&explanation).expect("explanation serializes")
        ),
        Format::Table | Format::Markdown => print!("{}", explainer::text(&explanation)),
    }
    ExitStatus::Ok
}

async fn plan_and_run(settings: &Settings, mode: Mode, host: &str) -> ExitStatus {
    // Policies first: invalid input must fail before anything touches the cluster.
    let policies = match policy::load_paths(&settings.policies) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bouncer: invalid policies:\n{e}");
            return ExitStatus::Invalid;
        }
    };
    let cluster_failed = |e: ClusterError| {
        eprintln!("bouncer: {e}");
        ExitStatus::Cluster
    };
    let clients = match cluster::connect(settings.context.as_deref()).await {
        Ok(c) => c,
        Err(e) => return cluster_failed(e),
    };
    let (client, metrics) = (clients.api, clients.metrics);
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
                return ExitStatus::Ok;
            }
            Err(e) => return cluster_failed(e),
        }
    }

    let status = run_locked(
        settings,
        mode,
        &client,
        &metrics,
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
    bare_marks: Result<mark::BareMarks, String>,
    now: DateTime<Utc>,
}

async fn observe(
    settings: &Settings,
    (client, metrics): (&Client, &Client),
    policies: &[policy::Policy],
    lease_ns: &str,
) -> Result<Observed, ExitStatus> {
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
            client,
            metrics,
            &settings.namespaces,
            &policy::label_keys(policies),
        ),
        cluster::prometheus::read(settings.prometheus.as_ref(), &needs, now),
        bare_marks,
    )
    .await;
    match inventory {
        Ok(i) => Ok(Observed {
            inventory: i.with_bare_marks(&bare_marks),
            prometheus,
            bare_marks,
            now,
        }),
        Err(e) => {
            eprintln!("bouncer: {e}");
            Err(ExitStatus::Cluster)
        }
    }
}

async fn run_locked(
    settings: &Settings,
    mode: Mode,
    client: &Client,
    metrics: &Client,
    policies: &[policy::Policy],
    (lease, lease_ns): (Option<&lock::LeaseGuard>, &str),
    stop: watch::Receiver<Stop>,
) -> ExitStatus {
    let started = std::time::Instant::now();
    let Observed {
        inventory,
        prometheus,
        bare_marks,
        now,
    } = match observe(settings, (client, metrics), policies, lease_ns).await {
        Ok(seen) => seen,
        Err(status) => return status,
    };
    let plan = plan::plan_with(
        policies,
        &inventory,
        &prometheus,
        now,
        &plan::Limits {
            max_bounces: settings.max_bounces,
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
        };
        let budget = (settings.rollout_timeout, settings.verify_settle);
        let outcomes = execute::execute(&plan, policies, &mut edge, budget, &stop).await;
        // An open breaker that held a due workload back is told on the workload, once per run
        // (a dry run and a plan write nothing).
        let skips = plan.skips.iter();
        let skips = skips.map(|s| (&s.target, s.policy.as_str(), &s.reason));
        for (target, note) in core::breaker::events(skips) {
            cluster::events::emit(
                client,
                &target,
                core::literals::REASON_BREAKER_OPEN,
                &note,
                cluster::events::Severity::Warning,
                clock(),
            )
            .await;
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
    if halted {
        ExitStatus::Failed
    } else {
        ExitStatus::Ok
    }
}

fn format_for(path: &Path) -> Format {
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => Format::Json,
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
