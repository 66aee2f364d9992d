//! `jobguard queue list|pause|resume`: the queues, and stopping and starting workers' fetches
//! from one without stopping the workers.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use comfy_table::{Cell, CellAlignment};
use jobguard::console::{Console, QueueState};
use jobguard::{Backend, Queue};
use serde::Serialize;
use sqlx::Pool;

use super::jobs::console_error;
use crate::args::Target;
use crate::database::{Database, redact};
use crate::on_pool;
use crate::report::{self, table, time};

#[derive(Subcommand, Debug)]
pub enum QueueCommand {
    /// Queues with jobs ready to run or paused once: paused or not, jobs ready now.
    List(ListArgs),
    /// No worker fetches the queue's jobs until it is resumed; jobs already fetched finish.
    Pause(NameArgs),
    /// Workers fetch the queue's jobs again.
    Resume(NameArgs),
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    target: Target,
}

#[derive(Args, Debug)]
pub struct NameArgs {
    /// The queue's name.
    name: String,
    #[command(flatten)]
    target: Target,
}

/// What `jobguard queue pause|resume --json` prints, as the API answers.
#[derive(Debug, Serialize)]
struct Changed<'a> {
    queue: &'a str,
    paused: bool,
}

pub async fn queue(command: QueueCommand) -> anyhow::Result<ExitCode> {
    let target = match &command {
        QueueCommand::List(args) => &args.target,
        QueueCommand::Pause(args) | QueueCommand::Resume(args) => &args.target,
    };
    let pool = Database::connect(&target.database_url, 2).await?;
    on_pool!(pool, pool => run(pool, &command, target).await)
}

async fn run<DB: Backend>(
    pool: Pool<DB>,
    command: &QueueCommand,
    target: &Target,
) -> anyhow::Result<ExitCode> {
    let database = redact(&target.database_url);
    let console = Console::new(Queue::new(pool.clone()));
    match command {
        QueueCommand::List(_) => {
            let queues = console
                .queues()
                .await
                .map_err(|error| console_error(error, &database))?;
            report::print(&queues, target.json, |queues| render(queues))?;
        }
        QueueCommand::Pause(args) | QueueCommand::Resume(args) => {
            let paused = matches!(command, QueueCommand::Pause(_));
            let done = if paused {
                console.pause(&args.name).await
            } else {
                console.resume(&args.name).await
            };
            done.map_err(|error| console_error(error, &database))?;
            let changed = Changed {
                queue: &args.name,
                paused,
            };
            report::print(&changed, target.json, |changed| {
                format!(
                    "queue `{}` {}\n",
                    changed.queue,
                    if changed.paused {
                        "paused: no worker fetches its jobs until `jobguard queue resume`"
                    } else {
                        "resumed"
                    }
                )
            })?;
        }
    }
    pool.close().await;
    Ok(ExitCode::SUCCESS)
}

fn render(queues: &[QueueState]) -> String {
    if queues.is_empty() {
        return "no queue has jobs ready or was ever paused\n".to_owned();
    }
    let mut out = table(&["queue", "state", "ready", "since (UTC)"]);
    for queue in queues {
        out.add_row(vec![
            Cell::new(&queue.name),
            Cell::new(if queue.paused { "paused" } else { "running" }),
            Cell::new(queue.ready).set_alignment(CellAlignment::Right),
            Cell::new(queue.changed_at.map(time).unwrap_or_default()),
        ]);
    }
    format!("{out}\n")
}
