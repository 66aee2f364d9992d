//! The guard's SQL for PostgreSQL. Table names come from a validated
//! [`TableName`]. The Rust guard and every other language's binding run these same statements.

use crate::table::TableName;

pub mod queue;
pub mod worker;

/// The guard table, its index by age and (on PostgreSQL) its claim function, in the order they
/// are created; each is `create ... if not exists` or `create or replace`.
pub fn create(table: &TableName) -> Vec<String> {
    let t = table.quoted();
    let mut statements = table.schema_statements();
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
    statements.push(create_claim_function(table));
    statements.push(create_held_function(table));
    statements
}

/// The claim as a function, for statements that claim a key inside a larger one (the worker
/// completes a job and claims its key in one statement); [`claim`] is the guard's own.
///
/// The primary key serialises concurrent deliveries of one key: a second insert waits for the
/// first transaction, then inserts nothing when it committed (a duplicate) or inserts when it
/// rolled back (the retry applies). On a conflict the function reads the row that holds the
/// key in a second statement, which under read committed takes a new snapshot and so sees the
/// row the conflicting transaction just committed (a single statement would not). The row is
/// returned through the output columns (`return next`), not a query of its own: a claim that
/// wins runs one statement, not two (about 3-6% more claims a second in pgbench).
pub fn create_claim_function(table: &TableName) -> String {
    format!(
        "create or replace function {function}(
            p_key text, p_kind text, p_fingerprint bytea, p_token bytea
        ) returns table (
            claimed boolean, held_applied_at int8, held_fingerprint bytea,
            held_result jsonb, held_token bytea
        ) language plpgsql volatile as $claim$
        begin
            insert into {t} (job_key, kind, fingerprint, claim_token)
            values (p_key, p_kind, p_fingerprint, p_token)
            on conflict (job_key) do nothing;
            if found then
                claimed := true;
                return next;
                return;
            end if;
            select false, (extract(epoch from g.applied_at) * 1000000)::int8,
                   g.fingerprint, g.result, g.claim_token
              into claimed, held_applied_at, held_fingerprint, held_result, held_token
              from {t} g where g.job_key = p_key;
            if found then
                return next;
            end if;
        end
        $claim$",
        function = table.derived_qualified("claim"),
        t = table.quoted(),
    )
}

/// Reads the row that holds a key, as the claim statements return it (`claimed` false), in a
/// statement of its own: a volatile function's query takes a new snapshot under read
/// committed, so it sees the row that a conflicting transaction committed while the calling
/// statement waited for it.
pub fn create_held_function(table: &TableName) -> String {
    format!(
        "create or replace function {function}(p_key text) returns table (
            claimed boolean, held_applied_at int8, held_fingerprint bytea,
            held_result jsonb, held_token bytea
        ) language plpgsql volatile as $held$
        begin
            return query
            select false, (extract(epoch from g.applied_at) * 1000000)::int8,
                   g.fingerprint, g.result, g.claim_token
              from {t} g where g.job_key = p_key;
        end
        $held$",
        function = table.derived_qualified("held"),
        t = table.quoted(),
    )
}

/// Claims a key (`$1`, kind `$2`, fingerprint `$3`, claim token `$4`): one row, `claimed` true,
/// or the row that holds the key; no row when that row was deleted between the conflict and
/// the read.
///
/// The guard's own statement: the insert is the guide's `insert ... on conflict do nothing`
/// with no function around it, so a claim that wins costs what the hand-written guard costs.
/// Only on a conflict does the held function run (the one-time filter skips it otherwise), and
/// it reads the holding row in a new snapshot, which this statement's own could not see when
/// the conflicting transaction committed while the insert waited. One round trip either way;
/// about 5-9% more winning claims a second in pgbench than calling the claim function.
pub fn claim(table: &TableName) -> String {
    format!(
        "with claimed as (
            insert into {t} (job_key, kind, fingerprint, claim_token)
            values ($1, $2, $3, $4)
            on conflict (job_key) do nothing
            returning true
        )
        select true as claimed, null::int8 as held_applied_at, null::bytea as held_fingerprint,
               null::jsonb as held_result, null::bytea as held_token
          from claimed
        union all
        select * from {held}($1) where not exists (select from claimed)",
        t = table.quoted(),
        held = table.derived_qualified("held"),
    )
}

/// Claims a key and says only whether this transaction holds it: a row when it does, none on a
/// conflict. The guide's `insert ... on conflict do nothing returning`, for a caller that reads
/// the holding row ([`record`]) only when it needs it; [`claim`] returns it in the same round
/// trip.
pub fn claim_bare(table: &TableName) -> String {
    format!(
        "insert into {} (job_key, kind, fingerprint, claim_token)
         values ($1, $2, $3, $4)
         on conflict (job_key) do nothing
         returning true",
        table.quoted()
    )
}

/// Read in a new statement after a conflict, so under read committed it sees the row that the
/// conflicting transaction committed.
pub fn record(table: &TableName) -> String {
    format!(
        "select (extract(epoch from applied_at) * 1000000)::int8, fingerprint, result, claim_token
         from {} where job_key = $1",
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

/// Whether a table's comment is the given marker (`$1` the quoted table, `$2` the marker):
/// true when the migration that made it ran the same statements.
pub const MIGRATED: &str = "select obj_description(to_regclass($1), 'pg_class') = $2";

/// Takes the migration lock of one table (`$1` from [`migrate_lock_key`]) until the
/// transaction ends: workers starting together would race on `create ... if not exists`,
/// which is not atomic in PostgreSQL's catalog.
pub const MIGRATE_LOCK: &str = "select pg_advisory_xact_lock(hashtextextended($1, 0))";

/// Waits at most this long for a lock a migration statement needs.
pub const MIGRATE_LOCK_TIMEOUT: &str = "set local lock_timeout = '30s'";

/// The key of [`MIGRATE_LOCK`] for `table`.
pub fn migrate_lock_key(table: &TableName) -> String {
    format!("jobguard:migrate:{table}")
}

/// Leaves `marker` (from [`schema_marker`](crate::sql::schema_marker)) as the table's comment.
pub fn mark_migrated(table: &TableName, marker: &str) -> String {
    // The marker is hex digits after a fixed prefix: safe to splice.
    format!("comment on table {} is '{marker}'", table.quoted())
}
