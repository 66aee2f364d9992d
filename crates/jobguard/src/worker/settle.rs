//! Settling a job: writing how its attempt ended (a retry later, a dead letter, its lease given
//! back) and recording it (its log line, duplicate source, outcome and duration metrics, the
//! worker's stats). The same for a job run alone and one run in a batch.

use std::sync::atomic::Ordering;

use super::{Counters, Ended, Worker};
use crate::error::Error;
use crate::metrics::{DuplicateSource, record_duplicate_source, record_job_duration};
use crate::queue::{Lease, LeasedJob};
use crate::spikes::record_outcome;
use crate::store::Backend;

impl<DB: Backend> Worker<DB> {
    /// Gives a job's lease back to the queue, so another worker runs it now.
    pub(super) async fn give_back(&self, lease: Lease, counters: &Counters, failed: &str) {
        match self.queue.release(lease).await {
            Ok(()) => {
                counters.released.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => tracing::warn!(%error, job.id = lease.job_id, "{failed}"),
        }
    }

    /// Retries a failed attempt later, or dead-letters it when it was fatal or the last one.
    pub(super) async fn fail(
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

    /// Gives back a job whose transaction could not commit for a transient reason (contention
    /// or a lost connection, the core's [`Transient`](jobguard_core::transient::Transient))
    /// however often it ran: it runs again after the retry policy's delay for its attempt,
    /// which is not counted, as the Python worker gives it back. A transient error never
    /// spends an attempt, so it never dead-letters a job.
    pub(super) async fn give_back_on(
        &self,
        conn: &mut DB::Connection,
        job: &LeasedJob,
        reason: &str,
    ) -> Ended {
        let delay = self
            .config
            .retry
            .next_delay(job.lease.attempt.max(1) as u32);
        tracing::warn!(
            error = reason,
            "the job's transaction did not commit for a transient reason; giving it back"
        );
        match self.queue.give_back_on(conn, job.lease, delay).await {
            Ok(()) => Ended::Released,
            Err(Error::Fenced { .. }) => Ended::Fenced,
            Err(error) => {
                tracing::warn!(%error, "giving the job back failed; it runs again when its lease expires");
                Ended::Failed
            }
        }
    }

    pub(super) async fn bury(
        &self,
        conn: &mut DB::Connection,
        job: &LeasedJob,
        message: &str,
    ) -> Ended {
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
        let source = DuplicateSource::infer(job.lease.attempt, job.replayed);
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
