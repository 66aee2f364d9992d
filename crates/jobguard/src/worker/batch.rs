//! Running a batch: up to [`WorkerConfig::batch_size`](super::WorkerConfig::batch_size) leased
//! jobs of kinds that opted in ([`Job::BATCH`](crate::Job::BATCH)), in one transaction.
//!
//! Each job's completion under its lease token and its key's claim are one statement, as on
//! the per-job path; its effect runs right after, on the same transaction, in fetch order; one
//! commit makes all of them true at once or none. A fenced job's statement completes nothing
//! and claims nothing, so the batch goes on without it. A key held before the batch, or claimed
//! by an earlier job of the same batch, is a duplicate: the key applies once.
//!
//! Anything else that stops the batch (an effect's error or panic, a serialization failure, a
//! deadlock, a lost connection or commit, a payload that does not decode) rolls the whole batch
//! back, and its jobs run again one per transaction on the per-job path: a failing job retries
//! alone and the others apply, and a commit whose outcome was lost is settled job by job as the
//! per-job path settles it (a job whose completion did commit is no longer held by its lease).

use std::sync::Mutex;
use std::time::Instant;

use sqlx::Transaction;
use tokio::sync::OwnedSemaphorePermit;

use super::run::{job_span, report};
use super::runnable::Runnable;
use super::{Counters, Ended, Worker};
use crate::dispatch::catch_panic;
use crate::guard::Claim;
use crate::key::JobKey;
use crate::queue::{Lease, LeasedJob};
use crate::store::Backend;

impl<DB: Backend> Worker<DB> {
    /// Runs `jobs` as one batch, or one per transaction when the batch rolled back.
    pub(super) async fn process_batch(
        &self,
        jobs: Vec<LeasedJob>,
        counters: &Counters,
        _permit: OwnedSemaphorePermit,
    ) {
        if jobs.len() == 1 {
            return self.process_one(&jobs[0], counters).await;
        }
        let started = Instant::now();
        match self.execute_batch(&jobs).await {
            Ok(ended) => {
                let took = started.elapsed();
                for (job, ended) in jobs.iter().zip(ended) {
                    report(job, ended, took, &job_span(job), counters);
                }
            }
            Err(reason) => {
                tracing::info!(
                    jobs = jobs.len(),
                    reason,
                    "the batch rolled back; running its jobs one per transaction"
                );
                for job in &jobs {
                    self.process_one(job, counters).await;
                }
            }
        }
    }

    /// One transaction for all of `jobs`; how each ended when it committed, or why not.
    async fn execute_batch(&self, jobs: &[LeasedJob]) -> Result<Vec<Ended>, String> {
        let decoded = jobs
            .iter()
            .map(|job| self.decode(job))
            .collect::<Result<Vec<_>, String>>()?;
        // Leases not claimed yet: they need heartbeats while the batch waits for its turn and
        // for the effects before theirs. A claimed job's row is locked by the batch.
        let pending = Mutex::new(jobs.iter().map(|job| job.lease).collect::<Vec<_>>());
        let waiting = async {
            let turn = self.queue.write_turn().await;
            (turn, self.checkout().await)
        };
        let (_turn, conn) = self.with_heartbeats(&pending, waiting).await;
        let mut conn = conn.map_err(|error| format!("no connection for the batch: {error}"))?;
        let result = self.commit_batch(&mut conn, jobs, &decoded, &pending).await;
        // A connection whose commit failed may be broken; the pool's check decides.
        match &result {
            Ok(_) => self.check_in(Some(conn)),
            Err(_) => drop(conn),
        }
        result
    }

    /// Opens the batch's transaction on `conn`, runs the batch and commits it, or rolls it back.
    async fn commit_batch(
        &self,
        conn: &mut DB::Connection,
        jobs: &[LeasedJob],
        decoded: &[(Box<dyn Runnable<DB>>, JobKey)],
        pending: &Mutex<Vec<Lease>>,
    ) -> Result<Vec<Ended>, String> {
        let mut guarded = self
            .guard
            .begin_on(conn)
            .await
            .map_err(|error| error.to_string())?;
        let ran = self
            .with_heartbeats(
                pending,
                self.run_batch(&mut guarded.tx, jobs, decoded, pending),
            )
            .await;
        match ran {
            Ok(ended) => guarded
                .tx
                .commit()
                .await
                .map(|()| ended)
                .map_err(|error| format!("the batch's commit failed: {error}")),
            Err(reason) => {
                // Now, not when the kept connection is next used: the per-job runs that follow
                // need the rows the batch locked.
                let _ = guarded.tx.rollback().await;
                Err(reason)
            }
        }
    }

    /// Claims and completes each job in turn, running its effect when its key was fresh.
    async fn run_batch(
        &self,
        tx: &mut Transaction<'_, DB>,
        jobs: &[LeasedJob],
        decoded: &[(Box<dyn Runnable<DB>>, JobKey)],
        pending: &Mutex<Vec<Lease>>,
    ) -> Result<Vec<Ended>, String> {
        let mut ended = Vec::with_capacity(jobs.len());
        for (job, (runnable, key)) in jobs.iter().zip(decoded) {
            let claim = self
                .claim_completing(tx, key, &job.payload, job.lease)
                .await
                .map_err(|error| error.to_string())?;
            pending
                .lock()
                .expect("not poisoned")
                .retain(|lease| *lease != job.lease);
            ended.push(match claim {
                // Its lease was taken over: the statement completed nothing and claimed
                // nothing, and the new holder runs the job.
                None => Ended::Fenced,
                Some(Claim::Duplicate(_)) => Ended::Duplicate,
                Some(Claim::Claimed) => match catch_panic(runnable.run(tx)).await {
                    Ok(Ok(())) => Ended::Applied,
                    Ok(Err(error)) => return Err(format!("job {}: {error}", job.lease.job_id)),
                    Err(panicked) => return Err(format!("job {}: {panicked}", job.lease.job_id)),
                },
            });
        }
        Ok(ended)
    }
}
