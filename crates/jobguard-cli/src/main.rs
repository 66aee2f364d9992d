//! The `jobguard` command line: a thin layer over the `jobguard` library.
//!
//! This file parses the command line and dispatches to [`commands`], one file per command.
//! Below them: [`builtin_jobs`], the jobs `jobguard worker` runs; [`demo`] and [`bench`], which
//! only the `demo`, `bench` and `demo-process` commands reach; and the helpers every command
//! shares: [`args`], [`access`], [`database`], [`broker`], [`exporter`], [`figures`] and
//! [`report`]; [`console_api`] is the console's HTTP API that `serve` mounts; [`crash_point`]
//! the line a process prints where the process that started it kills it. With the `faults`
//! feature (the fault tests' build), `faults` adds the crash flags of `consume`.

mod access;
mod args;
mod bench;
mod broker;
mod builtin_jobs;
mod commands;
mod console_api;
mod crash_point;
mod database;
mod demo;
mod exporter;
#[cfg(feature = "faults")]
mod faults;
mod figures;
mod report;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands::{
    bench::BenchCommand, consume, dead, demo as demo_command, demo_process, enqueue, jobs, key,
    outbox, provider, prune, queue, relay, retention, schedules, serve, stats, steps, worker,
};

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
    Demo(demo_command::DemoArgs),
    /// Measure what the guard costs.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// The processes `jobguard demo` and the fault runs start and kill at a crash point: a
    /// scenario's worker, the charge demo's worker, a broker demo's consumer. Not for use on
    /// their own.
    #[command(subcommand)]
    DemoProcess(demo_process::DemoProcess),
    /// Run the built-in jobs (credit, noop, fail; charge, charge-keyless and charge-naive against
    /// the payment provider) from the queue until Ctrl-C.
    Worker(worker::WorkerArgs),
    /// Put a job on the queue, unless a job with its key is already waiting or running.
    Enqueue(enqueue::EnqueueArgs),
    /// Job counts by state and the newest jobs; show, retry, cancel or delete one job.
    Jobs(jobs::JobsArgs),
    /// Everything stored about a job key: its guard row, its jobs, steps and outbox messages.
    Key(key::KeyArgs),
    /// List queues, and pause or resume workers' fetches from one.
    #[command(subcommand)]
    Queue(queue::QueueCommand),
    /// List and replay dead-lettered jobs.
    #[command(subcommand)]
    Dead(dead::DeadCommand),
    /// Deliver the outbox's messages to their sinks until Ctrl-C.
    Relay(relay::RelayArgs),
    /// List the outbox's messages and replay dead ones.
    #[command(subcommand)]
    Outbox(outbox::OutboxCommand),
    /// List external steps that need attention, and resolve them.
    #[command(subcommand)]
    Steps(steps::StepsCommand),
    /// Delete guard rows older than the retention, in batches.
    Prune(prune::PruneArgs),
    /// The longest time a duplicate can still arrive, against the guard's retention.
    Retention(retention::RetentionArgs),
    /// Run the built-in jobs from a broker (RabbitMQ, NATS JetStream, Redis Streams, Amazon
    /// SQS, Kafka).
    Consume(consume::ConsumeCommand),
    /// Serve the payment provider the charge jobs call, on 127.0.0.1, until Ctrl-C.
    Provider(provider::ProviderArgs),
    /// Serve /metrics (Prometheus), /health and a dashboard; with --worker, run the built-in
    /// jobs in the same process and count their outcomes and duplicates.
    Serve(serve::ServeArgs),
    /// The dashboard's figures in the terminal: backlog, dead letters, steps needing
    /// attention, the guard's memory horizon, and with --url a server's outcome counts.
    Stats(stats::StatsArgs),
    /// Periodic schedules: each one's last and next firing, and the job its last firing
    /// produced.
    Schedules(schedules::SchedulesArgs),
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
        Command::Demo(args) => demo_command::demo(args).await,
        Command::DemoProcess(process) => demo_process::demo_process(process).await,
        Command::Bench(command) => commands::bench::bench(command).await,
        Command::Worker(args) => worker::worker(args).await,
        Command::Enqueue(args) => enqueue::enqueue(args).await,
        Command::Jobs(args) => jobs::jobs(args).await,
        Command::Key(args) => key::key(args).await,
        Command::Queue(command) => queue::queue(command).await,
        Command::Dead(command) => dead::dead(command).await,
        Command::Relay(args) => relay::relay(args).await,
        Command::Outbox(command) => outbox::outbox(command).await,
        Command::Steps(command) => steps::steps(command).await,
        Command::Provider(args) => provider::provider(args).await,
        Command::Serve(args) => serve::serve(args).await,
        Command::Stats(args) => stats::stats(args).await,
        Command::Schedules(args) => schedules::schedules(args).await,
        Command::Prune(args) => prune::prune(args).await,
        Command::Retention(args) => retention::retention(args).await,
        Command::Consume(command) => consume::consume(command).await,
    }
}
