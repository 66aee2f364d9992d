//! Operations commands over the library's queue and worker: `jobguard worker`, `enqueue`,
//! `jobs` and `dead list|replay`. One file per command; what they share is here.

mod consume;
mod dead;
mod enqueue;
mod outbox;
mod prune;
mod relay;
mod retention;
pub mod stats;
mod status;
mod steps;
mod worker;

use std::time::{Duration, SystemTime};

use clap::Args;
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};

use crate::database::{DEFAULT_URL, Database};

pub use consume::{ConsumeArgs, consume};
pub use dead::{DeadCommand, dead};
pub use enqueue::{EnqueueArgs, enqueue};
pub use outbox::{OutboxCommand, outbox};
pub use prune::{PruneArgs, prune};
pub use relay::{RelayArgs, relay};
pub use retention::{RetentionArgs, retention};
pub use stats::{StatsArgs, stats};
pub use status::{JobsArgs, jobs};
pub use steps::{StepsCommand, steps};
pub use worker::{WorkerArgs, worker};

/// Where a command runs and how it prints.
#[derive(Args, Debug)]
pub struct Target {
    /// postgres://user@host/db, or sqlite:path.db for an embedded database.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    database_url: String,
    /// Print JSON on stdout instead of tables.
    #[arg(long)]
    json: bool,
}

/// Parses `30s`, `500ms`, `2m`, `1h 30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|error| format!("{error}: write a duration such as 30s, 500ms or 2m"))
}

/// Opens the database of a command.
///
/// Two processes opening a new SQLite file at the same moment (a worker and an enqueue
/// started together) race to switch it to WAL, and the loser fails at once with "database is
/// locked" whatever the busy timeout; opening again then succeeds.
async fn connect(url: &str, connections: u32) -> anyhow::Result<Database> {
    let mut tries = 0;
    loop {
        match Database::connect(url, connections).await {
            Err(error) if tries < 10 && is_locked(&error) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20 * tries)).await;
            }
            result => return result,
        }
    }
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

/// Whether the error says the queue table does not exist yet.
fn is_missing_table(error: &jobguard::Error) -> bool {
    let jobguard::Error::Database(sqlx::Error::Database(db)) = error else {
        return false;
    };
    // PostgreSQL's undefined_table, SQLite's generic error with its message.
    db.code().as_deref() == Some("42P01") || db.message().contains("no such table")
}

/// A read on the queue, with a clear error when there is no queue yet.
fn read_error(error: jobguard::Error, database: &str) -> anyhow::Error {
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

/// A table in the style of the demo's report.
fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    table
}

/// A time by the database clock, to the second, in UTC.
fn time(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// `text` cut to `max` characters.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(max.saturating_sub(1)).collect();
    short.push('…');
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        let error = parse_duration("30").unwrap_err();
        assert!(error.contains("such as 30s"), "{error}");
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn long_text_is_shortened() {
        assert_eq!(shorten("abc", 3), "abc");
        assert_eq!(shorten("abcdef", 4), "abc…");
    }
}
