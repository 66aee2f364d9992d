//! The guard's SQL for PostgreSQL, and its pruning. Table names come from a validated
//! [`TableName`].

use std::time::Duration;

use sqlx::postgres::{PgConnection, Postgres};
use sqlx::{AssertSqlSafe, Connection, Pool};

use crate::store::prune::PruneStore;
use crate::table::TableName;
use crate::time::{duration_micros, micros_duration};

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

/// A timestamp from a parameter in microseconds since the Unix epoch.
fn from_micros(param: &str) -> String {
    format!("(timestamptz 'epoch' + {param} * interval '1 microsecond')")
}

/// Now minus `$1` microseconds, by the database clock, as microseconds since the Unix epoch.
const PRUNE_CUTOFF: &str =
    "select (extract(epoch from now() - $1 * interval '1 microsecond') * 1000000)::int8";

/// One batch of a prune: up to `$3` of the oldest rows applied at or after `$2` and before the
/// cutoff `$1`, found through the `applied_at` index and deleted by row address in the same
/// statement; it returns how many went and the newest `applied_at` among them, where the next
/// batch starts.
///
/// No row lock is taken first: a row updated meanwhile (only fresh rows are, to store a result)
/// has a new address and is skipped, and a claim that conflicts with a row being deleted waits
/// for the delete, then inserts the key anew. That is the pitfall retention guards against, and
/// why the cutoff must lie beyond the horizon.
pub(crate) fn prune_guard(table: &TableName) -> String {
    let t = table.quoted();
    format!(
        "with deleted as (
             delete from {t} where ctid = any(array(
                 select ctid from {t}
                 where applied_at < {cutoff} and applied_at >= {after}
                 order by applied_at limit $3))
             returning applied_at
         )
         select count(*)::int8, (extract(epoch from max(applied_at)) * 1000000)::int8
         from deleted",
        cutoff = from_micros("$1"),
        after = from_micros("$2"),
    )
}

pub(crate) fn count_guard(table: &TableName) -> String {
    format!(
        "select count(*)::int8 from {} where applied_at < {}",
        table.quoted(),
        from_micros("$1")
    )
}

/// The age of the oldest row, read from the end of the `applied_at` index; null when empty.
pub(crate) fn oldest_guard_age(table: &TableName) -> String {
    format!(
        "select (extract(epoch from now() - min(applied_at)) * 1000000)::int8 from {}",
        table.quoted()
    )
}

/// One pruner per table across every process: a session-level advisory lock keyed by the
/// table's identity (its oid, or its name before it exists), so schemas with tables of the same
/// name do not share it.
const PRUNE_LOCK: &str = "select pg_try_advisory_lock(hashtextextended(
     'jobguard:prune:' || coalesce(to_regclass($1)::oid::text, $1), 0))";

impl PruneStore for Postgres {
    /// The connection that holds the table's advisory lock. It is detached from the pool, so
    /// that if pruning is cut short and the connection dropped, its session ends and the lock
    /// goes with it, instead of going back to the pool still held.
    type PruneTurn = PgConnection;

    async fn prune_cutoff(pool: &Pool<Self>, keep: Duration) -> sqlx::Result<i64> {
        sqlx::query_scalar(PRUNE_CUTOFF)
            .bind(duration_micros(keep))
            .fetch_one(pool)
            .await
    }

    async fn prune_guard(
        pool: &Pool<Self>,
        table: &TableName,
        cutoff: i64,
        after: i64,
        limit: u32,
    ) -> sqlx::Result<(u64, Option<i64>)> {
        let (deleted, last): (i64, Option<i64>) = sqlx::query_as(AssertSqlSafe(prune_guard(table)))
            .bind(cutoff)
            .bind(after)
            .bind(i64::from(limit))
            .fetch_one(pool)
            .await?;
        Ok((deleted.max(0) as u64, last))
    }

    async fn count_guard(pool: &Pool<Self>, table: &TableName, cutoff: i64) -> sqlx::Result<u64> {
        let rows: i64 = sqlx::query_scalar(AssertSqlSafe(count_guard(table)))
            .bind(cutoff)
            .fetch_one(pool)
            .await?;
        Ok(rows.max(0) as u64)
    }

    async fn oldest_guard_age(
        pool: &Pool<Self>,
        table: &TableName,
    ) -> sqlx::Result<Option<Duration>> {
        let age: Option<i64> = sqlx::query_scalar(AssertSqlSafe(oldest_guard_age(table)))
            .fetch_one(pool)
            .await?;
        Ok(age.map(micros_duration))
    }

    async fn take_prune_turn(
        pool: &Pool<Self>,
        table: &TableName,
    ) -> sqlx::Result<Option<PgConnection>> {
        let mut conn = pool.acquire().await?.detach();
        let held: bool = sqlx::query_scalar(PRUNE_LOCK)
            .bind(table.quoted())
            .fetch_one(&mut conn)
            .await?;
        if held {
            return Ok(Some(conn));
        }
        let _ = conn.close().await;
        Ok(None)
    }

    async fn end_prune_turn(conn: PgConnection) {
        // Ending the session releases its advisory lock.
        if let Err(error) = conn.close().await {
            tracing::debug!(%error, "closing the prune lock's connection failed; it is dropped");
        }
    }
}
