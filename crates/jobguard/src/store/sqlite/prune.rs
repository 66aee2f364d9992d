//! Pruning on SQLite: the guard table's batches, built once per guard, and this process's
//! turn to prune a table.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use sqlx::sqlite::Sqlite;
use sqlx::{AssertSqlSafe, Pool};

use crate::store::GuardSql;
use crate::store::prune::{PruneBatch, PruneStore, Pruned};
use crate::table::TableName;
use crate::time::duration_micros;
use jobguard_core::sql::sqlite::NOW_MICROS;

/// One batch of a prune: up to `$3` of the oldest rows applied at or after `$2` and before the
/// cutoff `$1`, found through the `applied_at` index and deleted by rowid. It runs under the
/// single write lock, so no claim of the same key interleaves with it.
pub(crate) fn prune_guard(table: &TableName) -> String {
    let t = table.quoted();
    format!(
        "delete from {t} where rowid in (
             select rowid from {t} where applied_at < $1 and applied_at >= $2
             order by applied_at limit $3)
         returning applied_at"
    )
}

pub(crate) fn count_guard(table: &TableName) -> String {
    format!(
        "select count(*) from {} where applied_at < $1",
        table.quoted()
    )
}

/// The age of the oldest row, read from the end of the `applied_at` index; null when empty.
pub(crate) fn oldest_guard_age(table: &TableName) -> String {
    format!(
        "select {NOW_MICROS} - min(applied_at) from {}",
        table.quoted()
    )
}

/// The tables this process is pruning, by database file. Pruners in other processes need no
/// lock: SQLite's single writer runs their batches one at a time, and a batch deletes only
/// rows that are still there.
static PRUNING: LazyLock<Mutex<HashSet<(PathBuf, String)>>> = LazyLock::new(Mutex::default);

/// This process's turn to prune one table; given back when dropped.
#[derive(Debug)]
pub struct SqlitePruneTurn((PathBuf, String));

impl Drop for SqlitePruneTurn {
    fn drop(&mut self) {
        PRUNING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&self.0);
    }
}

impl PruneStore for Sqlite {
    type PruneTurn = SqlitePruneTurn;

    async fn prune_cutoff(pool: &Pool<Self>, keep: Duration) -> sqlx::Result<i64> {
        sqlx::query_scalar(AssertSqlSafe(format!("select {NOW_MICROS} - $1")))
            .bind(duration_micros(keep))
            .fetch_one(pool)
            .await
    }

    async fn prune_guard(
        pool: &Pool<Self>,
        sql: &GuardSql,
        batch: PruneBatch,
    ) -> sqlx::Result<Pruned> {
        let deleted: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(sql.prune.clone()))
            .bind(batch.cutoff)
            .bind(batch.after)
            .bind(i64::from(batch.limit))
            .fetch_all(pool)
            .await?;
        Ok(Pruned::of_times(deleted))
    }

    crate::store::prune::guard_prune_reads!();

    async fn take_prune_turn(
        pool: &Pool<Self>,
        table: &TableName,
    ) -> sqlx::Result<Option<SqlitePruneTurn>> {
        let file = pool.connect_options().get_filename().to_owned();
        let file = std::fs::canonicalize(&file).unwrap_or(file);
        let key = (file, table.to_string());
        let mut pruning = PRUNING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Lazily: a turn built and dropped here would give back the holder's turn.
        Ok(pruning.insert(key.clone()).then(|| SqlitePruneTurn(key)))
    }

    async fn end_prune_turn(turn: SqlitePruneTurn) {
        drop(turn);
    }
}
