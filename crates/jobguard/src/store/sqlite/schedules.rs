//! The periodic schedules' SQL for SQLite.

use sqlx::sqlite::Sqlite;

use crate::store::schedules::{ScheduleSql, ScheduleStore, create_table, schedules_table};
use crate::table::TableName;

impl ScheduleStore for Sqlite {
    fn schedule_sql(jobs: &TableName) -> crate::Result<ScheduleSql> {
        let table = schedules_table(jobs)?;
        Ok(ScheduleSql::new(&table, vec![create_table(&table)]))
    }

    crate::store::schedules::schedule_statements!();
}
