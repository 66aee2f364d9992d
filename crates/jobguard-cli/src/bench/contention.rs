//! `jobguard bench contention`: when batching pays and when it does not.
//!
//! The same deposits, each adding to an account's balance and appending a ledger row, are
//! drained one job per transaction and then in batches, twice: once with every job on an account
//! of its own (no two transactions write the same row) and once with all jobs spread over a few
//! hot accounts. A batch holds the row locks of all its effects until it commits, so batches
//! over hot accounts wait on each other, deadlock, roll back and run their jobs one by one.

use std::time::{Duration, Instant};

use clap::Args;
use jobguard::queue::NewJob;
use jobguard::{
    GuardConfig, Job, JobError, JobKey, KeyError, Queue, TableName, Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};
use sqlx::{Executor, Pool};

use crate::database::{DEFAULT_URL, Database};
use crate::demo::ledger::{BENCH_LEDGER, Ledger, LedgerDb};
use crate::{on_pool, report};

const JOBS: &str = "jobguard_bench_contention_jobs";
const GUARD: &str = "jobguard_bench_contention_processed_jobs";
const ACCOUNTS: &str = "jobguard_bench_accounts";

/// Arguments of `jobguard bench contention`.
#[derive(Args, Debug)]
pub struct BenchContentionArgs {
    /// Deposits drained each way.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    jobs: u32,
    /// The hot accounts the contended run spreads its deposits over.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    hot_accounts: u32,
    /// Jobs per transaction in the batched runs.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(2..=10_000))]
    batch_size: u32,
    /// Jobs run at once, and connections in the worker's pool.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    concurrency: u32,
    /// postgres://user@host/db, or sqlite:path.db for an embedded database.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    database_url: String,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
}

/// One way of draining the deposits.
#[derive(Debug, Serialize)]
pub struct ContentionRun {
    /// `own rows` or `hot rows`.
    pub rows: &'static str,
    /// Accounts the deposits go to.
    pub accounts: u64,
    /// 1 for one job per transaction.
    pub batch_size: u32,
    pub jobs_per_s: f64,
    /// Batches committed and rolled back (their jobs then ran one per transaction).
    pub batches: u64,
    pub batches_rolled_back: u64,
    /// Every deposit applied once: ledger rows, applied jobs and the balances' sum all equal
    /// the jobs.
    pub exactly_once: bool,
}

/// The benchmark's result, as printed by `--json`.
#[derive(Debug, Serialize)]
pub struct ContentionBenchReport {
    pub backend: &'static str,
    pub jobs: usize,
    pub concurrency: u32,
    pub runs: Vec<ContentionRun>,
    /// Batched over per-job jobs/s with every job on its own row.
    pub own_rows_speedup: f64,
    /// Batched over per-job jobs/s with the jobs on the hot rows.
    pub hot_rows_speedup: f64,
    pub exactly_once: bool,
}

/// Adds one to an account's balance and appends a ledger row.
#[derive(Serialize, Deserialize)]
struct Deposit {
    n: u64,
    account: u64,
}

impl<DB: LedgerDb> Job<DB> for Deposit
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    const KIND: &'static str = "bench-deposit";
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("bench-deposit", [self.n.to_string()])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        // Integers only: safe to splice.
        let sql = format!(
            "update {ACCOUNTS} set balance = balance + 1 where id = {}",
            self.account
        );
        conn.execute(sqlx::AssertSqlSafe(sql)).await?;
        DB::append(conn, Ledger::Bench, self.account as i64, 1).await?;
        Ok(())
    }
}

/// Runs `jobguard bench contention`.
pub async fn run(args: BenchContentionArgs) -> anyhow::Result<std::process::ExitCode> {
    // The worker's connections, plus one for its notifications and one for heartbeats.
    let connections = args.concurrency + 2;
    let report = on_pool!(Database::connect(&args.database_url, connections).await?, pool => {
        measure(&pool, &args).await?
    });
    report::verdict(&report, args.json, render, report.exactly_once)
}

async fn measure<DB: LedgerDb>(
    pool: &Pool<DB>,
    args: &BenchContentionArgs,
) -> anyhow::Result<ContentionBenchReport>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let jobs = args.jobs as u64;
    let mut runs = Vec::new();
    for (rows, accounts) in [
        ("own rows", jobs),
        ("hot rows", u64::from(args.hot_accounts)),
    ] {
        for batch_size in [1, args.batch_size] {
            runs.push(drain(pool, args, rows, accounts, batch_size).await?);
        }
    }
    let speedup = |rows: &str| {
        let rate = |size: u32| {
            runs.iter()
                .find(|run| run.rows == rows && (run.batch_size == 1) == (size == 1))
                .map_or(0.0, |run| run.jobs_per_s)
        };
        rate(args.batch_size) / rate(1)
    };
    Ok(ContentionBenchReport {
        backend: DB::BACKEND,
        jobs: jobs as usize,
        concurrency: args.concurrency,
        own_rows_speedup: speedup("own rows"),
        hot_rows_speedup: speedup("hot rows"),
        exactly_once: runs.iter().all(|run| run.exactly_once),
        runs,
    })
}

/// Recreates the tables, enqueues the deposits (not timed) and drains them with one worker.
async fn drain<DB: LedgerDb>(
    pool: &Pool<DB>,
    args: &BenchContentionArgs,
    rows: &'static str,
    accounts: u64,
    batch_size: u32,
) -> anyhow::Result<ContentionRun>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let jobs = args.jobs as u64;
    let queue = reset(pool, accounts).await?;
    let deposits = (0..jobs)
        .map(|n| {
            NewJob::from_job::<DB, _>(&Deposit {
                n,
                account: n % accounts,
            })
        })
        .collect::<jobguard::Result<Vec<_>>>()?;
    for chunk in deposits.chunks(5_000) {
        queue.enqueue_many(chunk).await?;
    }
    let config = WorkerConfig {
        concurrency: args.concurrency as usize,
        batch_size: batch_size as usize,
        stop_when_idle: true,
        poll_interval: Duration::from_millis(20),
        guard: guard_config()?,
        ..WorkerConfig::default()
    };
    let worker = Worker::with_config(queue, config)?.register::<Deposit>();
    let started = Instant::now();
    let stats = worker.run(std::future::pending()).await?;
    let seconds = started.elapsed().as_secs_f64();
    let (ledger_rows, total) = DB::read(pool, Ledger::Bench).await?;
    let exactly_once = ledger_rows == jobs as i64 && total == jobs as i64 && stats.applied == jobs;
    Ok(ContentionRun {
        rows,
        accounts,
        batch_size,
        jobs_per_s: jobs as f64 / seconds,
        batches: stats.batches,
        batches_rolled_back: stats.batches_rolled_back,
        exactly_once,
    })
}

fn guard_config() -> anyhow::Result<GuardConfig> {
    Ok(GuardConfig::default().table(TableName::new(GUARD)?))
}

async fn reset<DB: LedgerDb>(pool: &Pool<DB>, accounts: u64) -> anyhow::Result<Queue<DB>>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let mut conn = pool.acquire().await?;
    for table in [JOBS, GUARD, ACCOUNTS, BENCH_LEDGER] {
        conn.execute(sqlx::AssertSqlSafe(format!("drop table if exists {table}")))
            .await?;
    }
    conn.execute(sqlx::AssertSqlSafe(format!(
        "create table {BENCH_LEDGER} (account bigint not null, amount bigint not null)"
    )))
    .await?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "create table {ACCOUNTS} (id bigint primary key, balance bigint not null)"
    )))
    .await?;
    // Integers only: safe to splice. A recursive series works on both backends.
    conn.execute(sqlx::AssertSqlSafe(format!(
        "insert into {ACCOUNTS} (id, balance)
         with recursive ids(id) as (select 0 union all select id + 1 from ids where id + 1 < {accounts})
         select id, 0 from ids"
    )))
    .await?;
    drop(conn);
    let queue = Queue::with_table(pool.clone(), TableName::new(JOBS)?)?;
    queue.migrate().await?;
    queue.guard(guard_config()?)?.migrate().await?;
    Ok(queue)
}

/// The human-readable report.
pub fn render(report: &ContentionBenchReport) -> String {
    let mut table = report::table(&[
        "rows",
        "accounts",
        "batch size",
        "jobs/s",
        "batches",
        "rolled back",
        "exactly once",
    ]);
    for run in &report.runs {
        table.add_row(vec![
            run.rows.to_owned(),
            run.accounts.to_string(),
            run.batch_size.to_string(),
            format!("{:.0}", run.jobs_per_s),
            run.batches.to_string(),
            run.batches_rolled_back.to_string(),
            run.exactly_once.to_string(),
        ]);
    }
    format!(
        "jobguard bench contention on {}: {} deposits each way, {} connections\n{table}\n\
         batched / per job: {:.2}x on rows of their own, {:.2}x on hot rows\n",
        report.backend,
        report.jobs,
        report.concurrency,
        report.own_rows_speedup,
        report.hot_rows_speedup,
    )
}
