//! Which database errors leave a transaction that may commit when run again: one table per
//! dialect, keyed by the code the server or the engine reports (PostgreSQL's SQLSTATE,
//! SQLite's result code). The Rust runners and the Python package classify by these same
//! tables, so a lost connection or a lock timeout is the same thing to a Rust worker and a
//! Python worker on one queue: a run again that spends no attempt, never a dead letter.
//!
//! ```
//! use jobguard_core::transient::{Transient, classify};
//!
//! assert_eq!(classify("postgres", "40001"), Some(Transient::Contention));
//! assert_eq!(classify("postgres", "57P01"), Some(Transient::Connection));
//! assert_eq!(classify("postgres", "08006"), Some(Transient::Connection));
//! assert_eq!(classify("sqlite", "517"), Some(Transient::Contention)); // SQLITE_BUSY_SNAPSHOT
//! assert_eq!(classify("postgres", "23505"), None); // a unique violation is the job's own
//! ```

/// Why a transaction may commit when run again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transient {
    /// Rolled back by other transactions: a serialization failure, a deadlock, a lock not
    /// granted in time, a busy or locked SQLite database. Run it again on the same connection.
    Contention,
    /// The session is gone or going (the server ended it, shuts down or is starting up, the
    /// link broke): run it again on another connection.
    Connection,
}

impl Transient {
    /// The class's name, as logs and metrics label it.
    pub fn as_str(self) -> &'static str {
        match self {
            Transient::Contention => "contention",
            Transient::Connection => "connection",
        }
    }
}

/// How many times a runner runs one transaction that ends in a transient error, within one
/// attempt of its job, before it gives the job back (its attempt not counted): the default of
/// the Rust guard's `GuardConfig::contention_attempts`, and the Python worker's.
pub const RUNS: u32 = 5;

/// The wait before running a transaction again after its `run`-th run (from 1) ended in a
/// transient error: 2, 4, 8 ms ... up to 256 ms, scaled by `0.5 + jitter` for a `jitter` in
/// `[0, 1)` that the caller draws, so that transactions which collided spread out.
///
/// ```
/// use std::time::Duration;
/// use jobguard_core::transient::backoff;
///
/// assert_eq!(backoff(1, 0.5), Duration::from_millis(2));
/// assert_eq!(backoff(3, 0.0), Duration::from_millis(4));
/// assert_eq!(backoff(20, 0.5), Duration::from_millis(256));
/// ```
pub fn backoff(run: u32, jitter: f64) -> std::time::Duration {
    let base = (1_u64 << run.min(8)) as f64;
    let scale = 0.5 + jitter.clamp(0.0, 1.0);
    std::time::Duration::from_secs_f64(base * scale / 1000.0)
}

/// PostgreSQL's SQLSTATEs of a transaction that may commit when run again, with what each is.
/// Class `08` (connection exception) is transient as a whole, beside these.
pub const POSTGRES: &[(&str, Transient, &str)] = &[
    ("40001", Transient::Contention, "serialization failure"),
    ("40P01", Transient::Contention, "deadlock detected"),
    (
        "55P03",
        Transient::Contention,
        "lock not available (lock_timeout, nowait)",
    ),
    (
        "57P01",
        Transient::Connection,
        "admin shutdown (pg_terminate_backend, a fast shutdown)",
    ),
    ("57P02", Transient::Connection, "crash shutdown"),
    (
        "57P03",
        Transient::Connection,
        "cannot connect now (starting up)",
    ),
];

/// SQLite's primary result codes of a transaction that may commit when run again (an extended
/// code is classified by its low byte): `SQLITE_BUSY` and `SQLITE_LOCKED`.
pub const SQLITE: &[(i32, Transient, &str)] = &[
    (5, Transient::Contention, "SQLITE_BUSY"),
    (6, Transient::Contention, "SQLITE_LOCKED"),
];

/// What the error code `code` means on `dialect` (`postgres` or `sqlite`): transient, and
/// how, or `None` for an error that running the transaction again would meet again (a bug,
/// bad data, a constraint) and for a dialect this table does not know.
pub fn classify(dialect: &str, code: &str) -> Option<Transient> {
    match dialect {
        "postgres" => {
            if code.len() == 5 && code.starts_with("08") {
                return Some(Transient::Connection);
            }
            POSTGRES
                .iter()
                .find(|(known, _, _)| *known == code)
                .map(|(_, class, _)| *class)
        }
        "sqlite" => {
            let code: i32 = code.parse().ok()?;
            SQLITE
                .iter()
                .find(|(primary, _, _)| *primary == code & 0xff)
                .map(|(_, class, _)| *class)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_postgres_code_in_the_table_is_classified_as_listed() {
        for (code, class, _) in POSTGRES {
            assert_eq!(classify("postgres", code), Some(*class), "{code}");
        }
        assert_eq!(classify("postgres", "08000"), Some(Transient::Connection));
        assert_eq!(classify("postgres", "08P01"), Some(Transient::Connection));
        for lasting in ["23505", "42P01", "22P02", "0800", "57014", ""] {
            assert_eq!(classify("postgres", lasting), None, "{lasting}");
        }
    }

    #[test]
    fn sqlite_extended_codes_follow_their_primary_code() {
        assert_eq!(classify("sqlite", "5"), Some(Transient::Contention));
        assert_eq!(classify("sqlite", "261"), Some(Transient::Contention)); // BUSY_RECOVERY
        assert_eq!(classify("sqlite", "262"), Some(Transient::Contention)); // LOCKED_SHAREDCACHE
        assert_eq!(classify("sqlite", "2067"), None); // CONSTRAINT_UNIQUE
        assert_eq!(classify("sqlite", "busy"), None);
        assert_eq!(classify("mysql", "1213"), None);
    }
}
