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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Pool;

use crate::error::{Error, Result};
use crate::guard::{Guard, GuardConfig};
use crate::store::Backend;
use crate::store::WriterLock;
use crate::store::prune::{PruneBatch, Pruned};
use crate::table::TableName;

mod enqueue;

pub(crate) use self::enqueue::Announce;
use self::enqueue::Announced;
pub use crate::payload::MAX_PAYLOAD_BYTES;
pub(crate) use crate::store::StateCount;
pub use crate::store::queue::{
    Backlog, Counts, DEFAULT_QUEUE, Enqueued, HELD_COUNT_SPAN, JobRow, JobState, Lease, LeasedJob,
    NOTIFY_CHANNEL, NewJob, Replay, TERMINAL_COUNT_CAP,
};
pub(crate) use crate::store::queue::{Fetch, Holder, JobFilter, Place, QueueSql, Settle};

/// The job queue. Cheap to clone.
pub struct Queue<DB: Backend> {
    inner: Arc<QueueInner<DB>>,
}

struct QueueInner<DB: Backend> {
    pool: Pool<DB>,
    sql: QueueSql,
    writer: WriterLock,
    /// When each queue name was last announced, one map per [`Announce`] (indexed by it), so
    /// that a queue gets at most one notification of each kind per window.
    last_notify: Mutex<[HashMap<String, Announced>; 2]>,
}

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

    /// The job holding `key` now: a live one, else a finished one its unique policy keeps the
    /// key for.
    pub(crate) async fn holder(&self, key: &str) -> Result<Option<Holder>> {
        let mut conn = self.inner.pool.acquire().await?;
        DB::holder(&mut conn, &self.inner.sql, key, true).await
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

    /// Takes up to `limit` available jobs of `queue`, oldest run time first, each under a lease
    /// of `lease` by the database clock.
    pub async fn fetch(&self, queue: &str, limit: u32, lease: Duration) -> Result<Vec<LeasedJob>> {
        let fetch = Fetch {
            queue,
            limit,
            lease,
            after: None,
            kinds: None,
        };
        self.fetch_with(fetch).await
    }

    /// [`fetch`](Self::fetch) as `fetch` says: past a place in the queue's order, of some
    /// kinds only.
    pub(crate) async fn fetch_with(&self, fetch: Fetch<'_>) -> Result<Vec<LeasedJob>> {
        let _writer = self.inner.writer.acquire().await;
        let mut conn = self.inner.pool.acquire().await?;
        self.fetch_on(&mut conn, fetch).await
    }

    /// [`fetch_with`](Self::fetch_with) on a connection the caller keeps: a worker's loop
    /// fetches on one connection of its own, so that its fetches neither wait for the pool nor
    /// pay its ping. Takes no writer's turn: on a single-writer backend the caller takes it
    /// first, before its connection (the worker keeps no connection there).
    pub(crate) async fn fetch_on(
        &self,
        conn: &mut DB::Connection,
        fetch: Fetch<'_>,
    ) -> Result<Vec<LeasedJob>> {
        let mut jobs = DB::fetch(conn, &self.inner.sql, fetch).await?;
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

    /// Gives a job back to run after `delay`, its attempt not counted, on a connection the
    /// caller holds, outside any transaction: its transaction did not commit for a transient
    /// reason however often it ran. The caller holds this process's turn to write, taken
    /// before the connection.
    pub(crate) async fn give_back_on(
        &self,
        conn: &mut DB::Connection,
        lease: Lease,
        delay: Duration,
    ) -> Result<()> {
        self.settle(conn, lease, Settle::GiveBack { delay }).await
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
        self.rescue_holding(max_attempts, &[], None).await
    }

    /// [`rescue_within`](Self::rescue_within) by a worker that holds `held` and runs `kinds`
    /// (every kind when `None`): it never takes its own jobs, whose leases it keeps, even in
    /// the moment a lease it kept lapsed while a transaction of its own held the row and then
    /// rolled back; and it leaves the jobs of kinds it does not run to the workers that run
    /// them, whose retry policies are the ones that count for them.
    pub(crate) async fn rescue_holding(
        &self,
        max_attempts: u32,
        held: &[Lease],
        kinds: Option<&[String]>,
    ) -> Result<u64> {
        let limit = i32::try_from(max_attempts.max(1)).unwrap_or(i32::MAX);
        let held: Vec<String> = held
            .iter()
            .map(|lease| format!("{}:{}", lease.job_id, lease.token))
            .collect();
        let _writer = self.inner.writer.acquire().await;
        Ok(DB::rescue(&self.inner.pool, &self.inner.sql, limit, held, kinds).await?)
    }

    /// A worker's heartbeats: each lease of `leases` holds for `by` from now. On SQLite they are
    /// written beside the database (see [`Queue::rescue`]), taking no lock, so a job waiting for
    /// the write lock keeps its lease however long another process holds the lock; on
    /// PostgreSQL one statement extends them all, skipping rather than waiting for the rows a
    /// transaction holds (they are held). Returns the leases lost: rescued or taken over.
    pub(crate) async fn heartbeat_many(
        &self,
        leases: &[Lease],
        by: Duration,
    ) -> Result<Vec<Lease>> {
        let (pool, sql) = (&self.inner.pool, &self.inner.sql);
        let mut in_table = Vec::new();
        for lease in leases {
            match DB::beat_aside(pool, sql, *lease, by) {
                Some(Ok(())) => {}
                Some(Err(error)) => {
                    tracing::warn!(%error, "writing a heartbeat file failed; extending the lease in the table");
                    in_table.push(*lease);
                }
                None => in_table.push(*lease),
            }
        }
        if in_table.is_empty() {
            return Ok(Vec::new());
        }
        let held = DB::extend_leases(pool, sql, &in_table, by).await?;
        in_table.retain(|lease| !held.contains(&lease.job_id));
        Ok(in_table)
    }

    /// Removes what [`heartbeat_many`](Self::heartbeat_many) kept outside the table for a lease that
    /// ended.
    pub(crate) fn end_heartbeats(&self, lease: Lease) {
        DB::forget_aside(&self.inner.pool, &self.inner.sql, lease);
    }

    /// Job counts by state: exact for live jobs, and for finished ones up to
    /// [`TERMINAL_COUNT_CAP`] per state, estimated above (see [`Counts`]). Each state is read
    /// from its own index, never by scanning the whole table; the rows read are those of the
    /// first [`HELD_COUNT_SPAN`] jobs of each queue, where the held ones are.
    pub async fn counts(&self) -> Result<Counts> {
        let mut counts = Counts::default();
        let mut total = -1;
        for StateCount { state, count: n } in DB::counts(&self.inner.pool, &self.inner.sql).await? {
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

    /// The statement behind [`counts`](Self::counts), to read its plan on your own table with
    /// `explain`: every state is counted through an index, never by reading the whole table,
    /// and the rows read for the held jobs are at most [`HELD_COUNT_SPAN`] per queue.
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
    /// let queue = jobguard::Queue::new(pool.clone());
    /// let explain = format!("explain {}", queue.counts_statement());
    /// for line in sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(explain))
    ///     .fetch_all(&pool)
    ///     .await?
    /// {
    ///     println!("{line}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn counts_statement(&self) -> &str {
        &self.inner.sql.counts
    }

    /// Deletes a batch of the oldest jobs in `state` (completed or dead) by their finish time,
    /// taking the writer's turn on SQLite. For the [`Pruner`](crate::retention::Pruner).
    pub(crate) async fn prune_finished(
        &self,
        state: JobState,
        batch: PruneBatch,
    ) -> Result<Pruned> {
        let _writer = self.inner.writer.acquire().await;
        Ok(DB::prune_jobs(&self.inner.pool, &self.inner.sql, state.as_str(), batch).await?)
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
    /// counted until their time comes. Read as [`counts`](Self::counts) reads the live jobs:
    /// the due ones from the fetch index, the held ones among each queue's first
    /// [`HELD_COUNT_SPAN`].
    pub async fn backlog(&self) -> Result<Vec<Backlog>> {
        Ok(DB::backlog(&self.inner.pool, &self.inner.sql).await?)
    }

    /// The newest jobs, optionally of one state and kind (held jobs, `running`, oldest first).
    pub async fn list(
        &self,
        state: Option<JobState>,
        kind: Option<&str>,
        limit: u32,
    ) -> Result<Vec<JobRow>> {
        let filter = JobFilter {
            state,
            kind: kind.map(str::to_owned),
            ..JobFilter::default()
        };
        self.list_where(&filter, i64::from(limit)).await
    }

    /// The jobs `filter` takes, at most `limit`: the one statement every listing runs, each
    /// combination of filters planned for the index that serves it.
    pub(crate) async fn list_where(&self, filter: &JobFilter, limit: i64) -> Result<Vec<JobRow>> {
        DB::list(&self.inner.pool, &self.inner.sql, filter, limit).await
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
