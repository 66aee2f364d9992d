//! The statements that end or extend a worker's lease on one job, in both dialects: the Rust
//! worker and the Python worker settle a job with this same text.
//!
//! Every one of them names the job (`$1`) and the lease token its fetch drew (`$2`), and
//! changes the row only while that lease holds it ([`HELD`]): a worker whose lease expired and
//! was taken over by another fetch (a newer token) changes nothing (no row changed).

use crate::sql::HELD;
use crate::table::TableName;

/// How a dialect writes the time: now, and a parameter of microseconds added to it.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// The current time, as the jobs table keeps times.
    pub now: &'static str,
    /// Appended to a parameter of microseconds to add it to [`now`](Self::now).
    pub plus_micros: &'static str,
}

/// PostgreSQL's: `timestamptz` columns, durations as intervals.
pub const POSTGRES: Clock = Clock {
    now: "now()",
    plus_micros: " * interval '1 microsecond'",
};

/// SQLite's: integer microseconds since the Unix epoch.
pub const SQLITE: Clock = Clock {
    now: crate::sql::sqlite::NOW_MICROS,
    plus_micros: "",
};

fn fenced() -> String {
    format!("where id = $1 and lease_token = $2 and {HELD}")
}

/// Completes the job `$1` under lease token `$2`: one row changed when the lease held.
pub fn complete(table: &TableName, clock: Clock) -> String {
    format!(
        "update {t} set state = 'completed', finished_at = {now}, leased_until = null
                 {fenced}",
        t = table.quoted(),
        now = clock.now,
        fenced = fenced(),
    )
}

/// Schedules the job `$1` under lease token `$2` to run again `$3` microseconds from now,
/// with the error `$4`: one row changed when the lease held. The attempt stays counted.
pub fn retry(table: &TableName, clock: Clock) -> String {
    format!(
        "update {t} set state = 'available', run_at = {now} + $3{m}, last_error = $4,
                 leased_until = null {fenced}",
        t = table.quoted(),
        now = clock.now,
        m = clock.plus_micros,
        fenced = fenced(),
    )
}

/// Dead-letters the job `$1` under lease token `$2` with the error `$3`: one row changed when
/// the lease held.
pub fn dead(table: &TableName, clock: Clock) -> String {
    format!(
        "update {t} set state = 'dead', finished_at = {now}, last_error = $3,
                 leased_until = null {fenced}",
        t = table.quoted(),
        now = clock.now,
        fenced = fenced(),
    )
}

/// Gives the job `$1` back under lease token `$2`, to run now, its attempt not counted (a
/// worker stopping, a transaction that could not commit for a transient reason): one row
/// changed when the lease held.
pub fn release(table: &TableName) -> String {
    format!(
        "update {t} set state = 'available', attempt = attempt - 1, leased_until = null
                 {fenced}",
        t = table.quoted(),
        fenced = fenced(),
    )
}

/// Gives the job `$1` back under lease token `$2`, to run `$3` microseconds from now, its
/// attempt not counted: a job whose transaction did not commit for a transient reason
/// (`crate::transient`) however often it ran within its attempt. The delay (the retry policy's
/// for the attempt) keeps a job whose error does not pass from running in a tight loop, and no
/// error is recorded, so its next fetch is not taken for a replay. One row changed when the
/// lease held.
pub fn give_back(table: &TableName, clock: Clock) -> String {
    format!(
        "update {t} set state = 'available', attempt = attempt - 1, run_at = {now} + $3{m},
                 leased_until = null {fenced}",
        t = table.quoted(),
        now = clock.now,
        m = clock.plus_micros,
        fenced = fenced(),
    )
}

/// Extends the lease `$2` of job `$1` to `$3` microseconds from now: one row changed when it held.
pub fn heartbeat(table: &TableName, clock: Clock) -> String {
    format!(
        "update {t} set leased_until = {now} + $3{m} {fenced}",
        t = table.quoted(),
        now = clock.now,
        m = clock.plus_micros,
        fenced = fenced(),
    )
}
