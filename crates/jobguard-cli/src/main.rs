//! The `jobguard` command line: a thin layer over the `jobguard` library.

mod bench;
mod bench_prune;
mod bench_queue;
mod broker_demo;
mod charge_demo;
mod charges;
mod database;
mod demo;
mod experiment;
mod jobs;
mod ledger;
mod ops;
mod provider;
mod scenarios;
mod serve;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use sqlx::{Postgres, Sqlite};

use crate::database::{DEFAULT_URL, Database, redact};
use crate::experiment::Shape;

/// Exactly-once effects for background jobs delivered at least once.
#[derive(Parser)]
#[command(name = "jobguard", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant's arguments costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Deliver N credit jobs D times each at once, naive and guarded, and compare the ledgers.
    Demo(DemoArgs),
    /// Measure what the guard costs.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// One delivery loop of a demo scenario, in its own process.
    #[command(hide = true)]
    ScenarioWorker(scenarios::WorkerArgs),
    /// Run the built-in jobs (credit, noop, fail) from the queue until Ctrl-C.
    Worker(ops::WorkerArgs),
    /// Put a job on the queue, unless a job with its key is already waiting or running.
    Enqueue(ops::EnqueueArgs),
    /// Job counts by state and the newest jobs.
    Jobs(ops::JobsArgs),
    /// List and replay dead-lettered jobs.
    #[command(subcommand)]
    Dead(ops::DeadCommand),
    /// Deliver the outbox's messages to their sinks until Ctrl-C.
    Relay(ops::RelayArgs),
    /// List the outbox's messages and replay dead ones.
    #[command(subcommand)]
    Outbox(ops::OutboxCommand),
    /// List external steps that need attention, and resolve them.
    #[command(subcommand)]
    Steps(ops::StepsCommand),
    /// Delete guard rows older than the retention, in batches.
    Prune(ops::PruneArgs),
    /// The longest time a duplicate can still arrive, against the guard's retention.
    Retention(ops::RetentionArgs),
    /// Run the built-in jobs from a broker (RabbitMQ, NATS JetStream, Redis Streams).
    Consume(ops::ConsumeArgs),
    /// Serve the payment provider the charge jobs call, on 127.0.0.1, until Ctrl-C.
    Provider(provider::ProviderArgs),
    /// Serve /metrics (Prometheus), /health and a dashboard; with --worker, run the built-in
    /// jobs in the same process and count their outcomes and duplicates.
    Serve(serve::ServeArgs),
    /// The dashboard's figures in the terminal: backlog, dead letters, steps needing
    /// attention, the guard's memory horizon, and with --url a server's outcome counts.
    Stats(ops::StatsArgs),
    /// The charge demo's worker, in its own process.
    #[command(hide = true)]
    ChargeWorker(charge_demo::ChargeWorkerArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Deliveries per second of the naive and the guarded credit job, side by side.
    Guard(BenchArgs),
    /// Jobs per second drained by the worker, against pgbench running the same transaction.
    Queue(BenchQueueArgs),
    /// On PostgreSQL: the worker's throughput while a prune deletes old guard rows, and with a
    /// big guard table against an empty one.
    Prune(bench_prune::BenchPruneArgs),
}

#[derive(Args)]
struct BenchQueueArgs {
    /// Jobs to enqueue and drain, for each kind of job.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    jobs: u32,
    /// Jobs run at once, and connections in the pool (and pgbench clients).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    concurrency: u32,
    /// postgres://user@host/db, or sqlite:path.db for an embedded database.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    database_url: String,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ExperimentArgs {
    /// Distinct credit jobs (job keys).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    jobs: Option<u32>,
    /// Deliveries of each job, made at the same time.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    deliveries: u32,
    /// Connections in the pool, and workers delivering jobs.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    concurrency: u32,
    /// postgres://user@host/db, or sqlite:path.db for an embedded database.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    database_url: String,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
}

impl ExperimentArgs {
    fn shape(&self, default_jobs: u32) -> Shape {
        Shape {
            jobs: self.jobs.unwrap_or(default_jobs) as usize,
            deliveries: self.deliveries as usize,
            concurrency: self.concurrency,
        }
    }
}

#[derive(Args)]
struct DemoArgs {
    #[command(flatten)]
    experiment: ExperimentArgs,
    /// Run an at-least-once failure for real through the job queue instead (20 jobs unless
    /// --jobs says otherwise).
    #[arg(long, value_enum)]
    scenario: Option<scenarios::Scenario>,
    /// Run the seed's experiment through a broker instead: each message published D times,
    /// and a consumer killed after its commit and before its ack.
    #[arg(long, value_enum, conflicts_with = "scenario")]
    broker: Option<broker_demo::Broker>,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    experiment: ExperimentArgs,
    /// Rounds of naive and guarded runs; the report gives the median.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("JOBGUARD_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo(args) => demo(args).await,
        Command::ScenarioWorker(args) => scenario_worker(args).await,
        Command::Bench(BenchCommand::Guard(args)) => bench_guard(args).await,
        Command::Bench(BenchCommand::Queue(args)) => bench_queue(args).await,
        Command::Bench(BenchCommand::Prune(args)) => bench_prune::run(args).await,
        Command::Worker(args) => ops::worker(args).await,
        Command::Enqueue(args) => ops::enqueue(args).await,
        Command::Jobs(args) => ops::jobs(args).await,
        Command::Dead(command) => ops::dead(command).await,
        Command::Relay(args) => ops::relay(args).await,
        Command::Outbox(command) => ops::outbox(command).await,
        Command::Steps(command) => ops::steps(command).await,
        Command::Provider(args) => provider::provider(args).await,
        Command::Serve(args) => serve::serve(args).await,
        Command::Stats(args) => ops::stats(args).await,
        Command::Prune(args) => ops::prune(args).await,
        Command::Retention(args) => ops::retention(args).await,
        Command::Consume(args) => ops::consume(args).await,
        Command::ChargeWorker(args) => charge_worker(args).await,
    }
}

async fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let scenario = args.scenario;
    if let Some(broker) = args.broker {
        let args = args.experiment;
        return broker_demo::run(broker, &args.database_url, args.shape(100), args.json).await;
    }
    let args = args.experiment;
    let database = redact(&args.database_url);
    if scenario == Some(scenarios::Scenario::Charge) {
        let jobs = args.shape(20).jobs;
        let url = &args.database_url;
        let report = match Database::connect(url, 4).await? {
            Database::Postgres(pool) => {
                charge_demo::run::<Postgres>(&pool, url, database, jobs).await?
            }
            Database::Sqlite(pool) => {
                charge_demo::run::<Sqlite>(&pool, url, database, jobs).await?
            }
        };
        let text = charge_demo::render(&report);
        return print_report(&report, args.json, text, report.exactly_once);
    }
    let report = if let Some(scenario) = scenario {
        let jobs = args.shape(20).jobs;
        let url = &args.database_url;
        match Database::connect(url, 4).await? {
            Database::Postgres(pool) => {
                scenarios::run::<Postgres>(&pool, url, database, scenario, jobs).await?
            }
            Database::Sqlite(pool) => {
                scenarios::run::<Sqlite>(&pool, url, database, scenario, jobs).await?
            }
        }
    } else {
        let shape = args.shape(100);
        let show_progress = !args.json && std::io::stderr().is_terminal();
        match Database::connect(&args.database_url, shape.concurrency).await? {
            Database::Postgres(pool) => {
                demo::run::<Postgres>(&pool, database, shape, show_progress).await?
            }
            Database::Sqlite(pool) => {
                demo::run::<Sqlite>(&pool, database, shape, show_progress).await?
            }
        }
    };
    print_report(
        &report,
        args.json,
        demo::render(&report),
        report.exactly_once,
    )
}

async fn bench_guard(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let rounds = args.rounds as usize;
    let args = args.experiment;
    let shape = args.shape(10_000);
    let progress = demo::progress_bar(&shape, !args.json && std::io::stderr().is_terminal());
    progress.set_length(shape.total_deliveries() as u64 * 2 * rounds as u64);
    let report = match Database::connect(&args.database_url, shape.concurrency).await? {
        Database::Postgres(pool) => bench::run::<Postgres>(&pool, shape, rounds, &progress).await?,
        Database::Sqlite(pool) => bench::run::<Sqlite>(&pool, shape, rounds, &progress).await?,
    };
    progress.finish_and_clear();
    print_report(
        &report,
        args.json,
        bench::render(&report),
        report.exactly_once,
    )
}

async fn scenario_worker(args: scenarios::WorkerArgs) -> anyhow::Result<ExitCode> {
    match Database::connect(args.database_url(), 4).await? {
        Database::Postgres(pool) => scenarios::worker_process::<Postgres>(&pool, &args).await?,
        Database::Sqlite(pool) => scenarios::worker_process::<Sqlite>(&pool, &args).await?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn charge_worker(args: charge_demo::ChargeWorkerArgs) -> anyhow::Result<ExitCode> {
    match Database::connect(args.database_url(), 6).await? {
        Database::Postgres(pool) => charge_demo::worker_process::<Postgres>(&pool).await?,
        Database::Sqlite(pool) => charge_demo::worker_process::<Sqlite>(&pool).await?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn bench_queue(args: BenchQueueArgs) -> anyhow::Result<ExitCode> {
    let (url, jobs, concurrency) = (&args.database_url, args.jobs as usize, args.concurrency);
    // The worker's connections, plus one for its notifications and one for heartbeats.
    let report = match Database::connect(url, concurrency + 2).await? {
        Database::Postgres(pool) => {
            bench_queue::run::<Postgres>(&pool, url, jobs, concurrency).await?
        }
        Database::Sqlite(pool) => bench_queue::run::<Sqlite>(&pool, url, jobs, concurrency).await?,
    };
    print_report(
        &report,
        args.json,
        bench_queue::render(&report),
        report.exactly_once,
    )
}

/// Prints a report as JSON or as text, and exits non-zero unless every job took effect once.
fn print_report<T: serde::Serialize>(
    report: &T,
    json: bool,
    text: String,
    exactly_once: bool,
) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{text}");
    }
    Ok(if exactly_once {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
