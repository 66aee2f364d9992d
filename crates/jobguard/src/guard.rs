//! The guard: one row per job key, inserted in the same transaction as the job's effect.
//!
//! A job system that delivers at least once will sometimes run a job twice, and sometimes at
//! the same time. The guard makes the *effect* happen once: before the effect runs, it inserts a
//! row for the job's key with `insert ... on conflict do nothing returning` in the transaction
//! that will hold the effect, and runs the effect only when the row was inserted.
//!
//! Because the guard row and the effect commit or roll back together:
//!
//! - **on commit**, the key is recorded and the effect is visible, together; every later or
//!   concurrent delivery of the key reports [`Outcome::Duplicate`] and changes nothing;
//! - **on rollback** (the effect failed, the process died, the connection dropped), neither the
//!   row nor the effect exists, so the next delivery applies the job;
//! - **while the first delivery runs**, a concurrent second delivery waits on the row's lock,
//!   then reports a duplicate when the first commits, or applies when it rolls back.
//!
//! ```no_run
//! use jobguard::{JobKey, Outcome, PgGuard};
//!
//! # async fn credit(pool: sqlx::PgPool) -> jobguard::Result<()> {
//! let guard = PgGuard::new(pool);
//! guard.migrate().await?;
//!
//! let key = JobKey::new("credit", ["order-8812"])?;
//! let outcome = guard
//!     .run(&key, async |conn| {
//!         sqlx::query("insert into ledger (account, amount) values ($1, $2)")
//!             .bind(7_i64)
//!             .bind(500_i64)
//!             .execute(&mut *conn)
//!             .await?;
//!         Ok(())
//!     })
//!     .await?;
//! match outcome {
//!     Outcome::Applied(()) => println!("credited"),
//!     Outcome::Duplicate(dup) => println!("already credited at {:?}", dup.first_applied_at),
//! }
//! # Ok(()) }
//! ```
//!
//! Jobs whose every step is naturally idempotent (set a value, upsert by natural key, delete if
//! exists) need no guard; a single non-idempotent step (increment, append, send) makes the whole
//! job need one.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Pool;
use tracing::Instrument;

use crate::error::{Error, JobError, Result};
use crate::fingerprint::Fingerprint;
use crate::key::JobKey;
use crate::metrics::record_duplicate_age;
use crate::spikes::record_outcome;
use crate::store::WriterLock;
use crate::store::{Backend, ClaimRow, ClaimToken, GuardRecord, GuardSql, NewClaim};

mod unit;

pub(crate) use self::unit::{Completing, Failure, Runs, UnitOfWork};
use crate::table::TableName;

/// What a delivery of a guarded job did.
#[derive(Clone, Debug, PartialEq)]
#[must_use = "a duplicate outcome means the effect did not run this time"]
pub enum Outcome<T> {
    /// This delivery claimed the key and its effect committed; the value the job returned.
    Applied(T),
    /// An earlier delivery already applied the key; nothing was changed.
    Duplicate(Duplicate<T>),
}

impl<T> Outcome<T> {
    /// Whether this delivery applied the effect.
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied(_))
    }

    /// Whether this delivery found the key already applied.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Outcome::Duplicate(_))
    }

    /// `applied` or `duplicate`, as used in metrics and reports.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Applied(_) => "applied",
            Outcome::Duplicate(_) => "duplicate",
        }
    }

    /// The value of the run that applied the key: this one's, or the stored result of the
    /// first run when this delivery is a duplicate and the job returned a non-null value.
    pub fn into_value(self) -> Option<T> {
        match self {
            Outcome::Applied(value) => Some(value),
            Outcome::Duplicate(dup) => dup.result,
        }
    }
}

/// A delivery of a key that was already applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Duplicate<T> {
    /// When the key was first applied, by the database clock.
    pub first_applied_at: SystemTime,
    /// What the first run returned, when it returned something other than JSON `null`.
    pub result: Option<T>,
}

/// The result of [`Guard::claim_tx`]: whether the caller's transaction now holds the key.
#[derive(Clone, Debug, PartialEq)]
#[must_use = "a duplicate claim means the effect must not run"]
pub enum Claim {
    /// The guard row was inserted in the caller's transaction: run the effect there.
    Claimed,
    /// The key was applied by a committed transaction: skip the effect.
    Duplicate(GuardRecord),
}

/// How a [`Guard`] is set up.
#[derive(Clone, Debug)]
pub struct GuardConfig {
    pub(crate) table: TableName,
    contention_attempts: u32,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            table: TableName::new(GuardConfig::DEFAULT_TABLE).expect("the default name is valid"),
            contention_attempts: jobguard_core::transient::RUNS,
        }
    }
}

impl GuardConfig {
    /// The guard table's name unless configured: `processed_jobs`.
    pub const DEFAULT_TABLE: &'static str = "processed_jobs";

    /// Uses another table, e.g. `TableName::new("billing_guard")?.in_schema("billing")?`.
    pub fn table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }

    /// How many times a job whose transaction hits a serialization failure, a deadlock or a
    /// busy SQLite database runs before [`Error::Contention`] (default 5, at least 1).
    pub fn contention_attempts(mut self, attempts: u32) -> Self {
        self.contention_attempts = attempts.max(1);
        self
    }
}

/// Runs jobs so that each job key takes effect once. Cheap to clone.
///
/// See the [module documentation](self) for the guarantee.
pub struct Guard<DB: Backend> {
    inner: Arc<Inner<DB>>,
}

struct Inner<DB: Backend> {
    pool: Pool<DB>,
    sql: GuardSql,
    contention_attempts: u32,
    writer: WriterLock,
}

impl<DB: Backend> Clone for Guard<DB> {
    fn clone(&self) -> Self {
        Guard {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Guard<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("backend", &DB::BACKEND)
            .field("table", &self.inner.sql.table.to_string())
            .finish()
    }
}

/// Records a `failed` outcome when dropped armed, that is while a panic unwinds.
struct PanicCounter<'a> {
    kind: &'a str,
    armed: bool,
}

impl Drop for PanicCounter<'_> {
    fn drop(&mut self) {
        if self.armed && std::thread::panicking() {
            record_outcome(self.kind, "failed");
        }
    }
}

impl<DB: Backend> Guard<DB> {
    /// A guard on the `processed_jobs` table of `pool`'s database.
    pub fn new(pool: Pool<DB>) -> Self {
        Self::with_config(pool, GuardConfig::default())
            .expect("the default table name is valid on every backend")
    }

    /// A guard with its own table or contention limit. Fails when the table name does not
    /// suit the backend (a schema on SQLite).
    pub fn with_config(pool: Pool<DB>, config: GuardConfig) -> Result<Self> {
        Self::with_writer(pool, config, WriterLock::for_backend::<DB>())
    }

    /// A guard that takes turns with the writers of a [`Queue`](crate::Queue) on SQLite.
    pub(crate) fn with_writer(
        pool: Pool<DB>,
        config: GuardConfig,
        writer: WriterLock,
    ) -> Result<Self> {
        let sql = DB::guard_sql(&config.table)?;
        let contention_attempts = config.contention_attempts;
        Ok(Guard {
            inner: Arc::new(Inner {
                pool,
                sql,
                contention_attempts,
                writer,
            }),
        })
    }

    /// The pool the guard runs jobs on.
    pub fn pool(&self) -> &Pool<DB> {
        &self.inner.pool
    }

    /// The guard table.
    pub fn table(&self) -> &TableName {
        &self.inner.sql.table
    }

    /// The age of the oldest guard row, by the database clock: how far back the guard
    /// remembers keys, its memory horizon. `None` when the table is empty. A duplicate older
    /// than this finds no row and is applied again.
    pub async fn oldest_age(&self) -> Result<Option<Duration>> {
        Ok(DB::oldest_guard_age(&self.inner.pool, &self.inner.sql).await?)
    }

    /// Creates the guard table and its index when missing. Safe to call from many processes at
    /// once and on every start.
    pub async fn migrate(&self) -> Result<()> {
        let sql = &self.inner.sql;
        Ok(DB::migrate_statements(&self.inner.pool, &sql.table, &sql.create).await?)
    }

    /// This process's turn to write on SQLite, shared with the queue's writers; nothing on
    /// PostgreSQL. Held by each batch of a prune.
    pub(crate) async fn write_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.inner.writer.acquire().await
    }

    /// Runs `effect` once for `key`, however many times the job is delivered.
    ///
    /// Opens a transaction, inserts the guard row first, runs `effect` on the same transaction
    /// only when the row was inserted, stores the value it returns (unless JSON `null`), and
    /// commits the row and the effect together.
    ///
    /// - `Ok(Outcome::Applied(value))`: committed, with this delivery's value.
    /// - `Ok(Outcome::Duplicate(..))`: an earlier delivery committed the key; nothing changed.
    /// - `Err(..)`: rolled back; nothing was applied and a later delivery will apply it, except
    ///   for [`Error::OutcomeUnknown`], after which a redelivery settles the outcome.
    ///
    /// `effect` may run more than once when the transaction is rolled back by a serialization
    /// failure or deadlock (PostgreSQL) or a busy database (SQLite); each run is in a fresh
    /// transaction, so only one run's writes ever commit.
    ///
    /// When the returned future is spawned and the closure borrows from the surrounding async
    /// function, write `async move |conn|` (moving in clones): rustc cannot yet prove such a
    /// future `Send` (rust-lang/rust#110338).
    ///
    /// ```no_run
    /// # async fn f(guard: jobguard::PgGuard) -> jobguard::Result<()> {
    /// let key = jobguard::JobKey::new("fee", ["account-7", "2026-10"])?;
    /// let outcome = guard
    ///     .run(&key, async |conn| {
    ///         let id: i64 = sqlx::query_scalar("insert into fees (account, cents) values (7, 900) returning id")
    ///             .fetch_one(&mut *conn)
    ///             .await?;
    ///         Ok(id)
    ///     })
    ///     .await?;
    /// // The fee's id, from this run or from the run that applied it first.
    /// let fee_id: Option<i64> = outcome.into_value();
    /// assert!(fee_id.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn run<T, F>(&self, key: &JobKey, effect: F) -> Result<Outcome<T>>
    where
        T: Serialize + DeserializeOwned + Send,
        F: AsyncFnMut(&mut DB::Connection) -> Result<T, JobError> + Send,
    {
        self.run_guarded(key, None, effect).await
    }

    /// Like [`run`](Self::run), and also records a fingerprint of `payload` with the key.
    ///
    /// A later delivery of the key with a different payload fails with [`Error::KeyReused`]
    /// and applies nothing: the same key naming two different operations is a bug in how the
    /// key is derived, and running either silently would hide it.
    pub async fn run_with_payload<T, P, F>(
        &self,
        key: &JobKey,
        payload: &P,
        effect: F,
    ) -> Result<Outcome<T>>
    where
        T: Serialize + DeserializeOwned + Send,
        P: Serialize + ?Sized,
        F: AsyncFnMut(&mut DB::Connection) -> Result<T, JobError> + Send,
    {
        let fingerprint = fingerprint_of(key, payload)?;
        self.run_guarded(key, Some(fingerprint), effect).await
    }

    /// Claims `key` inside a transaction the caller owns.
    ///
    /// Returns [`Claim::Claimed`] when the guard row was inserted: run the effect in the same
    /// transaction. On **commit** the key is recorded together with the effect; on
    /// **rollback** the row disappears with it and a later delivery can claim the key again.
    /// Returns [`Claim::Duplicate`] when a committed transaction already holds the key: skip the
    /// effect. A concurrent transaction holding the key uncommitted makes this call wait for it.
    ///
    /// On SQLite, open the transaction with `begin immediate` (as [`run`](Self::run) does), or
    /// concurrent deliveries fail with `database is locked` instead of waiting. On PostgreSQL
    /// under `repeatable read` or `serializable`, a concurrent claim fails with a serialization
    /// failure: roll back and deliver again.
    ///
    /// ```no_run
    /// use jobguard::{Claim, JobKey, PgGuard};
    ///
    /// # async fn f(guard: PgGuard, pool: sqlx::PgPool) -> jobguard::Result<()> {
    /// let key = JobKey::new("credit", ["order-8812"])?;
    /// let mut tx = pool.begin().await?;
    /// if let Claim::Claimed = guard.claim_tx(&mut tx, &key).await? {
    ///     sqlx::query("insert into ledger (account, amount) values (7, 500)")
    ///         .execute(&mut *tx)
    ///         .await?;
    /// }
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn claim_tx(&self, conn: &mut DB::Connection, key: &JobKey) -> Result<Claim> {
        self.claim_in(conn, key, None, &ClaimToken::new()).await
    }

    /// Like [`claim_tx`](Self::claim_tx), with the payload fingerprint check of
    /// [`run_with_payload`](Self::run_with_payload).
    pub async fn claim_with_payload_tx<P: Serialize + ?Sized>(
        &self,
        conn: &mut DB::Connection,
        key: &JobKey,
        payload: &P,
    ) -> Result<Claim> {
        let fingerprint = fingerprint_of(key, payload)?;
        self.claim_in(conn, key, Some(&fingerprint), &ClaimToken::new())
            .await
    }

    /// Stores the result of a job claimed with [`claim_tx`](Self::claim_tx), in the caller's
    /// transaction, so duplicates can return it. Visible on commit; gone on rollback.
    pub async fn store_result_tx<T: Serialize + ?Sized>(
        &self,
        conn: &mut DB::Connection,
        key: &JobKey,
        result: &T,
    ) -> Result<()> {
        let value = serde_json::to_value(result).map_err(|source| Error::StoredResult {
            key: key.to_string(),
            source,
        })?;
        Ok(DB::store_result(conn, &self.inner.sql, key.as_str(), &value).await?)
    }

    /// The guard row of `key`, if a committed transaction applied it.
    pub async fn lookup(&self, key: &JobKey) -> Result<Option<GuardRecord>> {
        let mut conn = self.inner.pool.acquire().await?;
        Ok(DB::fetch_record(&mut conn, &self.inner.sql, key.as_str()).await?)
    }

    async fn run_guarded<T, F>(
        &self,
        key: &JobKey,
        fingerprint: Option<Fingerprint>,
        mut effect: F,
    ) -> Result<Outcome<T>>
    where
        T: Serialize + DeserializeOwned + Send,
        F: AsyncFnMut(&mut DB::Connection) -> Result<T, JobError> + Send,
    {
        let span = tracing::debug_span!("guarded_job", job.key = %key, job.kind = key.kind());
        // Counts a delivery whose effect panicked, which never reaches the count below.
        let mut unwinding = PanicCounter {
            kind: key.kind(),
            armed: true,
        };
        let result = async {
            let mut runs = Runs::new(self);
            loop {
                let failure = match self.attempt(key, fingerprint.as_ref(), &mut effect).await {
                    Ok(outcome) => return Ok(outcome),
                    // The commit's answer was lost and another delivery holds the key.
                    Err(Failure::HeldElsewhere(record)) => {
                        return Ok(Outcome::Duplicate(duplicate_of(key, record)?));
                    }
                    Err(failure) => failure,
                };
                // Contention only: a broken connection is the caller's to retry, as an error.
                if failure.is_contention() && runs.again(&failure).await {
                    continue;
                }
                return Err(match failure {
                    Failure::Contention(sqlx::Error::RowNotFound) => {
                        let message = format!(
                            "the guard row of `{key}` kept disappearing between the conflict \
                             and its read: guard rows are being deleted while jobs run"
                        );
                        Error::Database(sqlx::Error::Protocol(message))
                    }
                    Failure::Contention(source) => Error::Contention {
                        key: key.to_string(),
                        attempts: runs.done(),
                        source,
                    },
                    Failure::Connection(error) => Error::Database(error),
                    Failure::Failed(error) => error,
                    Failure::HeldElsewhere(_) | Failure::Fenced => {
                        unreachable!("handled above, or only for jobs under a lease")
                    }
                });
            }
        }
        .instrument(span)
        .await;
        let label = match &result {
            Ok(outcome) => outcome.label(),
            Err(_) => "failed",
        };
        unwinding.armed = false;
        record_outcome(key.kind(), label);
        tracing::debug!(job.key = %key, outcome = label, "guarded job finished");
        result
    }

    /// One run: a unit of work that claims `key`, runs `effect` when the claim is fresh,
    /// stores its value and commits.
    async fn attempt<T, F>(
        &self,
        key: &JobKey,
        fingerprint: Option<&Fingerprint>,
        effect: &mut F,
    ) -> Result<Outcome<T>, Failure>
    where
        T: Serialize + DeserializeOwned + Send,
        F: AsyncFnMut(&mut DB::Connection) -> Result<T, JobError> + Send,
    {
        let _writer = self.inner.writer.acquire().await;
        // On a single-writer database, a delivery that queued behind the one that applied its
        // key finds the committed row with a plain read, without taking the write lock. A
        // committed guard row is final, so the read alone proves a duplicate.
        if DB::SINGLE_WRITER
            && let Some(record) = self.lookup(key).await.map_err(Failure::of)?
        {
            let claim =
                check_claim(key, fingerprint, ClaimRow::Held(record)).map_err(Failure::of)?;
            if let Claim::Duplicate(record) = claim {
                return Ok(Outcome::Duplicate(
                    duplicate_of(key, record).map_err(Failure::Failed)?,
                ));
            }
        }
        let mut unit = UnitOfWork::begin(self).await?;
        if let Claim::Duplicate(record) = unit.claim(key, fingerprint).await? {
            // The duplicate wrote nothing. Dropping the transaction queues its rollback on the
            // connection, which the pool flushes on release, instead of waiting for it here.
            drop(unit);
            return Ok(Outcome::Duplicate(
                duplicate_of(key, record).map_err(Failure::Failed)?,
            ));
        }
        let value = match effect(unit.conn()).await {
            Ok(value) => value,
            Err(error) => {
                unit.rollback().await;
                return Err(match Failure::effect::<DB>(key, error) {
                    // The effect's own error, though its connection broke.
                    Failure::Connection(db) => Failure::Failed(Error::Effect {
                        key: key.to_string(),
                        fatal: false,
                        source: Box::new(db),
                    }),
                    failure => failure,
                });
            }
        };
        let stored = serde_json::to_value(&value).map_err(|source| {
            Failure::Failed(Error::StoredResult {
                key: key.to_string(),
                source,
            })
        })?;
        if !stored.is_null() {
            unit.store_result(key, &stored).await?;
        }
        unit.commit().await?;
        Ok(Outcome::Applied(value))
    }

    async fn claim_in(
        &self,
        conn: &mut DB::Connection,
        key: &JobKey,
        fingerprint: Option<&Fingerprint>,
        token: &ClaimToken,
    ) -> Result<Claim> {
        let new = NewClaim {
            key: key.as_str(),
            kind: key.kind(),
            fingerprint,
            token,
        };
        let row = DB::claim(conn, &self.inner.sql, &new).await?;
        check_claim(key, fingerprint, row)
    }

    /// How many times a transaction rolled back by contention runs before it gives up.
    pub(crate) fn contention_attempts(&self) -> u32 {
        self.inner.contention_attempts
    }

    /// The guard table's statements, for the worker's claim that also completes its job.
    pub(crate) fn sql(&self) -> &GuardSql {
        &self.inner.sql
    }
}

/// Turns what the claim found into a [`Claim`], refusing a key reused with another payload.
pub(crate) fn check_claim(
    key: &JobKey,
    fingerprint: Option<&Fingerprint>,
    row: ClaimRow,
) -> Result<Claim> {
    let record = match row {
        ClaimRow::Claimed => return Ok(Claim::Claimed),
        ClaimRow::Held(record) => record,
        ClaimRow::Vanished => return Err(Error::Database(sqlx::Error::RowNotFound)),
    };
    // Only two known payloads can disagree: a key first run without a payload accepts any.
    if let (Some(stored), Some(given)) = (&record.fingerprint, fingerprint)
        && stored != given
    {
        return Err(Error::KeyReused {
            key: key.to_string(),
        });
    }
    // Every caller stops at a duplicate claim, so each duplicate delivery is counted once.
    record_duplicate_age(key.kind(), record.applied_at);
    Ok(Claim::Duplicate(record))
}

pub(crate) fn fingerprint_of<P: Serialize + ?Sized>(
    key: &JobKey,
    payload: &P,
) -> Result<Fingerprint> {
    Fingerprint::of(payload).map_err(|source| Error::Payload {
        key: key.to_string(),
        source,
    })
}

/// The [`Duplicate`] a recorded guard row stands for, its stored result decoded as `T`.
pub(crate) fn duplicate_of<T: DeserializeOwned>(
    key: &JobKey,
    record: GuardRecord,
) -> Result<Duplicate<T>> {
    let result = record
        .result
        .map(serde_json::from_value)
        .transpose()
        .map_err(|source| Error::StoredResult {
            key: key.to_string(),
            source,
        })?;
    Ok(Duplicate {
        first_applied_at: record.applied_at,
        result,
    })
}
