//! Consumer offsets kept in the database, with the effects they account for.
//!
//! A log broker (Kafka) hands a consumer group each partition's messages in order, and
//! remembers only how far the group got: its committed offset. Committed after the effects, it
//! lags them; a consumer that dies in between gets the messages again. [`Offsets`] keeps that
//! position in the database instead, written in the same transaction as the effects and their
//! guard rows, so that where the group stands and what it applied commit together: a consumer
//! that starts on a partition seeks to the stored offset and takes up exactly after what was
//! applied. The broker's own commits become an optimisation.

use std::collections::BTreeMap;
use std::sync::Arc;

use sqlx::{ConnectOptions as _, Connection as _, Pool};

use crate::error::Result;
use crate::store::Backend;
pub use crate::store::offsets::Position;
use crate::store::offsets::{DEFAULT_OFFSETS_TABLE, OffsetSql};
use crate::table::TableName;

/// The offsets table: `(consumer_group, topic, partition) -> next_offset`.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
/// use jobguard::broker::Offsets;
///
/// let offsets = Offsets::new(pool);
/// offsets.migrate().await?;
/// for (partition, next) in offsets.read("jobguard", "credits").await? {
///     println!("partition {partition}: next offset {next}");
/// }
/// # Ok(()) }
/// ```
pub struct Offsets<DB: Backend> {
    pool: Pool<DB>,
    sql: Arc<OffsetSql>,
}

impl<DB: Backend> Clone for Offsets<DB> {
    fn clone(&self) -> Self {
        Offsets {
            pool: self.pool.clone(),
            sql: Arc::clone(&self.sql),
        }
    }
}

impl<DB: Backend> Offsets<DB> {
    /// The offsets in the table `jobguard_consumer_offsets` of `pool`'s database.
    pub fn new(pool: Pool<DB>) -> Self {
        let table = TableName::new(DEFAULT_OFFSETS_TABLE).expect("the default name is valid");
        Self::in_table(pool, &table).expect("the default table has no schema")
    }

    /// The offsets in `table`. Fails with [`Error::InvalidName`](crate::Error::InvalidName)
    /// for a table in a schema on SQLite, which has none.
    pub fn in_table(pool: Pool<DB>, table: &TableName) -> Result<Self> {
        Ok(Offsets {
            pool,
            sql: Arc::new(DB::offset_sql(table)?),
        })
    }

    /// The table's name.
    pub fn table(&self) -> &TableName {
        &self.sql.table
    }

    /// Creates the table when missing.
    pub async fn migrate(&self) -> Result<()> {
        Ok(DB::migrate_statements(&self.pool, &self.sql.table, &self.sql.create).await?)
    }

    /// Records `position` inside the caller's transaction: it **commits** with the effects
    /// written there, and on **rollback** the group stands where it stood. A position behind the
    /// stored one leaves the row as it is.
    pub async fn store_tx(&self, conn: &mut DB::Connection, position: &Position<'_>) -> Result<()> {
        Ok(DB::store_offset(conn, &self.sql, position).await?)
    }

    /// Counts one run started of the message at `position.next_offset` inside the caller's
    /// transaction, which the caller commits **before** the message runs: a run that kills its
    /// consumer is counted all the same, and the message is dead-lettered once its runs reach
    /// the limit, as on brokers that count deliveries. Returns the runs started of it, this one
    /// included. On PostgreSQL the transaction's commit does not wait for the disk (a server
    /// crash may lose the last count; a consumer's death never does).
    pub(crate) async fn count_attempt_tx(
        &self,
        conn: &mut DB::Connection,
        position: &Position<'_>,
    ) -> Result<u32> {
        let runs = DB::count_attempt(conn, &self.sql, position).await?;
        Ok(u32::try_from(runs).unwrap_or(u32::MAX))
    }

    /// Sets the stored offset of `position`'s partition to `position.next_offset`, lower than
    /// the stored one or not: for a topic deleted and made again, whose offsets start over.
    pub(crate) async fn reset(&self, position: &Position<'_>) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        Ok(DB::reset_offset(&mut conn, &self.sql, position).await?)
    }

    /// The stored next offset of each partition of `topic` for `group`.
    pub async fn read(&self, group: &str, topic: &str) -> Result<BTreeMap<i32, i64>> {
        let mut conn = self.pool.acquire().await?;
        Ok(DB::read_offsets(&mut conn, &self.sql, group, topic).await?)
    }

    /// Deletes the stored offsets of `group` in `topic`, and the attempts counted there, so
    /// that the group starts where the broker says (for a topic deleted and made again).
    /// Returns how many partitions had one.
    pub async fn forget(&self, group: &str, topic: &str) -> Result<u64> {
        let mut conn = self.pool.acquire().await?;
        Ok(DB::forget_offsets(&mut conn, &self.sql, group, topic).await?)
    }

    /// [`read`](Self::read) from code that cannot await, such as a broker client's rebalance
    /// callback: on a thread of its own, over a connection of its own, so that it neither
    /// needs the caller's runtime nor waits for it.
    pub(crate) fn read_blocking(&self, group: &str, topic: &str) -> Result<BTreeMap<i32, i64>> {
        let options = self.pool.connect_options();
        let sql = &self.sql;
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(sqlx::Error::Io)?;
                    runtime.block_on(async {
                        let mut conn = options.connect().await?;
                        let offsets = DB::read_offsets(&mut conn, sql, group, topic).await;
                        let _ = conn.close().await;
                        Ok(offsets?)
                    })
                })
                .join()
                .unwrap_or_else(|_| {
                    Err(crate::Error::Database(sqlx::Error::Protocol(
                        "reading the stored offsets panicked".into(),
                    )))
                })
        })
    }
}
