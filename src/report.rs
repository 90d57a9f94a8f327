//! Reports of a plan or a run: a terminal table, stable JSON (`bouncer.dev/v1alpha1`
//! BounceReport), and Markdown for PR comments and job summaries.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::core::literals::rfc3339;
use crate::core::memory::MemoryReading;
use crate::core::model::{Method, WorkloadRef};
use crate::core::outcome::{Outcome, Status};
use crate::core::plan::Plan;
use crate::core::quantity::format_bytes;
use crate::core::reasons::{SkipReason, Trigger};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    Plan,
    DryRun,
    Run,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Table,
    Json,
    Yaml,
    Markdown,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub mode: Mode,
    pub generated_at: String,
    pub summary: Summary,
    pub metrics_unavailable: Option<String>,
    /// Policies with `spec.suspend: true`, by name (each workload they select is a skip
    /// `suspended`).
    pub suspended_policies: Vec<String>,
    pub rows: Vec<Row>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub planned: usize,
    pub bounced: usize,
    pub failed: usize,
    pub skipped: usize,
    pub not_attempted: usize,
    /// Bounces someone else's restart overtook while bouncer waited (neither bounced nor failed).
    pub superseded: usize,
    /// Would-be bounces of dry-run policies (`spec.dryRun`): planned, never carried out.
    pub dry_run: usize,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// Position in the bounce queue; None for skips.
    pub order: Option<usize>,
    pub policy: String,
    pub workload: WorkloadRef,
    /// The restart group (`label=value`) the workload is bounced with; null outside groups.
    pub group: Option<String>,
    pub pods: usize,
    pub memory: Option<MemoryReading>,
    pub triggers: Vec<TriggerRow>,
    /// bounce (planned), skip, dryRun (a dry-run policy's would-be bounce, never carried out),
    /// or a run outcome: bounced, revertedEvicted, reverted, skipped, failed, interrupted,
    /// notAttempted.
    pub decision: String,
    /// The row's policy is a dry-run policy (`spec.dryRun: true`): nothing is done for it.
    pub dry_run: bool,
    pub reason_code: Option<String>,
    pub reason: String,
    pub method: Option<Method>,
    pub patched_at: Option<String>,
    pub completed_at: Option<String>,
    pub duration_seconds: Option<f64>,
    pub verification: Option<String>,
    /// When the run's final re-check, right before this report, last saw the bounce's
    /// restartedAt intact (rollouts that were verified); null otherwise.
    pub last_confirmed: Option<String>,
    /// The field manager whose hold on the pod template's restartedAt kept bouncer from
    /// restarting through it (reasons restartPinned and revertedSince, or a bounce that evicted
    /// instead); null otherwise.
    pub restart_owner: Option<String>,
}

impl Row {
    /// A row with its identity and decision; what the outcome adds starts empty.
    pub fn new(
        order: Option<usize>,
        policy: &str,
        workload: &WorkloadRef,
        pods: usize,
        memory: Option<MemoryReading>,
        decision: &str,
    ) -> Row {
        Row {
            order,
            policy: policy.to_string(),
            workload: workload.clone(),
            group: None,
            pods,
            memory,
            triggers: Vec::new(),
            decision: decision.to_string(),
            dry_run: false,
            reason_code: None,
            reason: String::new(),
            method: None,
            patched_at: None,
            completed_at: None,
            duration_seconds: None,
            verification: None,
            last_confirmed: None,
            restart_owner: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TriggerRow {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub detail: String,
}

fn triggers(t: &[Trigger]) -> Vec<TriggerRow> {
    t.iter()
        .map(|t| TriggerRow {
            kind: t.code(),
            detail: t.to_string(),
        })
        .collect()
}

fn secs(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<f64> {
    Some((b? - a?).num_milliseconds() as f64 / 1000.0)
}

/// The decision of a dry-run policy's would-be bounce.
pub const DRY_RUN: &str = "dryRun";

/// Builds the report. `outcomes` is None for `plan` and `run --dry-run`. The plan is consumed:
/// its skips (most rows, in a large cluster) move into their rows rather than being copied.
pub fn build(plan: Plan, mode: Mode, outcomes: Option<&[Outcome]>) -> Report {
    let mut summary = Summary {
        planned: plan.bounces.len(),
        skipped: plan.skips.len(),
        dry_run: plan.dry_run.len(),
        ..Default::default()
    };
    // Sized once: a row is a few hundred bytes, and a vector grown by doubling holds up to
    // twice the rows' memory, three times while it moves.
    let mut rows = Vec::with_capacity(plan.bounces.len() + plan.dry_run.len() + plan.skips.len());
    for (i, b) in plan.bounces.iter().enumerate() {
        let outcome = outcomes.and_then(|o| o.get(i));
        let mut row = Row {
            triggers: triggers(&b.triggers),
            reason: b
                .triggers
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join("; "),
            method: Some(b.method),
            group: b.group.as_ref().map(ToString::to_string),
            ..Row::new(
                Some(i + 1),
                &b.policy,
                &b.target,
                b.pods,
                b.memory.clone(),
                "bounce",
            )
        };
        if let Some(o) = outcome {
            row.decision = o.status.code().into();
            row.method = Some(o.method);
            row.patched_at = o.patched_at.map(rfc3339);
            row.completed_at = o.completed_at.map(rfc3339);
            row.duration_seconds = secs(o.started, o.finished);
            row.verification = o.verification.clone();
            row.last_confirmed = o.last_confirmed.map(rfc3339);
            match &o.status {
                Status::Bounced => summary.bounced += 1,
                Status::RevertedEvicted { .. } => summary.bounced += 1,
                Status::Skipped(reason) => {
                    summary.skipped += 1;
                    row.reason_code = Some(reason.code().into());
                    row.reason = reason.to_string();
                }
                Status::Reverted { .. } | Status::Failed(_) | Status::Interrupted(_) => {
                    summary.failed += 1
                }
                Status::Superseded { .. } => {
                    summary.superseded += 1;
                    row.reason_code = Some(o.status.code().into());
                }
                Status::NotAttempted(held_by) => {
                    summary.not_attempted += 1;
                    row.reason = match held_by {
                        None => "not attempted: an earlier bounce halted the queue".into(),
                        Some(member) => {
                            format!("not attempted: {member} of its group was not bounced")
                        }
                    };
                }
            }
            if let Status::Failed(why) = &o.status {
                row.reason_code = Some(why.code().into());
                row.reason = why.detail.clone();
            }
            if let Status::Reverted { .. }
            | Status::RevertedEvicted { .. }
            | Status::Superseded { .. } = &o.status
            {
                row.reason = o.verification.clone().unwrap_or_default();
            }
            if let Status::Interrupted(why) = &o.status {
                row.reason = format!("interrupted: {why}");
            }
        }
        let instead = match outcome {
            Some(o) if o.status.bounced() => o.instead.as_ref(),
            Some(_) => None,
            None => b.instead.as_ref(),
        };
        evicted_instead(&mut row, instead);
        rows.push(row);
    }
    for b in &plan.dry_run {
        let would = b.triggers.iter().map(|t| t.to_string());
        let mut row = Row {
            triggers: triggers(&b.triggers),
            reason: format!(
                "dry run (policy spec.dryRun), would bounce: {}",
                would.collect::<Vec<_>>().join("; ")
            ),
            method: Some(b.method),
            group: b.group.as_ref().map(ToString::to_string),
            ..Row::new(
                None,
                &b.policy,
                &b.target,
                b.pods,
                b.memory.clone(),
                DRY_RUN,
            )
        };
        evicted_instead(&mut row, b.instead.as_ref());
        rows.push(row);
    }
    for s in plan.skips {
        rows.push(Row {
            order: None,
            reason_code: Some(s.reason.code().into()),
            reason: s.reason.to_string(),
            group: s.group.as_ref().map(ToString::to_string),
            policy: s.policy,
            workload: s.target,
            pods: s.pods,
            memory: s.memory,
            triggers: Vec::new(),
            decision: "skip".into(),
            dry_run: false,
            method: None,
            patched_at: None,
            completed_at: None,
            duration_seconds: None,
            verification: None,
            last_confirmed: None,
            restart_owner: s.reason.restart_owner().map(str::to_string),
        });
    }
    for row in &mut rows {
        row.dry_run = plan.dry_run_policies.contains(&row.policy);
    }
    Report {
        api_version: crate::core::policy::API_VERSION,
        kind: "BounceReport",
        mode,
        generated_at: rfc3339(plan.now),
        summary,
        metrics_unavailable: plan.metrics_unavailable.clone(),
        suspended_policies: plan.suspended_policies.iter().cloned().collect(),
        rows,
    }
}

/// A bounce that evicts where it would have restarted through the template says why, and whose
/// hold on restartedAt it is.
fn evicted_instead(row: &mut Row, instead: Option<&SkipReason>) {
    if let Some(reason) = instead {
        row.reason = format!(
            "{}; pods evicted instead of a restart: {}",
            row.reason,
            reason.evicted_because()
        );
        row.restart_owner = reason.restart_owner().map(str::to_string);
    }
}

fn memory_cell(m: &Option<MemoryReading>) -> String {
    match m {
        None => "-".into(),
        Some(m) => match m.threshold {
            Some(t) => format!("{} / {}", format_bytes(m.usage), format_bytes(t)),
            None => format_bytes(m.usage),
        },
    }
}

fn decision_cell(r: &Row, mode: Mode) -> String {
    match (r.decision.as_str(), mode) {
        ("bounce", Mode::Run) => "bounce".into(),
        ("bounce", _) => format!("would bounce #{}", r.order.unwrap_or(0)),
        (DRY_RUN, _) => "dry run: would bounce".into(),
        (d, _) => match r.duration_seconds {
            Some(s) if r.order.is_some() && d != "skipped" => format!("{d} ({s:.1}s)"),
            _ => d.to_string(),
        },
    }
}

/// The table's cells of a row; with `grouped`, a GROUP column after the workload.
fn cells(r: &Row, mode: Mode, grouped: bool) -> Vec<String> {
    let trigger = if r.triggers.is_empty() {
        "-".to_string()
    } else {
        r.triggers
            .iter()
            .map(|t| t.kind)
            .collect::<Vec<_>>()
            .join("+")
    };
    let mut reason = r.reason.clone();
    if let Some(v) = r
        .verification
        .as_ref()
        .filter(|v| !reason.contains(v.as_str()))
    {
        reason = format!("{reason}; {v}");
    }
    let mut cells = vec![
        r.policy.clone(),
        format!(
            "{}/{}/{}",
            r.workload.kind.as_str().to_lowercase(),
            r.workload.namespace,
            r.workload.name
        ),
        r.pods.to_string(),
        memory_cell(&r.memory),
        trigger,
        decision_cell(r, mode),
        reason,
    ];
    if grouped {
        cells.insert(2, r.group.clone().unwrap_or_else(|| "-".into()));
    }
    cells
}

fn headers(grouped: bool) -> Vec<&'static str> {
    let mut headers = HEADERS.to_vec();
    if grouped {
        headers.insert(2, "GROUP");
    }
    headers
}

fn grouped(r: &Report) -> bool {
    r.rows.iter().any(|row| row.group.is_some())
}

const HEADERS: [&str; 7] = [
    "POLICY",
    "WORKLOAD",
    "PODS",
    "MEMORY (MAX POD / THRESHOLD)",
    "TRIGGER",
    "DECISION",
    "REASON",
];

/// The report's one-line summary, e.g. `2 bounced, 0 failed, 0 not attempted, 4 skipped`.
pub fn summary_line(r: &Report) -> String {
    let s = &r.summary;
    let mut line = match r.mode {
        Mode::Plan | Mode::DryRun => format!("{} to bounce, {} skipped", s.planned, s.skipped),
        Mode::Run => format!(
            "{} bounced, {} failed, {} not attempted, {} skipped",
            s.bounced, s.failed, s.not_attempted, s.skipped
        ),
    };
    if s.superseded > 0 {
        line.push_str(&format!(", {} superseded", s.superseded));
    }
    if s.dry_run > 0 {
        line.push_str(&format!(", {} in dry-run policies", s.dry_run));
    }
    if r.mode == Mode::DryRun {
        line.push_str(" (dry run: nothing was changed)");
    }
    if let Some(why) = &r.metrics_unavailable {
        line.push_str(&format!("; memory triggers off: {why}"));
    }
    if !r.suspended_policies.is_empty() {
        let names = r.suspended_policies.join(", ");
        line.push_str(&format!("; suspended policies: {names}"));
    }
    line
}

pub fn table(r: &Report) -> String {
    let grouped = grouped(r);
    let headers = headers(grouped);
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| cells(row, r.mode, grouped))
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cols: &[&str]| {
        let mut l = String::new();
        for (i, c) in cols.iter().enumerate() {
            // The last column (the reason) is free text: no padding.
            if i + 1 < cols.len() {
                l.push_str(&format!("{c:<width$}  ", width = widths[i]));
            } else {
                l.push_str(c);
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut out = line(&headers);
    for row in &rows {
        out.push_str(&line(&row.iter().map(String::as_str).collect::<Vec<_>>()));
    }
    out.push_str(&format!("\n{}\n", summary_line(r)));
    out
}

pub fn markdown(r: &Report) -> String {
    let title = match r.mode {
        Mode::Plan => "bouncer plan",
        Mode::DryRun => "bouncer run --dry-run",
        Mode::Run => "bouncer run",
    };
    let escape = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = format!(
        "### {title} ({})\n\n{}\n\n",
        r.generated_at,
        summary_line(r)
    );
    let grouped = grouped(r);
    let headers: Vec<String> = headers(grouped)
        .iter()
        .map(|h| match *h {
            "MEMORY (MAX POD / THRESHOLD)" => "Memory (max pod / threshold)".to_string(),
            h => h[..1].to_string() + &h[1..].to_lowercase(),
        })
        .collect();
    out.push_str(&format!("| # | {} |\n", headers.join(" | ")));
    out.push_str(&format!("|---|{}\n", "---|".repeat(headers.len())));
    for row in &r.rows {
        let mut c: Vec<String> = cells(row, r.mode, grouped)
            .iter()
            .map(|c| escape(c))
            .collect();
        let (workload, decision) = (1, c.len() - 2);
        c[workload] = format!("`{}`", c[workload]);
        c[decision] = format!("**{}**", c[decision]);
        out.push_str(&format!(
            "| {} | {} |\n",
            row.order.map(|o| o.to_string()).unwrap_or_default(),
            c.join(" | ")
        ));
    }
    out
}

/// `one_line` prints JSON on a single line, so that in a cluster, where the report and the JSON
/// log lines share one stream, every line of `kubectl logs` is one JSON object.
pub fn render(r: &Report, format: Format, one_line: bool) -> String {
    let mut out = Vec::new();
    write(&mut out, r, format, one_line).expect("writing to memory");
    String::from_utf8(out).expect("the report is UTF-8")
}

/// [`render`] straight into `w`: JSON is serialized as it is written, never held whole (at
/// tens of thousands of rows, megabytes).
pub fn write(
    w: &mut impl std::io::Write,
    r: &Report,
    format: Format,
    one_line: bool,
) -> std::io::Result<()> {
    match format {
        Format::Table => w.write_all(table(r).as_bytes()),
        Format::Markdown => w.write_all(markdown(r).as_bytes()),
        Format::Json => json_line(w, r, one_line),
        Format::Yaml => yaml(w, r),
    }
}

/// One YAML document (the JSON report's fields).
pub fn yaml(w: &mut impl std::io::Write, value: &impl Serialize) -> std::io::Result<()> {
    serde_yaml_ng::to_writer(w, value).map_err(std::io::Error::other)
}

/// One JSON document and a newline.
pub fn json_line(
    w: &mut impl std::io::Write,
    value: &impl Serialize,
    one_line: bool,
) -> std::io::Result<()> {
    if one_line {
        serde_json::to_writer(&mut *w, value)?;
    } else {
        serde_json::to_writer_pretty(&mut *w, value)?;
    }
    w.write_all(b"\n")
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
