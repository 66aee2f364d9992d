//! The job queue's enqueue statements for PostgreSQL: the Rust `Queue::enqueue_tx` and the
//! Python package's `jobguard.enqueue` run this same text, so a job enqueued from either is
//! deduplicated by the same live key.

use crate::sql::LIVE_STATES;
pub use crate::sql::live_job;
use crate::table::TableName;

/// The channel on which enqueues wake idle workers (`select pg_notify($1, $2)`, the queue's
/// name as the payload).
pub const NOTIFY_CHANNEL: &str = "jobguard_jobs";

/// Wakes the workers listening on `$1` (the channel) for the queue `$2`.
pub const NOTIFY: &str = "select pg_notify($1, $2)";

/// Inserts a job: `$1` kind, `$2` key, `$3` queue, `$4` payload (JSON), `$5` max attempts,
/// `$6` delay in microseconds; returns its id, or no row when a live job (available or
/// running) holds the key. The live-key unique index decides, not a check-then-insert: a
/// concurrent enqueue of the same key waits for this transaction and then inserts nothing.
pub fn enqueue(table: &TableName) -> String {
    format!(
        "insert into {t} (kind, job_key, queue, payload, state, max_attempts, run_at)
             values ($1, $2, $3, $4, 'available', $5, now() + $6 * interval '1 microsecond')
             on conflict (job_key) where {LIVE_STATES} do nothing
             returning id",
        t = table.quoted()
    )
}

/// Inserts a job under a unique policy that keeps its key beyond the live states: the
/// parameters of [`enqueue`], then `$7` the job's `unique_states` (not 0); returns its id, or no
/// row when a job holds the key, live or finished in a state its own policy keeps the key in.
/// No conflict target: a conflict in either unique index (live key, kept key) inserts nothing,
/// and a concurrent enqueue of the key waits for this transaction, as with [`enqueue`].
pub fn enqueue_unique(table: &TableName) -> String {
    format!(
        "insert into {t}
                 (kind, job_key, queue, payload, state, max_attempts, run_at, unique_states)
             values ($1, $2, $3, $4, 'available', $5, now() + $6 * interval '1 microsecond', $7)
             on conflict do nothing
             returning id",
        t = table.quoted()
    )
}
