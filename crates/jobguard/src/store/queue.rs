//! The queue's rows and statements: what a job is in its table, and the SQL a backend builds
//! once per [`Queue`](crate::Queue) from its table name. `jobguard::queue` re-exports the types
//! users name.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::Pool;

use crate::error::{Error, Result};
use crate::key::{JobKey, check_kind};
use crate::payload::payload_problem;
use crate::store::database::StateCount;
use crate::store::guard::GuardStore;
use crate::table::TableName;
use crate::unique::{UniqueOpts, UniqueStates};

mod filter;
mod place;
pub(crate) mod sql;
mod statements;

pub use filter::{JobFilter, MAX_PAGE};
pub(crate) use place::Place;

pub(crate) use statements::queue_statements;

/// The queue a job goes to unless told otherwise.
pub const DEFAULT_QUEUE: &str = "default";
/// The PostgreSQL channel on which enqueues wake idle workers.
pub const NOTIFY_CHANNEL: &str = jobguard_core::sql::postgres::queue::NOTIFY_CHANNEL;

/// The table of queue states beside a queue's jobs table: which queues are paused.
pub(crate) fn queue_states(table: &TableName) -> String {
    jobguard_core::sql::paused_queues(table)
}

/// A job a worker holds: its lease is the token and `leased_until`, and its stored state stays
/// `available`. No index holds `leased_until`, the token or the attempt, so taking, extending
/// and giving back a lease changes no indexed column: on PostgreSQL a heap-only (HOT) update
/// that writes no index entry, on SQLite an update of the row alone. Every statement that ends
/// a lease sets `leased_until` back to null.
pub(crate) use jobguard_core::sql::{HELD, STATE, WAITING};

/// Whether a job other than `j` (the alias of the outer statement's row, on the jobs table
/// `t`, quoted) holds `j`'s key in a way that would refuse `j` coming back to life: a live job,
/// or, when `j` has a unique policy, a finished job its own policy keeps the key for. The
/// statements that bring a job back (replay, the console's retry) test it, as the unique indexes
/// would refuse them otherwise.
pub(crate) fn other_holder(t: &str) -> String {
    format!(
        "exists (select 1 from {t} l
                 where l.job_key = j.job_key and l.id <> j.id
                   and (l.{} or (j.unique_states <> 0 and {})))",
        jobguard_core::sql::LIVE_STATES,
        jobguard_core::sql::keeps_key_finished("l.")
    )
}

/// A job to enqueue: a kind, a key, a JSON payload and where and when to run it.
#[derive(Clone, Debug, PartialEq)]
pub struct NewJob {
    pub(crate) kind: String,
    pub(crate) key: JobKey,
    pub(crate) payload: Value,
    pub(crate) queue: String,
    pub(crate) max_attempts: u32,
    pub(crate) delay: Duration,
    pub(crate) unique: UniqueOpts,
}

impl NewJob {
    /// A job whose kind is its key's kind, on the default queue, with 10 attempts.
    ///
    /// The payload is validated here: it must serialize to JSON of at most
    /// [`MAX_PAYLOAD_BYTES`](crate::queue::MAX_PAYLOAD_BYTES) without NUL characters (PostgreSQL rejects `\u0000` in `jsonb`).
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
            unique: UniqueOpts::default(),
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

    /// Enqueues the job under a unique policy: which states keep its key, the period and
    /// queue appended to it, what a conflicting enqueue does. Replaces the kind's default
    /// ([`Job::unique_opts`](crate::Job::unique_opts)) for [`from_job`](Self::from_job).
    pub fn unique(mut self, opts: UniqueOpts) -> Self {
        self.unique = opts;
        self
    }

    /// The job's unique policy.
    pub fn unique_opts(&self) -> UniqueOpts {
        self.unique
    }

    /// The job's key.
    pub fn key(&self) -> &JobKey {
        &self.key
    }

    /// The job as it is stored: its key with its queue (when unique by queue) and the start
    /// of the period its run time (now plus its delay, by this process's clock) falls in
    /// appended. Enqueueing does this itself; call it to know the stored key first, or to fix
    /// the period before a delay crosses into the next one. Unchanged without either.
    pub fn resolve_key(mut self) -> Result<Self> {
        let run_at = std::time::SystemTime::now() + self.delay;
        self.key = self.unique.stored_key(&self.key, &self.queue, run_at)?;
        self.unique = self.unique.keyed();
        Ok(self)
    }
}

/// What [`Queue::enqueue`](crate::Queue::enqueue) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id.
    pub id: i64,
    /// False when a job holding the same key (waiting or running, or finished in a state its
    /// unique policy keeps the key in) was returned instead of inserting another.
    pub inserted: bool,
    /// True when the enqueue replaced the payload and run time of the waiting job that held
    /// the key ([`OnConflict::Replace`](crate::unique::OnConflict::Replace)).
    pub replaced: bool,
    /// The state the job holding the key was in, when one did (`inserted` false).
    pub existing_state: Option<JobState>,
}

impl Enqueued {
    /// A job inserted.
    pub(crate) fn inserted(id: i64) -> Self {
        Enqueued {
            id,
            inserted: true,
            replaced: false,
            existing_state: None,
        }
    }
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
    /// The fencing token: new at every fetch, never one the job had before (even when a crash
    /// lost the fetch's commit); every statement that extends or ends the lease compares it.
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
    /// When the job was due: with its id, its place in the order the queue gives jobs out.
    pub run_at: SystemTime,
    /// Whether this is the first attempt since a replay: a duplicate it finds is the replay's.
    pub replayed: bool,
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
    /// The state stored for a job in this state: a running job is an available one that a
    /// worker holds a lease on (see `HELD`).
    pub(crate) fn stored(&self) -> &'static str {
        match self {
            JobState::Running => "available",
            other => other.as_str(),
        }
    }

    /// The state's name, as reported.
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

/// A job as listed: by [`Queue::list`](crate::Queue::list) and, a page at a time, by the
/// console ([`Console::jobs`](crate::console::Console::jobs)).
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
    /// When it runs, or ran last (milliseconds since the Unix epoch in JSON).
    #[serde(serialize_with = "serialize_time")]
    pub run_at: SystemTime,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// When it was enqueued.
    #[serde(serialize_with = "serialize_time")]
    pub created_at: SystemTime,
    /// When it completed or died.
    #[serde(serialize_with = "serialize_optional_time")]
    pub finished_at: Option<SystemTime>,
    /// The payload.
    pub payload: Value,
    /// The states in which it keeps its key taken (`available,running` unless enqueued with a
    /// unique policy that keeps it longer).
    #[serde(serialize_with = "serialize_display")]
    pub unique_states: UniqueStates,
    /// How many times an enqueue replaced its payload and run time while it waited.
    pub replaced: i32,
}

impl JobRow {
    /// Decodes the columns every listing selects, in this order: id, kind, key, queue, state,
    /// attempt, max attempts, run time (microseconds), last error, creation and finish times
    /// (microseconds), payload, unique states, times replaced. A statement may select more
    /// after them.
    pub(crate) fn from_row<R>(row: &R) -> Result<Self>
    where
        R: sqlx::Row,
        usize: sqlx::ColumnIndex<R>,
        i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        sqlx::types::Json<Value>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        use crate::time::micros_to_time;
        let state: String = row.try_get(4)?;
        let payload: sqlx::types::Json<Value> = row.try_get(11)?;
        Ok(JobRow {
            id: row.try_get(0)?,
            kind: row.try_get(1)?,
            key: row.try_get(2)?,
            queue: row.try_get(3)?,
            state: state.parse()?,
            attempt: row.try_get(5)?,
            max_attempts: row.try_get(6)?,
            run_at: micros_to_time(row.try_get(7)?),
            last_error: row.try_get(8)?,
            created_at: micros_to_time(row.try_get(9)?),
            finished_at: row.try_get::<Option<i64>, _>(10)?.map(micros_to_time),
            payload: payload.0,
            unique_states: UniqueStates::from_mask(row.try_get(12)?),
            replaced: row.try_get(13)?,
        })
    }
}

/// A value as its `Display` text.
fn serialize_display<T: fmt::Display, S: serde::Serializer>(
    value: &T,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

/// A time as milliseconds since the Unix epoch, as the JSON of every report has them.
pub(crate) fn serialize_time<S: serde::Serializer>(
    time: &SystemTime,
    s: S,
) -> Result<S::Ok, S::Error> {
    let micros = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    s.serialize_u64(micros as u64 / 1000)
}

/// [`serialize_time`], or `null`.
pub(crate) fn serialize_optional_time<S: serde::Serializer>(
    time: &Option<SystemTime>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match time {
        Some(time) => serialize_time(time, s),
        None => s.serialize_none(),
    }
}

/// Which dead jobs [`Queue::replay`](crate::Queue::replay) brings back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replay {
    /// One job, by id.
    Job(i64),
    /// Every dead job of a kind.
    Kind(String),
    /// Every dead job.
    All,
}

/// Finished jobs of one state (completed, dead) that [`Queue::counts`](crate::Queue::counts) counts one by one;
/// above this many it estimates, so that a dashboard sample stays cheap on a huge table.
pub const TERMINAL_COUNT_CAP: i64 = 100_000;

/// How many of each queue's first jobs in its order (run time, id) [`Queue::counts`] and
/// [`Queue::backlog`] read to tell the jobs a worker holds from the waiting ones.
///
/// A held job's lease is in no index, so that taking it writes no index entry; the jobs stored
/// `available` are counted from the fetch index alone, and only these first rows are read. A
/// worker takes the first waiting jobs of the queue, so the only jobs ahead of a held one are
/// other held ones and the few whose enqueue committed later with an earlier run time: the
/// split is exact unless one queue has nearly this many jobs held at once.
///
/// [`Queue::counts`]: crate::Queue::counts
/// [`Queue::backlog`]: crate::Queue::backlog
pub const HELD_COUNT_SPAN: i64 = 10_000;

/// Job counts by state, from [`Queue::counts`](crate::Queue::counts).
///
/// Live jobs (available, running) are counted exactly, told apart among the first
/// [`HELD_COUNT_SPAN`] jobs of each queue. Finished ones are counted exactly up to
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
/// [`Queue::backlog`](crate::Queue::backlog).
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
#[derive(Debug)]
pub struct QueueSql {
    pub(crate) table: TableName,
    pub(crate) create: Vec<Arc<str>>,
    pub(crate) enqueue: Arc<str>,
    /// The enqueue of a job whose unique policy keeps its key past the live states (the core
    /// crate's `enqueue_unique`).
    pub(crate) enqueue_unique: Arc<str>,
    /// The job holding key `$1`: live, or (when `$2` is not 0) finished in a state its policy
    /// keeps the key in; a live one first. Id, key, kind, payload, state, live.
    pub(crate) holder: Arc<str>,
    /// Inserts a batch of jobs in one statement, skipping keys a job holds; returns the id and
    /// key of each row inserted.
    pub(crate) enqueue_many: Arc<str>,
    /// The jobs holding any of a batch of keys, live or kept by their policy: id, key, kind,
    /// payload, state, live.
    pub(crate) holders: Arc<str>,
    /// Replaces the payload (`$2`) and run time (`$3` microseconds from now) of job `$1` while
    /// it waits; returns its id when it did.
    pub(crate) replace: Arc<str>,
    /// Leases up to `$2` waiting jobs of queue `$1` for `$3` microseconds, in run time order.
    pub(crate) fetch: Arc<str>,
    /// [`fetch`](Self::fetch) of the jobs after run time `$4` (microseconds) and id `$5` in
    /// that order.
    pub(crate) fetch_after: Arc<str>,
    /// [`fetch`](Self::fetch) of the jobs of the kinds in `$4` only: a `text[]` on PostgreSQL,
    /// a JSON array on SQLite (each backend's `kinds_param`).
    pub(crate) fetch_kinds: Arc<str>,
    /// [`fetch_kinds`](Self::fetch_kinds) of the jobs after run time `$5` and id `$6`.
    pub(crate) fetch_kinds_after: Arc<str>,
    pub(crate) complete: Arc<str>,
    pub(crate) retry: Arc<str>,
    pub(crate) dead: Arc<str>,
    pub(crate) release: Arc<str>,
    /// Gives a job back to run after `$3` microseconds, its attempt not counted (a transient
    /// failure that outlasted its runs).
    pub(crate) give_back: Arc<str>,
    pub(crate) heartbeat: Arc<str>,
    /// Extends many leases in one statement: `$1` a JSON array of `{"id", "token"}`, `$2` the
    /// lease length in microseconds; selects the ids of the leases still held.
    pub(crate) heartbeat_many: Arc<str>,
    pub(crate) rescue: Arc<str>,
    pub(crate) counts: Arc<str>,
    pub(crate) backlog: Arc<str>,
    /// `select <job row columns> from <jobs>`, which [`JobFilter::clause`] completes: the
    /// columns [`JobRow::from_row`] decodes.
    pub(crate) list: Arc<str>,
    /// The condition a listing of running jobs puts on the jobs stored `available`: that a
    /// worker holds the job, read where the dialect's planner finds the held jobs at once.
    pub(crate) held: Arc<str>,
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
#[derive(Clone, Copy, Debug)]
pub enum Settle<'a> {
    Complete,
    Retry { delay: Duration, error: &'a str },
    Dead { error: &'a str },
    Release,
    GiveBack { delay: Duration },
    Extend { lease: Duration },
}

/// What the queue calls on a backend: enqueue one job or a batch, lease, settle, rescue and
/// read. Most methods come from [`queue_statements`]; a backend writes `queue_sql` (a function
/// of that name in scope), `enqueue_many` and `live_jobs` (their batches bind differently), and
/// the heartbeats kept outside the table where it keeps them there.
pub trait QueueStore: GuardStore {
    fn queue_sql(table: &TableName) -> Result<QueueSql>;

    /// Inserts `job`; its id, or `None` when a job holds its key.
    fn enqueue(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        job: &NewJob,
    ) -> impl Future<Output = sqlx::Result<Option<i64>>> + Send;

    /// The job holding `key`, if any: a live one, or when `kept` a finished one whose policy
    /// keeps the key.
    fn holder(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        key: &str,
        kept: bool,
    ) -> impl Future<Output = Result<Option<Holder>>> + Send;

    /// Replaces the payload and run time of job `id` with `job`'s while it waits; false when
    /// it no longer waits.
    fn replace(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        id: i64,
        job: &NewJob,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Inserts `jobs` (distinct keys) in one statement; returns the jobs inserted, leaving out
    /// those whose key a job holds.
    fn enqueue_many(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        jobs: &[&NewJob],
    ) -> impl Future<Output = sqlx::Result<Vec<InsertedJob>>> + Send;

    /// The jobs holding any of `keys`, live or finished and kept by their policy.
    fn holders(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        keys: &[&str],
    ) -> impl Future<Output = Result<Vec<Holder>>> + Send;

    /// Sends `payload` on `channel` with the backend's `statement` ([`QueueSql::notify`]).
    fn notify(
        conn: &mut Self::Connection,
        statement: &Arc<str>,
        channel: &str,
        payload: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    fn fetch(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        fetch: Fetch<'_>,
    ) -> impl Future<Output = sqlx::Result<Vec<LeasedJob>>> + Send;

    /// Ends or extends a lease; false when the lease is no longer held.
    fn settle(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        lease: Lease,
        how: Settle<'_>,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Extends every lease of `leases` by `by`; the ids of those still held.
    fn extend_leases(
        pool: &Pool<Self>,
        sql: &QueueSql,
        leases: &[Lease],
        by: Duration,
    ) -> impl Future<Output = sqlx::Result<Vec<i64>>> + Send;

    /// Rescues expired leases of `kinds` (every kind when `None`), except those `held` (as
    /// `job_id:token`) and those heartbeats kept outside the table say hold.
    fn rescue(
        pool: &Pool<Self>,
        sql: &QueueSql,
        max_attempts: i32,
        held: Vec<String>,
        kinds: Option<&[String]>,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// Records that the holder of `lease` is alive for `by` more without the database's write
    /// lock; `None` when the backend keeps heartbeats in the table.
    fn beat_aside(
        _pool: &Pool<Self>,
        _sql: &QueueSql,
        _lease: Lease,
        _by: Duration,
    ) -> Option<std::io::Result<()>> {
        None
    }

    /// The leases that heartbeats kept outside the table say still hold, as `job_id:token`.
    fn held_aside(_pool: &Pool<Self>, _sql: &QueueSql) -> Vec<String> {
        Vec::new()
    }

    /// Removes the heartbeat kept outside the table of a lease that ended.
    fn forget_aside(_pool: &Pool<Self>, _sql: &QueueSql, _lease: Lease) {}

    /// Jobs per state, and the `estimated total` the finished states above the cap are
    /// estimated from.
    fn counts(
        pool: &Pool<Self>,
        sql: &QueueSql,
    ) -> impl Future<Output = sqlx::Result<Vec<StateCount>>> + Send;

    /// Per queue: jobs ready to run, and how long the oldest has been due.
    fn backlog(
        pool: &Pool<Self>,
        sql: &QueueSql,
    ) -> impl Future<Output = sqlx::Result<Vec<Backlog>>> + Send;

    fn list(
        pool: &Pool<Self>,
        sql: &QueueSql,
        filter: &JobFilter,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<JobRow>>> + Send;

    fn replay(
        pool: &Pool<Self>,
        sql: &QueueSql,
        id: Option<i64>,
        kind: Option<&str>,
    ) -> impl Future<Output = sqlx::Result<Vec<i64>>> + Send;
}

/// What [`QueueStore::fetch`] takes: up to `limit` jobs of `queue`, each leased for `lease`;
/// with `after`, only jobs past that place in the queue's order; with `kinds`, only jobs of
/// those kinds.
#[derive(Clone, Copy, Debug)]
pub struct Fetch<'a> {
    pub(crate) queue: &'a str,
    pub(crate) limit: u32,
    pub(crate) lease: Duration,
    pub(crate) after: Option<Place>,
    pub(crate) kinds: Option<&'a [String]>,
}

/// A job found holding its key: live (available or running), or finished in a state its
/// unique policy keeps the key in.
#[derive(Debug)]
pub struct Holder {
    pub(crate) id: i64,
    pub(crate) key: String,
    pub(crate) kind: String,
    pub(crate) payload: Value,
    pub(crate) state: JobState,
    /// Whether it is live (`jobguard_core::sql::LIVE_STATES`), so holds the key against every
    /// enqueue; a finished holder holds it only against enqueues with a policy of their own.
    pub(crate) live: bool,
}

/// A job [`QueueStore::enqueue_many`] inserted.
#[derive(Debug)]
pub struct InsertedJob {
    pub(crate) id: i64,
    pub(crate) key: String,
}

impl From<(i64, String)> for InsertedJob {
    fn from((id, key): (i64, String)) -> Self {
        InsertedJob { id, key }
    }
}

/// The columns of [`QueueSql::holders`]: id, key, kind, payload, state, live.
pub(crate) type HolderColumns = (i64, String, String, sqlx::types::Json<Value>, String, bool);

impl TryFrom<HolderColumns> for Holder {
    type Error = Error;

    fn try_from((id, key, kind, payload, state, live): HolderColumns) -> Result<Self> {
        Ok(Holder {
            id,
            key,
            kind,
            payload: payload.0,
            state: state.parse()?,
            live,
        })
    }
}
