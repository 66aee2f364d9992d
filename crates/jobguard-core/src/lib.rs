//! The pure parts of jobguard, with no database driver and no broker client: what every
//! language's binding must compute exactly as the Rust library does.
//!
//! - [`key`]: [`JobKey`](key::JobKey), the encoded business key of a job, and its rules;
//! - [`cron`]: cron expressions in a named time zone (croner on chrono-tz), the firings of a
//!   schedule;
//! - [`fingerprint`]: the canonical-JSON hash of a payload that tells a redelivery from a
//!   reused key;
//! - [`api_key`]: idempotency keys for external APIs, derived from a job key and a step;
//! - [`payload`]: the size and NUL rules every job and outbox payload keeps;
//! - [`periodic`]: the key of a periodic job's firing and which missed firings a scheduler
//!   enqueues;
//! - [`retention`]: the horizon a guard retention must cover;
//! - [`unique`]: unique-job policies: the states that keep a key, the period in a key, what a
//!   repeated enqueue does;
//! - [`table`]: validated, quoted table names;
//! - [`transient`]: which database errors leave a transaction that may commit when run again,
//!   per dialect;
//! - [`sql`]: the guard's statements and DDL per dialect, the very text the Rust guard runs;
//! - [`url`]: database and broker URLs with their secrets hidden, as messages show them.
//!
//! The `jobguard` crate re-exports all of it; the Python package `jobguard` calls it through
//! PyO3, so a key, a fingerprint or a statement can never differ between the two.
//!
//! ```
//! use jobguard_core::key::JobKey;
//! use jobguard_core::sql;
//! use jobguard_core::table::TableName;
//!
//! let key = JobKey::new("credit", ["order-8812"])?;
//! assert_eq!(key.as_str(), "credit:order-8812");
//! let table = TableName::new("processed_jobs")?;
//! assert!(sql::sqlite::claim(&table).contains("on conflict (job_key) do nothing"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api_key;
pub mod cron;
pub mod date;
pub mod duration;
pub mod fingerprint;
pub mod key;
pub mod payload;
pub mod periodic;
pub mod retention;
pub mod sql;
pub mod table;
pub mod transient;
pub mod unique;
pub mod url;
