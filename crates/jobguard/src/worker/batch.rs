//! Running a batch: up to [`WorkerConfig::batch_size`](super::WorkerConfig::batch_size) leased
//! jobs of kinds that opted in ([`Job::BATCH`](crate::Job::BATCH)), in one transaction.
//!
//! One statement (on PostgreSQL; two on SQLite, under the write lock the batch holds anyway)
//! completes every job under its lease token and claims the keys of the completed ones; a second reads the rows of keys it found held, only when there are some. The effects
//! then run on the same transaction, in fetch order, and one commit makes all of them true at
//! once or none. A fenced job completes nothing and claims nothing, so the batch goes on
//! without it. A key held before the batch, or claimed by an earlier job of the same batch, is
//! a duplicate: the key applies once.
//!
//! Anything else that stops the batch (an effect's error or panic, a serialization failure, a
//! deadlock, a lost connection or commit, a payload that does not decode) rolls the whole batch
//! back, and its jobs run again one per transaction on the per-job path: a failing job retries
//! alone and the others apply, and a commit whose outcome was lost is settled job by job as the
//! per-job path settles it (a job whose completion did commit is no longer held by its lease).
//! A commit whose answer was lost is settled for the whole batch by the guard row of a key it
//! claimed, as [`Guard`](crate::Guard) settles one job's.

use std::sync::atomic::Ordering;
use std::time::Instant;

use sqlx::Transaction;

use super::run::{job_span, report};
use super::runnable::Runnable;
use super::{Counters, Ended, Worker};
use crate::dispatch::catch_panic;
use crate::guard::{Claim, check_claim, fingerprint_of};
use crate::key::JobKey;
use crate::metrics::count_batch;
use crate::queue::{Lease, LeasedJob};
use crate::store::{Backend, ClaimToken, NewClaim};

/// Why a batch rolled back, and whether contention did it: a deadlock, a serialization
/// failure or a busy database, which smaller batches make rarer.
struct Rollback {
    reason: String,
    contention: bool,
}

impl Rollback {
    /// Not contention: a job failed, panicked or could not be decoded.
    fn job(reason: String) -> Self {
        Rollback {
            reason,
            contention: false,
        }
    }

    /// A database error, which is contention when retrying the transaction may succeed.
    fn database<DB: Backend>(what: &str, error: &sqlx::Error) -> Self {
        Rollback {
            reason: format!("{what}: {error}"),
            contention: DB::is_transient(error),
        }
    }
}

impl<DB: Backend> Worker<DB> {
    /// Runs `jobs` as one batch, or one per transaction when the batch rolled back.
    pub(super) async fn process_batch(&self, jobs: &[LeasedJob], counters: &Counters) {
        // A group formed before batches began to contend (fetched ahead, waiting for a slot)
        // runs in batches of the size contention left, one after another on this slot.
        // The chunks not started yet keep their leases meanwhile (see `leases.rs`).
        let limit = self.batch_limit.current();
        if jobs.len() > limit {
            for chunk in jobs.chunks(limit) {
                self.run_group(chunk, counters).await;
            }
        } else {
            self.run_group(jobs, counters).await;
        }
    }

    /// Runs one group: a single job on the per-job path, or a batch.
    async fn run_group(&self, jobs: &[LeasedJob], counters: &Counters) {
        if jobs.len() == 1 {
            self.process_one(&jobs[0], counters).await;
            if self.batched.contains(&jobs[0].kind) {
                self.batch_limit.grow();
            }
            return;
        }
        let started = Instant::now();
        match self.execute_batch(jobs).await {
            Ok(ended) => {
                self.batch_limit.grow();
                counters.batches.fetch_add(1, Ordering::Relaxed);
                count_batch(&self.config.queue, "committed");
                let took = started.elapsed();
                for (job, ended) in jobs.iter().zip(ended) {
                    report(job, ended, took, &job_span(job), counters);
                }
            }
            Err(Rollback { reason, contention }) => {
                // Its jobs' rows are no longer held: each keeps its lease until its own turn.
                for job in jobs {
                    self.leases.unlocked(job.lease);
                }
                if contention {
                    self.batch_limit.shrink();
                }
                counters.batches_rolled_back.fetch_add(1, Ordering::Relaxed);
                count_batch(&self.config.queue, "rolled_back");
                tracing::info!(
                    jobs = jobs.len(),
                    reason,
                    contention,
                    "the batch rolled back; running its jobs one per transaction"
                );
                for job in jobs {
                    self.process_one(job, counters).await;
                }
            }
        }
    }

    /// One transaction for all of `jobs`; how each ended when it committed, or why not.
    async fn execute_batch(&self, jobs: &[LeasedJob]) -> Result<Vec<Ended>, Rollback> {
        let decoded = jobs
            .iter()
            .map(|job| self.decode(job))
            .collect::<Result<Vec<_>, String>>()
            .map_err(Rollback::job)?;
        // The leases are kept while the batch waits for its turn and a connection (see
        // `leases.rs`) until its claim locks the jobs' rows.
        let _turn = self.queue.write_turn().await;
        let mut conn = self
            .checkout()
            .await
            .map_err(|error| Rollback::job(format!("no connection for the batch: {error}")))?;
        let result = self.commit_batch(&mut conn, jobs, &decoded).await;
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
    ) -> Result<Vec<Ended>, Rollback> {
        let mut guarded = self
            .guard
            .begin_on(conn)
            .await
            .map_err(|error| Rollback::job(error.to_string()))?;
        let ran = self.run_batch(&mut guarded.tx, jobs, decoded).await;
        match ran {
            Ok((ended, claimed)) => match guarded.tx.commit().await {
                Ok(()) => Ok(ended),
                Err(error) => self.settle_lost_commit(ended, &claimed, error).await,
            },
            Err(reason) => {
                // Now, not when the kept connection is next used: the per-job runs that follow
                // need the rows the batch locked.
                let _ = guarded.tx.rollback().await;
                Err(reason)
            }
        }
    }

    /// After the batch's commit failed: the guard row of a key the batch claimed is the witness
    /// of whether the commit happened, for the whole batch, since its rows commit together. When
    /// it did, the batch ended as it ran; when it did not, or the witness cannot tell (the batch
    /// claimed no key, the database is unreachable), its jobs run again one per transaction,
    /// where a job whose completion did commit is found no longer leased and is left alone.
    async fn settle_lost_commit(
        &self,
        ended: Vec<Ended>,
        claimed: &[(JobKey, ClaimToken)],
        error: sqlx::Error,
    ) -> Result<Vec<Ended>, Rollback> {
        let failed = Rollback::database::<DB>("the batch's commit failed", &error);
        // An embedded SQLite database answers its commit in process: a failed commit did not
        // happen, and its transaction may still hold the write lock the witness would wait for.
        let Some((key, token)) = claimed.first().filter(|_| !DB::SINGLE_WRITER) else {
            return Err(failed);
        };
        tracing::warn!(%error, "the batch's commit failed; checking the guard row of its first key");
        match self.guard.holder(key).await {
            Ok(Some(record)) if record.token.as_ref() == Some(token) => Ok(ended),
            _ => Err(failed),
        }
    }

    /// Completes all the jobs and claims their keys (one statement on PostgreSQL), then runs
    /// the effect of each job that claimed its key, in fetch order.
    async fn run_batch(
        &self,
        tx: &mut Transaction<'_, DB>,
        jobs: &[LeasedJob],
        decoded: &[(Box<dyn Runnable<DB>>, JobKey)],
    ) -> Result<(Vec<Ended>, Vec<(JobKey, ClaimToken)>), Rollback> {
        let fingerprints = jobs
            .iter()
            .zip(decoded)
            .map(|(job, (_, key))| fingerprint_of(key, &job.payload))
            .collect::<crate::Result<Vec<_>>>()
            .map_err(|error| Rollback::job(error.to_string()))?;
        let tokens: Vec<ClaimToken> = jobs.iter().map(|_| ClaimToken::new()).collect();
        let claims: Vec<(NewClaim<'_>, Lease)> = jobs
            .iter()
            .zip(decoded)
            .zip(fingerprints.iter().zip(&tokens))
            .map(|((job, (_, key)), (fingerprint, token))| {
                let claim = NewClaim {
                    key: key.as_str(),
                    kind: key.kind(),
                    fingerprint: Some(fingerprint),
                    token,
                };
                (claim, job.lease)
            })
            .collect();
        let rows = DB::claim_completing_many(
            &mut **tx,
            (self.guard.sql(), self.queue.sql(), &self.sql),
            &claims,
        )
        .await
        .map_err(|error| Rollback::database::<DB>("claiming the batch's keys", &error))?;
        // Every job's row is now locked by the batch, or taken over: no more heartbeats.
        for job in jobs {
            self.leases.locked(job.lease);
        }
        let mut ended = Vec::with_capacity(jobs.len());
        let mut claimed = Vec::new();
        for (((job, (runnable, key)), row), (fingerprint, token)) in jobs
            .iter()
            .zip(decoded)
            .zip(rows)
            .zip(fingerprints.iter().zip(&tokens))
        {
            // Its lease was taken over: the statement completed nothing and claimed nothing for
            // it, and the new holder runs the job.
            let Some(row) = row else {
                ended.push(Ended::Fenced);
                continue;
            };
            let claim = check_claim(key, Some(fingerprint), row)
                .map_err(|error| Rollback::job(format!("job {}: {error}", job.lease.job_id)))?;
            ended.push(match claim {
                Claim::Duplicate(_) => Ended::Duplicate,
                Claim::Claimed => match catch_panic(runnable.run(tx)).await {
                    Ok(Ok(())) => {
                        claimed.push((key.clone(), *token));
                        Ended::Applied
                    }
                    Ok(Err(error)) => {
                        // A deadlock or serialization failure the effect ran into.
                        let contention = error
                            .inner()
                            .downcast_ref::<sqlx::Error>()
                            .is_some_and(DB::is_transient);
                        return Err(Rollback {
                            reason: format!("job {}: {error}", job.lease.job_id),
                            contention,
                        });
                    }
                    Err(panicked) => {
                        return Err(Rollback::job(format!(
                            "job {}: {panicked}",
                            job.lease.job_id
                        )));
                    }
                },
            });
        }
        Ok((ended, claimed))
    }
}
