//! The SQLite backend.
//!
//! SQLite has one writer at a time. Guarded jobs open their transaction with `begin immediate`,
//! which takes the write lock up front, and connections made by [`connect`] wait for it through
//! a busy timeout, so concurrent deliveries queue instead of failing with `database is locked`.
//! WAL mode lets readers proceed while a job writes.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use crate::error::Error;
use crate::store::Store;

/// A [`Guard`](crate::Guard) on SQLite.
pub type SqliteGuard = crate::Guard<Sqlite>;

/// How long a connection waits for the write lock before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens a pool on a SQLite database set up for guarded jobs: created when missing, WAL
/// journal, `synchronous = normal` (durable across application crashes; WAL's usual trade-off
/// across power loss) and a [`BUSY_TIMEOUT`].
///
/// `url` is a `sqlite:` URL (`sqlite:jobs.db`, `sqlite::memory:` is refused: each connection
/// would see its own empty database).
///
/// ```no_run
/// # async fn demo() -> jobguard::Result<()> {
/// let pool = jobguard::sqlite::connect("sqlite:jobs.db", 8).await?;
/// let guard = jobguard::SqliteGuard::new(pool);
/// guard.migrate().await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str, max_connections: u32) -> crate::Result<SqlitePool> {
    let options = SqliteConnectOptions::from_str(url)?;
    if options.get_filename().as_os_str() == ":memory:" {
        return Err(Error::Database(sqlx::Error::Configuration(
            "an in-memory SQLite database is private to one connection; use a file".into(),
        )));
    }
    let options = options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(BUSY_TIMEOUT);
    // Two processes creating the same file at once can both try to switch it to WAL, and the
    // loser gets SQLITE_BUSY without waiting; once the file exists this cannot happen.
    let mut attempt = 0;
    loop {
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .connect_with(options.clone())
            .await;
        match pool {
            Err(error) if attempt < 10 && Sqlite::is_transient(&error) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
            }
            pool => return Ok(pool?),
        }
    }
}
