//! The `jobguard` command line: a thin layer over the `jobguard` library.

mod bench;
mod database;
mod demo;
mod experiment;
mod ledger;

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

#[derive(Subcommand)]
enum Command {
    /// Deliver N credit jobs D times each at once, naive and guarded, and compare the ledgers.
    Demo(DemoArgs),
    /// Measure what the guard costs.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Deliveries per second of the naive and the guarded credit job, side by side.
    Guard(BenchArgs),
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
        Command::Bench(BenchCommand::Guard(args)) => bench_guard(args).await,
    }
}

async fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let args = args.experiment;
    let shape = args.shape(100);
    let database = redact(&args.database_url);
    let show_progress = !args.json && std::io::stderr().is_terminal();
    let report = match Database::connect(&args.database_url, shape.concurrency).await? {
        Database::Postgres(pool) => {
            demo::run::<Postgres>(&pool, database, shape, show_progress).await?
        }
        Database::Sqlite(pool) => {
            demo::run::<Sqlite>(&pool, database, shape, show_progress).await?
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", demo::render(&report));
    }
    Ok(if report.exactly_once {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", bench::render(&report));
    }
    Ok(if report.exactly_once {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
