//! Periodic jobs' rules: the key of a firing and which firings a scheduler enqueues.
//!
//! A schedule fires at the times its cron expression gives. Each firing is one job whose key
//! names the schedule and the firing's scheduled time in UTC, so every scheduler that runs the
//! schedule computes the same key for the same firing and the queue's unique policy keeps one
//! job per firing. Times here are whole seconds since the Unix epoch; evaluating the cron
//! expression (and its time zone) is the caller's part.
//!
//! ```
//! use jobguard_core::periodic::{Missed, firing_key, plan};
//!
//! // 2026-12-06T03:00:00Z
//! let at = 1_796_526_000;
//! let key = firing_key("nightly-report", at)?;
//! assert_eq!(key.as_str(), "periodic:nightly-report:2026-12-06T03:00:00Z");
//!
//! // Five firings due since the last one; the scheduler noticed the last 10 s late.
//! let due = [at, at + 60, at + 120, at + 180, at + 240];
//! let now = at + 250;
//! let on_time = plan(&due, now, 60, Missed::Skip);
//! assert_eq!(on_time.enqueue, [at + 240]);
//! assert_eq!(on_time.missed, [at, at + 60, at + 120, at + 180]);
//! assert_eq!(plan(&due, now, 60, Missed::Latest).enqueue, [at + 180, at + 240]);
//! assert_eq!(plan(&due, now, 60, Missed::All { limit: 2 }).enqueue, [at + 120, at + 180, at + 240]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::str::FromStr;

use crate::date::civil_from_days;
use crate::key::{JobKey, KeyError};
use crate::unique::UniqueStates;

/// The kind of every firing's key: `periodic:<schedule>:<time>`.
pub const KEY_KIND: &str = "periodic";

/// How many missed firings [`Missed::All`] enqueues unless told: a bound on the jobs one
/// scheduler's start can add.
pub const DEFAULT_ALL_LIMIT: u32 = 100;

/// The key of the firing of `schedule` scheduled at `at` (seconds since the epoch):
/// `periodic:<schedule>:<YYYY-MM-DDTHH:MM:SSZ>`. The schedule's name is escaped as any key
/// part; the time's colons separate parts, so the key reads as the time and stays canonical.
pub fn firing_key(schedule: &str, at: i64) -> Result<JobKey, KeyError> {
    let time = format_firing(at);
    // `2026-12-06T03:00:00Z` as the parts `2026-12-06T03`, `00`, `00Z`.
    let mut parts = vec![schedule];
    parts.extend(time.split(':'));
    JobKey::new(KEY_KIND, parts)
}

/// The states in which a firing's job keeps its key: while it waits, runs, and after it
/// completed or died, until retention prunes it. So every scheduler enqueues a firing once, and
/// a restarted one finds the firings it already enqueued taken.
pub fn firing_states() -> UniqueStates {
    UniqueStates::LIVE.with_completed().with_dead()
}

/// A firing's time in UTC as its key and the console show it: `2026-12-06T03:00:00Z`.
pub fn format_firing(at: i64) -> String {
    let (year, month, day) = civil_from_days(at.div_euclid(86_400));
    let second = at.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second / 3600,
        second / 60 % 60,
        second % 60
    )
}

/// What a scheduler does with the firings that came due while no scheduler ran (or while it
/// was stopped, or late past the grace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Missed {
    /// Enqueue none of them: the schedule goes on from its next firing.
    #[default]
    Skip,
    /// Enqueue the most recent of them, once: one catch-up however long the gap.
    Latest,
    /// Enqueue each of them, the most recent `limit` when more were missed.
    All {
        /// The most missed firings enqueued at once.
        limit: u32,
    },
}

impl fmt::Display for Missed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Missed::Skip => f.write_str("skip"),
            Missed::Latest => f.write_str("latest"),
            Missed::All { limit } if *limit == DEFAULT_ALL_LIMIT => f.write_str("all"),
            Missed::All { limit } => write!(f, "all:{limit}"),
        }
    }
}

/// A policy name that is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a missed-firings policy: write `skip`, `latest`, `all` (up to {DEFAULT_ALL_LIMIT}) or `all:N`"
)]
pub struct MissedError(pub String);

impl FromStr for Missed {
    type Err = MissedError;

    /// `skip`, `latest`, `all` or `all:N` (N at least 1).
    fn from_str(text: &str) -> Result<Self, MissedError> {
        match text.trim() {
            "skip" => Ok(Missed::Skip),
            "latest" => Ok(Missed::Latest),
            "all" => Ok(Missed::All {
                limit: DEFAULT_ALL_LIMIT,
            }),
            other => other
                .strip_prefix("all:")
                .and_then(|limit| limit.trim().parse::<u32>().ok())
                .filter(|limit| *limit > 0)
                .map(|limit| Missed::All { limit })
                .ok_or_else(|| MissedError(text.to_owned())),
        }
    }
}

/// Which due firings a scheduler enqueues, and which it counts as missed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The firings to enqueue, oldest first: the one on time, if any, and the catch-ups the
    /// policy asks for.
    pub enqueue: Vec<i64>,
    /// The missed firings left out, oldest first.
    pub missed: Vec<i64>,
}

/// Of `due`, the firings not yet enqueued whose time is at or before `now` (oldest first),
/// what a scheduler enqueues under `missed`.
///
/// The most recent due firing is on time when `now` is at most `grace` seconds past it: it is
/// always enqueued. Every other due firing was missed (no scheduler reached it in time), and
/// the policy decides: none, the most recent, or the most recent `limit`.
pub fn plan(due: &[i64], now: i64, grace: i64, missed: Missed) -> Plan {
    let (late, on_time) = match due.split_last() {
        Some((&last, earlier)) if now - last <= grace => (earlier, Some(last)),
        _ => (due, None),
    };
    let caught_up = match missed {
        Missed::Skip => 0,
        Missed::Latest => late.len().min(1),
        Missed::All { limit } => late.len().min(limit as usize),
    };
    let (left_out, caught) = late.split_at(late.len() - caught_up);
    let mut enqueue = caught.to_vec();
    enqueue.extend(on_time);
    Plan {
        enqueue,
        missed: left_out.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_schedule_and_the_utc_second() {
        assert_eq!(format_firing(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_firing(951_782_400 + 3661), "2000-02-29T01:01:01Z");
        let key = firing_key("a:b", 59).unwrap();
        assert_eq!(key.as_str(), "periodic:a%3Ab:1970-01-01T00:00:59Z");
        assert_eq!(JobKey::parse(key.as_str()).unwrap(), key);
        assert!(firing_key("", 0).is_err());
    }

    #[test]
    fn policies_parse_and_print() {
        for (text, policy) in [
            ("skip", Missed::Skip),
            ("latest", Missed::Latest),
            ("all", Missed::All { limit: 100 }),
            ("all:7", Missed::All { limit: 7 }),
        ] {
            assert_eq!(text.parse::<Missed>().unwrap(), policy);
            assert_eq!(policy.to_string(), text);
        }
        for bad in ["", "none", "all:0", "all:x", "ALL"] {
            let error = bad.parse::<Missed>().unwrap_err().to_string();
            assert!(error.contains("skip"), "{error}");
        }
    }

    #[test]
    fn the_plan_keeps_the_firing_on_time_and_the_policy_decides_the_rest() {
        let due: Vec<i64> = (1..=10).map(|n| n * 60).collect();
        // Noticed 5 s after the last one: it is on time.
        let now = 605;
        let skip = plan(&due, now, 10, Missed::Skip);
        assert_eq!(skip.enqueue, [600]);
        assert_eq!(skip.missed.len(), 9);
        let latest = plan(&due, now, 10, Missed::Latest);
        assert_eq!(latest.enqueue, [540, 600]);
        assert_eq!(latest.missed, due[..8]);
        let all = plan(&due, now, 10, Missed::All { limit: 100 });
        assert_eq!(all.enqueue, due);
        assert!(all.missed.is_empty());
        let some = plan(&due, now, 10, Missed::All { limit: 3 });
        assert_eq!(some.enqueue, [420, 480, 540, 600]);
        assert_eq!(some.missed, due[..6]);
        // Past the grace, the last one is missed too.
        let late = plan(&due, 700, 10, Missed::Skip);
        assert!(late.enqueue.is_empty());
        assert_eq!(late.missed, due);
        assert_eq!(plan(&due, 700, 10, Missed::Latest).enqueue, [600]);
        assert_eq!(plan(&[], 700, 10, Missed::Latest), Plan::default());
    }
}
