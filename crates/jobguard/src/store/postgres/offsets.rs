//! The consumer offsets' SQL for PostgreSQL.

use std::sync::Arc;

use sqlx::postgres::Postgres;

use crate::store::offsets::{OffsetSql, OffsetStore};
use crate::table::TableName;

impl OffsetStore for Postgres {
    fn offset_sql(table: &TableName) -> crate::Result<OffsetSql> {
        let t = table.quoted();
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
        })
    }

    crate::store::offsets::offset_statements!();
}
