//! `jobguard demo`: the seed's experiment, naive against guarded, with a verdict.
//!
//! The experiment itself is in [`experiment`] and its tables in [`ledger`]; the at-least-once
//! failures made to happen through the job queue in [`scenarios`], the charge jobs against a
//! payment provider in [`charge`], and the experiment through a real broker in [`broker`].
//! Their crashes (processes killed before an ack or a commit) happen in the processes these
//! start, `jobguard demo-process` ([`crate::commands::demo_process`]).

pub mod broker;
pub mod charge;
pub mod experiment;
mod kafka;
pub mod ledger;
pub mod scenarios;

use std::time::Instant;

use comfy_table::{Cell, CellAlignment, Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use sqlx::Pool;

use crate::builtin_jobs::Credit;
use experiment::{RunReport, Shape};
use ledger::LedgerDb;
use scenarios::Scenario;

/// The demo's result, as printed by `--json`.
#[derive(Debug, Serialize)]
pub struct DemoReport {
    pub backend: &'static str,
    pub database: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scenario: Option<Scenario>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scenario_description: Option<&'static str>,
    pub jobs: usize,
    pub deliveries: usize,
    pub concurrency: u32,
    pub expected_balance_total: i64,
    pub naive: RunReport,
    pub guarded: RunReport,
    /// The keyless run of the charge scenario.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyless: Option<RunReport>,
    /// Charges the payment provider made in the guarded (keyed) run of the charge scenario.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_charges: Option<i64>,
    /// True when the guarded run wrote exactly one effect per job and its balances add up.
    pub exactly_once: bool,
    pub seconds: f64,
}

/// Runs the experiment on `pool`.
pub async fn run<DB: LedgerDb>(
    pool: &Pool<DB>,
    database: String,
    shape: Shape,
    show_progress: bool,
) -> anyhow::Result<DemoReport> {
    let started = Instant::now();
    let guard = DB::reset(pool).await?;
    let credits = experiment::credits(&shape);
    let progress = progress_bar(&shape, show_progress);

    progress.set_message("naive");
    let mut naive = experiment::run_naive(pool, &credits, shape, &progress).await?;
    experiment::read_back(pool, &mut naive, false).await?;
    progress.set_message("guarded");
    let mut guarded = experiment::run_guarded(&guard, &credits, shape, &progress).await?;
    experiment::read_back(pool, &mut guarded, true).await?;
    progress.finish_and_clear();

    let runs = [naive, guarded];
    Ok(DemoReport::of_experiment::<DB>(
        database, shape, &credits, runs, started,
    ))
}

impl DemoReport {
    /// The report of the seed's experiment of `shape` over `credits`, from its naive and its
    /// guarded run: exactly once when the guarded run wrote one effect per job, applied each
    /// job once, failed none, and its balances add up.
    pub fn of_experiment<DB: LedgerDb>(
        database: String,
        shape: Shape,
        credits: &[Credit],
        [naive, guarded]: [RunReport; 2],
        started: Instant,
    ) -> DemoReport {
        let expected_balance_total = experiment::expected_total(credits);
        let exactly_once = guarded.effects == shape.jobs as i64
            && guarded.applied == shape.jobs
            && guarded.failed == 0
            && guarded.balance_total == expected_balance_total;
        DemoReport {
            backend: DB::BACKEND,
            database,
            scenario: None,
            scenario_description: None,
            jobs: shape.jobs,
            deliveries: shape.deliveries,
            concurrency: shape.concurrency,
            expected_balance_total,
            naive,
            guarded,
            keyless: None,
            provider_charges: None,
            exactly_once,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

/// A progress bar on the terminal for runs long enough to need one; hidden otherwise.
pub fn progress_bar(shape: &Shape, show: bool) -> ProgressBar {
    let total = shape.total_deliveries() as u64 * 2;
    if !show || total < 2_000 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>8} [{bar:40}] {pos}/{len} deliveries ({per_sec}, {eta})",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}

/// The human-readable report: a table, bars and the verdict.
pub fn render(report: &DemoReport) -> String {
    let mut out = String::new();
    match (report.scenario, report.scenario_description) {
        (Some(scenario), Some(description)) => {
            let name = serde_json::to_value(scenario).unwrap_or_default();
            out += &format!(
                "jobguard demo --scenario {}: {} credit jobs through the job queue\n{description}\n",
                name.as_str().unwrap_or_default(),
                report.jobs
            );
        }
        _ => {
            out += &format!(
                "jobguard demo: {} credit jobs, each delivered {} times at once over {} connections\n",
                report.jobs, report.deliveries, report.concurrency
            );
        }
    }
    out += &format!("database: {} ({})\n\n", report.database, report.backend);

    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "job",
        "deliveries",
        "effects (ledger rows)",
        "applied",
        "duplicates",
        "failed",
        "balance total",
        "seconds",
    ]);
    for (name, run) in [("naive", &report.naive), ("guarded", &report.guarded)] {
        table.add_row(vec![
            Cell::new(name),
            Cell::new(run.deliveries).set_alignment(CellAlignment::Right),
            Cell::new(run.effects).set_alignment(CellAlignment::Right),
            Cell::new(run.applied).set_alignment(CellAlignment::Right),
            Cell::new(run.duplicates).set_alignment(CellAlignment::Right),
            Cell::new(run.failed).set_alignment(CellAlignment::Right),
            Cell::new(balance(run.balance_total, report.expected_balance_total))
                .set_alignment(CellAlignment::Right),
            Cell::new(format!("{:.2}", run.seconds)).set_alignment(CellAlignment::Right),
        ]);
    }
    out += &format!("{table}\n\n");

    let widest = report
        .naive
        .effects
        .max(report.guarded.effects)
        .max(report.guarded.duplicates as i64)
        .max(1);
    let naive_note = match report.naive.effects / (report.jobs as i64).max(1) {
        n if n > 1 && report.naive.effects % report.jobs as i64 == 0 => format!("  balances x{n}"),
        _ => String::new(),
    };
    out += &bar_line("naive rows", report.naive.effects, widest, &naive_note);
    out += &bar_line("guarded rows", report.guarded.effects, widest, "");
    out += &bar_line(
        "duplicates",
        report.guarded.duplicates as i64,
        widest,
        "  skipped by the guard",
    );
    out += "\n";

    if report.exactly_once {
        out += &format!(
            "verdict: exactly once. {} jobs, {} effects, {} duplicate deliveries reported, balances correct\n",
            report.jobs, report.guarded.effects, report.guarded.duplicates
        );
    } else {
        out += &format!(
            "verdict: NOT exactly once. {} jobs but {} guarded effects ({} failed deliveries)\n",
            report.jobs, report.guarded.effects, report.guarded.failed
        );
    }
    for (name, run) in [("naive", &report.naive), ("guarded", &report.guarded)] {
        if let Some(error) = &run.first_error {
            out += &format!("first {name} error: {error}\n");
        }
    }
    out += &format!("time: {:.2} s\n", report.seconds);
    out
}

fn balance(total: i64, expected: i64) -> String {
    if total == expected || expected == 0 {
        total.to_string()
    } else {
        format!("{total} (expected {expected})")
    }
}

const BAR_WIDTH: i64 = 40;

fn bar_line(label: &str, value: i64, widest: i64, note: &str) -> String {
    let eighths = (value * BAR_WIDTH * 8 + widest / 2) / widest;
    let mut bar = "█".repeat((eighths / 8) as usize);
    const PARTS: [&str; 8] = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"];
    bar += PARTS[(eighths % 8) as usize];
    format!("{label:<13} {bar:<40} {value}{note}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_widest_value() {
        assert!(bar_line("x", 300, 300, "").contains(&"█".repeat(40)));
        let third = bar_line("x", 100, 300, "");
        assert_eq!(third.matches('█').count(), 13);
        assert!(third.contains('▍'));
        assert_eq!(bar_line("x", 0, 300, "").matches('█').count(), 0);
    }
}
