//! The guard's SQL for PostgreSQL. Table names come from a validated [`TableName`].

use crate::table::TableName;

pub(crate) fn create(table: &TableName) -> Vec<String> {
    let t = table.quoted();
    let mut statements = Vec::new();
    if let Some(schema) = table.schema() {
        statements.push(format!("create schema if not exists \"{schema}\""));
    }
    statements.push(format!(
        "create table if not exists {t} (
            job_key     text primary key,
            kind        text not null,
            fingerprint bytea,
            result      jsonb,
            claim_token bytea not null,
            applied_at  timestamptz not null default now()
        )"
    ));
    // Retention prunes by age; without this index every prune scans the whole table.
    statements.push(format!(
        "create index if not exists {} on {t} (applied_at)",
        table.derived("applied_at_idx")
    ));
    statements
}

/// The guard itself. The primary key serialises concurrent deliveries of one key: a second
/// insert waits for the first transaction, then inserts nothing when it committed (no row is
/// returned: a duplicate) or inserts when it rolled back (a row is returned: the retry applies).
pub(crate) fn claim(table: &TableName) -> String {
    format!(
        "insert into {} (job_key, kind, fingerprint, claim_token) values ($1, $2, $3, $4)
         on conflict (job_key) do nothing
         returning 1",
        table.quoted()
    )
}

/// Read in a new statement after a conflict, so under read committed it sees the row that the
/// conflicting transaction committed.
pub(crate) fn record(table: &TableName) -> String {
    format!(
        "select (extract(epoch from applied_at) * 1000000)::int8, fingerprint, result, claim_token
         from {} where job_key = $1",
        table.quoted()
    )
}

pub(crate) fn store_result(table: &TableName) -> String {
    format!(
        "update {} set result = $2 where job_key = $1",
        table.quoted()
    )
}
