//! The small internal interface each database backend implements.
//!
//! [`Guard`](crate::Guard) holds the logic (claim first, effect second, commit both); a backend
//! only knows its SQL dialect, how to open a transaction that queues writers instead of failing
//! them, and which of its errors are worth retrying.

use jobguard_core::transient::Transient;
use sqlx::Database;

pub(crate) mod console;
pub(crate) mod database;
pub(crate) mod guard;
pub(crate) mod offsets;
pub(crate) mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
pub(crate) mod prune;
pub(crate) mod queue;
pub(crate) mod schedules;
#[cfg(feature = "sqlite")]
mod sqlite;
pub(crate) mod steps;
pub(crate) mod worker;

mod writer;

pub use self::database::Wakeup;
pub(crate) use self::database::{StateCount, Store};
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
    + self::schedules::ScheduleStore
{
    /// The backend's name as shown to users: `postgres` or `sqlite`.
    const BACKEND: &'static str;
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

/// How `error` on `dialect` may pass when the transaction runs again: the core's table for the
/// error's code, or a connection that broke.
pub(crate) fn transient_in(dialect: &str, error: &sqlx::Error) -> Option<Transient> {
    if is_connection_error(error) {
        return Some(Transient::Connection);
    }
    let code = error.as_database_error()?.code()?;
    jobguard_core::transient::classify(dialect, &code)
}

/// PostgreSQL's undefined_table, or SQLite's "no such table": a read of a table nothing has
/// created yet.
pub(crate) fn is_missing_table(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    db.code().as_deref() == Some("42P01") || db.message().contains("no such table")
}
