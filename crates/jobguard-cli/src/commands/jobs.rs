//! `jobguard jobs`: job counts by state and the newest jobs; `jobguard jobs show|retry|cancel|
//! delete ID`: one job in full, and what an operator does to it, through
//! [`jobguard::console::Console`] as the console's API does.

use std::process::ExitCode;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Subcommand};
use comfy_table::{Cell, CellAlignment};
use jobguard::console::{Console, JobDetail};
use jobguard::queue::{Counts, JobRow, JobState};
use jobguard::{Backend, Queue};
use serde::Serialize;
use sqlx::Pool;

use crate::args::Target;
use crate::database::{Database, read_error, redact};
use crate::on_pool;
use crate::report::{self, shorten, table, time};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct JobsArgs {
    #[command(subcommand)]
    command: Option<JobCommand>,
    /// List only jobs in this state.
    #[arg(
        long,
        value_parser = PossibleValuesParser::new(["available", "running", "completed", "dead"])
            .map(|state| state.parse::<JobState>().expect("one of the possible values"))
    )]
    state: Option<JobState>,
    /// List only jobs of this kind.
    #[arg(long)]
    kind: Option<String>,
    /// How many of the newest jobs to list.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    limit: u32,
    #[command(flatten)]
    target: Target,
}

/// What `jobguard jobs --json` prints.
#[derive(Debug, Serialize)]
struct JobsReport {
    /// Every job of the table by state, whatever the filters.
    counts: Counts,
    /// The newest jobs that match the filters, newest first.
    jobs: Vec<JobRow>,
}

/// What an operator does to one job.
#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// One job in full: payload, attempts, last error, times, and the guard row of its key.
    Show(JobIdArgs),
    /// Run a dead job again with fresh attempts, or a failed job waiting for its backoff now.
    Retry(JobIdArgs),
    /// Make a job that waits to run never run (it is dead-lettered, never attempted).
    Cancel(JobIdArgs),
    /// Delete a job that is not running (its key's guard row stays).
    Delete(JobIdArgs),
}

#[derive(Args, Debug)]
pub struct JobIdArgs {
    /// The job's id, as `jobguard jobs` lists it.
    id: i64,
    #[command(flatten)]
    target: Target,
}

pub async fn jobs(args: JobsArgs) -> anyhow::Result<ExitCode> {
    if let Some(command) = args.command {
        return job(command).await;
    }
    on_pool!(Database::connect(&args.target.database_url, 2).await?, pool => run(pool, &args).await)
}

async fn run<DB: Backend>(pool: Pool<DB>, args: &JobsArgs) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let queue = Queue::new(pool.clone());
    let counts = queue
        .counts()
        .await
        .map_err(|error| read_error(error, &database))?;
    let jobs = queue
        .list(args.state, args.kind.as_deref(), args.limit)
        .await
        .map_err(|error| read_error(error, &database))?;
    pool.close().await;
    let report = JobsReport { counts, jobs };
    report::print(&report, args.target.json, |report| render(report, args))?;
    Ok(ExitCode::SUCCESS)
}

fn render(report: &JobsReport, args: &JobsArgs) -> String {
    let counts = &report.counts;
    let mut out = format!(
        "jobs by state: {} available, {} running, {} completed, {} dead\n",
        counts.available, counts.running, counts.completed, counts.dead
    );
    let mut filter = String::new();
    if let Some(state) = args.state {
        filter += &format!(" {state}");
    }
    filter += " jobs";
    if let Some(kind) = &args.kind {
        filter += &format!(" of kind `{kind}`");
    }
    if report.jobs.is_empty() {
        out += &format!("no{filter}\n");
        return out;
    }
    out += &format!("newest{filter}:\n");
    let mut table = table(&[
        "id",
        "kind",
        "key",
        "queue",
        "state",
        "attempt",
        "run at (UTC)",
        "last error",
    ]);
    for job in &report.jobs {
        table.add_row(vec![
            Cell::new(job.id).set_alignment(CellAlignment::Right),
            Cell::new(&job.kind),
            Cell::new(&job.key),
            Cell::new(&job.queue),
            Cell::new(job.state),
            Cell::new(format!("{}/{}", job.attempt, job.max_attempts))
                .set_alignment(CellAlignment::Right),
            Cell::new(time(job.run_at)),
            Cell::new(shorten(job.last_error.as_deref().unwrap_or(""), 60)),
        ]);
    }
    out += &format!("{table}\n");
    out
}

async fn job(command: JobCommand) -> anyhow::Result<ExitCode> {
    let (JobCommand::Show(args)
    | JobCommand::Retry(args)
    | JobCommand::Cancel(args)
    | JobCommand::Delete(args)) = &command;
    let pool = Database::connect(&args.target.database_url, 2).await?;
    on_pool!(pool, pool => act(pool, &command, args).await)
}

/// What `jobguard jobs retry|cancel|delete --json` prints, as the API answers.
#[derive(Debug, Serialize)]
struct Acted {
    id: i64,
    done: &'static str,
    /// The job as it is now; `None` once deleted.
    job: Option<JobDetail>,
}

async fn act<DB: Backend>(
    pool: Pool<DB>,
    command: &JobCommand,
    args: &JobIdArgs,
) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let console = Console::new(Queue::new(pool.clone()));
    let id = args.id;
    let done = match command {
        JobCommand::Show(_) => {
            let job = console
                .job(id)
                .await
                .map_err(|error| console_error(error, &database))?;
            pool.close().await;
            report::print(&job, args.target.json, render_job)?;
            return Ok(ExitCode::SUCCESS);
        }
        JobCommand::Retry(_) => ("retried", console.retry(id).await),
        JobCommand::Cancel(_) => ("cancelled", console.cancel(id).await),
        JobCommand::Delete(_) => ("deleted", console.delete(id).await),
    };
    let (done, result) = done;
    result.map_err(|error| console_error(error, &database))?;
    let job = match console.job(id).await {
        Ok(job) => Some(job),
        Err(jobguard::Error::JobNotFound { .. }) => None,
        Err(error) => return Err(error.into()),
    };
    pool.close().await;
    let acted = Acted { id, done, job };
    report::print(&acted, args.target.json, |acted| match &acted.job {
        Some(job) => format!("job {} {}: now {}\n", acted.id, acted.done, job.job.state),
        None => format!("job {} {}\n", acted.id, acted.done),
    })?;
    Ok(ExitCode::SUCCESS)
}

/// One job in full, for the terminal.
pub fn render_job(job: &JobDetail) -> String {
    let row = &job.job;
    let mut out = format!(
        "job {} ({}) on queue `{}`: {}, attempt {}/{}\n",
        row.id, row.kind, row.queue, row.state, row.attempt, row.max_attempts
    );
    out += &format!("key:         {}\n", row.key);
    out += &format!("enqueued:    {}\n", time(row.created_at));
    out += &format!("runs/ran at: {}\n", time(row.run_at));
    if let Some(finished) = row.finished_at {
        out += &format!("finished:    {}\n", time(finished));
    }
    if let Some(until) = job.leased_until {
        out += &format!("leased until {} (token {})\n", time(until), job.lease_token);
    }
    if let Some(error) = &row.last_error {
        out += &format!("last error:  {error}\n");
    }
    out += &format!("payload:     {}\n", row.payload);
    out += &match &job.guard {
        Some(guard) => format!(
            "guard:       key applied at {} by kind `{}`{}\n",
            time(guard.applied_at),
            guard.kind,
            match &guard.result {
                Some(result) => format!(", result {result}"),
                None => String::new(),
            }
        ),
        None => "guard:       the key was not applied (or its guard row was pruned)\n".to_owned(),
    };
    out
}

/// A console error as the operator reads it: an unknown job, a refused action or a bad name
/// as they are, anything else with the database named.
pub fn console_error(error: jobguard::Error, database: &str) -> anyhow::Error {
    match error {
        jobguard::Error::JobNotFound { .. }
        | jobguard::Error::JobConflict { .. }
        | jobguard::Error::Key(_) => anyhow::Error::new(error),
        error => read_error(error, database),
    }
}
