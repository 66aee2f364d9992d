//! The hidden commands that the demo and the fault tests start as processes, and the only way
//! to the fault hooks: `scenario-worker` and `charge-worker` (killed mid-job by the demo), and
//! `consume` with its hidden flags `--crash-after-commit`, `--crash-before-commit` and
//! `--demo MODE`.
//!
//! `jobguard consume` without those flags runs [`super::consume`] as it is.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use super::consume;
use crate::database::Database;
use crate::demo::crash_point::{CRASH_POINT, report_line};
use crate::demo::scenarios::{self, Mode};
use crate::demo::{broker, charge};
use crate::on_pool;

/// `jobguard consume`, with the hidden fault flags.
#[derive(Args, Debug)]
pub struct ConsumeCommand {
    #[command(flatten)]
    consume: consume::ConsumeArgs,
    /// After the first job's commit, print JOBGUARD_CRASH_POINT and wait to be killed, never
    /// acknowledging its message (for fault tests and the demo).
    #[arg(long, hide = true)]
    crash_after_commit: bool,
    /// After the first transaction's effects and before its commit, print
    /// JOBGUARD_CRASH_POINT with the keys it claimed and wait to be killed, never committing
    /// (for fault tests).
    #[arg(long, hide = true, conflicts_with_all = ["crash_after_commit", "demo"])]
    crash_before_commit: bool,
    /// Run the demo's credit job on the demo's tables instead of the built-in jobs.
    #[arg(long, hide = true, value_enum)]
    demo: Option<Mode>,
}

/// Runs `jobguard consume`, or its faulty variants when a hidden flag is given.
pub async fn consume(args: ConsumeCommand) -> anyhow::Result<ExitCode> {
    let crash = args.crash_after_commit;
    let Some(mode) = args.demo else {
        let mut hooks = consume::Hooks::default();
        if crash {
            hooks.before_ack = Some(Arc::new(broker::crash_after_commit));
        }
        if args.crash_before_commit {
            hooks.before_commit = Some(Arc::new(crash_before_commit));
        }
        return consume::run(args.consume, hooks).await;
    };
    let endpoint = args.consume.endpoint()?;
    let database = Database::connect(args.consume.database_url(), args.consume.connections());
    on_pool!(database.await?, pool => broker::consume(&pool, &endpoint, mode, crash).await)?;
    Ok(ExitCode::SUCCESS)
}

/// What `jobguard consume --crash-before-commit` runs between a transaction's effects and its
/// commit: it prints [`CRASH_POINT`] with how many keys the transaction claimed and which, and
/// waits there to be killed, never committing.
fn crash_before_commit(keys: Vec<jobguard::JobKey>) -> futures::future::BoxFuture<'static, ()> {
    let keys: Vec<String> = keys.iter().map(ToString::to_string).collect();
    report_line(&format!("{CRASH_POINT} {} {}", keys.len(), keys.join(" ")));
    Box::pin(std::future::pending())
}

/// `jobguard scenario-worker`: one delivery loop of a demo scenario, in this process.
pub async fn scenario_worker(args: scenarios::WorkerArgs) -> anyhow::Result<ExitCode> {
    on_pool!(Database::connect(args.database_url(), 4).await?, pool => {
        scenarios::worker_process(&pool, &args).await?
    });
    Ok(ExitCode::SUCCESS)
}

/// `jobguard charge-worker`: the charge demo's worker, in this process.
pub async fn charge_worker(args: charge::ChargeWorkerArgs) -> anyhow::Result<ExitCode> {
    on_pool!(Database::connect(args.database_url(), 6).await?, pool => {
        charge::worker_process(&pool).await?
    });
    Ok(ExitCode::SUCCESS)
}
