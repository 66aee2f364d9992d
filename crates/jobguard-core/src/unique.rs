//! Unique-job policies' rules: which states keep a key taken, the period and queue a policy
//! appends to a key, and what a repeated enqueue of a key does. The Rust queue and the Python
//! package both take these from here, with the statements in [`sql`](crate::sql)
//! (`enqueue_unique`, [`holder`](crate::sql::holder), [`replace`](crate::sql::replace)), so a
//! policy means the same from either language.
//!
//! ```
//! use jobguard_core::key::JobKey;
//! use jobguard_core::unique::{OnConflict, UniqueOpts, UniqueStates};
//!
//! let daily_fee = UniqueOpts::new()
//!     .states("available,running,completed".parse::<UniqueStates>()?)
//!     .period_secs(86_400)?
//!     .on_conflict(OnConflict::Reject);
//! let key = JobKey::new("fee", ["account-7"])?;
//! // 2026-10-02T10:15:07Z
//! let stored = daily_fee.stored_key(&key, "billing", 1_790_936_107)?;
//! assert_eq!(stored.as_str(), "fee:account-7:2026-10-02");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;

use crate::date::civil_from_days;
use crate::key::{JobKey, KeyError};
use crate::sql::{KEEP_COMPLETED, KEEP_DEAD, live_state_names};

/// A unique-job setting that is not valid: an unknown state, a list of states without both
/// live ones, a zero or fractional period, an unknown on-conflict action.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid unique {setting} `{given}`: {reason}")]
pub struct UniqueError {
    /// What was invalid: `states`, `period` or `on-conflict action`.
    pub setting: &'static str,
    /// What was given.
    pub given: String,
    /// Why, and what to give instead.
    pub reason: String,
}

/// The states in which a job keeps its key taken: the live ones always, plus completed and/or
/// dead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UniqueStates {
    completed: bool,
    dead: bool,
}

impl UniqueStates {
    /// Only the live states: an enqueue without a policy, and the default.
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
    pub fn mask(&self) -> i32 {
        (if self.completed { KEEP_COMPLETED } else { 0 }) | (if self.dead { KEEP_DEAD } else { 0 })
    }

    /// The states a stored mask names.
    pub fn from_mask(mask: i32) -> Self {
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
    type Err = UniqueError;

    /// A comma-separated list of job states (`available,running,completed`) that includes
    /// every live state.
    fn from_str(list: &str) -> Result<Self, UniqueError> {
        let invalid = |reason: String| UniqueError {
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
    /// kind under the key is a reused key.
    #[default]
    Return,
    /// Refuse the enqueue, naming the job that holds the key ([`rejected`]).
    Reject,
    /// Replace the payload and run time of the job that holds the key while it still waits
    /// (`replaced: true`). A job a worker holds, or a finished one, is returned as it is
    /// (`replaced: false`, with its state): it runs, or ran, with the payload it had. Another
    /// kind under the key is a reused key.
    Replace,
    /// [`Replace`](OnConflict::Replace) while the holder waits; a holder that no longer waits
    /// (a worker holds it, or it finished) refuses the enqueue ([`replace_rejected`]) instead
    /// of returning it: for a producer whose latest payload must win, and which must know when
    /// it did not.
    ReplaceOrReject,
}

/// What an enqueue does about the job found holding its key, by its [`OnConflict`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conflict {
    /// Return the holder: the enqueue found its job.
    Return,
    /// The key is reused by other work (another kind, or another payload under `return`).
    KeyReused,
    /// Refuse the enqueue ([`rejected`]).
    Reject,
    /// Replace the holder's payload and run time if it still waits; when it does not, return
    /// it as it is, or refuse ([`replace_rejected`]) when `or_reject`.
    Replace {
        /// Whether a holder that no longer waits refuses the enqueue.
        or_reject: bool,
    },
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

    /// What the enqueue does about the holder of its key: `same_kind` and `same_payload` say
    /// whether the holder carries the enqueued job's kind and payload.
    pub fn settle(self, same_kind: bool, same_payload: bool) -> Conflict {
        match self {
            OnConflict::Return if same_kind && same_payload => Conflict::Return,
            OnConflict::Return => Conflict::KeyReused,
            OnConflict::Reject => Conflict::Reject,
            OnConflict::Replace | OnConflict::ReplaceOrReject if !same_kind => Conflict::KeyReused,
            OnConflict::Replace => Conflict::Replace { or_reject: false },
            OnConflict::ReplaceOrReject => Conflict::Replace { or_reject: true },
        }
    }
}

impl fmt::Display for OnConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnConflict {
    type Err = UniqueError;

    fn from_str(name: &str) -> Result<Self, UniqueError> {
        match name {
            "return" => Ok(OnConflict::Return),
            "reject" => Ok(OnConflict::Reject),
            "replace" => Ok(OnConflict::Replace),
            "replace-or-reject" => Ok(OnConflict::ReplaceOrReject),
            other => Err(UniqueError {
                setting: "on-conflict action",
                given: other.to_owned(),
                reason: "use return, reject, replace or replace-or-reject".to_owned(),
            }),
        }
    }
}

/// Why an enqueue under [`OnConflict::Reject`] was refused.
pub fn rejected(key: &str, existing_id: i64, state: &str) -> String {
    format!(
        "job key `{key}` is taken by job {existing_id} ({state}): nothing was enqueued, as the \
         unique policy rejects a repeated enqueue; look at job {existing_id}, or enqueue with \
         another on-conflict action"
    )
}

/// Why an enqueue under [`OnConflict::ReplaceOrReject`] was refused: the holder no longer
/// waits.
pub fn replace_rejected(key: &str, existing_id: i64, state: &str) -> String {
    format!(
        "job key `{key}` is held by job {existing_id}, which no longer waits ({state}): it keeps \
         its payload, and this payload was neither enqueued nor replaced; enqueue it again once \
         job {existing_id} has left the key, or with on-conflict replace to accept the payload \
         kept"
    )
}

/// A unique-job policy: which states keep the key, the period in the key, the queue in the
/// key, and what a conflicting enqueue does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UniqueOpts {
    states: UniqueStates,
    period: Option<u64>,
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

    /// Appends the period of `seconds` the job's run time falls in to its key: periods are
    /// counted from the Unix epoch in UTC (a day starts at 00:00 UTC), by the producer's clock.
    /// Zero is a [`UniqueError`].
    pub fn period_secs(mut self, seconds: u64) -> Result<Self, UniqueError> {
        if seconds == 0 {
            return Err(period_error(format!("{seconds}s")));
        }
        self.period = Some(seconds);
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

    /// The period appended to the key, in seconds, if any.
    pub fn period_seconds(&self) -> Option<u64> {
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
    /// the period `run_at` (seconds since the epoch) falls in. Unchanged without either.
    pub fn stored_key(&self, key: &JobKey, queue: &str, run_at: i64) -> Result<JobKey, KeyError> {
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
        JobKey::new(key.kind(), parts)
    }

    /// The policy once its key is built: no period or queue left to append.
    pub fn keyed(mut self) -> Self {
        self.period = None;
        self.by_queue = false;
        self
    }
}

/// The error of a period that is not a whole number of seconds of at least one: `given` as
/// the caller wrote it.
pub fn period_error(given: String) -> UniqueError {
    UniqueError {
        setting: "period",
        given,
        reason: "a period is a whole number of seconds, at least 1s, e.g. 1h or 1d".to_owned(),
    }
}

/// The start of the period of `length` seconds that `at` (seconds since the epoch) falls in,
/// in UTC, as precise as the period needs: `2026-10-02` for whole days, `2026-10-02T10` for
/// hours, `2026-10-02T10:15` for minutes, else to the second.
pub fn period_start(at: i64, length: u64) -> String {
    let length = length.max(1) as i64;
    let start = at - at.rem_euclid(length);
    let (days, rest) = (start.div_euclid(86_400), start.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (rest / 3600, rest % 3600 / 60, rest % 60);
    if length % 86_400 == 0 {
        format!("{year:04}-{month:02}-{day:02}")
    } else if length % 3600 == 0 {
        format!("{year:04}-{month:02}-{day:02}T{hour:02}")
    } else if length % 60 == 0 {
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
            assert_eq!(error.setting, "states", "{bad}: {error}");
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
        assert!(UniqueOpts::new().period_secs(0).is_err());
        // 2026-10-02T10:15:07Z
        let at = 1_790_936_107;
        assert_eq!(period_start(at, 86_400), "2026-10-02");
        assert_eq!(period_start(at, 3600), "2026-10-02T10");
        assert_eq!(period_start(at, 900), "2026-10-02T10:15");
        assert_eq!(period_start(at, 7), "2026-10-02T10:15:05");
    }

    #[test]
    fn the_stored_key_appends_queue_then_period() {
        let key = JobKey::new("fee", ["account-7"]).unwrap();
        let at = 1_790_936_107;
        let plain = UniqueOpts::new();
        assert_eq!(plain.stored_key(&key, "billing", at).unwrap(), key);
        let daily = UniqueOpts::new().by_queue().period_secs(86_400).unwrap();
        assert_eq!(
            daily.stored_key(&key, "billing", at).unwrap().as_str(),
            "fee:account-7:billing:2026-10-02"
        );
        assert_eq!(daily.keyed(), UniqueOpts::new());
    }

    #[test]
    fn conflicts_settle_by_the_action() {
        assert_eq!(OnConflict::Return.settle(true, true), Conflict::Return);
        assert_eq!(OnConflict::Return.settle(true, false), Conflict::KeyReused);
        assert_eq!(OnConflict::Reject.settle(false, false), Conflict::Reject);
        assert_eq!(OnConflict::Replace.settle(false, true), Conflict::KeyReused);
        assert_eq!(
            OnConflict::Replace.settle(true, false),
            Conflict::Replace { or_reject: false }
        );
        assert_eq!(
            OnConflict::ReplaceOrReject.settle(true, true),
            Conflict::Replace { or_reject: true }
        );
        for action in ["return", "reject", "replace", "replace-or-reject"] {
            assert_eq!(action.parse::<OnConflict>().unwrap().as_str(), action);
        }
        assert_eq!(
            "keep".parse::<OnConflict>().unwrap_err().setting,
            "on-conflict action"
        );
    }
}
