//! A cron expression evaluated in a named time zone, with croner on chrono-tz's compiled-in
//! IANA database: no system file is read, so every scheduler computes the same firings.
//!
//! Daylight-saving changes are croner's: a fixed-time firing (`0 30 2 * * *`) that falls in a
//! gap runs at the first instant after the gap, and in a repeated hour runs once, at the
//! first pass; an interval firing (`0 */15 * * * *`) skips the instants of a gap and runs at
//! both passes of a repeated hour.
//!
//! The Rust scheduler and the Python package's both evaluate schedules here, so every
//! scheduler of a schedule, in either language, computes the same firings.
//!
//! ```
//! use jobguard_core::cron::{ZonedCron, parse_zone};
//!
//! let nightly = ZonedCron::new("0 3 * * *", parse_zone("UTC")?)?;
//! // 2026-12-06T03:00:00Z is the first firing after midnight.
//! assert_eq!(nightly.next_after(1_796_515_200), Some(1_796_526_000));
//! # Ok::<(), String>(())
//! ```

use std::str::FromStr;

use chrono::{DateTime, TimeZone};
pub use chrono_tz::Tz;
use croner::Cron;

/// The most due firings one tick considers: the most recent ones. Older ones count as missed
/// without being listed.
pub const MAX_DUE: usize = 10_000;

/// A parsed cron expression and its time zone.
#[derive(Clone, Debug)]
pub struct ZonedCron {
    cron: Cron,
    zone: Tz,
}

impl ZonedCron {
    /// Parses `expression` (five fields, or six with seconds first) to run in `zone`; the
    /// reason when it is not one, or never fires.
    pub fn new(expression: &str, zone: Tz) -> Result<Self, String> {
        let cron = Cron::from_str(expression).map_err(|error| {
            format!(
                "`{expression}` is not a cron expression ({error}); write five fields, minute \
                 hour day-of-month month day-of-week (`0 3 * * *`), or six with seconds first"
            )
        })?;
        let zoned = ZonedCron { cron, zone };
        if zoned.next_after(0).is_none() {
            return Err(format!("`{expression}` never fires"));
        }
        Ok(zoned)
    }

    fn at(&self, seconds: i64) -> Option<DateTime<Tz>> {
        self.zone.timestamp_opt(seconds, 0).single()
    }

    /// The first firing strictly after `seconds` (since the epoch).
    pub fn next_after(&self, seconds: i64) -> Option<i64> {
        let next = self
            .cron
            .find_next_occurrence(&self.at(seconds)?, false)
            .ok()?;
        Some(next.timestamp())
    }

    /// The firings after `after` and at or before `through`, oldest first: the most recent
    /// [`MAX_DUE`] of them, and whether older ones were left out.
    pub fn due(&self, after: i64, through: i64) -> (Vec<i64>, bool) {
        let mut due = Vec::new();
        let Some(mut cursor) = self.at(through) else {
            return (due, false);
        };
        let mut inclusive = true;
        while let Ok(previous) = self.cron.find_previous_occurrence(&cursor, inclusive) {
            if previous.timestamp() <= after {
                break;
            }
            if due.len() == MAX_DUE {
                due.reverse();
                return (due, true);
            }
            due.push(previous.timestamp());
            cursor = previous;
            inclusive = false;
        }
        due.reverse();
        (due, false)
    }
}

/// The time zone named `name` in the IANA database (`Europe/Paris`, `UTC`).
pub fn parse_zone(name: &str) -> Result<Tz, String> {
    name.parse::<Tz>().map_err(|_| {
        format!(
            "unknown time zone `{name}`: name one of the IANA database, such as `UTC`, \
             `Europe/Paris` or `America/New_York`"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_firings_are_those_in_the_window_oldest_first() {
        let every_minute = ZonedCron::new("* * * * *", Tz::UTC).unwrap();
        assert_eq!(every_minute.due(0, 180).0, [60, 120, 180]);
        assert_eq!(every_minute.due(60, 179).0, [120]);
        assert_eq!(every_minute.next_after(60), Some(120));
        let (due, cut) = every_minute.due(-1, (MAX_DUE as i64 + 5) * 60);
        assert!(cut);
        assert_eq!(due.len(), MAX_DUE);
        assert_eq!(*due.last().unwrap(), (MAX_DUE as i64 + 5) * 60);
    }

    #[test]
    fn bad_input_says_what_is_wrong() {
        assert!(
            ZonedCron::new("tomorrow", Tz::UTC)
                .unwrap_err()
                .contains("tomorrow")
        );
        assert!(
            ZonedCron::new("0 0 30 2 *", Tz::UTC)
                .unwrap_err()
                .contains("never")
        );
        assert!(
            parse_zone("Mars/Olympus")
                .unwrap_err()
                .contains("Mars/Olympus")
        );
        assert_eq!(parse_zone("Europe/Paris").unwrap(), Tz::Europe__Paris);
    }
}
