//! The worker: takes jobs from the [`Queue`], and runs each one in a single transaction that
//! claims the guard row, applies the job's effect and completes the job.
//!
//! For a job whose effect is a database write, that one commit makes three things true at once
//! or none of them: the effect happened, the key is recorded, the job is done. A worker that
//! crashes anywhere before the commit leaves no trace and the job runs again when its lease
//! expires; a worker that crashes after the commit leaves a completed job. A job delivered again
//! anyway (a lease that expired while the first worker was still running, a replay, the same
//! work enqueued twice) finds its key in the guard and is completed as a duplicate.
//!
//! ```no_run
//! use jobguard::{Job, JobError, JobKey, KeyError, Queue, Worker};
//! use serde::{Deserialize, Serialize};
//! use sqlx::PgConnection;
//!
//! #[derive(Serialize, Deserialize)]
//! struct Credit {
//!     order: String,
//!     account: i64,
//!     amount: i64,
//! }
//!
//! impl Job<sqlx::Postgres> for Credit {
//!     const KIND: &'static str = "credit";
//!
//!     fn key(&self) -> Result<JobKey, KeyError> {
//!         JobKey::new("credit", [&self.order])
//!     }
//!
//!     async fn run(&self, conn: &mut PgConnection) -> Result<(), JobError> {
//!         sqlx::query("insert into ledger (account, amount) values ($1, $2)")
//!             .bind(self.account)
//!             .bind(self.amount)
//!             .execute(conn)
//!             .await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
//! let queue = Queue::new(pool);
//! let worker = Worker::new(queue.clone())?.register::<Credit>();
//! worker.migrate().await?;
//! queue.enqueue_job(&Credit { order: "order-8812".into(), account: 7, amount: 500 }).await?;
//! let stats = worker.run(jobguard::worker::shutdown_signal()).await?;
//! println!("{} applied, {} duplicates", stats.applied, stats.duplicates);
//! # Ok(()) }
//! ```
//!
//! # Batches
//!
//! A kind that sets [`Job::BATCH`] runs in batches when [`WorkerConfig::batch_size`] is above
//! 1: the worker runs up to that many fetched jobs of such kinds in one transaction. One
//! statement (on PostgreSQL) completes them all under their lease tokens and claims all their
//! keys; their effects run in fetch order; one commit for all. A fenced job completes and
//! claims nothing and is left out; a key already held, even by an earlier job of the same
//! batch, is a duplicate. Any error, panic, serialization failure or deadlock rolls the whole
//! batch back, and its jobs run again one per transaction: a failing job retries alone, the
//! others apply. A commit whose answer was lost is settled for the whole batch by the guard row
//! of a key it claimed. Outcomes, metrics and [`WorkerStats`] count each job as the per-job
//! path does, and [`WorkerStats::batches`] and [`WorkerStats::batches_rolled_back`] the
//! batches.
//!
//! A batch holds every row its effects lock until it commits: kinds whose jobs write the same
//! rows contend across batches and are better left at one job per transaction. The worker
//! adapts: a batch rolled back by contention (a deadlock, a serialization failure, a busy
//! database) halves the batch size, and each group that commits grows it by one, up to
//! `batch_size`. `jobguard bench contention` measures both cases.

// The pipeline, in order: fetch, group, run (one job, or a batch), settle; the leases of every
// job held kept meanwhile.
mod batch_limit;
mod cursor;
mod fetch;
mod group;
mod kinds;
mod leases;
mod periodic;
mod run_batch;
mod run_one;
mod runnable;
mod settle;
mod shutdown;

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use sqlx::pool::PoolConnection;

use self::runnable::{Runnable, decode_job, external_decoder};
use crate::dispatch::Registry;
use crate::error::Result;
use crate::external::ExternalJob;
use crate::guard::{Guard, GuardConfig};
use crate::queue::{DEFAULT_QUEUE, Queue};
use crate::retention::{PruneConfig, Retention, RetentionConfig};
use crate::retry::RetryPolicy;
use crate::store::worker::CompletedRows;
use crate::store::{Backend, WorkerSql};

pub use self::kinds::UnknownKinds;
pub use self::shutdown::shutdown_signal;
pub use crate::job::Job;

/// Connections a [`Worker`] leaves its pool beyond one per running job: for fetching and
/// rescuing, and for heartbeats.
pub const SPARE_CONNECTIONS: usize = 2;

/// How a [`Worker`] runs.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The queue to take jobs from.
    pub queue: String,
    /// Jobs run at once. A running job holds a connection, and the worker needs
    /// [`SPARE_CONNECTIONS`] more: [`Worker::run`] lowers the concurrency, with a warning, to
    /// the pool's `max_connections` minus those (at least 1).
    pub concurrency: usize,
    /// How long a job is leased for when fetched. Until it starts, the worker extends the
    /// lease every third of it; once it starts, its transaction holds the job's row, so a job
    /// that runs past its lease is not handed out again (a worker that stalls before that point
    /// is fenced off instead). On SQLite the extensions are files beside the database, written
    /// without the write lock, so a job waiting for the lock keeps its lease (see
    /// [`Queue::rescue`]).
    pub lease: Duration,
    /// How often an idle worker looks for jobs without a notification.
    pub poll_interval: Duration,
    /// When failed jobs run again.
    pub retry: RetryPolicy,
    /// How long running jobs get to finish after shutdown is asked; then they are rolled back
    /// and their jobs given back.
    pub shutdown_timeout: Duration,
    /// Jobs of kinds that opted in with [`Job::BATCH`] run up to this many in one transaction
    /// (see [`batch`](self#batches)). 1, the default, runs every job in its own transaction.
    /// The worker runs smaller batches, down to one job, while batches roll back on
    /// contention, and grows them back to this size as they commit.
    pub batch_size: usize,
    /// How long a batch that the fetch did not fill waits for more jobs before it runs. Only
    /// applies when the fetch returned fewer batchable jobs than `batch_size` and every slot is
    /// busy: with a slot free the batch starts at once, so a short queue keeps its latency.
    pub batch_linger: Duration,
    /// Jobs the worker leases ahead of its free slots (batches, when batching), so that a job
    /// that finishes is followed at once by the next rather than by a fetch's round trip.
    /// They wait for a slot in fetch order with their leases extended, and are given back
    /// when the worker stops first. `None`, the default, fetches twice `concurrency` ahead
    /// on PostgreSQL and none on SQLite, where jobs take the one write lock in
    /// turn anyway; `Some(0)` fetches only for free slots.
    pub prefetch: Option<usize>,
    /// Return as soon as the queue has no job of a kind the worker fetches and no job is
    /// running (for tests and benchmarks).
    pub stop_when_idle: bool,
    /// Jobs of kinds with no handler registered: left waiting for a worker that runs them
    /// (the default, [`UnknownKinds::Leave`]: the worker fetches only its own kinds), or
    /// fetched and dead-lettered.
    pub unknown_kinds: UnknownKinds,
    /// The guard table.
    pub guard: GuardConfig,
    /// How long guard rows are kept, checked when the worker starts against the longest time a
    /// duplicate can still arrive (see [`retention`](crate::retention)).
    pub retention: RetentionConfig,
    /// When and how the worker prunes guard rows older than the retention.
    pub prune: PruneConfig,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            queue: DEFAULT_QUEUE.to_owned(),
            concurrency: 10,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            retry: RetryPolicy::default(),
            shutdown_timeout: Duration::from_secs(30),
            batch_size: 1,
            batch_linger: Duration::from_millis(2),
            prefetch: None,
            stop_when_idle: false,
            unknown_kinds: UnknownKinds::Leave,
            guard: GuardConfig::default(),
            retention: RetentionConfig::default(),
            prune: PruneConfig::default(),
        }
    }
}

/// What a worker did, by outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WorkerStats {
    /// Jobs whose effect this worker committed.
    pub applied: u64,
    /// Jobs whose key the guard already held: completed without running the effect.
    pub duplicates: u64,
    /// Attempts that failed and were scheduled to run again.
    pub failed: u64,
    /// Jobs dead-lettered: out of attempts, a fatal error, a bad payload, or a kind with no
    /// handler (with [`UnknownKinds::DeadLetter`]).
    pub dead: u64,
    /// Attempts whose lease had been taken over: rolled back, the new holder runs the job.
    pub fenced: u64,
    /// Jobs given back at shutdown.
    pub released: u64,
    /// Guard rows (and `done` steps) this worker's scheduled prunes deleted.
    pub pruned: u64,
    /// Scheduled prunes skipped because another worker was pruning the guard table.
    pub prunes_skipped: u64,
    /// Batches of two or more jobs committed in one transaction (see [`Job::BATCH`]).
    pub batches: u64,
    /// Batches rolled back (a job failed, a deadlock, a lost commit) whose jobs then ran one
    /// per transaction. Many of them mean the batched kinds contend for the same rows.
    pub batches_rolled_back: u64,
}

#[derive(Default)]
struct Counters {
    applied: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
    fenced: AtomicU64,
    released: AtomicU64,
    pruned: AtomicU64,
    prunes_skipped: AtomicU64,
    batches: AtomicU64,
    batches_rolled_back: AtomicU64,
}

/// How one job ended for this worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Applied,
    Duplicate,
    Failed,
    Dead,
    Fenced,
    /// Given back after transient failures, its attempt not counted: it runs again now.
    Released,
}

impl Ended {
    fn label(self) -> &'static str {
        match self {
            Ended::Applied => "applied",
            Ended::Duplicate => "duplicate",
            Ended::Failed => "failed",
            Ended::Dead => "dead",
            Ended::Fenced => "fenced",
            // The job's attempt did not end as it meant to, as the Python worker labels it.
            Ended::Released => "failed",
        }
    }
}

/// Runs registered [`Job`] kinds from a [`Queue`].
pub struct Worker<DB: Backend> {
    queue: Queue<DB>,
    guard: Guard<DB>,
    handlers: Registry<dyn Runnable<DB>>,
    /// The registered kinds whose [`Job::BATCH`] is true.
    batched: HashSet<String>,
    /// The kinds the fetches take (`None`: every kind), set when the worker starts to run.
    fetched_kinds: Option<Vec<String>>,
    /// The claim that completes the job, built once.
    sql: WorkerSql,
    /// Jobs per batch now: the configured size, lowered while batches contend.
    batch_limit: batch_limit::BatchLimit,
    /// Every lease the worker holds, kept by one task.
    leases: leases::Leases,
    config: WorkerConfig,
    /// Connections kept between jobs. The pool tests a connection with a round trip when it is
    /// taken and again when it is given back; at thousands of jobs a second that doubles the
    /// statements of a short job.
    connections: Mutex<Vec<PoolConnection<DB>>>,
    /// Periodic schedules whose firings this worker enqueues, on a timer task of its own.
    schedules: Vec<crate::periodic::Periodic>,
}

impl<DB: Backend> Worker<DB> {
    /// A worker on `queue` with the default configuration and no job kinds yet.
    pub fn new(queue: Queue<DB>) -> Result<Self> {
        Self::with_config(queue, WorkerConfig::default())
    }

    /// A worker with its own configuration.
    pub fn with_config(queue: Queue<DB>, config: WorkerConfig) -> Result<Self> {
        let guard = queue.guard(config.guard.clone())?;
        // A queue that keeps no completed job deletes each job's row as it completes it,
        // rather than writing a completed version of the row for the prune to delete.
        let rows = if config.retention.keep_completed.is_zero() {
            CompletedRows::Deleted
        } else {
            CompletedRows::Kept
        };
        let sql = DB::worker_sql(guard.sql(), queue.sql(), rows);
        Ok(Worker {
            queue,
            guard,
            sql,
            handlers: Registry::default(),
            batched: HashSet::new(),
            fetched_kinds: None,
            batch_limit: batch_limit::BatchLimit::new(config.batch_size),
            leases: leases::Leases::default(),
            config,
            connections: Mutex::default(),
            schedules: Vec::new(),
        })
    }

    /// [`WorkerConfig::concurrency`], lowered with a warning to what the pool can serve: one
    /// connection per running job, and [`SPARE_CONNECTIONS`] for fetching, rescuing and
    /// heartbeats, which would otherwise wait for a running job to finish and let leases
    /// expire.
    fn servable_concurrency(&self) -> usize {
        let requested = self.config.concurrency.max(1);
        let pool = self.queue.pool().options().get_max_connections() as usize;
        let servable = pool.saturating_sub(SPARE_CONNECTIONS).max(1);
        if requested > servable {
            tracing::warn!(
                concurrency = requested,
                pool,
                running = servable,
                "the pool cannot serve this many jobs at once; running fewer (give the pool \
                 concurrency + {SPARE_CONNECTIONS} connections)"
            );
        }
        requested.min(servable)
    }

    /// Runs jobs of kind `J::KIND` as `J`.
    pub fn register<J: Job<DB>>(mut self) -> Self {
        self.handlers.insert(J::KIND, decode_job::<DB, J>);
        if J::BATCH {
            self.batched.insert(J::KIND.to_owned());
        } else {
            self.batched.remove(J::KIND);
        }
        self
    }

    /// Runs jobs of kind `J::KIND` as the [`ExternalJob`] `J`, whose calls get `context`.
    pub fn register_external<J: ExternalJob<DB>>(mut self, context: J::Context) -> Self {
        self.handlers
            .insert(J::KIND, external_decoder::<DB, J>(context));
        self.batched.remove(J::KIND);
        self
    }

    /// The guard the worker claims keys with.
    pub fn guard(&self) -> &Guard<DB> {
        &self.guard
    }

    /// Creates the queue's and the guard's tables (and the schedules table, with
    /// [`schedules`](Self::schedule)) when missing; cheap when they exist.
    pub async fn migrate(&self) -> Result<()> {
        self.queue.migrate().await?;
        self.guard.migrate().await?;
        self.migrate_schedules().await
    }

    /// The worker's retention, checked against the horizon of its retry policy and lease
    /// (see [`RetentionConfig::validate`]).
    pub fn retention(&self) -> Result<Retention> {
        self.config
            .retention
            .validate(&self.config.retry, self.config.lease)
    }
}

impl Counters {
    fn count(&self, ended: Ended) {
        let counter = match ended {
            Ended::Applied => &self.applied,
            Ended::Duplicate => &self.duplicates,
            Ended::Failed => &self.failed,
            Ended::Dead => &self.dead,
            Ended::Fenced => &self.fenced,
            Ended::Released => &self.released,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> WorkerStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        WorkerStats {
            applied: get(&self.applied),
            duplicates: get(&self.duplicates),
            failed: get(&self.failed),
            dead: get(&self.dead),
            fenced: get(&self.fenced),
            released: get(&self.released),
            pruned: get(&self.pruned),
            prunes_skipped: get(&self.prunes_skipped),
            batches: get(&self.batches),
            batches_rolled_back: get(&self.batches_rolled_back),
        }
    }
}
