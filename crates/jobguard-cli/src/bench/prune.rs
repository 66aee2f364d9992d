//! `jobguard bench prune`, on PostgreSQL: what pruning costs the jobs that run meanwhile, and
//! what a big guard table costs each job.
//!
//! 1. Prune under load: the guard table gets `--rows` rows 30 days old; the worker drains a
//!    backlog of guarded credit jobs (each a ledger insert committed with its guard row and its
//!    completion) for `--window`, then while a [`Pruner`] deletes the old rows, then for
//!    `--window` again. The ratio is the worker's jobs per second during the prune over its jobs
//!    per second before it.
//! 2. Table size: `--jobs` jobs drained with an empty guard table, then with `--big-rows` rows
//!    in it. Keys are hashes, so each claim lands on a random page of the key index rather
//!    than on the few hot pages that sequential keys would share.
//! 3. A big jobs table: `--job-rows` completed jobs (with their payloads) finished two days
//!    ago. What one dashboard sample of [`Queue::counts`] takes, against the `group by state`
//!    it replaced; then the worker drains a backlog while a [`Pruner`] with
//!    [`Pruner::jobs`] deletes the completed jobs past a day, and the worker's jobs per second
//!    are measured over `--window` before and during the prune.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use jobguard::retention::{PruneConfig, RetentionConfig};
use jobguard::{
    GuardConfig, Job, JobError, JobKey, KeyError, Pruner, Queue, RetryPolicy, TableName, Worker,
    WorkerConfig,
};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{ConnectOptions, Executor, PgPool, Postgres};

use crate::args::parse_duration;
use crate::database::{DEFAULT_URL, Database, redact};
use crate::report;

const JOBS: &str = "jobguard_bench_prune_jobs";
const GUARD: &str = "jobguard_bench_prune_guard";
const LEDGER: &str = "jobguard_bench_prune_ledger";
const KIND: &str = "bench-prune-credit";

/// Arguments of `jobguard bench prune`.
#[derive(Args, Debug)]
pub struct BenchPruneArgs {
    /// Old guard rows to prune while the worker runs jobs.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    rows: u64,
    /// Jobs waiting when the worker starts, enough to keep it busy through both windows and
    /// the prune.
    #[arg(long, default_value_t = 400_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    backlog: u64,
    /// How long the worker's throughput is measured before the prune, and again after it.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    window: Duration,
    /// Guard rows for the table-size measurement; 0 skips it.
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    big_rows: u64,
    /// Jobs drained with the empty and with the big guard table.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    jobs: u64,
    /// Completed jobs in the jobs table for its measurement; 0 skips it.
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    job_rows: u64,
    /// Jobs run at once by the worker.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    concurrency: u32,
    /// Rows deleted per prune statement.
    #[arg(long, default_value_t = PruneConfig::DEFAULT_BATCH, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: u32,
    /// The pause between prune batches.
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    pause: Duration,
    /// postgres://user@host/db.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    database_url: String,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
}

/// The benchmark's result, as printed by `--json`.
#[derive(Debug, Serialize)]
pub struct PruneBenchReport {
    pub database: String,
    pub concurrency: u32,
    pub batch: u32,
    pub pause_ms: f64,
    pub prune: PruneUnderLoad,
    pub table_size: Option<TableSize>,
    pub jobs_table: Option<JobsTable>,
}

/// A big jobs table: counting it, and pruning its completed jobs under load.
#[derive(Debug, Serialize)]
pub struct JobsTable {
    /// Completed jobs inserted two days old, and deleted by the prune.
    pub rows: u64,
    pub fill_seconds: f64,
    /// The median of ten [`Queue::counts`] samples, and of ten `group by state` counts.
    pub counts_ms: f64,
    pub group_by_ms: f64,
    pub pruned: u64,
    pub batches: u64,
    pub prune_seconds: f64,
    pub rows_per_s: f64,
    /// The worker's jobs per second before and during the prune.
    pub before_jobs_per_s: f64,
    pub during_jobs_per_s: f64,
    /// during / before.
    pub ratio: f64,
}

/// Pruning while the worker runs jobs.
#[derive(Debug, Serialize)]
pub struct PruneUnderLoad {
    /// Old rows inserted, and deleted by the prune.
    pub rows: u64,
    pub pruned: u64,
    pub batches: u64,
    pub prune_seconds: f64,
    pub rows_per_s: f64,
    /// The worker's jobs per second before, during and after the prune.
    pub before_jobs_per_s: f64,
    pub during_jobs_per_s: f64,
    pub after_jobs_per_s: f64,
    /// during / before.
    pub ratio: f64,
}

/// Guarded jobs per second with an empty and with a big guard table.
#[derive(Debug, Serialize)]
pub struct TableSize {
    pub rows: u64,
    pub jobs: u64,
    pub fill_seconds: f64,
    pub empty_jobs_per_s: f64,
    pub full_jobs_per_s: f64,
    /// full / empty.
    pub ratio: f64,
}

/// Counts the effects applied, without a query: read between measurements.
static APPLIED: AtomicU64 = AtomicU64::new(0);

/// A credit keyed by a hash, appending to the benchmark's ledger.
#[derive(Serialize, Deserialize)]
struct PruneCredit {
    n: u64,
    key: String,
}

impl Job<Postgres> for PruneCredit {
    const KIND: &'static str = KIND;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("bench-credit", [&self.key])
    }

    async fn run(&self, conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "insert into {LEDGER} (account, amount) values (7, 500)"
        )))
        .execute(conn)
        .await?;
        APPLIED.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Runs `jobguard bench prune`.
pub async fn run(args: BenchPruneArgs) -> anyhow::Result<std::process::ExitCode> {
    let checked = match Database::connect(&args.database_url, 1).await? {
        Database::Postgres(pool) => pool,
        Database::Sqlite(_) => {
            bail!("`jobguard bench prune` measures PostgreSQL: give --database-url postgres://...")
        }
    };
    // The setup's bulk statements are slow on purpose: no slow-statement warnings for them.
    let options = (*checked.connect_options())
        .clone()
        .disable_statement_logging();
    checked.close().await;
    let pool = PgPoolOptions::new()
        .max_connections(args.concurrency + 6)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await?;
    let prune = prune_under_load(&pool, &args).await?;
    let table_size = if args.big_rows > 0 {
        Some(table_size(&pool, &args).await?)
    } else {
        None
    };
    let jobs_table = if args.job_rows > 0 {
        Some(jobs_table(&pool, &args).await?)
    } else {
        None
    };
    drop_tables(&pool).await?;
    let report = PruneBenchReport {
        database: redact(&args.database_url),
        concurrency: args.concurrency,
        batch: args.batch,
        pause_ms: args.pause.as_secs_f64() * 1000.0,
        prune,
        table_size,
        jobs_table,
    };
    report::print(&report, args.json, render)?;
    Ok(std::process::ExitCode::SUCCESS)
}

async fn prune_under_load(pool: &PgPool, args: &BenchPruneArgs) -> anyhow::Result<PruneUnderLoad> {
    let queue = reset(pool).await?;
    progress(args, &format!("inserting {} old guard rows", args.rows));
    execute(
        pool,
        &format!(
            "insert into {GUARD} (job_key, kind, claim_token, applied_at)
             select 'bench-credit:' || md5('old-' || n), 'bench-old', '\\x00'::bytea,
                    now() - interval '30 days' + n * interval '1 millisecond'
             from generate_series(1, {}) n",
            args.rows
        ),
    )
    .await?;
    enqueue(pool, "load", args.backlog).await?;
    settle(pool).await?;

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = worker(&queue, args.concurrency, false)?;
    let running = tokio::spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    progress(args, "worker running; warming up");
    tokio::time::sleep(Duration::from_secs(2)).await;

    let before = rate(args.window).await;
    progress(
        args,
        &format!("{before:.0} jobs/s before the prune; pruning"),
    );
    let retention =
        RetentionConfig::default().validate(&RetryPolicy::default(), Duration::from_secs(30))?;
    let guard = queue.guard(GuardConfig::default().table(TableName::new(GUARD)?))?;
    let pruner = Pruner::new(&guard, retention)
        .batch(args.batch)
        .pause(args.pause);
    let (applied, started) = (APPLIED.load(Ordering::Relaxed), Instant::now());
    let report = pruner
        .run()
        .await?
        .context("another pruner holds the benchmark's guard table")?;
    let prune_seconds = started.elapsed().as_secs_f64();
    let during = (APPLIED.load(Ordering::Relaxed) - applied) as f64 / prune_seconds;
    progress(args, &format!("{during:.0} jobs/s during the prune"));
    let after = rate(args.window).await;

    let _ = stop.send(());
    let stats = running.await??;
    if stats.failed + stats.dead > 0 {
        bail!("the benchmark's jobs failed: {stats:?}");
    }
    let waiting: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "select count(*) from {JOBS} where state = 'available'"
    )))
    .fetch_one(pool)
    .await?;
    if waiting == 0 {
        bail!("the backlog ran out during the measurement: raise --backlog");
    }
    Ok(PruneUnderLoad {
        rows: args.rows,
        pruned: report.guard_rows,
        batches: report.batches,
        prune_seconds,
        rows_per_s: report.guard_rows as f64 / prune_seconds,
        before_jobs_per_s: before,
        during_jobs_per_s: during,
        after_jobs_per_s: after,
        ratio: during / before,
    })
}

async fn table_size(pool: &PgPool, args: &BenchPruneArgs) -> anyhow::Result<TableSize> {
    let queue = reset(pool).await?;
    enqueue(pool, "empty", args.jobs).await?;
    settle(pool).await?;
    let empty = drain(&queue, args).await?;
    progress(args, &format!("{empty:.0} jobs/s on an empty guard table"));

    let queue = reset(pool).await?;
    progress(args, &format!("inserting {} guard rows", args.big_rows));
    let started = Instant::now();
    // Spread over the last 11 days or so: all of them within a 14-day retention.
    execute(
        pool,
        &format!(
            "insert into {GUARD} (job_key, kind, claim_token, applied_at)
             select 'bench-credit:' || md5('fill-' || n), '{KIND}', '\\x00'::bytea,
                    now() - n * interval '100 milliseconds'
             from generate_series(1, {}) n",
            args.big_rows
        ),
    )
    .await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    enqueue(pool, "full", args.jobs).await?;
    settle(pool).await?;
    let full = drain(&queue, args).await?;
    progress(
        args,
        &format!("{full:.0} jobs/s with {} guard rows", args.big_rows),
    );
    Ok(TableSize {
        rows: args.big_rows,
        jobs: args.jobs,
        fill_seconds,
        empty_jobs_per_s: empty,
        full_jobs_per_s: full,
        ratio: full / empty,
    })
}

async fn jobs_table(pool: &PgPool, args: &BenchPruneArgs) -> anyhow::Result<JobsTable> {
    let queue = reset(pool).await?;
    progress(args, &format!("inserting {} completed jobs", args.job_rows));
    let started = Instant::now();
    execute(
        pool,
        &format!(
            "insert into {JOBS} (kind, job_key, queue, payload, state, attempt, max_attempts,
                                 finished_at)
             select '{KIND}', 'bench-credit:' || h, 'default',
                    jsonb_build_object('n', n, 'key', h), 'completed', 1, 10,
                    now() - interval '2 days' + n * interval '1 millisecond'
             from generate_series(1, {}) n, md5('done-' || n) h",
            args.job_rows
        ),
    )
    .await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    enqueue(pool, "jobs", args.backlog).await?;
    settle(pool).await?;

    let counts_ms = median_ms(async || {
        queue.counts().await?;
        Ok(())
    })
    .await?;
    let group_by = format!("select state, count(*) from {JOBS} group by state");
    let group_by_ms = median_ms(async || {
        pool.execute(sqlx::AssertSqlSafe(group_by.clone())).await?;
        Ok(())
    })
    .await?;
    progress(
        args,
        &format!("counts: {counts_ms:.2} ms; group by state: {group_by_ms:.0} ms"),
    );

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = worker(&queue, args.concurrency, false)?;
    let running = tokio::spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rate(args.window).await;
    progress(
        args,
        &format!("{before:.0} jobs/s before; pruning the completed jobs"),
    );
    let retention = RetentionConfig {
        keep_completed: Duration::from_secs(24 * 3600),
        ..RetentionConfig::default()
    }
    .validate(&RetryPolicy::default(), Duration::from_secs(30))?;
    let guard = queue.guard(GuardConfig::default().table(TableName::new(GUARD)?))?;
    let pruner = Pruner::new(&guard, retention)
        .jobs(&queue)
        .batch(args.batch)
        .pause(args.pause);
    let started = Instant::now();
    let pruning = tokio::spawn(async move { pruner.run().await });
    // The worker's rate over the first window of the prune; then the prune runs alone, so that
    // the backlog need not outlast it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = rate(args.window).await;
    let pruned_while_measured = !pruning.is_finished();
    let _ = stop.send(());
    let stats = running.await??;
    if stats.failed + stats.dead > 0 {
        bail!("the benchmark's jobs failed: {stats:?}");
    }
    let report = pruning
        .await??
        .context("another pruner holds the benchmark's guard table")?;
    let prune_seconds = started.elapsed().as_secs_f64();
    if !pruned_while_measured {
        bail!("the prune ended before the measurement did: raise --job-rows or shorten --window");
    }
    progress(
        args,
        &format!(
            "{during:.0} jobs/s during; {} completed jobs pruned in {prune_seconds:.1} s",
            report.completed_jobs
        ),
    );
    Ok(JobsTable {
        rows: args.job_rows,
        fill_seconds,
        counts_ms,
        group_by_ms,
        // The worker's own jobs completed meanwhile are younger than a day: not pruned.
        pruned: report.completed_jobs,
        batches: report.batches,
        prune_seconds,
        rows_per_s: report.completed_jobs as f64 / prune_seconds,
        before_jobs_per_s: before,
        during_jobs_per_s: during,
        ratio: during / before,
    })
}

/// The median time of ten runs of `run`, in milliseconds.
async fn median_ms(mut run: impl AsyncFnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let mut times = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        run().await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The worker's effects per second over `window`.
async fn rate(window: Duration) -> f64 {
    let (applied, started) = (APPLIED.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(window).await;
    (APPLIED.load(Ordering::Relaxed) - applied) as f64 / started.elapsed().as_secs_f64()
}

/// Drains the queue; jobs per second.
async fn drain(queue: &Queue<Postgres>, args: &BenchPruneArgs) -> anyhow::Result<f64> {
    let worker = worker(queue, args.concurrency, true)?;
    let started = Instant::now();
    let stats = worker.run(std::future::pending()).await?;
    let seconds = started.elapsed().as_secs_f64();
    if stats.failed + stats.dead > 0 || stats.applied != args.jobs {
        bail!("the benchmark's jobs did not each apply once: {stats:?}");
    }
    Ok(args.jobs as f64 / seconds)
}

fn worker(
    queue: &Queue<Postgres>,
    concurrency: u32,
    stop_when_idle: bool,
) -> anyhow::Result<Worker<Postgres>> {
    let config = WorkerConfig {
        concurrency: concurrency as usize,
        stop_when_idle,
        poll_interval: Duration::from_millis(20),
        guard: GuardConfig::default().table(TableName::new(GUARD)?),
        // The benchmark prunes by itself, when it measures.
        prune: PruneConfig {
            schedule: None,
            ..PruneConfig::default()
        },
        ..WorkerConfig::default()
    };
    Ok(Worker::with_config(queue.clone(), config)?.register::<PruneCredit>())
}

/// Fresh tables: the queue, the guard and the ledger.
async fn reset(pool: &PgPool) -> anyhow::Result<Queue<Postgres>> {
    drop_tables(pool).await?;
    execute(
        pool,
        &format!("create table {LEDGER} (account bigint not null, amount bigint not null)"),
    )
    .await?;
    let queue = Queue::with_table(pool.clone(), TableName::new(JOBS)?)?;
    queue.migrate().await?;
    queue
        .guard(GuardConfig::default().table(TableName::new(GUARD)?))?
        .migrate()
        .await?;
    Ok(queue)
}

async fn drop_tables(pool: &PgPool) -> anyhow::Result<()> {
    for table in [JOBS, GUARD, LEDGER] {
        execute(pool, &format!("drop table if exists {table}")).await?;
    }
    Ok(())
}

/// `jobs` available credit jobs, keyed by hashes tagged with `tag`, inserted in one statement.
async fn enqueue(pool: &PgPool, tag: &str, jobs: u64) -> anyhow::Result<()> {
    execute(
        pool,
        &format!(
            "insert into {JOBS} (kind, job_key, queue, payload, state, max_attempts)
             select '{KIND}', 'bench-credit:' || h, 'default',
                    jsonb_build_object('n', n, 'key', h), 'available', 10
             from generate_series(1, {jobs}) n, md5('{tag}-' || n) h"
        ),
    )
    .await
}

/// Vacuums and analyzes the tables just filled, and checkpoints, so that neither hint bits,
/// stale statistics nor a checkpoint of the fill land in a measurement.
async fn settle(pool: &PgPool) -> anyhow::Result<()> {
    execute(pool, &format!("vacuum analyze {GUARD}, {JOBS}")).await?;
    if let Err(error) = pool.execute("checkpoint").await {
        tracing::debug!(%error, "checkpoint refused (not a superuser?); measuring anyway");
    }
    Ok(())
}

async fn execute(pool: &PgPool, sql: &str) -> anyhow::Result<()> {
    pool.execute(sqlx::AssertSqlSafe(sql.to_owned()))
        .await
        .with_context(|| format!("benchmark setup failed: {sql}"))?;
    Ok(())
}

fn progress(args: &BenchPruneArgs, message: &str) {
    if !args.json {
        eprintln!("bench prune: {message}");
    }
}

/// The human-readable report.
pub fn render(report: &PruneBenchReport) -> String {
    let p = &report.prune;
    let mut out = format!(
        "jobguard bench prune on {}: worker with {} jobs at once; prune batches of {} rows, \
         {:.0} ms apart\n\
         prune under load: {} old guard rows deleted in {:.2} s ({:.0} rows/s, {} batches)\n\
         \x20 worker before the prune {:>10.0} jobs/s\n\
         \x20 worker during the prune {:>10.0} jobs/s   ratio during/before: {:.3}\n\
         \x20 worker after the prune  {:>10.0} jobs/s\n",
        report.database,
        report.concurrency,
        report.batch,
        report.pause_ms,
        p.pruned,
        p.prune_seconds,
        p.rows_per_s,
        p.batches,
        p.before_jobs_per_s,
        p.during_jobs_per_s,
        p.ratio,
        p.after_jobs_per_s,
    );
    if let Some(t) = &report.table_size {
        out += &format!(
            "table size: {} guarded jobs drained each time\n\
             \x20 empty guard table       {:>10.0} jobs/s\n\
             \x20 {:>10} guard rows   {:>10.0} jobs/s   ratio full/empty: {:.3} (filled in {:.0} s)\n",
            t.jobs, t.empty_jobs_per_s, t.rows, t.full_jobs_per_s, t.ratio, t.fill_seconds,
        );
    }
    if let Some(j) = &report.jobs_table {
        out += &format!(
            "jobs table: {} completed jobs (filled in {:.0} s)\n\
             \x20 one counts sample       {:>10.2} ms   (group by state: {:.0} ms)\n\
             \x20 pruned {} completed jobs in {:.1} s ({:.0} rows/s, {} batches)\n\
             \x20 worker before the prune {:>10.0} jobs/s\n\
             \x20 worker during the prune {:>10.0} jobs/s   ratio during/before: {:.3}\n",
            j.rows,
            j.fill_seconds,
            j.counts_ms,
            j.group_by_ms,
            j.pruned,
            j.prune_seconds,
            j.rows_per_s,
            j.batches,
            j.before_jobs_per_s,
            j.during_jobs_per_s,
            j.ratio,
        );
    }
    out
}
