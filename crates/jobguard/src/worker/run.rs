//! Running one leased job: decode it, make an external job's call, then one transaction that
//! claims the key and completes the job, runs the effect and commits; or a retry or a dead
//! letter when it failed.

use std::time::Instant;

use sqlx::pool::PoolConnection;
use tracing::Instrument;

use super::runnable::Runnable;
use super::{Counters, Ended, SPARE_CONNECTIONS, Worker};
use crate::dispatch::catch_panic;
use crate::error::{Error, Result};
use crate::guard::{Claim, check_claim, fingerprint_of};
use crate::key::JobKey;
use crate::metrics::{DuplicateSource, record_duplicate_source, record_job_duration};
use crate::queue::{Lease, LeasedJob};
use crate::retry::contention_backoff;
use crate::spikes::record_outcome;
use crate::store::{Backend, ClaimToken, NewClaim, is_connection_error};

/// Why an attempt did not commit.
pub(super) enum Failure {
    /// Rolled back by contention; run the attempt again now.
    Transient(sqlx::Error),
    /// The connection broke; run the attempt again now on another one.
    Reconnect(sqlx::Error),
    /// The lease was taken over.
    Fenced,
    /// The job failed; retry later or dead-letter.
    Failed { message: String, fatal: bool },
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        match error {
            Error::Fenced { .. } => Failure::Fenced,
            error => Failure::Failed {
                fatal: !error.is_retryable(),
                message: error.to_string(),
            },
        }
    }
}

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
            Ok((runnable, key)) => self.call_external(key, &**runnable).await,
            Err(_) => Ok(()),
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
    async fn call_external(
        &self,
        key: &JobKey,
        runnable: &dyn Runnable<DB>,
    ) -> std::result::Result<(), (String, bool)> {
        let Some(call) = runnable.call(key) else {
            return Ok(());
        };
        match self.guard.lookup(key).await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => {}
            Err(error) => return Err((error.to_string(), false)),
        }
        match catch_panic(call).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => {
                let fatal = !error.is_retryable();
                Err((error.to_string(), fatal))
            }
            Err(panicked) => Err((panicked, false)),
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
        let mut retries = 0;
        loop {
            let attempt = self.attempt(&mut conn, job, &key, &*runnable).await;
            if attempt.is_err() {
                // Rolled back: the job's row is no longer held by this transaction.
                self.leases.unlocked(job.lease);
            }
            let error = match attempt {
                Ok(ended) => return (ended, Some(conn)),
                Err(Failure::Fenced) => return (Ended::Fenced, Some(conn)),
                Err(Failure::Failed { message, fatal }) => {
                    return (self.fail(&mut conn, job, &message, fatal).await, Some(conn));
                }
                Err(Failure::Transient(error)) => error,
                Err(Failure::Reconnect(error)) => {
                    drop(conn);
                    conn = match self.queue.pool().acquire().await {
                        Ok(fresh) => fresh,
                        Err(_) => return (Ended::Failed, None),
                    };
                    error
                }
            };
            // The guard's limit on runs rolled back by contention, this one included.
            if retries + 1 >= self.guard.contention_attempts() {
                return (
                    self.fail(&mut conn, job, &error.to_string(), false).await,
                    Some(conn),
                );
            }
            retries += 1;
            tracing::debug!(%error, retries, "rolled back by contention or a lost connection; running again");
            tokio::time::sleep(contention_backoff(retries + 1)).await;
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

    /// One transaction: claim the key, run the effect, complete the job, commit.
    async fn attempt(
        &self,
        conn: &mut PoolConnection<DB>,
        job: &LeasedJob,
        key: &JobKey,
        runnable: &dyn Runnable<DB>,
    ) -> Result<Ended, Failure> {
        // Until the claim locks the job, the lease keeper extends its lease: the wait for
        // SQLite's write lock, or for a concurrent delivery of the key to commit, can be long.
        let claiming = async {
            let mut guarded = self.guard.begin_on(conn).await?;
            let claim = self
                .claim_completing(&mut guarded.tx, key, &job.payload, job.lease)
                .await?;
            Ok::<_, Error>((guarded, claim))
        };
        let (mut guarded, claim) = claiming
            .await
            .map_err(|e| transient_or::<DB>(e, Failure::from))?;
        let tx = &mut guarded.tx;
        // The job's completion is written before its effect runs, in the same transaction: both
        // commit together, and a worker whose lease was taken over stops here. From here no
        // other worker can fetch or rescue the job, so its lease needs no more heartbeats.
        let Some(claim) = claim else {
            // Roll back now rather than when the kept connection is next used: until then the
            // transaction would hold what it locked.
            let _ = guarded.tx.rollback().await;
            return Err(Failure::Fenced);
        };
        self.leases.locked(job.lease);
        let ended = match claim {
            Claim::Duplicate(_) => Ended::Duplicate,
            Claim::Claimed => match catch_panic(runnable.run(tx)).await {
                Ok(Ok(())) => Ended::Applied,
                Ok(Err(error)) => {
                    let (source, fatal) = error.into_parts();
                    return Err(match source.downcast::<sqlx::Error>() {
                        Ok(db) if DB::is_transient(&db) => Failure::Transient(*db),
                        Ok(db) if is_connection_error(&db) => Failure::Reconnect(*db),
                        Ok(db) => Failure::Failed {
                            message: db.to_string(),
                            fatal,
                        },
                        Err(source) => Failure::Failed {
                            message: source.to_string(),
                            fatal,
                        },
                    });
                }
                Err(panicked) => {
                    return Err(Failure::Failed {
                        message: panicked,
                        fatal: false,
                    });
                }
            },
        };
        guarded
            .tx
            .commit()
            .await
            .map_err(|e| transient_or::<DB>(Error::Database(e), Failure::from))?;
        Ok(ended)
    }

    /// Retries a failed attempt later, or dead-letters it when it was fatal or the last one.
    async fn fail(
        &self,
        conn: &mut DB::Connection,
        job: &LeasedJob,
        message: &str,
        fatal: bool,
    ) -> Ended {
        let last = job
            .max_attempts
            .min(self.config.retry.max_attempts.max(1) as i32);
        if fatal || job.lease.attempt >= last {
            return self.bury(conn, job, message).await;
        }
        tracing::warn!(error = message, "job failed; it will run again");
        let delay = self
            .config
            .retry
            .next_delay(job.lease.attempt.max(1) as u32);
        match self.queue.retry_on(conn, job.lease, delay, message).await {
            Ok(()) => Ended::Failed,
            Err(Error::Fenced { .. }) => Ended::Fenced,
            Err(error) => {
                tracing::warn!(%error, "scheduling a retry failed; the job runs again when its lease expires");
                Ended::Failed
            }
        }
    }

    async fn bury(&self, conn: &mut DB::Connection, job: &LeasedJob, message: &str) -> Ended {
        tracing::warn!(error = message, "job dead-lettered");
        match self.queue.dead_letter_on(conn, job.lease, message).await {
            Ok(()) => Ended::Dead,
            Err(Error::Fenced { .. }) => Ended::Fenced,
            Err(error) => {
                tracing::warn!(%error, "dead-lettering failed; the job runs again when its lease expires");
                Ended::Failed
            }
        }
    }

    /// Claims `key` and completes the job of `lease` in one step inside the worker's
    /// transaction; `None` when the lease is no longer held (nothing was claimed then).
    ///
    /// Completing before the effect runs is safe because both commit or roll back together,
    /// and it means a worker whose lease was taken over never runs the effect at all.
    pub(super) async fn claim_completing(
        &self,
        conn: &mut DB::Connection,
        key: &JobKey,
        payload: &serde_json::Value,
        lease: Lease,
    ) -> Result<Option<Claim>> {
        let fingerprint = fingerprint_of(key, payload)?;
        let token = ClaimToken::new();
        let new = NewClaim {
            key: key.as_str(),
            kind: key.kind(),
            fingerprint: Some(&fingerprint),
            token: &token,
        };
        let (row, completed) = DB::claim_completing(
            conn,
            (self.guard.sql(), self.queue.sql(), &self.sql),
            &new,
            lease,
        )
        .await?;
        if !completed {
            return Ok(None);
        }
        check_claim(key, Some(&fingerprint), row).map(Some)
    }
}

/// The span a job's logs are written in.
pub(super) fn job_span(job: &LeasedJob) -> tracing::Span {
    tracing::info_span!(
        "job",
        job.id = job.lease.job_id,
        job.kind = %job.kind,
        job.key = %job.key,
        attempt = job.lease.attempt,
    )
}

/// Records how a job ended: its log line, duplicate source, outcome and duration metrics, and
/// the worker's stats. The same for a job run alone and one run in a batch.
pub(super) fn report(
    job: &LeasedJob,
    ended: Ended,
    took: std::time::Duration,
    span: &tracing::Span,
    counters: &Counters,
) {
    span.in_scope(|| {
        tracing::debug!(
            outcome = ended.label(),
            seconds = took.as_secs_f64(),
            "job ended"
        );
    });
    if ended == Ended::Duplicate {
        let source = DuplicateSource::infer(job.lease.attempt, job.lease.token);
        record_duplicate_source(&job.kind, source);
        // In the job's span, so the log names the key that was a duplicate.
        span.in_scope(|| {
            tracing::info!(
                %source,
                "duplicate: the key was already applied; completed without the effect"
            );
        });
    }
    record_outcome(&job.kind, ended.label());
    record_job_duration(&job.kind, ended.label(), took);
    counters.count(ended);
}

pub(super) fn transient_or<DB: Backend>(
    error: Error,
    otherwise: impl FnOnce(Error) -> Failure,
) -> Failure {
    match error {
        Error::Database(db) if DB::is_transient(&db) => Failure::Transient(db),
        Error::Database(db) if is_connection_error(&db) => Failure::Reconnect(db),
        error => otherwise(error),
    }
}
