//! The consumer offsets' SQL for PostgreSQL.

use sqlx::postgres::Postgres;

use crate::store::offsets::{OffsetDialect, OffsetSql, OffsetStore};
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
        Ok(OffsetSql::new(
            table,
            &t,
            &a,
            create,
            OffsetDialect {
                now: "now()",
                greatest: "greatest",
                // The count must outlive the consumer process, which is what it is for: a
                // commit in PostgreSQL's memory does. Not waiting for the disk keeps a run from
                // costing two flushes; a crash of the server itself may lose the last count, one
                // run uncounted.
                attempt_setup: Some("set local synchronous_commit = off"),
            },
        ))
    }

    crate::store::offsets::offset_statements!();
}
