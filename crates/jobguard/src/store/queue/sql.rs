//! The queue's statements: the text both dialects share, written once here over a
//! [`QueueDialect`] of the fragments in which they differ, joined by [`QueueSql::new`] with the
//! statements each dialect writes whole ([`DialectStatements`]: the table, the enqueue shared
//! with the Python package, the batches, the fetch, the heartbeats of many leases, the rescue
//! and the prune, whose locking or parameters differ).

use std::sync::Arc;

use jobguard_core::sql::lease;
use jobguard_core::sql::{LEGACY_RUNNING, STATE};

use super::{HELD_COUNT_SPAN, QueueSql, TERMINAL_COUNT_CAP, other_holder};
use crate::table::TableName;

/// What the queue's shared statements differ in between dialects.
pub(crate) struct QueueDialect {
    /// The current time, as the table keeps times.
    pub now: &'static str,
    /// Appended to a parameter of microseconds to add it to [`now`](Self::now).
    pub plus_micros: &'static str,
    /// A time (or a span of time) as microseconds, as the store decodes times.
    pub as_micros: fn(&str) -> String,
    /// Casts that a parameter compared with `is null` needs to have a type: to `int8`, `text`.
    pub int8: &'static str,
    pub text: &'static str,
    /// The row count that finished states above [`TERMINAL_COUNT_CAP`] are estimated from, of
    /// the jobs table given.
    pub estimated_total: fn(&str) -> String,
}

/// The statements a dialect writes whole; [`QueueSql`] documents each.
pub(crate) struct DialectStatements {
    pub create: Vec<String>,
    pub enqueue: String,
    pub enqueue_unique: String,
    pub enqueue_many: String,
    pub holders: String,
    pub fetch: String,
    pub fetch_after: String,
    pub fetch_kinds: String,
    pub fetch_kinds_after: String,
    pub held: String,
    pub heartbeat_many: String,
    pub rescue: String,
    pub prune_jobs: String,
    pub count_prunable_jobs: String,
    pub notify: Option<&'static str>,
}

/// The columns of a listed job, as [`JobRow::from_row`](super::JobRow::from_row) decodes them,
/// for `Queue::list` and the console.
pub(crate) fn job_row_columns(dialect: &QueueDialect) -> String {
    let micros = dialect.as_micros;
    format!(
        "id, kind, job_key, queue, {STATE}, attempt, max_attempts, {}, last_error, {}, {}, payload,
         unique_states, replaced",
        micros("run_at"),
        micros("created_at"),
        micros("finished_at"),
    )
}

/// The held jobs among the first [`HELD_COUNT_SPAN`] jobs stored `available` of queue
/// `q.queue` in its order (those also meeting `and_also`, a condition on `h`): a scalar
/// subquery, correlated with a `q` that names the queue.
fn held_at_head(t: &str, and_also: &str) -> String {
    format!(
        "(select count(leased_until) from
             (select h.leased_until from {t} h
              where h.state = 'available' and h.queue = q.queue {and_also}
              order by h.run_at, h.id limit {HELD_COUNT_SPAN}) head)"
    )
}

impl QueueSql {
    /// The statements on the jobs table `table`: the dialect's own, and the shared ones in
    /// its dialect.
    pub(crate) fn new(table: &TableName, dialect: &QueueDialect, own: DialectStatements) -> Self {
        let QueueDialect {
            now,
            plus_micros: m,
            as_micros,
            int8,
            text,
            estimated_total,
        } = dialect;
        let t = table.quoted();
        let clock = lease::Clock {
            now,
            plus_micros: m,
        };
        let columns = job_row_columns(dialect);
        QueueSql {
            table: table.clone(),
            create: own.create.into_iter().map(Into::into).collect(),
            enqueue: own.enqueue.into(),
            enqueue_unique: own.enqueue_unique.into(),
            holder: jobguard_core::sql::holder(table).into(),
            enqueue_many: own.enqueue_many.into(),
            holders: own.holders.into(),
            replace: jobguard_core::sql::replace(table, clock).into(),
            fetch: own.fetch.into(),
            fetch_after: own.fetch_after.into(),
            fetch_kinds: own.fetch_kinds.into(),
            fetch_kinds_after: own.fetch_kinds_after.into(),
            // Every statement that ends or extends a lease names the attempt that holds it, so a
            // worker whose lease expired and was taken over changes nothing. The core's text,
            // which the Python worker runs too.
            complete: lease::complete(table, clock).into(),
            retry: lease::retry(table, clock).into(),
            dead: lease::dead(table, clock).into(),
            release: lease::release(table).into(),
            give_back: lease::give_back(table, clock).into(),
            // One lease, outside a worker's own heartbeats (on SQLite through the busy timeout,
            // outside this process's writer turn).
            heartbeat: lease::heartbeat(table, clock).into(),
            heartbeat_many: own.heartbeat_many.into(),
            rescue: own.rescue.into(),
            // Finished states are counted up to TERMINAL_COUNT_CAP rows through the `finished`
            // index, so a sample costs the same with 10M finished rows as with none; `estimated
            // total` is what finished states above the cap are estimated from. Live ones: the
            // jobs stored `available` per queue from the fetch index alone, and among them the
            // held ones, whose lease no index holds (so that taking it writes no index entry),
            // from the rows of the first HELD_COUNT_SPAN jobs of each queue in its order: a
            // worker takes jobs from the head, so they are all there (see `HELD_COUNT_SPAN`).
            counts: format!(
                "with queues as (
                     select q.jobs, {held} as held
                     from (select queue, count(*) as jobs from {t} where state = 'available'
                           group by queue) q
                 ),
                 live as (select coalesce(sum(jobs), 0){int8} as jobs,
                                 coalesce(sum(held), 0){int8} as held
                          from queues)
                 select 'available', jobs - held from live
                 -- and the jobs a worker of the earlier schema holds, stored `running`
                 union all select 'running', held + (select count(*) from {t}
                                                    where {LEGACY_RUNNING}) from live
                 union all select 'completed', count(*) from
                     (select 1 from {t} where state = 'completed'
                      order by state, finished_at limit {TERMINAL_COUNT_CAP}) c
                 union all select 'dead', count(*) from
                     (select 1 from {t} where state = 'dead'
                      order by state, finished_at limit {TERMINAL_COUNT_CAP}) d
                 union all select 'estimated total', {}",
                estimated_total(&t),
                held = held_at_head(&t, "")
            )
            .into(),
            // Per queue: the jobs due, from the fetch index alone, less the held ones at its head
            // (as for the counts); the oldest waiting job is the first of the queue's order that
            // no worker holds, found past the held ones.
            backlog: format!(
                "select queue, ready, {} from
                     (select q.queue, q.due - {held} as ready,
                             (select w.run_at from {t} w
                              where w.queue = q.queue and {WAITING_W} and w.run_at <= {now}
                              order by w.run_at, w.id limit 1) as oldest
                      from (select queue, count(*) as due from {t}
                            where state = 'available' and run_at <= {now}
                            group by queue) q) b
                 where ready > 0
                 order by queue",
                as_micros(&format!("{now} - oldest")),
                held = held_at_head(&t, &format!("and h.run_at <= {now}")),
                WAITING_W = "w.state = 'available' and w.leased_until is null",
            )
            .into(),
            list: format!("select {columns} from {t}").into(),
            held: own.held.into(),
            // The newest dead job of a key comes back, and only when no other job holds the key:
            // a live one, or a finished one kept by a unique policy.
            replay: format!(
                "update {t} as j
                 set state = 'available', attempt = 0, run_at = {now}, finished_at = null,
                     leased_until = null
                 where j.state = 'dead'
                   and ($1{int8} is null or j.id = $1) and ($2{text} is null or j.kind = $2)
                   and j.id = (select max(d.id) from {t} d
                               where d.job_key = j.job_key and d.state = 'dead')
                   and not {}
                 returning id",
                other_holder(&t)
            )
            .into(),
            notify: own.notify.map(Arc::from),
            prune_jobs: own.prune_jobs.into(),
            count_prunable_jobs: own.count_prunable_jobs.into(),
        }
    }
}
