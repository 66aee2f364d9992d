//! The SQLite dialect of the store: the [`Backend`] implementation, with its statements named
//! by concept in `sqlite/` (guard, queue, outbox, steps, the worker's batch) and the heartbeats that keep leases
//! while the single writer is busy.
//!
//! SQLite has one writer at a time. Guarded jobs open their transaction with `begin immediate`,
//! which takes the write lock up front, and connections made by [`connect`] wait for it through
//! a busy timeout, so concurrent deliveries queue instead of failing with `database is locked`.
//! WAL mode lets readers proceed while a job writes.

mod console;
mod guard;
mod heartbeat;
mod offsets;
mod outbox;
mod prune;
mod queue;
mod steps;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::Sqlite;
use sqlx::{AssertSqlSafe, Pool, Transaction};

use super::queue::Lease;
use super::queue::{NewJob, QueueSql};
use super::{Backend, ClaimRow, GuardSql, NewClaim, Store, WorkerSql};
use crate::error::Error;
use crate::table::TableName;

/// Refuses a table name with a schema: SQLite has none.
fn no_schema(table: &TableName) -> crate::Result<()> {
    match table.schema() {
        Some(schema) => Err(Error::InvalidName {
            what: "schema (SQLite has none)",
            name: schema.into(),
        }),
        None => Ok(()),
    }
}

impl Backend for Sqlite {
    const BACKEND: &'static str = "sqlite";
}

impl Store for Sqlite {
    const SINGLE_WRITER: bool = true;

    crate::store::table_sql!(no_schema);

    async fn migrate_statements(
        pool: &Pool<Self>,
        _table: &TableName,
        statements: &[Arc<str>],
    ) -> sqlx::Result<()> {
        // `begin immediate` already makes concurrent migrations take turns.
        let mut tx = pool.begin_with("begin immediate").await?;
        for statement in statements {
            sqlx::query(AssertSqlSafe(statement.clone()))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }

    async fn begin(pool: &Pool<Self>) -> sqlx::Result<Transaction<'static, Self>> {
        // A deferred transaction would take the write lock at its first write, and in WAL mode
        // fail with SQLITE_BUSY instead of waiting when another writer got there first.
        pool.begin_with("begin immediate").await
    }

    async fn begin_on(conn: &mut Self::Connection) -> sqlx::Result<Transaction<'_, Self>> {
        sqlx::Connection::begin_with(conn, "begin immediate").await
    }

    async fn claim(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        claim: &NewClaim<'_>,
    ) -> sqlx::Result<ClaimRow> {
        let row = sqlx::query(AssertSqlSafe(sql.claim.clone()))
            .bind(claim.key)
            .bind(claim.kind)
            .bind(claim.fingerprint.map(|f| f.as_bytes().as_slice()))
            .bind(claim.token.0.as_slice())
            .fetch_optional(&mut *conn)
            .await?;
        if row.is_some() {
            return Ok(ClaimRow::Claimed);
        }
        // Under `begin immediate` no other writer runs, so the row read is the one that
        // conflicted, unless it was deleted before this transaction began.
        Ok(match Self::fetch_record(conn, sql, claim.key).await? {
            Some(record) => ClaimRow::Held(record),
            None => ClaimRow::Vanished,
        })
    }

    fn worker_sql(guard: &GuardSql, queue: &QueueSql) -> WorkerSql {
        worker::worker_sql(&guard.table, &queue.table)
    }

    async fn claim_completing_many(
        conn: &mut Self::Connection,
        sql: (&GuardSql, &QueueSql, &WorkerSql),
        claims: &[(NewClaim<'_>, Lease)],
    ) -> sqlx::Result<Vec<Option<ClaimRow>>> {
        worker::claim_completing_many(conn, sql, claims).await
    }

    crate::store::shared_statements!();

    async fn enqueue_many(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        jobs: &[&NewJob],
    ) -> sqlx::Result<Vec<(i64, String)>> {
        queue::enqueue_many(conn, sql, jobs).await
    }

    async fn live_jobs(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        keys: &[&str],
    ) -> sqlx::Result<Vec<crate::store::LiveJob>> {
        queue::live_jobs(conn, sql, keys).await
    }

    fn beat_aside(
        pool: &Pool<Self>,
        sql: &crate::store::queue::QueueSql,
        lease: crate::store::queue::Lease,
        by: Duration,
    ) -> Option<std::io::Result<()>> {
        let until = std::time::SystemTime::now() + by;
        heartbeat::Heartbeats::of(pool, &sql.table).map(|files| files.beat(lease, until))
    }

    fn held_aside(pool: &Pool<Self>, sql: &crate::store::queue::QueueSql) -> Vec<String> {
        heartbeat::Heartbeats::of(pool, &sql.table)
            .map(|files| files.holding(std::time::SystemTime::now()))
            .unwrap_or_default()
    }

    fn forget_aside(
        pool: &Pool<Self>,
        sql: &crate::store::queue::QueueSql,
        lease: crate::store::queue::Lease,
    ) {
        if let Some(files) = heartbeat::Heartbeats::of(pool, &sql.table) {
            files.forget(lease);
        }
    }

    async fn listen(_pool: &Pool<Self>) -> sqlx::Result<Option<crate::store::Wakeup>> {
        Ok(None)
    }

    fn is_transient(error: &sqlx::Error) -> bool {
        // SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes.
        let code = error.as_database_error().and_then(|e| e.code());
        code.and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| matches!(c & 0xff, 5 | 6))
    }
}
