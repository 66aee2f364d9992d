//! Durations as jobguard prints them in errors, logs and reports, and as its command lines and
//! files take them.
//!
//! One format everywhere, so an error naming a retention and a report naming a horizon read
//! the same way, and `--lease 30s` means the same to `jobguard worker` and to
//! `python -m jobguard worker`.
//!
//! ```
//! use std::time::Duration;
//! use jobguard_core::duration::format_duration;
//!
//! assert_eq!(format_duration(Duration::from_secs(90)), "1m 30s");
//! ```

use std::time::Duration;

/// A duration as a user writes it on a command line or in a file: `30s`, `500ms`, `2m`,
/// `1h 30m`, `14d`. A bare number is refused with a message that says how to write one, so
/// that `--lease 30` never means thirty of an unstated unit.
///
/// ```
/// use std::time::Duration;
/// use jobguard_core::duration::parse_duration;
///
/// assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
/// assert_eq!(parse_duration(" 250ms "), Ok(Duration::from_millis(250)));
/// assert!(parse_duration("30").unwrap_err().contains("such as 30s"));
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|error| format!("{error}: write a duration such as 30s, 500ms or 2m"))
}

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
