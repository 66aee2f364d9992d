//! A job the [`Worker`](crate::Worker) and the broker [`Consumer`](crate::broker) run: its
//! kind, the key it derives from the business operation, and its effect on the transaction that
//! also records the key.
//!
//! ```no_run
//! use jobguard::{Job, JobError, JobKey, KeyError};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Welcome {
//!     user: i64,
//! }
//!
//! impl Job<sqlx::Postgres> for Welcome {
//!     const KIND: &'static str = "welcome";
//!
//!     fn key(&self) -> Result<JobKey, KeyError> {
//!         JobKey::new("welcome", [self.user.to_string()])
//!     }
//!
//!     async fn run(&self, conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
//!         sqlx::query("insert into mails (user_id) values ($1)")
//!             .bind(self.user)
//!             .execute(conn)
//!             .await?;
//!         Ok(())
//!     }
//! }
//! ```

use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::JobError;
use crate::key::{JobKey, KeyError};
use crate::store::Backend;

/// A kind of job the worker can run.
///
/// The job's fields are its payload (stored as JSON); [`key`](Job::key) derives its key from
/// the business operation; [`run`](Job::run) applies its effect on the worker's open
/// transaction, after the guard claimed the key and before the job is completed, all of which
/// commit together.
pub trait Job<DB: Backend>: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The kind the job is enqueued and registered under.
    const KIND: &'static str;

    /// Whether the [`Worker`](crate::Worker) may run jobs of this kind in batches, when its
    /// [`batch_size`](crate::WorkerConfig::batch_size) is above 1: up to that many fetched jobs
    /// in one transaction, with one commit instead of one per job.
    ///
    /// A batch's effects commit together, and every row an effect locks stays locked until the
    /// whole batch commits: kinds whose jobs write the same rows (one account's balance, one
    /// counter) contend across batches and deadlock more, and are better run one per
    /// transaction. When any job of a batch fails, panics or meets a serialization failure or
    /// deadlock, the batch rolls back and its jobs run again one per transaction, so a job must
    /// not rely on running only once per fetch. Off by default.
    const BATCH: bool = false;

    /// The job's key, derived from the business operation, e.g. `credit:order-8812`.
    fn key(&self) -> Result<JobKey, KeyError>;

    /// The kind's unique policy: which states keep a job's key taken, the period and queue
    /// appended to the key, what a repeated enqueue does ([`crate::unique`]). Jobs enqueued as
    /// values take it ([`NewJob::from_job`](crate::queue::NewJob::from_job)); a call can set
    /// another with [`NewJob::unique`](crate::queue::NewJob::unique). The live states only and
    /// return the existing job, unless overridden.
    ///
    /// ```
    /// # use jobguard::{Job, JobError, JobKey, KeyError};
    /// use jobguard::unique::{OnConflict, UniqueOpts, UniqueStates};
    /// # #[derive(serde::Serialize, serde::Deserialize)]
    /// # struct Fee { account: u64 }
    /// impl Job<sqlx::Postgres> for Fee {
    ///     const KIND: &'static str = "fee";
    ///     fn key(&self) -> Result<JobKey, KeyError> {
    ///         JobKey::new("fee", [format!("account-{}", self.account)])
    ///     }
    ///     fn unique_opts() -> UniqueOpts {
    ///         UniqueOpts::new()
    ///             .states(UniqueStates::LIVE.with_completed())
    ///             .period(std::time::Duration::from_secs(86_400))
    ///             .expect("a day is a valid period")
    ///             .on_conflict(OnConflict::Reject)
    ///     }
    ///     async fn run(&self, _: &mut sqlx::PgConnection) -> Result<(), JobError> { Ok(()) }
    /// }
    /// assert!(<Fee as Job<sqlx::Postgres>>::unique_opts().states_kept().completed());
    /// ```
    fn unique_opts() -> crate::unique::UniqueOpts {
        crate::unique::UniqueOpts::default()
    }

    /// The job's effect, on the transaction that commits it with the guard row and the job's
    /// completion. Return [`JobError::fatal`] for errors no retry can fix.
    fn run(&self, conn: &mut DB::Connection) -> impl Future<Output = Result<(), JobError>> + Send;
}
