//! `jobguard stats`: the figures of `jobguard serve`'s dashboard, in the terminal.
//!
//! The database's figures (queue backlog, dead letters, steps needing attention, the guard's
//! memory horizon) are read from the database itself. Outcome counts per kind exist only in the
//! process that ran the jobs: `--url` reads everything, those included, from a running
//! `jobguard serve --worker`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use comfy_table::{Cell, CellAlignment};
use jobguard::queue::{Counts, JobState};
use jobguard::steps::Steps;
use jobguard::{Backend, Guard, Queue};
use serde::{Deserialize, Serialize};
use sqlx::Pool;

use crate::args::Target;
use crate::args::Token;
use crate::database::{Database, is_missing_table, redact};
use crate::on_pool;
use crate::report::{self, shorten, table, time};

/// Dead letters listed, newest first.
pub const DEAD_LETTERS_SHOWN: u32 = 50;
/// Steps needing attention listed, oldest first.
pub const STEPS_SHOWN: u32 = 50;

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Read the figures from a running `jobguard serve` at this URL (e.g.
    /// http://127.0.0.1:9464), with the outcomes its worker counted, instead of the database.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// The token of that `jobguard serve`, needed when it listens on a non-loopback address.
    #[arg(long, env = "JOBGUARD_TOKEN", hide_env_values = true, value_parser = Token::parse)]
    token: Option<Token>,
    #[command(flatten)]
    target: Target,
}

/// Everything the dashboard shows: what `jobguard stats --json` prints and what
/// `jobguard serve` answers at `/api/stats`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Figures {
    /// `postgres` or `sqlite`.
    pub backend: String,
    /// The database, its password hidden.
    pub database: String,
    /// When the database was read, in milliseconds since the Unix epoch.
    pub sampled_at: u64,
    /// The job queue; `None` when the database has none yet.
    pub queue: Option<QueueFigures>,
    /// The newest dead letters, up to [`DEAD_LETTERS_SHOWN`].
    pub dead_letters: Vec<DeadLetter>,
    /// External steps needing attention; `None` when there is no step ledger.
    pub steps: Option<StepFigures>,
    /// The guard's memory; `None` when there is no guard table yet.
    pub guard: Option<GuardFigures>,
    /// Outcomes counted by this process's worker: only from `jobguard serve`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcomes: Option<OutcomeFigures>,
}

/// Jobs by state, and what is ready to run per queue.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct QueueFigures {
    pub available: i64,
    pub running: i64,
    pub completed: i64,
    pub dead: i64,
    /// Whether `completed` or `dead` is an estimate: above 100,000 finished jobs of a state the
    /// counts are estimated, so that a sample stays cheap on a huge table.
    #[serde(default)]
    pub estimated: bool,
    /// Per queue with jobs ready to run.
    pub backlog: Vec<QueueBacklog>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct QueueBacklog {
    pub queue: String,
    /// Jobs ready to run now.
    pub ready: i64,
    /// How long the oldest of them has been due, in seconds.
    pub oldest_wait: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeadLetter {
    pub id: i64,
    pub kind: String,
    pub key: String,
    pub attempt: i32,
    pub max_attempts: i32,
    /// When it last ran, in milliseconds since the Unix epoch.
    pub run_at: u64,
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepFigures {
    /// Steps marked `attention`.
    pub attention: u64,
    /// The oldest of them, up to [`STEPS_SHOWN`].
    pub steps: Vec<AttentionStep>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AttentionStep {
    pub key: String,
    pub step: String,
    pub reason: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GuardFigures {
    pub table: String,
    /// The age of the oldest guard row in seconds: how far back the guard remembers keys;
    /// `None` when the table is empty.
    pub oldest_age: Option<f64>,
}

/// What the worker of `jobguard serve --worker` counted, per kind.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OutcomeFigures {
    /// Whether this process runs a worker; without one nothing is counted here.
    pub worker: bool,
    /// The length of a spike-detection window, in seconds.
    pub window: f64,
    /// Applied and duplicate deliveries per kind since the process started.
    pub totals: BTreeMap<String, KindTotals>,
    /// The closed windows, oldest first, then the open one.
    pub windows: Vec<WindowFigures>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct KindTotals {
    pub applied: u64,
    pub duplicates: u64,
    /// Whether the kind's last closed window was a spike.
    pub spike: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WindowFigures {
    /// When the window ended, in milliseconds since the Unix epoch.
    pub ended: u64,
    /// Whether the window is still open.
    pub open: bool,
    pub kinds: BTreeMap<String, KindWindowFigures>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KindWindowFigures {
    pub applied: u64,
    pub duplicates: u64,
    pub baseline: f64,
    pub spike: bool,
}

impl From<&jobguard::spikes::Window> for WindowFigures {
    fn from(window: &jobguard::spikes::Window) -> Self {
        WindowFigures {
            ended: millis(window.ended),
            open: false,
            kinds: window
                .kinds
                .iter()
                .map(|(kind, w)| {
                    let figures = KindWindowFigures {
                        applied: w.applied,
                        duplicates: w.duplicates,
                        baseline: w.baseline,
                        spike: w.spike,
                    };
                    (kind.clone(), figures)
                })
                .collect(),
        }
    }
}

pub fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// The tables the figures are read from.
pub struct Tables<DB: Backend> {
    pub queue: Queue<DB>,
    pub guard: Guard<DB>,
    pub steps: Steps<DB>,
}

impl<DB: Backend> Tables<DB> {
    /// The default tables of `pool`'s database.
    pub fn new(pool: Pool<DB>) -> Self {
        Tables {
            queue: Queue::new(pool.clone()),
            guard: Guard::new(pool.clone()),
            steps: Steps::new(pool),
        }
    }

    /// Reads the database's figures. A table that does not exist yet reads as `None`.
    pub async fn read(&self, database: &str) -> anyhow::Result<Figures> {
        let context = || format!("cannot read the figures of {database}");
        let queue = absent_if_missing(self.queue_figures().await).with_context(context)?;
        let dead_letters = match queue {
            Some(_) => self
                .queue
                .list(Some(JobState::Dead), None, DEAD_LETTERS_SHOWN)
                .await
                .with_context(context)?
                .into_iter()
                .map(|job| DeadLetter {
                    id: job.id,
                    kind: job.kind,
                    key: job.key,
                    attempt: job.attempt,
                    max_attempts: job.max_attempts,
                    run_at: millis(job.run_at),
                    error: job.last_error,
                })
                .collect(),
            None => Vec::new(),
        };
        let steps = absent_if_missing(self.step_figures().await).with_context(context)?;
        let oldest = absent_if_missing(self.guard.oldest_age().await).with_context(context)?;
        let guard = oldest.map(|age| GuardFigures {
            table: self.guard.table().to_string(),
            oldest_age: age.map(|age| age.as_secs_f64()),
        });
        Ok(Figures {
            backend: DB::BACKEND.to_owned(),
            database: database.to_owned(),
            sampled_at: millis(SystemTime::now()),
            queue,
            dead_letters,
            steps,
            guard,
            outcomes: None,
        })
    }

    async fn queue_figures(&self) -> jobguard::Result<QueueFigures> {
        let counts = self.queue.counts().await?;
        let estimated = counts.is_estimated();
        let Counts {
            available,
            running,
            completed,
            dead,
        } = counts;
        let backlog = self.queue.backlog().await?;
        Ok(QueueFigures {
            available,
            running,
            completed,
            dead,
            estimated,
            backlog: backlog
                .into_iter()
                .map(|b| QueueBacklog {
                    queue: b.queue,
                    ready: b.ready,
                    oldest_wait: b.oldest_wait.as_secs_f64(),
                })
                .collect(),
        })
    }

    async fn step_figures(&self) -> jobguard::Result<StepFigures> {
        let attention = self.steps.attention_count().await?;
        let steps = self.steps.attention(STEPS_SHOWN).await?;
        Ok(StepFigures {
            attention,
            steps: steps
                .into_iter()
                .map(|s| AttentionStep {
                    key: s.key,
                    step: s.step,
                    reason: s.reason,
                })
                .collect(),
        })
    }
}

/// `Ok(None)` for a table that does not exist yet.
fn absent_if_missing<T>(read: jobguard::Result<T>) -> jobguard::Result<Option<T>> {
    match read {
        Ok(value) => Ok(Some(value)),
        Err(error) if is_missing_table(&error) => Ok(None),
        Err(error) => Err(error),
    }
}

pub async fn stats(args: StatsArgs) -> anyhow::Result<ExitCode> {
    let figures = match &args.url {
        Some(url) => from_serve(url, args.token.as_ref()).await?,
        None => {
            let database = redact(&args.target.database_url);
            on_pool!(Database::connect(&args.target.database_url, 2).await?, pool => read(pool, &database).await?)
        }
    };
    report::print(&figures, args.target.json, render)?;
    Ok(ExitCode::SUCCESS)
}

async fn read<DB: Backend>(pool: Pool<DB>, database: &str) -> anyhow::Result<Figures> {
    let figures = Tables::new(pool.clone()).read(database).await;
    pool.close().await;
    figures
}

async fn from_serve(url: &str, token: Option<&Token>) -> anyhow::Result<Figures> {
    let endpoint = format!("{}/api/stats", url.trim_end_matches('/'));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let mut request = client.get(&endpoint);
    if let Some(token) = token {
        request = request.bearer_auth(token.secret());
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("cannot reach jobguard serve at {endpoint}"))?;
    let status = response.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        bail!(
            "jobguard serve at {url} refused the request: it needs its token (--token or \
             JOBGUARD_TOKEN)"
        );
    }
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        bail!(
            "jobguard serve at {endpoint} answered {status}: {}",
            body.trim()
        );
    }
    response
        .json()
        .await
        .with_context(|| format!("{endpoint} did not answer with jobguard serve's figures"))
}

/// The figures as text, in the order of the dashboard.
pub fn render(figures: &Figures) -> String {
    let mut out = format!(
        "jobguard stats: {} ({}), read at {}\n\n",
        figures.database,
        figures.backend,
        time(UNIX_EPOCH + Duration::from_millis(figures.sampled_at))
    );
    match &figures.outcomes {
        Some(outcomes) if !outcomes.totals.is_empty() => {
            let mut table = table(&["kind", "applied", "duplicates", "duplicate spike"]);
            for (kind, totals) in &outcomes.totals {
                table.add_row(vec![
                    Cell::new(kind),
                    Cell::new(totals.applied).set_alignment(CellAlignment::Right),
                    Cell::new(totals.duplicates).set_alignment(CellAlignment::Right),
                    Cell::new(if totals.spike { "SPIKE" } else { "no" }),
                ]);
            }
            out += &format!("outcomes counted by this server's worker:\n{table}\n");
        }
        Some(outcomes) if outcomes.worker => {
            out += "outcomes: none counted yet by this server's worker\n";
        }
        Some(_) => {
            out += "outcomes: this server runs no worker (start it with --worker to count them)\n";
        }
        None => {
            out += "outcomes: counted only by the process that runs the jobs; use --url to read \
                    them from a running `jobguard serve --worker`\n";
        }
    }
    out.push('\n');
    match &figures.queue {
        Some(queue) => {
            out += &format!(
                "jobs: {} available, {} running, {} completed, {} dead{}\n",
                queue.available,
                queue.running,
                queue.completed,
                queue.dead,
                if queue.estimated {
                    " (finished jobs estimated: over 100,000 of a state)"
                } else {
                    ""
                }
            );
            if queue.backlog.is_empty() {
                out += "no job is waiting for a worker\n";
            } else {
                let mut table = table(&["queue", "ready", "oldest waiting"]);
                for backlog in &queue.backlog {
                    table.add_row(vec![
                        Cell::new(&backlog.queue),
                        Cell::new(backlog.ready).set_alignment(CellAlignment::Right),
                        Cell::new(age(backlog.oldest_wait)).set_alignment(CellAlignment::Right),
                    ]);
                }
                out += &format!("{table}\n");
            }
        }
        None => out += "jobs: there is no job queue in this database yet\n",
    }
    out.push('\n');
    let dead = figures.queue.as_ref().map_or(0, |queue| queue.dead);
    if figures.dead_letters.is_empty() {
        out += "dead letters: none\n";
    } else {
        let mut table = table(&["id", "kind", "key", "attempts", "error"]);
        for job in &figures.dead_letters {
            table.add_row(vec![
                Cell::new(job.id).set_alignment(CellAlignment::Right),
                Cell::new(&job.kind),
                Cell::new(&job.key),
                Cell::new(format!("{}/{}", job.attempt, job.max_attempts))
                    .set_alignment(CellAlignment::Right),
                Cell::new(shorten(job.error.as_deref().unwrap_or(""), 60)),
            ]);
        }
        out += &format!(
            "dead letters: {dead} (newest first; replay with `jobguard dead replay --id ID`)\n\
             {table}\n"
        );
    }
    out.push('\n');
    match &figures.steps {
        Some(steps) if steps.attention > 0 => {
            let mut table = table(&["key", "step", "reason"]);
            for step in &steps.steps {
                table.add_row(vec![
                    Cell::new(&step.key),
                    Cell::new(&step.step),
                    Cell::new(shorten(&step.reason, 60)),
                ]);
            }
            out += &format!(
                "external steps needing attention: {} (settle with `jobguard steps resolve`)\n\
                 {table}\n",
                steps.attention
            );
        }
        Some(_) => out += "external steps needing attention: none\n",
        None => out += "external steps needing attention: there is no step ledger\n",
    }
    match &figures.guard {
        Some(GuardFigures {
            table,
            oldest_age: Some(seconds),
        }) => {
            out += &format!(
                "guard memory horizon: the oldest key in `{table}` was applied {} ago\n",
                age(*seconds)
            );
        }
        Some(GuardFigures { table, .. }) => {
            out += &format!("guard memory horizon: `{table}` holds no key yet\n");
        }
        None => out += "guard memory horizon: there is no guard table yet\n",
    }
    out
}

/// Seconds as people read them: `250ms`, `42s`, `3d 4h`.
fn age(seconds: f64) -> String {
    let duration = Duration::from_secs_f64(seconds.max(0.0));
    if duration < Duration::from_secs(1) {
        return format!("{}ms", duration.as_millis());
    }
    let rounded = Duration::from_secs(duration.as_secs());
    humantime::format_duration(rounded).to_string()
}

#[cfg(test)]
mod tests {
    use super::age;

    #[test]
    fn ages_read_as_people_write_them() {
        assert_eq!(age(0.25), "250ms");
        assert_eq!(age(42.7), "42s");
        assert_eq!(age(90_061.0), "1day 1h 1m 1s");
    }
}
