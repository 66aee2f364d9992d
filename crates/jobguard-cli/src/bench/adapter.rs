//! `jobguard bench adapter`: jobguard as a system of the public cross-system PostgreSQL job
//! queue benchmark (github.com/hardbyte/postgresql-job-queue-benchmarking), speaking its
//! adapter contract (`CONTRIBUTING_ADAPTERS.md`): its settings from the environment, JSONL
//! telemetry on stdout (a descriptor, then every `SAMPLE_EVERY_S` the pickup latency
//! percentiles over the last 30 s, the enqueue and completion rates and the queue depth), logs
//! on stderr, and a clean exit on SIGTERM.
//!
//! A producer enqueues jobs at `PRODUCER_RATE`, credited on the wall clock's elapsed time, or
//! as the harness paces it (`PRODUCER_PACING=harness`: one `enqueue_many` per `ENQUEUE <n>`
//! line on stdin), or up to `TARGET_DEPTH` waiting jobs (`PRODUCER_MODE=depth-target`). A
//! worker of `WORKER_COUNT` slots runs them: each job's run records how long ago its enqueue
//! was sent (the same process's clock), then works `JOB_WORK_MS`. Every job goes through
//! jobguard's whole path: the statement that completes it also claims its key in the guard
//! table, in the transaction its work runs in. The `batched` variant runs up to
//! `--batch-size` jobs per transaction.

mod window;

use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use jobguard::queue::NewJob;
use jobguard::{
    GuardConfig, Job, JobError, JobKey, KeyError, PruneConfig, PruneSchedule, Queue,
    RetentionConfig, TableName, Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{PgPool, Postgres};

use self::window::Window;
use super::jobs::epoch_micros;

/// The queue's table in the benchmark's database.
pub const JOBS: &str = "jobguard_adapter_jobs";
/// The guard's table.
pub const GUARD: &str = "jobguard_adapter_processed_jobs";

/// Arguments of `jobguard bench adapter`; everything else comes from the environment the
/// benchmark's harness sets.
#[derive(Args, Debug)]
pub struct BenchAdapterArgs {
    /// `per-job`: one job per transaction (the system `jobguard`); `batched`: up to
    /// --batch-size jobs per transaction (the system `jobguard-batched`).
    #[arg(long, value_enum, default_value_t = Variant::PerJob)]
    variant: Variant,
    /// Jobs per transaction of the batched variant.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(2..=1000))]
    batch_size: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Variant {
    PerJob,
    Batched,
}

impl Variant {
    fn system(self) -> &'static str {
        match self {
            Variant::PerJob => "jobguard",
            Variant::Batched => "jobguard-batched",
        }
    }
}

/// The harness's settings, read from the environment with the contract's defaults.
#[derive(Debug)]
struct Settings {
    database_url: String,
    depth_target: bool,
    harness_paced: bool,
    rate: f64,
    batch_max: usize,
    batch_ms: u64,
    target_depth: i64,
    workers: usize,
    payload_bytes: usize,
    work_ms: u64,
    sample_every: Duration,
    /// `BENCH_INSTANCE_ID`: which replica this is (0 without replicas), in every record.
    instance_id: u32,
    /// Whether this replica produces: all do, unless `PRODUCER_ONLY_INSTANCE_ZERO=1`.
    produces: bool,
    /// `PRODUCER_RATE_CONTROL_FILE`: the fixed rate, read again every tick (the harness's
    /// phases change it while the run goes on); `PRODUCER_RATE` while it is missing or
    /// unreadable.
    rate_control: Option<std::path::PathBuf>,
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let database_url = std::env::var("DATABASE_URL")
            .context("DATABASE_URL is not set: the benchmark's database")?;
        let scenario = var("SCENARIO", "long_horizon".to_owned())?;
        if scenario != "long_horizon" {
            bail!("SCENARIO={scenario} is not supported: only long_horizon is");
        }
        let mode = var("PRODUCER_MODE", "fixed".to_owned())?;
        let depth_target = match mode.as_str() {
            "fixed" => false,
            "depth-target" => true,
            other => bail!("PRODUCER_MODE={other}: expected fixed or depth-target"),
        };
        let pacing = var("PRODUCER_PACING", "adapter".to_owned())?;
        let harness_paced = match pacing.as_str() {
            "adapter" => false,
            "harness" => !depth_target,
            other => bail!("PRODUCER_PACING={other}: expected adapter or harness"),
        };
        let sample_every_s: u64 = var("SAMPLE_EVERY_S", 5)?;
        if sample_every_s == 0 {
            bail!("SAMPLE_EVERY_S=0: the samples need a cadence of at least a second");
        }
        let instance_id: u32 = var("BENCH_INSTANCE_ID", 0)?;
        let only_zero: u32 = var("PRODUCER_ONLY_INSTANCE_ZERO", 0)?;
        Ok(Settings {
            instance_id,
            produces: only_zero == 0 || instance_id == 0,
            rate_control: std::env::var_os("PRODUCER_RATE_CONTROL_FILE")
                .filter(|path| !path.is_empty())
                .map(Into::into),
            database_url,
            depth_target,
            harness_paced,
            rate: var("PRODUCER_RATE", 100.0)?,
            batch_max: var::<usize>("PRODUCER_BATCH_MAX", 128)?.max(1),
            batch_ms: var::<u64>("PRODUCER_BATCH_MS", 10)?.max(1),
            target_depth: var("TARGET_DEPTH", 1000)?,
            workers: var::<usize>("WORKER_COUNT", 16)?.max(1),
            payload_bytes: var("JOB_PAYLOAD_BYTES", 256)?,
            work_ms: var("JOB_WORK_MS", 1)?,
            sample_every: Duration::from_secs(sample_every_s),
        })
    }
}

impl Settings {
    /// The fixed rate now: the control file's number when it has one, else `PRODUCER_RATE`.
    fn current_rate(&self) -> f64 {
        self.rate_control
            .as_ref()
            .and_then(|path| std::fs::read_to_string(path).ok())
            .and_then(|text| text.trim().parse::<f64>().ok())
            .map_or(self.rate, |rate| rate.max(0.0))
    }
}

/// `name` from the environment, parsed, or `default` when unset or empty.
fn var<T: FromStr>(name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .parse()
            .map_err(|error| anyhow::anyhow!("{name}={text} is not valid: {error}")),
        _ => Ok(default),
    }
}

/// The benchmark's job: its run records its pickup latency, then works.
#[derive(Serialize, Deserialize)]
struct AdapterJob {
    /// The producer's run and the job's number in it: its key.
    run: u64,
    n: u64,
    /// When its enqueue was sent, in microseconds since the Unix epoch.
    enqueued_us: u64,
    work_ms: u64,
    /// Filler to the payload size the harness asked for.
    pad: String,
}

/// What the jobs report, shared with the sampler: they run in this process, and a job's run
/// has nothing but its payload and its transaction.
static COUNTERS: Counters = Counters::new();

struct Counters {
    latency: Mutex<Option<Window>>,
    enqueued: AtomicU64,
    completed: AtomicU64,
    /// The producer's `enqueue_many` calls, and the microseconds they took, for its log line.
    enqueue_calls: AtomicU64,
    enqueue_us: AtomicU64,
}

impl Counters {
    const fn new() -> Self {
        Counters {
            latency: Mutex::new(None),
            enqueued: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            enqueue_calls: AtomicU64::new(0),
            enqueue_us: AtomicU64::new(0),
        }
    }

    fn record_pickup(&self, waited_us: u64) {
        if let Some(window) = self.latency.lock().expect("not poisoned").as_mut() {
            window.record(waited_us);
        }
    }
}

impl Job<Postgres> for AdapterJob {
    const KIND: &'static str = "adapter-job";
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("adapter-job", [self.run.to_string(), self.n.to_string()])
    }

    async fn run(&self, _conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
        COUNTERS.record_pickup(epoch_micros().saturating_sub(self.enqueued_us));
        if self.work_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.work_ms)).await;
        }
        COUNTERS.completed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Runs the adapter until SIGTERM or Ctrl-C.
pub async fn run(args: BenchAdapterArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::from_env()?;
    let system = args.variant.system();
    *COUNTERS.latency.lock().expect("not poisoned") = Some(Window::new(Duration::from_secs(30)));
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(settings.workers as u32 + 4)
        .connect(&settings.database_url)
        .await
        .context("connect to DATABASE_URL")?;
    let queue = Queue::with_table(pool.clone(), TableName::new(JOBS)?)?;
    queue.migrate().await?;
    let guard = GuardConfig::default().table(TableName::new(GUARD)?);
    queue.guard(guard.clone())?.migrate().await?;
    emit(&descriptor(&pool, system, settings.instance_id).await?)?;

    let config = WorkerConfig {
        concurrency: settings.workers,
        batch_size: match args.variant {
            Variant::PerJob => 1,
            Variant::Batched => args.batch_size as usize,
        },
        shutdown_timeout: Duration::from_secs(2),
        guard,
        // What a deployment at this rate runs: no completed job kept (the guard rows are the
        // record of what was applied, kept for their retention), so the worker deletes each
        // job's row as it completes it and the jobs table stays near the jobs in flight; the
        // prune takes expired guard rows every minute (see docs/performance.md).
        retention: RetentionConfig {
            keep_completed: Duration::ZERO,
            ..RetentionConfig::default()
        },
        prune: PruneConfig {
            schedule: Some(PruneSchedule::new("* * * * *")?),
            ..PruneConfig::default()
        },
        ..WorkerConfig::default()
    };
    let worker = Worker::with_config(queue.clone(), config)?.register::<AdapterJob>();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let depth = Arc::new(AtomicU64::new(0));
    let settings = Arc::new(settings);
    let producer = tokio::spawn(produce(
        queue.clone(),
        Arc::clone(&settings),
        Arc::clone(&depth),
        stopped.clone(),
    ));
    let depth_poller = tokio::spawn(poll_depth(
        queue.clone(),
        Arc::clone(&depth),
        stopped.clone(),
    ));
    let sampler = tokio::spawn(sample(
        system,
        Arc::clone(&settings),
        Arc::clone(&depth),
        stopped.clone(),
    ));
    let mut worker_stopped = stopped.clone();
    let worker = tokio::spawn(worker.run(async move {
        let _ = worker_stopped.wait_for(|stop| *stop).await;
    }));

    jobguard::worker::shutdown_signal().await;
    eprintln!("jobguard bench adapter: stopping");
    let _ = stop.send(true);
    producer.await??;
    depth_poller.await?;
    sampler.await??;
    let stats = worker.await??;
    eprintln!("jobguard bench adapter: stopped, {stats:?}");
    pool.close().await;
    Ok(ExitCode::SUCCESS)
}

/// The startup descriptor: the system, its tables (in the schema the connection writes to) and
/// its version.
async fn descriptor(
    pool: &PgPool,
    system: &str,
    instance_id: u32,
) -> anyhow::Result<serde_json::Value> {
    let schema: String = sqlx::query_scalar("select current_schema()")
        .fetch_one(pool)
        .await?;
    let database: String = sqlx::query_scalar("select current_database()")
        .fetch_one(pool)
        .await?;
    Ok(json!({
        "kind": "descriptor",
        "system": system,
        "instance_id": instance_id,
        "event_tables": [format!("{schema}.{JOBS}"), format!("{schema}.{GUARD}")],
        "extensions": [],
        "version": env!("CARGO_PKG_VERSION"),
        "schema_version": env!("CARGO_PKG_VERSION"),
        "db_name": database,
        "started_at": timestamp(SystemTime::now()),
    }))
}

/// Enqueues as the settings say until stopped: every `PRODUCER_BATCH_MS`, the jobs the rate
/// credited since the last tick on the wall clock (up to `PRODUCER_BATCH_MAX` per call); or
/// one call per `ENQUEUE <n>` line; or up to the target depth.
async fn produce(
    queue: Queue<Postgres>,
    settings: Arc<Settings>,
    depth: Arc<AtomicU64>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    if !settings.produces {
        let _ = stopped.wait_for(|stop| *stop).await;
        return Ok(());
    }
    let run = epoch_micros();
    let pad = "x".repeat(settings.payload_bytes.saturating_sub(64));
    let mut n = 0u64;
    let mut tokens = settings.harness_paced.then(read_tokens);
    let mut credit = 0.0f64;
    let mut last_credit = Instant::now();
    let period = Duration::from_millis(settings.batch_ms);
    loop {
        let due = if let Some(tokens) = tokens.as_mut() {
            tokio::select! {
                token = tokens.recv() => match token {
                    Some(count) => count,
                    None => return Ok(()),
                },
                _ = stopped.wait_for(|stop| *stop) => return Ok(()),
            }
        } else {
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                _ = stopped.wait_for(|stop| *stop) => return Ok(()),
            }
            if settings.depth_target {
                (settings.target_depth - depth.load(Ordering::Relaxed) as i64).max(0) as usize
            } else {
                let now = Instant::now();
                let rate = settings.current_rate();
                credit += rate * now.duration_since(last_credit).as_secs_f64();
                last_credit = now;
                let whole = credit.floor();
                credit -= whole;
                whole as usize
            }
        };
        // Up to PRODUCER_CALLS calls of at most `PRODUCER_BATCH_MAX` jobs each at a time: one
        // call waits for its commit's WAL flush and its round trips, during which the database
        // has room for more (see docs/performance.md, the producer's cap).
        let mut left = due;
        let mut calls = Vec::with_capacity(PRODUCER_CALLS);
        while left > 0 {
            let count = left.min(settings.batch_max);
            let enqueued_us = epoch_micros();
            let jobs = (n..n + count as u64)
                .map(|n| {
                    NewJob::from_job::<Postgres, _>(&AdapterJob {
                        run,
                        n,
                        enqueued_us,
                        work_ms: settings.work_ms,
                        pad: pad.clone(),
                    })
                })
                .collect::<jobguard::Result<Vec<_>>>()?;
            n += count as u64;
            left -= count;
            let (queue, depth, depth_target) = (&queue, &depth, settings.depth_target);
            calls.push(async move {
                let call = Instant::now();
                queue.enqueue_many(&jobs).await?;
                COUNTERS.enqueue_calls.fetch_add(1, Ordering::Relaxed);
                COUNTERS
                    .enqueue_us
                    .fetch_add(call.elapsed().as_micros() as u64, Ordering::Relaxed);
                COUNTERS.enqueued.fetch_add(count as u64, Ordering::Relaxed);
                if depth_target {
                    depth.fetch_add(count as u64, Ordering::Relaxed);
                }
                Ok::<(), jobguard::Error>(())
            });
            if calls.len() == PRODUCER_CALLS || left == 0 {
                futures::future::try_join_all(calls.drain(..)).await?;
            }
        }
    }
}

/// How many `enqueue_many` calls the producer has in flight at most.
const PRODUCER_CALLS: usize = 4;

/// The counts of `ENQUEUE <n>` lines on stdin, read on a thread of their own; the channel
/// closes with stdin.
fn read_tokens() -> tokio::sync::mpsc::Receiver<usize> {
    let (sender, receiver) = tokio::sync::mpsc::channel(1024);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            let Some(count) = line.trim().strip_prefix("ENQUEUE ") else {
                continue;
            };
            match count.trim().parse::<usize>() {
                Ok(0) => {}
                Ok(count) => {
                    if sender.blocking_send(count).is_err() {
                        return;
                    }
                }
                Err(_) => eprintln!("jobguard bench adapter: ignored `{line}`"),
            }
        }
    });
    receiver
}

/// Reads the number of jobs waiting to run every 250 ms until stopped.
async fn poll_depth(
    queue: Queue<Postgres>,
    depth: Arc<AtomicU64>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        match queue.counts().await {
            Ok(counts) => depth.store(counts.available.max(0) as u64, Ordering::Relaxed),
            Err(error) => eprintln!("jobguard bench adapter: cannot count the queue: {error}"),
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
    }
}

/// Emits the samples every `SAMPLE_EVERY_S`, the first at the next wall-clock multiple of it,
/// and once more when stopped.
async fn sample(
    system: &'static str,
    settings: Arc<Settings>,
    depth: Arc<AtomicU64>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let every = settings.sample_every;
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let into_period = Duration::from_nanos((since_epoch.as_nanos() % every.as_nanos()) as u64);
    let first = tokio::time::Instant::now() + (every - into_period);
    let mut ticks = tokio::time::interval_at(first, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut enqueued, mut completed) = (0, 0);
    let mut last = Instant::now();
    loop {
        let last_tick = tokio::select! {
            _ = ticks.tick() => false,
            _ = stopped.wait_for(|stop| *stop) => true,
        };
        let now = Instant::now();
        let seconds = now.duration_since(last).as_secs_f64().max(1e-3);
        last = now;
        let (enqueued_now, completed_now) = (
            COUNTERS.enqueued.load(Ordering::Relaxed),
            COUNTERS.completed.load(Ordering::Relaxed),
        );
        let [p50, p95, p99] = COUNTERS
            .latency
            .lock()
            .expect("not poisoned")
            .as_mut()
            .map_or([0.0; 3], |window| window.quantiles_ms([0.50, 0.95, 0.99]));
        let t = timestamp(SystemTime::now());
        let window_s = every.as_secs();
        let metrics = [
            ("claim_p50_ms", p50, 30),
            ("claim_p95_ms", p95, 30),
            ("claim_p99_ms", p99, 30),
            (
                "enqueue_rate",
                (enqueued_now - enqueued) as f64 / seconds,
                window_s,
            ),
            (
                "completion_rate",
                (completed_now - completed) as f64 / seconds,
                window_s,
            ),
            ("queue_depth", depth.load(Ordering::Relaxed) as f64, 0),
        ];
        (enqueued, completed) = (enqueued_now, completed_now);
        // Where the producer's time went, on stderr: its calls and how long they took.
        let (calls, busy_us) = (
            COUNTERS.enqueue_calls.swap(0, Ordering::Relaxed),
            COUNTERS.enqueue_us.swap(0, Ordering::Relaxed),
        );
        if calls > 0 {
            eprintln!(
                "jobguard bench adapter: {calls} enqueue_many calls, {:.1} ms each, {:.0}% of \
                 the sample in calls (up to {PRODUCER_CALLS} at once)",
                busy_us as f64 / calls as f64 / 1000.0,
                busy_us as f64 / 1e4 / seconds
            );
        }
        for (metric, value, window) in metrics {
            emit(&json!({
                "t": t,
                "system": system,
                "instance_id": settings.instance_id,
                "kind": "adapter",
                "subject_kind": "adapter",
                "subject": "",
                "metric": metric,
                "value": value,
                "window_s": window,
            }))?;
        }
        if last_tick {
            return Ok(());
        }
    }
}

/// One JSONL record on stdout, flushed at once.
fn emit(record: &serde_json::Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, record)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// `2026-04-17T09:00:10.000Z`.
fn timestamp(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}
