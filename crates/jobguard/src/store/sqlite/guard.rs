//! The guard's SQL for SQLite, and its pruning. Table names come from a validated
//! [`TableName`].

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use sqlx::sqlite::Sqlite;
use sqlx::{AssertSqlSafe, Pool};

use crate::store::prune::PruneStore;
use crate::table::TableName;
use crate::time::{duration_micros, micros_duration};

/// Now by the database clock, in microseconds since the Unix epoch (millisecond precision).
pub(crate) const NOW_MICROS: &str =
    "cast((julianday('now') - 2440587.5) * 86400000000.0 as integer)";

pub(crate) fn create(table: &TableName) -> Vec<String> {
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
pub(crate) fn claim(table: &TableName) -> String {
    format!(
        "insert into {} (job_key, kind, fingerprint, claim_token, applied_at)
         values ($1, $2, $3, $4, {NOW_MICROS})
         on conflict (job_key) do nothing
         returning 1",
        table.quoted()
    )
}

pub(crate) fn record(table: &TableName) -> String {
    format!(
        "select applied_at, fingerprint, result, claim_token from {} where job_key = $1",
        table.quoted()
    )
}

pub(crate) fn store_result(table: &TableName) -> String {
    format!(
        "update {} set result = $2 where job_key = $1",
        table.quoted()
    )
}

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
        table: &TableName,
        cutoff: i64,
        after: i64,
        limit: u32,
    ) -> sqlx::Result<(u64, Option<i64>)> {
        let deleted: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(prune_guard(table)))
            .bind(cutoff)
            .bind(after)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await?;
        Ok((deleted.len() as u64, deleted.into_iter().max()))
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
