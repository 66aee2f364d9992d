//! Durations as jobguard prints them in errors, logs and reports.
//!
//! One format everywhere, so an error naming a retention and a report naming a horizon read
//! the same way.
//!
//! ```
//! use std::time::Duration;
//! use jobguard::retention::format_duration;
//!
//! assert_eq!(format_duration(Duration::from_secs(90)), "1m 30s");
//! ```

pub use jobguard_core::duration::format_duration;
