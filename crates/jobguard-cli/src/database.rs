//! Opening the database a command runs on, from a URL: PostgreSQL or an embedded SQLite file.

use std::time::Duration;

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
    pub async fn connect(url: &str, connections: u32) -> anyhow::Result<Self> {
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

/// The URL with its secrets replaced, for output and logs: the library's, shared with the
/// broker clients.
pub use jobguard::broker::redact;
