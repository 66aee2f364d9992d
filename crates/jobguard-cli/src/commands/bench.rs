//! `jobguard bench guard|queue|prune|enqueue|contention|brokers|adapter|soak`: what the guard costs,
//! measured.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::demo::ExperimentArgs;
use crate::bench::{adapter, brokers, contention, enqueue, guard, prune, queue, soak};
use crate::database::{DEFAULT_URL, Database};
use crate::demo;
use crate::{on_pool, report};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Deliveries per second of the naive and the guarded credit job, side by side.
    Guard(BenchArgs),
    /// Jobs per second drained by the worker, against pgbench running the same transaction.
    Queue(BenchQueueArgs),
    /// On PostgreSQL: the worker's throughput while a prune deletes old guard rows, and with a
    /// big guard table against an empty one.
    Prune(prune::BenchPruneArgs),
    /// Jobs per second enqueued one by one against one `enqueue_many` call.
    Enqueue(enqueue::BenchEnqueueArgs),
    /// Batched against per-job execution, for jobs writing rows of their own and for jobs
    /// writing a few hot rows.
    Contention(contention::BenchContentionArgs),
    /// Messages per second a broker consumer applies one per transaction against in batches,
    /// on each broker that answers.
    Brokers(brokers::BenchBrokersArgs),
    /// jobguard as a system of the public cross-system PostgreSQL queue benchmark
    /// (hardbyte/postgresql-job-queue-benchmarking): settings from its environment variables,
    /// JSONL samples on stdout, until SIGTERM. See bench/README.md.
    Adapter(adapter::BenchAdapterArgs),
    /// On PostgreSQL: a steady load with pruning on a short schedule and retention, and the
    /// jobs and guard tables' rows, dead tuples and bytes after each prune.
    Soak(soak::BenchSoakArgs),
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    experiment: ExperimentArgs,
    /// Rounds of naive and guarded runs; the report gives the median.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
}

#[derive(Args)]
pub struct BenchQueueArgs {
    /// Jobs to enqueue and drain, for each kind of job.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    jobs: u32,
    /// Jobs (or batches) run at once, and connections in the pool (and pgbench clients); by
    /// default 20 on PostgreSQL and 4 on SQLite, whose one writer at a time gains nothing from
    /// more.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    concurrency: Option<u32>,
    /// Jobs per transaction in the batched runs; 1 skips them.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch_size: u32,
    /// How many times the per-job credit drain and pgbench run, back to back; the report
    /// gives each round's ratio and the median.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// Jobs per second offered in one pickup-latency run; by default three runs, at 10%, 50%
    /// and 90% of the credit jobs' rate one per transaction.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    rate: Option<u32>,
    /// Periodic schedules, each firing a no-op job every second, run by the worker of every
    /// run beside its loop: the cost of scheduling, against a run without.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000))]
    periodic: u32,
    /// postgres://user@host/db, or sqlite:path.db for an embedded database.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    database_url: String,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
}

/// Runs one of the benchmarks.
pub async fn bench(command: BenchCommand) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::Guard(args) => bench_guard(args).await,
        BenchCommand::Queue(args) => bench_queue(args).await,
        BenchCommand::Prune(args) => prune::run(args).await,
        BenchCommand::Enqueue(args) => enqueue::run(args).await,
        BenchCommand::Contention(args) => contention::run(args).await,
        BenchCommand::Brokers(args) => brokers::run(args).await,
        BenchCommand::Adapter(args) => adapter::run(args).await,
        BenchCommand::Soak(args) => soak::run(args).await,
    }
}

async fn bench_guard(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let rounds = args.rounds as usize;
    let args = args.experiment;
    let shape = args.shape(10_000);
    let progress = demo::progress_bar(&shape, !args.json && std::io::stderr().is_terminal());
    progress.set_length(shape.total_deliveries() as u64 * 2 * rounds as u64);
    let report = on_pool!(Database::connect(&args.database_url, shape.concurrency).await?, pool => {
        guard::run(&pool, shape, rounds, &progress).await?
    });
    progress.finish_and_clear();
    report::verdict(&report, args.json, guard::render, report.exactly_once)
}

async fn bench_queue(args: BenchQueueArgs) -> anyhow::Result<ExitCode> {
    let url = &args.database_url;
    let default_concurrency = if url.starts_with("sqlite:") { 4 } else { 20 };
    let bench = queue::QueueBench {
        jobs: args.jobs as usize,
        concurrency: args.concurrency.unwrap_or(default_concurrency),
        batch_size: args.batch_size as usize,
        rounds: args.rounds as usize,
        rate: args.rate.map(f64::from),
        periodic: args.periodic,
    };
    // A connection per job run at once, plus the worker's notifications, its fetches and
    // heartbeats, and the producer of the pickup runs.
    let connections = bench.concurrency + 3;
    let report = on_pool!(Database::connect(url, connections).await?, pool => {
        queue::run(&pool, url, bench).await?
    });
    report::verdict(&report, args.json, queue::render, report.all_exactly_once())
}
