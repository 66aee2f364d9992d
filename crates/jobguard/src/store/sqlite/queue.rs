//! The job queue's SQL for SQLite. Times are integer microseconds since the Unix epoch by the
//! database clock; durations arrive as microseconds.

use jobguard_core::sql::sqlite::NOW_MICROS as NOW;
use jobguard_core::sql::sqlite::queue as core;
use jobguard_core::sql::sqlite::worker::{self, Scope};
use std::time::Duration;

use super::heartbeat;
use sqlx::{AssertSqlSafe, Pool};

use sqlx::sqlite::Sqlite;

use crate::store::queue::sql::{DialectStatements, QueueDialect};
use crate::store::queue::{
    HELD, Holder, HolderColumns, InsertedJob, Lease, NewJob, QueueSql, QueueStore, STATE,
};
use crate::table::TableName;
use crate::time::duration_micros;

/// What the queue's shared statements need to know of SQLite: times are integers already.
pub(super) const DIALECT: QueueDialect = QueueDialect {
    now: NOW,
    plus_micros: "",
    as_micros: str::to_owned,
    int8: "",
    text: "",
    // The span of ids: two lookups of the rowid's ends (SQLite reads `min` and `max` from the
    // b-tree only one at a time).
    estimated_total: |t| {
        format!("coalesce((select max(id) from {t}) - (select min(id) from {t}) + 1, 0)")
    },
};

pub(crate) fn queue_sql(table: &TableName) -> QueueSql {
    let t = table.quoted();
    let live = jobguard_core::sql::LIVE_STATES;
    QueueSql::new(
        table,
        &DIALECT,
        DialectStatements {
            // The tables' statements are the core's, which the Python package migrates with too.
            create: core::create(table),
            // The single enqueue is shared with the Python package: one text for both.
            enqueue: core::enqueue(table),
            enqueue_unique: core::enqueue_unique(table),
            // A batch in one statement and one bound parameter: a JSON array of
            // `[kind, key, queue, payload, max_attempts, delay]` rows, so neither the statement nor
            // SQLite's limit on bound parameters depends on the batch size. The payload travels as
            // a JSON string whose text is stored as is. `on conflict do nothing`, against either
            // unique index (live key, kept key), leaves out each key a job holds, and `returning`
            // names the rows inserted. (`where true`: SQLite would read `on conflict` after a bare `from` as a
            // join's `on`.)
            enqueue_many: format!(
                "insert into {t}
                 (kind, job_key, queue, payload, state, max_attempts, run_at, created_at,
                  unique_states)
             select json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                    json_extract(value, '$[2]'), json_extract(value, '$[3]'), 'available',
                    json_extract(value, '$[4]'), {NOW} + json_extract(value, '$[5]'), {NOW},
                    json_extract(value, '$[6]')
             from json_each($1) where true
             on conflict do nothing
             returning id, job_key"
            ),
            holders: format!(
                "select id, job_key, kind, payload, {STATE}, {live} from {t}
             where job_key in (select value from json_each($1)) and ({live} or {kept})",
                kept = jobguard_core::sql::keeps_key_finished("")
            ),
            fetch: worker::fetch(table, Scope::Queue),
            fetch_after: worker::fetch(table, Scope::After),
            fetch_kinds: worker::fetch(table, Scope::Kinds),
            fetch_kinds_after: worker::fetch(table, Scope::KindsAfter),
            // The `(state, id)` index hands out the oldest jobs stored `available` first, where
            // the held ones are.
            held: "leased_until is not null".into(),
            // For an in-memory database, or when a heartbeat file cannot be written.
            heartbeat_many: format!(
                "update {t} set leased_until = {NOW} + $2
             where {HELD}
               and exists (select 1 from json_each($1) h
                           where json_extract(h.value, '$.id') = {t}.id
                             and json_extract(h.value, '$.token') = {t}.lease_token)
             returning id"
            ),
            rescue: worker::rescue(table),
            // Deletes up to `$3` of the oldest jobs in state `$1` that finished before `$2`, from `$4`
            // on (where the last batch ended); returns the finish times of the jobs deleted. One
            // statement under SQLite's single writer: no replay can come between the pick and the
            // delete.
            prune_jobs: format!(
                "delete from {t} where id in (
                 select id from {t} where state = $1 and finished_at < $2 and finished_at >= $4
                 order by finished_at limit $3)
             returning finished_at"
            ),
            // How many jobs in state `$1` finished before `$2`.
            count_prunable_jobs: format!(
                "select count(*) from {} where state = $1 and finished_at < $2",
                t
            ),
            notify: None,
        },
    )
}

/// The kinds a fetch takes, as its `$4` binds them: a JSON array, read with `json_each`.
fn kinds_param(kinds: &[String]) -> String {
    serde_json::to_string(kinds).expect("strings serialize")
}

impl QueueStore for Sqlite {
    crate::store::queue::queue_statements!();

    /// Binds a batch for the `enqueue_many` statement: one JSON array of rows.
    async fn enqueue_many(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        jobs: &[&NewJob],
    ) -> sqlx::Result<Vec<InsertedJob>> {
        let rows: Vec<_> = jobs
            .iter()
            .map(|job| {
                (
                    &job.kind,
                    job.key.as_str(),
                    &job.queue,
                    job.payload.to_string(),
                    job.max_attempts as i32,
                    duration_micros(job.delay),
                    job.unique.states_kept().mask(),
                )
            })
            .collect();
        let rows = serde_json::to_string(&rows).expect("strings and numbers serialize");
        let rows: Vec<(i64, String)> = sqlx::query_as(AssertSqlSafe(sql.enqueue_many.clone()))
            .bind(rows)
            .fetch_all(conn)
            .await?;
        Ok(rows.into_iter().map(InsertedJob::from).collect())
    }

    /// The jobs holding any of `keys`.
    async fn holders(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        keys: &[&str],
    ) -> crate::Result<Vec<Holder>> {
        let keys = serde_json::to_string(keys).expect("strings serialize");
        let rows: Vec<HolderColumns> = sqlx::query_as(AssertSqlSafe(sql.holders.clone()))
            .bind(keys)
            .fetch_all(conn)
            .await?;
        rows.into_iter().map(Holder::try_from).collect()
    }

    fn beat_aside(
        pool: &Pool<Self>,
        sql: &QueueSql,
        lease: Lease,
        by: Duration,
    ) -> Option<std::io::Result<()>> {
        let until = std::time::SystemTime::now() + by;
        heartbeat::Heartbeats::of(pool, &sql.table).map(|files| files.beat(lease, until))
    }

    fn held_aside(pool: &Pool<Self>, sql: &QueueSql) -> Vec<String> {
        heartbeat::Heartbeats::of(pool, &sql.table)
            .map(|files| files.holding(std::time::SystemTime::now()))
            .unwrap_or_default()
    }

    fn forget_aside(pool: &Pool<Self>, sql: &QueueSql, lease: Lease) {
        if let Some(files) = heartbeat::Heartbeats::of(pool, &sql.table) {
            files.forget(lease);
        }
    }
}
