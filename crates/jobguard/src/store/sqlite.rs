//! The SQLite dialect of the store: [`Backend`] and the backend-wide [`Store`]; each concept's
//! store trait is implemented beside its statements in `sqlite/` (guard, queue, worker, outbox,
//! steps, offsets, prune, console), with the heartbeats that keep leases while the single
//! writer is busy (`heartbeat.rs`).
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
mod schedules;
mod steps;
mod worker;

use std::sync::Arc;

use sqlx::sqlite::Sqlite;
use sqlx::{AssertSqlSafe, Pool, Transaction};

use super::Backend;
use super::database::Store;
use crate::error::Error;
use crate::table::TableName;
use jobguard_core::transient::Transient;

/// Refuses a table name with a schema: SQLite has none.
pub(super) fn no_schema(table: &TableName) -> crate::Result<()> {
    match table.schema() {
        Some(schema) => Err(Error::InvalidName {
            what: "schema (SQLite has none)",
            name: schema.into(),
        }),
        None => Ok(()),
    }
}

/// The error of `alter table ... add column` for a column the table has.
fn is_duplicate_column(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|e| e.message().starts_with("duplicate column name"))
}

impl Backend for Sqlite {
    const BACKEND: &'static str = "sqlite";
}

impl Store for Sqlite {
    const SINGLE_WRITER: bool = true;

    async fn migrate_statements(
        pool: &Pool<Self>,
        _table: &TableName,
        statements: &[Arc<str>],
    ) -> sqlx::Result<()> {
        // `begin immediate` already makes concurrent migrations take turns.
        let mut tx = pool.begin_with("begin immediate").await?;
        for statement in statements {
            let done = sqlx::query(AssertSqlSafe(statement.clone()))
                .execute(&mut *tx)
                .await;
            match done {
                // SQLite has no `add column if not exists`: a column added by an earlier
                // migration fails this statement alone, and the transaction goes on.
                Err(error)
                    if jobguard_core::sql::queue_schema::is_optional_on_sqlite(statement)
                        && is_duplicate_column(&error) => {}
                done => {
                    done?;
                }
            }
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

    async fn listen(_pool: &Pool<Self>) -> sqlx::Result<Option<super::database::Wakeup>> {
        Ok(None)
    }

    fn transient(error: &sqlx::Error) -> Option<Transient> {
        // SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes.
        super::transient_in("sqlite", error)
    }
}
