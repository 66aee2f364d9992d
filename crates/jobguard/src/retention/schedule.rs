//! When a worker prunes: a cron expression, evaluated in UTC.

use std::cmp::Ordering;
use std::fmt;
use std::ops::ControlFlow;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use croner::errors::CronError;
use croner::{CivilDate, CivilDateTime, CivilTime, Cron, CronDateTime, Resolution, Weekday};
use tokio::sync::watch;

use super::prune::{PruneReport, Pruner};
use crate::error::{Error, Result};
use crate::store::Backend;

/// When a [`Worker`](crate::Worker) prunes the guard table: a cron expression in UTC, with five
/// fields (minute hour day-of-month month day-of-week) or six (seconds first). Daily at
/// 03:00 UTC unless configured.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use jobguard::retention::PruneSchedule;
///
/// let daily = PruneSchedule::default();
/// assert_eq!(daily.expression(), "0 3 * * *");
/// // 1970-01-01 00:00 UTC, then 03:00 the same day.
/// assert_eq!(daily.next_after(UNIX_EPOCH), Some(UNIX_EPOCH + Duration::from_secs(3 * 3600)));
///
/// let hourly: PruneSchedule = "30 * * * *".parse()?;
/// assert_eq!(hourly.next_after(UNIX_EPOCH), Some(UNIX_EPOCH + Duration::from_secs(30 * 60)));
/// assert!(PruneSchedule::new("every night").is_err());
/// # Ok::<(), jobguard::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct PruneSchedule {
    cron: Cron,
    expression: String,
}

impl PruneSchedule {
    /// The schedule unless configured: daily at 03:00 UTC.
    pub const DAILY: &'static str = "0 3 * * *";

    /// Parses a cron expression, refusing it with [`Error::InvalidConfig`] when it is not one.
    pub fn new(expression: &str) -> Result<Self> {
        let cron = Cron::from_str(expression).map_err(|error| Error::InvalidConfig {
            setting: "prune schedule",
            reason: format!(
                "`{expression}` is not a cron expression ({error}); write five fields, minute \
                 hour day-of-month month day-of-week, e.g. `0 3 * * *` for daily at 03:00 UTC"
            ),
        })?;
        // A pattern that never matches (the 30th of February) would never prune.
        if cron.find_next_occurrence(&Utc(0), false).is_err() {
            return Err(Error::InvalidConfig {
                setting: "prune schedule",
                reason: format!("`{expression}` never happens"),
            });
        }
        Ok(PruneSchedule {
            cron,
            expression: expression.to_owned(),
        })
    }

    /// The expression as given.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The first time strictly after `time` (to the second) at which the schedule fires.
    pub fn next_after(&self, time: SystemTime) -> Option<SystemTime> {
        let seconds = match time.duration_since(UNIX_EPOCH) {
            Ok(since) => i64::try_from(since.as_secs()).ok()?,
            Err(before) => -i64::try_from(before.duration().as_secs_f64().ceil() as u64).ok()?,
        };
        let next = self.cron.find_next_occurrence(&Utc(seconds), false).ok()?;
        let next = u64::try_from(next.0).ok()?;
        Some(UNIX_EPOCH + Duration::from_secs(next))
    }
}

impl Default for PruneSchedule {
    fn default() -> Self {
        PruneSchedule::new(PruneSchedule::DAILY).expect("the default schedule parses")
    }
}

impl FromStr for PruneSchedule {
    type Err = Error;

    fn from_str(expression: &str) -> Result<Self> {
        PruneSchedule::new(expression)
    }
}

impl fmt::Debug for PruneSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PruneSchedule")
            .field(&self.expression)
            .finish()
    }
}

impl fmt::Display for PruneSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.expression)
    }
}

/// Prunes at every time of `schedule` until `stop` turns true, reporting each round to
/// `on_round`: `Some` with what it deleted, `None` when another pruner held the table.
pub(crate) async fn run_schedule<DB: Backend>(
    pruner: Pruner<DB>,
    schedule: PruneSchedule,
    mut stop: watch::Receiver<bool>,
    mut on_round: impl FnMut(Option<&PruneReport>) + Send,
) {
    // The memory horizon is visible from the start, not only after the first prune.
    if let Err(error) = pruner.oldest_age().await {
        tracing::debug!(%error, "cannot read the oldest guard row yet");
    }
    loop {
        let now = SystemTime::now();
        let Some(next) = schedule.next_after(now) else {
            tracing::warn!(schedule = %schedule, "the prune schedule has no next time; not pruning");
            return;
        };
        tokio::select! {
            () = tokio::time::sleep(next.duration_since(now).unwrap_or_default()) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        let stopping = stop.clone();
        let round = pruner
            .run_with(|_| {
                if *stopping.borrow() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .await;
        match round {
            Ok(Some(report)) => {
                tracing::info!(
                    guard_rows = report.guard_rows,
                    step_rows = report.step_rows,
                    seconds = report.elapsed.as_secs_f64(),
                    "scheduled prune done"
                );
                on_round(Some(&report));
            }
            Ok(None) => {
                tracing::debug!("another worker is pruning the guard table; skipping this round");
                on_round(None);
            }
            Err(error) => tracing::warn!(%error, "scheduled prune failed; trying at the next time"),
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// A time in UTC, to the second: what croner evaluates the schedule on, without a time zone
/// library.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Utc(i64);

const SECONDS_PER_DAY: i64 = 86_400;

impl CronDateTime for Utc {
    fn to_civil(&self) -> CivilDateTime {
        let (year, month, day) = civil_from_days(self.0.div_euclid(SECONDS_PER_DAY));
        let second = self.0.rem_euclid(SECONDS_PER_DAY) as u32;
        CivilDateTime::new(
            CivilDate::from_parts_unchecked(year, month, day),
            CivilTime::from_parts_unchecked(second / 3600, second / 60 % 60, second % 60),
        )
    }

    fn civil_weekday(&self) -> Weekday {
        // 1970-01-01 was a Thursday, four days after a Sunday.
        let days = self.0.div_euclid(SECONDS_PER_DAY);
        Weekday::from_days_from_sunday((days + 4).rem_euclid(7) as u32)
    }

    fn resolve_civil(
        &self,
        civil: CivilDateTime,
    ) -> std::result::Result<Resolution<Self>, CronError> {
        let days = days_from_civil(civil.year(), civil.month(), civil.day());
        let second = i64::from(civil.hour() * 3600 + civil.minute() * 60 + civil.second());
        Ok(Resolution::Single(Utc(days * SECONDS_PER_DAY + second)))
    }

    fn checked_add_seconds(&self, seconds: i64) -> Option<Self> {
        self.0.checked_add(seconds).map(Utc)
    }

    fn cmp_instant(&self, other: &Self) -> Ordering {
        self.cmp(other)
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i32, month: u32, day: u32) -> i64 {
    let year = i64::from(year) - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date `days` after 1970-01-01.
fn civil_from_days(days: i64) -> (i32, u32, u32) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year as i32, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(days: i64, seconds: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs((days * SECONDS_PER_DAY + seconds) as u64)
    }

    #[test]
    fn dates_round_trip_through_day_numbers() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        // 2024 is a leap year; 2100 is not.
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
        assert_eq!(
            days_from_civil(2024, 3, 1) - days_from_civil(2024, 2, 28),
            2
        );
        assert_eq!(
            days_from_civil(2100, 3, 1) - days_from_civil(2100, 2, 28),
            1
        );
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }

    #[test]
    fn weekdays_follow_the_calendar() {
        // 2026-10-02 is a Friday.
        let friday = days_from_civil(2026, 10, 2) * SECONDS_PER_DAY;
        assert_eq!(Utc(friday).civil_weekday(), Weekday::Friday);
        assert_eq!(
            Utc(friday + 2 * SECONDS_PER_DAY).civil_weekday(),
            Weekday::Sunday
        );
    }

    #[test]
    fn the_next_time_is_strictly_after() {
        let daily = PruneSchedule::default();
        let day = days_from_civil(2026, 10, 2);
        assert_eq!(daily.next_after(at(day, 0)), Some(at(day, 3 * 3600)));
        // At 03:00 exactly (and a moment after), the next run is tomorrow's.
        assert_eq!(
            daily.next_after(at(day, 3 * 3600)),
            Some(at(day + 1, 3 * 3600))
        );
        let moment = at(day, 3 * 3600) + Duration::from_millis(500);
        assert_eq!(daily.next_after(moment), Some(at(day + 1, 3 * 3600)));

        // Sundays at 04:30; 2026-10-02 is a Friday.
        let weekly = PruneSchedule::new("30 4 * * SUN").unwrap();
        assert_eq!(
            weekly.next_after(at(day, 0)),
            Some(at(day + 2, 4 * 3600 + 1800))
        );
        // With seconds: every 5 seconds.
        let often = PruneSchedule::new("*/5 * * * * *").unwrap();
        assert_eq!(often.next_after(at(day, 7)), Some(at(day, 10)));
    }

    #[test]
    fn bad_expressions_are_refused_with_the_reason() {
        for bad in ["", "tomorrow", "61 * * * *", "0 0 30 2 *"] {
            let error = PruneSchedule::new(bad).unwrap_err();
            assert!(matches!(
                error,
                Error::InvalidConfig {
                    setting: "prune schedule",
                    ..
                }
            ));
            assert!(error.to_string().contains(bad), "{error}");
        }
    }
}
