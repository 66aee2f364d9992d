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
use std::time::{Duration, Instant};

use sqlx::Pool;

use crate::error::{Error, Result};
use crate::guard::{Guard, GuardConfig};
use crate::store::Backend;
use crate::store::WriterLock;
use crate::table::TableName;

pub use crate::payload::MAX_PAYLOAD_BYTES;
pub use crate::store::queue::{
    Backlog, Counts, DEFAULT_QUEUE, Enqueued, JobRow, JobState, Lease, LeasedJob, NOTIFY_CHANNEL,
    NewJob, Replay, TERMINAL_COUNT_CAP,
};
pub(crate) use crate::store::queue::{Fetch, QueueSql, Settle, StateCount};

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

/// Where a notification is sent from, which sets how often it may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Announce {
    /// Inside the caller's transaction, delivered when it commits. PostgreSQL serialises the
    /// commits of transactions that notify, each holding a lock through its WAL flush, so these
    /// go at most once per [`NOTIFY_IN_TX_EVERY`].
    InTransaction,
    /// After the jobs' own transaction committed, as a statement of its own: such a transaction
    /// writes no WAL and holds the lock for microseconds, so these may go every
    /// [`NOTIFY_COMMITTED_EVERY`], which bounds the wait of a job enqueued inside a window.
    Committed,
}

impl Announce {
    fn every(self) -> Duration {
        match self {
            Announce::InTransaction => NOTIFY_IN_TX_EVERY,
            Announce::Committed => NOTIFY_COMMITTED_EVERY,
        }
    }
}

/// When a queue was last announced, and whether a trailing announcement is due.
struct Announced {
    at: Instant,
    /// An enqueue inside the window was not announced: a notification goes out at the window's
    /// end, so that job does not wait for a worker's poll.
    trailing: bool,
}

/// The window of notifications sent inside a caller's transaction.
const NOTIFY_IN_TX_EVERY: Duration = Duration::from_millis(20);

/// The window of notifications sent after the jobs committed.
const NOTIFY_COMMITTED_EVERY: Duration = Duration::from_millis(1);

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
        // No transaction is open on `conn`: each statement commits as it runs, and the job is
        // announced after its insert committed.
        self.enqueue_on(&mut conn, job, Announce::Committed).await
    }

    /// Enqueues a job inside the caller's transaction. Workers see it when the transaction
    /// **commits**; on **rollback** it was never enqueued. Enqueue a job in the same
    /// transaction as the state change that calls for it, and the two cannot disagree.
    pub async fn enqueue_tx(&self, conn: &mut DB::Connection, job: &NewJob) -> Result<Enqueued> {
        self.enqueue_on(conn, job, Announce::InTransaction).await
    }

    async fn enqueue_on(
        &self,
        conn: &mut DB::Connection,
        job: &NewJob,
        announce: Announce,
    ) -> Result<Enqueued> {
        let sql = &self.inner.sql;
        // A live job holding the key can finish between the insert and the read; then the
        // insert succeeds on the second round.
        for _ in 0..3 {
            if let Some(id) = DB::enqueue(conn, sql, job).await? {
                self.notify(conn, &job.queue, announce).await?;
                return Ok(Enqueued { id, inserted: true });
            }
            if let Some(live) = DB::live_job(conn, sql, job.key.as_str()).await? {
                if live.kind != job.kind || live.payload != job.payload {
                    return Err(Error::KeyReused {
                        key: job.key.to_string(),
                    });
                }
                return Ok(Enqueued {
                    id: live.id,
                    inserted: false,
                });
            }
        }
        Err(Error::Database(sqlx::Error::Protocol(format!(
            "the live job of `{}` kept changing while enqueueing",
            job.key
        ))))
    }

    /// Enqueues many jobs in one transaction and, on PostgreSQL, one insert statement: what
    /// [`enqueue`](Self::enqueue) does for each, at a fraction of the round trips. Returns what
    /// happened to each job, in the order given: inserted, or the id of the job with the same
    /// key that was already waiting or running. Visible to workers as soon as this returns.
    ///
    /// The batch is all or nothing: a key already live with another payload or kind fails it
    /// with [`Error::KeyReused`] and none of its jobs is enqueued. The same key twice in one
    /// batch is one job, reported for both entries as if they were enqueued one by one: the
    /// first as inserted, the second as finding it (another payload or kind for it is
    /// [`Error::KeyReused`] too).
    ///
    /// On PostgreSQL the batch is one `insert ... select from unnest(...)`, then one `select`
    /// for the keys a live job held; on SQLite one insert from a JSON array, under this
    /// process's turn to write. Each queue that received jobs is notified once.
    ///
    /// ```no_run
    /// use jobguard::queue::{NewJob, Queue};
    /// use jobguard::JobKey;
    ///
    /// # async fn f(queue: Queue<sqlx::Postgres>) -> jobguard::Result<()> {
    /// let jobs = (1..=3)
    ///     .map(|order| {
    ///         let key = JobKey::new("credit", [format!("order-{order}")])?;
    ///         NewJob::new(key, &serde_json::json!({"order": order, "amount": 500}))
    ///     })
    ///     .collect::<jobguard::Result<Vec<_>>>()?;
    /// let enqueued = queue.enqueue_many(&jobs).await?;
    /// assert_eq!(enqueued.len(), 3);
    /// # Ok(()) }
    /// ```
    pub async fn enqueue_many(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let _writer = self.inner.writer.acquire().await;
        let mut conn = self.inner.pool.acquire().await?;
        self.enqueue_many_tx(&mut conn, jobs).await
    }

    /// [`enqueue_many`](Self::enqueue_many) inside the caller's transaction. Workers see the
    /// jobs when the transaction **commits**; on **rollback** none was enqueued. When this
    /// fails, the batch's own inserts are already undone (it runs in a savepoint) and the
    /// caller's transaction can go on.
    ///
    /// On SQLite, pass a transaction begun with `begin immediate` or a connection outside
    /// any transaction, as for [`enqueue_tx`](Self::enqueue_tx).
    pub async fn enqueue_many_tx(
        &self,
        conn: &mut DB::Connection,
        jobs: &[NewJob],
    ) -> Result<Vec<Enqueued>> {
        // One entry per key: a key twice in the batch is one job, and must be the same job.
        let mut first_of_key: HashMap<&str, &NewJob> = HashMap::with_capacity(jobs.len());
        for job in jobs {
            let first = *first_of_key.entry(job.key.as_str()).or_insert(job);
            if first.kind != job.kind || first.payload != job.payload {
                return Err(Error::KeyReused {
                    key: job.key.to_string(),
                });
            }
        }
        if first_of_key.is_empty() {
            return Ok(Vec::new());
        }
        // Keys in one order in every batch: two batches sharing keys on PostgreSQL wait for
        // each other's insert in the same order and cannot deadlock.
        let mut distinct: Vec<&NewJob> = first_of_key.into_values().collect();
        distinct.sort_unstable_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
        let slot_of_key: HashMap<&str, usize> = distinct
            .iter()
            .enumerate()
            .map(|(slot, job)| (job.key.as_str(), slot))
            .collect();

        let sql = &self.inner.sql;
        let mut results: Vec<Option<Enqueued>> = vec![None; distinct.len()];
        // A savepoint in the caller's transaction, else a transaction of its own (`begin
        // immediate` on SQLite): a refused key undoes the whole batch.
        let mut tx = if sqlx::Connection::is_in_transaction(conn) {
            sqlx::Connection::begin(conn).await?
        } else {
            DB::begin_on(conn).await?
        };
        let mut pending: Vec<usize> = (0..distinct.len()).collect();
        // A live job holding a key can finish between the insert and the read; then that key
        // is inserted on the next round.
        for _ in 0..3 {
            let batch: Vec<&NewJob> = pending.iter().map(|&slot| distinct[slot]).collect();
            let mut waiting: HashMap<&str, usize> = pending
                .iter()
                .map(|&slot| (distinct[slot].key.as_str(), slot))
                .collect();
            for inserted in DB::enqueue_many(&mut tx, sql, &batch).await? {
                if let Some(slot) = waiting.remove(inserted.key.as_str()) {
                    results[slot] = Some(Enqueued {
                        id: inserted.id,
                        inserted: true,
                    });
                }
            }
            if waiting.is_empty() {
                pending.clear();
                break;
            }
            let keys: Vec<&str> = waiting.keys().copied().collect();
            for live in DB::live_jobs(&mut tx, sql, &keys).await? {
                let Some(slot) = waiting.remove(live.key.as_str()) else {
                    continue;
                };
                let job = distinct[slot];
                if live.kind != job.kind || live.payload != job.payload {
                    // Dropping the transaction rolls the batch back.
                    return Err(Error::KeyReused { key: live.key });
                }
                results[slot] = Some(Enqueued {
                    id: live.id,
                    inserted: false,
                });
            }
            pending = waiting.into_values().collect();
            if pending.is_empty() {
                break;
            }
        }
        if let Some(&slot) = pending.first() {
            return Err(Error::Database(sqlx::Error::Protocol(format!(
                "the live job of `{}` kept changing while enqueueing",
                distinct[slot].key
            ))));
        }
        tx.commit().await?;

        // One notification per queue that received jobs.
        let mut queues: Vec<&str> = distinct
            .iter()
            .zip(&results)
            .filter(|(_, result)| result.is_some_and(|r| r.inserted))
            .map(|(job, _)| job.queue.as_str())
            .collect();
        queues.sort_unstable();
        queues.dedup();
        for queue in queues {
            self.notify(conn, queue, Announce::Committed).await?;
        }
        // As if enqueued one by one in order: a key's later entries find its first one's job.
        let mut reported = vec![false; distinct.len()];
        Ok(jobs
            .iter()
            .map(|job| {
                let slot = slot_of_key[job.key.as_str()];
                let mut result = results[slot].expect("inserted or found live");
                result.inserted &= !std::mem::replace(&mut reported[slot], true);
                result
            })
            .collect())
    }

    /// Enqueues many [`Job`](crate::Job) values; see [`enqueue_many`](Self::enqueue_many). A
    /// value whose key or payload cannot be enqueued fails the batch with
    /// [`Error::InvalidBatchJob`] naming its index, before anything is written.
    pub async fn enqueue_jobs<J: crate::Job<DB>>(&self, jobs: &[J]) -> Result<Vec<Enqueued>> {
        self.enqueue_many(&Self::new_jobs(jobs)?).await
    }

    /// Enqueues many [`Job`](crate::Job) values inside the caller's transaction; see
    /// [`enqueue_many_tx`](Self::enqueue_many_tx). Workers see them when the transaction
    /// **commits**; on **rollback** none was enqueued.
    pub async fn enqueue_jobs_tx<J: crate::Job<DB>>(
        &self,
        conn: &mut DB::Connection,
        jobs: &[J],
    ) -> Result<Vec<Enqueued>> {
        self.enqueue_many_tx(conn, &Self::new_jobs(jobs)?).await
    }

    fn new_jobs<J: crate::Job<DB>>(jobs: &[J]) -> Result<Vec<NewJob>> {
        jobs.iter()
            .enumerate()
            .map(|(index, job)| {
                NewJob::from_job::<DB, J>(job).map_err(|source| Error::InvalidBatchJob {
                    index,
                    source: Box::new(source),
                })
            })
            .collect()
    }

    /// Wakes idle workers of `queue` (on PostgreSQL): at once when the window of `announce` is
    /// open, else once at the window's end for every enqueue inside it.
    pub(crate) async fn notify(
        &self,
        conn: &mut DB::Connection,
        queue: &str,
        announce: Announce,
    ) -> Result<()> {
        let Some(notify) = &self.inner.sql.notify else {
            return Ok(());
        };
        let now = Instant::now();
        let every = announce.every();
        {
            let mut last = self.inner.last_notify.lock().expect("not poisoned");
            let last = &mut last[announce as usize];
            match last.get_mut(queue) {
                Some(announced) if now.duration_since(announced.at) < every => {
                    if !announced.trailing {
                        announced.trailing = true;
                        self.notify_later(queue, announce, announced.at + every);
                    }
                    return Ok(());
                }
                Some(announced) => announced.at = now,
                None => {
                    let announced = Announced {
                        at: now,
                        trailing: false,
                    };
                    last.insert(queue.to_owned(), announced);
                }
            }
        }
        Ok(DB::notify(conn, notify, NOTIFY_CHANNEL, queue).await?)
    }

    /// The trailing notification of a window in which an enqueue went unannounced: sent at
    /// `at` on a connection of its own, outside the enqueue's transaction, which has usually
    /// committed by then. If it has not, the job is found by the next notification or poll.
    fn notify_later(&self, queue: &str, announce: Announce, at: Instant) {
        let (queue, inner) = (queue.to_owned(), Arc::clone(&self.inner));
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            if let Some(announced) =
                inner.last_notify.lock().expect("not poisoned")[announce as usize].get_mut(&queue)
            {
                announced.at = Instant::now();
                announced.trailing = false;
            }
            let Some(notify) = &inner.sql.notify else {
                return;
            };
            let sent = async {
                let mut conn = inner.pool.acquire().await?;
                DB::notify(&mut conn, notify, NOTIFY_CHANNEL, &queue).await
            };
            if let Err(error) = sent.await {
                tracing::debug!(%error, queue, "the trailing job notification failed; workers poll");
            }
        });
    }

    /// Takes up to `limit` available jobs of `queue`, oldest run time first, each under a lease
    /// of `lease` by the database clock.
    pub async fn fetch(&self, queue: &str, limit: u32, lease: Duration) -> Result<Vec<LeasedJob>> {
        let _writer = self.inner.writer.acquire().await;
        let fetch = Fetch {
            queue,
            limit,
            lease,
        };
        let mut jobs = DB::fetch(&self.inner.pool, &self.inner.sql, fetch).await?;
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
        self.rescue_holding(max_attempts, &[]).await
    }

    /// [`rescue_within`](Self::rescue_within) by a worker that holds `held`: it never takes
    /// its own jobs, whose leases it keeps, even in the moment a lease it kept lapsed while a
    /// transaction of its own held the row and then rolled back.
    pub(crate) async fn rescue_holding(&self, max_attempts: u32, held: &[Lease]) -> Result<u64> {
        let limit = i32::try_from(max_attempts.max(1)).unwrap_or(i32::MAX);
        let held: Vec<String> = held
            .iter()
            .map(|lease| format!("{}:{}", lease.job_id, lease.token))
            .collect();
        let _writer = self.inner.writer.acquire().await;
        Ok(DB::rescue(&self.inner.pool, &self.inner.sql, limit, held).await?)
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
    /// from its own index, never by scanning the whole table.
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
    /// `explain`: every state is counted through an index, never by reading the whole table.
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
        Ok(DB::backlog(&self.inner.pool, &self.inner.sql).await?)
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
