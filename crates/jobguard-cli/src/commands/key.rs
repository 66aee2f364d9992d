//! `jobguard key KEY`: everything stored about one job key: its guard row, the jobs that
//! carried it, its external steps and its outbox messages.

use std::process::ExitCode;

use clap::Args;
use comfy_table::{Cell, CellAlignment};
use jobguard::console::{Console, JobOutcome, KeyOutcome, KeyReport};
use jobguard::{Backend, Queue};
use sqlx::Pool;

use super::jobs::console_error;
use crate::args::Target;
use crate::database::{Database, redact};
use crate::on_pool;
use crate::report::{self, shorten, table, time};

#[derive(Args, Debug)]
pub struct KeyArgs {
    /// The job key, exactly as stored (e.g. `credit:order-8812`).
    key: String,
    #[command(flatten)]
    target: Target,
}

pub async fn key(args: KeyArgs) -> anyhow::Result<ExitCode> {
    on_pool!(Database::connect(&args.target.database_url, 2).await?, pool => run(pool, &args).await)
}

async fn run<DB: Backend>(pool: Pool<DB>, args: &KeyArgs) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let console = Console::new(Queue::new(pool.clone()));
    let report = console
        .key(&args.key)
        .await
        .map_err(|error| console_error(error, &database))?;
    pool.close().await;
    let known = report.guard.is_some() || !report.jobs.is_empty();
    report::print(&report, args.target.json, render)?;
    // Like the API's 404: nothing is known of the key.
    Ok(if known {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn render(report: &KeyReport) -> String {
    let mut out = match &report.guard {
        Some(guard) => {
            format!(
                "key `{}`: applied at {} by kind `{}`{}{}\n",
                report.key,
                time(guard.applied_at),
                guard.kind,
                match &guard.fingerprint {
                    Some(fingerprint) =>
                        format!(", payload fingerprint {}", shorten(fingerprint, 16)),
                    None => String::new(),
                },
                match &guard.result {
                    Some(result) => format!(", result {result}"),
                    None => String::new(),
                }
            ) + &match guard.applied_by {
                Some(id) => format!("applied by job {id}\n"),
                None => {
                    "applied outside the queue (or by a job that did not record it)\n".to_owned()
                }
            }
        }
        None => format!(
            "key `{}`: not applied (no guard row: never run to its commit, or pruned)\n",
            report.key
        ),
    };
    if report.jobs.is_empty() {
        out += "no job carries it\n";
    } else {
        out += "jobs that carried it, newest first:\n";
        let mut jobs = table(&[
            "id",
            "kind",
            "queue",
            "state",
            "outcome",
            "attempt",
            "enqueued",
            "kept while",
            "replaced",
            "last error",
        ]);
        for row in &report.jobs {
            let job = &row.job;
            jobs.add_row(vec![
                Cell::new(job.id).set_alignment(CellAlignment::Right),
                Cell::new(&job.kind),
                Cell::new(&job.queue),
                Cell::new(job.state),
                Cell::new(outcome(&row.outcome)),
                Cell::new(format!("{}/{}", job.attempt, job.max_attempts)),
                Cell::new(time(job.created_at)),
                Cell::new(job.unique_states),
                Cell::new(if job.replaced > 0 {
                    format!("{}x", job.replaced)
                } else {
                    String::new()
                }),
                Cell::new(shorten(job.last_error.as_deref().unwrap_or(""), 60)),
            ]);
        }
        out += &format!("{jobs}\n");
    }
    // Why a repeated enqueue of the key does not insert.
    out += &match &report.holder {
        None => "no job holds the key: an enqueue of it inserts a job\n".to_owned(),
        Some(holder) if holder.live => format!(
            "job {} holds the key ({}): an enqueue of it returns that job (--on-conflict \
             return), is refused (reject), or replaces its payload while it waits (replace)\n",
            holder.id, holder.state
        ),
        Some(holder) => format!(
            "job {} keeps the key while {}, by its unique policy: an enqueue with a policy of \
             its own returns it or is refused; one without inserts a job\n",
            holder.id, holder.state
        ),
    };
    for step in &report.steps {
        out += &format!(
            "step `{}` ({}): {}, {} attempts{}\n",
            step.step,
            step.kind,
            step.state,
            step.attempts,
            step.reason
                .as_deref()
                .map(|reason| format!(": {reason}"))
                .unwrap_or_default()
        );
    }
    for message in &report.messages {
        out += &format!(
            "outbox message `{}`: {}, {} deliveries{}\n",
            message.id,
            message.state,
            message.attempts,
            message
                .last_error
                .as_deref()
                .map(|error| format!(", last error: {error}"))
                .unwrap_or_default()
        );
    }
    out
}

/// Whether a job applied the key or completed as a duplicate, and of which job.
fn outcome(outcome: &KeyOutcome) -> String {
    match (outcome.outcome, outcome.duplicate_of) {
        (Some(JobOutcome::Applied), _) => "applied".to_owned(),
        (Some(JobOutcome::Duplicate), Some(of)) => format!("duplicate of {of}"),
        (Some(JobOutcome::Duplicate), None) => "duplicate".to_owned(),
        (None, _) => String::new(),
    }
}
