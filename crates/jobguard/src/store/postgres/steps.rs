//! The step ledger's SQL for PostgreSQL. Leases are computed by the database clock, so workers
//! on machines with drifting clocks agree on when a lease has expired.

use std::sync::Arc;

use sqlx::postgres::Postgres;

use crate::store::steps::{self, StepSql, StepStore};
use crate::table::TableName;

impl StepStore for Postgres {
    fn step_sql(table: &TableName) -> StepSql {
        let t = table.quoted();
        let micros = "* interval '1 microsecond'";
        let mut create = table.schema_statements();
        create.extend([format!(
            "create table if not exists {t} (
                    job_key     text not null,
                    step        text not null,
                    kind        text not null,
                    state       text not null check (state in ('started', 'done', 'attention')),
                    token       bytea not null,
                    attempts    integer not null default 1,
                    lease_until timestamptz not null,
                    result      jsonb,
                    reason      text,
                    started_at  timestamptz not null default now(),
                    updated_at  timestamptz not null default now(),
                    primary key (job_key, step)
                )"
        )]);
        create.extend(crate::store::steps::step_indexes(table));
        let (held, key) = (crate::store::steps::HELD, crate::store::steps::KEY);
        // Prune cutoffs arrive as microseconds since the Unix epoch.
        let cutoff = "timestamptz 'epoch' + $1 * interval '1 microsecond'";
        let sql = |text: String| -> Arc<str> { text.into() };
        StepSql {
            table: table.clone(),
            create: create.into_iter().map(Into::into).collect(),
            // Committed on its own before the call: from here on, a crash leaves a trace that
            // the next delivery reconciles instead of calling blindly.
            start: sql(format!(
                "insert into {t} (job_key, step, kind, state, token, lease_until)
                 values ($1, $2, $3, 'started', $4, now() + $5 {micros})
                 on conflict (job_key, step) do nothing"
            )),
            read: sql(format!(
                "select state, token,
                        (extract(epoch from greatest(lease_until - now(), interval '0'))
                         * 1000000)::bigint,
                        result, reason
                 from {t} {key}"
            )),
            // Only an expired lease can be taken over, and only by one delivery: the token
            // it read must still be there.
            take_over: sql(format!(
                "update {t} set token = $4, lease_until = now() + $5 {micros},
                        attempts = attempts + 1, updated_at = now()
                 {held} and lease_until <= now()"
            )),
            done: sql(format!(
                "update {t} set state = 'done', result = $4, updated_at = now() {held}"
            )),
            expire: sql(format!(
                "update {t} set lease_until = now(), updated_at = now() {held}"
            )),
            attention: sql(format!(
                "update {t} set state = 'attention', reason = $4, updated_at = now() {held}"
            )),
            forget: sql(steps::forget(&t)),
            resolve_done: sql(format!(
                "update {t} set state = 'done', result = $3, updated_at = now()
                 {key} and state = 'attention'"
            )),
            resolve_not_done: sql(steps::resolve_not_done(&t)),
            stale: sql(format!(
                "select job_key, step, attempts, token from {t}
                 where state = 'started' and lease_until <= now()
                 order by lease_until limit $1"
            )),
            list_attention: sql(steps::list_attention(&t)),
            prunable: sql(format!(
                "select count(*) from {t} where state = 'done' and updated_at < {cutoff}"
            )),
            // Only `done` steps: a `started` step's caller may be calling right now, or vanished
            // and must be reconciled; an `attention` step waits for an operator. A batch is
            // found by the index and deleted by row address, in one statement.
            prune: sql(format!(
                "delete from {t} where ctid = any(array(
                     select ctid from {t} where state = 'done' and updated_at < {cutoff}
                     order by updated_at limit $2))"
            )),
        }
    }

    crate::store::steps::step_statements!();
}
