//! The periodic schedules' SQL for PostgreSQL.

use sqlx::postgres::Postgres;

use crate::store::schedules::{ScheduleSql, ScheduleStore, create_table, schedules_table};
use crate::table::TableName;

impl ScheduleStore for Postgres {
    fn schedule_sql(jobs: &TableName) -> crate::Result<ScheduleSql> {
        let table = schedules_table(jobs)?;
        let mut create = table.schema_statements();
        create.push(create_table(&table));
        Ok(ScheduleSql::new(&table, create))
    }

    crate::store::schedules::schedule_statements!();
}
