//! How many jobs the worker puts in a batch: [`WorkerConfig::batch_size`] at most, adapted to
//! contention.
//!
//! A batch holds every row lock its effects take until it commits, so batches whose jobs write
//! the same rows wait on each other and deadlock, and each deadlock costs the database's
//! deadlock timeout and a rerun of the batch one job at a time. The limit halves when a batch
//! rolls back on contention (a deadlock, a serialization failure, a busy SQLite database), and
//! stays there for [`COOLDOWN`]; after that it grows by one for each group of batchable jobs
//! that commits: additive increase, multiplicative decrease. Kinds whose batches never contend
//! stay at the configured size; kinds whose batches do settle at small batches, down to one job
//! per transaction, and probe upwards again every [`COOLDOWN`]. The cooldown is long because a
//! deadlock is expensive: PostgreSQL finds one only after `deadlock_timeout` (1 s by default),
//! the time a worker runs hundreds of jobs one by one.
//!
//! [`WorkerConfig::batch_size`]: super::WorkerConfig::batch_size

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long the batch size stays down after a batch rolled back on contention.
pub(super) const COOLDOWN: Duration = Duration::from_secs(10);

/// The adaptive batch size; see the module documentation.
#[derive(Debug)]
pub(super) struct BatchLimit {
    max: usize,
    current: AtomicUsize,
    /// When a batch last rolled back on contention.
    contended_at: Mutex<Option<Instant>>,
}

impl BatchLimit {
    /// Starts at `max` (at least 1).
    pub(super) fn new(max: usize) -> Self {
        let max = max.max(1);
        BatchLimit {
            max,
            current: AtomicUsize::new(max),
            contended_at: Mutex::new(None),
        }
    }

    /// Jobs per batch now, from 1 to the configured size.
    pub(super) fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// A group of batchable jobs committed: one more job per batch, up to the configured size,
    /// unless a batch rolled back on contention less than [`COOLDOWN`] ago.
    pub(super) fn grow(&self) {
        if self.current() == self.max {
            return;
        }
        let cooling = self
            .contended_at
            .lock()
            .expect("not poisoned")
            .is_some_and(|at| at.elapsed() < COOLDOWN);
        if cooling {
            return;
        }
        let _ = self
            .current
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            });
    }

    /// A batch rolled back on contention: half as many jobs per batch, at least one.
    pub(super) fn shrink(&self) {
        *self.contended_at.lock().expect("not poisoned") = Some(Instant::now());
        let _ = self
            .current
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n > 1).then_some(n / 2)
            });
        tracing::debug!(
            batch_size = self.current(),
            "a batch rolled back on contention; smaller batches"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::BatchLimit;

    #[test]
    fn halves_on_contention_and_grows_back_by_one() {
        let limit = BatchLimit::new(50);
        assert_eq!(limit.current(), 50);
        limit.grow();
        assert_eq!(limit.current(), 50, "never past the configured size");
        for expected in [25, 12, 6, 3, 1, 1] {
            limit.shrink();
            assert_eq!(limit.current(), expected);
        }
        limit.grow();
        assert_eq!(limit.current(), 1, "no growth while cooling down");
        *limit.contended_at.lock().unwrap() = Some(std::time::Instant::now() - super::COOLDOWN);
        limit.grow();
        limit.grow();
        assert_eq!(limit.current(), 3);
    }

    #[test]
    fn a_size_of_one_stays_one() {
        let limit = BatchLimit::new(0);
        limit.grow();
        limit.shrink();
        assert_eq!(limit.current(), 1);
    }
}
