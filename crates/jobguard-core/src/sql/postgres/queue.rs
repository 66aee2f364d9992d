//! The job queue's tables and enqueue statements for PostgreSQL: the Rust `Queue` (its
//! `migrate` and `enqueue_tx`) and the Python package (`App.migrate`, `jobguard.enqueue`) run
//! this same text, so a table either creates is the other's, and a job enqueued from either is
//! deduplicated by the same live key.

pub use crate::sql::live_job;
use crate::sql::queue_schema::{job_indexes, job_upgrades, unique_columns};
use crate::sql::{LIVE_STATES, paused_queues};
use crate::table::TableName;

/// The queue's tables and indexes on `table`, in the order a migration runs them (each is
/// `create ... if not exists`, `add column if not exists` or an upgrade that does nothing the
/// second time): the schema, the jobs table, its storage settings, the unique-policy columns,
/// the indexes, the upgrades from earlier schemas, and the table of paused queues. Run in one
/// transaction under the migration lock, the table's comment then set to their
/// [`schema_marker`](crate::sql::schema_marker).
pub fn create(table: &TableName) -> Vec<String> {
    let t = table.quoted();
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
            ) with (fillfactor = 70)"
    ));
    // Room on each page for a job's next row version, so that taking and extending its lease
    // (which change no indexed column) are heap-only updates; for a table made before, the
    // pages written from now on.
    //
    // A queue's table turns over all day: every job is inserted, updated a few times and
    // deleted when pruned. Autovacuum's defaults wait for a fifth of the table to be dead rows;
    // at a few thousand jobs a second that is hundreds of thousands of dead rows between runs,
    // which every fetch walks past. A vacuum once one row in a hundred is dead (and at least a
    // thousand) keeps the table near its live size.
    create.push(format!(
        "alter table {t} set (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,
                             autovacuum_vacuum_threshold = 1000)"
    ));
    create.extend(unique_columns(table, "add column if not exists"));
    create.extend(job_indexes(table));
    create.extend(job_upgrades(table));
    // Queues an operator paused: the fetch takes nothing from them.
    create.push(format!(
        "create table if not exists {} (
                name       text primary key,
                paused     boolean not null default false,
                changed_at timestamptz not null default now()
            )",
        paused_queues(table)
    ));
    create
}

/// The channel on which enqueues wake idle workers (`select pg_notify($1, $2)`, the queue's
/// name as the payload).
pub const NOTIFY_CHANNEL: &str = "jobguard_jobs";

/// Wakes the workers listening on `$1` (the channel) for the queue `$2`.
pub const NOTIFY: &str = "select pg_notify($1, $2)";

/// Inserts a job: `$1` kind, `$2` key, `$3` queue, `$4` payload (JSON), `$5` max attempts,
/// `$6` delay in microseconds; returns its id, or no row when a live job (available or
/// running) holds the key. The live-key unique index decides, not a check-then-insert: a
/// concurrent enqueue of the same key waits for this transaction and then inserts nothing.
pub fn enqueue(table: &TableName) -> String {
    format!(
        "insert into {t} (kind, job_key, queue, payload, state, max_attempts, run_at)
             values ($1, $2, $3, $4, 'available', $5, now() + $6 * interval '1 microsecond')
             on conflict (job_key) where {LIVE_STATES} do nothing
             returning id",
        t = table.quoted()
    )
}

/// [`enqueue`] and, when it inserted, the notification that wakes the queue's idle workers
/// ([`NOTIFY`] on [`NOTIFY_CHANNEL`], the queue `$3` as the payload), in one statement: one
/// round trip for a caller that announces every enqueue. Returns the id, or no row (and no
/// notification: the notification is taken per inserted row) when a live job holds the key.
pub fn enqueue_notifying(table: &TableName) -> String {
    format!(
        "with job as ({enqueue})
         select job.id from job,
             lateral (select pg_notify('{NOTIFY_CHANNEL}', $3::text) where job.id is not null) as woken",
        enqueue = enqueue(table)
    )
}

/// Inserts a batch of jobs in one statement: `$1` kinds, `$2` keys, `$3` queues, `$4` payloads
/// (JSON text), `$5` max attempts, `$6` delays in microseconds, `$7` each job's
/// `unique_states` (0 without a policy), one array per column, unnested into rows, so the
/// statement is the same for any batch size. `on conflict do nothing`, against either unique
/// index (live key, kept key), leaves out without an error each key a job already holds (or
/// that a concurrent transaction inserts first: the statement waits for it to commit or roll
/// back); returns `id, job_key` of each row inserted, and the caller reads the others' holders.
/// Pass each key once, the keys sorted, so that two batches sharing keys wait for each other
/// in the same order instead of deadlocking.
pub fn enqueue_many(table: &TableName) -> String {
    enqueue_many_returning(table, "id, job_key")
}

/// [`enqueue_many`] and one notification per queue that received a job ([`NOTIFY`] on
/// [`NOTIFY_CHANNEL`], the queue as the payload), in one statement: none when nothing was
/// inserted. Returns `id, job_key` of each row inserted.
pub fn enqueue_many_notifying(table: &TableName) -> String {
    format!(
        "with job as ({insert})
         select job.id, job.job_key from job
         where (select count(pg_notify('{NOTIFY_CHANNEL}', q.queue))
                from (select distinct queue from job) as q) >= 0",
        insert = enqueue_many_returning(table, "id, job_key, queue")
    )
}

fn enqueue_many_returning(table: &TableName, returning: &str) -> String {
    format!(
        "insert into {t}
             (kind, job_key, queue, payload, state, max_attempts, run_at, unique_states)
         select b.kind, b.job_key, b.queue, b.payload::jsonb, 'available', b.max_attempts,
                now() + b.delay * interval '1 microsecond', b.unique_states
         from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::int8[],
                     $7::int4[])
              as b(kind, job_key, queue, payload, max_attempts, delay, unique_states)
         on conflict do nothing
         returning {returning}",
        t = table.quoted()
    )
}

/// Inserts a job under a unique policy that keeps its key beyond the live states: the
/// parameters of [`enqueue`], then `$7` the job's `unique_states` (not 0); returns its id, or no
/// row when a job holds the key, live or finished in a state its own policy keeps the key in.
/// No conflict target: a conflict in either unique index (live key, kept key) inserts nothing,
/// and a concurrent enqueue of the key waits for this transaction, as with [`enqueue`].
pub fn enqueue_unique(table: &TableName) -> String {
    format!(
        "insert into {t}
                 (kind, job_key, queue, payload, state, max_attempts, run_at, unique_states)
             values ($1, $2, $3, $4, 'available', $5, now() + $6 * interval '1 microsecond', $7)
             on conflict do nothing
             returning id",
        t = table.quoted()
    )
}
