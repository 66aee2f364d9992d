//! Pruning the jobs table: completed and dead jobs past their retention, in batches.
//!
//! A job's row holds its payload, so a table that only grows holds every payload ever sent.
//! Once a job has finished, its row is no longer what stops a duplicate (the guard row is), so
//! completed jobs can go after [`keep_completed`](super::RetentionConfig::keep_completed), and
//! dead ones after [`keep_dead`](super::RetentionConfig::keep_dead), once they can no longer be
//! replayed. The statements are in each backend's `queue_sql.rs`.

use std::future::Future;

use sqlx::Pool;

use crate::queue::QueueSql;

/// The statements that prune finished jobs, which each backend implements.
#[doc(hidden)]
pub trait JobPruneStore: sqlx::Database {
    /// Deletes up to `limit` of the oldest jobs in `state` that finished before `cutoff` and
    /// not before `after` (microseconds since the Unix epoch); returns how many, and the latest
    /// finish time among them.
    #[doc(hidden)]
    fn prune_jobs(
        pool: &Pool<Self>,
        sql: &QueueSql,
        state: &'static str,
        cutoff_after: (i64, i64),
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<(u64, Option<i64>)>> + Send;

    /// How many jobs in `state` finished before `cutoff`.
    #[doc(hidden)]
    fn count_prunable_jobs(
        pool: &Pool<Self>,
        sql: &QueueSql,
        state: &'static str,
        cutoff: i64,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

#[cfg(feature = "postgres")]
impl JobPruneStore for sqlx::Postgres {
    async fn prune_jobs(
        pool: &Pool<Self>,
        sql: &QueueSql,
        state: &'static str,
        (cutoff, after): (i64, i64),
        limit: u32,
    ) -> sqlx::Result<(u64, Option<i64>)> {
        let (deleted, last): (i64, Option<i64>) =
            sqlx::query_as(sqlx::AssertSqlSafe(sql.prune_jobs.clone()))
                .bind(state)
                .bind(cutoff)
                .bind(i64::from(limit))
                .bind(after)
                .fetch_one(pool)
                .await?;
        Ok((deleted.max(0) as u64, last))
    }

    async fn count_prunable_jobs(
        pool: &Pool<Self>,
        sql: &QueueSql,
        state: &'static str,
        cutoff: i64,
    ) -> sqlx::Result<u64> {
        let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.count_prunable_jobs.clone()))
            .bind(state)
            .bind(cutoff)
            .fetch_one(pool)
            .await?;
        Ok(rows.max(0) as u64)
    }
}

#[cfg(feature = "sqlite")]
impl JobPruneStore for sqlx::Sqlite {
    async fn prune_jobs(
        pool: &Pool<Self>,
        sql: &QueueSql,
        state: &'static str,
        (cutoff, after): (i64, i64),
        limit: u32,
    ) -> sqlx::Result<(u64, Option<i64>)> {
        let finished: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.prune_jobs.clone()))
            .bind(state)
            .bind(cutoff)
            .bind(i64::from(limit))
            .bind(after)
            .fetch_all(pool)
            .await?;
        Ok((finished.len() as u64, finished.into_iter().max()))
    }

    async fn count_prunable_jobs(
        pool: &Pool<Self>,
        sql: &QueueSql,
        state: &'static str,
        cutoff: i64,
    ) -> sqlx::Result<u64> {
        let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.count_prunable_jobs.clone()))
            .bind(state)
            .bind(cutoff)
            .fetch_one(pool)
            .await?;
        Ok(rows.max(0) as u64)
    }
}
