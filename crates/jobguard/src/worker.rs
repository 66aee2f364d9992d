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

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sqlx::pool::PoolConnection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::backend::{Backend, is_connection_error};
use crate::error::{Error, JobError, Result};
use crate::external::{ApiKey, ExternalJob};
use crate::guard::{Claim, Guard, GuardConfig};
use crate::key::{JobKey, KeyError};
use crate::metrics::{DuplicateSource, record_duplicate_source, record_job_duration};
use crate::queue::{DEFAULT_QUEUE, Enqueued, Lease, LeasedJob, NewJob, Queue};
use crate::retention::{PruneConfig, PruneReport, Pruner, Retention, RetentionConfig};
use crate::retry::RetryPolicy;
use crate::spikes::record_outcome;
use crate::steps::Steps;

/// A kind of job the worker can run.
///
/// The job's fields are its payload (stored as JSON); [`key`](Job::key) derives its key from
/// the business operation; [`run`](Job::run) applies its effect on the worker's open
/// transaction, after the guard claimed the key and before the job is completed, all of which
/// commit together.
pub trait Job<DB: Backend>: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The kind the job is enqueued and registered under.
    const KIND: &'static str;

    /// The job's key, derived from the business operation, e.g. `credit:order-8812`.
    fn key(&self) -> Result<JobKey, KeyError>;

    /// The job's effect, on the transaction that commits it with the guard row and the job's
    /// completion. Return [`JobError::fatal`] for errors no retry can fix.
    fn run(&self, conn: &mut DB::Connection) -> impl Future<Output = Result<(), JobError>> + Send;
}

impl NewJob {
    /// The job for a [`Job`] value: its kind, key and payload.
    pub fn from_job<DB: Backend, J: Job<DB>>(job: &J) -> Result<Self> {
        NewJob::new(job.key()?, job)?.kind(J::KIND)
    }

    /// The job for an [`ExternalJob`] value: its kind, key and payload.
    pub fn from_external<DB: Backend, J: ExternalJob<DB>>(job: &J) -> Result<Self> {
        NewJob::new(job.key()?, job)?.kind(J::KIND)
    }
}

impl<DB: Backend> Queue<DB> {
    /// Enqueues a [`Job`] value; see [`enqueue`](Queue::enqueue).
    pub async fn enqueue_job<J: Job<DB>>(&self, job: &J) -> Result<Enqueued> {
        self.enqueue(&NewJob::from_job::<DB, J>(job)?).await
    }

    /// Enqueues an [`ExternalJob`] value; see [`enqueue`](Queue::enqueue).
    pub async fn enqueue_external<J: ExternalJob<DB>>(&self, job: &J) -> Result<Enqueued> {
        self.enqueue(&NewJob::from_external::<DB, J>(job)?).await
    }
}

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
    /// Return as soon as the queue is empty and no job is running (for tests and benchmarks).
    pub stop_when_idle: bool,
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
            stop_when_idle: false,
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
    /// Jobs dead-lettered: out of attempts, a fatal error, an unknown kind or a bad payload.
    pub dead: u64,
    /// Attempts whose lease had been taken over: rolled back, the new holder runs the job.
    pub fenced: u64,
    /// Jobs given back at shutdown.
    pub released: u64,
    /// Guard rows (and `done` steps) this worker's scheduled prunes deleted.
    pub pruned: u64,
    /// Scheduled prunes skipped because another worker was pruning the guard table.
    pub prunes_skipped: u64,
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
}

/// How one job ended for this worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Applied,
    Duplicate,
    Failed,
    Dead,
    Fenced,
}

impl Ended {
    fn label(self) -> &'static str {
        match self {
            Ended::Applied => "applied",
            Ended::Duplicate => "duplicate",
            Ended::Failed => "failed",
            Ended::Dead => "dead",
            Ended::Fenced => "fenced",
        }
    }
}

/// Why an attempt did not commit.
enum Failure {
    /// Rolled back by contention; run the attempt again now.
    Transient(sqlx::Error),
    /// The connection broke; run the attempt again now on another one.
    Reconnect(sqlx::Error),
    /// The lease was taken over.
    Fenced,
    /// The job failed; retry later or dead-letter.
    Failed { message: String, fatal: bool },
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        match error {
            Error::Fenced { .. } => Failure::Fenced,
            error => Failure::Failed {
                fatal: !error.is_retryable(),
                message: error.to_string(),
            },
        }
    }
}

/// Runs registered [`Job`] kinds from a [`Queue`].
pub struct Worker<DB: Backend> {
    queue: Queue<DB>,
    guard: Guard<DB>,
    handlers: HashMap<&'static str, Arc<dyn Handler<DB>>>,
    config: WorkerConfig,
    /// Connections kept between jobs. The pool tests a connection with a round trip when it is
    /// taken and again when it is given back; at thousands of jobs a second that doubles the
    /// statements of a short job.
    connections: Mutex<Vec<PoolConnection<DB>>>,
}

impl<DB: Backend> Worker<DB> {
    /// A worker on `queue` with the default configuration and no job kinds yet.
    pub fn new(queue: Queue<DB>) -> Result<Self> {
        Self::with_config(queue, WorkerConfig::default())
    }

    /// A worker with its own configuration.
    pub fn with_config(queue: Queue<DB>, config: WorkerConfig) -> Result<Self> {
        let guard = queue.guard(config.guard.clone())?;
        Ok(Worker {
            queue,
            guard,
            handlers: HashMap::new(),
            config,
            connections: Mutex::default(),
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
        self.handlers
            .insert(J::KIND, Arc::new(TypedHandler::<J>(PhantomData)));
        self
    }

    /// Runs jobs of kind `J::KIND` as the [`ExternalJob`] `J`, whose calls get `context`.
    pub fn register_external<J: ExternalJob<DB>>(mut self, context: J::Context) -> Self {
        let handler = ExternalHandler::<J, DB> {
            context: Arc::new(context),
        };
        self.handlers.insert(J::KIND, Arc::new(handler));
        self
    }

    /// The guard the worker claims keys with.
    pub fn guard(&self) -> &Guard<DB> {
        &self.guard
    }

    /// Creates the queue's and the guard's tables when missing; cheap when they exist.
    pub async fn migrate(&self) -> Result<()> {
        self.queue.migrate().await?;
        self.guard.migrate().await
    }

    /// The worker's retention, checked against the horizon of its retry policy and lease
    /// (see [`RetentionConfig::validate`]).
    pub fn retention(&self) -> Result<Retention> {
        self.config
            .retention
            .validate(&self.config.retry, self.config.lease)
    }

    /// Runs until `shutdown` resolves (see [`shutdown_signal`]), or until the queue is empty
    /// with [`WorkerConfig::stop_when_idle`].
    ///
    /// Refuses to start with [`Error::RetentionTooShort`] when the guard's retention is shorter
    /// than the longest time a duplicate can still arrive, unless overridden. While it runs it
    /// prunes on [`PruneConfig::schedule`], one worker per guard table at a time.
    ///
    /// After shutdown is asked it takes no new jobs, lets running jobs finish within
    /// [`WorkerConfig::shutdown_timeout`], then rolls back the rest and gives their jobs back.
    pub async fn run(mut self, shutdown: impl Future<Output = ()> + Send) -> Result<WorkerStats> {
        let retention = self.retention()?;
        self.config.concurrency = self.servable_concurrency();
        let worker = Arc::new(self);
        let counters = Arc::new(Counters::default());
        let (stop_pruning, pruning) = worker.prune_on_schedule(retention, &counters);
        let leases: Arc<Mutex<HashSet<Lease>>> = Arc::default();
        let permits = Arc::new(Semaphore::new(worker.config.concurrency.max(1)));
        let mut tasks = JoinSet::new();
        let mut wakeup = match DB::listen(worker.queue.pool()).await {
            Ok(wakeup) => wakeup,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for new jobs; polling only");
                None
            }
        };
        let rescue_every = (worker.config.lease / 2).max(Duration::from_millis(100));
        let refill_at = (worker.config.concurrency / 2).max(1);
        let mut last_rescue: Option<Instant> = None;
        let mut shutdown = std::pin::pin!(shutdown);

        loop {
            while let Some(joined) = tasks.try_join_next() {
                log_join(joined);
            }
            // On SQLite a running job holds the only write lock, so the queue's own writes wait
            // for it: shutdown must not.
            if last_rescue.is_none_or(|at| at.elapsed() >= rescue_every) {
                let rescued = tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    rescued = worker.queue.rescue_within(worker.config.retry.max_attempts) => rescued,
                };
                match rescued {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(jobs = n, "rescued jobs whose lease expired"),
                    Err(error) => tracing::warn!(%error, "rescuing expired leases failed"),
                }
                last_rescue = Some(Instant::now());
            }
            let free = permits.available_permits();
            let mut fetched = 0;
            // Fetch in batches: one query for half the slots rather than one per finished job.
            if free > 0 && (free >= refill_at || tasks.is_empty()) {
                let fetch =
                    worker
                        .queue
                        .fetch(&worker.config.queue, free as u32, worker.config.lease);
                let fetched_jobs = tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    jobs = fetch => jobs,
                };
                match fetched_jobs {
                    Ok(jobs) => {
                        fetched = jobs.len();
                        for job in jobs {
                            let permit = Arc::clone(&permits)
                                .acquire_owned()
                                .await
                                .expect("never closed");
                            leases.lock().expect("not poisoned").insert(job.lease);
                            let (worker, counters, leases) = (
                                Arc::clone(&worker),
                                Arc::clone(&counters),
                                Arc::clone(&leases),
                            );
                            tasks.spawn(async move {
                                let lease = job.lease;
                                worker.process(job, &counters, permit).await;
                                worker.queue.end_heartbeats(lease);
                                leases.lock().expect("not poisoned").remove(&lease);
                            });
                        }
                    }
                    Err(error) => tracing::warn!(%error, "fetching jobs failed; retrying"),
                }
            }
            if fetched > 0 && fetched == free {
                continue;
            }
            if worker.config.stop_when_idle && fetched == 0 && tasks.is_empty() {
                break;
            }
            tokio::select! {
                () = &mut shutdown => break,
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => log_join(joined),
                () = next_wakeup(&mut wakeup) => {}
                () = tokio::time::sleep(worker.config.poll_interval) => {}
            }
        }

        let drained = tokio::time::timeout(worker.config.shutdown_timeout, async {
            while let Some(joined) = tasks.join_next().await {
                log_join(joined);
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                jobs = tasks.len(),
                "running jobs did not finish in time; rolling them back"
            );
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
            let unfinished: Vec<Lease> = leases.lock().expect("not poisoned").drain().collect();
            for lease in unfinished {
                match worker.queue.release(lease).await {
                    Ok(()) => {
                        counters.released.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => {
                        tracing::warn!(%error, job.id = lease.job_id, "giving a job back failed; its lease will expire")
                    }
                }
            }
        }
        if let Some(mut pruning) = pruning {
            // A prune stops after its current batch.
            let _ = stop_pruning.send(true);
            let timeout = worker.config.shutdown_timeout;
            if tokio::time::timeout(timeout, &mut pruning).await.is_err() {
                pruning.abort();
            }
        }
        Ok(counters.snapshot())
    }

    /// Starts the scheduled prune, if there is a schedule; it stops when the sender says so.
    fn prune_on_schedule(
        &self,
        retention: Retention,
        counters: &Arc<Counters>,
    ) -> (
        tokio::sync::watch::Sender<bool>,
        Option<tokio::task::JoinHandle<()>>,
    ) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let Some(schedule) = self.config.prune.schedule.clone() else {
            return (stop, None);
        };
        let config = &self.config.prune;
        let mut pruner = Pruner::new(&self.guard, retention)
            .batch(config.batch)
            .pause(config.pause)
            .jobs(&self.queue);
        if let Some(steps) = &config.steps {
            pruner = pruner.steps(Steps::with_config(self.queue.pool().clone(), steps.clone()));
        }
        let counters = Arc::clone(counters);
        let on_round = move |report: Option<&PruneReport>| match report {
            Some(report) => {
                let rows = report.guard_rows + report.step_rows;
                counters.pruned.fetch_add(rows, Ordering::Relaxed);
            }
            None => {
                counters.prunes_skipped.fetch_add(1, Ordering::Relaxed);
            }
        };
        let task = crate::retention::run_schedule(pruner, schedule, stopped, on_round);
        (stop, Some(tokio::spawn(task)))
    }

    async fn process(&self, job: LeasedJob, counters: &Counters, _permit: OwnedSemaphorePermit) {
        let span = tracing::info_span!(
            "job",
            job.id = job.lease.job_id,
            job.kind = %job.kind,
            job.key = %job.key,
            attempt = job.lease.attempt,
        );
        let started = Instant::now();
        let ended = self.execute(&job).instrument(span.clone()).await;
        let took = started.elapsed();
        span.in_scope(|| {
            tracing::debug!(
                outcome = ended.label(),
                seconds = took.as_secs_f64(),
                "job ended"
            );
        });
        if ended == Ended::Duplicate {
            let source = DuplicateSource::infer(job.lease.attempt, job.lease.token);
            record_duplicate_source(&job.kind, source);
            // In the job's span, so the log names the key that was a duplicate.
            span.in_scope(|| {
                tracing::info!(
                    %source,
                    "duplicate: the key was already applied; completed without the effect"
                );
            });
        }
        record_outcome(&job.kind, ended.label());
        record_job_duration(&job.kind, ended.label(), took);
        counters.count(ended);
    }

    async fn execute(&self, job: &LeasedJob) -> Ended {
        let decoded = self.decode(job);
        let called = match &decoded {
            Ok((runnable, key)) => self.call_external(job, key, &**runnable).await,
            Err(_) => Ok(()),
        };
        // On SQLite, this process's turn to write comes before a connection (see
        // `Queue::write_turn`), and is held until the job's outcome is written. Jobs wait for
        // it behind each other, so their leases are extended meanwhile.
        let waiting = async {
            let turn = self.queue.write_turn().await;
            (turn, self.checkout().await)
        };
        let (_turn, conn) = self.with_heartbeat(job.lease, waiting).await;
        let conn = match conn {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "no connection for the job; it runs again when its lease expires");
                return Ended::Failed;
            }
        };
        let (ended, conn) = match called {
            Ok(()) => self.execute_on(conn, job, decoded).await,
            Err((message, fatal)) => {
                let mut conn = conn;
                (self.fail(&mut conn, job, &message, fatal).await, Some(conn))
            }
        };
        self.check_in(conn);
        ended
    }

    /// The first stage of an [`ExternalJob`]: its API call, outside any transaction and holding
    /// no connection, under heartbeats. Skipped when the key is already recorded; the attempt
    /// then completes the job as a duplicate.
    async fn call_external(
        &self,
        job: &LeasedJob,
        key: &JobKey,
        runnable: &dyn Runnable<DB>,
    ) -> std::result::Result<(), (String, bool)> {
        let Some(call) = runnable.call(key) else {
            return Ok(());
        };
        match self.guard.lookup(key).await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => {}
            Err(error) => return Err((error.to_string(), false)),
        }
        let called = AssertUnwindSafe(call).catch_unwind();
        match self.with_heartbeat(job.lease, called).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => {
                let fatal = !error.is_retryable();
                Err((error.to_string(), fatal))
            }
            Err(panic) => Err((
                format!("the job panicked: {}", panic_message(&panic)),
                false,
            )),
        }
    }

    /// Runs a job on `conn`, which also records its failure, so a job never waits for a second
    /// connection while holding one. Gives the connection back unless it broke.
    async fn execute_on(
        &self,
        mut conn: PoolConnection<DB>,
        job: &LeasedJob,
        decoded: std::result::Result<(Box<dyn Runnable<DB>>, JobKey), String>,
    ) -> (Ended, Option<PoolConnection<DB>>) {
        let (runnable, key) = match decoded {
            Ok(decoded) => decoded,
            Err(message) => return (self.bury(&mut conn, job, &message).await, Some(conn)),
        };
        let mut retries = 0;
        loop {
            let error = match self.attempt(&mut conn, job, &key, &*runnable).await {
                Ok(ended) => return (ended, Some(conn)),
                Err(Failure::Fenced) => return (Ended::Fenced, Some(conn)),
                Err(Failure::Failed { message, fatal }) => {
                    return (self.fail(&mut conn, job, &message, fatal).await, Some(conn));
                }
                Err(Failure::Transient(error)) => error,
                Err(Failure::Reconnect(error)) => {
                    drop(conn);
                    conn = match self.queue.pool().acquire().await {
                        Ok(fresh) => fresh,
                        Err(_) => return (Ended::Failed, None),
                    };
                    error
                }
            };
            if retries == 5 {
                return (
                    self.fail(&mut conn, job, &error.to_string(), false).await,
                    Some(conn),
                );
            }
            retries += 1;
            tracing::debug!(%error, retries, "rolled back by contention or a lost connection; running again");
            tokio::time::sleep(Duration::from_millis(2 << retries)).await;
        }
    }

    /// The job's handler, payload and key, or why it can never run.
    fn decode(&self, job: &LeasedJob) -> Result<(Box<dyn Runnable<DB>>, JobKey), String> {
        let Some(handler) = self.handlers.get(job.kind.as_str()) else {
            return Err(format!(
                "unknown job kind `{}`: no handler is registered for it in this worker",
                job.kind
            ));
        };
        let runnable = handler.decode(&job.payload).map_err(|error| {
            format!(
                "the payload does not deserialize into a `{}` job: {error}",
                job.kind
            )
        })?;
        let key = JobKey::parse(&job.key)
            .map_err(|error| format!("the stored job key is invalid: {error}"))?;
        Ok((runnable, key))
    }

    /// A connection kept from an earlier job, or a new one from the pool.
    async fn checkout(&self) -> Result<PoolConnection<DB>> {
        let kept = self.connections.lock().expect("not poisoned").pop();
        match kept {
            Some(conn) => Ok(conn),
            None => Ok(self.queue.pool().acquire().await?),
        }
    }

    /// Keeps a connection for the next job; a rolled-back transaction on it was only queued,
    /// and goes out with the next statement.
    ///
    /// At most one connection per job slot is kept, and never the pool's last
    /// [`SPARE_CONNECTIONS`], so fetching and heartbeats always find one.
    fn check_in(&self, conn: Option<PoolConnection<DB>>) {
        let pool = self.queue.pool().options().get_max_connections() as usize;
        let keep = self
            .config
            .concurrency
            .min(pool.saturating_sub(SPARE_CONNECTIONS));
        let mut kept = self.connections.lock().expect("not poisoned");
        if let Some(conn) = conn.filter(|_| kept.len() < keep) {
            kept.push(conn);
        }
    }

    /// One transaction: claim the key, run the effect, complete the job, commit.
    async fn attempt(
        &self,
        conn: &mut PoolConnection<DB>,
        job: &LeasedJob,
        key: &JobKey,
        runnable: &dyn Runnable<DB>,
    ) -> Result<Ended, Failure> {
        // Until the claim locks the job, heartbeats keep the lease: the wait for SQLite's write
        // lock, or for a concurrent delivery of the key to commit, can be long.
        let claiming = async {
            let mut guarded = self.guard.begin_on(conn).await?;
            let claim = self
                .guard
                .claim_completing(
                    &mut guarded.tx,
                    key,
                    &job.payload,
                    self.queue.sql(),
                    job.lease,
                )
                .await?;
            Ok::<_, Error>((guarded, claim))
        };
        let (mut guarded, claim) = self
            .with_heartbeat(job.lease, claiming)
            .await
            .map_err(|e| transient_or::<DB>(e, Failure::from))?;
        let tx = &mut guarded.tx;
        // The job's completion is written before its effect runs, in the same transaction: both
        // commit together, and a worker whose lease was taken over stops here. From here no
        // other worker can fetch or rescue the job, so its lease needs no more heartbeats.
        let Some(claim) = claim else {
            // Roll back now rather than when the kept connection is next used: until then the
            // transaction would hold what it locked.
            let _ = guarded.tx.rollback().await;
            return Err(Failure::Fenced);
        };
        let ended = match claim {
            Claim::Duplicate(_) => Ended::Duplicate,
            Claim::Claimed => match AssertUnwindSafe(runnable.run(tx)).catch_unwind().await {
                Ok(Ok(())) => Ended::Applied,
                Ok(Err(error)) => {
                    let (source, fatal) = error.into_parts();
                    return Err(match source.downcast::<sqlx::Error>() {
                        Ok(db) if DB::is_transient(&db) => Failure::Transient(*db),
                        Ok(db) if is_connection_error(&db) => Failure::Reconnect(*db),
                        Ok(db) => Failure::Failed {
                            message: db.to_string(),
                            fatal,
                        },
                        Err(source) => Failure::Failed {
                            message: source.to_string(),
                            fatal,
                        },
                    });
                }
                Err(panic) => {
                    let message = panic_message(&panic);
                    return Err(Failure::Failed {
                        message: format!("the job panicked: {message}"),
                        fatal: false,
                    });
                }
            },
        };
        guarded
            .tx
            .commit()
            .await
            .map_err(|e| transient_or::<DB>(Error::Database(e), Failure::from))?;
        Ok(ended)
    }

    /// Retries a failed attempt later, or dead-letters it when it was fatal or the last one.
    async fn fail(
        &self,
        conn: &mut DB::Connection,
        job: &LeasedJob,
        message: &str,
        fatal: bool,
    ) -> Ended {
        let last = job
            .max_attempts
            .min(self.config.retry.max_attempts.max(1) as i32);
        if fatal || job.lease.attempt >= last {
            return self.bury(conn, job, message).await;
        }
        tracing::warn!(error = message, "job failed; it will run again");
        let delay = self
            .config
            .retry
            .next_delay(job.lease.attempt.max(1) as u32);
        match self.queue.retry_on(conn, job.lease, delay, message).await {
            Ok(()) => Ended::Failed,
            Err(Error::Fenced { .. }) => Ended::Fenced,
            Err(error) => {
                tracing::warn!(%error, "scheduling a retry failed; the job runs again when its lease expires");
                Ended::Failed
            }
        }
    }

    async fn bury(&self, conn: &mut DB::Connection, job: &LeasedJob, message: &str) -> Ended {
        tracing::warn!(error = message, "job dead-lettered");
        match self.queue.dead_letter_on(conn, job.lease, message).await {
            Ok(()) => Ended::Dead,
            Err(Error::Fenced { .. }) => Ended::Fenced,
            Err(error) => {
                tracing::warn!(%error, "dead-lettering failed; the job runs again when its lease expires");
                Ended::Failed
            }
        }
    }

    /// Runs `work`, extending `lease` every third of its length until it finishes. Most work
    /// finishes before the first beat, and then costs one timer, not a task.
    async fn with_heartbeat<T>(&self, lease: Lease, work: impl Future<Output = T>) -> T {
        let length = self.config.lease;
        // Polled alongside `work`, never instead of it: `work` may hold the write lock or the
        // job's row that an extension waits for.
        let beats = async {
            loop {
                tokio::time::sleep(length / 3).await;
                match self.queue.heartbeat(lease, length).await {
                    Ok(()) => {}
                    Err(Error::Fenced { .. }) => {
                        tracing::warn!(
                            job.id = lease.job_id,
                            "lost the lease; this attempt will be fenced off"
                        );
                        std::future::pending::<()>().await;
                    }
                    Err(error) => tracing::warn!(%error, "extending a lease failed"),
                }
            }
        };
        tokio::select! {
            done = work => done,
            () = beats => unreachable!("heartbeats never end"),
        }
    }
}

/// Resolves on SIGINT or SIGTERM (Ctrl-C elsewhere): pass it to [`Worker::run`].
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(mut interrupt), Ok(mut terminate)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn transient_or<DB: Backend>(error: Error, otherwise: impl FnOnce(Error) -> Failure) -> Failure {
    match error {
        Error::Database(db) if DB::is_transient(&db) => Failure::Transient(db),
        Error::Database(db) if is_connection_error(&db) => Failure::Reconnect(db),
        error => otherwise(error),
    }
}

async fn next_wakeup(wakeup: &mut Option<crate::backend::Wakeup>) {
    match wakeup {
        Some(wakeup) => wakeup.0.next().await,
        None => std::future::pending().await,
    }
}

fn log_join(joined: std::result::Result<(), tokio::task::JoinError>) {
    if let Err(error) = joined
        && error.is_panic()
    {
        tracing::error!(%error, "a job task panicked outside the job");
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned())
}

impl Counters {
    fn count(&self, ended: Ended) {
        let counter = match ended {
            Ended::Applied => &self.applied,
            Ended::Duplicate => &self.duplicates,
            Ended::Failed => &self.failed,
            Ended::Dead => &self.dead,
            Ended::Fenced => &self.fenced,
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
        }
    }
}

/// Turns a stored payload into a runnable job of one kind.
trait Handler<DB: Backend>: Send + Sync {
    fn decode(&self, payload: &Value) -> Result<Box<dyn Runnable<DB>>, serde_json::Error>;
}

struct TypedHandler<J>(PhantomData<fn() -> J>);

impl<DB: Backend, J: Job<DB>> Handler<DB> for TypedHandler<J> {
    fn decode(&self, payload: &Value) -> Result<Box<dyn Runnable<DB>>, serde_json::Error> {
        Ok(Box::new(J::deserialize(payload)?))
    }
}

/// A decoded job, its type erased.
trait Runnable<DB: Backend>: Send + Sync {
    /// The stage before the transaction, for jobs that have one.
    fn call<'a>(&'a self, _key: &'a JobKey) -> Option<BoxFuture<'a, Result<(), JobError>>> {
        None
    }

    fn run<'a>(&'a self, conn: &'a mut DB::Connection) -> BoxFuture<'a, Result<(), JobError>>;
}

impl<DB: Backend, J: Job<DB>> Runnable<DB> for J {
    fn run<'a>(&'a self, conn: &'a mut DB::Connection) -> BoxFuture<'a, Result<(), JobError>> {
        Box::pin(Job::run(self, conn))
    }
}

struct ExternalHandler<J: ExternalJob<DB>, DB: Backend> {
    context: Arc<J::Context>,
}

impl<DB: Backend, J: ExternalJob<DB>> Handler<DB> for ExternalHandler<J, DB> {
    fn decode(&self, payload: &Value) -> Result<Box<dyn Runnable<DB>>, serde_json::Error> {
        Ok(Box::new(Called::<J, DB> {
            job: J::deserialize(payload)?,
            context: Arc::clone(&self.context),
            output: Mutex::new(None),
        }))
    }
}

/// An [`ExternalJob`] and, once its call returned, the API's answer for its transaction.
struct Called<J: ExternalJob<DB>, DB: Backend> {
    job: J,
    context: Arc<J::Context>,
    output: Mutex<Option<Arc<J::Output>>>,
}

impl<DB: Backend, J: ExternalJob<DB>> Runnable<DB> for Called<J, DB> {
    fn call<'a>(&'a self, key: &'a JobKey) -> Option<BoxFuture<'a, Result<(), JobError>>> {
        Some(Box::pin(async move {
            let api_key = ApiKey::derive(key, J::STEP, J::API_KEY_FORMAT)
                .map_err(|error| JobError::from(error).into_fatal())?;
            let output = self.job.call(&self.context, &api_key).await?;
            *self.output.lock().expect("not poisoned") = Some(Arc::new(output));
            Ok(())
        }))
    }

    fn run<'a>(&'a self, conn: &'a mut DB::Connection) -> BoxFuture<'a, Result<(), JobError>> {
        Box::pin(async move {
            let output = self.output.lock().expect("not poisoned").clone();
            let Some(output) = output else {
                return Err(JobError::msg(
                    "the job's API call has not run; it runs again",
                ));
            };
            self.job.record(&self.context, conn, &output).await
        })
    }
}
