//! `jobguard dead list` and `jobguard dead replay`: the dead letters.

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{ArgGroup, Args, Subcommand};
use comfy_table::Cell;
use jobguard::queue::{JobRow, JobState, Replay};
use jobguard::{Backend, Queue};
use serde::Serialize;
use sqlx::Pool;

use crate::args::Target;
use crate::database::{Database, is_missing_table, read_error, redact};
use crate::on_pool;
use crate::report::{self, table, time};

#[derive(Subcommand, Debug)]
pub enum DeadCommand {
    /// The dead-lettered jobs, newest first, with the error that killed them.
    List(DeadListArgs),
    /// Make dead jobs available again with fresh attempts.
    Replay(ReplayArgs),
}

#[derive(Args, Debug)]
pub struct DeadListArgs {
    /// List only dead jobs of this kind.
    #[arg(long)]
    kind: Option<String>,
    /// How many of the newest dead jobs to list.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    limit: u32,
    #[command(flatten)]
    target: Target,
}

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("which").required(true).args(["id", "kind", "all"])))]
pub struct ReplayArgs {
    /// Replay the dead job with this id.
    #[arg(long)]
    id: Option<i64>,
    /// Replay every dead job of this kind.
    #[arg(long)]
    kind: Option<String>,
    /// Replay every dead job.
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    target: Target,
}

/// What `jobguard dead replay --json` prints.
#[derive(Debug, Serialize)]
struct ReplayReport {
    replayed: Vec<i64>,
}

pub async fn dead(command: DeadCommand) -> anyhow::Result<ExitCode> {
    let url = match &command {
        DeadCommand::List(args) => &args.target.database_url,
        DeadCommand::Replay(args) => &args.target.database_url,
    };
    on_pool!(Database::connect(url, 2).await?, pool => run(pool, &command).await)
}

async fn run<DB: Backend>(pool: Pool<DB>, command: &DeadCommand) -> anyhow::Result<ExitCode> {
    let queue = Queue::new(pool.clone());
    let code = match command {
        DeadCommand::List(args) => list(&queue, args).await,
        DeadCommand::Replay(args) => replay(&queue, args).await,
    };
    pool.close().await;
    code
}

async fn list<DB: Backend>(queue: &Queue<DB>, args: &DeadListArgs) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let jobs = queue
        .list(Some(JobState::Dead), args.kind.as_deref(), args.limit)
        .await
        .map_err(|error| read_error(error, &database))?;
    report::print(&jobs, args.target.json, |jobs| {
        render(jobs, args.kind.as_deref())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn render(jobs: &[JobRow], kind: Option<&str>) -> String {
    let of_kind = kind.map(|k| format!(" of kind `{k}`")).unwrap_or_default();
    if jobs.is_empty() {
        return format!("no dead jobs{of_kind}\n");
    }
    let mut table = table(&["id", "kind", "key", "attempts", "last run (UTC)", "error"]);
    for job in jobs {
        let mut row =
            report::dead_job_cells(job.id, &job.kind, &job.key, job.attempt, job.max_attempts);
        row.extend([
            Cell::new(time(job.run_at)),
            Cell::new(job.last_error.as_deref().unwrap_or("")),
        ]);
        table.add_row(row);
    }
    format!(
        "{} dead job{}{of_kind}, newest first:\n{table}\nreplay with `jobguard dead replay --id ID`, \
         `--kind KIND` or `--all`\n",
        jobs.len(),
        if jobs.len() == 1 { "" } else { "s" }
    )
}

async fn replay<DB: Backend>(queue: &Queue<DB>, args: &ReplayArgs) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let which = match (args.id, &args.kind) {
        (Some(id), _) => Replay::Job(id),
        (None, Some(kind)) => Replay::Kind(kind.clone()),
        (None, None) => Replay::All,
    };
    let replayed = match queue.replay(&which).await {
        Err(error) if is_missing_table(&error) => return Err(read_error(error, &database)),
        result => result.with_context(|| format!("cannot replay dead jobs in {database}"))?,
    };
    if let (Some(id), true) = (args.id, replayed.is_empty()) {
        bail!(
            "job {id} was not replayed: no dead job has that id, or another job with its key is \
             waiting or running (see `jobguard jobs`)"
        );
    }
    report::print(
        &ReplayReport { replayed },
        args.target.json,
        |ReplayReport { replayed }| {
            if replayed.is_empty() {
                return "no dead jobs to replay\n".to_owned();
            }
            let ids: Vec<String> = replayed.iter().map(i64::to_string).collect();
            format!(
                "replayed {} dead job{}: {}\nthey run on the next `jobguard worker`; a key the guard \
             already applied completes as a duplicate\n",
                replayed.len(),
                if replayed.len() == 1 { "" } else { "s" },
                ids.join(", ")
            )
        },
    )?;
    Ok(ExitCode::SUCCESS)
}
