//! `jobguard bench queue`: how fast the worker drains the queue, for no-op jobs and for guarded
//! credit jobs, against the same per-job transaction run by pgbench at the same connection count.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use jobguard::queue::NewJob;
use jobguard::{
    Backend, GuardConfig, Job, JobError, JobKey, KeyError, Queue, TableName, Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};
use sqlx::{Executor, Pool};

use crate::demo::ledger::{BENCH_LEDGER, Ledger, LedgerDb};

const JOBS: &str = "jobguard_bench_jobs";
const GUARD: &str = "jobguard_bench_processed_jobs";
const LEDGER: &str = BENCH_LEDGER;
const PGBENCH_JOBS: &str = "jobguard_bench_pgbench_jobs";
const PGBENCH_GUARD: &str = "jobguard_bench_pgbench_processed_jobs";

/// The benchmark's result, as printed by `--json`.
#[derive(Debug, Serialize)]
pub struct QueueBenchReport {
    pub backend: &'static str,
    pub jobs: usize,
    pub concurrency: u32,
    pub noop_jobs_per_s: f64,
    pub credit_jobs_per_s: f64,
    /// Transactions per second of pgbench running the credit job's transaction, when pgbench
    /// is installed and the database is PostgreSQL.
    pub pgbench_tps: Option<f64>,
    /// credit_jobs_per_s / pgbench_tps.
    pub ratio: Option<f64>,
    /// Whether every credit job was applied exactly once.
    pub exactly_once: bool,
}

/// A job that does nothing but pass through the guard and the queue.
#[derive(Serialize, Deserialize)]
struct BenchNoop {
    n: u64,
}

/// The seed's credit job, appending to the benchmark's ledger.
#[derive(Serialize, Deserialize)]
struct BenchCredit {
    n: u64,
    amount: i64,
}

impl<DB: LedgerDb> Job<DB> for BenchNoop {
    const KIND: &'static str = "bench-noop";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("bench-noop", [self.n.to_string()])
    }

    async fn run(&self, _conn: &mut DB::Connection) -> Result<(), JobError> {
        Ok(())
    }
}

impl<DB: LedgerDb> Job<DB> for BenchCredit {
    const KIND: &'static str = "bench-credit";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("bench-credit", [format!("order-{}", self.n)])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        DB::append(conn, Ledger::Bench, 7, self.amount).await?;
        Ok(())
    }
}

/// Runs the benchmark on `pool`, whose connections number `concurrency`.
pub async fn run<DB: LedgerDb>(
    pool: &Pool<DB>,
    url: &str,
    jobs: usize,
    concurrency: u32,
) -> anyhow::Result<QueueBenchReport>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let queue = reset::<DB>(pool).await?;
    enqueue(&queue, jobs, |n| {
        NewJob::from_job::<DB, _>(&BenchNoop { n })
    })
    .await?;
    let (noop_seconds, _) = drain::<DB>(&queue, concurrency).await?;

    let queue = reset::<DB>(pool).await?;
    enqueue(&queue, jobs, |n| {
        NewJob::from_job::<DB, _>(&BenchCredit { n, amount: 500 })
    })
    .await?;
    let (credit_seconds, stats) = drain::<DB>(&queue, concurrency).await?;
    let (rows, _) = DB::read(pool, Ledger::Bench).await?;
    let exactly_once = rows == jobs as i64 && stats.applied == jobs as u64;

    let pgbench_tps = if DB::BACKEND == "postgres" {
        pgbench::<DB>(pool, url, jobs, concurrency).await?
    } else {
        None
    };
    let credit_jobs_per_s = jobs as f64 / credit_seconds;
    Ok(QueueBenchReport {
        backend: DB::BACKEND,
        jobs,
        concurrency,
        noop_jobs_per_s: jobs as f64 / noop_seconds,
        credit_jobs_per_s,
        pgbench_tps,
        ratio: pgbench_tps.map(|tps| credit_jobs_per_s / tps),
        exactly_once,
    })
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
    match (report.pgbench_tps, report.ratio) {
        (Some(tps), Some(ratio)) => {
            out += &format!(
                "pgbench         {tps:>10.0} tps    (the same per-job transaction, same connections)\n\
                 ratio credit jobs / pgbench: {ratio:.3}\n"
            );
        }
        _ => out += "pgbench: not run (needs PostgreSQL and pgbench on PATH)\n",
    }
    if !report.exactly_once {
        out += "WARNING: the credit jobs were not applied exactly once\n";
    }
    out
}

async fn reset<DB: LedgerDb>(pool: &Pool<DB>) -> anyhow::Result<Queue<DB>>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let mut conn = pool.acquire().await?;
    for table in [JOBS, GUARD, LEDGER, PGBENCH_JOBS, PGBENCH_GUARD] {
        conn.execute(sqlx::AssertSqlSafe(format!("drop table if exists {table}")))
            .await?;
    }
    conn.execute(sqlx::AssertSqlSafe(format!(
        "create table {LEDGER} (account bigint not null, amount bigint not null)"
    )))
    .await?;
    drop(conn);
    let queue = Queue::with_table(pool.clone(), TableName::new(JOBS)?)?;
    queue.migrate().await?;
    queue.guard(guard_config()?)?.migrate().await?;
    Ok(queue)
}

fn guard_config() -> anyhow::Result<GuardConfig> {
    Ok(GuardConfig::default().table(TableName::new(GUARD)?))
}

/// Enqueues jobs `0..jobs` from a few producers at once; not timed.
async fn enqueue<DB: Backend>(
    queue: &Queue<DB>,
    jobs: usize,
    job: impl Fn(u64) -> jobguard::Result<NewJob>,
) -> anyhow::Result<()> {
    let new_jobs = (0..jobs as u64)
        .map(job)
        .collect::<jobguard::Result<Vec<_>>>()?;
    let mut inserts =
        futures::stream::iter(new_jobs.iter().map(|job| queue.enqueue(job))).buffer_unordered(8);
    while let Some(result) = inserts.next().await {
        result?;
    }
    Ok(())
}

async fn drain<DB: LedgerDb>(
    queue: &Queue<DB>,
    concurrency: u32,
) -> anyhow::Result<(f64, jobguard::WorkerStats)> {
    let config = WorkerConfig {
        concurrency: concurrency as usize,
        stop_when_idle: true,
        poll_interval: Duration::from_millis(20),
        guard: guard_config()?,
        ..WorkerConfig::default()
    };
    let worker = Worker::with_config(queue.clone(), config)?
        .register::<BenchNoop>()
        .register::<BenchCredit>();
    let started = Instant::now();
    let stats = worker.run(std::future::pending()).await?;
    let seconds = started.elapsed().as_secs_f64();
    if stats.failed + stats.dead > 0 {
        bail!("the benchmark's jobs failed: {stats:?}");
    }
    Ok((seconds, stats))
}

/// Runs the credit job's transaction with pgbench, statement for statement as the worker runs
/// it: begin, complete the job and claim its key, append to the ledger, commit. As many
/// transactions as jobs, over the same number of connections.
async fn pgbench<DB: LedgerDb>(
    pool: &Pool<DB>,
    url: &str,
    jobs: usize,
    concurrency: u32,
) -> anyhow::Result<Option<f64>>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let Some(pgbench) = find_pgbench() else {
        return Ok(None);
    };
    let queue = Queue::with_table(pool.clone(), TableName::new(PGBENCH_JOBS)?)?;
    queue.migrate().await?;
    queue
        .guard(GuardConfig::default().table(TableName::new(PGBENCH_GUARD)?))?
        .migrate()
        .await?;
    // Jobs 1..=jobs, leased at attempt 1, for the transactions to complete.
    let mut conn = pool.acquire().await?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "insert into {PGBENCH_JOBS} (kind, job_key, queue, payload, state, attempt, lease_token, max_attempts)
         select 'bench-credit', 'bench-credit:order-' || n, 'default', '{{}}', 'running', 1, 1, 10
         from generate_series(1, {jobs}) n"
    )))
    .await?;
    drop(conn);
    // A fresh key per transaction (a collision now and then only takes the cheaper duplicate
    // path), and a leased job to complete. No `:` in literals: pgbench reads `:word` as a
    // variable even inside quotes.
    let script = format!(
        "\\set key random(1, 2000000000)\n\
         \\set id random(1, {jobs})\n\
         BEGIN;\n\
         WITH completed AS (UPDATE {PGBENCH_JOBS} SET state = 'completed', finished_at = now(), leased_until = NULL WHERE id = :id AND lease_token = 1 AND state = 'running' RETURNING 1) \
         SELECT c.*, EXISTS (SELECT 1 FROM completed) FROM {PGBENCH_GUARD}_claim('bench-credit-order-' || CAST(:key AS text), 'bench-credit', NULL, '\\x00'::bytea) c;\n\
         INSERT INTO {LEDGER} (account, amount) VALUES (7, 500);\n\
         COMMIT;\n"
    );
    let path = std::env::temp_dir().join(format!("jobguard-pgbench-{}.sql", std::process::id()));
    std::fs::write(&path, script)?;
    let transactions = (jobs / concurrency as usize).max(1);
    let output = tokio::process::Command::new(pgbench)
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &concurrency.to_string(),
            "-j",
            "2",
        ])
        .args(["-t", &transactions.to_string(), "-f"])
        .arg(&path)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .await
        .context("run pgbench")?;
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "pgbench failed: {}{}",
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let tps = stdout
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|tps| tps.parse().ok())
        .with_context(|| format!("pgbench printed no tps: {stdout}"))?;
    Ok(Some(tps))
}

fn find_pgbench() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("pgbench"))
        .find(|p| p.is_file())
}
