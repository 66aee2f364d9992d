//! The periodic schedules' state table (`<jobs table>_schedules`): one row per schedule with
//! the time of its last firing enqueued and the job that firing produced, written in the
//! transaction that enqueues the firing. Its statements are the same text on both backends
//! (times are whole seconds since the Unix epoch, in `bigint` columns); the binding and
//! decoding are written once in [`schedule_statements`].

use std::future::Future;
use std::sync::Arc;

use jobguard_core::sql::schedules;

use crate::table::TableName;

/// The schedules table's statements, built once from its validated name.
#[derive(Debug)]
pub struct ScheduleSql {
    pub(crate) table: TableName,
    pub(crate) create: Vec<Arc<str>>,
    /// `$1` name, `$2` cron, `$3` zone, `$4` kind, `$5` queue, `$6` now: inserts the row, or
    /// updates its definition; returns `(created_at, last_fired_at)`.
    pub(crate) register: Arc<str>,
    /// `$1` name: `(created_at, last_fired_at)`.
    pub(crate) read: Arc<str>,
    /// `$1` name, `$2` the firing's time, `$3` now: takes the firing (the schedule's row moved
    /// to it) unless it or a later one was taken; returns the name when it took it.
    pub(crate) advance: Arc<str>,
    /// `$1` name, `$2` the firing's time, `$3` its job, `$4` now: records the firing's job.
    pub(crate) fired: Arc<str>,
    /// `$1` name, `$2` the firing's time: the job recorded for it, while it is the last.
    pub(crate) firing_job: Arc<str>,
    /// Every row, by name.
    pub(crate) list: Arc<str>,
}

/// A schedule's row as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleRow {
    /// The schedule's name.
    pub name: String,
    /// Its cron expression, as the last scheduler to start had it.
    pub cron: String,
    /// Its time zone.
    pub zone: String,
    /// The kind of its jobs.
    pub kind: String,
    /// The queue its jobs go to.
    pub queue: String,
    /// When a scheduler first ran it (seconds since the epoch): no firing before is missed.
    pub created_at: i64,
    /// The time of its last firing enqueued (seconds since the epoch), if any.
    pub last_fired_at: Option<i64>,
    /// The job that firing produced.
    pub last_job_id: Option<i64>,
}

impl ScheduleSql {
    /// The statements on the schedules table `table`, created by `create`: the core's text,
    /// which the Python scheduler runs too.
    pub(crate) fn new(table: &TableName, create: Vec<String>) -> Self {
        ScheduleSql {
            table: table.clone(),
            create: create.into_iter().map(Arc::from).collect(),
            register: schedules::register(table).into(),
            read: schedules::read(table).into(),
            advance: schedules::advance(table).into(),
            fired: schedules::fired(table).into(),
            firing_job: schedules::firing_job(table).into(),
            list: schedules::list(table).into(),
        }
    }
}

/// The schedules table's statements each backend implements, in its `schedules.rs`.
pub trait ScheduleStore: sqlx::Database {
    /// The statements on the schedules table of the jobs table `jobs`.
    fn schedule_sql(jobs: &TableName) -> crate::Result<ScheduleSql>;

    /// Inserts or updates the schedule's row; its `(created_at, last_fired_at)`.
    fn register_schedule(
        conn: &mut Self::Connection,
        sql: &ScheduleSql,
        row: &ScheduleRow,
        now: i64,
    ) -> impl Future<Output = sqlx::Result<(i64, Option<i64>)>> + Send;

    /// The schedule's `(created_at, last_fired_at)`, if it has a row.
    fn read_schedule(
        conn: &mut Self::Connection,
        sql: &ScheduleSql,
        name: &str,
    ) -> impl Future<Output = sqlx::Result<Option<(i64, Option<i64>)>>> + Send;

    /// Takes the firing at `at` on the firing's transaction, before its job is enqueued: the
    /// schedule's row moved to it. False when it, or a later firing, was taken already.
    fn advance_schedule(
        conn: &mut Self::Connection,
        sql: &ScheduleSql,
        name: &str,
        at: i64,
        now: i64,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// The job recorded for the firing at `at`, while it is the schedule's last.
    fn firing_job(
        conn: &mut Self::Connection,
        sql: &ScheduleSql,
        name: &str,
        at: i64,
    ) -> impl Future<Output = sqlx::Result<Option<i64>>> + Send;

    /// Records the job of the firing at `at`, on the transaction that took it.
    fn record_firing(
        conn: &mut Self::Connection,
        sql: &ScheduleSql,
        name: &str,
        at: i64,
        job: i64,
        now: i64,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Every schedule's row.
    fn list_schedules(
        conn: &mut Self::Connection,
        sql: &ScheduleSql,
    ) -> impl Future<Output = sqlx::Result<Vec<ScheduleRow>>> + Send;
}

/// The schedule statements' binding and decoding, the same on every backend. Expanded inside
/// each `impl ScheduleStore`, where the backend's types are concrete.
macro_rules! schedule_statements {
    () => {
        async fn register_schedule(
            conn: &mut Self::Connection,
            sql: &$crate::store::schedules::ScheduleSql,
            row: &$crate::store::schedules::ScheduleRow,
            now: i64,
        ) -> sqlx::Result<(i64, Option<i64>)> {
            sqlx::query_as(sqlx::AssertSqlSafe(&*sql.register))
                .bind(&row.name)
                .bind(&row.cron)
                .bind(&row.zone)
                .bind(&row.kind)
                .bind(&row.queue)
                .bind(now)
                .fetch_one(conn)
                .await
        }

        async fn read_schedule(
            conn: &mut Self::Connection,
            sql: &$crate::store::schedules::ScheduleSql,
            name: &str,
        ) -> sqlx::Result<Option<(i64, Option<i64>)>> {
            sqlx::query_as(sqlx::AssertSqlSafe(&*sql.read))
                .bind(name)
                .fetch_optional(conn)
                .await
        }

        async fn advance_schedule(
            conn: &mut Self::Connection,
            sql: &$crate::store::schedules::ScheduleSql,
            name: &str,
            at: i64,
            now: i64,
        ) -> sqlx::Result<bool> {
            let took: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(&*sql.advance))
                .bind(name)
                .bind(at)
                .bind(now)
                .fetch_optional(conn)
                .await?;
            Ok(took.is_some())
        }

        async fn firing_job(
            conn: &mut Self::Connection,
            sql: &$crate::store::schedules::ScheduleSql,
            name: &str,
            at: i64,
        ) -> sqlx::Result<Option<i64>> {
            let job: Option<Option<i64>> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(&*sql.firing_job))
                    .bind(name)
                    .bind(at)
                    .fetch_optional(conn)
                    .await?;
            Ok(job.flatten())
        }

        async fn record_firing(
            conn: &mut Self::Connection,
            sql: &$crate::store::schedules::ScheduleSql,
            name: &str,
            at: i64,
            job: i64,
            now: i64,
        ) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(&*sql.fired))
                .bind(name)
                .bind(at)
                .bind(job)
                .bind(now)
                .execute(conn)
                .await?;
            Ok(())
        }

        async fn list_schedules(
            conn: &mut Self::Connection,
            sql: &$crate::store::schedules::ScheduleSql,
        ) -> sqlx::Result<Vec<$crate::store::schedules::ScheduleRow>> {
            type Row = (
                String,
                String,
                String,
                String,
                String,
                i64,
                Option<i64>,
                Option<i64>,
            );
            let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(&*sql.list))
                .fetch_all(conn)
                .await?;
            Ok(rows
                .into_iter()
                .map(
                    |(name, cron, zone, kind, queue, created_at, last_fired_at, last_job_id)| {
                        $crate::store::schedules::ScheduleRow {
                            name,
                            cron,
                            zone,
                            kind,
                            queue,
                            created_at,
                            last_fired_at,
                            last_job_id,
                        }
                    },
                )
                .collect())
        }
    };
}

pub(crate) use schedule_statements;

/// The schedules table of the jobs table `jobs`: `<jobs>_schedules`, in its schema.
pub(crate) fn schedules_table(jobs: &TableName) -> crate::Result<TableName> {
    schedules::table(jobs).map_err(crate::Error::from)
}

/// The columns, the same on both backends.
pub(crate) fn create_table(table: &TableName) -> String {
    schedules::create(table)
}
