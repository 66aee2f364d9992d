//! Opening the database a command runs on, from a URL: PostgreSQL or an embedded SQLite file.
//!
//! Every command opens its database with [`Database::connect`] and runs its generic body on
//! whichever pool it got with [`on_pool!`](crate::on_pool). The commands that run until
//! stopped (`worker`, `consume`, `relay`, `serve`) go through [`Startup`] instead, which waits
//! for a database that is not up yet; one-shot commands fail at once.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::sqlite::SqlitePool;

/// Where commands run when no `--database-url` or `DATABASE_URL` is given.
pub const DEFAULT_URL: &str = "sqlite:jobguard-demo.db";

/// A connected database of either backend.
pub enum Database {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

impl Database {
    /// Connects with a pool of `connections`, with errors that say what to do.
    ///
    /// Two processes opening a new SQLite file at the same moment (a worker and an enqueue
    /// started together) race to switch it to WAL, and the loser fails at once with "database
    /// is locked" whatever the busy timeout; opening again then succeeds.
    pub async fn connect(url: &str, connections: u32) -> anyhow::Result<Self> {
        let mut tries = 0;
        loop {
            match Self::open(url, connections).await {
                Err(error) if tries < 10 && is_locked(&error) => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(20 * tries)).await;
                }
                result => return result,
            }
        }
    }

    async fn open(url: &str, connections: u32) -> anyhow::Result<Self> {
        let shown = redact(url);
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let hint = || {
                format!(
                    "cannot connect to PostgreSQL at {shown}: is it running, and does the URL \
                     name an existing database?"
                )
            };
            // One direct connection first: a pool retries refused connections until its
            // acquire timeout, which makes a wrong URL look like a hang.
            let options: PgConnectOptions = url.parse().with_context(hint)?;
            PgConnection::connect_with(&options)
                .await
                .with_context(hint)?
                .close()
                .await?;
            let pool = PgPoolOptions::new()
                .max_connections(connections)
                .min_connections(connections.min(4))
                .acquire_timeout(Duration::from_secs(30))
                .connect_with(options)
                .await
                .with_context(hint)?;
            Ok(Database::Postgres(pool))
        } else if url.starts_with("sqlite:") {
            let pool = jobguard::sqlite::connect(url, connections)
                .await
                .with_context(|| format!("cannot open the SQLite database {shown}"))?;
            Ok(Database::Sqlite(pool))
        } else {
            bail!(
                "unsupported database URL `{shown}`: use postgres://user@host/db or sqlite:path.db"
            )
        }
    }
}

/// A long-running command's patience with its database at startup: while the server refuses
/// connections, is starting up or recovering, or cuts them as it goes down (a restart, a
/// failover, a deploy that starts the workers before the database), the startup is tried again
/// with backoff, a line on stderr each time, until `timeout` has passed since the command began.
pub struct Startup {
    shown: String,
    timeout: Duration,
    deadline: Instant,
}

impl Startup {
    /// The first delay between tries; it doubles up to [`Startup::MAX_DELAY`].
    const FIRST_DELAY: Duration = Duration::from_millis(250);
    const MAX_DELAY: Duration = Duration::from_secs(5);

    /// Patience of `timeout` (`--connect-timeout`) from now with the database at `url`.
    pub fn new(url: &str, timeout: Duration) -> Self {
        Startup {
            shown: redact(url),
            timeout,
            deadline: Instant::now() + timeout,
        }
    }

    /// Connects as [`Database::connect`] does, waiting for a database that is not up yet.
    pub async fn connect(&self, url: &str, connections: u32) -> anyhow::Result<Database> {
        self.retry(|| Database::connect(url, connections)).await
    }

    /// Runs `step` (connecting, creating tables: anything safe to run again) until it succeeds,
    /// fails for another reason than an unreachable database, or the patience runs out.
    pub async fn retry<T, F, Fut>(&self, mut step: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let mut delay = Self::FIRST_DELAY;
        loop {
            let error = match step().await {
                Ok(value) => return Ok(value),
                Err(error) if is_unreachable(&error) => error,
                Err(error) => return Err(error),
            };
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let timeout = humantime::format_duration(self.timeout);
                return Err(error.context(format!(
                    "gave up waiting for the database at {} after {timeout} (--connect-timeout)",
                    self.shown
                )));
            }
            let wait = delay.min(left);
            eprintln!(
                "jobguard: the database at {} is not reachable yet ({}); trying again in {} \
                 ({} left of --connect-timeout)",
                self.shown,
                error.root_cause(),
                humantime::format_duration(millis(wait)),
                humantime::format_duration(millis(left))
            );
            tokio::time::sleep(wait).await;
            delay = (delay * 2).min(Self::MAX_DELAY);
        }
    }
}

/// `duration` to the millisecond, for messages.
fn millis(duration: Duration) -> Duration {
    Duration::from_millis(duration.as_millis() as u64)
}

/// Whether the error says the database server cannot be reached or is not ready yet, rather
/// than that the URL, the credentials or the schema are wrong: the connection was refused,
/// reset or cut (I/O errors, the pool's acquire timing out), or PostgreSQL answered that it
/// is shutting down or starting up (SQLSTATE class 57P) or lost the connection (class 08).
fn is_unreachable(error: &anyhow::Error) -> bool {
    error
        .chain()
        .filter_map(|cause| cause.downcast_ref::<sqlx::Error>())
        .any(|error| match error {
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|code| {
                matches!(code.as_ref(), "57P01" | "57P02" | "57P03") || code.starts_with("08")
            }),
            _ => false,
        })
}

/// The URL with its secrets replaced, for output and logs: jobguard-core's, which the
/// library's broker clients use too.
pub use jobguard_core::url::redact;

/// Runs `$body` with `$pool` bound to the pool of whichever backend `$database` holds: the
/// body's generic code is compiled once per backend.
#[macro_export]
macro_rules! on_pool {
    ($database:expr, $pool:ident => $body:expr) => {
        match $database {
            $crate::database::Database::Postgres($pool) => $body,
            $crate::database::Database::Sqlite($pool) => $body,
        }
    };
}

/// Whether SQLite answered SQLITE_BUSY ("database is locked").
fn is_locked(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<sqlx::Error>(),
            Some(sqlx::Error::Database(db)) if db.code().as_deref() == Some("5")
        )
    })
}

/// Whether the error says the table read does not exist yet.
pub fn is_missing_table(error: &jobguard::Error) -> bool {
    let jobguard::Error::Database(sqlx::Error::Database(db)) = error else {
        return false;
    };
    // PostgreSQL's undefined_table, SQLite's generic error with its message.
    db.code().as_deref() == Some("42P01") || db.message().contains("no such table")
}

/// PostgreSQL's undefined_column, SQLite's generic error with its message: a table made by an
/// earlier version, before a migration added the column.
pub fn is_missing_column(error: &jobguard::Error) -> bool {
    let jobguard::Error::Database(sqlx::Error::Database(db)) = error else {
        return false;
    };
    db.code().as_deref() == Some("42703") || db.message().contains("has no column named")
}

/// A read on the queue, with a clear error when there is no queue yet.
pub fn read_error(error: jobguard::Error, database: &str) -> anyhow::Error {
    if is_missing_table(&error) {
        anyhow::anyhow!(
            "there is no job queue in {database} yet (table `{}` is missing): check \
             --database-url, or create it with `jobguard enqueue` or `jobguard worker`",
            jobguard::Queue::<sqlx::Sqlite>::DEFAULT_TABLE
        )
    } else {
        anyhow::Error::new(error).context(format!("cannot read the job queue in {database}"))
    }
}
