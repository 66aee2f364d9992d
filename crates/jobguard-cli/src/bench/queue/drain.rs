//! The benchmark's tables, and draining them: jobs enqueued in chunks (not timed), then run by
//! one worker until the queue is empty (timed).

use std::time::{Duration, Instant};

use anyhow::bail;
use jobguard::periodic::{Periodic, Scheduler};
use jobguard::queue::NewJob;
use jobguard::{Backend, GuardConfig, Queue, TableName, Worker, WorkerConfig, WorkerStats};
use sqlx::{Executor, Pool};

use crate::bench::jobs::{BenchCredit, BenchNoop, BenchPickup};
use crate::demo::ledger::{BENCH_LEDGER, LedgerDb};

pub const JOBS: &str = "jobguard_bench_jobs";
pub const GUARD: &str = "jobguard_bench_processed_jobs";
pub const LEDGER: &str = BENCH_LEDGER;
pub const PGBENCH_JOBS: &str = "jobguard_bench_pgbench_jobs";
pub const PGBENCH_GUARD: &str = "jobguard_bench_pgbench_processed_jobs";
/// The schedules table of [`JOBS`].
pub const SCHEDULES: &str = "jobguard_bench_jobs_schedules";

/// Jobs per `enqueue_many` call: one statement each, and few enough for SQLite's JSON array.
const ENQUEUE_CHUNK: usize = 5_000;

/// How often an idle worker of the drains, and of SQLite's pickup runs, looks for jobs. On
/// SQLite, which has no notifications, it bounds the pickup latency of every job.
pub const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// How long a batch the fetch left short waits for more jobs: the worker's default.
pub const BATCH_LINGER: Duration = Duration::from_millis(2);

/// How a benchmark worker runs: `concurrency` jobs or batches at once, batchable kinds up to
/// `batch_size` per transaction, and `periodic` schedules firing every second beside its
/// loop (each firing a no-op job), for the cost of scheduling.
#[derive(Clone, Copy, Debug)]
pub struct WorkerShape {
    pub concurrency: u32,
    pub batch_size: usize,
    pub periodic: u32,
}

/// Opens every connection of the pool before anything is timed: the pool opens them as they
/// are first wanted, which would otherwise fall into the first run (a TLS handshake each on
/// PostgreSQL).
pub async fn warm_up<DB: Backend>(pool: &Pool<DB>) -> anyhow::Result<()> {
    let connections = pool.options().get_max_connections() as usize;
    let opened = futures::future::try_join_all((0..connections).map(|_| pool.acquire())).await?;
    drop(opened);
    Ok(())
}

/// Drops the benchmark's tables and creates its queue, guard and ledger, empty.
pub async fn reset<DB: LedgerDb>(pool: &Pool<DB>) -> anyhow::Result<Queue<DB>>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let mut conn = pool.acquire().await?;
    for table in [JOBS, GUARD, LEDGER, PGBENCH_JOBS, PGBENCH_GUARD, SCHEDULES] {
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
    Scheduler::new(queue.clone(), Vec::new())?.migrate().await?;
    Ok(queue)
}

fn guard_config() -> anyhow::Result<GuardConfig> {
    Ok(GuardConfig::default().table(TableName::new(GUARD)?))
}

/// Enqueues jobs `0..jobs` with one `enqueue_many` per chunk; not timed.
pub async fn enqueue<DB: Backend>(
    queue: &Queue<DB>,
    jobs: usize,
    job: impl Fn(u64) -> jobguard::Result<NewJob>,
) -> anyhow::Result<()> {
    for start in (0..jobs).step_by(ENQUEUE_CHUNK) {
        let end = (start + ENQUEUE_CHUNK).min(jobs);
        let chunk = (start as u64..end as u64)
            .map(&job)
            .collect::<jobguard::Result<Vec<_>>>()?;
        queue.enqueue_many(&chunk).await?;
    }
    Ok(())
}

/// A worker on `queue` that runs every benchmark kind.
pub fn worker<DB: LedgerDb>(
    queue: &Queue<DB>,
    shape: WorkerShape,
    stop_when_idle: bool,
    poll_interval: Duration,
) -> anyhow::Result<Worker<DB>> {
    let config = WorkerConfig {
        concurrency: shape.concurrency as usize,
        batch_size: shape.batch_size,
        batch_linger: BATCH_LINGER,
        stop_when_idle,
        poll_interval,
        guard: guard_config()?,
        ..WorkerConfig::default()
    };
    let mut worker = Worker::with_config(queue.clone(), config)?
        .register::<BenchNoop>()
        .register::<BenchCredit>()
        .register::<BenchPickup>();
    for n in 0..shape.periodic {
        let name = format!("bench-periodic-{n}");
        let noop = BenchNoop { n: u64::from(n) };
        let every_second = Periodic::new(&name, "* * * * * *", "bench-noop", &noop)?;
        worker = worker.schedule(every_second);
    }
    Ok(worker)
}

/// Runs the queue empty with one worker; the seconds it took, and what the worker counted.
pub async fn drain<DB: LedgerDb>(
    queue: &Queue<DB>,
    shape: WorkerShape,
) -> anyhow::Result<(f64, WorkerStats)> {
    let worker = worker(queue, shape, true, POLL_INTERVAL)?;
    let started = Instant::now();
    let stats = worker.run(std::future::pending()).await?;
    let seconds = started.elapsed().as_secs_f64();
    check(&stats)?;
    Ok((seconds, stats))
}

/// Fails when a benchmark job failed: the figures would not be of the path measured.
pub fn check(stats: &WorkerStats) -> anyhow::Result<()> {
    if stats.failed + stats.dead > 0 {
        bail!("the benchmark's jobs failed: {stats:?}");
    }
    Ok(())
}
