//! A job queue on PostgreSQL or SQLite, built for at-least-once delivery that the guard turns
//! into exactly-once effects.
//!
//! Jobs wait in one table. Workers take them in batches with a *lease* (a visibility timeout
//! computed by the database clock); a job whose lease expires is handed out again, to the same
//! or another worker. Completing, retrying or extending a job names the attempt that holds the
//! lease, so a worker whose lease expired and was taken over changes nothing: it is *fenced*.
//!
//! ```no_run
//! use jobguard::queue::{NewJob, Queue};
//! use jobguard::JobKey;
//!
//! # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
//! let queue = Queue::new(pool);
//! queue.migrate().await?;
//! let key = JobKey::new("credit", ["order-8812"])?;
//! let job = NewJob::new(key, &serde_json::json!({"account": 7, "amount": 500}))?;
//! let first = queue.enqueue(&job).await?;
//! let again = queue.enqueue(&job).await?; // the producer retried: same job, no second row
//! assert_eq!(first.id, again.id);
//! assert!(first.inserted && !again.inserted);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::Pool;

use crate::error::{Error, Result};
use crate::guard::{Guard, GuardConfig};
use crate::key::{JobKey, check_kind};
use crate::payload::payload_problem;
use crate::store::Backend;
use crate::store::WriterLock;
use crate::table::TableName;

/// The queue a job goes to unless told otherwise.
pub const DEFAULT_QUEUE: &str = "default";
/// The largest payload accepted, in bytes of JSON.
pub use crate::payload::MAX_PAYLOAD_BYTES;
/// The PostgreSQL channel on which enqueues wake idle workers.
pub const NOTIFY_CHANNEL: &str = "jobguard_jobs";

/// A job to enqueue: a kind, a key, a JSON payload and where and when to run it.
#[derive(Clone, Debug, PartialEq)]
pub struct NewJob {
    pub(crate) kind: String,
    pub(crate) key: JobKey,
    pub(crate) payload: Value,
    pub(crate) queue: String,
    pub(crate) max_attempts: u32,
    pub(crate) delay: Duration,
}

impl NewJob {
    /// A job whose kind is its key's kind, on the default queue, with 10 attempts.
    ///
    /// The payload is validated here: it must serialize to JSON of at most
    /// [`MAX_PAYLOAD_BYTES`] without NUL characters (PostgreSQL rejects `\u0000` in `jsonb`).
    pub fn new<P: Serialize + ?Sized>(key: JobKey, payload: &P) -> Result<Self> {
        let payload = serde_json::to_value(payload).map_err(|source| Error::Payload {
            key: key.to_string(),
            source,
        })?;
        if let Some(reason) = payload_problem(&payload, "it", "enqueue") {
            return Err(Error::InvalidPayload {
                key: key.to_string(),
                reason,
            });
        }
        Ok(NewJob {
            kind: key.kind().to_owned(),
            key,
            payload,
            queue: DEFAULT_QUEUE.to_owned(),
            max_attempts: 10,
            delay: Duration::ZERO,
        })
    }

    /// Runs the job with the handler registered for `kind` rather than the key's kind.
    pub fn kind(mut self, kind: &str) -> Result<Self> {
        check_kind(kind)?;
        self.kind = kind.to_owned();
        Ok(self)
    }

    /// Puts the job on another queue (same naming rules as a kind).
    pub fn queue(mut self, queue: &str) -> Result<Self> {
        check_kind(queue)?;
        self.queue = queue.to_owned();
        Ok(self)
    }

    /// Attempts before the job is dead-lettered (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.clamp(1, i32::MAX as u32);
        self
    }

    /// Makes the job available only after `delay`, by the database clock.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The job's key.
    pub fn key(&self) -> &JobKey {
        &self.key
    }
}

/// What [`Queue::enqueue`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id.
    pub id: i64,
    /// False when a job with the same key was already waiting or running and was returned
    /// instead of inserting another.
    pub inserted: bool,
}

/// The right to finish one attempt of a job.
///
/// Every fetch of a job draws a new token, and only the newest token can complete, retry,
/// extend or release the job: a worker whose lease expired and was taken over is fenced off,
/// even after the job was released or replayed and its attempt count went back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lease {
    /// The job's id.
    pub job_id: i64,
    /// The attempt this lease is for, starting at 1.
    pub attempt: i32,
    /// The fencing token: how many times the job has been fetched, this time included.
    pub token: i64,
}

/// A job taken from the queue under a lease.
#[derive(Clone, Debug, PartialEq)]
pub struct LeasedJob {
    /// The lease to complete, retry, extend or release the job with.
    pub lease: Lease,
    /// The handler to run.
    pub kind: String,
    /// The job key as stored.
    pub key: String,
    /// The payload.
    pub payload: Value,
    /// Attempts before the job is dead-lettered.
    pub max_attempts: i32,
    /// When the lease expires, by the database clock.
    pub leased_until: SystemTime,
}

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting to run, now or at its run time.
    Available,
    /// Leased to a worker.
    Running,
    /// Finished.
    Completed,
    /// Failed for good: out of attempts, or a fatal error. Can be replayed.
    Dead,
}

impl JobState {
    /// The state's name as stored.
    pub fn as_str(&self) -> &'static str {
        match self {
            JobState::Available => "available",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Dead => "dead",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "available" => Ok(JobState::Available),
            "running" => Ok(JobState::Running),
            "completed" => Ok(JobState::Completed),
            "dead" => Ok(JobState::Dead),
            other => Err(Error::Database(sqlx::Error::Decode(
                format!("unknown job state `{other}`").into(),
            ))),
        }
    }
}

/// A job as listed by [`Queue::list`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobRow {
    /// The job's id.
    pub id: i64,
    /// The handler it runs with.
    pub kind: String,
    /// The job key.
    pub key: String,
    /// The queue it is on.
    pub queue: String,
    /// Where it is in its life.
    pub state: JobState,
    /// Attempts made so far.
    pub attempt: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// When it runs, or ran last.
    #[serde(serialize_with = "serialize_time")]
    pub run_at: SystemTime,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// When it was enqueued.
    #[serde(serialize_with = "serialize_time")]
    pub created_at: SystemTime,
    /// The payload.
    pub payload: Value,
}

fn serialize_time<S: serde::Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    let micros = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    s.serialize_u64(micros as u64 / 1000)
}

/// Which dead jobs [`Queue::replay`] brings back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replay {
    /// One job, by id.
    Job(i64),
    /// Every dead job of a kind.
    Kind(String),
    /// Every dead job.
    All,
}

/// Finished jobs of one state (completed, dead) that [`Queue::counts`] counts one by one;
/// above this many it estimates, so that a dashboard sample stays cheap on a huge table.
pub const TERMINAL_COUNT_CAP: i64 = 100_000;

/// Job counts by state, from [`Queue::counts`].
///
/// Live jobs (available, running) are counted exactly. Finished ones are counted exactly up to
/// [`TERMINAL_COUNT_CAP`] per state; above it the count is estimated (on PostgreSQL from the
/// planner's row count of the table, on SQLite from the span of job ids), never less than the
/// cap, and [`is_estimated`](Self::is_estimated) says so.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Waiting to run.
    pub available: i64,
    /// Leased to a worker.
    pub running: i64,
    /// Finished.
    pub completed: i64,
    /// Dead-lettered.
    pub dead: i64,
}

impl Counts {
    /// Whether `completed` or `dead` is an estimate: [`TERMINAL_COUNT_CAP`] rows or more.
    pub fn is_estimated(&self) -> bool {
        self.completed >= TERMINAL_COUNT_CAP || self.dead >= TERMINAL_COUNT_CAP
    }
}

/// The jobs of one queue that are ready to run and waiting for a worker, from
/// [`Queue::backlog`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Backlog {
    /// The queue's name.
    pub queue: String,
    /// Jobs available whose run time has come.
    pub ready: i64,
    /// How long the oldest of them has been due, by the database clock.
    #[serde(serialize_with = "serialize_seconds")]
    pub oldest_wait: Duration,
}

fn serialize_seconds<S: serde::Serializer>(wait: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(wait.as_secs_f64())
}

/// The queue's statements, built once from its validated table name.
#[doc(hidden)]
#[derive(Debug)]
pub struct QueueSql {
    pub(crate) table: TableName,
    pub(crate) create: Vec<Arc<str>>,
    pub(crate) enqueue: Arc<str>,
    pub(crate) live_job: Arc<str>,
    pub(crate) fetch: Arc<str>,
    pub(crate) complete: Arc<str>,
    pub(crate) retry: Arc<str>,
    pub(crate) dead: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) heartbeat: Arc<str>,
    pub(crate) rescue: Arc<str>,
    pub(crate) counts: Arc<str>,
    pub(crate) backlog: Arc<str>,
    pub(crate) list: Arc<str>,
    pub(crate) replay: Arc<str>,
    pub(crate) notify: Option<Arc<str>>,
    /// Deletes a batch of finished jobs of one state: `$1` state, `$2` cutoff, `$3` limit,
    /// `$4` the earliest finish time to look at; returns the finish times deleted (SQLite) or
    /// their count and the latest (PostgreSQL).
    pub(crate) prune_jobs: Arc<str>,
    /// Counts the finished jobs of one state before a cutoff: `$1` state, `$2` cutoff.
    pub(crate) count_prunable_jobs: Arc<str>,
}

/// How a settled lease ends.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum Settle<'a> {
    Complete,
    Retry { delay: Duration, error: &'a str },
    Dead { error: &'a str },
    Release,
    Extend { lease: Duration },
}

/// The job queue. Cheap to clone.
pub struct Queue<DB: Backend> {
    inner: Arc<QueueInner<DB>>,
}

struct QueueInner<DB: Backend> {
    pool: Pool<DB>,
    sql: QueueSql,
    writer: WriterLock,
    /// When each queue name was last announced, to send at most one notification per queue
    /// per [`NOTIFY_EVERY`]: a NOTIFY per insert would serialise commits under load.
    last_notify: Mutex<HashMap<String, Instant>>,
}

const NOTIFY_EVERY: Duration = Duration::from_millis(20);

impl<DB: Backend> Clone for Queue<DB> {
    fn clone(&self) -> Self {
        Queue {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<DB: Backend> fmt::Debug for Queue<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("table", &self.inner.sql.table.to_string())
            .finish()
    }
}

impl<DB: Backend> Queue<DB> {
    /// The table jobs wait in unless configured: `jobguard_jobs`.
    pub const DEFAULT_TABLE: &'static str = "jobguard_jobs";

    /// A queue on the `jobguard_jobs` table.
    pub fn new(pool: Pool<DB>) -> Self {
        let table = TableName::new(Self::DEFAULT_TABLE).expect("the default name is valid");
        Self::with_table(pool, table).expect("the default table suits every backend")
    }

    /// A queue on another table. Fails for a schema on SQLite.
    pub fn with_table(pool: Pool<DB>, table: TableName) -> Result<Self> {
        let sql = DB::queue_sql(&table)?;
        let inner = QueueInner {
            pool,
            sql,
            writer: WriterLock::for_backend::<DB>(),
            last_notify: Mutex::default(),
        };
        Ok(Queue {
            inner: Arc::new(inner),
        })
    }

    /// A guard on the same database whose writers take turns with this queue's on SQLite, as
    /// the [`Worker`](crate::Worker) uses.
    pub fn guard(&self, config: GuardConfig) -> Result<Guard<DB>> {
        Guard::with_writer(self.inner.pool.clone(), config, self.inner.writer.clone())
    }

    pub(crate) fn sql(&self) -> &QueueSql {
        &self.inner.sql
    }

    /// This process's turn to write on SQLite (shared with the queue's guard); nothing on
    /// PostgreSQL.
    ///
    /// Everything that writes under the turn takes it *before* a connection from the pool,
    /// never while holding one: a task holding a connection while it waited for the turn
    /// could leave the turn's holder waiting for a connection, each waiting for the other.
    pub(crate) async fn write_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.inner.writer.acquire().await
    }

    /// The pool the queue uses.
    pub fn pool(&self) -> &Pool<DB> {
        &self.inner.pool
    }

    /// Creates the queue's table and indexes when missing.
    pub async fn migrate(&self) -> Result<()> {
        Ok(DB::migrate_statements(
            &self.inner.pool,
            &self.inner.sql.table,
            &self.inner.sql.create,
        )
        .await?)
    }

    /// Enqueues a job, or returns the job with the same key that is already waiting or
    /// running. Visible to workers as soon as this returns.
    ///
    /// The same key with another payload or kind is refused with [`Error::KeyReused`].
    pub async fn enqueue(&self, job: &NewJob) -> Result<Enqueued> {
        let _writer = self.inner.writer.acquire().await;
        let mut conn = self.inner.pool.acquire().await?;
        self.enqueue_tx(&mut conn, job).await
    }

    /// Enqueues a job inside the caller's transaction. Workers see it when the transaction
    /// **commits**; on **rollback** it was never enqueued. Enqueue a job in the same
    /// transaction as the state change that calls for it, and the two cannot disagree.
    pub async fn enqueue_tx(&self, conn: &mut DB::Connection, job: &NewJob) -> Result<Enqueued> {
        let sql = &self.inner.sql;
        // A live job holding the key can finish between the insert and the read; then the
        // insert succeeds on the second round.
        for _ in 0..3 {
            if let Some(id) = DB::enqueue(conn, sql, job).await? {
                self.notify(conn, &job.queue).await?;
                return Ok(Enqueued { id, inserted: true });
            }
            if let Some((id, kind, payload)) = DB::live_job(conn, sql, job.key.as_str()).await? {
                if kind != job.kind || payload != job.payload {
                    return Err(Error::KeyReused {
                        key: job.key.to_string(),
                    });
                }
                return Ok(Enqueued {
                    id,
                    inserted: false,
                });
            }
        }
        Err(Error::Database(sqlx::Error::Protocol(format!(
            "the live job of `{}` kept changing while enqueueing",
            job.key
        ))))
    }

    async fn notify(&self, conn: &mut DB::Connection, queue: &str) -> Result<()> {
        let Some(notify) = &self.inner.sql.notify else {
            return Ok(());
        };
        let now = Instant::now();
        {
            let mut last = self.inner.last_notify.lock().expect("not poisoned");
            match last.get_mut(queue) {
                Some(at) if now.duration_since(*at) < NOTIFY_EVERY => return Ok(()),
                Some(at) => *at = now,
                None => {
                    last.insert(queue.to_owned(), now);
                }
            }
        }
        Ok(DB::notify(conn, notify, NOTIFY_CHANNEL, queue).await?)
    }

    /// Takes up to `limit` available jobs of `queue`, oldest run time first, each under a lease
    /// of `lease` by the database clock.
    pub async fn fetch(&self, queue: &str, limit: u32, lease: Duration) -> Result<Vec<LeasedJob>> {
        let _writer = self.inner.writer.acquire().await;
        let mut jobs = DB::fetch(&self.inner.pool, &self.inner.sql, queue, limit, lease).await?;
        jobs.sort_by_key(|job| job.lease.job_id);
        Ok(jobs)
    }

    /// Completes a job inside the caller's transaction, which should hold the job's effect.
    /// On **commit** the job is done together with its effect; on **rollback** neither
    /// happened and the job runs again when its lease expires.
    ///
    /// Fails with [`Error::Fenced`] when the lease is no longer held: the lease expired and the
    /// job was handed out again, or it was released. Roll back then: the holder of the newer
    /// lease runs the job.
    pub async fn complete_tx(&self, conn: &mut DB::Connection, lease: Lease) -> Result<()> {
        self.settle(conn, lease, Settle::Complete).await
    }

    /// Schedules another attempt after `delay`, recording `error`.
    pub async fn retry(&self, lease: Lease, delay: Duration, error: &str) -> Result<()> {
        let _writer = self.inner.writer.acquire().await;
        let mut conn = self.inner.pool.acquire().await?;
        self.settle(&mut conn, lease, Settle::Retry { delay, error })
            .await
    }

    /// Dead-letters a job, recording `error`.
    pub async fn dead_letter(&self, lease: Lease, error: &str) -> Result<()> {
        let _writer = self.inner.writer.acquire().await;
        let mut conn = self.inner.pool.acquire().await?;
        self.settle(&mut conn, lease, Settle::Dead { error }).await
    }

    /// [`retry`](Self::retry) on a connection the caller holds, outside any transaction. The
    /// caller holds this process's turn to write ([`write_turn`](Self::write_turn)), taken
    /// before the connection.
    pub(crate) async fn retry_on(
        &self,
        conn: &mut DB::Connection,
        lease: Lease,
        delay: Duration,
        error: &str,
    ) -> Result<()> {
        self.settle(conn, lease, Settle::Retry { delay, error })
            .await
    }

    /// [`dead_letter`](Self::dead_letter) on a connection the caller holds, outside any
    /// transaction. The caller holds this process's turn to write, taken before the
    /// connection.
    pub(crate) async fn dead_letter_on(
        &self,
        conn: &mut DB::Connection,
        lease: Lease,
        error: &str,
    ) -> Result<()> {
        self.settle(conn, lease, Settle::Dead { error }).await
    }

    /// Gives a job back without counting the attempt, for a worker shutting down before it
    /// started the job.
    pub async fn release(&self, lease: Lease) -> Result<()> {
        let _writer = self.inner.writer.acquire().await;
        let mut conn = self.inner.pool.acquire().await?;
        self.settle(&mut conn, lease, Settle::Release).await
    }

    /// Extends a lease to `by` from now, by the database clock, for a job that runs long (a
    /// heartbeat).
    ///
    /// On SQLite this does not wait for this process's turn to write: a job waiting for its
    /// turn (behind the other jobs of its process) or for the write lock (behind other
    /// processes) keeps its lease, the extension waiting for the lock only as long as the
    /// transaction that holds it, through the busy timeout.
    pub async fn extend(&self, lease: Lease, by: Duration) -> Result<()> {
        let mut conn = self.inner.pool.acquire().await?;
        self.settle(&mut conn, lease, Settle::Extend { lease: by })
            .await
    }

    async fn settle(&self, conn: &mut DB::Connection, lease: Lease, how: Settle<'_>) -> Result<()> {
        if DB::settle(conn, &self.inner.sql, lease, how).await? {
            Ok(())
        } else {
            Err(Error::Fenced {
                job_id: lease.job_id,
                attempt: lease.attempt,
            })
        }
    }

    /// Makes jobs whose lease expired available again, or dead when that was their last
    /// attempt by their own `max_attempts`. Returns how many jobs it moved.
    ///
    /// On SQLite a [`Worker`](crate::Worker)'s heartbeats are small files in
    /// `<database>-jobguard-leases/`, which need no write lock: a job whose file says its lease
    /// holds is left running even when its lease in the table expired, because its worker is
    /// alive and waiting for the write lock.
    ///
    /// A [`Worker`](crate::Worker) rescues with [`rescue_within`](Self::rescue_within) and its
    /// retry policy's limit.
    pub async fn rescue(&self) -> Result<u64> {
        self.rescue_within(u32::MAX).await
    }

    /// [`rescue`](Self::rescue), where a job's last attempt is the lesser of its own
    /// `max_attempts` and `max_attempts`: the limit a worker's
    /// [`RetryPolicy`](crate::RetryPolicy) puts on failed attempts, so that losing a lease
    /// gives a job no more attempts than failing does.
    pub async fn rescue_within(&self, max_attempts: u32) -> Result<u64> {
        let limit = i32::try_from(max_attempts.max(1)).unwrap_or(i32::MAX);
        let _writer = self.inner.writer.acquire().await;
        Ok(DB::rescue(&self.inner.pool, &self.inner.sql, limit).await?)
    }

    /// A worker's heartbeat: the lease holds for `by` from now. On SQLite it is written beside
    /// the database (see [`Queue::rescue`]), taking no lock, so a job waiting for the write lock
    /// keeps its lease however long another process holds the lock; on PostgreSQL it is
    /// [`extend`](Self::extend).
    pub(crate) async fn heartbeat(&self, lease: Lease, by: Duration) -> Result<()> {
        match DB::beat_aside(&self.inner.pool, &self.inner.sql, lease, by) {
            None => self.extend(lease, by).await,
            Some(Ok(())) => Ok(()),
            Some(Err(error)) => {
                tracing::warn!(%error, "writing a heartbeat file failed; extending the lease in the table");
                self.extend(lease, by).await
            }
        }
    }

    /// Removes what [`heartbeat`](Self::heartbeat) kept outside the table for a lease that
    /// ended.
    pub(crate) fn end_heartbeats(&self, lease: Lease) {
        DB::forget_aside(&self.inner.pool, &self.inner.sql, lease);
    }

    /// Job counts by state: exact for live jobs, and for finished ones up to
    /// [`TERMINAL_COUNT_CAP`] per state, estimated above (see [`Counts`]). Each state is read
    /// from its own index, never by scanning the whole table.
    pub async fn counts(&self) -> Result<Counts> {
        let mut counts = Counts::default();
        let mut total = -1;
        for (state, n) in DB::counts(&self.inner.pool, &self.inner.sql).await? {
            if state == "estimated total" {
                total = n;
                continue;
            }
            match state.parse()? {
                JobState::Available => counts.available = n,
                JobState::Running => counts.running = n,
                JobState::Completed => counts.completed = n,
                JobState::Dead => counts.dead = n,
            }
        }
        // What the estimated total leaves once the states counted exactly are taken out.
        let rest = |exact: i64| (total - counts.available - counts.running - exact).max(0);
        let (completed, dead) = (counts.completed, counts.dead);
        if completed >= TERMINAL_COUNT_CAP {
            counts.completed =
                rest(if dead < TERMINAL_COUNT_CAP { dead } else { 0 }).max(TERMINAL_COUNT_CAP);
        }
        if dead >= TERMINAL_COUNT_CAP {
            counts.dead = rest(if completed < TERMINAL_COUNT_CAP {
                completed
            } else {
                0
            })
            .max(TERMINAL_COUNT_CAP);
        }
        Ok(counts)
    }

    /// The statement behind [`counts`](Self::counts), for tests that check its plan.
    #[doc(hidden)]
    pub fn counts_statement(&self) -> &str {
        &self.inner.sql.counts
    }

    /// Deletes up to `limit` of the oldest jobs in `state` (completed or dead) that finished
    /// before `cutoff` and not before `after` (microseconds since the Unix epoch, by the
    /// database clock), taking the writer's turn on SQLite; returns how many, and the latest
    /// finish time among them. For the [`Pruner`](crate::retention::Pruner).
    pub(crate) async fn prune_finished(
        &self,
        state: JobState,
        cutoff: i64,
        after: i64,
        limit: u32,
    ) -> Result<(u64, Option<i64>)> {
        let _writer = self.inner.writer.acquire().await;
        Ok(DB::prune_jobs(
            &self.inner.pool,
            &self.inner.sql,
            state.as_str(),
            (cutoff, after),
            limit,
        )
        .await?)
    }

    /// How many jobs in `state` finished before `cutoff`: what a prune would delete.
    pub(crate) async fn prunable(&self, state: JobState, cutoff: i64) -> Result<u64> {
        Ok(
            DB::count_prunable_jobs(&self.inner.pool, &self.inner.sql, state.as_str(), cutoff)
                .await?,
        )
    }

    /// The jobs ready to run and waiting for a worker, per queue that has any, with how long
    /// the oldest has been due: a backlog that grows, or an oldest wait that grows, means the
    /// workers do not keep up. Jobs scheduled for later (a delay, a retry's backoff) are not
    /// counted until their time comes.
    pub async fn backlog(&self) -> Result<Vec<Backlog>> {
        let rows = DB::backlog(&self.inner.pool, &self.inner.sql).await?;
        Ok(rows
            .into_iter()
            .map(|(queue, ready, oldest_micros)| Backlog {
                queue,
                ready,
                oldest_wait: Duration::from_micros(oldest_micros.max(0) as u64),
            })
            .collect())
    }

    /// The newest jobs, optionally of one state and kind.
    pub async fn list(
        &self,
        state: Option<JobState>,
        kind: Option<&str>,
        limit: u32,
    ) -> Result<Vec<JobRow>> {
        DB::list(
            &self.inner.pool,
            &self.inner.sql,
            state.map(|s| s.as_str()),
            kind,
            limit,
        )
        .await
    }

    /// Makes dead jobs available again with fresh attempts. A job whose key has a live job
    /// already stays dead. Returns the ids replayed.
    ///
    /// A replayed job whose key the guard still holds reports a duplicate: replay is safe as
    /// long as the guard's retention covers the replay window.
    pub async fn replay(&self, which: &Replay) -> Result<Vec<i64>> {
        let (id, kind) = match which {
            Replay::Job(id) => (Some(*id), None),
            Replay::Kind(kind) => (None, Some(kind.as_str())),
            Replay::All => (None, None),
        };
        let _writer = self.inner.writer.acquire().await;
        Ok(DB::replay(&self.inner.pool, &self.inner.sql, id, kind).await?)
    }
}
