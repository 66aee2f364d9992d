//! The PostgreSQL dialect of the store: [`Backend`] and the backend-wide [`Store`]; each
//! concept's store trait is implemented beside its statements in `postgres/` (guard, queue,
//! worker, outbox, steps, offsets, prune, console), each statement built once per table.
//!
//! Guarded jobs run in `read committed`, PostgreSQL's default: the guard row's primary key
//! makes concurrent deliveries of one key wait for each other, so no stronger isolation is
//! needed for the guard. Serialization failures (`40001`) and deadlocks (`40P01`) that the
//! job's own effect runs into are retried a bounded number of times.

mod console;
mod guard;
mod offsets;
mod outbox;
mod prune;
mod queue;
mod schedules;
mod steps;
mod worker;

use std::sync::Arc;

use futures::future::BoxFuture;
use sqlx::postgres::{PgListener, Postgres};
use sqlx::{AssertSqlSafe, Pool, Transaction};

use super::Backend;
use super::database::{Store, Wakeup, WakeupSource};
use crate::table::TableName;
use jobguard_core::sql::postgres as guard_sql;
use jobguard_core::transient::Transient;

/// Names the exact DDL a table was migrated with, stored as the table's comment.
fn schema_marker(statements: &[Arc<str>]) -> String {
    jobguard_core::sql::schema_marker(statements)
}

impl WakeupSource for PgListener {
    fn next(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // The listener reconnects by itself; after an error the worker's polling covers
            // the gap, so wait a little rather than spin.
            if let Err(error) = self.recv().await {
                tracing::debug!(%error, "the job notification listener failed; polling meanwhile");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        })
    }
}

impl Backend for Postgres {
    const BACKEND: &'static str = "postgres";
}

impl Store for Postgres {
    const SINGLE_WRITER: bool = false;

    async fn migrate_statements(
        pool: &Pool<Self>,
        table: &TableName,
        statements: &[Arc<str>],
    ) -> sqlx::Result<()> {
        // A schema already in place is left alone: `create index if not exists` would still
        // wait for every transaction writing the table, stalling a running queue.
        let marker = schema_marker(statements);
        let table_name = table.quoted();
        let migrated = guard_sql::MIGRATED;
        let done: Option<bool> = sqlx::query_scalar(migrated)
            .bind(&table_name)
            .bind(&marker)
            .fetch_one(pool)
            .await?;
        if done == Some(true) {
            return Ok(());
        }
        let mut tx = pool.begin().await?;
        // Workers starting together would race on `create ... if not exists`, which is not
        // atomic in PostgreSQL's catalog; one lock per table makes them take turns.
        sqlx::query(guard_sql::MIGRATE_LOCK)
            .bind(guard_sql::migrate_lock_key(table))
            .execute(&mut *tx)
            .await?;
        let done: Option<bool> = sqlx::query_scalar(migrated)
            .bind(&table_name)
            .bind(&marker)
            .fetch_one(&mut *tx)
            .await?;
        if done == Some(true) {
            return tx.commit().await;
        }
        sqlx::query(guard_sql::MIGRATE_LOCK_TIMEOUT)
            .execute(&mut *tx)
            .await?;
        for statement in statements {
            sqlx::query(AssertSqlSafe(statement.clone()))
                .execute(&mut *tx)
                .await?;
        }
        let comment = guard_sql::mark_migrated(table, &marker);
        sqlx::query(AssertSqlSafe(comment))
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }

    async fn begin(pool: &Pool<Self>) -> sqlx::Result<Transaction<'static, Self>> {
        pool.begin().await
    }

    async fn begin_on(conn: &mut Self::Connection) -> sqlx::Result<Transaction<'_, Self>> {
        sqlx::Connection::begin(conn).await
    }

    async fn listen(pool: &Pool<Self>) -> sqlx::Result<Option<Wakeup>> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(crate::store::queue::NOTIFY_CHANNEL).await?;
        Ok(Some(Wakeup(Box::new(listener))))
    }

    fn transient(error: &sqlx::Error) -> Option<Transient> {
        super::transient_in("postgres", error)
    }
}
