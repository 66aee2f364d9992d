//! The pruning statements each backend implements: the guard and steps tables
//! ([`PruneStore`]) and the jobs table ([`JobPruneStore`]).
//!
//! Pruning the jobs table: completed and dead jobs past their retention, in batches.
//!
//! A job's row holds its payload, so a table that only grows holds every payload ever sent.
//! Once a job has finished, its row is no longer what stops a duplicate (the guard row is), so
//! completed jobs can go after [`keep_completed`](crate::RetentionConfig::keep_completed), and
//! dead ones after [`keep_dead`](crate::RetentionConfig::keep_dead), once they can no longer be
//! replayed. The statements are in each backend's `queue_sql.rs`.

use std::future::Future;
use std::time::Duration;

use sqlx::Pool;

use super::queue::QueueSql;
use crate::store::guard::GuardSql;
use crate::table::TableName;

/// [`JobPruneStore::count_prunable_jobs`], the same count in both dialects.
macro_rules! count_prunable_jobs {
    () => {
        async fn count_prunable_jobs(
            pool: &Pool<Self>,
            sql: &QueueSql,
            state: &'static str,
            cutoff: i64,
        ) -> sqlx::Result<u64> {
            let rows: i64 =
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql.count_prunable_jobs.clone()))
                    .bind(state)
                    .bind(cutoff)
                    .fetch_one(pool)
                    .await?;
            Ok(rows.max(0) as u64)
        }
    };
}

/// [`PruneStore::count_guard`] and [`PruneStore::oldest_guard_age`], the same reads in both
/// dialects.
macro_rules! guard_prune_reads {
    () => {
        async fn count_guard(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::guard::GuardSql,
            cutoff: i64,
        ) -> sqlx::Result<u64> {
            let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.count_prunable.clone()))
                .bind(cutoff)
                .fetch_one(pool)
                .await?;
            Ok(rows.max(0) as u64)
        }

        async fn oldest_guard_age(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::guard::GuardSql,
        ) -> sqlx::Result<Option<std::time::Duration>> {
            let age: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.oldest_age.clone()))
                .fetch_one(pool)
                .await?;
            Ok(age.map($crate::time::micros_duration))
        }
    };
}
pub(crate) use guard_prune_reads;

/// One batch of a prune: up to `limit` of the oldest rows from `after` on and before `cutoff`
/// (microseconds since the Unix epoch, by the database clock).
#[derive(Clone, Copy, Debug)]
pub struct PruneBatch {
    pub(crate) cutoff: i64,
    pub(crate) after: i64,
    pub(crate) limit: u32,
}

/// What one batch of a prune deleted: how many rows, and the latest time among them, where the
/// next batch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pruned {
    pub(crate) deleted: u64,
    pub(crate) last: Option<i64>,
}

impl Pruned {
    /// From a statement that returns its count and latest time (PostgreSQL's).
    pub(crate) fn counted(deleted: i64, last: Option<i64>) -> Self {
        Pruned {
            deleted: deleted.max(0) as u64,
            last,
        }
    }

    /// From a statement that returns the time of every row it deleted (SQLite's).
    pub(crate) fn of_times(times: Vec<i64>) -> Self {
        Pruned {
            deleted: times.len() as u64,
            last: times.into_iter().max(),
        }
    }
}

/// The statements that prune finished jobs, which each backend implements.
pub trait JobPruneStore: sqlx::Database {
    /// Deletes a batch of the oldest jobs in `state` by their finish time; the latest finish
    /// time among them is where the next batch starts.
    fn prune_jobs(
        pool: &Pool<Self>,
        sql: &QueueSql,
        state: &'static str,
        batch: PruneBatch,
    ) -> impl Future<Output = sqlx::Result<Pruned>> + Send;

    /// How many jobs in `state` finished before `cutoff`.
    fn count_prunable_jobs(
        pool: &Pool<Self>,
        sql: &QueueSql,
        state: &'static str,
        cutoff: i64,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

/// The pruning statements each backend implements.
pub trait PruneStore: sqlx::Database + JobPruneStore {
    /// Proof that this process holds a table's turn to prune; released by
    /// [`end_prune_turn`](Self::end_prune_turn) or, if lost, when dropped.
    type PruneTurn: Send + 'static;

    /// Now minus `keep` by the database clock, in microseconds since the Unix epoch.
    fn prune_cutoff(
        pool: &Pool<Self>,
        keep: Duration,
    ) -> impl Future<Output = sqlx::Result<i64>> + Send;

    /// Deletes a batch of the oldest guard rows by `applied_at`; the newest `applied_at` among
    /// them is where the next batch starts.
    fn prune_guard(
        pool: &Pool<Self>,
        sql: &GuardSql,
        batch: PruneBatch,
    ) -> impl Future<Output = sqlx::Result<Pruned>> + Send;

    fn count_guard(
        pool: &Pool<Self>,
        sql: &GuardSql,
        cutoff: i64,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;

    fn oldest_guard_age(
        pool: &Pool<Self>,
        sql: &GuardSql,
    ) -> impl Future<Output = sqlx::Result<Option<Duration>>> + Send;

    /// The table's turn to prune, or `None` when another pruner holds it.
    fn take_prune_turn(
        pool: &Pool<Self>,
        table: &TableName,
    ) -> impl Future<Output = sqlx::Result<Option<Self::PruneTurn>>> + Send;

    fn end_prune_turn(turn: Self::PruneTurn) -> impl Future<Output = ()> + Send;
}

#[cfg(feature = "postgres")]
impl JobPruneStore for sqlx::Postgres {
    async fn prune_jobs(
        pool: &Pool<Self>,
        sql: &QueueSql,
        state: &'static str,
        batch: PruneBatch,
    ) -> sqlx::Result<Pruned> {
        let (deleted, last): (i64, Option<i64>) =
            sqlx::query_as(sqlx::AssertSqlSafe(sql.prune_jobs.clone()))
                .bind(state)
                .bind(batch.cutoff)
                .bind(i64::from(batch.limit))
                .bind(batch.after)
                .fetch_one(pool)
                .await?;
        Ok(Pruned::counted(deleted, last))
    }

    count_prunable_jobs!();
}

#[cfg(feature = "sqlite")]
impl JobPruneStore for sqlx::Sqlite {
    async fn prune_jobs(
        pool: &Pool<Self>,
        sql: &QueueSql,
        state: &'static str,
        batch: PruneBatch,
    ) -> sqlx::Result<Pruned> {
        let finished: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.prune_jobs.clone()))
            .bind(state)
            .bind(batch.cutoff)
            .bind(i64::from(batch.limit))
            .bind(batch.after)
            .fetch_all(pool)
            .await?;
        Ok(Pruned::of_times(finished))
    }

    count_prunable_jobs!();
}
