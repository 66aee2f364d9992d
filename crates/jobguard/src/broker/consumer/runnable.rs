//! The consumer's registered kinds: a decoded job whose type is erased, run alone under the
//! guard or on a batch's transaction.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use super::Faults;
use crate::error::{JobError, Result};
use crate::guard::{Guard, Outcome};
use crate::job::Job;
use crate::key::{JobKey, KeyError};
use crate::store::Backend;

/// A job run alone, with the fault-injection point before its transaction commits. One value,
/// so that the guard's closure captures one thing and rustc proves its future `Send`
/// (rust-lang/rust#110338).
struct Held<J> {
    job: Arc<J>,
    faults: Faults,
    key: JobKey,
}

impl<J> Held<J> {
    /// The job's effect on `conn`, then the fault-injection point with the job's key.
    async fn run<DB: Backend>(&self, conn: &mut DB::Connection) -> std::result::Result<(), JobError>
    where
        J: Job<DB>,
    {
        self.job.run(conn).await?;
        self.faults.before_commit(std::iter::once(&self.key)).await;
        Ok(())
    }
}

/// A decoded job, its type erased.
pub(in crate::broker) trait Runnable<DB: Backend>: Send + Sync {
    /// The key the job derives from its fields.
    fn key(&self) -> Result<JobKey, KeyError>;

    /// The job's guarded run. Built where the job's type is known: with every type concrete,
    /// rustc proves the future `Send` for the spawned task (rust-lang/rust#110338).
    fn guarded(
        self: Arc<Self>,
        guard: Guard<DB>,
        key: JobKey,
        payload: Value,
        faults: Faults,
    ) -> BoxFuture<'static, Result<Outcome<()>>>;

    /// The job's effect on a transaction of the caller's, for a batch.
    fn run_in<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
    ) -> BoxFuture<'a, std::result::Result<(), JobError>>;
}

impl<DB: Backend, J: Job<DB>> Runnable<DB> for J {
    fn key(&self) -> Result<JobKey, KeyError> {
        Job::key(self)
    }

    fn guarded(
        self: Arc<Self>,
        guard: Guard<DB>,
        key: JobKey,
        payload: Value,
        faults: Faults,
    ) -> BoxFuture<'static, Result<Outcome<()>>> {
        Box::pin(async move {
            let held = Held {
                job: self,
                faults,
                key: key.clone(),
            };
            guard
                .run_with_payload(&key, &payload, async move |conn| held.run(conn).await)
                .await
        })
    }

    fn run_in<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
    ) -> BoxFuture<'a, std::result::Result<(), JobError>> {
        Box::pin(self.run(conn))
    }
}
