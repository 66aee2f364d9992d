//! The worker's statements for SQLite: fetch and rescue. The Rust worker and the Python worker
//! run this same text. A job is completed and its key claimed in two statements under the
//! transaction's write lock ([`lease::complete`](crate::sql::lease::complete), then the guard's
//! [`claim`](crate::sql::sqlite::claim)).

use crate::sql::sqlite::NOW_MICROS as NOW;
use crate::sql::{HELD, LEGACY_RUNNING, REPLAYED, WAITING, paused_queues};
use crate::table::TableName;

pub use crate::sql::postgres::worker::Scope;

/// Fetches up to `$2` waiting jobs of queue `$1` in run-time order, each leased for `$3`
/// microseconds under a new fencing token (see PostgreSQL's
/// [`fetch`](crate::sql::postgres::worker::fetch)); [`Scope::After`] takes `$4` and `$5` as
/// there, [`Scope::Kinds`] takes `$4` as a JSON array of kinds, and [`Scope::KindsAfter`] both,
/// the kinds first. One statement, atomic on its
/// own: SQLite's one writer at a time makes two workers take different jobs. SQLite's clock
/// counts whole milliseconds, so a fetch that follows a lost one reads a later clock only after
/// a millisecond has passed, which a crash and its recovery always take.
pub fn fetch(table: &TableName, scope: Scope) -> String {
    let t = table.quoted();
    let paused_table = paused_queues(table);
    let scope = match scope {
        Scope::Queue => "",
        Scope::After => "and (run_at, id) > ($4, $5)",
        Scope::Kinds => "and kind in (select value from json_each($4))",
        Scope::KindsAfter => {
            "and kind in (select value from json_each($4)) and (run_at, id) > ($5, $6)"
        }
    };
    format!(
        "update {t}
             -- a token from the clock, never one the row had (see PostgreSQL's fetch)
             set attempt = attempt + 1, lease_token = max(lease_token + 1, {NOW}),
                 leased_until = {NOW} + $3
             where id in (select id from {t}
                          where {WAITING} and queue = $1 and run_at <= {NOW} {scope}
                            -- a paused queue gives out nothing
                            and not exists (select 1 from {paused_table} p
                                            where p.name = $1 and p.paused <> 0)
                          order by run_at, id limit $2)
             returning id, kind, job_key, payload, attempt, max_attempts, leased_until, lease_token,
                       run_at, {REPLAYED}"
    )
}

/// Gives back, or dead-letters on their last attempt, the jobs whose lease expired: `$1` is
/// the worker's retry policy's attempts, `$2` a JSON array of `id:token` leases known to hold,
/// `$3` a JSON array of the kinds the worker runs, or null for every kind. The last attempt is
/// the lesser of the job's own limit and the policy's, as when an attempt fails.
pub fn rescue(table: &TableName) -> String {
    let t = table.quoted();
    format!(
        "update {t}
             set state = case when attempt >= min(max_attempts, $1) then 'dead'
                              else 'available' end,
                 finished_at = case when attempt >= min(max_attempts, $1) then {NOW} end,
                 last_error = 'the lease of attempt ' || attempt || ' expired before it finished',
                 leased_until = null
             -- a job a worker of the earlier schema fetched (`LEGACY_RUNNING`) too
             where ({HELD} or {LEGACY_RUNNING}) and leased_until < {NOW}
               -- a lease whose heartbeat file says it holds ($2, `id:token`) belongs to a
               -- worker that is alive, waiting for the write lock: not expired
               and (id || ':' || lease_token) not in (select value from json_each($2))
               -- the kinds the rescuing worker runs ($3, a JSON array), or null for every kind
               and ($3 is null or kind in (select value from json_each($3)))"
    )
}
