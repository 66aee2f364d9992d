//! The queue's tables: the statements that create a jobs table and bring one made by an
//! earlier jobguard up to date, shared by both dialects. The Rust `Queue::migrate` and the
//! Python package's `App.migrate` run this same list (each dialect's `queue::create`), so a
//! table either makes is the other's, and the marker PostgreSQL leaves on it (a hash of the
//! statements) tells both that it is migrated.

use crate::sql::{LIVE_STATES, keeps_key};
use crate::table::TableName;

/// Statements that bring a jobs table from an earlier schema to this one, run by every
/// migration after the table's own statements (each does nothing the second time): the index
/// of `running` leases is gone.
///
/// Jobs a worker of the earlier schema leased, stored `running`, are left as they are: that
/// worker may still be running one (a rolling upgrade), and its heartbeat and its completion
/// name the stored state `running`, so a migration that rewrote the state would fence it off a
/// job it holds and roll its effect back. Such a job is counted and listed as running
/// ([`LEGACY_RUNNING`](crate::sql::LEGACY_RUNNING)), its worker completes it as before, and
/// once its lease expired (the worker died or was stopped) the rescue gives it back.
pub fn job_upgrades(table: &TableName) -> Vec<String> {
    vec![format!(
        "drop index if exists {}",
        table.derived_qualified("leases")
    )]
}

/// The columns of the unique-job policies, added to a jobs table made before them: `add` is
/// the dialect's `add column` (PostgreSQL's with `if not exists`; SQLite has none, and its
/// migration skips a column already there: see [`is_optional_on_sqlite`]). After the table,
/// before [`job_indexes`].
pub fn unique_columns(table: &TableName, add: &str) -> Vec<String> {
    let t = table.quoted();
    vec![
        // The finished states in which the job keeps its key (`jobguard_core::sql::KEEP_*`
        // bits); 0, the default, for live states only.
        format!("alter table {t} {add} unique_states integer not null default 0"),
        // How many times an enqueue replaced the job's payload and run time while it waited.
        format!("alter table {t} {add} replaced integer not null default 0"),
    ]
}

/// Whether a migration statement on SQLite may fail with `duplicate column name` and the
/// migration go on: SQLite has no `add column if not exists`, so a column an earlier migration
/// added fails its `alter table` alone.
pub fn is_optional_on_sqlite(statement: &str) -> bool {
    statement.starts_with("alter table")
}

/// The indexes of a jobs table, the same statements on both backends (their SQL is common to
/// PostgreSQL and SQLite), created after the table itself and its [`unique_columns`].
pub fn job_indexes(table: &TableName) -> Vec<String> {
    let t = table.quoted();
    let live = LIVE_STATES;
    vec![
        // One live job per key: a producer that enqueues the same work twice gets the job
        // that is already waiting or running, enforced by the index, not a check-then-insert.
        format!(
            "create unique index if not exists {} on {t} (job_key) where {live}",
            table.derived("live_key")
        ),
        // One job per key among the jobs enqueued with a unique policy that keeps the key past
        // the live states, in the states their own `unique_states` names: a repeated enqueue of
        // a key whose job completed (or died) under such a policy inserts nothing. Jobs without
        // one are not in it, and cost nothing more to insert.
        format!(
            "create unique index if not exists {} on {t} (job_key) where {}",
            table.derived("kept_key"),
            keeps_key()
        ),
        format!(
            "create index if not exists {} on {t} (queue, run_at, id) where state = 'available'",
            table.derived("fetch")
        ),
        // Pruning finished jobs takes the oldest of one state in batches, and counts stop after
        // a bounded number of them: both walk this index, never the whole table. Not partial:
        // the prune names its state as a parameter, which a partial index's predicate cannot
        // match in a generic plan (and SQLite matches only a predicate the query repeats).
        format!(
            "create index if not exists {} on {t} (state, finished_at)",
            table.derived("finished")
        ),
        // Replay finds a key's newest dead job, and the dead jobs of a kind, without a scan per
        // dead row.
        format!(
            "create index if not exists {} on {t} (job_key, id) where state = 'dead'",
            table.derived("dead_key")
        ),
        format!(
            "create index if not exists {} on {t} (kind, id) where state = 'dead'",
            table.derived("dead_kind")
        ),
        // The console lists jobs newest first, by state, kind, queue or key, a page at a time:
        // each filter walks its own index backwards from where the last page ended.
        format!(
            "create index if not exists {} on {t} (state, id)",
            table.derived("state_id")
        ),
        format!(
            "create index if not exists {} on {t} (kind, id)",
            table.derived("kind_id")
        ),
        format!(
            "create index if not exists {} on {t} (queue, id)",
            table.derived("queue_id")
        ),
        format!(
            "create index if not exists {} on {t} (job_key, id)",
            table.derived("key_id")
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::keeps_key_finished;

    #[test]
    fn the_indexes_follow_the_columns_they_name() {
        let table = TableName::new("jobguard_jobs").unwrap();
        let kept = &job_indexes(&table)[1];
        assert!(kept.contains("unique_states <> 0"));
        assert!(kept.contains(&keeps_key_finished("")));
    }
}
