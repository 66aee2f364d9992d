//! The step ledger's SQL for SQLite. Times are integer microseconds since the Unix epoch by the
//! database clock; durations arrive as microseconds.

use std::sync::Arc;

use sqlx::sqlite::Sqlite;

use crate::store::steps::{self, StepSql, StepStore};
use crate::table::TableName;
use jobguard_core::sql::sqlite::NOW_MICROS as NOW;

impl StepStore for Sqlite {
    fn step_sql(table: &TableName) -> StepSql {
        let t = table.quoted();
        let mut create = vec![format!(
            "create table if not exists {t} (
                    job_key     text not null,
                    step        text not null,
                    kind        text not null,
                    state       text not null check (state in ('started', 'done', 'attention')),
                    token       blob not null,
                    attempts    integer not null default 1,
                    lease_until integer not null,
                    result      text,
                    reason      text,
                    started_at  integer not null,
                    updated_at  integer not null,
                    primary key (job_key, step)
                )"
        )];
        create.extend(crate::store::steps::step_indexes(table));
        let (held, key) = (crate::store::steps::HELD, crate::store::steps::KEY);
        let sql = |text: String| -> Arc<str> { text.into() };
        StepSql {
            table: table.clone(),
            create: create.into_iter().map(Into::into).collect(),
            // Committed on its own before the call: from here on, a crash leaves a trace that
            // the next delivery reconciles instead of calling blindly.
            start: sql(format!(
                "insert into {t}
                     (job_key, step, kind, state, token, lease_until, started_at, updated_at)
                 values ($1, $2, $3, 'started', $4, {NOW} + $5, {NOW}, {NOW})
                 on conflict (job_key, step) do nothing"
            )),
            read: sql(format!(
                "select state, token, max(lease_until - {NOW}, 0), result, reason
                 from {t} {key}"
            )),
            // Only an expired lease can be taken over, and only by one delivery: the token
            // it read must still be there.
            take_over: sql(format!(
                "update {t} set token = $4, lease_until = {NOW} + $5, attempts = attempts + 1,
                        updated_at = {NOW}
                 {held} and lease_until <= {NOW}"
            )),
            done: sql(format!(
                "update {t} set state = 'done', result = $4, updated_at = {NOW} {held}"
            )),
            expire: sql(format!(
                "update {t} set lease_until = {NOW}, updated_at = {NOW} {held}"
            )),
            attention: sql(format!(
                "update {t} set state = 'attention', reason = $4, updated_at = {NOW} {held}"
            )),
            forget: sql(steps::forget(&t)),
            resolve_done: sql(format!(
                "update {t} set state = 'done', result = $3, updated_at = {NOW}
                 {key} and state = 'attention'"
            )),
            resolve_not_done: sql(steps::resolve_not_done(&t)),
            stale: sql(format!(
                "select job_key, step, attempts, token from {t}
                 where state = 'started' and lease_until <= {NOW}
                 order by lease_until limit $1"
            )),
            list_attention: sql(steps::list_attention(&t)),
            prunable: sql(format!(
                "select count(*) from {t} where state = 'done' and updated_at < $1"
            )),
            // Only `done` steps: a `started` step's caller may be calling right now, or vanished
            // and must be reconciled; an `attention` step waits for an operator.
            prune: sql(format!(
                "delete from {t} where rowid in (
                     select rowid from {t} where state = 'done' and updated_at < $1
                     order by updated_at limit $2)"
            )),
        }
    }

    crate::store::steps::step_statements!();
}
