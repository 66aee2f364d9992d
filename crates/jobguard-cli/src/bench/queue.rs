//! `jobguard bench queue`: how fast the worker drains the queue, for no-op jobs and for guarded
//! credit jobs, one job per transaction and in batches, against the same per-job transaction
//! run by pgbench at the same connection count; and how long a job waits to be picked up while
//! jobs arrive at a steady rate.

mod drain;
mod pgbench;
mod pickup;

use jobguard::queue::{JobState, NewJob};
use serde::Serialize;
use sqlx::{Executor, Pool};

use self::drain::{BATCH_LINGER, WorkerShape, drain, enqueue, reset, warm_up};
use self::pickup::{Latency, Pickup};
use super::jobs::{BenchCredit, BenchNoop};
use super::median;
use crate::demo::ledger::{Ledger, LedgerDb};

/// What to measure.
#[derive(Clone, Copy, Debug)]
pub struct QueueBench {
    /// Jobs drained in each throughput run.
    pub jobs: usize,
    /// Jobs (or batches) run at once, and pgbench's clients.
    pub concurrency: u32,
    /// Jobs per transaction in the batched runs; 1 skips them.
    pub batch_size: usize,
    /// Rounds of the per-job credit drain followed at once by pgbench.
    pub rounds: usize,
    /// Jobs per second offered in one pickup run; by default runs at [`PICKUP_LOADS`] of the
    /// per-job credit rate.
    pub rate: Option<f64>,
    /// Periodic schedules firing every second on the worker of every run.
    pub periodic: u32,
}

/// The pickup runs' offered loads, as fractions of the per-job credit rate measured in the
/// same run: a user sees how latency grows with load.
pub const PICKUP_LOADS: [f64; 3] = [0.1, 0.5, 0.9];

/// One pickup run: jobs offered at a steady rate to an otherwise idle worker.
#[derive(Debug, Serialize)]
pub struct PickupRun {
    /// The rate as a fraction of the per-job credit rate; `None` for a rate given by `--rate`.
    pub load: Option<f64>,
    pub rate: f64,
    pub jobs: usize,
    /// One job per transaction, from the enqueue sent.
    pub per_job: Latency,
    /// Batches of up to `batch_size`, from the enqueue sent; `None` when it is 1.
    pub batched: Option<Latency>,
    /// The same, from the enqueue returned (committed, and the workers notified).
    pub per_job_committed: Latency,
    pub batched_committed: Option<Latency>,
}

/// The benchmark's result, as printed by `--json`.
#[derive(Debug, Serialize)]
pub struct QueueBenchReport {
    pub backend: &'static str,
    pub jobs: usize,
    pub concurrency: u32,
    /// Jobs per transaction in the batched runs.
    pub batch_size: usize,
    /// Periodic schedules firing every second on the worker of every run (`--periodic`).
    pub periodic: u32,
    pub noop_jobs_per_s: f64,
    /// The median of the rounds' per-job credit drains.
    pub credit_jobs_per_s: f64,
    /// The no-op jobs drained in batches of up to `batch_size`; `None` when it is 1.
    pub batched_noop_jobs_per_s: Option<f64>,
    /// The credit jobs drained in batches of up to `batch_size`; `None` when it is 1.
    pub batched_credit_jobs_per_s: Option<f64>,
    /// Transactions per second of pgbench running the credit job's transaction, when pgbench
    /// is installed and the database is PostgreSQL: the median of the rounds.
    pub pgbench_tps: Option<f64>,
    /// Rounds of a per-job credit drain followed at once by pgbench.
    pub rounds: usize,
    /// Each round's credit jobs/s over its pgbench tps, in the order run.
    pub round_ratios: Vec<f64>,
    /// The median of `round_ratios`: the per-job path against pgbench, each pair measured
    /// seconds apart so that the machine's drift between runs moves both.
    pub ratio: Option<f64>,
    /// batched_credit_jobs_per_s / pgbench_tps (the median round's).
    pub batched_ratio: Option<f64>,
    /// Whether every credit job was applied exactly once.
    pub exactly_once: bool,
    /// Whether every credit job of the batched run was applied exactly once.
    pub batched_exactly_once: Option<bool>,
    /// Jobs per second offered in the pickup runs.
    pub rate: f64,
    /// Jobs offered in each pickup run.
    pub pickup_jobs: usize,
    /// Pickup latency (enqueue sent to run started) with one job per transaction, median.
    pub latency_p50_ms: f64,
    /// Pickup latency with one job per transaction, 99th percentile.
    pub latency_p99_ms: f64,
    /// Pickup latency with batches of up to `batch_size`, median.
    pub batched_latency_p50_ms: Option<f64>,
    /// Pickup latency with batches of up to `batch_size`, 99th percentile.
    pub batched_latency_p99_ms: Option<f64>,
    /// How often the idle worker looked for jobs: the longest wait of a job no notification
    /// announced.
    pub poll_interval_ms: f64,
    /// How long a batch the fetch left short waited for more jobs.
    pub batch_linger_ms: f64,
    /// Every pickup run: at each of [`PICKUP_LOADS`], or the one `--rate` asked for.
    pub pickup: Vec<PickupRun>,
}

impl QueueBenchReport {
    /// Whether every credit job, batched or not, was applied exactly once.
    pub fn all_exactly_once(&self) -> bool {
        self.exactly_once && self.batched_exactly_once != Some(false)
    }
}

/// A drain's rate and whether its credits were applied exactly once.
struct Drained {
    jobs_per_s: f64,
    exactly_once: bool,
}

/// Runs the benchmark on `pool`, which has a connection per job run at once, plus one for the
/// worker's notifications, one for its fetches and heartbeats, and one for the pickup runs'
/// producer.
pub async fn run<DB: LedgerDb>(
    pool: &Pool<DB>,
    url: &str,
    bench: QueueBench,
) -> anyhow::Result<QueueBenchReport>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let QueueBench {
        jobs, concurrency, ..
    } = bench;
    let per_job = WorkerShape {
        concurrency,
        batch_size: 1,
        periodic: bench.periodic,
    };
    let batched = WorkerShape {
        concurrency,
        batch_size: bench.batch_size,
        periodic: bench.periodic,
    };
    let batching = bench.batch_size > 1;

    let postgres = DB::BACKEND == "postgres";
    warm_up(pool).await?;
    let noop = drain_noop(pool, jobs, per_job).await?;
    // The machine's speed drifts between runs (other processes, the disk's flushes), so
    // each round drains credit jobs and runs pgbench at once after, and the ratio is the
    // median round's.
    let mut credits = Vec::with_capacity(bench.rounds);
    let mut round_tps = Vec::with_capacity(bench.rounds);
    for _ in 0..bench.rounds.max(1) {
        credits.push(drain_credit(pool, jobs, per_job).await?);
        if postgres && let Some(tps) = pgbench::tps::<DB>(pool, url, jobs, concurrency).await? {
            round_tps.push(tps);
        }
    }
    let round_ratios: Vec<f64> = credits
        .iter()
        .zip(&round_tps)
        .map(|(credit, tps)| credit.jobs_per_s / tps)
        .collect();
    let credit = Drained {
        jobs_per_s: median(&credits.iter().map(|d| d.jobs_per_s).collect::<Vec<_>>()),
        exactly_once: credits.iter().all(|d| d.exactly_once),
    };
    let pgbench_tps = (!round_tps.is_empty()).then(|| median(&round_tps));
    let (batched_noop, batched_credit) = if batching {
        (
            Some(drain_noop(pool, jobs, batched).await?),
            Some(drain_credit(pool, jobs, batched).await?),
        )
    } else {
        (None, None)
    };

    let loads: Vec<(Option<f64>, f64)> = match bench.rate {
        Some(rate) => vec![(None, rate.max(1.0))],
        None => PICKUP_LOADS
            .iter()
            .map(|&load| (Some(load), (credit.jobs_per_s * load).max(1.0)))
            .collect(),
    };
    let mut pickups = Vec::with_capacity(loads.len());
    for (load, rate) in loads {
        let pickup_jobs = pickup::offered_jobs(jobs, rate);
        let latency = pickup_latency(pool, per_job, pickup_jobs, rate).await?;
        let batched_latency = if batching {
            Some(pickup_latency(pool, batched, pickup_jobs, rate).await?)
        } else {
            None
        };
        pickups.push(PickupRun {
            load,
            rate,
            jobs: pickup_jobs,
            per_job: latency.sent,
            batched: batched_latency.map(|l| l.sent),
            per_job_committed: latency.committed,
            batched_committed: batched_latency.map(|l| l.committed),
        });
    }
    // The headline figures: the run at half the peak, or the one `--rate` asked for.
    let headline = pickups
        .iter()
        .find(|run| run.load == Some(0.5))
        .unwrap_or(&pickups[0]);
    let (rate, pickup_jobs, latency, batched_latency) = (
        headline.rate,
        headline.jobs,
        headline.per_job,
        headline.batched,
    );

    let batched_credit_jobs_per_s = batched_credit.as_ref().map(|d| d.jobs_per_s);
    let per_pgbench = |jobs_per_s: Option<f64>| Some(jobs_per_s? / pgbench_tps?);
    Ok(QueueBenchReport {
        backend: DB::BACKEND,
        jobs,
        concurrency,
        batch_size: bench.batch_size,
        periodic: bench.periodic,
        noop_jobs_per_s: noop.jobs_per_s,
        credit_jobs_per_s: credit.jobs_per_s,
        batched_noop_jobs_per_s: batched_noop.map(|d| d.jobs_per_s),
        batched_credit_jobs_per_s,
        pgbench_tps,
        rounds: credits.len(),
        ratio: (!round_ratios.is_empty()).then(|| median(&round_ratios)),
        round_ratios,
        batched_ratio: per_pgbench(batched_credit_jobs_per_s),
        exactly_once: credit.exactly_once,
        batched_exactly_once: batched_credit.map(|d| d.exactly_once),
        rate,
        pickup_jobs,
        latency_p50_ms: latency.p50_ms,
        latency_p99_ms: latency.p99_ms,
        batched_latency_p50_ms: batched_latency.map(|l| l.p50_ms),
        batched_latency_p99_ms: batched_latency.map(|l| l.p99_ms),
        poll_interval_ms: pickup::poll_interval::<DB>().as_secs_f64() * 1000.0,
        pickup: pickups,
        batch_linger_ms: BATCH_LINGER.as_secs_f64() * 1000.0,
    })
}

async fn drain_noop<DB: LedgerDb>(
    pool: &Pool<DB>,
    jobs: usize,
    shape: WorkerShape,
) -> anyhow::Result<Drained>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let queue = reset::<DB>(pool).await?;
    enqueue(&queue, jobs, |n| {
        NewJob::from_job::<DB, _>(&BenchNoop { n })
    })
    .await?;
    let (seconds, stats) = drain::<DB>(&queue, shape).await?;
    Ok(Drained {
        jobs_per_s: jobs as f64 / seconds,
        exactly_once: stats.applied == jobs as u64 + firings_applied(&queue).await?,
    })
}

/// Drains `jobs` credit jobs; exactly once when the ledger has a row per job and the worker
/// applied each job.
async fn drain_credit<DB: LedgerDb>(
    pool: &Pool<DB>,
    jobs: usize,
    shape: WorkerShape,
) -> anyhow::Result<Drained>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let queue = reset::<DB>(pool).await?;
    enqueue(&queue, jobs, |n| {
        NewJob::from_job::<DB, _>(&BenchCredit { n, amount: 500 })
    })
    .await?;
    let (seconds, stats) = drain::<DB>(&queue, shape).await?;
    let (rows, _) = DB::read(pool, Ledger::Bench).await?;
    Ok(Drained {
        jobs_per_s: jobs as f64 / seconds,
        exactly_once: rows == jobs as i64
            && stats.applied == jobs as u64 + firings_applied(&queue).await?,
    })
}

/// The jobs of periodic firings (`--periodic`) the worker completed: its applied count
/// includes them beside the benchmark's own.
async fn firings_applied<DB: LedgerDb>(queue: &jobguard::Queue<DB>) -> anyhow::Result<u64> {
    let done = queue
        .list(Some(JobState::Completed), Some("bench-noop"), u32::MAX)
        .await?;
    Ok(done
        .iter()
        .filter(|job| job.key.starts_with("periodic:"))
        .count() as u64)
}

async fn pickup_latency<DB: LedgerDb>(
    pool: &Pool<DB>,
    shape: WorkerShape,
    jobs: usize,
    rate: f64,
) -> anyhow::Result<Pickup>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let queue = reset::<DB>(pool).await?;
    pickup::measure(&queue, shape, jobs, rate).await
}

/// The human-readable report.
pub fn render(report: &QueueBenchReport) -> String {
    let mut out = format!(
        "jobguard bench queue on {}: {} jobs drained by one worker with {} connections\n\
         no-op jobs      {:>10.0} jobs/s\n\
         credit jobs     {:>10.0} jobs/s (guarded, each in one transaction with its completion)\n",
        report.backend,
        report.jobs,
        report.concurrency,
        report.noop_jobs_per_s,
        report.credit_jobs_per_s,
    );
    if report.periodic > 0 {
        out += &format!(
            "periodic        {:>10} schedules firing every second on the worker\n",
            report.periodic
        );
    }
    if let (Some(noop), Some(credit)) = (
        report.batched_noop_jobs_per_s,
        report.batched_credit_jobs_per_s,
    ) {
        out += &format!(
            "batched no-op   {noop:>10.0} jobs/s (up to {size} per transaction)\n\
             batched credit  {credit:>10.0} jobs/s (guarded, up to {size} per transaction)\n",
            size = report.batch_size,
        );
    } else {
        out += "batched runs: not run (--batch-size 1)\n";
    }
    match (report.pgbench_tps, report.ratio) {
        (Some(tps), Some(ratio)) => {
            out += &format!(
                "pgbench         {tps:>10.0} tps    (the same per-job transaction, same connections)\n\
                 ratio credit jobs / pgbench: {ratio:.3} (median of {} rounds: {})\n",
                report.rounds,
                report
                    .round_ratios
                    .iter()
                    .map(|r| format!("{r:.3}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if let Some(batched_ratio) = report.batched_ratio {
                out += &format!("ratio batched credit jobs / pgbench: {batched_ratio:.3}\n");
            }
        }
        _ => out += "pgbench: not run (needs PostgreSQL and pgbench on PATH)\n",
    }
    out += &format!(
        "pickup latency, credit jobs offered at a steady rate (enqueue sent, or returned after \
         its commit, to run started; \
         poll every {} ms, batches linger {} ms), in ms:\n\
         {:<46} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
        report.poll_interval_ms,
        report.batch_linger_ms,
        "",
        "jobs/s",
        "jobs",
        "p50",
        "p90",
        "p99",
        "p99.9",
        "max",
    );
    for run in &report.pickup {
        let load = run.load.map_or_else(
            || "--rate".to_owned(),
            |l| format!("{:.0}% of peak", l * 100.0),
        );
        let shapes = [
            ("one per transaction", Some(run.per_job)),
            ("batched", run.batched),
            (
                "one per transaction, from commit",
                Some(run.per_job_committed),
            ),
            ("batched, from commit", run.batched_committed),
        ];
        for (shape, latency) in shapes {
            if let Some(l) = latency {
                out += &format!(
                    "{:<46} {:>8.0} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}\n",
                    format!("{load}, {shape}"),
                    run.rate,
                    run.jobs,
                    l.p50_ms,
                    l.p90_ms,
                    l.p99_ms,
                    l.p999_ms,
                    l.max_ms,
                );
            }
        }
    }
    if !report.exactly_once {
        out += "WARNING: the credit jobs were not applied exactly once\n";
    }
    if report.batched_exactly_once == Some(false) {
        out += "WARNING: the batched credit jobs were not applied exactly once\n";
    }
    out
}
