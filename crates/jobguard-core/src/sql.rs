//! The guard's SQL text per dialect, built from a validated [`TableName`].
//!
//! The Rust guard and the Python package run these same statements, so both libraries create
//! the same table and claim a key the same way, and can share one database.

use crate::table::TableName;

pub mod postgres;
pub mod sqlite;

/// The states of a job that holds its key: one live job per key, enforced by a partial unique
/// index with this predicate.
pub const LIVE_STATES: &str = "state in ('available', 'running')";

/// The live job holding the key `$1`: id, kind, payload. One text for both dialects, which
/// each dialect's `queue` module re-exports beside its `enqueue`.
pub fn live_job(table: &TableName) -> String {
    format!(
        "select id, kind, payload from {} where job_key = $1 and {LIVE_STATES}",
        table.quoted()
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
