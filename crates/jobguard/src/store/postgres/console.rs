//! The console's SQL for PostgreSQL. Times come back as microseconds since the Unix epoch.

use sqlx::postgres::Postgres;

use super::queue::micros;
use crate::store::console::{self, ConsoleSql, ConsoleStore, ConsoleTables};
use crate::store::queue::sql::job_row_columns;
use crate::store::queue::{WAITING, other_holder, queue_states};

impl ConsoleStore for Postgres {
    fn console_sql(tables: &ConsoleTables) -> ConsoleSql {
        console_sql(tables)
    }

    crate::store::console::console_statements!();
}

fn console_sql(tables: &ConsoleTables) -> ConsoleSql {
    let t = tables.jobs.quoted();
    let columns = job_row_columns(&super::queue::DIALECT);
    ConsoleSql {
        // Each filter has an index that hands rows out newest first: the primary key for none,
        // `(state, id)`, `(kind, id)`, `(queue, id)` and `(job_key, id)` for one (see the
        // queue's migration); with several, the planner walks the most selective.
        job: format!(
            "select {columns}, {}, lease_token from {t} where id = $1",
            micros("leased_until")
        )
        .into(),
        state_of: console::state_of(&t).into(),
        live_holder: console::live_holder(&t).into(),
        // A dead job comes back with fresh attempts, as a replay; a failed job waiting for its
        // backoff runs now. Never while another job holds the key (live, or finished and kept
        // by its unique policy): the unique indexes would refuse it, and that job is the one to
        // watch.
        retry: format!(
            "update {t} j
             set state = 'available',
                 attempt = case when j.state = 'dead' then 0 else j.attempt end,
                 run_at = now(), finished_at = null, leased_until = null
             where j.id = $1
               and (j.state = 'dead' or (j.state = 'available' and j.leased_until is null
                    and j.last_error is not null))
               and not {other_holder}
             returning j.queue",
            other_holder = other_holder(&t)
        )
        .into(),
        // Only a job no worker holds: a running job's row is locked by its attempt's
        // transaction or fenced by its lease, and finishes on its own.
        cancel: format!(
            "update {t} set state = 'dead', finished_at = now(), leased_until = null,
                 last_error = $2
             where id = $1 and {WAITING}
             returning queue"
        )
        .into(),
        delete: console::delete(&t).into(),
        set_paused: format!(
            "insert into {q} (name, paused, changed_at) values ($1, $2, now())
             on conflict (name) do update set paused = excluded.paused, changed_at = now()",
            q = queue_states(&tables.jobs)
        )
        .into(),
        queues: format!(
            "select name, paused, {} from {} order by name",
            micros("changed_at"),
            queue_states(&tables.jobs)
        )
        .into(),
        key_record: format!(
            "select kind, {}, fingerprint, result, claim_token from {} where job_key = $1",
            micros("applied_at"),
            tables.guard.quoted()
        )
        .into(),
        key_steps: format!(
            "select step, kind, state, attempts, result, reason, {}, {}
             from {} where job_key = $1 order by started_at, step",
            micros("started_at"),
            micros("updated_at"),
            tables.steps.quoted()
        )
        .into(),
        // Byte order, as the outbox's `id_bytes` index keeps it: every id that starts with
        // `<key>/` lies between `<key>/` and `<key>0`.
        key_messages: format!(
            "select id, topic, state, attempts, last_error, {}, {}
             from {} where id collate \"C\" >= $1 and id collate \"C\" < $2
             order by id collate \"C\"",
            micros("created_at"),
            micros("sent_at"),
            tables.outbox.quoted()
        )
        .into(),
    }
}
