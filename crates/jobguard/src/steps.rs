//! Started/done steps, for external calls to APIs that take no idempotency key.
//!
//! Without a key the API cannot drop a repeated call, so the job must know whether an earlier
//! delivery already made it. [`Steps`] keeps a ledger row per job key and step:
//!
//! 1. `started`, committed **before** the call, with a lease;
//! 2. the call;
//! 3. `done`, with the call's result.
//!
//! A delivery that finds `done` returns the recorded result. One that finds a live `started`
//! calls nothing: another delivery is calling right now, so it fails with
//! [`Error::StepInFlight`] and retries later. One that finds an expired `started` knows that an
//! earlier caller vanished between 1 and 3, and cannot know whether the call happened: it asks a
//! reconciler, written by the user against the API's lookup, which answers
//!
//! - [`Reconciled::Done`]: it happened; the result is recorded and nothing is called;
//! - [`Reconciled::NotDone`]: it did not; the call is made;
//! - [`Reconciled::Unknown`]: it cannot tell; the step is marked `attention`, counted in
//!   `jobguard_steps_attention_total`, and never called again until an operator settles it
//!   with [`Steps::resolve`].
//!
//! Nothing ever calls again blindly. A window remains: an API that applies a call but is not
//! yet showing it in its lookup makes the reconciler answer `NotDone` wrongly. That is why an
//! API with idempotency keys ([`external`](crate::external)) is always the better choice.
//!
//! ```no_run
//! use jobguard::steps::{Reconciled, Steps};
//! use jobguard::{JobError, JobKey};
//!
//! # async fn create_transfer(reference: &str) -> Result<String, JobError> { todo!() }
//! # async fn find_transfer(reference: &str) -> Result<Option<String>, JobError> { todo!() }
//! # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
//! let steps = Steps::new(pool);
//! steps.migrate().await?;
//! let key = JobKey::new("payout", ["invoice-311"])?;
//! let transfer_id: String = steps
//!     .run(
//!         &key,
//!         "transfer",
//!         async || create_transfer("invoice-311").await,
//!         async || match find_transfer("invoice-311").await? {
//!             Some(id) => Ok(Reconciled::Done(id)),
//!             None => Ok(Reconciled::NotDone),
//!         },
//!     )
//!     .await?
//!     .into_value();
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Pool;

use crate::error::{Error, JobError, Result, effect_error};
use crate::key::{JobKey, check_kind};
use crate::store::steps::{StaleClaim, StepSql, StepStart, StepUpdate};
use crate::store::{Backend, ClaimToken};
use crate::table::TableName;

pub use crate::store::steps::{AttentionStep, StaleStep};

/// Steps marked `attention` per job kind: `jobguard_steps_attention_total{kind}`.
pub use crate::metrics::STEPS_ATTENTION_TOTAL as ATTENTION_TOTAL;

/// What a reconciler found out about a step whose caller vanished.
#[derive(Clone, Debug, PartialEq)]
pub enum Reconciled<T> {
    /// The effect happened; this is its result.
    Done(T),
    /// The effect did not happen; it is safe to call.
    NotDone,
    /// The external system cannot say; why, for the operator.
    Unknown(String),
}

/// How a step's result was obtained.
#[derive(Clone, Debug, PartialEq)]
pub enum StepOutcome<T> {
    /// This delivery made the call.
    Called(T),
    /// An earlier delivery made the call and recorded its result.
    Recorded(T),
    /// An earlier caller vanished; the reconciler found the effect had happened.
    Reconciled(T),
}

impl<T> StepOutcome<T> {
    /// The step's result, however it was obtained.
    pub fn into_value(self) -> T {
        match self {
            StepOutcome::Called(value)
            | StepOutcome::Recorded(value)
            | StepOutcome::Reconciled(value) => value,
        }
    }

    /// Whether this delivery called the external system.
    pub fn called(&self) -> bool {
        matches!(self, StepOutcome::Called(_))
    }
}

/// How an operator settles a step marked `attention`.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    /// The effect happened, with this result: the next delivery returns it.
    Done(serde_json::Value),
    /// The effect did not happen: the next delivery calls.
    NotDone,
}

/// What a [`Steps::sweep`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Stale steps the reconciler found done; their results are recorded.
    pub done: u64,
    /// Stale steps the reconciler found not done; cleared, so the next delivery calls.
    pub not_done: u64,
    /// Stale steps marked `attention`.
    pub attention: u64,
    /// Stale steps whose reconciler failed; they stay stale for the next sweep.
    pub failed: u64,
}

/// Settings of a [`Steps`] ledger.
#[derive(Clone, Debug)]
pub struct StepConfig {
    pub(crate) table: TableName,
    lease: Duration,
}

impl Default for StepConfig {
    fn default() -> Self {
        StepConfig {
            table: TableName::new("jobguard_steps").expect("a valid default table name"),
            lease: Duration::from_secs(60),
        }
    }
}

impl StepConfig {
    /// The ledger's table (default `jobguard_steps`).
    pub fn table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }

    /// How long a started call may take before another delivery reconciles it (default 60 s).
    ///
    /// Make it longer than the API call's timeout: a lease that expires while the call is
    /// still running lets another delivery reconcile a call that has not finished, and the
    /// reconciler may then answer `NotDone` for an effect about to happen.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
}

/// The ledger of started and done external steps. See the [module docs](self).
pub struct Steps<DB: Backend> {
    pool: Pool<DB>,
    sql: Arc<StepSql>,
    lease: Duration,
}

impl<DB: Backend> Clone for Steps<DB> {
    fn clone(&self) -> Self {
        Steps {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
            lease: self.lease,
        }
    }
}

impl<DB: Backend> std::fmt::Debug for Steps<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steps")
            .field("table", &self.sql.table)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl<DB: Backend> Steps<DB> {
    /// A ledger in the `jobguard_steps` table with a 60-second lease.
    pub fn new(pool: Pool<DB>) -> Self {
        Self::with_config(pool, StepConfig::default())
    }

    /// A ledger with the given settings.
    pub fn with_config(pool: Pool<DB>, config: StepConfig) -> Self {
        Steps {
            pool,
            sql: Arc::new(DB::step_sql(&config.table)),
            lease: config.lease,
        }
    }

    /// Creates the ledger's table if it does not exist.
    pub async fn migrate(&self) -> Result<()> {
        Ok(DB::migrate_statements(&self.pool, &self.sql.table, &self.sql.create).await?)
    }

    /// Runs `step` of the job `key` at most once, reconciling when an earlier caller vanished.
    ///
    /// See the [module docs](self) for the states. `call` makes the external call; its
    /// result is recorded as `done`. If `call` fails, the step's lease is ended at once, so the
    /// next delivery asks `reconcile` rather than calling again: a failed call may still have
    /// taken effect (a timeout after the API applied it).
    ///
    /// Errors: [`Error::StepInFlight`] when another delivery holds the step (retryable),
    /// [`Error::StepNeedsAttention`] when the step is marked `attention` (fatal), and
    /// [`Error::Effect`] when `call` or `reconcile` fails.
    pub async fn run<T, C, R>(
        &self,
        key: &JobKey,
        step: &str,
        call: C,
        reconcile: R,
    ) -> Result<StepOutcome<T>>
    where
        T: Serialize + DeserializeOwned + Send,
        C: AsyncFnOnce() -> Result<T, JobError>,
        R: AsyncFnOnce() -> Result<Reconciled<T>, JobError>,
    {
        check_kind(step)?;
        let token = ClaimToken::new();
        let start = StepStart {
            key: key.as_str(),
            step,
            kind: key.kind(),
            token: &token,
            lease: self.lease,
        };
        if DB::step_start(&self.pool, &self.sql, &start).await? {
            return self.call(key, step, &token, call).await;
        }
        let Some(row) = DB::step_read(&self.pool, &self.sql, key.as_str(), step).await? else {
            // Cleared between the insert and the read (resolved as not done): start afresh.
            return Err(in_flight(key, step, Duration::ZERO));
        };
        match row.state.as_str() {
            "done" => Ok(StepOutcome::Recorded(decode(key, row.result)?)),
            "attention" => Err(Error::StepNeedsAttention {
                key: key.to_string(),
                step: step.to_owned(),
                reason: row.reason.unwrap_or_default(),
            }),
            _ if row.remaining > Duration::ZERO => Err(in_flight(key, step, row.remaining)),
            _ => {
                let held = self
                    .update(key.as_str(), step, &row.token, StepUpdate::TakeOver(&token))
                    .await?;
                if !held {
                    return Err(in_flight(key, step, self.lease));
                }
                self.reconcile(key, step, &token, call, reconcile).await
            }
        }
    }

    /// Reconciles `started` steps whose lease expired, up to `limit` of them: the steps of
    /// callers that vanished and were never redelivered.
    ///
    /// `reconcile` answers for each; `Done` records the result, `NotDone` clears the step so
    /// the job's next delivery calls, `Unknown` marks it `attention`, and an error leaves it
    /// for the next sweep.
    pub async fn sweep<F, Fut>(&self, limit: u32, mut reconcile: F) -> Result<SweepReport>
    where
        F: FnMut(StaleStep) -> Fut,
        Fut: Future<Output = Result<Reconciled<serde_json::Value>, JobError>>,
    {
        let mut report = SweepReport::default();
        for StaleClaim {
            step: stale,
            token: old_token,
        } in DB::step_stale(&self.pool, &self.sql, limit).await?
        {
            let token = ClaimToken::new();
            let (key, step) = (stale.key.clone(), stale.step.clone());
            if !self
                .update(&key, &step, &old_token, StepUpdate::TakeOver(&token))
                .await?
            {
                continue;
            }
            let kind = key.split(':').next().unwrap_or_default().to_owned();
            match reconcile(stale).await {
                Ok(Reconciled::Done(value)) => {
                    self.update(&key, &step, &token.0, StepUpdate::Done(&value))
                        .await?;
                    report.done += 1;
                }
                Ok(Reconciled::NotDone) => {
                    self.update(&key, &step, &token.0, StepUpdate::Forget)
                        .await?;
                    report.not_done += 1;
                }
                Ok(Reconciled::Unknown(reason)) => {
                    self.update(&key, &step, &token.0, StepUpdate::Attention(&reason))
                        .await?;
                    metrics::counter!(ATTENTION_TOTAL, "kind" => kind).increment(1);
                    report.attention += 1;
                }
                Err(error) => {
                    tracing::warn!(job.key = %key, step, %error, "reconciling a stale step failed");
                    self.update(&key, &step, &token.0, StepUpdate::Expire)
                        .await?;
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }

    /// Settles a step marked `attention` after an operator checked the external system.
    /// Returns false when the step is not marked `attention`.
    pub async fn resolve(&self, key: &JobKey, step: &str, resolution: Resolution) -> Result<bool> {
        let update = match &resolution {
            Resolution::Done(value) => StepUpdate::ResolveDone(value),
            Resolution::NotDone => StepUpdate::ResolveNotDone,
        };
        self.update(key.as_str(), step, &[], update).await
    }

    /// Steps marked `attention`, oldest first, up to `limit`.
    pub async fn attention(&self, limit: u32) -> Result<Vec<AttentionStep>> {
        Ok(DB::step_attention(&self.pool, &self.sql, limit).await?)
    }

    /// How many steps are marked `attention`, waiting for [`resolve`](Self::resolve).
    pub async fn attention_count(&self) -> Result<u64> {
        Ok(DB::step_attention_count(&self.pool, &self.sql).await?)
    }

    async fn call<T, C>(
        &self,
        key: &JobKey,
        step: &str,
        token: &ClaimToken,
        call: C,
    ) -> Result<StepOutcome<T>>
    where
        T: Serialize + DeserializeOwned + Send,
        C: AsyncFnOnce() -> Result<T, JobError>,
    {
        match call().await {
            Ok(value) => {
                let json = to_json(key, &value)?;
                if !self
                    .update(key.as_str(), step, &token.0, StepUpdate::Done(&json))
                    .await?
                {
                    // The lease ran out during the call and another delivery took the step
                    // over: it reconciles, and will find this call's effect.
                    tracing::warn!(job.key = %key, step, "a step's lease expired during its call");
                }
                Ok(StepOutcome::Called(value))
            }
            Err(error) => {
                self.update(key.as_str(), step, &token.0, StepUpdate::Expire)
                    .await?;
                Err(effect_error(key, error))
            }
        }
    }

    async fn reconcile<T, C, R>(
        &self,
        key: &JobKey,
        step: &str,
        token: &ClaimToken,
        call: C,
        reconcile: R,
    ) -> Result<StepOutcome<T>>
    where
        T: Serialize + DeserializeOwned + Send,
        C: AsyncFnOnce() -> Result<T, JobError>,
        R: AsyncFnOnce() -> Result<Reconciled<T>, JobError>,
    {
        match reconcile().await {
            Ok(Reconciled::Done(value)) => {
                let json = to_json(key, &value)?;
                self.update(key.as_str(), step, &token.0, StepUpdate::Done(&json))
                    .await?;
                Ok(StepOutcome::Reconciled(value))
            }
            Ok(Reconciled::NotDone) => self.call(key, step, token, call).await,
            Ok(Reconciled::Unknown(reason)) => {
                self.update(key.as_str(), step, &token.0, StepUpdate::Attention(&reason))
                    .await?;
                metrics::counter!(ATTENTION_TOTAL, "kind" => key.kind().to_owned()).increment(1);
                tracing::error!(job.key = %key, step, %reason, "a step needs attention");
                Err(Error::StepNeedsAttention {
                    key: key.to_string(),
                    step: step.to_owned(),
                    reason,
                })
            }
            Err(error) => {
                self.update(key.as_str(), step, &token.0, StepUpdate::Expire)
                    .await?;
                Err(effect_error(key, error))
            }
        }
    }

    /// The ledger's table.
    pub(crate) fn table(&self) -> &TableName {
        &self.sql.table
    }

    /// `done` steps recorded before `cutoff` (microseconds since the Unix epoch, by the
    /// database clock).
    pub(crate) async fn prunable(&self, cutoff: i64) -> Result<u64> {
        Ok(DB::step_prunable(&self.pool, &self.sql, cutoff).await?)
    }

    /// Deletes up to `limit` `done` steps recorded before `cutoff`. Never a `started` step (its
    /// caller may be calling right now, or vanished and needs reconciling) nor one that needs
    /// attention (only an operator settles it).
    pub(crate) async fn prune_batch(&self, cutoff: i64, limit: u32) -> Result<u64> {
        Ok(DB::step_prune(&self.pool, &self.sql, cutoff, limit).await?)
    }

    async fn update(
        &self,
        key: &str,
        step: &str,
        token: &[u8],
        how: StepUpdate<'_>,
    ) -> Result<bool> {
        Ok(DB::step_update(&self.pool, &self.sql, key, step, token, how, self.lease).await?)
    }
}

fn in_flight(key: &JobKey, step: &str, retry_after: Duration) -> Error {
    Error::StepInFlight {
        key: key.to_string(),
        step: step.to_owned(),
        retry_after,
    }
}

fn to_json<T: Serialize>(key: &JobKey, value: &T) -> Result<serde_json::Value> {
    serde_json::to_value(value).map_err(|source| Error::StoredResult {
        key: key.to_string(),
        source,
    })
}

fn decode<T: DeserializeOwned>(key: &JobKey, value: Option<serde_json::Value>) -> Result<T> {
    serde_json::from_value(value.unwrap_or_default()).map_err(|source| Error::StoredResult {
        key: key.to_string(),
        source,
    })
}
