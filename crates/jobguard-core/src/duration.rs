//! Durations as jobguard prints them in errors, logs and reports.
//!
//! One format everywhere, so an error naming a retention and a report naming a horizon read
//! the same way.
//!
//! ```
//! use std::time::Duration;
//! use jobguard_core::duration::format_duration;
//!
//! assert_eq!(format_duration(Duration::from_secs(90)), "1m 30s");
//! ```

use std::time::Duration;

/// A duration as jobguard prints it, to the second (to the millisecond under a second):
/// `14d`, `7d 15m 13s`, `250ms`.
///
/// ```
/// use std::time::Duration;
/// use jobguard_core::duration::format_duration;
///
/// assert_eq!(format_duration(Duration::from_secs(14 * 86_400)), "14d");
/// assert_eq!(format_duration(Duration::from_millis(613_200)), "10m 13s");
/// ```
pub fn format_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    if duration.is_zero() {
        return "0s".into();
    }
    if secs == 0 {
        return format!("{}ms", duration.subsec_millis());
    }
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    let text: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect();
    text.join(" ")
}
