//! The console's SQL for SQLite. Times are integer microseconds since the Unix epoch.

use sqlx::sqlite::Sqlite;

use crate::store::console::{self, ConsoleSql, ConsoleStore, ConsoleTables};
use crate::store::queue::sql::job_row_columns;
use crate::store::queue::{WAITING, other_holder, queue_states};
use jobguard_core::sql::sqlite::NOW_MICROS as NOW;

impl ConsoleStore for Sqlite {
    fn console_sql(tables: &ConsoleTables) -> ConsoleSql {
        console_sql(tables)
    }

    crate::store::console::console_statements!();
}

fn console_sql(tables: &ConsoleTables) -> ConsoleSql {
    let t = tables.jobs.quoted();
    let columns = job_row_columns(&super::queue::DIALECT);
    ConsoleSql {
        // Each filter has an index that hands rows out newest first (see the queue's
        // migration).
        job: format!("select {columns}, leased_until, lease_token from {t} where id = $1").into(),
        state_of: console::state_of(&t).into(),
        live_holder: console::live_holder(&t).into(),
        // A dead job comes back with fresh attempts, as a replay; a failed job waiting for its
        // backoff runs now. Never while another live job holds the key.
        retry: format!(
            "update {t} as j
             set state = 'available',
                 attempt = case when j.state = 'dead' then 0 else j.attempt end,
                 run_at = {NOW}, finished_at = null, leased_until = null
             where j.id = $1
               and (j.state = 'dead' or (j.state = 'available' and j.leased_until is null
                    and j.last_error is not null))
               and not {other_holder}
             returning queue",
            other_holder = other_holder(&t)
        )
        .into(),
        cancel: format!(
            "update {t} set state = 'dead', finished_at = {NOW}, leased_until = null,
                 last_error = $2
             where id = $1 and {WAITING}
             returning queue"
        )
        .into(),
        delete: console::delete(&t).into(),
        set_paused: format!(
            "insert into {q} (name, paused, changed_at) values ($1, $2, {NOW})
             on conflict (name) do update set paused = excluded.paused, changed_at = {NOW}",
            q = queue_states(&tables.jobs)
        )
        .into(),
        queues: format!(
            "select name, paused, changed_at from {} order by name",
            queue_states(&tables.jobs)
        )
        .into(),
        key_record: format!(
            "select kind, applied_at, fingerprint, result, claim_token from {} where job_key = $1",
            tables.guard.quoted()
        )
        .into(),
        key_steps: format!(
            "select step, kind, state, attempts, result, reason, started_at, updated_at
             from {} where job_key = $1 order by started_at, step",
            tables.steps.quoted()
        )
        .into(),
        // SQLite compares text byte by byte: the unique index on `id` serves the range.
        key_messages: format!(
            "select id, topic, state, attempts, last_error, created_at, sent_at
             from {} where id >= $1 and id < $2 order by id",
            tables.outbox.quoted()
        )
        .into(),
    }
}
