//! The job queue's SQL for PostgreSQL. Times are computed by the database clock; durations
//! arrive as microseconds.

use jobguard_core::sql::postgres::queue as core;
use jobguard_core::sql::postgres::worker::{self, Scope};
use sqlx::AssertSqlSafe;

use sqlx::postgres::Postgres;

use crate::store::queue::sql::{DialectStatements, QueueDialect};
use crate::store::queue::{
    HELD_COUNT_SPAN, Holder, HolderColumns, InsertedJob, NewJob, QueueSql, QueueStore, STATE,
};
use crate::table::TableName;
use crate::time::duration_micros;

/// Microseconds since the Unix epoch of a `timestamptz` (or of an `interval`).
pub(super) fn micros(column: &str) -> String {
    format!("(extract(epoch from {column}) * 1000000)::int8")
}

/// What the queue's shared statements need to know of PostgreSQL.
pub(super) const DIALECT: QueueDialect = QueueDialect {
    now: "now()",
    plus_micros: " * interval '1 microsecond'",
    as_micros: micros,
    int8: "::int8",
    text: "::text",
    // The planner's row count.
    estimated_total: |t| {
        format!(
            "coalesce((select reltuples::int8 from pg_class where oid = to_regclass('{t}')), -1)"
        )
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
            // A batch in one statement, shared with the Python package's `enqueue_many`: the
            // caller passes each key once, sorted, and reads the holders of the keys it left out.
            enqueue_many: core::enqueue_many(table),
            holders: format!(
                "select id, job_key, kind, payload, {STATE}, {live} from {t}
                 where job_key = any($1::text[]) and ({live} or {kept})",
                kept = jobguard_core::sql::keeps_key_finished("")
            ),
            fetch: worker::fetch(table, Scope::Queue),
            // The held jobs at the head of each queue, as the counts find them, looked up by id:
            // with the state a constant, the planner would otherwise read the jobs in id order
            // by the primary key and walk every finished job older than the first held one.
            held: format!(
                "id = any(array(
                     select h.id from
                         (select queue from {t} where state = 'available' group by queue) q
                         cross join lateral
                         (select h.id, h.leased_until from {t} h
                          where h.state = 'available' and h.queue = q.queue
                          order by h.run_at, h.id limit {HELD_COUNT_SPAN}) h
                     where h.leased_until is not null))"
            ),
            fetch_after: worker::fetch(table, Scope::After),
            fetch_kinds: worker::fetch(table, Scope::Kinds),
            fetch_kinds_after: worker::fetch(table, Scope::KindsAfter),
            // Rows a transaction of the worker's own holds (a job whose claim locked it) are
            // skipped rather than waited for: one such job must not stall the heartbeats of all the
            // others. They count as held, as does every lease still running under its token in the
            // statement's snapshot; only a lease rescued or taken over is not.
            // The worker's statements are the core's, which the Python worker runs too.
            heartbeat_many: worker::heartbeat_many(table),
            rescue: worker::rescue(table),
            // Deletes up to `$3` of the oldest jobs in state `$1` that finished before `$2` and at or
            // after `$4` (where the last batch ended, past the index entries it left for vacuum), times
            // in microseconds since the Unix epoch; returns how many, and the latest finish. A job
            // replayed between the pick and the delete is no longer in state `$1`: the delete re-checks
            // the state on the row it locks, so a replayed job is never deleted.
            prune_jobs: format!(
                "with deleted as (
                 delete from {t} where id = any(array(
                     select id from {t}
                     where state = $1
                       and finished_at < timestamptz 'epoch' + $2 * interval '1 microsecond'
                       and finished_at >= timestamptz 'epoch' + $4 * interval '1 microsecond'
                     order by finished_at limit $3))
                   and state = $1
                 returning finished_at
             )
             select count(*)::int8, (extract(epoch from max(finished_at)) * 1000000)::int8
             from deleted"
            ),
            // How many jobs in state `$1` finished before `$2`.
            count_prunable_jobs: format!(
                "select count(*)::int8 from {} where state = $1
               and finished_at < timestamptz 'epoch' + $2 * interval '1 microsecond'",
                t
            ),
            notify: Some(core::NOTIFY),
        },
    )
}

/// The kinds a fetch takes, as its `$4` binds them: a `text[]`.
fn kinds_param(kinds: &[String]) -> &[String] {
    kinds
}

impl QueueStore for Postgres {
    crate::store::queue::queue_statements!();

    /// Binds a batch for the `enqueue_many` statement: one array per column.
    async fn enqueue_many(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        jobs: &[&NewJob],
    ) -> sqlx::Result<Vec<InsertedJob>> {
        let kinds: Vec<&str> = jobs.iter().map(|job| job.kind.as_str()).collect();
        let keys: Vec<&str> = jobs.iter().map(|job| job.key.as_str()).collect();
        let queues: Vec<&str> = jobs.iter().map(|job| job.queue.as_str()).collect();
        let payloads: Vec<String> = jobs.iter().map(|job| job.payload.to_string()).collect();
        let attempts: Vec<i32> = jobs.iter().map(|job| job.max_attempts as i32).collect();
        let delays: Vec<i64> = jobs.iter().map(|job| duration_micros(job.delay)).collect();
        let unique: Vec<i32> = jobs
            .iter()
            .map(|job| job.unique.states_kept().mask())
            .collect();
        let rows: Vec<(i64, String)> = sqlx::query_as(AssertSqlSafe(sql.enqueue_many.clone()))
            .bind(kinds)
            .bind(keys)
            .bind(queues)
            .bind(payloads)
            .bind(attempts)
            .bind(delays)
            .bind(unique)
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
        let rows: Vec<HolderColumns> = sqlx::query_as(AssertSqlSafe(sql.holders.clone()))
            .bind(keys)
            .fetch_all(conn)
            .await?;
        rows.into_iter().map(Holder::try_from).collect()
    }
}
