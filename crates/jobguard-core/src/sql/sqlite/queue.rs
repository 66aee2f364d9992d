//! The job queue's enqueue statements for SQLite: the Rust `Queue::enqueue_tx` and the Python
//! package's `jobguard.enqueue` run this same text. Times are integer microseconds since the
//! Unix epoch by the database clock.

use crate::sql::LIVE_STATES;
pub use crate::sql::live_job;
use crate::sql::sqlite::NOW_MICROS as NOW;
use crate::table::TableName;

/// Inserts a job: `$1` kind, `$2` key, `$3` queue, `$4` payload (JSON text), `$5` max
/// attempts, `$6` delay in microseconds; returns its id, or no row when a live job (available
/// or running) holds the key, as the live-key unique index decides.
pub fn enqueue(table: &TableName) -> String {
    format!(
        "insert into {t}
                 (kind, job_key, queue, payload, state, max_attempts, run_at, created_at)
             values ($1, $2, $3, $4, 'available', $5, {NOW} + $6, {NOW})
             on conflict (job_key) where {LIVE_STATES} do nothing
             returning id",
        t = table.quoted()
    )
}

/// Inserts a job under a unique policy that keeps its key beyond the live states: the
/// parameters of [`enqueue`], then `$7` the job's `unique_states` (not 0); returns its id, or no
/// row when a job holds the key, live or finished in a state its own policy keeps the key in
/// (either unique index: no conflict target).
pub fn enqueue_unique(table: &TableName) -> String {
    format!(
        "insert into {t}
                 (kind, job_key, queue, payload, state, max_attempts, run_at, created_at,
                  unique_states)
             values ($1, $2, $3, $4, 'available', $5, {NOW} + $6, {NOW}, $7)
             on conflict do nothing
             returning id",
        t = table.quoted()
    )
}
