//! `jobguard bench soak`, on PostgreSQL: whether the tables stay the same size under a steady
//! load. A producer enqueues `--rate` jobs a second for `--duration`, a worker runs them (each
//! claiming its key in the guard table as it completes), and every `--prune-every` a
//! [`Pruner`] deletes the guard rows and completed jobs older than `--keep`. After each prune
//! the report reads both tables' rows, live and dead tuples, and heap and index bytes. With a
//! retention of seconds instead of days, many prune cycles fit into minutes: the retention is
//! far below the horizon a real deployment needs, on purpose, and only here.
//!
//! Pruning deletes; autovacuum makes the space reusable. On a server with `autovacuum = off`
//! the soak vacuums both tables after each prune itself, as autovacuum would, and says so:
//! without either, dead tuples pile up whatever the pruner does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use jobguard::queue::NewJob;
use jobguard::retention::{PruneConfig, RetentionConfig};
use jobguard::{
    GuardConfig, Job, JobError, JobKey, KeyError, Pruner, Queue, RetryPolicy, TableName, Worker,
    WorkerConfig,
};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, Postgres};

use crate::args::parse_duration;
use crate::database::{DEFAULT_URL, Database, redact};
use crate::report;

const JOBS: &str = "jobguard_bench_soak_jobs";
const GUARD: &str = "jobguard_bench_soak_guard";

/// Arguments of `jobguard bench soak`.
#[derive(Args, Debug)]
pub struct BenchSoakArgs {
    /// How long the load lasts.
    #[arg(long, default_value = "3m", value_parser = parse_duration)]
    duration: Duration,
    /// Jobs enqueued per second.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rate: u32,
    /// Guard rows and completed jobs older than this are pruned.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    keep: Duration,
    /// How often the pruner runs.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    prune_every: Duration,
    /// Jobs run at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    concurrency: u32,
    /// postgres://user@host/db.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    database_url: String,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
}

/// One table after one prune.
#[derive(Clone, Debug, Serialize)]
pub struct TableSize {
    pub rows: i64,
    pub live_tuples: i64,
    pub dead_tuples: i64,
    pub heap_bytes: i64,
    pub index_bytes: i64,
}

/// The tables after one prune cycle.
#[derive(Debug, Serialize)]
pub struct Cycle {
    pub seconds: f64,
    pub applied: u64,
    pub pruned_guard_rows: u64,
    pub pruned_jobs: u64,
    pub jobs: TableSize,
    pub guard: TableSize,
}

/// What `jobguard bench soak --json` prints.
#[derive(Debug, Serialize)]
pub struct SoakReport {
    pub database: String,
    pub rate: u32,
    pub keep_s: f64,
    pub prune_every_s: f64,
    /// Whether the server runs autovacuum; when it does not, the soak vacuums the two tables
    /// after each prune.
    pub autovacuum: bool,
    pub cycles: Vec<Cycle>,
    /// The largest total bytes (both tables, heap and indexes) of the second half of the
    /// cycles over the largest of the first half: about 1 when the sizes level off.
    pub growth: f64,
    pub levels_off: bool,
}

/// The soak's job: nothing but the queue and the guard.
#[derive(Serialize, Deserialize)]
struct SoakJob {
    run: u64,
    n: u64,
}

static APPLIED: AtomicU64 = AtomicU64::new(0);

impl Job<Postgres> for SoakJob {
    const KIND: &'static str = "bench-soak";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("bench-soak", [self.run.to_string(), self.n.to_string()])
    }

    async fn run(&self, _conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
        APPLIED.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Runs the soak and prints its report.
pub async fn run(args: BenchSoakArgs) -> anyhow::Result<std::process::ExitCode> {
    let database = Database::connect(&args.database_url, args.concurrency + 4).await?;
    let Database::Postgres(pool) = database else {
        bail!("bench soak measures PostgreSQL's tables: give a postgres:// --database-url");
    };
    let report = soak(&pool, &args).await?;
    pool.close().await;
    report::print(&report, args.json, render)?;
    Ok(std::process::ExitCode::SUCCESS)
}

async fn soak(pool: &PgPool, args: &BenchSoakArgs) -> anyhow::Result<SoakReport> {
    for table in [JOBS, GUARD] {
        sqlx::query(sqlx::AssertSqlSafe(format!("drop table if exists {table}")))
            .execute(pool)
            .await?;
    }
    let queue = Queue::with_table(pool.clone(), TableName::new(JOBS)?)?;
    queue.migrate().await?;
    let guard_config = GuardConfig::default().table(TableName::new(GUARD)?);
    let guard = queue.guard(guard_config.clone())?;
    guard.migrate().await?;
    let retention = RetentionConfig {
        keep: args.keep,
        keep_completed: args.keep,
        override_horizon: true,
        ..RetentionConfig::default()
    }
    .validate(&RetryPolicy::default(), Duration::from_secs(30))?;
    let pruner = Pruner::new(&guard, retention.clone()).jobs(&queue);
    let config = WorkerConfig {
        concurrency: args.concurrency as usize,
        guard: guard_config,
        retention: RetentionConfig {
            keep: args.keep,
            keep_completed: args.keep,
            override_horizon: true,
            ..RetentionConfig::default()
        },
        // The soak prunes by itself, on its own clock.
        prune: PruneConfig {
            schedule: None,
            ..PruneConfig::default()
        },
        ..WorkerConfig::default()
    };
    let worker = Worker::with_config(queue.clone(), config)?.register::<SoakJob>();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut worker_stopped = stopped.clone();
    let running = tokio::spawn(worker.run(async move {
        let _ = worker_stopped.wait_for(|stop| *stop).await;
    }));
    let producer = tokio::spawn(produce(queue.clone(), args.rate, stopped));

    let autovacuum: String = sqlx::query_scalar("show autovacuum")
        .fetch_one(pool)
        .await?;
    let autovacuum = autovacuum == "on";
    if !autovacuum && !args.json {
        eprintln!(
            "autovacuum is off on this server: the soak vacuums both tables after each prune"
        );
    }
    let started = Instant::now();
    let mut cycles = Vec::new();
    while started.elapsed() < args.duration {
        tokio::time::sleep(args.prune_every).await;
        let report = pruner.run().await?;
        if !autovacuum {
            sqlx::query(sqlx::AssertSqlSafe(format!("vacuum {JOBS}, {GUARD}")))
                .execute(pool)
                .await?;
        }
        let (guard_rows, jobs) = report.map_or((0, 0), |r| (r.guard_rows, r.completed_jobs));
        let cycle = Cycle {
            seconds: started.elapsed().as_secs_f64(),
            applied: APPLIED.load(Ordering::Relaxed),
            pruned_guard_rows: guard_rows,
            pruned_jobs: jobs,
            jobs: size(pool, JOBS).await?,
            guard: size(pool, GUARD).await?,
        };
        if !args.json {
            eprintln!("{}", render_cycle(&cycle));
        }
        cycles.push(cycle);
    }
    let _ = stop.send(true);
    producer.await??;
    let stats = running.await??;
    if stats.failed + stats.dead > 0 {
        bail!("the soak's jobs failed: {stats:?}");
    }
    let total = |cycle: &Cycle| {
        (cycle.jobs.heap_bytes
            + cycle.jobs.index_bytes
            + cycle.guard.heap_bytes
            + cycle.guard.index_bytes) as f64
    };
    let half = cycles.len() / 2;
    let largest = |cycles: &[Cycle]| cycles.iter().map(total).fold(0.0, f64::max);
    let growth = if half == 0 {
        1.0
    } else {
        largest(&cycles[half..]) / largest(&cycles[..half]).max(1.0)
    };
    Ok(SoakReport {
        database: redact(&args.database_url),
        rate: args.rate,
        keep_s: args.keep.as_secs_f64(),
        prune_every_s: args.prune_every.as_secs_f64(),
        autovacuum,
        levels_off: growth <= 1.25,
        growth,
        cycles,
    })
}

/// Enqueues `rate` jobs a second, credited on the elapsed time, every 10 ms, until stopped.
async fn produce(
    queue: Queue<Postgres>,
    rate: u32,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let run = super::jobs::epoch_micros();
    let started = Instant::now();
    let mut sent = 0u64;
    loop {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
            _ = stopped.wait_for(|stop| *stop) => return Ok(()),
        }
        let due = (started.elapsed().as_secs_f64() * f64::from(rate)) as u64;
        if due == sent {
            continue;
        }
        let jobs = (sent..due)
            .map(|n| NewJob::from_job::<Postgres, _>(&SoakJob { run, n }))
            .collect::<jobguard::Result<Vec<_>>>()?;
        queue.enqueue_many(&jobs).await?;
        sent = due;
    }
}

/// Rows, tuples and bytes of `table`.
async fn size(pool: &PgPool, table: &str) -> anyhow::Result<TableSize> {
    let sql = format!(
        "select (select count(*) from {table}) as rows,
                coalesce(s.n_live_tup, 0) as live_tuples, coalesce(s.n_dead_tup, 0) as dead_tuples,
                pg_table_size('{table}'::regclass) as heap_bytes,
                pg_indexes_size('{table}'::regclass) as index_bytes
         from (select 1) one
         left join pg_stat_user_tables s on s.relid = '{table}'::regclass"
    );
    let (rows, live_tuples, dead_tuples, heap_bytes, index_bytes) =
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_one(pool)
            .await?;
    Ok(TableSize {
        rows,
        live_tuples,
        dead_tuples,
        heap_bytes,
        index_bytes,
    })
}

fn megabytes(bytes: i64) -> f64 {
    bytes as f64 / 1_048_576.0
}

fn render_cycle(cycle: &Cycle) -> String {
    format!(
        "{:>6.0} s  applied {:>8}  pruned {:>7} guard rows, {:>7} jobs  |  jobs {:>7} rows \
         ({:>6} dead) {:>6.1} + {:>6.1} MB  |  guard {:>7} rows ({:>6} dead) {:>6.1} + {:>6.1} MB",
        cycle.seconds,
        cycle.applied,
        cycle.pruned_guard_rows,
        cycle.pruned_jobs,
        cycle.jobs.rows,
        cycle.jobs.dead_tuples,
        megabytes(cycle.jobs.heap_bytes),
        megabytes(cycle.jobs.index_bytes),
        cycle.guard.rows,
        cycle.guard.dead_tuples,
        megabytes(cycle.guard.heap_bytes),
        megabytes(cycle.guard.index_bytes),
    )
}

/// The human-readable report.
pub fn render(report: &SoakReport) -> String {
    let mut out = format!(
        "{} jobs/s on {}, retention {:.0} s, a prune every {:.0} s{} (heap + index MB)\n",
        report.rate,
        report.database,
        report.keep_s,
        report.prune_every_s,
        if report.autovacuum {
            ""
        } else {
            ", each followed by a vacuum (autovacuum is off)"
        }
    );
    for cycle in &report.cycles {
        out.push_str(&render_cycle(cycle));
        out.push('\n');
    }
    out.push_str(&format!(
        "largest size of the second half over the first: {:.2} ({})\n",
        report.growth,
        if report.levels_off {
            "levels off"
        } else {
            "still growing"
        }
    ));
    out
}
