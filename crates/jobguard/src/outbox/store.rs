//! The outbox's interface to the backends: the statements each one builds from its table name,
//! and their binding and decoding, written once in [`outbox_statements`] and expanded in each
//! backend's `outbox_sql.rs`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sqlx::Pool;

use super::{MessageRow, OutboxMessage};
use crate::error::Result;
use crate::table::TableName;

/// The outbox's statements, built once from its validated table name.
#[doc(hidden)]
#[derive(Debug)]
pub struct OutboxSql {
    pub(crate) table: TableName,
    pub(crate) create: Vec<Arc<str>>,
    pub(crate) publish: Arc<str>,
    pub(crate) fingerprint: Arc<str>,
    pub(crate) due: Arc<str>,
    pub(crate) sent: Arc<str>,
    pub(crate) retry: Arc<str>,
    pub(crate) dead: Arc<str>,
    pub(crate) take_lease: Arc<str>,
    pub(crate) release_lease: Arc<str>,
    pub(crate) counts: Arc<str>,
    pub(crate) list: Arc<str>,
    pub(crate) replay: Arc<str>,
    pub(crate) prune: Arc<str>,
}

/// The values of a message about to be written.
#[doc(hidden)]
#[derive(Debug)]
pub struct NewMessage<'a> {
    pub(crate) id: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) payload: &'a Value,
    pub(crate) fingerprint: &'a [u8; 32],
}

/// A due message read by the relay, with its place in the outbox.
#[doc(hidden)]
#[derive(Debug)]
pub struct DueMessage {
    pub(crate) seq: i64,
    pub(crate) message: OutboxMessage,
}

/// How a delivery attempt ends for its row.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum Settle<'a> {
    Sent,
    Retry { delay: Duration, error: &'a str },
    Dead { error: &'a str },
}

/// The outbox statements each backend implements. Their SQL is in the backend's
/// `outbox_sql.rs`; their binding, the same for every backend, in [`outbox_statements`].
#[doc(hidden)]
pub trait OutboxStore: sqlx::Database {
    #[doc(hidden)]
    fn outbox_sql(table: &TableName) -> Result<OutboxSql>;

    /// Inserts a message; false when its id is already in the outbox.
    #[doc(hidden)]
    fn publish(
        conn: &mut Self::Connection,
        sql: &OutboxSql,
        message: &NewMessage<'_>,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    #[doc(hidden)]
    fn published_fingerprint(
        conn: &mut Self::Connection,
        sql: &OutboxSql,
        id: &str,
    ) -> impl Future<Output = sqlx::Result<Option<Vec<u8>>>> + Send;

    #[doc(hidden)]
    fn due(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        limit: u32,
    ) -> impl Future<Output = sqlx::Result<Vec<DueMessage>>> + Send;

    /// Records how a delivery ended; false when the message was no longer pending.
    #[doc(hidden)]
    fn settle_message(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        seq: i64,
        how: Settle<'_>,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Takes or renews the relay lease; false when another holder has it.
    #[doc(hidden)]
    fn take_lease(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        holder: &str,
        lease: Duration,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    #[doc(hidden)]
    fn release_lease(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        holder: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    #[doc(hidden)]
    fn outbox_counts(
        pool: &Pool<Self>,
        sql: &OutboxSql,
    ) -> impl Future<Output = sqlx::Result<Vec<(String, i64)>>> + Send;

    #[doc(hidden)]
    fn outbox_list(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        state: Option<&str>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<MessageRow>>> + Send;

    #[doc(hidden)]
    fn outbox_replay(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        id: Option<&str>,
    ) -> impl Future<Output = sqlx::Result<Vec<String>>> + Send;

    #[doc(hidden)]
    fn outbox_prune(
        pool: &Pool<Self>,
        sql: &OutboxSql,
        older_than: Duration,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

/// The outbox statements whose binding and decoding are the same on every backend: only their
/// SQL differs, and that comes from the backend's [`OutboxSql`]. Expanded inside each
/// `impl OutboxStore`, where the backend's `Row` and `Connection` types are concrete. Times
/// come back as microseconds since the Unix epoch; durations go in as microseconds.
macro_rules! outbox_statements {
    () => {
        async fn publish(
            conn: &mut Self::Connection,
            sql: &$crate::outbox::OutboxSql,
            message: &$crate::outbox::NewMessage<'_>,
        ) -> sqlx::Result<bool> {
            let seq: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.publish.clone()))
                .bind(message.id)
                .bind(message.topic)
                .bind(sqlx::types::Json(message.payload))
                .bind(message.fingerprint.as_slice())
                .fetch_optional(conn)
                .await?;
            Ok(seq.is_some())
        }

        async fn published_fingerprint(
            conn: &mut Self::Connection,
            sql: &$crate::outbox::OutboxSql,
            id: &str,
        ) -> sqlx::Result<Option<Vec<u8>>> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.fingerprint.clone()))
                .bind(id)
                .fetch_optional(conn)
                .await
        }

        async fn due(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::outbox::OutboxSql,
            limit: u32,
        ) -> sqlx::Result<Vec<$crate::outbox::DueMessage>> {
            use sqlx::Row as _;
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.due.clone()))
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.into_iter()
                .map(|row| {
                    let payload: sqlx::types::Json<serde_json::Value> = row.try_get(3)?;
                    let attempts: i32 = row.try_get(4)?;
                    Ok($crate::outbox::DueMessage {
                        seq: row.try_get(0)?,
                        message: $crate::outbox::OutboxMessage {
                            id: $crate::outbox::MessageId::from_stored(row.try_get(1)?),
                            topic: row.try_get(2)?,
                            payload: payload.0,
                            attempt: u32::try_from(attempts).unwrap_or(0).saturating_add(1),
                            created_at: $crate::time::micros_to_time(row.try_get(5)?),
                        },
                    })
                })
                .collect()
        }

        async fn settle_message(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::outbox::OutboxSql,
            seq: i64,
            how: $crate::outbox::Settle<'_>,
        ) -> sqlx::Result<bool> {
            use $crate::outbox::Settle;
            let statement = match how {
                Settle::Sent => &sql.sent,
                Settle::Retry { .. } => &sql.retry,
                Settle::Dead { .. } => &sql.dead,
            };
            let query = sqlx::query(sqlx::AssertSqlSafe(statement.clone())).bind(seq);
            let query = match how {
                Settle::Sent => query,
                Settle::Retry { delay, error } => {
                    query.bind($crate::time::duration_micros(delay)).bind(error)
                }
                Settle::Dead { error } => query.bind(error),
            };
            Ok(query.execute(pool).await?.rows_affected() == 1)
        }

        async fn take_lease(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::outbox::OutboxSql,
            holder: &str,
            lease: std::time::Duration,
        ) -> sqlx::Result<bool> {
            let held: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.take_lease.clone()))
                .bind(holder)
                .bind($crate::time::duration_micros(lease))
                .fetch_optional(pool)
                .await?;
            Ok(held.is_some())
        }

        async fn release_lease(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::outbox::OutboxSql,
            holder: &str,
        ) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(sql.release_lease.clone()))
                .bind(holder)
                .execute(pool)
                .await?;
            Ok(())
        }

        async fn outbox_counts(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::outbox::OutboxSql,
        ) -> sqlx::Result<Vec<(String, i64)>> {
            sqlx::query_as(sqlx::AssertSqlSafe(sql.counts.clone()))
                .fetch_all(pool)
                .await
        }

        async fn outbox_list(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::outbox::OutboxSql,
            state: Option<&str>,
            limit: u32,
        ) -> $crate::Result<Vec<$crate::outbox::MessageRow>> {
            use sqlx::Row as _;
            use $crate::time::micros_to_time;
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.list.clone()))
                .bind(state)
                .bind(i64::from(limit))
                .fetch_all(pool)
                .await?;
            rows.into_iter()
                .map(|row| {
                    let state: String = row.try_get(2)?;
                    let sent_at: Option<i64> = row.try_get(7)?;
                    let payload: sqlx::types::Json<serde_json::Value> = row.try_get(8)?;
                    Ok($crate::outbox::MessageRow {
                        id: $crate::outbox::MessageId::from_stored(row.try_get(0)?),
                        topic: row.try_get(1)?,
                        state: state.parse()?,
                        attempts: row.try_get(3)?,
                        next_attempt_at: micros_to_time(row.try_get(4)?),
                        last_error: row.try_get(5)?,
                        created_at: micros_to_time(row.try_get(6)?),
                        sent_at: sent_at.map(micros_to_time),
                        payload: payload.0,
                    })
                })
                .collect()
        }

        async fn outbox_replay(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::outbox::OutboxSql,
            id: Option<&str>,
        ) -> sqlx::Result<Vec<String>> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.replay.clone()))
                .bind(id)
                .fetch_all(pool)
                .await
        }

        async fn outbox_prune(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::outbox::OutboxSql,
            older_than: std::time::Duration,
        ) -> sqlx::Result<u64> {
            let done = sqlx::query(sqlx::AssertSqlSafe(sql.prune.clone()))
                .bind($crate::time::duration_micros(older_than))
                .execute(pool)
                .await?;
            Ok(done.rows_affected())
        }
    };
}
pub(crate) use outbox_statements;
