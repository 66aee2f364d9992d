//! `jobguard bench guard`: what the guard costs, as deliveries per second of the naive and the
//! guarded credit job measured side by side in one run.

use indicatif::ProgressBar;
use serde::Serialize;
use sqlx::Pool;

use super::median;
use crate::demo::experiment::{self, RunReport, Shape};
use crate::demo::ledger::LedgerDb;

/// The benchmark's result, as printed by `--json`.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub backend: &'static str,
    pub jobs: usize,
    pub deliveries: usize,
    pub concurrency: u32,
    pub rounds: usize,
    /// Median over the rounds.
    pub naive_deliveries_per_s: f64,
    /// Median over the rounds.
    pub guarded_deliveries_per_s: f64,
    /// guarded / naive: 1.0 means the guard is free, 0.9 that it costs 10%.
    pub ratio: f64,
    pub naive_rounds: Vec<f64>,
    pub guarded_rounds: Vec<f64>,
    /// Whether every guarded round applied each job exactly once.
    pub exactly_once: bool,
}

/// Runs `rounds` rounds of naive and guarded deliveries, alternating which goes first so that
/// neither always runs on a warmer cache.
pub async fn run<DB: LedgerDb>(
    pool: &Pool<DB>,
    shape: Shape,
    rounds: usize,
    progress: &ProgressBar,
) -> anyhow::Result<BenchReport> {
    let credits = experiment::credits(&shape);
    let (mut naive_rounds, mut guarded_rounds) = (Vec::new(), Vec::new());
    let mut exactly_once = true;
    for round in 0..rounds {
        let guard = DB::reset(pool).await?;
        let mut guarded = RunReport::default();
        let mut naive = RunReport::default();
        for guarded_first in [round % 2 == 1, round % 2 == 0] {
            if guarded_first {
                guarded = experiment::run_guarded(&guard, &credits, shape, progress).await?;
            } else {
                naive = experiment::run_naive(pool, &credits, shape, progress).await?;
            }
        }
        experiment::read_back(pool, &mut guarded, true).await?;
        exactly_once &=
            guarded.effects == shape.jobs as i64 && guarded.failed == 0 && naive.failed == 0;
        naive_rounds.push(naive.deliveries_per_second);
        guarded_rounds.push(guarded.deliveries_per_second);
    }
    let naive = median(&naive_rounds);
    let guarded = median(&guarded_rounds);
    Ok(BenchReport {
        backend: DB::BACKEND,
        jobs: shape.jobs,
        deliveries: shape.deliveries,
        concurrency: shape.concurrency,
        rounds,
        naive_deliveries_per_s: naive,
        guarded_deliveries_per_s: guarded,
        ratio: guarded / naive,
        naive_rounds,
        guarded_rounds,
        exactly_once,
    })
}

/// The human-readable report.
pub fn render(report: &BenchReport) -> String {
    let rounds = |r: &[f64]| {
        r.iter()
            .map(|v| format!("{v:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "jobguard bench guard on {}: {} jobs x {} deliveries, {} connections, {} rounds (median)\n\
         naive    {:>10.0} deliveries/s   rounds: {}\n\
         guarded  {:>10.0} deliveries/s   rounds: {}\n\
         ratio guarded/naive: {:.3}{}\n",
        report.backend,
        report.jobs,
        report.deliveries,
        report.concurrency,
        report.rounds,
        report.naive_deliveries_per_s,
        rounds(&report.naive_rounds),
        report.guarded_deliveries_per_s,
        rounds(&report.guarded_rounds),
        report.ratio,
        if report.exactly_once {
            ""
        } else {
            "\nWARNING: a guarded round did not apply every job exactly once"
        },
    )
}
