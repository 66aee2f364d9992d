//! The consumer offsets' SQL for PostgreSQL.

use std::sync::Arc;

use sqlx::postgres::Postgres;

use crate::store::offsets::{OffsetSql, OffsetStore};
use crate::table::TableName;

impl OffsetStore for Postgres {
    fn offset_sql(table: &TableName) -> crate::Result<OffsetSql> {
        let t = table.quoted();
        let a = table.derived_qualified("attempts");
        let mut create = table.schema_statements();
        create.push(format!(
            "create table if not exists {t} (
                consumer_group text not null,
                topic          text not null,
                partition      integer not null,
                next_offset    bigint not null,
                updated_at     timestamptz not null default now(),
                primary key (consumer_group, topic, partition)
            )"
        ));
        create.push(format!(
            "create table if not exists {a} (
                consumer_group text not null,
                topic          text not null,
                partition      integer not null,
                message_offset bigint not null,
                runs           bigint not null,
                updated_at     timestamptz not null default now(),
                primary key (consumer_group, topic, partition)
            )"
        ));
        Ok(OffsetSql {
            table: table.clone(),
            create: create.into_iter().map(Arc::from).collect(),
            // In the transaction of the effects: the row commits with them or not at all. Two
            // owners of a partition during a rebalance take turns on the row; the later
            // commit never moves it back.
            store: format!(
                "insert into {t} (consumer_group, topic, partition, next_offset)
                 values ($1, $2, $3, $4)
                 on conflict (consumer_group, topic, partition) do update
                 set next_offset = greatest({t}.next_offset, excluded.next_offset),
                     updated_at = now()"
            )
            .into(),
            read: format!(
                "select partition, next_offset from {t}
                 where consumer_group = $1 and topic = $2 order by partition"
            )
            .into(),
            forget: format!("delete from {t} where consumer_group = $1 and topic = $2").into(),
            // The count must outlive the consumer process, which is what it is for: a commit
            // in PostgreSQL's memory does. Not waiting for the disk keeps a run from costing two
            // flushes; a crash of the server itself may lose the last count, one run uncounted.
            attempt_setup: Some("set local synchronous_commit = off".into()),
            // Committed before the message runs, so that a run that kills its consumer is
            // counted all the same. Two owners of a partition during a rebalance take turns on
            // the row, and both runs count.
            attempt: format!(
                "insert into {a} (consumer_group, topic, partition, message_offset, runs)
                 values ($1, $2, $3, $4, 1)
                 on conflict (consumer_group, topic, partition) do update
                 set runs = case when {a}.message_offset = excluded.message_offset
                                 then {a}.runs + 1 else 1 end,
                     message_offset = excluded.message_offset,
                     updated_at = now()
                 returning runs"
            )
            .into(),
            forget_attempts: format!("delete from {a} where consumer_group = $1 and topic = $2")
                .into(),
            reset: format!(
                "insert into {t} (consumer_group, topic, partition, next_offset)
                 values ($1, $2, $3, $4)
                 on conflict (consumer_group, topic, partition) do update
                 set next_offset = excluded.next_offset, updated_at = now()"
            )
            .into(),
        })
    }

    crate::store::offsets::offset_statements!();
}
