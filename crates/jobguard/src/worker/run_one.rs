//! Running one leased job: decode it, make an external job's call, then one transaction that
//! claims the key and completes the job, runs the effect and commits; when it failed, it is
//! settled as a retry or a dead letter (see `settle.rs`).

use std::time::Instant;

use sqlx::pool::PoolConnection;
use tracing::Instrument;

use super::runnable::Runnable;
use super::settle::{job_span, report};
use super::{Counters, Ended, SPARE_CONNECTIONS, Worker};
use crate::dispatch::catch_panic;
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::guard::{Claim, Completing, Failure, Runs, UnitOfWork, fingerprint_of};
use crate::key::JobKey;
use crate::queue::LeasedJob;
use crate::store::Backend;

impl<DB: Backend> Worker<DB> {
    /// Runs one job on the per-job path and records how it ended.
    pub(super) async fn process_one(&self, job: &LeasedJob, counters: &Counters) {
        let span = job_span(job);
        let started = Instant::now();
        let ended = self.execute(job).instrument(span.clone()).await;
        report(job, ended, started.elapsed(), &span, counters);
    }

    async fn execute(&self, job: &LeasedJob) -> Ended {
        let decoded = self.decode(job);
        let called = match &decoded {
            Ok((runnable, key)) => self.call_external(job, key, &**runnable).await,
            Err(_) => Ok(()),
        };
        let called = match called {
            Err(CallFailed::Fenced) => return Ended::Fenced,
            Err(CallFailed::Failed(message, fatal)) => Err((message, fatal)),
            Ok(()) => Ok(()),
        };
        // On SQLite, this process's turn to write comes before a connection (see
        // `Queue::write_turn`), and is held until the job's outcome is written. Jobs wait for
        // it behind each other, their leases kept meanwhile (see `leases.rs`).
        let _turn = self.queue.write_turn().await;
        let conn = self.checkout().await;
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
    /// no connection, its lease kept meanwhile. Skipped when the key is already recorded; the attempt
    /// then completes the job as a duplicate.
    ///
    /// The call is made only once the lease is known to hold, by extending it: a worker whose
    /// lease was taken over makes no call. On PostgreSQL the extension commits durably, and
    /// with it the fetch before it (whose own commit did not wait for its WAL flush): a crash
    /// after the check cannot give the job's token back, so no other worker can hold the lease
    /// while this one calls.
    async fn call_external(
        &self,
        job: &LeasedJob,
        key: &JobKey,
        runnable: &dyn Runnable<DB>,
    ) -> std::result::Result<(), CallFailed> {
        let Some(call) = runnable.call(key) else {
            return Ok(());
        };
        match self.guard.lookup(key).await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => {}
            Err(error) => return Err(CallFailed::Failed(error.to_string(), false)),
        }
        match self.queue.extend(job.lease, self.config.lease).await {
            Ok(()) => {}
            Err(Error::Fenced { .. }) => {
                tracing::warn!("the lease was taken over before the external call; not calling");
                return Err(CallFailed::Fenced);
            }
            Err(error) => return Err(CallFailed::Failed(error.to_string(), false)),
        }
        match catch_panic(call).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => {
                let fatal = !error.is_retryable();
                Err(CallFailed::Failed(error.to_string(), fatal))
            }
            Err(panicked) => Err(CallFailed::Failed(panicked, false)),
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
        let fingerprint = match fingerprint_of(&key, &job.payload) {
            Ok(fingerprint) => fingerprint,
            Err(error) => {
                return (
                    self.bury(&mut conn, job, &error.to_string()).await,
                    Some(conn),
                );
            }
        };
        let mut runs = Runs::new(&self.guard);
        loop {
            let failure = match self
                .attempt(&mut conn, job, &key, &fingerprint, &*runnable)
                .await
            {
                Ok(ended) => return (ended, Some(conn)),
                Err(failure) => failure,
            };
            // Rolled back: the job's row is no longer held by this transaction.
            self.leases.unlocked(job.lease);
            match failure {
                Failure::Fenced => return (Ended::Fenced, Some(conn)),
                Failure::Failed(_) => {
                    let (message, fatal) = failure.message();
                    return (self.fail(&mut conn, job, &message, fatal).await, Some(conn));
                }
                Failure::Connection(_) => {
                    drop(conn);
                    conn = match self.queue.pool().acquire().await {
                        Ok(fresh) => fresh,
                        Err(_) => return (Ended::Failed, None),
                    };
                }
                Failure::Contention(_) | Failure::HeldElsewhere(_) => {}
            }
            // The guard's limit on runs rolled back by contention or a lost connection, this
            // one included; past it the job is given back, its attempt not counted.
            if !runs.again(&failure).await {
                let (message, _) = failure.message();
                return (
                    self.give_back_on(&mut conn, job, &message).await,
                    Some(conn),
                );
            }
        }
    }

    /// The job's handler, payload and key, or why it can never run.
    pub(super) fn decode(
        &self,
        job: &LeasedJob,
    ) -> Result<(Box<dyn Runnable<DB>>, JobKey), String> {
        let runnable = self.handlers.decode(&job.kind, &job.payload, "worker")?;
        let key = JobKey::parse(&job.key)
            .map_err(|error| format!("the stored job key is invalid: {error}"))?;
        Ok((runnable, key))
    }

    /// A connection kept from an earlier job, or a new one from the pool.
    pub(super) async fn checkout(&self) -> Result<PoolConnection<DB>> {
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
    pub(super) fn check_in(&self, conn: Option<PoolConnection<DB>>) {
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

    /// One unit of work: claim the key and complete the job, run the effect, commit.
    async fn attempt(
        &self,
        conn: &mut PoolConnection<DB>,
        job: &LeasedJob,
        key: &JobKey,
        fingerprint: &Fingerprint,
        runnable: &dyn Runnable<DB>,
    ) -> Result<Ended, Failure> {
        // Until the claim locks the job, the lease keeper extends its lease: the wait for
        // SQLite's write lock, or for a concurrent delivery of the key to commit, can be long.
        let mut unit = UnitOfWork::begin_on(&self.guard, conn).await?;
        let completing = Completing {
            key,
            fingerprint: Some(fingerprint),
            lease: job.lease,
        };
        // The job's completion is written before its effect runs, in the same transaction: both
        // commit together, and a worker whose lease was taken over stops here. From here no
        // other worker can fetch or rescue the job, so its lease needs no more heartbeats.
        let claim = match unit
            .claim_completing(self.queue.sql(), &self.sql, completing)
            .await
        {
            Ok(claim) => claim,
            Err(failure) => {
                unit.rollback().await;
                return Err(failure);
            }
        };
        self.leases.locked(job.lease);
        let ended = match claim {
            Claim::Duplicate(_) => Ended::Duplicate,
            Claim::Claimed => match catch_panic(runnable.run(unit.conn())).await {
                Ok(Ok(())) => Ended::Applied,
                Ok(Err(error)) => {
                    unit.rollback().await;
                    return Err(Failure::effect::<DB>(key, error));
                }
                Err(panicked) => {
                    unit.rollback().await;
                    return Err(Failure::Failed(Error::Effect {
                        key: key.to_string(),
                        fatal: false,
                        source: panicked.into(),
                    }));
                }
            },
        };
        unit.commit().await?;
        Ok(ended)
    }
}

/// Why an external job's call stage did not end with the call made.
enum CallFailed {
    /// The lease was taken over: the attempt stops, no call made.
    Fenced,
    /// The call (or the lookup before it) failed: the message, and whether it is fatal.
    Failed(String, bool),
}
