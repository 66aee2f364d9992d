//! `jobguard jobs`: job counts by state and the newest jobs.

use std::process::ExitCode;

use clap::Args;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use comfy_table::{Cell, CellAlignment};
use jobguard::queue::{Counts, JobRow, JobState};
use jobguard::{Backend, Queue};
use serde::Serialize;
use sqlx::Pool;

use crate::args::Target;
use crate::database::{Database, read_error, redact};
use crate::on_pool;
use crate::report::{self, shorten, table, time};

#[derive(Args, Debug)]
pub struct JobsArgs {
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

pub async fn jobs(args: JobsArgs) -> anyhow::Result<ExitCode> {
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
