//! Times and durations as the stores keep them: microseconds since the Unix epoch, and
//! durations in microseconds.
//!
//! Both backends store `bigint`/`integer` microseconds, so the conversions live once here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A time stored or computed as microseconds since the Unix epoch.
pub(crate) fn micros_to_time(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros.max(0) as u64)
}

/// A duration as microseconds, saturating at `i64::MAX`.
pub(crate) fn duration_micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// Microseconds as a duration, zero when negative.
pub(crate) fn micros_duration(micros: i64) -> Duration {
    Duration::from_micros(micros.max(0) as u64)
}

/// A time as microseconds since the Unix epoch, as [`micros_to_time`] reads it back (zero
/// before the epoch).
pub(crate) fn time_to_micros(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).map_or(0, duration_micros)
}
