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

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jobguard_core::date::civil_from_days;
use jobguard_core::sql::{KEEP_COMPLETED, KEEP_DEAD, live_state_names};

use crate::error::{Error, Result};
use crate::key::JobKey;

/// The states in which a job keeps its key taken: the live ones always, plus completed and/or
/// dead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UniqueStates {
    completed: bool,
    dead: bool,
}

impl UniqueStates {
    /// Only the live states: today's behaviour, and the default.
    pub const LIVE: UniqueStates = UniqueStates {
        completed: false,
        dead: false,
    };

    /// The live states and `completed`: a key whose job succeeded is never enqueued again.
    pub fn with_completed(mut self) -> Self {
        self.completed = true;
        self
    }

    /// The live states and `dead`: a key whose job failed for good is never enqueued again.
    pub fn with_dead(mut self) -> Self {
        self.dead = true;
        self
    }

    /// Whether a completed job keeps the key.
    pub fn completed(&self) -> bool {
        self.completed
    }

    /// Whether a dead job keeps the key.
    pub fn dead(&self) -> bool {
        self.dead
    }

    /// The mask stored in the job's `unique_states` column: 0 for live only.
    pub(crate) fn mask(&self) -> i32 {
        (if self.completed { KEEP_COMPLETED } else { 0 }) | (if self.dead { KEEP_DEAD } else { 0 })
    }

    /// The states a stored mask names.
    pub(crate) fn from_mask(mask: i32) -> Self {
        UniqueStates {
            completed: mask & KEEP_COMPLETED != 0,
            dead: mask & KEEP_DEAD != 0,
        }
    }
}

impl fmt::Display for UniqueStates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = live_state_names();
        if self.completed {
            names.push("completed");
        }
        if self.dead {
            names.push("dead");
        }
        f.write_str(&names.join(","))
    }
}

impl FromStr for UniqueStates {
    type Err = Error;

    /// A comma-separated list of job states (`available,running,completed`) that includes
    /// every live state.
    fn from_str(list: &str) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidUnique {
            setting: "states",
            given: list.to_owned(),
            reason,
        };
        let live = live_state_names();
        let mut states = UniqueStates::LIVE;
        let mut named = Vec::new();
        for name in list
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
        {
            match name {
                "completed" => states.completed = true,
                "dead" => states.dead = true,
                // Running is a live state whether it is stored or derived from a lease.
                name if live.contains(&name) || name == "running" => {}
                other => {
                    return Err(invalid(format!(
                        "unknown job state `{other}`: the states are available, running, \
                         completed and dead"
                    )));
                }
            }
            named.push(name);
        }
        let mut required = live.clone();
        if !required.contains(&"running") {
            required.push("running");
        }
        let missing: Vec<&str> = required
            .into_iter()
            .filter(|state| !named.contains(state))
            .collect();
        if !missing.is_empty() {
            return Err(invalid(format!(
                "a job always keeps its key while it waits or runs, so the list must include \
                 available and running (missing: {}); add completed and/or dead to keep it \
                 longer",
                missing.join(", ")
            )));
        }
        Ok(states)
    }
}

/// What an enqueue does when a job already holds its key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnConflict {
    /// Return the job that holds the key (`inserted: false`): the default. Another payload or
    /// kind under the key is [`Error::KeyReused`].
    #[default]
    Return,
    /// Refuse the enqueue with [`Error::EnqueueRejected`], naming the job that holds the key.
    Reject,
    /// Replace the payload and run time of the job that holds the key while it still waits
    /// (`replaced: true`). A job a worker holds, or a finished one, is returned as it is
    /// (`replaced: false`, with its state): it runs, or ran, with the payload it had. Another
    /// kind under the key is [`Error::KeyReused`].
    Replace,
    /// [`Replace`](OnConflict::Replace) while the holder waits; a holder that no longer waits
    /// (a worker holds it, or it finished) refuses the enqueue with [`Error::ReplaceRejected`]
    /// instead of returning it: for a producer whose latest payload must win, and which must
    /// know when it did not.
    ReplaceOrReject,
}

impl OnConflict {
    /// The action's name, as the CLI takes it.
    pub fn as_str(&self) -> &'static str {
        match self {
            OnConflict::Return => "return",
            OnConflict::Reject => "reject",
            OnConflict::Replace => "replace",
            OnConflict::ReplaceOrReject => "replace-or-reject",
        }
    }
}

impl fmt::Display for OnConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnConflict {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "return" => Ok(OnConflict::Return),
            "reject" => Ok(OnConflict::Reject),
            "replace" => Ok(OnConflict::Replace),
            "replace-or-reject" => Ok(OnConflict::ReplaceOrReject),
            other => Err(Error::InvalidUnique {
                setting: "on-conflict action",
                given: other.to_owned(),
                reason: "use return, reject, replace or replace-or-reject".to_owned(),
            }),
        }
    }
}

/// A unique-job policy: which states keep the key, the period in the key, the queue in the
/// key, and what a conflicting enqueue does. See the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UniqueOpts {
    states: UniqueStates,
    period: Option<Duration>,
    by_queue: bool,
    on_conflict: OnConflict,
}

impl UniqueOpts {
    /// Live states only, no period, not by queue, return the existing job: what an enqueue
    /// without a policy does.
    pub fn new() -> Self {
        UniqueOpts::default()
    }

    /// The states that keep the key taken.
    pub fn states(mut self, states: UniqueStates) -> Self {
        self.states = states;
        self
    }

    /// Appends the period the job's run time falls in to its key: periods are whole seconds,
    /// counted from the Unix epoch in UTC (a day starts at 00:00 UTC), by the producer's clock.
    /// A zero or fractional period is [`Error::InvalidUnique`].
    pub fn period(mut self, period: Duration) -> Result<Self> {
        if period.is_zero() || period.subsec_nanos() != 0 {
            return Err(Error::InvalidUnique {
                setting: "period",
                given: format!("{period:?}"),
                reason: "a period is a whole number of seconds, at least 1s, e.g. 1h or 1d"
                    .to_owned(),
            });
        }
        self.period = Some(period);
        Ok(self)
    }

    /// Appends the job's queue to its key: the same work on two queues is two jobs.
    pub fn by_queue(mut self) -> Self {
        self.by_queue = true;
        self
    }

    /// What a conflicting enqueue does.
    pub fn on_conflict(mut self, action: OnConflict) -> Self {
        self.on_conflict = action;
        self
    }

    /// The states that keep the key taken.
    pub fn states_kept(&self) -> UniqueStates {
        self.states
    }

    /// The period appended to the key, if any.
    pub fn period_len(&self) -> Option<Duration> {
        self.period
    }

    /// Whether the queue is appended to the key.
    pub fn is_by_queue(&self) -> bool {
        self.by_queue
    }

    /// What a conflicting enqueue does.
    pub fn conflict_action(&self) -> OnConflict {
        self.on_conflict
    }

    /// The key a job is stored under: `key`, then `queue` when by queue, then the start of
    /// the period `run_at` falls in. Unchanged without either.
    pub(crate) fn stored_key(
        &self,
        key: &JobKey,
        queue: &str,
        run_at: SystemTime,
    ) -> Result<JobKey> {
        if !self.by_queue && self.period.is_none() {
            return Ok(key.clone());
        }
        let mut parts = key.parts();
        if self.by_queue {
            parts.push(queue.to_owned());
        }
        if let Some(period) = self.period {
            parts.push(period_start(run_at, period));
        }
        Ok(JobKey::new(key.kind(), parts)?)
    }

    /// The policy once its key is built: no period or queue left to append.
    pub(crate) fn keyed(mut self) -> Self {
        self.period = None;
        self.by_queue = false;
        self
    }
}

/// The start of the period of `length` that `at` falls in, in UTC, as precise as the period
/// needs: `2026-10-02` for whole days, `2026-10-02T10` for hours, `2026-10-02T10:15` for
/// minutes, else to the second.
pub(crate) fn period_start(at: SystemTime, length: Duration) -> String {
    let secs = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let length = length.as_secs().max(1);
    let start = secs - secs % length;
    let (days, rest) = (start / 86_400, start % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    let (hour, minute, second) = (rest / 3600, rest % 3600 / 60, rest % 60);
    if length.is_multiple_of(86_400) {
        format!("{year:04}-{month:02}-{day:02}")
    } else if length.is_multiple_of(3600) {
        format!("{year:04}-{month:02}-{day:02}T{hour:02}")
    } else if length.is_multiple_of(60) {
        format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_supersets_of_the_live_pair_only() {
        let all: UniqueStates = "available,running,completed,dead".parse().unwrap();
        assert!(all.completed() && all.dead());
        assert_eq!(all.mask(), KEEP_COMPLETED | KEEP_DEAD);
        assert_eq!(UniqueStates::from_mask(all.mask()), all);
        let live: UniqueStates = "running, available".parse().unwrap();
        assert_eq!(live, UniqueStates::LIVE);
        assert_eq!(live.mask(), 0);
        assert_eq!(all.to_string(), "available,running,completed,dead");
        for bad in [
            "available,completed",
            "completed",
            "",
            "available,running,done",
        ] {
            let error = bad.parse::<UniqueStates>().unwrap_err();
            assert!(
                matches!(
                    error,
                    Error::InvalidUnique {
                        setting: "states",
                        ..
                    }
                ),
                "{bad}: {error}"
            );
        }
        let error = "available,running,finished"
            .parse::<UniqueStates>()
            .unwrap_err();
        assert!(
            error.to_string().contains("unknown job state `finished`"),
            "{error}"
        );
        let error = "available,completed".parse::<UniqueStates>().unwrap_err();
        assert!(error.to_string().contains("missing: running"), "{error}");
    }

    #[test]
    fn periods_are_whole_seconds_and_round_down() {
        assert!(UniqueOpts::new().period(Duration::ZERO).is_err());
        assert!(
            UniqueOpts::new()
                .period(Duration::from_millis(1500))
                .is_err()
        );
        // 2026-10-02T10:15:07Z
        let at = UNIX_EPOCH + Duration::from_secs(1_790_936_107);
        assert_eq!(period_start(at, Duration::from_secs(86_400)), "2026-10-02");
        assert_eq!(period_start(at, Duration::from_secs(3600)), "2026-10-02T10");
        assert_eq!(
            period_start(at, Duration::from_secs(900)),
            "2026-10-02T10:15"
        );
        assert_eq!(
            period_start(at, Duration::from_secs(7)),
            "2026-10-02T10:15:05"
        );
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn the_stored_key_appends_queue_then_period() {
        let key = JobKey::new("fee", ["account-7"]).unwrap();
        let at = UNIX_EPOCH + Duration::from_secs(1_790_936_107);
        let plain = UniqueOpts::new();
        assert_eq!(plain.stored_key(&key, "billing", at).unwrap(), key);
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
