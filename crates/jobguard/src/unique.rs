//! Unique-job policies: what a repeated enqueue of a key does.
//!
//! A job key already names one piece of work; a [`UniqueOpts`] chooses, at enqueue time, how
//! long the key stays taken and what a second enqueue of it gets:
//!
//! - **states**: the live states (waiting or running) always keep the key; a policy can keep it
//!   while the job is completed and/or dead too, until retention prunes the row. Temporal's
//!   reuse policies map to: live only (allow duplicate), live and completed (allow duplicate
//!   failed only), live, completed and dead (reject duplicate).
//! - **period**: the start of the period the job's run time falls in, appended to the key
//!   (`fee:account-7:2026-10-02` for a daily fee): the guide's rule that a legitimately
//!   repeating job puts its period in its key, done for the producer. The key changes, so the
//!   guard applies each period's job once.
//! - **by queue**: the queue appended to the key, so the same work on two queues is two jobs
//!   (and two effects).
//! - **on conflict**: return the job that holds the key (the default), reject the enqueue with
//!   [`Error::EnqueueRejected`], or replace the payload and run time of that job while it still
//!   waits: keeping a job that no longer waits as it is ([`OnConflict::Replace`]) or refusing
//!   with [`Error::ReplaceRejected`] ([`OnConflict::ReplaceOrReject`]).
//!
//! The database enforces it: the states are stored with each job (`unique_states`) and a
//! partial unique index keeps one job per key among those whose state their own policy
//! names. An enqueue never checks and then inserts. A policy is the job's own: the jobs of one
//! key should share one, which [`Job::unique_opts`](crate::Job::unique_opts) makes natural.
//!
//! The rules (the states, the period in the key, the conflict actions) are
//! [`jobguard_core::unique`]'s, which the Python package calls too: a policy means the same
//! from either language.
//!
//! ```
//! use std::time::Duration;
//! use jobguard::unique::{OnConflict, UniqueOpts, UniqueStates};
//!
//! let daily_fee = UniqueOpts::new()
//!     .states("available,running,completed".parse::<UniqueStates>()?)
//!     .period(Duration::from_secs(86_400))?
//!     .on_conflict(OnConflict::Reject);
//! assert!(daily_fee.states_kept().completed());
//! # Ok::<(), jobguard::Error>(())
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jobguard_core::unique as core;

use crate::error::{Error, Result};
use crate::key::JobKey;

pub use jobguard_core::unique::{Conflict, OnConflict, UniqueError, UniqueStates, period_start};

impl From<UniqueError> for Error {
    fn from(
        UniqueError {
            setting,
            given,
            reason,
        }: UniqueError,
    ) -> Self {
        Error::InvalidUnique {
            setting,
            given,
            reason,
        }
    }
}

/// A unique-job policy: which states keep the key, the period in the key, the queue in the
/// key, and what a conflicting enqueue does. See the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UniqueOpts(core::UniqueOpts);

impl UniqueOpts {
    /// Live states only, no period, not by queue, return the existing job: what an enqueue
    /// without a policy does.
    pub fn new() -> Self {
        UniqueOpts::default()
    }

    /// The states that keep the key taken.
    pub fn states(self, states: UniqueStates) -> Self {
        UniqueOpts(self.0.states(states))
    }

    /// Appends the period the job's run time falls in to its key: periods are whole seconds,
    /// counted from the Unix epoch in UTC (a day starts at 00:00 UTC), by the producer's clock.
    /// A zero or fractional period is [`Error::InvalidUnique`].
    pub fn period(self, period: Duration) -> Result<Self> {
        if period.subsec_nanos() != 0 {
            return Err(core::period_error(format!("{period:?}")).into());
        }
        self.0
            .period_secs(period.as_secs())
            .map(UniqueOpts)
            .map_err(|_| core::period_error(format!("{period:?}")).into())
    }

    /// Appends the job's queue to its key: the same work on two queues is two jobs.
    pub fn by_queue(self) -> Self {
        UniqueOpts(self.0.by_queue())
    }

    /// What a conflicting enqueue does.
    pub fn on_conflict(self, action: OnConflict) -> Self {
        UniqueOpts(self.0.on_conflict(action))
    }

    /// The states that keep the key taken.
    pub fn states_kept(&self) -> UniqueStates {
        self.0.states_kept()
    }

    /// The period appended to the key, if any.
    pub fn period_len(&self) -> Option<Duration> {
        self.0.period_seconds().map(Duration::from_secs)
    }

    /// Whether the queue is appended to the key.
    pub fn is_by_queue(&self) -> bool {
        self.0.is_by_queue()
    }

    /// What a conflicting enqueue does.
    pub fn conflict_action(&self) -> OnConflict {
        self.0.conflict_action()
    }

    /// The key a job is stored under: `key`, then `queue` when by queue, then the start of
    /// the period `run_at` falls in. Unchanged without either.
    pub(crate) fn stored_key(
        &self,
        key: &JobKey,
        queue: &str,
        run_at: SystemTime,
    ) -> Result<JobKey> {
        let seconds = run_at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        Ok(self.0.stored_key(key, queue, seconds as i64)?)
    }

    /// The policy once its key is built: no period or queue left to append.
    pub(crate) fn keyed(self) -> Self {
        UniqueOpts(self.0.keyed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_whole_seconds() {
        assert!(UniqueOpts::new().period(Duration::ZERO).is_err());
        assert!(
            UniqueOpts::new()
                .period(Duration::from_millis(1500))
                .is_err()
        );
        let daily = UniqueOpts::new()
            .period(Duration::from_secs(86_400))
            .unwrap();
        assert_eq!(daily.period_len(), Some(Duration::from_secs(86_400)));
    }

    #[test]
    fn the_stored_key_appends_queue_then_period() {
        let key = JobKey::new("fee", ["account-7"]).unwrap();
        let at = UNIX_EPOCH + Duration::from_secs(1_790_936_107);
        let daily = UniqueOpts::new()
            .by_queue()
            .period(Duration::from_secs(86_400))
            .unwrap();
        assert_eq!(
            daily.stored_key(&key, "billing", at).unwrap().as_str(),
            "fee:account-7:billing:2026-10-02"
        );
        assert_eq!(daily.keyed(), UniqueOpts::new());
    }
}
