//! The seed's experiment: N credit jobs, each delivered D times at once over C connections,
//! once with the naive job and once with the guarded job.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use indicatif::ProgressBar;
use jobguard::{Guard, Outcome};
use serde::Serialize;
use sqlx::Pool;

use super::ledger::{self, Ledger, LedgerDb};
use crate::builtin_jobs::Credit;

/// The experiment's size.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Shape {
    pub jobs: usize,
    pub deliveries: usize,
    pub concurrency: u32,
}

impl Shape {
    pub fn total_deliveries(&self) -> usize {
        self.jobs * self.deliveries
    }
}

/// What one run (naive or guarded) did, read back from its ledger.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunReport {
    /// Deliveries made: every time a job ran, whatever it did.
    pub deliveries: usize,
    /// Ledger rows written: the effects that actually happened.
    pub effects: i64,
    pub applied: usize,
    pub duplicates: usize,
    pub failed: usize,
    pub balance_total: i64,
    pub seconds: f64,
    pub deliveries_per_second: f64,
    /// The first error a delivery returned, if any did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Charges the payment provider made (the charge scenario).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_charges: Option<i64>,
    /// Orders the provider charged more than once (the charge scenario).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub orders_charged_more_than_once: Option<usize>,
    /// Worker processes killed mid-job (the charge scenario).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crashes: Option<usize>,
}

/// The credits of the experiment, one per job.
pub fn credits(shape: &Shape) -> Arc<Vec<Credit>> {
    Arc::new((0..shape.jobs).map(ledger::credit_for_order).collect())
}

/// The total every balance should add up to when each job is applied once.
pub fn expected_total(credits: &[Credit]) -> i64 {
    credits.iter().map(|c| c.amount).sum()
}

/// Delivers every credit with the naive job, which appends on each delivery.
pub async fn run_naive<DB: LedgerDb>(
    pool: &Pool<DB>,
    credits: &Arc<Vec<Credit>>,
    shape: Shape,
    progress: &ProgressBar,
) -> anyhow::Result<RunReport> {
    let pool = pool.clone();
    let report = deliver_all(credits, shape, progress, move |credit| {
        let pool = pool.clone();
        async move {
            ledger::credit_naive(&pool, &credit)
                .await
                .map(Outcome::Applied)
                .map_err(Into::into)
        }
    })
    .await;
    Ok(report)
}

/// Delivers every credit with the guarded job.
pub async fn run_guarded<DB: LedgerDb>(
    guard: &Guard<DB>,
    credits: &Arc<Vec<Credit>>,
    shape: Shape,
    progress: &ProgressBar,
) -> anyhow::Result<RunReport> {
    let guard = guard.clone();
    let report = deliver_all(credits, shape, progress, move |credit| {
        let guard = guard.clone();
        async move { ledger::credit_guarded(&guard, credit).await }
    })
    .await;
    Ok(report)
}

/// Reads a run's effects back from its ledger.
pub async fn read_back<DB: LedgerDb>(
    pool: &Pool<DB>,
    report: &mut RunReport,
    guarded: bool,
) -> anyhow::Result<()> {
    let ledger = if guarded {
        Ledger::Guarded
    } else {
        Ledger::Naive
    };
    (report.effects, report.balance_total) = DB::read(pool, ledger).await?;
    Ok(())
}

/// `concurrency` workers take deliveries from one list, in which the D copies of each job sit
/// next to each other, so the copies of a job are picked up by different workers at the same
/// moment: concurrent redeliveries, as a queue produces them after a mass redelivery.
async fn deliver_all<F, Fut>(
    credits: &Arc<Vec<Credit>>,
    shape: Shape,
    progress: &ProgressBar,
    deliver: F,
) -> RunReport
where
    F: Fn(Credit) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = jobguard::Result<Outcome<()>>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let total = shape.total_deliveries();
    let started = Instant::now();
    let workers: Vec<_> = (0..shape.concurrency)
        .map(|_| {
            let (credits, next, deliver, progress) = (
                Arc::clone(credits),
                Arc::clone(&next),
                deliver.clone(),
                progress.clone(),
            );
            tokio::spawn(async move {
                let mut tally = RunReport::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return tally;
                    }
                    match deliver(credits[i / shape.deliveries].clone()).await {
                        Ok(Outcome::Applied(())) => tally.applied += 1,
                        Ok(Outcome::Duplicate(_)) => tally.duplicates += 1,
                        Err(error) => {
                            tally.failed += 1;
                            tally.first_error.get_or_insert_with(|| error.to_string());
                        }
                    }
                    progress.inc(1);
                }
            })
        })
        .collect();
    let mut report = RunReport {
        deliveries: total,
        ..RunReport::default()
    };
    for worker in workers {
        let tally = worker.await.expect("a delivery worker panicked");
        report.applied += tally.applied;
        report.duplicates += tally.duplicates;
        report.failed += tally.failed;
        report.first_error = report.first_error.or(tally.first_error);
    }
    report.seconds = started.elapsed().as_secs_f64();
    report.deliveries_per_second = total as f64 / report.seconds;
    report
}
