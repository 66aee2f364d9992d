//! `jobguard bench enqueue`: jobs per second enqueued one by one (`Queue::enqueue`, one
//! statement and one commit per job, from one producer) against one `Queue::enqueue_many` call
//! for the same jobs (one transaction), each on a fresh table; then both again with a unique
//! policy on (completed and dead keep the key, a period of a day in the key), which inserts
//! through the kept-key index as well as the live-key one.

use std::time::Instant;

use clap::Args;
use jobguard::queue::NewJob;
use jobguard::unique::{UniqueOpts, UniqueStates};
use jobguard::{Backend, JobKey, Queue, TableName};
use serde::Serialize;
use serde_json::json;
use sqlx::{Executor, Pool};

use crate::database::{DEFAULT_URL, Database};
use crate::{on_pool, report};

const JOBS: &str = "jobguard_bench_enqueue_jobs";

/// Arguments of `jobguard bench enqueue`.
#[derive(Args, Debug)]
pub struct BenchEnqueueArgs {
    /// Jobs to enqueue each way.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    jobs: u32,
    /// postgres://user@host/db, or sqlite:path.db for an embedded database.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    database_url: String,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
}

/// The benchmark's result, as printed by `--json`.
#[derive(Debug, Serialize)]
pub struct EnqueueBenchReport {
    backend: &'static str,
    jobs: usize,
    /// `Queue::enqueue` for each job in turn.
    one_by_one_jobs_per_s: f64,
    /// One `Queue::enqueue_many` call for all the jobs.
    enqueue_many_jobs_per_s: f64,
    /// `enqueue_many_jobs_per_s` over `one_by_one_jobs_per_s`.
    speedup: f64,
    /// `Queue::enqueue` for each job, under the unique policy.
    unique_one_by_one_jobs_per_s: f64,
    /// One `Queue::enqueue_many` call, under the unique policy.
    unique_enqueue_many_jobs_per_s: f64,
    /// `unique_one_by_one_jobs_per_s` over `one_by_one_jobs_per_s`: below 1, the policy's cost.
    unique_one_by_one_ratio: f64,
    /// Every job was inserted, each way.
    all_inserted: bool,
}

/// Runs `jobguard bench enqueue`.
pub async fn run(args: BenchEnqueueArgs) -> anyhow::Result<std::process::ExitCode> {
    let jobs = args.jobs as usize;
    let report = on_pool!(Database::connect(&args.database_url, 2).await?, pool => {
        measure(&pool, jobs).await?
    });
    report::verdict(&report, args.json, render, report.all_inserted)
}

async fn measure<DB: Backend>(pool: &Pool<DB>, jobs: usize) -> anyhow::Result<EnqueueBenchReport>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let new_jobs = (0..jobs)
        .map(|n| {
            let key = JobKey::new("bench-enqueue", [n.to_string()])?;
            NewJob::new(key, &json!({"account": n % 100, "amount": 500}))
        })
        .collect::<jobguard::Result<Vec<_>>>()?;
    let (one_by_one, many, mut all_inserted) = measure_jobs(pool, &new_jobs).await?;
    let policy = UniqueOpts::new()
        .states(UniqueStates::LIVE.with_completed().with_dead())
        .period(std::time::Duration::from_secs(86_400))?;
    let unique_jobs: Vec<NewJob> = new_jobs.into_iter().map(|job| job.unique(policy)).collect();
    let (unique_one_by_one, unique_many, unique_inserted) =
        measure_jobs(pool, &unique_jobs).await?;
    all_inserted &= unique_inserted;
    drop_table(pool).await?;

    Ok(EnqueueBenchReport {
        backend: DB::BACKEND,
        jobs,
        one_by_one_jobs_per_s: one_by_one,
        enqueue_many_jobs_per_s: many,
        speedup: many / one_by_one,
        unique_one_by_one_jobs_per_s: unique_one_by_one,
        unique_enqueue_many_jobs_per_s: unique_many,
        unique_one_by_one_ratio: unique_one_by_one / one_by_one,
        all_inserted,
    })
}

/// Jobs per second one by one and in one batch, each on a fresh table, and whether every job
/// was inserted.
async fn measure_jobs<DB: Backend>(
    pool: &Pool<DB>,
    new_jobs: &[NewJob],
) -> anyhow::Result<(f64, f64, bool)>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let jobs = new_jobs.len();
    let queue = reset(pool).await?;
    let started = Instant::now();
    let mut inserted = 0;
    for job in new_jobs {
        inserted += usize::from(queue.enqueue(job).await?.inserted);
    }
    let one_by_one = jobs as f64 / started.elapsed().as_secs_f64();
    let mut all_inserted = inserted == jobs;

    let queue = reset(pool).await?;
    let started = Instant::now();
    let results = queue.enqueue_many(new_jobs).await?;
    let many = jobs as f64 / started.elapsed().as_secs_f64();
    all_inserted &= results.iter().filter(|e| e.inserted).count() == jobs;
    Ok((one_by_one, many, all_inserted))
}

/// The human-readable report.
pub fn render(report: &EnqueueBenchReport) -> String {
    let mut out = format!(
        "jobguard bench enqueue on {}: {} jobs each way\n\
         one by one      {:>10.0} jobs/s (Queue::enqueue, one commit per job)\n\
         enqueue_many    {:>10.0} jobs/s (one call, one transaction)\n\
         speedup         {:>10.1}x\n\
         with a unique policy (completed and dead keep the key, a day's period in the key):\n\
         one by one      {:>10.0} jobs/s ({:.2}x of without)\n\
         enqueue_many    {:>10.0} jobs/s\n",
        report.backend,
        report.jobs,
        report.one_by_one_jobs_per_s,
        report.enqueue_many_jobs_per_s,
        report.speedup,
        report.unique_one_by_one_jobs_per_s,
        report.unique_one_by_one_ratio,
        report.unique_enqueue_many_jobs_per_s,
    );
    if !report.all_inserted {
        out += "WARNING: not every job was inserted\n";
    }
    out
}

async fn drop_table<DB: Backend>(pool: &Pool<DB>) -> anyhow::Result<()>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let mut conn = pool.acquire().await?;
    conn.execute(sqlx::AssertSqlSafe(format!("drop table if exists {JOBS}")))
        .await?;
    Ok(())
}

/// A fresh, empty jobs table for the benchmark.
async fn reset<DB: Backend>(pool: &Pool<DB>) -> anyhow::Result<Queue<DB>>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    drop_table(pool).await?;
    let queue = Queue::with_table(pool.clone(), TableName::new(JOBS)?)?;
    queue.migrate().await?;
    Ok(queue)
}
