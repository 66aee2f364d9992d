//! Consumer offsets kept with the effects: for a log broker (Kafka), the next offset of each
//! partition a consumer group takes, written in the transaction that applied the messages
//! before it, and the runs started of the message at it (`<table>_attempts`), written before
//! each run. The statements each backend builds from the table name, and their interface;
//! the binding and decoding, the same on every backend, are written once in
//! [`offset_statements`].

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use crate::table::TableName;

/// The table offsets are kept in unless told otherwise.
pub const DEFAULT_OFFSETS_TABLE: &str = "jobguard_consumer_offsets";

/// Where a consumer group stands in one partition: the offset of the next message to take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position<'a> {
    /// The consumer group.
    pub group: &'a str,
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
    /// The offset of the first message not yet applied (or dead-lettered).
    pub next_offset: i64,
}

/// The offset table's statements, built once from its validated table name.
#[derive(Debug)]
pub struct OffsetSql {
    pub(crate) table: TableName,
    pub(crate) create: Vec<Arc<str>>,
    /// `$1` group, `$2` topic, `$3` partition, `$4` next offset: upsert, never moving back.
    pub(crate) store: Arc<str>,
    /// `$1` group, `$2` topic: `(partition, next_offset)` rows.
    pub(crate) read: Arc<str>,
    /// `$1` group, `$2` topic: deletes their rows.
    pub(crate) forget: Arc<str>,
    /// Run first in the transaction that counts an attempt, when the backend needs one
    /// (PostgreSQL: that transaction's commit does not wait for the disk).
    pub(crate) attempt_setup: Option<Arc<str>>,
    /// `$1` group, `$2` topic, `$3` partition, `$4` the offset of the message about to run:
    /// counts one run of it started, and returns the runs started of it (a row for another
    /// offset starts again at 1).
    pub(crate) attempt: Arc<str>,
    /// `$1` group, `$2` topic: deletes their attempt counts.
    pub(crate) forget_attempts: Arc<str>,
    /// `$1` group, `$2` topic, `$3` partition, `$4` next offset: sets the row to it, lower or
    /// not (a recreated topic starts again below what was stored for the old one).
    pub(crate) reset: Arc<str>,
}

/// What the offset statements of one dialect differ in; the rest of their text is written
/// once, in [`OffsetSql::new`].
pub(crate) struct OffsetDialect {
    /// The expression of the current time, as the tables' `updated_at` holds it.
    pub now: &'static str,
    /// The function of the larger of two values.
    pub greatest: &'static str,
    /// Run first in the transaction that counts an attempt, if the dialect needs it.
    pub attempt_setup: Option<&'static str>,
}

impl OffsetSql {
    /// The statements on the offsets table `t` and its attempts table `a`, both as SQL writes
    /// them, made by `create`.
    pub(crate) fn new(
        table: &TableName,
        t: &str,
        a: &str,
        create: Vec<String>,
        dialect: OffsetDialect,
    ) -> Self {
        let OffsetDialect {
            now,
            greatest,
            attempt_setup,
        } = dialect;
        OffsetSql {
            table: table.clone(),
            create: create.into_iter().map(Arc::from).collect(),
            // In the transaction of the effects: the row commits with them or not at all. Two
            // owners of a partition during a rebalance take turns on the row; the later
            // commit never moves it back.
            store: format!(
                "insert into {t} (consumer_group, topic, partition, next_offset)
                 values ($1, $2, $3, $4)
                 on conflict (consumer_group, topic, partition) do update
                 set next_offset = {greatest}({t}.next_offset, excluded.next_offset),
                     updated_at = {now}"
            )
            .into(),
            read: format!(
                "select partition, next_offset from {t}
                 where consumer_group = $1 and topic = $2 order by partition"
            )
            .into(),
            forget: format!("delete from {t} where consumer_group = $1 and topic = $2").into(),
            attempt_setup: attempt_setup.map(Arc::from),
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
                     updated_at = {now}
                 returning runs"
            )
            .into(),
            forget_attempts: format!("delete from {a} where consumer_group = $1 and topic = $2")
                .into(),
            reset: format!(
                "insert into {t} (consumer_group, topic, partition, next_offset)
                 values ($1, $2, $3, $4)
                 on conflict (consumer_group, topic, partition) do update
                 set next_offset = excluded.next_offset, updated_at = {now}"
            )
            .into(),
        }
    }
}

/// The offset statements each backend implements, in its `offsets.rs`.
pub trait OffsetStore: sqlx::Database {
    fn offset_sql(table: &TableName) -> crate::Result<OffsetSql>;

    /// Records `position` on the caller's connection, usually inside the transaction that
    /// applied the messages before it. An offset lower than the one stored leaves the row as
    /// it is: a consumer that lost the partition in a rebalance and commits late never moves
    /// its new owner back.
    fn store_offset(
        conn: &mut Self::Connection,
        sql: &OffsetSql,
        position: &Position<'_>,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// The stored next offset of each partition of `topic` for `group`.
    fn read_offsets(
        conn: &mut Self::Connection,
        sql: &OffsetSql,
        group: &str,
        topic: &str,
    ) -> impl Future<Output = sqlx::Result<BTreeMap<i32, i64>>> + Send;

    /// Counts one run started of the message at `position.next_offset`, on the caller's
    /// connection (in a transaction of its own, committed before the message runs): the runs
    /// started of it, this one included.
    fn count_attempt(
        conn: &mut Self::Connection,
        sql: &OffsetSql,
        position: &Position<'_>,
    ) -> impl Future<Output = sqlx::Result<i64>> + Send;

    /// Sets the stored offset of `position`'s partition to `position.next_offset`, even below
    /// the stored one.
    fn reset_offset(
        conn: &mut Self::Connection,
        sql: &OffsetSql,
        position: &Position<'_>,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Deletes the stored offsets of `group` in `topic`, and their attempt counts; how many
    /// partitions had an offset.
    fn forget_offsets(
        conn: &mut Self::Connection,
        sql: &OffsetSql,
        group: &str,
        topic: &str,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

/// A query bound to a position: `$1` group, `$2` topic, `$3` partition, `$4` next offset.
macro_rules! bind_position {
    ($query:expr, $position:expr) => {
        $query
            .bind($position.group)
            .bind($position.topic)
            .bind($position.partition)
            .bind($position.next_offset)
    };
}

pub(crate) use bind_position;

/// The offset statements' binding and decoding, the same on every backend: only their SQL
/// differs, and that comes from the backend's [`OffsetSql`]. Expanded inside each
/// `impl OffsetStore`, where the backend's types are concrete.
macro_rules! offset_statements {
    () => {
        async fn store_offset(
            conn: &mut Self::Connection,
            sql: &$crate::store::offsets::OffsetSql,
            position: &$crate::store::offsets::Position<'_>,
        ) -> sqlx::Result<()> {
            $crate::store::offsets::bind_position!(
                sqlx::query(sqlx::AssertSqlSafe(&*sql.store)),
                position
            )
            .execute(conn)
            .await?;
            Ok(())
        }

        async fn count_attempt(
            conn: &mut Self::Connection,
            sql: &$crate::store::offsets::OffsetSql,
            position: &$crate::store::offsets::Position<'_>,
        ) -> sqlx::Result<i64> {
            if let Some(setup) = &sql.attempt_setup {
                sqlx::query(sqlx::AssertSqlSafe(&**setup))
                    .execute(&mut *conn)
                    .await?;
            }
            let (runs,): (i64,) = $crate::store::offsets::bind_position!(
                sqlx::query_as(sqlx::AssertSqlSafe(&*sql.attempt)),
                position
            )
            .fetch_one(conn)
            .await?;
            Ok(runs)
        }

        async fn reset_offset(
            conn: &mut Self::Connection,
            sql: &$crate::store::offsets::OffsetSql,
            position: &$crate::store::offsets::Position<'_>,
        ) -> sqlx::Result<()> {
            $crate::store::offsets::bind_position!(
                sqlx::query(sqlx::AssertSqlSafe(&*sql.reset)),
                position
            )
            .execute(conn)
            .await?;
            Ok(())
        }

        async fn read_offsets(
            conn: &mut Self::Connection,
            sql: &$crate::store::offsets::OffsetSql,
            group: &str,
            topic: &str,
        ) -> sqlx::Result<std::collections::BTreeMap<i32, i64>> {
            let rows: Vec<(i32, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(&*sql.read))
                .bind(group)
                .bind(topic)
                .fetch_all(conn)
                .await?;
            Ok(rows.into_iter().collect())
        }

        async fn forget_offsets(
            conn: &mut Self::Connection,
            sql: &$crate::store::offsets::OffsetSql,
            group: &str,
            topic: &str,
        ) -> sqlx::Result<u64> {
            sqlx::query(sqlx::AssertSqlSafe(&*sql.forget_attempts))
                .bind(group)
                .bind(topic)
                .execute(&mut *conn)
                .await?;
            let done = sqlx::query(sqlx::AssertSqlSafe(&*sql.forget))
                .bind(group)
                .bind(topic)
                .execute(conn)
                .await?;
            Ok(done.rows_affected())
        }
    };
}

pub(crate) use offset_statements;
