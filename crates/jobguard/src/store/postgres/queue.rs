//! The job queue's SQL for PostgreSQL. Times are computed by the database clock; durations
//! arrive as microseconds.

use jobguard_core::sql::postgres::queue as core;
use sqlx::AssertSqlSafe;
use sqlx::types::Json;

use sqlx::postgres::Postgres;

use crate::store::queue::{
    InsertedJob, LiveJob, NewJob, QueueSql, QueueStore, job_indexes, queue_states,
};
use crate::table::TableName;
use crate::time::duration_micros;

/// Microseconds since the Unix epoch of a `timestamptz` column.
pub(super) fn micros(column: &str) -> String {
    format!("(extract(epoch from {column}) * 1000000)::int8")
}

/// The columns of a listed job, as [`JobRow::from_row`](crate::store::queue::JobRow::from_row)
/// decodes them: for `Queue::list` and the console.
pub(super) fn job_row_columns() -> String {
    format!(
        "id, kind, job_key, queue, state, attempt, max_attempts, {}, last_error, {}, {}, payload",
        micros("run_at"),
        micros("created_at"),
        micros("finished_at"),
    )
}

pub(crate) fn queue_sql(table: &TableName) -> QueueSql {
    let t = table.quoted();
    let columns = job_row_columns();
    let paused_table = queue_states(table);
    let live = "state in ('available', 'running')";
    let micros = "* interval '1 microsecond'";
    let fenced = "where id = $1 and lease_token = $2 and state = 'running'";
    let mut create = Vec::new();
    if let Some(schema) = table.schema() {
        create.push(format!("create schema if not exists \"{schema}\""));
    }
    create.push(format!(
        "create table if not exists {t} (
                id           bigserial primary key,
                kind         text not null,
                job_key      text not null,
                queue        text not null,
                payload      jsonb not null,
                state        text not null
                             check (state in ('available', 'running', 'completed', 'dead')),
                attempt      integer not null default 0,
                lease_token  bigint not null default 0,
                max_attempts integer not null check (max_attempts > 0),
                run_at       timestamptz not null default now(),
                leased_until timestamptz,
                last_error   text,
                created_at   timestamptz not null default now(),
                finished_at  timestamptz
            )"
    ));
    create.extend(job_indexes(table));
    // Queues an operator paused: the fetch below takes nothing from them.
    create.push(format!(
        "create table if not exists {} (
                name       text primary key,
                paused     boolean not null default false,
                changed_at timestamptz not null default now()
            )",
        queue_states(table)
    ));
    QueueSql {
        table: table.clone(),
        create: create.into_iter().map(Into::into).collect(),
        // The single enqueue is shared with the Python package: one text for both.
        enqueue: core::enqueue(table).into(),
        live_job: core::live_job(table).into(),
        // A batch in one statement: one array per column, unnested into rows, so the statement
        // is the same for any batch size. `on conflict ... do nothing` against the live-key
        // index leaves out, without an error, each key a live job already holds (or that a
        // concurrent transaction inserts first: the statement waits for it to commit or roll
        // back), and `returning` names the rows inserted; the caller reads the others with
        // `live_jobs`. The caller passes the keys sorted, so that two batches sharing keys
        // wait for each other in the same order instead of deadlocking.
        enqueue_many: format!(
            "insert into {t} (kind, job_key, queue, payload, state, max_attempts, run_at)
             select b.kind, b.job_key, b.queue, b.payload::jsonb, 'available', b.max_attempts,
                    now() + b.delay {micros}
             from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::int8[])
                  as b(kind, job_key, queue, payload, max_attempts, delay)
             on conflict (job_key) where {live} do nothing
             returning id, job_key"
        )
        .into(),
        live_jobs: format!(
            "select id, job_key, kind, payload from {t} where job_key = any($1::text[]) and {live}"
        )
        .into(),
        // `skip locked`: concurrent workers take different jobs instead of queueing on one.
        fetch: format!(
            "with picked as (
                 select id from {t}
                 where state = 'available' and queue = $1 and run_at <= now()
                   -- a paused queue gives out nothing; jobs already leased run on
                   and not exists (select 1 from {paused_table} p
                                   where p.name = $1 and p.paused)
                 order by run_at, id
                 limit $2
                 for update skip locked
             )
             update {t} j
             set state = 'running', attempt = j.attempt + 1, lease_token = j.lease_token + 1,
                 leased_until = now() + $3 {micros}
             from picked where j.id = picked.id
             returning j.id, j.kind, j.job_key, j.payload, j.attempt, j.max_attempts,
                       (extract(epoch from j.leased_until) * 1000000)::int8, j.lease_token"
        )
        .into(),
        // Every statement that ends or extends a lease names the attempt that holds it, so a
        // worker whose lease expired and was taken over changes nothing.
        complete: format!(
            "update {t} set state = 'completed', finished_at = now(), leased_until = null {fenced}"
        )
        .into(),
        retry: format!(
            "update {t} set state = 'available', run_at = now() + $3 {micros}, last_error = $4,
             leased_until = null {fenced}"
        )
        .into(),
        dead: format!(
            "update {t} set state = 'dead', finished_at = now(), last_error = $3,
             leased_until = null {fenced}"
        )
        .into(),
        release: format!(
            "update {t} set state = 'available', attempt = attempt - 1, leased_until = null {fenced}"
        )
        .into(),
        heartbeat: format!("update {t} set leased_until = now() + $3 {micros} {fenced}").into(),
        // Rows a transaction of the worker's own holds (a job whose claim locked it) are
        // skipped rather than waited for: one such job must not stall the heartbeats of all the
        // others. They count as held, as does every lease still running under its token in the
        // statement's snapshot; only a lease rescued or taken over is not.
        heartbeat_many: format!(
            "with held as (select * from jsonb_to_recordset($1::jsonb) as h(id int8, token int8)),
                  free as (select j.id from {t} j join held h
                           on j.id = h.id and j.lease_token = h.token
                           where j.state = 'running'
                           for update of j skip locked),
                  extended as (update {t} set leased_until = now() + $2 {micros}
                               where id in (select id from free) returning id)
             select h.id from held h join {t} j
             on j.id = h.id and j.lease_token = h.token and j.state = 'running'"
        )
        .into(),
        // The last attempt is the lesser of the job's own limit and the worker's retry
        // policy ($1), as when an attempt fails: a job is never given more attempts by
        // losing its lease than by failing.
        rescue: format!(
            "update {t}
             set state = case when attempt >= least(max_attempts, $1) then 'dead'
                              else 'available' end,
                 finished_at = case when attempt >= least(max_attempts, $1) then now() end,
                 last_error = 'the lease of attempt ' || attempt || ' expired before it finished',
                 leased_until = null
             where id in (select id from {t}
                          where state = 'running' and leased_until < now()
                            -- leases known to hold ($2, `id:token`): on PostgreSQL those of
                            -- the worker that rescues, whose heartbeats are in the table
                            and (id::text || ':' || lease_token::text)
                                not in (select jsonb_array_elements_text($2::jsonb))
                          -- a running job's own transaction holds its row: not expired
                          for update skip locked)"
        )
        .into(),
        // Live states are counted exactly through their partial indexes (the fetch and lease
        // indexes), finished ones up to TERMINAL_COUNT_CAP rows through the `finished` index, so
        // a sample costs the same with 10M finished rows as with none. `estimated total` is
        // what finished states above the cap are estimated from: the planner's row count.
        counts: format!(
            "select 'available', count(*) from {t} where state = 'available'
             union all select 'running', count(*) from {t} where state = 'running'
             union all select 'completed', count(*) from
                 (select 1 from {t} where state = 'completed'
                  order by state, finished_at limit {cap}) c
             union all select 'dead', count(*) from
                 (select 1 from {t} where state = 'dead'
                  order by state, finished_at limit {cap}) d
             union all select 'estimated total', coalesce(
                 (select reltuples::int8 from pg_class where oid = to_regclass('{t}')), -1)",
            cap = crate::store::queue::TERMINAL_COUNT_CAP
        )
        .into(),
        // Served by the fetch index (queue, run_at, id) where state = 'available'.
        backlog: format!(
            "select queue, count(*),
                    (extract(epoch from now() - min(run_at)) * 1000000)::int8
             from {t} where state = 'available' and run_at <= now()
             group by queue order by queue"
        )
        .into(),
        list: format!(
            "select {columns} from {t}
             where ($1::text is null or state = $1) and ($2::text is null or kind = $2)
             order by id desc limit $3"
        )
        .into(),
        // The newest dead job of a key comes back, and only when no live job holds the key.
        replay: format!(
            "update {t} j
             set state = 'available', attempt = 0, run_at = now(), finished_at = null,
                 leased_until = null
             where j.state = 'dead'
               and ($1::int8 is null or j.id = $1) and ($2::text is null or j.kind = $2)
               and j.id = (select max(d.id) from {t} d
                           where d.job_key = j.job_key and d.state = 'dead')
               and not exists (select 1 from {t} l where l.job_key = j.job_key and l.{live})
             returning j.id"
        )
        .into(),
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
        )
        .into(),
        // How many jobs in state `$1` finished before `$2`.
        count_prunable_jobs: format!(
            "select count(*)::int8 from {} where state = $1
               and finished_at < timestamptz 'epoch' + $2 * interval '1 microsecond'",
            t
        )
        .into(),
        notify: Some(core::NOTIFY.into()),
    }
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
        let rows: Vec<(i64, String)> = sqlx::query_as(AssertSqlSafe(sql.enqueue_many.clone()))
            .bind(kinds)
            .bind(keys)
            .bind(queues)
            .bind(payloads)
            .bind(attempts)
            .bind(delays)
            .fetch_all(conn)
            .await?;
        Ok(rows.into_iter().map(InsertedJob::from).collect())
    }

    /// The live jobs holding any of `keys`.
    async fn live_jobs(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        keys: &[&str],
    ) -> sqlx::Result<Vec<LiveJob>> {
        let rows: Vec<(i64, String, String, Json<serde_json::Value>)> =
            sqlx::query_as(AssertSqlSafe(sql.live_jobs.clone()))
                .bind(keys)
                .fetch_all(conn)
                .await?;
        Ok(rows.into_iter().map(LiveJob::from).collect())
    }
}
