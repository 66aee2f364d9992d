//! The periodic schedules' state table (`<jobs table>_schedules`): one row per schedule with
//! the time of its last firing enqueued and the job that firing produced, written in the
//! transaction that enqueues the firing. The same text on both dialects (times are whole
//! seconds since the Unix epoch, in `bigint` columns), run by the Rust scheduler and the
//! Python package's alike, so `jobguard schedules` shows the schedules of both.
//!
//! ```
//! use jobguard_core::sql::schedules;
//! use jobguard_core::table::TableName;
//!
//! let table = schedules::table(&TableName::new("jobguard_jobs")?)?;
//! assert_eq!(table.name(), "jobguard_jobs_schedules");
//! assert!(schedules::advance(&table).contains("last_fired_at < $2"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::table::{NameError, TableName};

/// The schedules table of the jobs table `jobs`: `<jobs>_schedules`, in its schema.
pub fn table(jobs: &TableName) -> Result<TableName, NameError> {
    let table = TableName::new(&format!("{}_schedules", jobs.name()))?;
    match jobs.schema() {
        Some(schema) => table.in_schema(schema),
        None => Ok(table),
    }
}

/// Creates the table when missing; the columns are the same on both dialects.
pub fn create(table: &TableName) -> String {
    format!(
        "create table if not exists {} (
            name          text primary key,
            cron          text not null,
            zone          text not null,
            kind          text not null,
            queue         text not null,
            created_at    bigint not null,
            last_fired_at bigint,
            last_job_id   bigint,
            updated_at    bigint not null
        )",
        table.quoted()
    )
}

/// `$1` name, `$2` cron, `$3` zone, `$4` kind, `$5` queue, `$6` now: inserts the row, or
/// updates its definition; returns `(created_at, last_fired_at)`.
pub fn register(table: &TableName) -> String {
    format!(
        "insert into {t} (name, cron, zone, kind, queue, created_at, updated_at)
                 values ($1, $2, $3, $4, $5, $6, $6)
                 on conflict (name) do update
                 set cron = excluded.cron, zone = excluded.zone, kind = excluded.kind,
                     queue = excluded.queue, updated_at = excluded.updated_at
                 returning created_at, last_fired_at",
        t = table.quoted()
    )
}

/// `$1` name: `(created_at, last_fired_at)`.
pub fn read(table: &TableName) -> String {
    format!(
        "select created_at, last_fired_at from {} where name = $1",
        table.quoted()
    )
}

/// `$1` name, `$2` the firing's time, `$3` now: takes the firing for the transaction that runs
/// it, returning the schedule's name, or nothing when the schedule's last firing is at or after
/// `$2` (another scheduler took this firing, or a later one, first). The first statement of a
/// firing's transaction, before its job is enqueued: the firing's job is inserted only by the
/// transaction that moved the schedule to it, and the two commit together.
///
/// Why first, and in the same transaction: a scheduler that read the row, then stalled while
/// another fired the same time, whose job completed and was pruned, would find the firing's key
/// free again and enqueue it a second time; the row, not the job, is what remembers a firing.
/// On PostgreSQL the update locks the row: a second scheduler's waits for the first's commit,
/// then re-reads the row and takes nothing (or takes the firing, when the first rolled back).
/// On SQLite the firing's transaction holds the write lock from its start.
pub fn advance(table: &TableName) -> String {
    format!(
        "update {t}
                 set last_fired_at = $2, last_job_id = null, updated_at = $3
                 where name = $1 and (last_fired_at is null or last_fired_at < $2)
                 returning name",
        t = table.quoted()
    )
}

/// `$1` name, `$2` the firing's time, `$3` its job, `$4` now: records the job of the firing that
/// [`advance`] took, in the same transaction.
pub fn fired(table: &TableName) -> String {
    format!(
        "update {t}
                 set last_job_id = $3, updated_at = $4
                 where name = $1 and last_fired_at = $2",
        t = table.quoted()
    )
}

/// `$1` name, `$2` a firing's time: the job recorded for that firing, when it is the schedule's
/// last (the job a scheduler that found the firing taken reports).
pub fn firing_job(table: &TableName) -> String {
    format!(
        "select last_job_id from {} where name = $1 and last_fired_at = $2",
        table.quoted()
    )
}

/// Every row, by name: name, cron, zone, kind, queue, created_at, last_fired_at, last_job_id.
pub fn list(table: &TableName) -> String {
    format!(
        "select name, cron, zone, kind, queue, created_at, last_fired_at, last_job_id
                 from {} order by name",
        table.quoted()
    )
}
