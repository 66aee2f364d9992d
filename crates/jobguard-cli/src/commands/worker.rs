//! `jobguard worker`: runs the built-in jobs from the queue until Ctrl-C, or until idle; with
//! `--relay-webhook-url`, delivers the outbox's messages in the same process.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use jobguard::outbox::{RelayConfig, RelayReport, WebhookSink};
use jobguard::retention::{PruneConfig, PruneSchedule, format_duration};
use jobguard::steps::StepConfig;
use jobguard::worker::shutdown_signal;
use jobguard::{Queue, RetryPolicy, UnknownKinds, Worker, WorkerConfig, WorkerStats};
use serde::Serialize;
use sqlx::Pool;

use super::retention::{DeclaredWindows, JobKeeping, retention_config, retry_policy};
use crate::args::{ConnectWait, Target, parse_duration};
use crate::builtin_jobs::charges::PaymentTables;
use crate::builtin_jobs::{self, ExampleDb};
use crate::database::{Startup, redact};
use crate::exporter::MetricsArgs;
use crate::on_pool;
use crate::report;

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The queue to take jobs from.
    #[arg(long, default_value = jobguard::queue::DEFAULT_QUEUE)]
    queue: String,
    /// Jobs run at once.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    concurrency: u32,
    /// Jobs of batchable kinds (the built-in `credit` and `noop`) run up to this many in one
    /// transaction; when one fails, the batch rolls back and its jobs run one per transaction.
    /// 1 runs every job in its own transaction.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10000))]
    batch_size: u32,
    /// How long a batch the fetch left short waits for more jobs before it runs.
    #[arg(long, default_value = "2ms", value_parser = parse_duration)]
    batch_linger: Duration,
    /// Jobs (batches, when batching) leased ahead of free slots, so a finished job is followed
    /// at once; they wait for a slot with their leases extended. Default: twice --concurrency
    /// on PostgreSQL, 0 on SQLite (its jobs take the one write lock in turn). 0 fetches only
    /// for free slots.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=10000))]
    prefetch: Option<u32>,
    /// How long a job is leased for (e.g. 30s); running jobs extend it every third of it.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    lease: Duration,
    /// How often an idle worker looks for jobs; on PostgreSQL an enqueue also wakes it.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    poll: Duration,
    /// The delay before a failed job runs again; it doubles with each attempt, up to an hour.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    backoff: Duration,
    /// How long running jobs get to finish after Ctrl-C; then they are rolled back and given
    /// back to the queue.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    shutdown_timeout: Duration,
    /// Stop as soon as no job of the built-in kinds is available to run now and none is
    /// running.
    #[arg(long)]
    until_idle: bool,
    /// Also fetch jobs of kinds other than the built-in ones, and dead-letter them ("unknown
    /// job kind"). Without it they stay waiting for a worker that runs their kind (a Python
    /// worker, another service) on the same queue.
    #[arg(long)]
    dead_letter_unknown_kinds: bool,
    /// Also deliver the outbox's messages to this webhook (URL/TOPIC), in this process, as
    /// `jobguard relay` does; with --until-idle, what is due is delivered before stopping.
    #[arg(long, value_name = "URL")]
    relay_webhook_url: Option<String>,
    /// How long guard rows are kept (e.g. 14d); the worker refuses to start when it is shorter
    /// than the horizon `jobguard retention` prints, unless --override-horizon.
    #[arg(long, default_value = "14d", value_parser = parse_duration)]
    keep: Duration,
    #[command(flatten)]
    windows: DeclaredWindows,
    #[command(flatten)]
    jobs: JobKeeping,
    /// When to prune guard rows older than --keep (and completed and dead jobs past
    /// --keep-completed and --keep-dead): a cron expression in UTC (five fields, or
    /// six with seconds), or `off`. One worker prunes at a time.
    #[arg(long, default_value = PruneSchedule::DAILY, value_parser = parse_schedule)]
    prune_schedule: Schedule,
    /// Start even though --keep is shorter than the horizon: duplicates that arrive later than
    /// --keep after their key was applied will apply again.
    #[arg(long)]
    override_horizon: bool,
    /// Enqueue the jobs of the periodic schedules in this file (TOML, or JSON when it ends in
    /// .json; see `jobguard schedules`), each firing once however many workers run it.
    #[arg(long, value_name = "FILE")]
    schedule: Option<std::path::PathBuf>,
    #[command(flatten)]
    metrics: MetricsArgs,
    #[command(flatten)]
    wait: ConnectWait,
    #[command(flatten)]
    target: Target,
}

/// `--prune-schedule`: a cron expression, or `off`.
#[derive(Clone, Debug)]
struct Schedule(Option<PruneSchedule>);

fn parse_schedule(text: &str) -> Result<Schedule, String> {
    if text.trim() == "off" {
        return Ok(Schedule(None));
    }
    PruneSchedule::new(text.trim())
        .map(|schedule| Schedule(Some(schedule)))
        .map_err(|error| error.to_string())
}

/// What `jobguard worker --json` prints when it stops.
#[derive(Debug, Serialize)]
struct WorkerReport {
    backend: &'static str,
    database: String,
    queue: String,
    #[serde(flatten)]
    stats: WorkerStats,
    /// What the in-process relay delivered, with `--relay-webhook-url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    relay: Option<RelayReport>,
    seconds: f64,
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    if args.lease < Duration::from_millis(300) {
        bail!(
            "--lease {} is too short: jobs extend their lease every third of it; use at least \
             300ms, and longer than your slowest job takes between heartbeats",
            humantime::format_duration(args.lease)
        );
    }
    if args.poll < Duration::from_millis(10) {
        bail!("--poll must be at least 10ms");
    }
    let sink = match &args.relay_webhook_url {
        Some(url) => Some(WebhookSink::new(url)?),
        None => None,
    };
    // Each running job holds a connection for its transaction; heartbeats, retries and the
    // next fetch need a few more, and the relay a few of its own.
    let connections = args.concurrency + 4 + if sink.is_some() { 4 } else { 0 };
    // Ctrl-C and SIGTERM are caught from here on, one signal for the whole run: a stop asked
    // while the worker still starts (waiting for its database) ends it cleanly.
    let signal = shutdown_signal().boxed().shared();
    let _ = signal.clone().now_or_never();
    // A worker started while the database restarts, or before it in a deploy, waits for it.
    let startup = Startup::new(&args.target.database_url, args.wait.connect_timeout);
    let database = tokio::select! {
        database = startup.connect(&args.target.database_url, connections) => database?,
        () = signal.clone() => return Ok(stopped_while_starting()),
    };
    on_pool!(database, pool => run(pool, sink, args, startup, signal).await)
}

/// A stop asked before the worker ran anything.
fn stopped_while_starting() -> ExitCode {
    eprintln!("jobguard worker: stopped while starting; no job was run");
    ExitCode::SUCCESS
}

async fn run<DB: ExampleDb>(
    pool: Pool<DB>,
    sink: Option<WebhookSink>,
    args: WorkerArgs,
    startup: Startup,
    signal: Shared<BoxFuture<'static, ()>>,
) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let config = WorkerConfig {
        queue: args.queue.clone(),
        concurrency: args.concurrency as usize,
        batch_size: args.batch_size as usize,
        batch_linger: args.batch_linger,
        prefetch: args.prefetch.map(|n| n as usize),
        lease: args.lease,
        poll_interval: args.poll,
        retry: retry_policy(args.backoff),
        shutdown_timeout: args.shutdown_timeout,
        stop_when_idle: args.until_idle,
        unknown_kinds: if args.dead_letter_unknown_kinds {
            UnknownKinds::DeadLetter
        } else {
            UnknownKinds::Leave
        },
        retention: retention_config(args.keep, &args.windows, &args.jobs, args.override_horizon),
        prune: PruneConfig {
            schedule: args.prune_schedule.0.clone(),
            // The built-in charge jobs' step ledger.
            steps: Some(StepConfig::default().table(PaymentTables::default().steps)),
            ..PruneConfig::default()
        },
        ..WorkerConfig::default()
    };
    let queue = Queue::new(pool.clone());
    let mut worker = builtin_jobs::register(Worker::with_config(queue.clone(), config)?);
    if let Some(path) = &args.schedule {
        for periodic in super::schedules::load(path, &args.queue)? {
            worker = worker.schedule(periodic);
        }
    }
    // Refused before anything is created or started.
    let retention = worker.retention()?;
    // Creating the tables is safe to run again: a server going down meanwhile is waited for.
    tokio::select! {
        migrated = startup.retry(|| migrate(&worker, &pool, &database)) => migrated?,
        () = signal.clone() => return Ok(stopped_while_starting()),
    }

    // Before the first job, so that every outcome is counted.
    if let Some(endpoint) = args.metrics.start(pool.clone(), signal.clone()).await? {
        eprintln!(
            "jobguard worker: metrics on http://{}/metrics, health on /health",
            endpoint.address
        );
    }

    let relay = match sink {
        Some(sink) => {
            let config = RelayConfig {
                poll_interval: args.poll,
                retry: RetryPolicy {
                    base: args.backoff,
                    ..RetryPolicy::default()
                },
                ..RelayConfig::default()
            };
            let relay = super::relay::start(pool.clone(), sink, config)
                .await
                .with_context(|| format!("cannot start the relay on {database}"))?;
            Some(relay)
        }
        None => None,
    };

    if !args.target.json {
        let pruning = match &args.prune_schedule.0 {
            Some(schedule) => format!("pruned at `{schedule}` UTC"),
            None => "never pruned (--prune-schedule off)".to_owned(),
        };
        eprintln!(
            "jobguard worker: guard rows kept {} (horizon {}{}), {pruning}",
            format_duration(retention.keep()),
            format_duration(retention.horizon().total()),
            if retention.is_overridden() {
                ", OVERRIDDEN: later duplicates apply again"
            } else {
                ""
            }
        );
        eprintln!(
            "jobguard worker: queue `{}` on {database} ({}), {} jobs at once, kinds {} (other \
             kinds {}){}; {}",
            args.queue,
            DB::BACKEND,
            args.concurrency,
            builtin_jobs::KINDS.join(", "),
            if args.dead_letter_unknown_kinds {
                "dead-lettered"
            } else {
                "left waiting"
            },
            match &args.relay_webhook_url {
                Some(url) => format!(", outbox relayed to {url}"),
                None => String::new(),
            },
            if args.until_idle {
                "stops when idle"
            } else {
                "Ctrl-C to stop"
            }
        );
    }
    if !args.target.json {
        for periodic in worker.schedules() {
            eprintln!(
                "jobguard worker: schedule `{}`: `{}` {} -> {} on `{}`, missed firings: {}",
                periodic.name(),
                periodic.expression(),
                periodic.zone_name(),
                periodic.kind(),
                periodic.queue_name(),
                periodic.missed_policy()
            );
        }
    }
    let started = Instant::now();
    // One signal for both; the relay also stops when the worker does (--until-idle).
    let (worker_stopped, on_worker_stop) = tokio::sync::oneshot::channel::<()>();
    let working = async {
        let stats = worker.run(signal.clone()).await;
        let _ = worker_stopped.send(());
        stats
    };
    let relaying = async {
        let Some(relay) = &relay else {
            return Ok(None);
        };
        let stop = async {
            tokio::select! {
                () = signal.clone() => {}
                _ = on_worker_stop => {}
            }
        };
        let mut report = relay.run(stop).await?;
        if args.until_idle {
            // The last jobs' messages.
            report += super::relay::drain(relay).await?;
        }
        anyhow::Ok(Some(report))
    };
    let (stats, relayed) = tokio::join!(working, relaying);
    let report = WorkerReport {
        backend: DB::BACKEND,
        database,
        queue: args.queue,
        stats: stats?,
        relay: relayed?,
        seconds: started.elapsed().as_secs_f64(),
    };
    pool.close().await;
    report::print(&report, args.target.json, render)?;
    Ok(ExitCode::SUCCESS)
}

/// Creates the queue's, the guard's, the schedules' and the built-in jobs' tables when missing.
async fn migrate<DB: ExampleDb>(
    worker: &Worker<DB>,
    pool: &Pool<DB>,
    database: &str,
) -> anyhow::Result<()> {
    worker.migrate().await.with_context(|| {
        format!("cannot create the job queue's, the guard's or the schedules' tables in {database}")
    })?;
    builtin_jobs::migrate(pool)
        .await
        .with_context(|| format!("cannot create the built-in jobs' tables in {database}"))
}

fn render(report: &WorkerReport) -> String {
    let stats = &report.stats;
    let table = report::outcomes(
        ["outcome", "jobs", "meaning"],
        &[
            (
                "applied",
                stats.applied,
                "effect committed with the guard row",
            ),
            (
                "duplicates",
                stats.duplicates,
                "key already applied: completed, effect skipped",
            ),
            ("failed", stats.failed, "attempt failed, will run again"),
            (
                "dead",
                stats.dead,
                "dead-lettered: see `jobguard dead list`",
            ),
            (
                "fenced",
                stats.fenced,
                "lease lost to another worker: rolled back",
            ),
            ("released", stats.released, "given back at shutdown"),
            (
                "pruned",
                stats.pruned,
                "guard rows and done steps past --keep, deleted on schedule",
            ),
        ],
    );
    let relay = match &report.relay {
        Some(relay) => format!("outbox relay\n{}\n", super::relay::render(relay)),
        None => String::new(),
    };
    let batches = match (stats.batches, stats.batches_rolled_back) {
        (0, 0) => String::new(),
        (committed, rolled_back) => format!(
            "batches: {committed} committed, {rolled_back} rolled back (their jobs ran one per transaction)\n"
        ),
    };
    format!(
        "worker stopped after {:.2} s on queue `{}`\n{table}\n{batches}{relay}",
        report.seconds, report.queue
    )
}
