//! The consumer offsets' SQL for SQLite. Times are integer microseconds since the Unix epoch.

use sqlx::sqlite::Sqlite;

use crate::error::Error;
use crate::store::offsets::{OffsetDialect, OffsetSql, OffsetStore};
use crate::table::TableName;
use jobguard_core::sql::sqlite::NOW_MICROS as NOW;

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
        // Under SQLite's one write lock, the later of two owners' commits still never moves
        // the stored offset back.
        Ok(OffsetSql::new(
            table,
            &t,
            &a,
            create,
            OffsetDialect {
                now: NOW,
                greatest: "max",
                attempt_setup: None,
            },
        ))
    }

    crate::store::offsets::offset_statements!();
}
