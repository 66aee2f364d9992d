//! `jobguard demo`: the seed's experiment, or an at-least-once failure made to happen through
//! the queue (`--scenario`) or a broker (`--broker`), naive against guarded.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Args;

use crate::database::{DEFAULT_URL, Database, redact};
use crate::demo::experiment::Shape;
use crate::demo::scenarios::{self, Scenario};
use crate::demo::{self, broker, charge};
use crate::{on_pool, report};

/// The experiment's size and where it runs, for `jobguard demo` and `jobguard bench guard`.
#[derive(Args)]
pub struct ExperimentArgs {
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
    pub database_url: String,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
}

impl ExperimentArgs {
    /// The experiment's shape, with `default_jobs` when `--jobs` is not given.
    pub fn shape(&self, default_jobs: u32) -> Shape {
        Shape {
            jobs: self.jobs.unwrap_or(default_jobs) as usize,
            deliveries: self.deliveries as usize,
            concurrency: self.concurrency,
        }
    }
}

#[derive(Args)]
pub struct DemoArgs {
    #[command(flatten)]
    experiment: ExperimentArgs,
    /// Run an at-least-once failure for real through the job queue instead (20 jobs unless
    /// --jobs says otherwise).
    #[arg(long, value_enum)]
    scenario: Option<Scenario>,
    /// Run the seed's experiment through a broker instead: each message published D times,
    /// and a consumer killed after its commit and before its ack.
    #[arg(long, value_enum, conflicts_with = "scenario")]
    broker: Option<crate::broker::Broker>,
}

/// Runs `jobguard demo`; exits non-zero unless the guarded run took effect exactly once.
pub async fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let scenario = args.scenario;
    let args_broker = args.broker;
    let args = args.experiment;
    if let Some(name) = args_broker {
        return broker::run(name, &args.database_url, args.shape(100), args.json).await;
    }
    let database = redact(&args.database_url);
    let url = &args.database_url;
    if scenario == Some(Scenario::Charge) {
        let jobs = args.shape(20).jobs;
        let report = on_pool!(Database::connect(url, 4).await?, pool => {
            charge::run(&pool, url, database, jobs).await?
        });
        return report::verdict(&report, args.json, charge::render, report.exactly_once);
    }
    let report = if let Some(scenario) = scenario {
        let jobs = args.shape(20).jobs;
        on_pool!(Database::connect(url, 4).await?, pool => {
            scenarios::run(&pool, url, database, scenario, jobs).await?
        })
    } else {
        let shape = args.shape(100);
        let show_progress = !args.json && std::io::stderr().is_terminal();
        on_pool!(Database::connect(url, shape.concurrency).await?, pool => {
            demo::run(&pool, database, shape, show_progress).await?
        })
    };
    report::verdict(&report, args.json, demo::render, report.exactly_once)
}
