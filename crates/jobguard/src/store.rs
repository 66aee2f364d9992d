//! The small internal interface each database backend implements.
//!
//! [`Guard`](crate::Guard) holds the logic (claim first, effect second, commit both); a backend
//! only knows its SQL dialect, how to open a transaction that queues writers instead of failing
//! them, and which of its errors are worth retrying.

use std::future::Future;
use std::sync::Arc;

use sqlx::{Database, Pool, Transaction};

use crate::table::TableName;

pub(crate) mod console;
pub(crate) mod guard;
pub(crate) mod offsets;
pub(crate) mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
pub(crate) mod prune;
pub(crate) mod queue;
#[cfg(feature = "sqlite")]
mod sqlite;
pub(crate) mod steps;
pub(crate) mod worker;

mod writer;

pub use self::guard::GuardRecord;
pub(crate) use self::guard::{ClaimRow, ClaimToken, GuardSql, GuardStore, NewClaim};
pub(crate) use self::queue::QueueStore;
pub(crate) use self::worker::{WorkerSql, WorkerStatements, WorkerStore};
pub(crate) use writer::WriterLock;

/// A database jobguard can guard jobs on: [`sqlx::Postgres`] or [`sqlx::Sqlite`].
///
/// The trait is sealed: what jobguard calls on a backend is in supertraits private to the
/// crate.
pub trait Backend:
    Database
    + Store
    + GuardStore
    + QueueStore
    + WorkerStore
    + self::console::ConsoleStore
    + self::outbox::OutboxStore
    + self::steps::StepStore
    + self::offsets::OffsetStore
{
    /// The backend's name as shown to users: `postgres` or `sqlite`.
    const BACKEND: &'static str;
}

/// What is backend-wide, under every concept's store trait: how the backend runs migrations,
/// opens a guarded transaction, wakes idle workers and tells transient errors. Public in a
/// private module, so that no other crate can name it: with the concepts' traits (guard,
/// queue, worker, console, outbox, steps, offsets) it seals [`Backend`].
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

    /// Serialization failures, deadlocks and busy databases: rolling back and running the whole
    /// transaction again may succeed.
    fn is_transient(error: &sqlx::Error) -> bool;
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

/// Whether an error means the connection itself is gone, so it must not be used again.
pub(crate) fn is_connection_error(error: &sqlx::Error) -> bool {
    matches!(
        error,
        sqlx::Error::Io(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed
    )
}
