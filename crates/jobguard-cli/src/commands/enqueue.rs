//! `jobguard enqueue`: puts one job on the queue.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use jobguard::queue::{Enqueued, NewJob};
use jobguard::{Backend, JobKey, Queue};
use serde::Serialize;
use serde_json::Value;
use sqlx::Pool;

use crate::args::{Target, parse_duration};
use crate::builtin_jobs;
use crate::database::{Database, is_missing_table, redact};
use crate::on_pool;
use crate::report;

#[derive(Args, Debug)]
pub struct EnqueueArgs {
    /// The job's kind: `credit`, `noop` and `fail` are built in; any other kind needs --key.
    kind: String,
    /// The payload, as JSON, e.g. '{"order": "o-1", "account": 7, "amount": 500}'.
    #[arg(long)]
    payload: String,
    /// The job key, `kind:part[:part...]`, naming the business operation; built-in kinds
    /// derive it from the payload.
    #[arg(long)]
    key: Option<String>,
    /// The queue to put the job on.
    #[arg(long, default_value = jobguard::queue::DEFAULT_QUEUE)]
    queue: String,
    /// Attempts before the job is dead-lettered.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_attempts: u32,
    /// Run the job only after this long, e.g. 30s or 5m.
    #[arg(long, value_parser = parse_duration)]
    delay: Option<Duration>,
    #[command(flatten)]
    target: Target,
}

/// What `jobguard enqueue --json` prints.
#[derive(Debug, Serialize)]
struct EnqueueReport {
    id: i64,
    /// False when a job with the same key was already waiting or running.
    inserted: bool,
    kind: String,
    key: String,
    queue: String,
}

pub async fn enqueue(args: EnqueueArgs) -> anyhow::Result<ExitCode> {
    // Every check that needs no database comes first.
    let job = new_job(&args)?;
    on_pool!(Database::connect(&args.target.database_url, 2).await?, pool => run(pool, &args, &job).await)
}

fn new_job(args: &EnqueueArgs) -> anyhow::Result<NewJob> {
    let payload: Value = serde_json::from_str(&args.payload)
        .map_err(|error| anyhow!("--payload is not valid JSON: {error}"))?;
    let given_key = args
        .key
        .as_deref()
        .map(|key| JobKey::parse(key).with_context(|| format!("invalid --key `{key}`")))
        .transpose()?;
    let (key, payload) = match builtin_jobs::check(&args.kind, &payload)? {
        Some(checked) => {
            if let Some(given) = given_key
                && given != checked.key
            {
                bail!(
                    "--key `{given}` does not match the payload: a `{}` job's key is derived \
                     from its payload, here `{}`; leave out --key",
                    args.kind,
                    checked.key
                );
            }
            (checked.key, checked.payload)
        }
        None => {
            let Some(key) = given_key else {
                bail!(
                    "`{}` is not a built-in job kind ({}), so its key cannot be derived from the \
                     payload: give it with --key, naming the operation, e.g. --key {}:<id>",
                    args.kind,
                    builtin_jobs::KINDS.join(", "),
                    args.kind
                );
            };
            (key, payload)
        }
    };
    let job = NewJob::new(key, &payload)?
        .kind(&args.kind)
        .with_context(|| format!("invalid job kind `{}`", args.kind))?
        .queue(&args.queue)
        .map_err(|_| {
            anyhow!(
                "invalid --queue `{}`: a queue name starts with an ASCII letter and has only \
                 ASCII letters, digits, `_`, `-` and `.`, at most 64 bytes",
                args.queue
            )
        })?
        .max_attempts(args.max_attempts)
        .delay(args.delay.unwrap_or_default());
    Ok(job)
}

async fn run<DB: Backend>(
    pool: Pool<DB>,
    args: &EnqueueArgs,
    job: &NewJob,
) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let queue = Queue::new(pool.clone());
    let enqueued = enqueue_creating(&queue, job)
        .await
        .map_err(|error| match error {
            jobguard::Error::KeyReused { key } => anyhow!(
                "job key `{key}` is held by a job that is waiting or running with another \
                 payload or kind: nothing was enqueued; give different work its own key, or \
                 enqueue the original payload"
            ),
            error => anyhow::Error::new(error)
                .context(format!("cannot enqueue `{}` in {database}", job.key())),
        })?;
    pool.close().await;

    let report = EnqueueReport {
        id: enqueued.id,
        inserted: enqueued.inserted,
        kind: args.kind.clone(),
        key: job.key().to_string(),
        queue: args.queue.clone(),
    };
    if !builtin_jobs::KINDS.contains(&args.kind.as_str()) {
        eprintln!(
            "note: `jobguard worker` runs only {}; jobs of kind `{}` need a worker of your own \
             that registers the kind",
            builtin_jobs::KINDS.join(", "),
            args.kind
        );
    }
    report::print(&report, args.target.json, |report| {
        if report.inserted {
            format!(
                "enqueued job {} ({}) on queue `{}`\n",
                report.id, report.key, report.queue
            )
        } else {
            format!(
                "job {} ({}) is already waiting or running: not enqueued again (inserted: \
                 false)\n",
                report.id, report.key
            )
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Enqueues, creating the queue's table the first time: no DDL when it exists, as creating
/// an index that exists still waits for the writers of its table on PostgreSQL.
async fn enqueue_creating<DB: Backend>(
    queue: &Queue<DB>,
    job: &NewJob,
) -> jobguard::Result<Enqueued> {
    match queue.enqueue(job).await {
        Err(error) if is_missing_table(&error) => {
            queue.migrate().await?;
            queue.enqueue(job).await
        }
        result => result,
    }
}
