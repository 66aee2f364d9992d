//! The outbox's SQL for SQLite. Times are integer microseconds since the Unix epoch by the
//! database clock; durations arrive as microseconds.

use std::sync::Arc;

use sqlx::sqlite::Sqlite;

use crate::error::Error;
use crate::store::outbox::{self, OutboxSql, OutboxStore};
use crate::table::TableName;
use jobguard_core::sql::sqlite::NOW_MICROS as NOW;

impl OutboxStore for Sqlite {
    fn outbox_sql(table: &TableName) -> crate::Result<OutboxSql> {
        if let Some(schema) = table.schema() {
            return Err(Error::InvalidName {
                what: "schema (SQLite has none)",
                name: schema.into(),
            });
        }
        Ok(outbox_sql(table))
    }

    crate::store::outbox::outbox_statements!();
}

fn outbox_sql(table: &TableName) -> OutboxSql {
    let t = table.quoted();
    let lease = table.derived("relay");
    let mut create = vec![
        // `seq` is the order of the outbox: per topic, the relay delivers by it. SQLite has
        // one writer at a time, so seq order is commit order.
        format!(
            "create table if not exists {t} (
                seq             integer primary key autoincrement,
                id              text not null unique,
                topic           text not null,
                payload         text not null,
                fingerprint     blob not null,
                state           text not null default 'pending'
                                check (state in ('pending', 'sent', 'dead')),
                attempts        integer not null default 0,
                next_attempt_at integer not null,
                last_error      text,
                created_at      integer not null,
                sent_at         integer
            )"
        ),
    ];
    create.extend(crate::store::outbox::outbox_indexes(table));
    create.push(format!(
        "create table if not exists {lease} (
            name         text primary key not null,
            holder       text not null,
            leased_until integer not null
        )"
    ));
    OutboxSql {
        table: table.clone(),
        create: create.into_iter().map(Arc::from).collect(),
        // The unique id makes publishing idempotent: a job that runs again writes nothing.
        publish: format!(
            "insert into {t} (id, topic, payload, fingerprint, next_attempt_at, created_at)
             values ($1, $2, $3, $4, {NOW}, {NOW})
             on conflict (id) do nothing
             returning seq"
        )
        .into(),
        fingerprint: outbox::fingerprint(&t).into(),
        // In order per topic: a message is due only when no earlier message of its topic is
        // pending and backing off. Per topic the result is therefore a prefix of its pending
        // messages in seq order, which the relay delivers one by one.
        due: format!(
            "select m.seq, m.id, m.topic, m.payload, m.attempts, m.created_at
             from {t} m
             where m.state = 'pending' and m.next_attempt_at <= {NOW}
               and not exists (select 1 from {t} e
                               where e.topic = m.topic and e.state = 'pending'
                                 and e.next_attempt_at > {NOW} and e.seq < m.seq)
             order by m.seq
             limit $1"
        )
        .into(),
        // At least once: a message becomes sent only after the sink confirmed it, and only
        // from pending, so a dead-lettered or replayed message is not overwritten by a relay
        // that overlapped this one.
        sent: format!(
            "update {t} set state = 'sent', sent_at = {NOW}, attempts = attempts + 1
             where seq = $1 and state = 'pending'"
        )
        .into(),
        retry: format!(
            "update {t} set attempts = attempts + 1, next_attempt_at = {NOW} + $2, last_error = $3
             where seq = $1 and state = 'pending'"
        )
        .into(),
        dead: crate::store::outbox::dead_sql(&t).into(),
        // One relay at a time: the row is taken when free or expired (by the database clock)
        // and renewed by its holder. SQLite's single writer makes the upsert atomic.
        take_lease: format!(
            "insert into {lease} as l (name, holder, leased_until)
             values ('relay', $1, {NOW} + $2)
             on conflict (name) do update
                 set holder = excluded.holder, leased_until = excluded.leased_until
                 where l.holder = excluded.holder or l.leased_until < {NOW}
             returning 1"
        )
        .into(),
        release_lease: outbox::release_lease(&lease).into(),
        counts: outbox::counts(&t).into(),
        list: format!(
            "select id, topic, state, attempts, next_attempt_at, last_error, created_at, sent_at,
                    payload
             from {t}
             where ($1 is null or state = $1)
             order by seq desc limit $2"
        )
        .into(),
        replay: format!(
            "update {t} set state = 'pending', attempts = 0, next_attempt_at = {NOW}
             where state = 'dead' and ($1 is null or id = $1)
             returning id"
        )
        .into(),
        prune: format!("delete from {t} where state = 'sent' and sent_at < {NOW} - $1").into(),
    }
}
