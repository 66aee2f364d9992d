//! The worker's statements for PostgreSQL: fetch, complete-and-claim (one job, or a batch and
//! the read of the keys it did not claim), the heartbeats of many leases and the rescue. The Rust worker and the Python worker run this same text; the
//! statements that settle one lease are in [`lease`](crate::sql::lease).

use crate::sql::{HELD, KEEP_COMPLETED, LEGACY_RUNNING, REPLAYED, WAITING, paused_queues};
use crate::table::TableName;

/// Which jobs of a queue a fetch takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every kind, from the head of the queue.
    Queue,
    /// Every kind, past run time `$4` (microseconds since the epoch) and id `$5`: where the
    /// worker's previous fetch ended, over none of the jobs it holds.
    After,
    /// Only the kinds named in `$4` (a `text[]`): a worker running some kinds beside workers
    /// running others leaves their jobs waiting, to be fetched by them.
    Kinds,
    /// Only the kinds named in `$4`, past run time `$5` and id `$6`: [`Kinds`](Self::Kinds)
    /// where the worker's previous fetch ended, as [`After`](Self::After).
    KindsAfter,
}

/// Fetches up to `$2` waiting jobs of queue `$1` in run-time order, each leased for `$3`
/// microseconds under a new fencing token; see [`Scope`] for `$4` and `$5`. Returns id, kind,
/// key, payload, attempt, max attempts, leased until and run at (microseconds), lease token,
/// and whether the job was replayed.
///
/// `skip locked`: concurrent workers take different jobs instead of queueing on one. The token
/// is drawn from the clock (microseconds since the epoch), and is one more than the row's last
/// when that is ahead of the clock: it never repeats, even when a crash loses the fetch's
/// asynchronous commit and the row comes back with its earlier token, since the fetch after
/// the recovery reads a later clock. Every statement that ends or extends the lease compares it
/// for equality, so a worker whose fetch was lost is fenced off.
pub fn fetch(table: &TableName, scope: Scope) -> String {
    const NEXT_TOKEN: &str =
        "greatest(j.lease_token + 1, (extract(epoch from now()) * 1000000)::int8)";
    let t = table.quoted();
    let paused_table = paused_queues(table);
    let micros = "* interval '1 microsecond'";
    let scope = match scope {
        Scope::Queue => "",
        Scope::After => {
            "and (run_at, id) > ('epoch'::timestamptz + $4 * interval '1 microsecond', $5)"
        }
        Scope::Kinds => "and kind = any($4::text[])",
        Scope::KindsAfter => {
            "and kind = any($4::text[])
                   and (run_at, id) > ('epoch'::timestamptz + $5 * interval '1 microsecond', $6)"
        }
    };
    format!(
        "with picked as (
                 select id from {t}
                 where {WAITING} and queue = $1 and run_at <= now() {scope}
                   -- a paused queue gives out nothing; jobs already leased run on
                   and not exists (select 1 from {paused_table} p
                                   where p.name = $1 and p.paused)
                 order by run_at, id
                 limit $2
                 for update skip locked
             ),
             -- the lease commits without waiting for its WAL flush: the job's own transaction,
             -- which completes it under this token, flushes the lease with its commit, and a
             -- lease lost with a crash only lets the job be fetched again, which its token and
             -- the guard make harmless (set once per fetch, not per job)
             asynchronous as materialized (
                 select set_config('synchronous_commit', 'off', true)
             )
             update {t} j
             set attempt = j.attempt + 1, lease_token = {NEXT_TOKEN},
                 leased_until = now() + $3 {micros}
             from picked, asynchronous where j.id = picked.id
             returning j.id, j.kind, j.job_key, j.payload, j.attempt, j.max_attempts,
                       (extract(epoch from j.leased_until) * 1000000)::int8, j.lease_token,
                       (extract(epoch from j.run_at) * 1000000)::int8, {REPLAYED}"
    )
}

/// What completing a job does with its row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompletedRows {
    /// The row stays, `completed`, until the prune deletes it after the retention's
    /// `keep_completed`.
    #[default]
    Kept,
    /// The row is deleted by the statement that completes the job, for a queue that keeps no
    /// completed job (`keep_completed` zero): the guard row is the record that the key was
    /// applied. A job whose unique policy keeps its key taken while completed is kept all the
    /// same, since its row is what holds the key. No index entry is written for the completion
    /// and no prune is needed for it: half the index writes of a job's life.
    Deleted,
}

/// Completes a job and claims its key in one statement: `$1` key, `$2` kind, `$3`
/// fingerprint, `$4` claim token (the guard's claim), `$5` job id, `$6` lease token. The job's
/// row is completed (or deleted; see [`CompletedRows`]) only under the lease that holds it, and
/// the key is claimed only when it was: a fenced worker gets no row back and has claimed
/// nothing. Otherwise the row of the guard's claim function (`claimed`, then the holding row's
/// applied at, fingerprint, result and claim token); a null `claimed` means the key's row
/// vanished between the conflict and its read.
///
/// The update (or delete) locks the job's row until the transaction ends: from here no other
/// worker can fetch or rescue it, and the job's effect commits with its completion and its
/// guard row.
pub fn claim_completing(guard: &TableName, jobs: &TableName, rows: CompletedRows) -> String {
    let held = format!("id = $5 and lease_token = $6 and {HELD}");
    let jobs = jobs.quoted();
    let complete = |also: &str| {
        format!(
            "update {jobs} set state = 'completed', finished_at = now(), leased_until = null
             where {held}{also}
             returning 1"
        )
    };
    let completed = match rows {
        CompletedRows::Kept => format!("completed as (\n             {}\n         )", complete("")),
        CompletedRows::Deleted => format!(
            "kept as (
             {}
         ),
         deleted as (
             delete from {jobs} where {held} and (unique_states & {KEEP_COMPLETED}) = 0
             returning 1
         ),
         completed as (select * from kept union all select * from deleted)",
            complete(&format!(" and (unique_states & {KEEP_COMPLETED}) <> 0")),
        ),
    };
    format!(
        "with {completed}
         select c.* from completed left join lateral {claim}($1, $2, $3, $4) c on true",
        claim = guard.derived_qualified("claim"),
    )
}

/// Completes a batch's jobs under their lease tokens and claims the keys of the completed ones,
/// in one statement. The inputs are parallel arrays, one element per job in batch order: job id
/// (`$1`), lease token (`$2`), key (`$3`), kind (`$4`), fingerprint (`$5`), claim token (`$6`).
///
/// One row per job, in batch order: `completed` false means its lease was taken over, so
/// nothing was completed or claimed for it; `claimed` true means its key's guard row was
/// inserted by this statement for this job. A completed job that did not claim its key either
/// shares it with an earlier job of the batch (which claimed or found it) or found it held by a
/// committed transaction: [`held`] reads those rows in a new statement.
///
/// - Only the first completed job of each key tries to claim it, so a key twice in one batch
///   is claimed once and the second job is a duplicate.
/// - The keys are inserted in key order, so two batches that share keys lock them in the same
///   order and wait for each other rather than deadlock.
/// - As in the per-job claim, `on conflict do nothing` waits for a concurrent transaction
///   holding the key, then inserts nothing when it committed (a duplicate) or inserts when it
///   rolled back (this batch applies the key).
pub fn claim_completing_many(guard: &TableName, jobs: &TableName, rows: CompletedRows) -> String {
    let held = "j.id = b.job_id and j.lease_token = b.lease_token
               and j.state = 'available' and j.leased_until is not null";
    let complete = |also: &str| {
        format!(
            "update {jobs} j set state = 'completed', finished_at = now(), leased_until = null
             from batch b
             where {held}{also}
             returning j.id",
            jobs = jobs.quoted(),
        )
    };
    let completed = match rows {
        CompletedRows::Kept => format!("completed as (\n             {}\n         )", complete("")),
        CompletedRows::Deleted => format!(
            "kept as (
             {}
         ),
         deleted as (
             delete from {jobs} j using batch b
             where {held} and (j.unique_states & {KEEP_COMPLETED}) = 0
             returning j.id
         ),
         completed as (select id from kept union all select id from deleted)",
            complete(&format!(" and (j.unique_states & {KEEP_COMPLETED}) <> 0")),
            jobs = jobs.quoted(),
        ),
    };
    format!(
        "with batch as (
             select * from unnest($1::int8[], $2::int8[], $3::text[], $4::text[], $5::bytea[], $6::bytea[])
                 with ordinality as b(job_id, lease_token, job_key, kind, fingerprint, claim_token, ord)
         ),
         {completed},
         first_of_key as (
             select distinct on (b.job_key) b.*
             from batch b join completed c on c.id = b.job_id
             order by b.job_key, b.ord
         ),
         claimed as (
             insert into {guard} (job_key, kind, fingerprint, claim_token)
             select job_key, kind, fingerprint, claim_token from first_of_key order by job_key
             on conflict (job_key) do nothing
             returning job_key
         )
         select c.id is not null as completed,
                coalesce(f.ord = b.ord and k.job_key is not null, false) as claimed
         from batch b
         left join completed c on c.id = b.job_id
         left join first_of_key f on f.job_key = b.job_key
         left join claimed k on k.job_key = b.job_key
         order by b.ord",
        guard = guard.quoted(),
    )
}

/// Reads the guard rows holding keys (`$1`) that a batch did not claim. A new statement, so
/// under read committed it sees rows that concurrent transactions committed while the batch's
/// statement waited for them, as well as the rows the batch itself inserted.
pub fn held(guard: &TableName) -> String {
    format!(
        "select job_key, (extract(epoch from applied_at) * 1000000)::int8, fingerprint, result,
                claim_token
         from {} where job_key = any($1::text[])",
        guard.quoted()
    )
}

/// Extends to `$2` microseconds from now the leases in `$1` (a JSON array of `{"id", "token"}`)
/// that still hold; returns the ids of those that do.
///
/// Rows a transaction of the worker's own holds (a job whose claim locked it) are skipped
/// rather than waited for: one such job must not stall the heartbeats of all the others. They
/// count as held, as does every lease still running under its token in the statement's
/// snapshot; only a lease rescued or taken over is not.
pub fn heartbeat_many(table: &TableName) -> String {
    let t = table.quoted();
    format!(
        "with held as (select * from jsonb_to_recordset($1::jsonb) as h(id int8, token int8)),
                  free as (select j.id from {t} j join held h
                           on j.id = h.id and j.lease_token = h.token
                           where {HELD}
                           for update of j skip locked),
                  extended as (update {t} set leased_until = now() + $2 * interval '1 microsecond'
                               where id in (select id from free) returning id)
             select h.id from held h join {t} j
             on j.id = h.id and j.lease_token = h.token and {HELD}"
    )
}

/// Gives back, or dead-letters on their last attempt, the jobs whose lease expired: `$1` is
/// the worker's retry policy's attempts, `$2` a JSON array of `id:token` leases known to hold
/// (the rescuing worker's own), `$3` the kinds the worker runs (a `text[]`), or null for every
/// kind. A job running under its own transaction holds its row locked and is skipped.
///
/// The last attempt is the lesser of the job's own limit and the policy's, as when an attempt
/// fails: a job is never given more attempts by losing its lease than by failing. A worker
/// rescues only the kinds it runs, so the policy that counts is one the job's kind runs
/// under: a worker of other kinds, with a shorter policy, never dead-letters it early.
pub fn rescue(table: &TableName) -> String {
    let t = table.quoted();
    format!(
        "update {t}
             set state = case when attempt >= least(max_attempts, $1) then 'dead'
                              else 'available' end,
                 finished_at = case when attempt >= least(max_attempts, $1) then now() end,
                 last_error = 'the lease of attempt ' || attempt || ' expired before it finished',
                 leased_until = null
             where id in (select id from {t}
                          -- a job a worker of the earlier schema fetched and stored
                          -- `running` (`LEGACY_RUNNING`), once its lease expired, too
                          where ({HELD} or {LEGACY_RUNNING}) and leased_until < now()
                            and ($3::text[] is null or kind = any($3::text[]))
                            -- leases known to hold ($2, `id:token`): on PostgreSQL those of
                            -- the worker that rescues, whose heartbeats are in the table
                            and (id::text || ':' || lease_token::text)
                                not in (select jsonb_array_elements_text($2::jsonb))
                          -- a running job's own transaction holds its row: not expired
                          for update skip locked)"
    )
}
