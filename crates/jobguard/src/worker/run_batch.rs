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

use super::runnable::Runnable;
use super::settle::{job_span, report};
use super::{Counters, Ended, Worker};
use crate::dispatch::catch_panic;
use crate::guard::{Claim, Completing, Failure, UnitOfWork, fingerprint_of};
use crate::key::JobKey;
use crate::metrics::count_batch;
use crate::queue::LeasedJob;
use crate::store::Backend;

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

    /// A unit of work's failure, which is contention when running it again may succeed.
    fn of(what: &str, failure: &Failure) -> Self {
        Rollback {
            reason: format!("{what}: {failure}"),
            contention: failure.is_contention(),
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
                // Its jobs' rows are no longer held: each keeps its lease until its own turn,
                // extended at once, since no heartbeat could extend it while the batch held the
                // row (this worker's own rescue leaves the jobs it holds alone meanwhile).
                let leases: Vec<_> = jobs.iter().map(|job| job.lease).collect();
                for lease in &leases {
                    self.leases.unlocked(*lease);
                }
                if let Err(error) = self.queue.heartbeat_many(&leases, self.config.lease).await {
                    tracing::warn!(%error, "extending the leases of a rolled-back batch failed");
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

    /// One unit of work for the batch on `conn`: complete all the jobs and claim their keys
    /// (one statement on PostgreSQL), run the effect of each job that claimed its key, in fetch
    /// order, and commit; or roll it all back. A commit whose answer was lost is settled for the
    /// whole batch by the guard row of a key it claimed, since its rows commit together.
    async fn commit_batch(
        &self,
        conn: &mut DB::Connection,
        jobs: &[LeasedJob],
        decoded: &[(Box<dyn Runnable<DB>>, JobKey)],
    ) -> Result<Vec<Ended>, Rollback> {
        let fingerprints = jobs
            .iter()
            .zip(decoded)
            .map(|(job, (_, key))| fingerprint_of(key, &job.payload))
            .collect::<crate::Result<Vec<_>>>()
            .map_err(|error| Rollback::job(error.to_string()))?;
        let completing: Vec<Completing<'_>> = jobs
            .iter()
            .zip(decoded)
            .zip(&fingerprints)
            .map(|((job, (_, key)), fingerprint)| Completing {
                key,
                fingerprint: Some(fingerprint),
                lease: job.lease,
            })
            .collect();
        let mut unit = UnitOfWork::begin_on(&self.guard, conn)
            .await
            .map_err(|failure| Rollback::of("opening the batch's transaction", &failure))?;
        let claims = match unit
            .claim_completing_many(self.queue.sql(), &self.sql, &completing)
            .await
        {
            Ok(claims) => claims,
            Err(failure) => {
                unit.rollback().await;
                return Err(Rollback::of("claiming the batch's keys", &failure));
            }
        };
        // Every job's row is now locked by the batch, or taken over: no more heartbeats.
        for job in jobs {
            self.leases.locked(job.lease);
        }
        let mut ended = Vec::with_capacity(jobs.len());
        for ((job, (runnable, key)), claim) in jobs.iter().zip(decoded).zip(claims) {
            ended.push(match claim {
                // Its lease was taken over: the statement completed nothing and claimed nothing
                // for it, and the new holder runs the job.
                None => Ended::Fenced,
                Some(Claim::Duplicate(_)) => Ended::Duplicate,
                Some(Claim::Claimed) => match catch_panic(runnable.run(unit.conn())).await {
                    Ok(Ok(())) => Ended::Applied,
                    Ok(Err(error)) => {
                        // Now, not when the kept connection is next used: the per-job runs
                        // that follow need the rows the batch locked.
                        unit.rollback().await;
                        let failure = Failure::effect::<DB>(key, error);
                        let what = format!("job {}", job.lease.job_id);
                        return Err(Rollback::of(&what, &failure));
                    }
                    Err(panicked) => {
                        unit.rollback().await;
                        return Err(Rollback::job(format!(
                            "job {}: {panicked}",
                            job.lease.job_id
                        )));
                    }
                },
            });
        }
        match unit.commit().await {
            Ok(()) => Ok(ended),
            Err(failure) => Err(Rollback::of("the batch's commit failed", &failure)),
        }
    }
}
