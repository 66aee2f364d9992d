//! The guard's SQL for SQLite. Table names come from a validated
//! [`TableName`]. The Rust guard and every other language's binding run these same statements.

use crate::table::TableName;

pub mod queue;
pub mod worker;

/// Now by the database clock, in microseconds since the Unix epoch (millisecond precision).
pub const NOW_MICROS: &str = "cast((julianday('now') - 2440587.5) * 86400000000.0 as integer)";

/// The guard table, its index by age and (on PostgreSQL) its claim function, in the order they
/// are created; each is `create ... if not exists` or `create or replace`.
pub fn create(table: &TableName) -> Vec<String> {
    let t = table.quoted();
    vec![
        format!(
            "create table if not exists {t} (
                job_key     text primary key not null,
                kind        text not null,
                fingerprint blob,
                result      text,
                claim_token blob not null,
                applied_at  integer not null -- microseconds since the Unix epoch
            )"
        ),
        // Retention prunes by age; without this index every prune scans the whole table.
        format!(
            "create index if not exists {} on {t} (applied_at)",
            table.derived("applied_at_idx")
        ),
    ]
}

/// The guard itself. Guarded transactions start with `begin immediate`, so they hold SQLite's
/// single write lock from the start and concurrent deliveries queue behind each other: the
/// second sees the first's committed row and inserts nothing (a duplicate), or, when the first
/// rolled back, inserts it (the retry applies).
pub fn claim(table: &TableName) -> String {
    format!(
        "insert into {} (job_key, kind, fingerprint, claim_token, applied_at)
         values ($1, $2, $3, $4, {NOW_MICROS})
         on conflict (job_key) do nothing
         returning 1",
        table.quoted()
    )
}

/// Reads the row that holds a key: applied at (microseconds), fingerprint, result, claim token.
pub fn record(table: &TableName) -> String {
    format!(
        "select applied_at, fingerprint, result, claim_token from {} where job_key = $1",
        table.quoted()
    )
}

/// Stores the first run's result (`$2`, JSON) in the row of the key (`$1`) this transaction
/// claimed.
pub fn store_result(table: &TableName) -> String {
    format!(
        "update {} set result = $2 where job_key = $1",
        table.quoted()
    )
}
