//! The steps table's rows and its interface to the backends: the statements each backend
//! builds from the table name, and their binding and decoding, written once in
//! `step_statements!` and expanded in each backend's `steps.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Pool;

use super::ClaimToken;
use crate::table::TableName;

/// A step found `started` with an expired lease, as given to a sweep's reconciler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleStep {
    /// The job's key.
    pub key: String,
    /// The step name.
    pub step: String,
    /// How many deliveries started or took over the step.
    pub attempts: i32,
}

/// A step marked `attention`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionStep {
    /// The job's key.
    pub key: String,
    /// The step name.
    pub step: String,
    /// What the reconciler reported.
    pub reason: String,
}

/// The step ledger's statements, built once per [`Steps`] from its validated table name.
#[derive(Debug)]
pub struct StepSql {
    pub(crate) table: TableName,
    pub(crate) create: Vec<Arc<str>>,
    pub(crate) start: Arc<str>,
    pub(crate) read: Arc<str>,
    pub(crate) take_over: Arc<str>,
    pub(crate) done: Arc<str>,
    pub(crate) expire: Arc<str>,
    pub(crate) attention: Arc<str>,
    pub(crate) forget: Arc<str>,
    pub(crate) resolve_done: Arc<str>,
    pub(crate) resolve_not_done: Arc<str>,
    pub(crate) stale: Arc<str>,
    pub(crate) list_attention: Arc<str>,
    pub(crate) prunable: Arc<str>,
    pub(crate) prune: Arc<str>,
}

/// The values of a step about to be started.
#[derive(Debug)]
pub struct StepStart<'a> {
    pub(crate) key: &'a str,
    pub(crate) step: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) token: &'a ClaimToken,
    pub(crate) lease: Duration,
}

/// A step row as read back.
#[derive(Debug)]
pub struct StepRow {
    pub(crate) state: String,
    pub(crate) token: Vec<u8>,
    /// How long the lease still runs; zero once expired.
    pub(crate) remaining: Duration,
    pub(crate) result: Option<serde_json::Value>,
    pub(crate) reason: Option<String>,
}

/// A change to a step row, made only if the row still holds the expected token and state.
#[derive(Debug)]
pub enum StepUpdate<'a> {
    TakeOver(&'a ClaimToken),
    Done(&'a serde_json::Value),
    Expire,
    Attention(&'a str),
    Forget,
    ResolveDone(&'a serde_json::Value),
    ResolveNotDone,
}

/// A stale step and the claim token of the attempt that left it, which a sweep takes it over
/// from.
#[derive(Debug)]
pub struct StaleClaim {
    pub(crate) step: StaleStep,
    pub(crate) token: Vec<u8>,
}

/// The step ledger's statements each backend implements. Every store also prunes, its own
/// `done` steps and the guard table they go with.
pub trait StepStore: sqlx::Database + super::prune::PruneStore {
    fn step_sql(table: &TableName) -> StepSql;

    /// Inserts the `started` row; false when a row for the step exists.
    fn step_start(
        pool: &Pool<Self>,
        sql: &StepSql,
        start: &StepStart<'_>,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    fn step_read(
        pool: &Pool<Self>,
        sql: &StepSql,
        key: &str,
        step: &str,
    ) -> impl Future<Output = sqlx::Result<Option<StepRow>>> + Send;

    /// Applies `how`; false when the row no longer holds `token` in the expected state.
    fn step_update(
        pool: &Pool<Self>,
        sql: &StepSql,
        key: &str,
        step: &str,
        token: &[u8],
        how: StepUpdate<'_>,
        lease: Duration,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    fn step_stale(
        pool: &Pool<Self>,
        sql: &StepSql,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<StaleClaim>>> + Send;

    fn step_attention(
        pool: &Pool<Self>,
        sql: &StepSql,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<AttentionStep>>> + Send;

    fn step_attention_count(
        pool: &Pool<Self>,
        sql: &StepSql,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// Counts `done` steps recorded before `cutoff`.
    fn step_prunable(
        pool: &Pool<Self>,
        sql: &StepSql,
        cutoff: i64,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// Deletes up to `limit` `done` steps recorded before `cutoff`.
    fn step_prune(
        pool: &Pool<Self>,
        sql: &StepSql,
        cutoff: i64,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

/// The step table's indexes, the same in both dialects.
pub(crate) fn step_indexes(table: &TableName) -> [String; 2] {
    let t = table.quoted();
    [
        format!(
            "create index if not exists {} on {t} (lease_until) where state = 'started'",
            table.derived("stale")
        ),
        // Pruning deletes the oldest `done` steps, batch by batch.
        format!(
            "create index if not exists {} on {t} (updated_at) where state = 'done'",
            table.derived("done")
        ),
    ]
}

// Every change names the token of the delivery that holds the step and the state it expects,
// so a delivery whose lease was taken over changes nothing.
pub(crate) const HELD: &str =
    "where job_key = $1 and step = $2 and token = $3 and state = 'started'";
/// The one step a statement reads or writes.
pub(crate) const KEY: &str = "where job_key = $1 and step = $2";

// The ledger's statements that every dialect writes alike, on the steps table `t` (quoted);
// each backend's `step_sql` takes them from here.

pub(crate) fn forget(t: &str) -> String {
    format!("delete from {t} {HELD}")
}

pub(crate) fn resolve_not_done(t: &str) -> String {
    format!("delete from {t} {KEY} and state = 'attention'")
}

pub(crate) fn list_attention(t: &str) -> String {
    format!(
        "select job_key, step, reason from {t} where state = 'attention'
         order by updated_at limit $1"
    )
}

/// The binding and decoding of the step statements, the same on every backend; expanded in
/// each backend's `impl StepStore`, where its types are concrete.
macro_rules! step_statements {
    () => {
        async fn step_start(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::steps::StepSql,
            start: &$crate::store::steps::StepStart<'_>,
        ) -> sqlx::Result<bool> {
            let done = sqlx::query(sqlx::AssertSqlSafe(sql.start.clone()))
                .bind(start.key)
                .bind(start.step)
                .bind(start.kind)
                .bind(&start.token.0[..])
                .bind($crate::time::duration_micros(start.lease))
                .execute(pool)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn step_read(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::steps::StepSql,
            key: &str,
            step: &str,
        ) -> sqlx::Result<Option<$crate::store::steps::StepRow>> {
            use sqlx::Row as _;
            let row = sqlx::query(sqlx::AssertSqlSafe(sql.read.clone()))
                .bind(key)
                .bind(step)
                .fetch_optional(pool)
                .await?;
            row.map(|row| {
                let remaining: i64 = row.try_get(2)?;
                let result: Option<sqlx::types::Json<serde_json::Value>> = row.try_get(3)?;
                Ok($crate::store::steps::StepRow {
                    state: row.try_get(0)?,
                    token: row.try_get(1)?,
                    remaining: std::time::Duration::from_micros(remaining.max(0) as u64),
                    result: result.map(|json| json.0),
                    reason: row.try_get(4)?,
                })
            })
            .transpose()
        }

        async fn step_update(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::steps::StepSql,
            key: &str,
            step: &str,
            token: &[u8],
            how: $crate::store::steps::StepUpdate<'_>,
            lease: std::time::Duration,
        ) -> sqlx::Result<bool> {
            use $crate::store::steps::StepUpdate;
            let statement = match how {
                StepUpdate::TakeOver(_) => &sql.take_over,
                StepUpdate::Done(_) => &sql.done,
                StepUpdate::Expire => &sql.expire,
                StepUpdate::Attention(_) => &sql.attention,
                StepUpdate::Forget => &sql.forget,
                StepUpdate::ResolveDone(_) => &sql.resolve_done,
                StepUpdate::ResolveNotDone => &sql.resolve_not_done,
            };
            let query = sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
                .bind(key)
                .bind(step);
            let query = match how {
                StepUpdate::ResolveDone(value) => query.bind(sqlx::types::Json(value)),
                StepUpdate::ResolveNotDone => query,
                StepUpdate::TakeOver(new) => query
                    .bind(token)
                    .bind(new.0.to_vec())
                    .bind($crate::time::duration_micros(lease)),
                StepUpdate::Done(value) => query.bind(token).bind(sqlx::types::Json(value)),
                StepUpdate::Attention(reason) => query.bind(token).bind(reason),
                StepUpdate::Expire | StepUpdate::Forget => query.bind(token),
            };
            Ok(query.execute(pool).await?.rows_affected() == 1)
        }

        async fn step_stale(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::steps::StepSql,
            limit: u32,
        ) -> sqlx::Result<Vec<$crate::store::steps::StaleClaim>> {
            let rows: Vec<(String, String, i32, Vec<u8>)> =
                sqlx::query_as(sqlx::AssertSqlSafe(sql.stale.clone()))
                    .bind(i64::from(limit))
                    .fetch_all(pool)
                    .await?;
            Ok(rows
                .into_iter()
                .map(
                    |(key, step, attempts, token)| $crate::store::steps::StaleClaim {
                        step: $crate::store::steps::StaleStep {
                            key,
                            step,
                            attempts,
                        },
                        token,
                    },
                )
                .collect())
        }

        async fn step_prunable(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::steps::StepSql,
            cutoff: i64,
        ) -> sqlx::Result<u64> {
            let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.prunable.clone()))
                .bind(cutoff)
                .fetch_one(pool)
                .await?;
            Ok(rows.max(0) as u64)
        }

        async fn step_prune(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::steps::StepSql,
            cutoff: i64,
            limit: u32,
        ) -> sqlx::Result<u64> {
            let done = sqlx::query(sqlx::AssertSqlSafe(sql.prune.clone()))
                .bind(cutoff)
                .bind(i64::from(limit))
                .execute(pool)
                .await?;
            Ok(done.rows_affected())
        }

        async fn step_attention_count(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::steps::StepSql,
        ) -> sqlx::Result<u64> {
            // The same statement on every backend.
            let count = format!(
                "select count(*) from {} where state = 'attention'",
                sql.table.quoted()
            );
            let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count))
                .fetch_one(pool)
                .await?;
            Ok(rows.max(0) as u64)
        }

        async fn step_attention(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::steps::StepSql,
            limit: u32,
        ) -> sqlx::Result<Vec<$crate::store::steps::AttentionStep>> {
            let rows: Vec<(String, String, Option<String>)> =
                sqlx::query_as(sqlx::AssertSqlSafe(sql.list_attention.clone()))
                    .bind(i64::from(limit))
                    .fetch_all(pool)
                    .await?;
            Ok(rows
                .into_iter()
                .map(|(key, step, reason)| $crate::store::steps::AttentionStep {
                    key,
                    step,
                    reason: reason.unwrap_or_default(),
                })
                .collect())
        }
    };
}
pub(crate) use step_statements;
