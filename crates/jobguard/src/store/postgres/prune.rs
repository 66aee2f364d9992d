//! Pruning on PostgreSQL: the guard table's batches, built once per guard, and the advisory
//! lock that lets one pruner per table run across every process.

use std::time::Duration;

use sqlx::postgres::{PgConnection, Postgres};
use sqlx::{AssertSqlSafe, Connection, Pool};

use crate::store::GuardSql;
use crate::store::prune::{PruneBatch, PruneStore, Pruned};
use crate::table::TableName;
use crate::time::duration_micros;

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
        sql: &GuardSql,
        batch: PruneBatch,
    ) -> sqlx::Result<Pruned> {
        let (deleted, last): (i64, Option<i64>) = sqlx::query_as(AssertSqlSafe(sql.prune.clone()))
            .bind(batch.cutoff)
            .bind(batch.after)
            .bind(i64::from(batch.limit))
            .fetch_one(pool)
            .await?;
        Ok(Pruned::counted(deleted, last))
    }

    crate::store::prune::guard_prune_reads!();

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
