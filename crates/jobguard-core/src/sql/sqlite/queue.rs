//! The job queue's tables and enqueue statements for SQLite: the Rust `Queue` (its `migrate`
//! and `enqueue_tx`) and the Python package (`App.migrate`, `jobguard.enqueue`) run this same
//! text. Times are integer microseconds since the Unix epoch by the database clock.

pub use crate::sql::live_job;
use crate::sql::queue_schema::{job_indexes, job_upgrades, unique_columns};
use crate::sql::sqlite::NOW_MICROS as NOW;
use crate::sql::{LIVE_STATES, paused_queues};
use crate::table::TableName;

/// The queue's tables and indexes on `table`, in the order a migration runs them, in one
/// `begin immediate` transaction: the jobs table, the unique-policy columns (an `alter table`
/// that fails with `duplicate column name` is skipped:
/// [`is_optional_on_sqlite`](crate::sql::queue_schema::is_optional_on_sqlite)), the indexes,
/// the upgrades from earlier schemas, and the table of paused queues.
pub fn create(table: &TableName) -> Vec<String> {
    let t = table.quoted();
    let mut create = vec![format!(
        "create table if not exists {t} (
                id           integer primary key autoincrement,
                kind         text not null,
                job_key      text not null,
                queue        text not null,
                payload      text not null,
                state        text not null
                             check (state in ('available', 'running', 'completed', 'dead')),
                attempt      integer not null default 0,
                lease_token  bigint not null default 0,
                max_attempts integer not null check (max_attempts > 0),
                run_at       integer not null,
                leased_until integer,
                last_error   text,
                created_at   integer not null,
                finished_at  integer
            )"
    )];
    create.extend(unique_columns(table, "add column"));
    create.extend(job_indexes(table));
    create.extend(job_upgrades(table));
    // Queues an operator paused: the fetch takes nothing from them.
    create.push(format!(
        "create table if not exists {} (
                name       text primary key,
                paused     integer not null default 0,
                changed_at integer not null
            )",
        paused_queues(table)
    ));
    create
}

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
