//! The outbox's SQL for PostgreSQL. Times are computed by the database clock; durations arrive
//! as microseconds, and times leave as microseconds since the Unix epoch.

use std::sync::Arc;

use sqlx::postgres::Postgres;

use crate::store::outbox::{self, OutboxSql, OutboxStore};
use crate::table::TableName;

impl OutboxStore for Postgres {
    fn outbox_sql(table: &TableName) -> crate::Result<OutboxSql> {
        Ok(outbox_sql(table))
    }

    crate::store::outbox::outbox_statements!();
}

fn outbox_sql(table: &TableName) -> OutboxSql {
    let t = table.quoted();
    let lease = table.derived_qualified("relay");
    let micros = "* interval '1 microsecond'";
    let epoch = |column: &str| format!("(extract(epoch from {column}) * 1000000)::int8");
    let mut create = table.schema_statements();
    create.extend([
        // `seq` is the order of the outbox: per topic, the relay delivers by it.
        format!(
            "create table if not exists {t} (
                seq             bigserial primary key,
                id              text not null unique,
                topic           text not null,
                payload         jsonb not null,
                fingerprint     bytea not null,
                state           text not null default 'pending'
                                check (state in ('pending', 'sent', 'dead')),
                attempts        integer not null default 0,
                next_attempt_at timestamptz not null default now(),
                last_error      text,
                created_at      timestamptz not null default now(),
                sent_at         timestamptz
            )"
        ),
    ]);
    create.extend(crate::store::outbox::outbox_indexes(table));
    // A key's messages, as the console reads them: ids that start with `<key>/`, a range in
    // byte order whatever the database's collation.
    create.push(format!(
        "create index if not exists {} on {t} ((id collate \"C\"))",
        table.derived("id_bytes")
    ));
    create.extend([format!(
        "create table if not exists {lease} (
                name         text primary key,
                holder       text not null,
                leased_until timestamptz not null
            )"
    )]);
    OutboxSql {
        table: table.clone(),
        create: create.into_iter().map(Arc::from).collect(),
        // The unique id makes publishing idempotent: a job that runs again writes nothing. A
        // concurrent transaction publishing the same id makes this wait until it ends, then
        // insert (it rolled back) or do nothing (it committed).
        publish: format!(
            "insert into {t} (id, topic, payload, fingerprint) values ($1, $2, $3, $4)
             on conflict (id) do nothing
             returning seq"
        )
        .into(),
        // A new statement after the conflict: under read committed it sees the committed row.
        fingerprint: outbox::fingerprint(&t).into(),
        // In order per topic: a message is due only when no earlier message of its topic is
        // pending and backing off. Per topic the result is therefore a prefix of its pending
        // messages in seq order, which the relay delivers one by one.
        due: format!(
            "select m.seq, m.id, m.topic, m.payload, m.attempts, {created}
             from {t} m
             where m.state = 'pending' and m.next_attempt_at <= now()
               and not exists (select 1 from {t} e
                               where e.topic = m.topic and e.state = 'pending'
                                 and e.next_attempt_at > now() and e.seq < m.seq)
             order by m.seq
             limit $1",
            created = epoch("m.created_at"),
        )
        .into(),
        // At least once: a message becomes sent only after the sink confirmed it, and only
        // from pending, so a dead-lettered or replayed message is not overwritten by a relay
        // that overlapped this one.
        sent: format!(
            "update {t} set state = 'sent', sent_at = now(), attempts = attempts + 1
             where seq = $1 and state = 'pending'"
        )
        .into(),
        retry: format!(
            "update {t} set attempts = attempts + 1, next_attempt_at = now() + $2 {micros},
                            last_error = $3
             where seq = $1 and state = 'pending'"
        )
        .into(),
        dead: crate::store::outbox::dead_sql(&t).into(),
        // One relay at a time: the row is taken when free or expired (by the database clock)
        // and renewed by its holder; a concurrent taker waits on the primary key, then sees
        // the winner's row and gets nothing back.
        take_lease: format!(
            "insert into {lease} as l (name, holder, leased_until)
             values ('relay', $1, now() + $2 {micros})
             on conflict (name) do update
                 set holder = excluded.holder, leased_until = excluded.leased_until
                 where l.holder = excluded.holder or l.leased_until < now()
             returning 1::int8"
        )
        .into(),
        release_lease: outbox::release_lease(&lease).into(),
        counts: outbox::counts(&t).into(),
        list: format!(
            "select id, topic, state, attempts, {next}, last_error, {created}, {sent}, payload
             from {t}
             where ($1::text is null or state = $1)
             order by seq desc limit $2",
            next = epoch("next_attempt_at"),
            created = epoch("created_at"),
            sent = epoch("sent_at"),
        )
        .into(),
        replay: format!(
            "update {t} set state = 'pending', attempts = 0, next_attempt_at = now()
             where state = 'dead' and ($1::text is null or id = $1)
             returning id"
        )
        .into(),
        prune: format!("delete from {t} where state = 'sent' and sent_at < now() - $1 {micros}")
            .into(),
    }
}
