//! `jobguard prune`: deletes guard rows older than the retention, in batches, the step
//! ledger's `done` steps of the same age, and the queue's completed and dead jobs older than
//! --keep-completed and --keep-dead; refuses a retention shorter than the horizon, a horizon
//! that reaches the provider key lifetime, and a --keep-dead shorter than the replay window.

use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use jobguard::retention::{PrunePlan, PruneReport, format_duration};
use jobguard::steps::{StepConfig, Steps};
use jobguard::{Backend, Guard, Pruner, Queue, Retention, TableName};
use serde::Serialize;
use sqlx::Pool;

use super::retention::{DeclaredWindows, JobKeeping, WorkerTiming, retention_config};
use crate::args::{Target, parse_duration};
use crate::database::{Database, is_missing_table, redact};
use crate::on_pool;
use crate::report;

/// Arguments of `jobguard prune`.
#[derive(Args, Debug)]
pub struct PruneArgs {
    /// How long guard rows are kept (e.g. 14d); must cover the horizon `jobguard retention`
    /// prints, unless --override-horizon.
    #[arg(long, default_value = "14d", value_parser = parse_duration)]
    keep: Duration,
    /// Rows deleted per statement.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: u32,
    /// The pause between batches, which lets the workers' jobs through.
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    pause: Duration,
    /// Count what would be deleted, and delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Prune even though --keep is shorter than the horizon: duplicates that arrive later than
    /// --keep after their key was applied will apply again.
    #[arg(long)]
    override_horizon: bool,
    /// The step ledger whose `done` steps are pruned too, when it exists.
    #[arg(long, default_value = "jobguard_steps")]
    steps_table: String,
    #[command(flatten)]
    timing: WorkerTiming,
    #[command(flatten)]
    windows: DeclaredWindows,
    #[command(flatten)]
    jobs: JobKeeping,
    /// The jobs table whose completed and dead jobs are pruned too, when it exists.
    #[arg(long, default_value = "jobguard_jobs")]
    jobs_table: String,
    #[command(flatten)]
    target: Target,
}

/// What `jobguard prune --json` prints.
#[derive(Debug, Serialize)]
struct PruneOutput {
    backend: &'static str,
    database: String,
    table: String,
    /// The step ledger pruned with it, when it exists.
    steps_table: Option<String>,
    /// The jobs table whose finished jobs are pruned with it, when it exists.
    jobs_table: Option<String>,
    keep_completed_seconds: f64,
    keep_dead_seconds: f64,
    /// Completed jobs deleted, or that would be with --dry-run.
    completed_jobs: u64,
    /// Dead jobs deleted, or that would be with --dry-run.
    dead_jobs: u64,
    keep_seconds: f64,
    horizon_seconds: f64,
    /// Whether --keep is shorter than the horizon, accepted with --override-horizon.
    overridden: bool,
    dry_run: bool,
    /// Guard rows deleted, or that would be with --dry-run.
    guard_rows: u64,
    /// `done` steps deleted, or that would be with --dry-run.
    step_rows: u64,
    /// Delete statements run (0 with --dry-run).
    batches: u64,
    seconds: f64,
    /// The age of the oldest guard row left (or now, with --dry-run); null when empty.
    oldest_age_seconds: Option<f64>,
}

/// Runs `jobguard prune`.
pub async fn prune(args: PruneArgs) -> anyhow::Result<ExitCode> {
    let config = retention_config(args.keep, &args.windows, &args.jobs, args.override_horizon);
    // Refused before touching the database.
    let retention = config.validate(&args.timing.retry(), args.timing.lease)?;
    let steps_table = TableName::new(&args.steps_table).context("invalid --steps-table")?;
    let jobs_table = TableName::new(&args.jobs_table).context("invalid --jobs-table")?;
    let tables = (steps_table, jobs_table);
    on_pool!(Database::connect(&args.target.database_url, 4).await?, pool => run(pool, retention, tables, args).await)
}

async fn run<DB: Backend>(
    pool: Pool<DB>,
    retention: Retention,
    (steps_table, jobs_table): (TableName, TableName),
    args: PruneArgs,
) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let guard = Guard::new(pool.clone());
    let mut pruner = Pruner::new(&guard, retention.clone())
        .batch(args.batch)
        .pause(args.pause);
    let steps = Steps::with_config(
        pool.clone(),
        StepConfig::default().table(steps_table.clone()),
    );
    let has_steps = match steps.attention(1).await {
        Ok(_) => true,
        Err(error) if is_missing_table(&error) => false,
        Err(error) => {
            return Err(error).context(format!("cannot read the step ledger in {database}"));
        }
    };
    if has_steps {
        pruner = pruner.steps(steps);
    }
    let queue = Queue::with_table(pool.clone(), jobs_table.clone())?;
    let has_jobs = match queue.counts().await {
        Ok(_) => true,
        Err(error) if is_missing_table(&error) => false,
        Err(error) => {
            return Err(error).context(format!("cannot read the jobs table in {database}"));
        }
    };
    if has_jobs {
        pruner = pruner.jobs(&queue);
    }
    let plan = pruner.plan().await.map_err(|error| {
        if is_missing_table(&error) {
            anyhow::anyhow!(
                "there is no guard table `{}` in {database}: check --database-url (`jobguard \
                 worker` creates it)",
                guard.table()
            )
        } else {
            anyhow::Error::new(error).context(format!("cannot read the guard in {database}"))
        }
    })?;
    let mut output = PruneOutput {
        backend: DB::BACKEND,
        database,
        table: guard.table().to_string(),
        steps_table: has_steps.then(|| steps_table.to_string()),
        jobs_table: has_jobs.then(|| jobs_table.to_string()),
        keep_completed_seconds: retention.keep_completed().as_secs_f64(),
        keep_dead_seconds: retention.keep_dead().as_secs_f64(),
        completed_jobs: plan.completed_jobs,
        dead_jobs: plan.dead_jobs,
        keep_seconds: retention.keep().as_secs_f64(),
        horizon_seconds: retention.horizon().total().as_secs_f64(),
        overridden: retention.is_overridden(),
        dry_run: args.dry_run,
        guard_rows: plan.guard_rows,
        step_rows: plan.step_rows,
        batches: 0,
        seconds: 0.0,
        oldest_age_seconds: plan.oldest_age.map(|age| age.as_secs_f64()),
    };
    if !args.dry_run {
        let report = run_with_progress(&pruner, &plan, !args.target.json).await?;
        output.guard_rows = report.guard_rows;
        output.step_rows = report.step_rows;
        output.completed_jobs = report.completed_jobs;
        output.dead_jobs = report.dead_jobs;
        output.batches = report.batches;
        output.seconds = report.elapsed.as_secs_f64();
        output.oldest_age_seconds = report.oldest_age.map(|age| age.as_secs_f64());
    }
    report::print(&output, args.target.json, |output| {
        render(output, &retention)
    })?;
    Ok(ExitCode::SUCCESS)
}

async fn run_with_progress<DB: Backend>(
    pruner: &Pruner<DB>,
    plan: &PrunePlan,
    show: bool,
) -> anyhow::Result<PruneReport> {
    let total = plan.guard_rows + plan.step_rows + plan.completed_jobs + plan.dead_jobs;
    let bar = if show && std::io::stderr().is_terminal() && total > 0 {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "pruning [{bar:40}] {pos}/{len} rows ({per_sec}, {eta} left)",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let report = pruner
        .run_with(|report| {
            bar.set_position(
                report.guard_rows + report.step_rows + report.completed_jobs + report.dead_jobs,
            );
            ControlFlow::Continue(())
        })
        .await?;
    bar.finish_and_clear();
    match report {
        Some(report) => Ok(report),
        None => bail!(
            "another prune is running on this guard table (a worker's scheduled prune, or \
             another `jobguard prune`); nothing was deleted, try again when it is done"
        ),
    }
}

fn render(output: &PruneOutput, retention: &Retention) -> String {
    let keep = format_duration(retention.keep());
    let mut out = if retention.is_overridden() {
        format!(
            "WARNING: --keep {keep} is shorter than the horizon {}; duplicates that arrive later \
             than {keep} apply again\n",
            retention.horizon()
        )
    } else {
        format!(
            "retention {keep} covers the horizon {}\n",
            format_duration(retention.horizon().total())
        )
    };
    let steps = match &output.steps_table {
        Some(table) => format!(" and {} done steps from `{table}`", output.step_rows),
        None => String::new(),
    };
    if output.dry_run {
        out += &format!(
            "dry run: would delete {} guard rows from `{}`{steps}, older than {keep}\n",
            output.guard_rows, output.table
        );
    } else {
        out += &format!(
            "deleted {} guard rows from `{}`{steps}, older than {keep}, in {:.2} s ({} batches)\n",
            output.guard_rows, output.table, output.seconds, output.batches
        );
    }
    if let Some(table) = &output.jobs_table {
        let verb = if output.dry_run {
            "would delete"
        } else {
            "deleted"
        };
        out += &format!(
            "{verb} {} completed jobs older than {} and {} dead jobs older than {} from `{table}`\n",
            output.completed_jobs,
            format_duration(retention.keep_completed()),
            output.dead_jobs,
            format_duration(retention.keep_dead()),
        );
    }
    let oldest = match output.oldest_age_seconds {
        Some(age) => format_duration(Duration::from_secs_f64(age)),
        None => "none, the table is empty".to_owned(),
    };
    out += &format!("oldest guard row: {oldest}\n");
    out
}
