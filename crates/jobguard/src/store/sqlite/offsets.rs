//! The consumer offsets' SQL for SQLite. Times are integer microseconds since the Unix epoch.

use std::sync::Arc;

use sqlx::sqlite::Sqlite;

use super::guard::NOW_MICROS as NOW;
use crate::error::Error;
use crate::store::offsets::{OffsetSql, OffsetStore};
use crate::table::TableName;

impl OffsetStore for Sqlite {
    fn offset_sql(table: &TableName) -> crate::Result<OffsetSql> {
        if let Some(schema) = table.schema() {
            return Err(Error::InvalidName {
                what: "schema (SQLite has none)",
                name: schema.into(),
            });
        }
        let t = table.quoted();
        let a = table.derived("attempts");
        let create = vec![
            format!(
                "create table if not exists {t} (
                consumer_group text not null,
                topic          text not null,
                partition      integer not null,
                next_offset    integer not null,
                updated_at     integer not null default ({NOW}),
                primary key (consumer_group, topic, partition)
            )"
            ),
            format!(
                "create table if not exists {a} (
                consumer_group text not null,
                topic          text not null,
                partition      integer not null,
                message_offset integer not null,
                runs           integer not null,
                updated_at     integer not null default ({NOW}),
                primary key (consumer_group, topic, partition)
            )"
            ),
        ];
        Ok(OffsetSql {
            table: table.clone(),
            create: create.into_iter().map(Arc::from).collect(),
            // In the transaction of the effects (under SQLite's one write lock); the later of
            // two owners' commits never moves the row back.
            store: format!(
                "insert into {t} (consumer_group, topic, partition, next_offset)
                 values ($1, $2, $3, $4)
                 on conflict (consumer_group, topic, partition) do update
                 set next_offset = max({t}.next_offset, excluded.next_offset),
                     updated_at = {NOW}"
            )
            .into(),
            read: format!(
                "select partition, next_offset from {t}
                 where consumer_group = $1 and topic = $2 order by partition"
            )
            .into(),
            forget: format!("delete from {t} where consumer_group = $1 and topic = $2").into(),
            attempt_setup: None,
            // Committed before the message runs, so that a run that kills its consumer is
            // counted all the same.
            attempt: format!(
                "insert into {a} (consumer_group, topic, partition, message_offset, runs)
                 values ($1, $2, $3, $4, 1)
                 on conflict (consumer_group, topic, partition) do update
                 set runs = case when {a}.message_offset = excluded.message_offset
                                 then {a}.runs + 1 else 1 end,
                     message_offset = excluded.message_offset,
                     updated_at = {NOW}
                 returning runs"
            )
            .into(),
            forget_attempts: format!("delete from {a} where consumer_group = $1 and topic = $2")
                .into(),
            reset: format!(
                "insert into {t} (consumer_group, topic, partition, next_offset)
                 values ($1, $2, $3, $4)
                 on conflict (consumer_group, topic, partition) do update
                 set next_offset = excluded.next_offset, updated_at = {NOW}"
            )
            .into(),
        })
    }

    crate::store::offsets::offset_statements!();
}
