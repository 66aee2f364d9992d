//! The dashboard's figures: what `jobguard serve` answers at `/api/stats` and exports at
//! `/metrics`, and what `jobguard stats` prints. The database's figures (queue backlog, dead
//! letters, steps needing attention, the guard's memory horizon) are read from its tables here;
//! the outcome counts come from the process that ran the jobs.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;

use jobguard::queue::{Counts, JobState};
use jobguard::steps::Steps;
use jobguard::{Backend, Guard, Queue};
use serde::{Deserialize, Serialize};
use sqlx::Pool;

use crate::database::is_missing_table;

/// Dead letters listed, newest first.
pub const DEAD_LETTERS_SHOWN: u32 = 50;
/// Steps needing attention listed, oldest first.
pub const STEPS_SHOWN: u32 = 50;

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
