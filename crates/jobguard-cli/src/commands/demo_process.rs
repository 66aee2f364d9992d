//! `jobguard demo-process`: the processes `jobguard demo` and the fault runs start, each of which
//! prints `JOBGUARD_CRASH_POINT` where the process that started it kills it with SIGKILL.
//!
//! - `scenario-worker`: one delivery loop of `demo --scenario crash-before-ack`, killed after a
//!   job's effect and before its ack;
//! - `charge-worker`: the charge demo's worker, killed after the provider charged and before the
//!   database commit;
//! - `broker-consumer`: the consumer of `demo --broker NAME`, killed after its first commit and
//!   before its ack.
//!
//! They run on the demo's own tables and are not meant to be started by hand.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::consume::ConsumeArgs;
use crate::database::Database;
use crate::demo::scenarios::{self, Mode};
use crate::demo::{broker, charge};
use crate::on_pool;

/// `jobguard demo-process NAME`.
// Parsed once per process: the size of the largest variant's arguments costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum DemoProcess {
    /// One delivery loop of `jobguard demo --scenario`, in its own process, on the demo's tables;
    /// with --crash-before-ack, the worker the crash-before-ack scenario kills.
    ScenarioWorker(scenarios::WorkerArgs),
    /// The worker of `jobguard demo --scenario charge`, on the demo's tables: runs the charge
    /// jobs until none is left and prints its counts; with JOBGUARD_CRASH_AFTER_CALL set to a
    /// directory, it stops after every fifth order's charge, before the database commit, and
    /// waits to be killed.
    ChargeWorker(charge::ChargeWorkerArgs),
    /// The consumer `jobguard demo --broker NAME` kills: runs the demo's naive or guarded credit
    /// job from the broker on the demo's tables, and after its first commit prints
    /// JOBGUARD_CRASH_POINT and waits to be killed, before the ack.
    BrokerConsumer(BrokerConsumerArgs),
}

/// Arguments of `jobguard demo-process broker-consumer`: those of `jobguard consume`, and the
/// credit job to run.
#[derive(Args, Debug)]
pub struct BrokerConsumerArgs {
    #[command(flatten)]
    consume: ConsumeArgs,
    /// The credit job to run.
    #[arg(long, value_enum)]
    mode: Mode,
}

/// Runs one of the demo's processes.
pub async fn demo_process(process: DemoProcess) -> anyhow::Result<ExitCode> {
    match process {
        DemoProcess::ScenarioWorker(args) => {
            on_pool!(Database::connect(args.database_url(), 4).await?, pool => {
                scenarios::worker_process(&pool, &args).await?
            });
        }
        DemoProcess::ChargeWorker(args) => {
            on_pool!(Database::connect(args.database_url(), 6).await?, pool => {
                charge::worker_process(&pool).await?
            });
        }
        DemoProcess::BrokerConsumer(args) => {
            let endpoint = args.consume.endpoint()?;
            let database =
                Database::connect(args.consume.database_url(), args.consume.connections());
            on_pool!(database.await?, pool => {
                broker::consumer_process(&pool, &endpoint, args.mode).await?
            });
        }
    }
    Ok(ExitCode::SUCCESS)
}
