//! The small internal interface each database backend implements.
//!
//! [`Guard`](crate::Guard) holds the logic (claim first, effect second, commit both); a backend
//! only knows its SQL dialect, how to open a transaction that queues writers instead of failing
//! them, and which of its errors are worth retrying.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::{Database, Pool, Transaction};

use self::queue::{JobRow, Lease, LeasedJob, NewJob, QueueSql, Settle};
use crate::fingerprint::Fingerprint;
use crate::table::TableName;
use crate::time::micros_to_time;

pub(crate) mod console;
pub(crate) mod offsets;
pub(crate) mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
pub(crate) mod prune;
pub(crate) mod queue;
#[cfg(feature = "sqlite")]
mod sqlite;
pub(crate) mod steps;

mod writer;

pub(crate) use writer::WriterLock;

/// A database jobguard can guard jobs on: [`sqlx::Postgres`] or [`sqlx::Sqlite`].
///
/// The trait is sealed: what jobguard calls on a backend is in supertraits private to the
/// crate.
pub trait Backend:
    Database
    + Store
    + self::console::ConsoleStore
    + self::outbox::OutboxStore
    + self::steps::StepStore
    + self::offsets::OffsetStore
{
    /// The backend's name as shown to users: `postgres` or `sqlite`.
    const BACKEND: &'static str;
}

/// What the guard, the queue and the worker call on a backend: the dialect's SQL, how it opens
/// a guarded transaction, the claim, and which errors are transient. Public in a private
/// module, so that no other crate can name it: it seals [`Backend`].
pub trait Store: Database {
    /// Whether the database admits one writing transaction at a time.
    const SINGLE_WRITER: bool;

    fn guard_sql(table: &TableName) -> crate::Result<GuardSql>;

    fn queue_sql(table: &TableName) -> crate::Result<QueueSql>;

    /// Runs `create ... if not exists` statements, one migration of `table` at a time.
    fn migrate_statements(
        pool: &Pool<Self>,
        table: &TableName,
        statements: &[Arc<str>],
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Opens the transaction a guarded job runs in.
    fn begin(
        pool: &Pool<Self>,
    ) -> impl Future<Output = sqlx::Result<Transaction<'static, Self>>> + Send;

    /// Opens the transaction a guarded job runs in on a connection the caller holds.
    fn begin_on(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = sqlx::Result<Transaction<'_, Self>>> + Send;

    /// Inserts the guard row, or reads the row that holds the key.
    fn claim(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        claim: &NewClaim<'_>,
    ) -> impl Future<Output = sqlx::Result<ClaimRow>> + Send;

    /// The worker's statements over its guard and queue tables, built once per worker.
    /// Backends that claim and complete in one statement override this.
    fn worker_sql(_guard: &GuardSql, _queue: &QueueSql) -> WorkerSql {
        WorkerSql {
            claim_completing: None,
            claim_completing_many: None,
            complete_many: None,
            held: None,
        }
    }

    /// Claims the key and completes the job of `lease`; false when the lease is not held.
    /// Backends that can do both in one statement override this.
    fn claim_completing(
        conn: &mut Self::Connection,
        sql: (&GuardSql, &QueueSql, &WorkerSql),
        claim: &NewClaim<'_>,
        lease: Lease,
    ) -> impl Future<Output = sqlx::Result<(ClaimRow, bool)>> + Send {
        async move {
            let (guard, queue, _) = sql;
            if !Self::settle(conn, queue, lease, Settle::Complete).await? {
                return Ok((ClaimRow::Vanished, false));
            }
            Ok((Self::claim(conn, guard, claim).await?, true))
        }
    }

    /// Completes the jobs of a batch under their leases and claims the keys of the completed
    /// ones, in order: for each job, `None` when its lease is not held (it completed nothing and
    /// claimed nothing), else what claiming its key found. A key that an earlier job of the
    /// batch claimed is found held by this transaction. Backends that can do it in one
    /// statement override this; the default runs [`Backend::claim_completing`] per job.
    fn claim_completing_many(
        conn: &mut Self::Connection,
        sql: (&GuardSql, &QueueSql, &WorkerSql),
        claims: &[(NewClaim<'_>, Lease)],
    ) -> impl Future<Output = sqlx::Result<Vec<Option<ClaimRow>>>> + Send {
        async move {
            let mut rows = Vec::with_capacity(claims.len());
            for (claim, lease) in claims {
                let (row, completed) = Self::claim_completing(conn, sql, claim, *lease).await?;
                rows.push(completed.then_some(row));
            }
            Ok(rows)
        }
    }

    fn fetch_record(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        key: &str,
    ) -> impl Future<Output = sqlx::Result<Option<GuardRecord>>> + Send;

    fn store_result(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        key: &str,
        result: &serde_json::Value,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    fn enqueue(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        job: &NewJob,
    ) -> impl Future<Output = sqlx::Result<Option<i64>>> + Send;

    fn live_job(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        key: &str,
    ) -> impl Future<Output = sqlx::Result<Option<(i64, String, serde_json::Value)>>> + Send;

    /// Inserts `jobs` (distinct keys) in one statement; returns the id and key of each job
    /// inserted, leaving out those whose key a live job holds.
    fn enqueue_many(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        jobs: &[&NewJob],
    ) -> impl Future<Output = sqlx::Result<Vec<(i64, String)>>> + Send;

    /// The live jobs holding any of `keys`: id, key, kind and payload.
    fn live_jobs(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        keys: &[&str],
    ) -> impl Future<Output = sqlx::Result<Vec<LiveJob>>> + Send;

    fn notify(
        conn: &mut Self::Connection,
        statement: &Arc<str>,
        channel: &str,
        payload: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    fn fetch(
        pool: &Pool<Self>,
        sql: &QueueSql,
        queue: &str,
        limit: u32,
        lease: Duration,
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

    /// Rescues expired leases, except those `held` (as `job_id:token`) and those heartbeats
    /// kept outside the table say hold.
    fn rescue(
        pool: &Pool<Self>,
        sql: &QueueSql,
        max_attempts: i32,
        held: Vec<String>,
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

    fn counts(
        pool: &Pool<Self>,
        sql: &QueueSql,
    ) -> impl Future<Output = sqlx::Result<Vec<(String, i64)>>> + Send;

    /// Per queue: jobs ready to run, and how long the oldest has been due in microseconds.
    fn backlog(
        pool: &Pool<Self>,
        sql: &QueueSql,
    ) -> impl Future<Output = sqlx::Result<Vec<(String, i64, i64)>>> + Send;

    fn list(
        pool: &Pool<Self>,
        sql: &QueueSql,
        state: Option<&str>,
        kind: Option<&str>,
        limit: u32,
    ) -> impl Future<Output = crate::Result<Vec<JobRow>>> + Send;

    fn replay(
        pool: &Pool<Self>,
        sql: &QueueSql,
        id: Option<i64>,
        kind: Option<&str>,
    ) -> impl Future<Output = sqlx::Result<Vec<i64>>> + Send;

    /// A source of wake-ups for idle workers when jobs are enqueued, if the database has one.
    fn listen(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<Option<Wakeup>>> + Send;

    /// Serialization failures, deadlocks and busy databases: rolling back and running the whole
    /// transaction again may succeed.
    fn is_transient(error: &sqlx::Error) -> bool;
}

/// The worker's statements over both its guard and its queue table, built once per
/// [`Worker`](crate::Worker).
#[derive(Debug)]
pub struct WorkerSql {
    /// Completes the job under its lease token and claims the key in one statement, where the
    /// backend can (PostgreSQL); `None` where it takes two under the write lock (SQLite).
    pub(crate) claim_completing: Option<Arc<str>>,
    /// Completes a batch's jobs and claims their keys in one statement (PostgreSQL), or claims
    /// the keys of the jobs [`WorkerSql::complete_many`] completed (SQLite).
    pub(crate) claim_completing_many: Option<Arc<str>>,
    /// Completes a batch's jobs under their lease tokens, where that is a statement of its own.
    pub(crate) complete_many: Option<Arc<str>>,
    /// Reads the rows holding a batch's keys that it did not claim, in a new statement.
    pub(crate) held: Option<Arc<str>>,
}

/// The guard table's statements, built once per [`Guard`](crate::Guard) from its validated name.
#[derive(Debug)]
pub struct GuardSql {
    pub(crate) table: TableName,
    pub(crate) create: Vec<Arc<str>>,
    pub(crate) claim: Arc<str>,
    pub(crate) record: Arc<str>,
    pub(crate) store_result: Arc<str>,
    pub(crate) prune: Arc<str>,
    pub(crate) count_prunable: Arc<str>,
    pub(crate) oldest_age: Arc<str>,
}

/// The [`Backend::guard_sql`] and [`Backend::queue_sql`] of a dialect, built from its `guard`,
/// `prune` and `queue` SQL modules, which must be in scope where it is used: both dialects fill
/// the same fields from functions of the same names. `$check` refuses a table name the dialect
/// cannot hold.
macro_rules! table_sql {
    ($($check:path)?) => {
        fn guard_sql(table: &$crate::table::TableName) -> $crate::Result<$crate::store::GuardSql> {
            $($check(table)?;)?
            Ok($crate::store::GuardSql {
                table: table.clone(),
                create: guard::create(table)
                    .into_iter()
                    .map(std::sync::Arc::from)
                    .collect(),
                claim: guard::claim(table).into(),
                record: guard::record(table).into(),
                store_result: guard::store_result(table).into(),
                prune: prune::prune_guard(table).into(),
                count_prunable: prune::count_guard(table).into(),
                oldest_age: prune::oldest_guard_age(table).into(),
            })
        }

        fn queue_sql(
            table: &$crate::table::TableName,
        ) -> $crate::Result<$crate::store::queue::QueueSql> {
            Self::guard_sql(table)?;
            Ok(queue::queue_sql(table))
        }
    };
}
pub(crate) use table_sql;

/// The values of a guard row about to be inserted.
#[derive(Debug)]
pub struct NewClaim<'a> {
    pub(crate) key: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) fingerprint: Option<&'a Fingerprint>,
    pub(crate) token: &'a ClaimToken,
}

/// What inserting a guard row found.
#[derive(Debug)]
pub enum ClaimRow {
    /// The row was inserted: this transaction holds the key.
    Claimed,
    /// A committed row holds the key.
    Held(GuardRecord),
    /// The insert conflicted, but the row was gone when read (deleted in between).
    Vanished,
}

/// Identifies one attempt to claim a key.
///
/// After a commit fails with a lost connection, the guard row is the witness of whether the
/// commit happened; the token says whether the row found is this attempt's or another's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimToken(pub(crate) [u8; 16]);

impl ClaimToken {
    pub(crate) fn new() -> Self {
        use std::sync::OnceLock;
        use std::sync::atomic::{AtomicU64, Ordering};
        static PROCESS: OnceLock<[u8; 32]> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let process = PROCESS.get_or_init(|| {
            let started = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let mut hasher = blake3::Hasher::new();
            hasher.update(&std::process::id().to_le_bytes());
            hasher.update(&started.as_nanos().to_le_bytes());
            *hasher.finalize().as_bytes()
        });
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let hash = blake3::keyed_hash(process, &n.to_le_bytes());
        let mut token = [0; 16];
        token.copy_from_slice(&hash.as_bytes()[..16]);
        ClaimToken(token)
    }
}

/// A guard row as read back from the table.
#[derive(Clone, Debug, PartialEq)]
pub struct GuardRecord {
    /// When the key was first applied, by the database clock.
    pub applied_at: SystemTime,
    /// The fingerprint of the payload it was applied with, when one was given.
    pub fingerprint: Option<Fingerprint>,
    /// The result the first run returned, when it returned one.
    pub result: Option<serde_json::Value>,
    pub(crate) token: Option<ClaimToken>,
}

impl GuardRecord {
    pub(crate) fn from_columns(
        applied_at_micros: i64,
        fingerprint: Option<Vec<u8>>,
        result: Option<serde_json::Value>,
        token: Vec<u8>,
    ) -> Self {
        GuardRecord {
            applied_at: micros_to_time(applied_at_micros),
            fingerprint: fingerprint.as_deref().and_then(Fingerprint::from_slice),
            result: result.filter(|value| !value.is_null()),
            token: <[u8; 16]>::try_from(token.as_slice()).ok().map(ClaimToken),
        }
    }
}

/// A guard row as a batch's `held` statement reads it: key, applied at (micros), fingerprint,
/// result, claim token.
pub(crate) type HeldRow = (
    String,
    i64,
    Option<Vec<u8>>,
    Option<sqlx::types::Json<serde_json::Value>>,
    Vec<u8>,
);

/// The keys of a batch's jobs that completed but did not claim their key, given per job
/// whether it completed and whether it claimed.
pub(crate) fn unclaimed_keys<'a>(
    claims: &[(NewClaim<'a>, Lease)],
    rows: &[(bool, bool)],
) -> Vec<&'a str> {
    claims
        .iter()
        .zip(rows)
        .filter(|(_, (completed, claimed))| *completed && !*claimed)
        .map(|((claim, _), _)| claim.key)
        .collect()
}

/// What [`Backend::claim_completing_many`] returns, from whether each job completed and claimed
/// and the rows that hold the keys it did not claim.
pub(crate) fn batch_claim_rows(
    claims: &[(NewClaim<'_>, Lease)],
    rows: &[(bool, bool)],
    held: Vec<HeldRow>,
) -> Vec<Option<ClaimRow>> {
    let held: std::collections::HashMap<String, GuardRecord> = held
        .into_iter()
        .map(|(key, applied_at, fingerprint, result, token)| {
            let result = result.map(|json| json.0);
            let record = GuardRecord::from_columns(applied_at, fingerprint, result, token);
            (key, record)
        })
        .collect();
    claims
        .iter()
        .zip(rows)
        .map(|((claim, _), (completed, claimed))| {
            completed.then(|| match claimed {
                true => ClaimRow::Claimed,
                false => held
                    .get(claim.key)
                    .cloned()
                    .map_or(ClaimRow::Vanished, ClaimRow::Held),
            })
        })
        .collect()
}

/// A live job as [`Backend::live_jobs`] reads it: id, key, kind and payload.
pub(crate) type LiveJob = (i64, String, String, serde_json::Value);

/// Wakes an idle worker when a job is enqueued (PostgreSQL's LISTEN/NOTIFY).
pub struct Wakeup(pub(crate) Box<dyn WakeupSource>);

pub(crate) trait WakeupSource: Send {
    /// Resolves at the next notification, or after an error has been logged and waited out.
    fn next(&mut self) -> futures::future::BoxFuture<'_, ()>;
}

/// The statements whose binding and decoding are the same on every backend: only their SQL
/// differs, and that comes from the backend's `GuardSql` and `QueueSql`. Expanded inside each
/// `impl Backend`, where the backend's `Row` and `Connection` types are concrete.
macro_rules! shared_statements {
    () => {
        async fn fetch_record(
            conn: &mut Self::Connection,
            sql: &$crate::store::GuardSql,
            key: &str,
        ) -> sqlx::Result<Option<$crate::store::GuardRecord>> {
            use sqlx::Row as _;
            let row = sqlx::query(sqlx::AssertSqlSafe(sql.record.clone()))
                .bind(key)
                .fetch_optional(conn)
                .await?;
            row.map(|row| {
                let result: Option<sqlx::types::Json<serde_json::Value>> = row.try_get(2)?;
                Ok($crate::store::GuardRecord::from_columns(
                    row.try_get(0)?,
                    row.try_get(1)?,
                    result.map(|json| json.0),
                    row.try_get(3)?,
                ))
            })
            .transpose()
        }

        async fn store_result(
            conn: &mut Self::Connection,
            sql: &$crate::store::GuardSql,
            key: &str,
            result: &serde_json::Value,
        ) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(sql.store_result.clone()))
                .bind(key)
                .bind(sqlx::types::Json(result))
                .execute(conn)
                .await?;
            Ok(())
        }

        async fn enqueue(
            conn: &mut Self::Connection,
            sql: &$crate::store::queue::QueueSql,
            job: &$crate::store::queue::NewJob,
        ) -> sqlx::Result<Option<i64>> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.enqueue.clone()))
                .bind(&job.kind)
                .bind(job.key.as_str())
                .bind(&job.queue)
                .bind(sqlx::types::Json(&job.payload))
                .bind(job.max_attempts as i32)
                .bind($crate::time::duration_micros(job.delay))
                .fetch_optional(conn)
                .await
        }

        async fn live_job(
            conn: &mut Self::Connection,
            sql: &$crate::store::queue::QueueSql,
            key: &str,
        ) -> sqlx::Result<Option<(i64, String, serde_json::Value)>> {
            let row: Option<(i64, String, sqlx::types::Json<serde_json::Value>)> =
                sqlx::query_as(sqlx::AssertSqlSafe(sql.live_job.clone()))
                    .bind(key)
                    .fetch_optional(conn)
                    .await?;
            Ok(row.map(|(id, kind, payload)| (id, kind, payload.0)))
        }

        async fn notify(
            conn: &mut Self::Connection,
            statement: &std::sync::Arc<str>,
            channel: &str,
            payload: &str,
        ) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
                .bind(channel)
                .bind(payload)
                .execute(conn)
                .await?;
            Ok(())
        }

        async fn fetch(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
            queue: &str,
            limit: u32,
            lease: std::time::Duration,
        ) -> sqlx::Result<Vec<$crate::store::queue::LeasedJob>> {
            use sqlx::Row as _;
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.fetch.clone()))
                .bind(queue)
                .bind(i64::from(limit))
                .bind($crate::time::duration_micros(lease))
                .fetch_all(pool)
                .await?;
            rows.into_iter()
                .map(|row| {
                    let payload: sqlx::types::Json<serde_json::Value> = row.try_get(3)?;
                    Ok($crate::store::queue::LeasedJob {
                        lease: $crate::store::queue::Lease {
                            job_id: row.try_get(0)?,
                            attempt: row.try_get(4)?,
                            token: row.try_get(7)?,
                        },
                        kind: row.try_get(1)?,
                        key: row.try_get(2)?,
                        payload: payload.0,
                        max_attempts: row.try_get(5)?,
                        leased_until: $crate::time::micros_to_time(row.try_get(6)?),
                    })
                })
                .collect()
        }

        async fn settle(
            conn: &mut Self::Connection,
            sql: &$crate::store::queue::QueueSql,
            lease: $crate::store::queue::Lease,
            how: $crate::store::queue::Settle<'_>,
        ) -> sqlx::Result<bool> {
            use $crate::store::queue::Settle;
            use $crate::time::duration_micros;
            let statement = match how {
                Settle::Complete => &sql.complete,
                Settle::Retry { .. } => &sql.retry,
                Settle::Dead { .. } => &sql.dead,
                Settle::Release => &sql.release,
                Settle::Extend { .. } => &sql.heartbeat,
            };
            let query = sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
                .bind(lease.job_id)
                .bind(lease.token);
            let query = match how {
                Settle::Complete | Settle::Release => query,
                Settle::Retry { delay, error } => query.bind(duration_micros(delay)).bind(error),
                Settle::Dead { error } => query.bind(error),
                Settle::Extend { lease } => query.bind(duration_micros(lease)),
            };
            Ok(query.execute(conn).await?.rows_affected() == 1)
        }

        async fn extend_leases(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
            leases: &[$crate::store::queue::Lease],
            by: std::time::Duration,
        ) -> sqlx::Result<Vec<i64>> {
            let held: Vec<serde_json::Value> = leases
                .iter()
                .map(|lease| serde_json::json!({ "id": lease.job_id, "token": lease.token }))
                .collect();
            let held = serde_json::Value::Array(held).to_string();
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.heartbeat_many.clone()))
                .bind(held)
                .bind($crate::time::duration_micros(by))
                .fetch_all(pool)
                .await
        }

        async fn rescue(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
            max_attempts: i32,
            mut held: Vec<String>,
        ) -> sqlx::Result<u64> {
            // The heartbeats kept outside the table are read once the transaction holds the
            // write lock (SQLite's `begin immediate`): read before, they would miss the
            // heartbeats written while the rescue waited for the lock, however long that was.
            let mut tx = Self::begin(pool).await?;
            held.extend(Self::held_aside(pool, sql));
            let held = serde_json::to_string(&held).expect("strings serialize");
            let done = sqlx::query(sqlx::AssertSqlSafe(sql.rescue.clone()))
                .bind(max_attempts)
                .bind(held)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(done.rows_affected())
        }

        async fn counts(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
        ) -> sqlx::Result<Vec<(String, i64)>> {
            sqlx::query_as(sqlx::AssertSqlSafe(sql.counts.clone()))
                .fetch_all(pool)
                .await
        }

        async fn backlog(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
        ) -> sqlx::Result<Vec<(String, i64, i64)>> {
            sqlx::query_as(sqlx::AssertSqlSafe(sql.backlog.clone()))
                .fetch_all(pool)
                .await
        }

        async fn list(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
            state: Option<&str>,
            kind: Option<&str>,
            limit: u32,
        ) -> $crate::Result<Vec<$crate::store::queue::JobRow>> {
            use sqlx::Row as _;
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.list.clone()))
                .bind(state)
                .bind(kind)
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.into_iter()
                .map(|row| {
                    let state: String = row.try_get(4)?;
                    let payload: sqlx::types::Json<serde_json::Value> = row.try_get(10)?;
                    Ok($crate::store::queue::JobRow {
                        id: row.try_get(0)?,
                        kind: row.try_get(1)?,
                        key: row.try_get(2)?,
                        queue: row.try_get(3)?,
                        state: state.parse()?,
                        attempt: row.try_get(5)?,
                        max_attempts: row.try_get(6)?,
                        run_at: $crate::time::micros_to_time(row.try_get(7)?),
                        last_error: row.try_get(8)?,
                        created_at: $crate::time::micros_to_time(row.try_get(9)?),
                        payload: payload.0,
                    })
                })
                .collect()
        }

        async fn replay(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
            id: Option<i64>,
            kind: Option<&str>,
        ) -> sqlx::Result<Vec<i64>> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.replay.clone()))
                .bind(id)
                .bind(kind)
                .fetch_all(pool)
                .await
        }
    };
}
pub(crate) use shared_statements;

/// Whether an error means the connection itself is gone, so it must not be used again.
pub(crate) fn is_connection_error(error: &sqlx::Error) -> bool {
    matches!(
        error,
        sqlx::Error::Io(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed
    )
}
