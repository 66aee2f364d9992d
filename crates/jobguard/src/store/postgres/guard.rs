//! The guard's SQL for PostgreSQL. Table names come from a validated
//! [`TableName`].

use crate::table::TableName;

pub(crate) fn create(table: &TableName) -> Vec<String> {
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
    statements
}

/// The guard itself, as a function so that a claim is one round trip whether it wins or not.
///
/// The primary key serialises concurrent deliveries of one key: a second insert waits for the
/// first transaction, then inserts nothing when it committed (a duplicate) or inserts when it
/// rolled back (the retry applies). On a conflict the function reads the row that holds the
/// key in a second statement, which under read committed takes a new snapshot and so sees the
/// row the conflicting transaction just committed (a single statement would not).
pub(crate) fn create_claim_function(table: &TableName) -> String {
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
                return query select true, null::int8, null::bytea, null::jsonb, null::bytea;
            else
                return query
                    select false, (extract(epoch from g.applied_at) * 1000000)::int8,
                           g.fingerprint, g.result, g.claim_token
                    from {t} g where g.job_key = p_key;
            end if;
        end
        $claim$",
        function = table.derived_qualified("claim"),
        t = table.quoted(),
    )
}

/// Claims a key: one row, `claimed` true, or the row that holds the key; no row when that row
/// was deleted between the conflict and the read.
pub(crate) fn claim(table: &TableName) -> String {
    format!(
        "select * from {}($1, $2, $3, $4)",
        table.derived_qualified("claim")
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
