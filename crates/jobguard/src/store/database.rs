//! What a backend does for every concept: run migrations, open the transaction a guarded job
//! runs in, wake idle workers, tell transient errors; and the rows every concept reads alike.
//! [`Store`] is the base of each concept's store trait.

use std::future::Future;
use std::sync::Arc;

use jobguard_core::transient::Transient;
use sqlx::{Database, Pool, Transaction};

use crate::table::TableName;

/// What is backend-wide, under every concept's store trait: how the backend runs migrations,
/// opens a guarded transaction, wakes idle workers and tells transient errors. Public in a
/// private module, so that no other crate can name it: with the concepts' traits (guard,
/// queue, worker, console, outbox, steps, offsets) it seals [`Backend`](super::Backend).
pub trait Store: Database {
    /// Whether the database admits one writing transaction at a time.
    const SINGLE_WRITER: bool;

    /// Runs `create ... if not exists` statements, one migration of `table` at a time.
    fn migrate_statements(
        pool: &Pool<Self>,
        table: &TableName,
        statements: &[Arc<str>],
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Opens the transaction a guarded job runs in.
    fn begin(
        pool: &Pool<Self>,
    ) -> impl Future<Output = sqlx::Result<Transaction<'static, Self>>> + Send;

    /// Opens the transaction a guarded job runs in on a connection the caller holds.
    fn begin_on(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = sqlx::Result<Transaction<'_, Self>>> + Send;

    /// A source of wake-ups for idle workers when jobs are enqueued, if the database has one.
    fn listen(pool: &Pool<Self>) -> impl Future<Output = sqlx::Result<Option<Wakeup>>> + Send;

    /// Whether rolling back and running the whole transaction again may succeed, and how: the
    /// dialect's table in [`jobguard_core::transient`] (by SQLSTATE or result code), which the
    /// Python package classifies by too, and a connection that broke.
    fn transient(error: &sqlx::Error) -> Option<Transient>;

    /// Serialization failures, deadlocks, locks not granted in time and busy databases: running
    /// the whole transaction again on the same connection may succeed.
    fn is_transient(error: &sqlx::Error) -> bool {
        Self::transient(error) == Some(Transient::Contention)
    }
}

/// How many rows of a table are in one state, as the queue's and the outbox's counts read them.
#[derive(Debug)]
pub struct StateCount {
    pub(crate) state: String,
    pub(crate) count: i64,
}

impl From<(String, i64)> for StateCount {
    fn from((state, count): (String, i64)) -> Self {
        StateCount { state, count }
    }
}

/// Wakes an idle worker when a job is enqueued (PostgreSQL's LISTEN/NOTIFY).
pub struct Wakeup(pub(crate) Box<dyn WakeupSource>);

pub(crate) trait WakeupSource: Send {
    /// Resolves at the next notification, or after an error has been logged and waited out.
    fn next(&mut self) -> futures::future::BoxFuture<'_, ()>;
}
