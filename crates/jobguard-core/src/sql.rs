//! The guard's SQL text per dialect, built from a validated [`TableName`].
//!
//! The Rust guard and the Python package run these same statements, so both libraries create
//! the same table and claim a key the same way, and can share one database.

use crate::table::TableName;

pub mod lease;
pub mod postgres;
pub mod queue_schema;
pub mod schedules;
pub mod sqlite;

/// The table of the queues an operator paused, beside the jobs table `table`: a fetch takes
/// nothing from a paused queue.
pub fn paused_queues(table: &TableName) -> String {
    table.derived_qualified("queues")
}

/// The states of a job that holds its key: one live job per key, enforced by a partial unique
/// index with this predicate.
pub const LIVE_STATES: &str = "state in ('available', 'running')";

/// The names of the live states, read from [`LIVE_STATES`]: the states a user's list of unique
/// states must include.
///
/// ```
/// assert!(jobguard_core::sql::live_state_names().contains(&"available"));
/// ```
pub fn live_state_names() -> Vec<&'static str> {
    LIVE_STATES.split('\'').skip(1).step_by(2).collect()
}

/// A job that waits for a worker and that no worker holds: available, with no lease on it.
/// The only job an enqueue that replaces on conflict rewrites.
pub const WAITING: &str = "state = 'available' and leased_until is null";

/// A job a worker holds: its lease is the token and `leased_until`, and its stored state stays
/// `available`. No index holds `leased_until`, the token or the attempt, so taking, extending
/// and giving back a lease changes no indexed column: on PostgreSQL a heap-only (HOT) update
/// that writes no index entry, on SQLite an update of the row alone. Every statement that ends
/// a lease sets `leased_until` back to null.
pub const HELD: &str = "state = 'available' and leased_until is not null";

/// A job a worker of the schema before the lean lease fetched: that schema stored a leased job
/// `running` (with its token and `leased_until`), and its workers may still run beside newer
/// ones during a rolling upgrade. Such a job is reported, counted and listed as running, and
/// the rescue gives it back once its lease expired, as it does a held job, so that no job is
/// left stored `running` when the worker that fetched it dies.
pub const LEGACY_RUNNING: &str = "state = 'running'";

/// Whether a job just fetched was replayed from the dead letters (or retried from the console)
/// since it last ran: its first attempt again, carrying the error it died with. No other way
/// back to attempt 1 keeps an error (a retry, a rescue and a release each leave the next fetch
/// at attempt 2 or more), so a duplicate found by such a fetch came from the replay.
pub const REPLAYED: &str = "(attempt = 1 and last_error is not null)";

/// The state a job is reported in: `running` while a worker holds it.
pub const STATE: &str =
    "case when state = 'available' and leased_until is not null then 'running' else state end";

/// The bit of a job's `unique_states` that keeps its key taken once it completed.
pub const KEEP_COMPLETED: i32 = 1;
/// The bit of a job's `unique_states` that keeps its key taken once it is dead.
pub const KEEP_DEAD: i32 = 2;

/// Whether a finished job keeps its key taken by its own `unique_states`; `prefix` is a table
/// alias with its dot, or empty.
pub fn keeps_key_finished(prefix: &str) -> String {
    format!(
        "({prefix}state = 'completed' and ({prefix}unique_states & {KEEP_COMPLETED}) <> 0
          or {prefix}state = 'dead' and ({prefix}unique_states & {KEEP_DEAD}) <> 0)"
    )
}

/// The predicate of the kept-key unique index: a job enqueued with unique states beyond the
/// live ones holds its key while live, and while finished in a state its mask names. Jobs
/// enqueued without (`unique_states = 0`) stay out of it, so the default enqueue pays for the
/// live-key index alone.
pub fn keeps_key() -> String {
    format!(
        "unique_states <> 0 and ({LIVE_STATES} or {})",
        keeps_key_finished("")
    )
}

/// The live job holding the key `$1`: id, kind, payload. One text for both dialects, which
/// each dialect's `queue` module re-exports beside its `enqueue`.
pub fn live_job(table: &TableName) -> String {
    format!(
        "select id, kind, payload from {} where job_key = $1 and {LIVE_STATES}",
        table.quoted()
    )
}

/// The job holding the key `$1` after an enqueue found it taken: live, or (when `$2` is not 0)
/// finished in a state its own policy keeps the key in; a live one first. Id, key, kind,
/// payload, state (`running` while a worker holds it), live. One text for both dialects, run
/// by the Rust queue and the Python package alike.
///
/// Read after the insert found the key taken: a new statement, so under read committed it
/// sees the row a concurrent enqueue committed while the insert waited.
pub fn holder(table: &TableName) -> String {
    format!(
        "select id, job_key, kind, payload, {STATE}, {LIVE_STATES} from {t}
                 where job_key = $1 and ({LIVE_STATES} or ($2 <> 0 and {kept}))
                 order by {LIVE_STATES} desc, id desc limit 1",
        t = table.quoted(),
        kept = keeps_key_finished(""),
    )
}

/// Replaces the payload (`$2`) and run time (`$3` microseconds from now) of job `$1` while it
/// waits; returns its id when it did. Only while the job waits: a worker that fetched it holds
/// it under a lease, and its attempt runs with the payload it fetched. Neither the lease token
/// nor the attempt changes, so no worker's fencing depends on a replace.
pub fn replace(table: &TableName, clock: lease::Clock) -> String {
    format!(
        "update {t} set payload = $2, run_at = {now} + $3{m}, replaced = replaced + 1
                 where id = $1 and {WAITING}
                 returning id",
        t = table.quoted(),
        now = clock.now,
        m = clock.plus_micros,
    )
}

/// The marker a PostgreSQL migration leaves as the table's comment: a hash of the statements
/// that created it, so that a migration finding its own marker leaves the schema alone.
///
/// ```
/// let marker = jobguard_core::sql::schema_marker(&["create table t (x int)"]);
/// assert!(marker.starts_with("jobguard schema "));
/// ```
pub fn schema_marker<S: AsRef<str>>(statements: &[S]) -> String {
    let mut hasher = blake3::Hasher::new();
    for statement in statements {
        hasher.update(statement.as_ref().as_bytes());
        hasher.update(&[0]);
    }
    format!("jobguard schema {}", &hasher.finalize().to_hex()[..16])
}
