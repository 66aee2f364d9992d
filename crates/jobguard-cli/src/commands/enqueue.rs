//! `jobguard enqueue`: puts one job on the queue.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use jobguard::queue::{Enqueued, JobState, NewJob};
use jobguard::unique::{OnConflict, UniqueOpts, UniqueStates};
use jobguard::{Backend, JobKey, Queue};
use serde::Serialize;
use serde_json::Value;
use sqlx::Pool;

use crate::args::{Target, parse_duration};
use crate::builtin_jobs;
use crate::database::{Database, is_missing_column, is_missing_table, redact};
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
    /// The states that keep the job's key taken, comma-separated: available,running (always)
    /// plus completed and/or dead, e.g. available,running,completed: a key whose job completed
    /// is then never enqueued again (until retention prunes the job).
    #[arg(long, value_name = "STATES", value_parser = parse_states)]
    unique_states: Option<UniqueStates>,
    /// Append the period the job's run time falls in to its key, e.g. 1d or 1h: one job (and
    /// one effect) per key per period, counted from the Unix epoch in UTC.
    #[arg(long, value_name = "PERIOD", value_parser = parse_period)]
    unique_period: Option<Duration>,
    /// Append the queue to the job's key: the same work on two queues is two jobs.
    #[arg(long)]
    unique_by_queue: bool,
    /// What to do when a job already holds the key: return it (the default), reject (exit 1
    /// naming it), replace its payload and run time while it still waits (a job a worker holds,
    /// or a finished one, keeps its payload: said on stderr, exit 0), or replace-or-reject
    /// (replace while it waits, else exit 1 naming it).
    #[arg(long, value_name = "ACTION", default_value = "return", value_parser = parse_on_conflict)]
    on_conflict: OnConflict,
    #[command(flatten)]
    target: Target,
}

fn parse_states(text: &str) -> Result<UniqueStates, String> {
    text.parse()
        .map_err(|error: jobguard::unique::UniqueError| error.to_string())
}

fn parse_period(text: &str) -> Result<Duration, String> {
    let period = parse_duration(text)?;
    UniqueOpts::new()
        .period(period)
        .map_err(|error| error.to_string())?;
    Ok(period)
}

fn parse_on_conflict(text: &str) -> Result<OnConflict, String> {
    text.parse()
        .map_err(|error: jobguard::unique::UniqueError| error.to_string())
}

/// What `jobguard enqueue --json` prints.
#[derive(Debug, Serialize)]
struct EnqueueReport {
    /// The job inserted, or the one holding the key.
    id: i64,
    /// False when a job held the key already: waiting or running, or finished in a state its
    /// unique policy keeps the key in.
    inserted: bool,
    /// The job that held the key, when one did.
    existing_id: Option<i64>,
    /// Its state, when one did.
    existing_state: Option<JobState>,
    /// True when the waiting job that held the key took this payload and run time.
    replaced: bool,
    /// True when the enqueue was refused (`--on-conflict reject`, or `replace-or-reject` and
    /// the job holding the key no longer waits): the exit code is 1.
    rejected: bool,
    kind: String,
    /// The key as stored, with the queue and period appended when asked for.
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
    let mut unique = UniqueOpts::new()
        .states(args.unique_states.unwrap_or_default())
        .on_conflict(args.on_conflict);
    if let Some(period) = args.unique_period {
        unique = unique.period(period)?;
    }
    if args.unique_by_queue {
        unique = unique.by_queue();
    }
    // The key as stored, fixed now so that the report names it.
    Ok(job.unique(unique).resolve_key()?)
}

async fn run<DB: Backend>(
    pool: Pool<DB>,
    args: &EnqueueArgs,
    job: &NewJob,
) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let queue = Queue::new(pool.clone());
    let enqueued = match enqueue_creating(&queue, job).await {
        Ok(enqueued) => Ok(enqueued),
        Err(
            jobguard::Error::EnqueueRejected {
                existing_id, state, ..
            }
            | jobguard::Error::ReplaceRejected {
                existing_id, state, ..
            },
        ) => Err((existing_id, state.parse::<JobState>().ok())),
        Err(jobguard::Error::KeyReused { key }) => {
            return Err(anyhow!(
                "job key `{key}` is held by a job with another payload or kind: nothing was \
                 enqueued; give different work its own key, or enqueue the original payload"
            ));
        }
        Err(error) => {
            return Err(anyhow::Error::new(error)
                .context(format!("cannot enqueue `{}` in {database}", job.key())));
        }
    };
    pool.close().await;

    let report = match enqueued {
        Ok(enqueued) => EnqueueReport {
            id: enqueued.id,
            inserted: enqueued.inserted,
            existing_id: (!enqueued.inserted).then_some(enqueued.id),
            existing_state: enqueued.existing_state,
            replaced: enqueued.replaced,
            rejected: false,
            kind: args.kind.clone(),
            key: job.key().to_string(),
            queue: args.queue.clone(),
        },
        Err((existing_id, existing_state)) => EnqueueReport {
            id: existing_id,
            inserted: false,
            existing_id: Some(existing_id),
            existing_state,
            replaced: false,
            rejected: true,
            kind: args.kind.clone(),
            key: job.key().to_string(),
            queue: args.queue.clone(),
        },
    };
    if let Some(why) = kept_payload(args.on_conflict, &report) {
        eprintln!(
            "warning: job {} ({}) kept its payload, as {why}: the payload given was not enqueued \
             (replaced: false); use --on-conflict replace-or-reject to have this fail",
            report.id, report.key
        );
    }
    if !builtin_jobs::KINDS.contains(&args.kind.as_str()) {
        eprintln!(
            "note: `jobguard worker` runs only {}; jobs of kind `{}` need a worker of your own \
             that registers the kind",
            builtin_jobs::KINDS.join(", "),
            args.kind
        );
    }
    report::print(&report, args.target.json, |report| {
        let state = report
            .existing_state
            .map_or_else(|| "unknown".to_owned(), |state| state.to_string());
        if report.inserted {
            format!(
                "enqueued job {} ({}) on queue `{}`\n",
                report.id, report.key, report.queue
            )
        } else if report.rejected {
            format!(
                "job key `{}` is taken by job {} ({state}): nothing was enqueued \
                 (--on-conflict {})\n",
                report.key, report.id, args.on_conflict
            )
        } else if report.replaced {
            format!(
                "job {} ({}) was waiting: its payload and run time were replaced (replaced: \
                 true)\n",
                report.id, report.key
            )
        } else if args.on_conflict == OnConflict::Replace {
            format!(
                "job {} ({}) holds the key but no longer waits ({state}): returned as it is, \
                 not replaced (replaced: false)\n",
                report.id, report.key
            )
        } else if matches!(state.as_str(), "available" | "running") {
            format!(
                "job {} ({}) is already waiting or running ({state}): not enqueued again \
                 (inserted: false)\n",
                report.id, report.key
            )
        } else {
            format!(
                "job {} ({}) keeps the key under its unique policy ({state}): not enqueued \
                 again (inserted: false)\n",
                report.id, report.key
            )
        }
    })?;
    Ok(if report.rejected {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Why a `--on-conflict replace` left the payload of the job holding the key as it was, when
/// it did: the producer's payload was dropped, though the exit code is 0.
fn kept_payload(action: OnConflict, report: &EnqueueReport) -> Option<String> {
    if action != OnConflict::Replace || report.inserted || report.replaced {
        return None;
    }
    Some(match report.existing_state {
        Some(JobState::Running) => "a worker holds it (running)".to_owned(),
        Some(state @ (JobState::Completed | JobState::Dead)) => {
            format!("it has finished ({state}) and its unique policy keeps the key")
        }
        _ => "it no longer waits".to_owned(),
    })
}

/// Enqueues, creating the queue's table the first time: no DDL when it exists, as creating
/// an index that exists still waits for the writers of its table on PostgreSQL.
async fn enqueue_creating<DB: Backend>(
    queue: &Queue<DB>,
    job: &NewJob,
) -> jobguard::Result<Enqueued> {
    match queue.enqueue(job).await {
        // A table made before the unique policies' columns is migrated the same way.
        Err(error) if is_missing_table(&error) || is_missing_column(&error) => {
            queue.migrate().await?;
            queue.enqueue(job).await
        }
        result => result,
    }
}
