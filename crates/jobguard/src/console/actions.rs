//! What an operator does to a job or a queue: retry, cancel, delete, pause, resume.
//!
//! Each job action is one statement that changes the job only from the states it applies to;
//! when it changes nothing, the job is read back to say why: [`Error::JobNotFound`] or
//! [`Error::JobConflict`] with the reason. On SQLite each takes this process's turn to write,
//! as the queue's own writes do.

use crate::error::{Error, Result};
use crate::key::check_kind;
use crate::queue::JobState;
use crate::store::Backend;
use crate::store::console::{JobStateOf, QueueState};

use super::{Console, is_missing_table};

/// The error a cancelled job is left with.
pub const CANCELLED: &str = "cancelled by an operator before it ran";

/// An action on one job, for the statement it runs and the words it is refused with.
#[derive(Clone, Copy, Debug)]
enum Action {
    Retry,
    Cancel,
    Delete,
}

impl Action {
    fn done(self) -> &'static str {
        match self {
            Action::Retry => "retried",
            Action::Cancel => "cancelled",
            Action::Delete => "deleted",
        }
    }
}

impl<DB: Backend> Console<DB> {
    /// Runs job `id` again now: a dead job comes back with fresh attempts (as a replay), a
    /// failed job waiting for its retry's backoff runs at once. A job whose key the guard
    /// holds reports a duplicate when it runs, as a replayed one does.
    ///
    /// Refused with [`Error::JobConflict`] for a job that waits for its first attempt, runs or
    /// completed, and for a dead job while another job with its key waits or runs.
    pub async fn retry(&self, id: i64) -> Result<()> {
        self.act(Action::Retry, id).await
    }

    /// Makes job `id`, waiting to run, never run: it is dead-lettered with the error
    /// [`CANCELLED`] and no attempt. A cancelled job can be retried (or replayed) like any dead
    /// one, and is pruned with them. Refused with [`Error::JobConflict`] unless the job waits:
    /// a running job finishes or fails on its own.
    pub async fn cancel(&self, id: i64) -> Result<()> {
        self.act(Action::Cancel, id).await
    }

    /// Deletes job `id` (waiting, completed or dead) from the table. Its key's guard row stays:
    /// the key's effect was applied or not, and a new job with the key is a duplicate or
    /// applies accordingly. Refused with [`Error::JobConflict`] for a running job.
    pub async fn delete(&self, id: i64) -> Result<()> {
        self.act(Action::Delete, id).await
    }

    async fn act(&self, action: Action, id: i64) -> Result<()> {
        let (statement, text) = match action {
            Action::Retry => (&self.sql.retry, None),
            Action::Cancel => (&self.sql.cancel, Some(CANCELLED)),
            Action::Delete => (&self.sql.delete, None),
        };
        let changed = {
            let _writer = self.queue.write_turn().await;
            DB::console_act(self.queue.pool(), statement, id, text).await
        };
        match changed {
            Ok(Some(queue)) => {
                if matches!(action, Action::Retry) {
                    self.wake(&queue).await?;
                }
                Ok(())
            }
            Ok(None) => Err(self.refusal(action, id).await?),
            // Another job with the key became live between the statement's check and its
            // write: the live-key index refused the retry.
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                Err(self.refusal(action, id).await?)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Why `action` changed nothing on job `id`.
    async fn refusal(&self, action: Action, id: i64) -> Result<Error> {
        let pool = self.queue.pool();
        let Some(JobStateOf { state, key }) = DB::console_state(pool, &self.sql, id).await? else {
            return Ok(Error::JobNotFound { id });
        };
        let state: JobState = state.parse()?;
        let reason = match (action, state) {
            (_, JobState::Running) => match action {
                Action::Retry => "it is running now".to_owned(),
                _ => "it is running: a worker holds it, and it completes, retries or dies on \
                      its own"
                    .to_owned(),
            },
            (Action::Retry, JobState::Completed) => "it completed: its effect was applied, \
                and running it again would be a duplicate (enqueue a job with a new key for \
                new work)"
                .to_owned(),
            (Action::Retry, JobState::Available) => "it has not failed: it waits for its first \
                attempt, which runs at its run time"
                .to_owned(),
            (Action::Retry, JobState::Dead) => {
                match DB::console_live_holder(pool, &self.sql, &key, id).await? {
                    Some(holder) => format!(
                        "job {holder} with the same key `{key}` is waiting or running; watch that \
                         one instead"
                    ),
                    None => "it changed while it was being retried; look again".to_owned(),
                }
            }
            (Action::Cancel, state) => {
                format!("it is {state}: only a job waiting to run can be cancelled")
            }
            (Action::Delete, _) => "it changed while it was being deleted; look again".to_owned(),
        };
        Ok(Error::JobConflict {
            id,
            action: action.done(),
            reason,
        })
    }

    /// Pauses `queue`: from when this returns, no worker fetches its jobs (on both backends
    /// the fetch statement itself checks the queue's state), until [`resume`](Self::resume).
    /// Jobs already fetched run to their end. Enqueueing goes on. A name that is not a valid
    /// queue name is refused with [`Error::Key`].
    pub async fn pause(&self, queue: &str) -> Result<()> {
        self.set_paused(queue, true).await
    }

    /// Resumes `queue` and wakes its idle workers.
    pub async fn resume(&self, queue: &str) -> Result<()> {
        self.set_paused(queue, false).await?;
        self.wake(queue).await
    }

    async fn set_paused(&self, queue: &str, paused: bool) -> Result<()> {
        check_kind(queue)?;
        for first in [true, false] {
            let set = {
                let _writer = self.queue.write_turn().await;
                DB::console_set_paused(self.queue.pool(), &self.sql, queue, paused).await
            };
            match set {
                // A queue migrated before queues could be paused has no table of states yet.
                Err(error) if first && is_missing_table(&error) => self.queue.migrate().await?,
                set => return Ok(set?),
            }
        }
        unreachable!("the second round returns")
    }

    /// Every queue with jobs ready to run or paused once, by name: whether it is paused, and
    /// its jobs ready now.
    pub async fn queues(&self) -> Result<Vec<QueueState>> {
        let backlog = self.queue.backlog().await?;
        let states = match DB::console_queues(self.queue.pool(), &self.sql).await {
            Err(error) if is_missing_table(&error) => Vec::new(),
            states => states?,
        };
        let mut queues: std::collections::BTreeMap<String, QueueState> = states
            .into_iter()
            .map(|state| (state.name.clone(), state))
            .collect();
        for backlog in backlog {
            queues
                .entry(backlog.queue.clone())
                .or_insert_with(|| QueueState {
                    name: backlog.queue.clone(),
                    paused: false,
                    changed_at: None,
                    ready: 0,
                })
                .ready = backlog.ready;
        }
        Ok(queues.into_values().collect())
    }

    /// Wakes idle workers of `queue` on PostgreSQL; nothing on SQLite, whose workers poll.
    async fn wake(&self, queue: &str) -> Result<()> {
        let mut conn = self.queue.pool().acquire().await?;
        self.queue
            .notify(&mut conn, queue, crate::queue::Announce::Committed)
            .await
    }
}
