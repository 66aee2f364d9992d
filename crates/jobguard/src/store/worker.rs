//! The worker's interface to the backends: completing a leased job and claiming its key in one
//! transaction, for one job or a batch, over statements built once per worker from both its
//! guard and its queue table.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

pub use jobguard_core::sql::postgres::worker::CompletedRows;

use crate::store::guard::{ClaimRow, GuardRecord, GuardSql, GuardStore, NewClaim};
use crate::store::queue::{Lease, QueueSql, QueueStore, Settle};

/// What the worker calls on a backend: the claim that completes a job, one job or a batch.
/// Each method has a default written with the guard's and the queue's own statements; backends
/// that can do it in fewer round trips override them.
pub trait WorkerStore: GuardStore + QueueStore {
    /// The worker's statements over its guard and queue tables, built once per worker;
    /// `rows` is what completing a job does with its row, where the backend can delete it in
    /// the statement that completes it. Backends that claim and complete in one statement
    /// override this.
    fn worker_sql(_guard: &GuardSql, _queue: &QueueSql, _rows: CompletedRows) -> WorkerSql {
        WorkerSql {
            claim_completing: None,
            claim_completing_many: None,
            complete_many: None,
            held: None,
        }
    }

    /// Completes the job of `job.lease` and claims its key: `None` when the lease is not held
    /// (nothing was completed or claimed), else what claiming the key found.
    fn claim_completing(
        conn: &mut Self::Connection,
        sql: WorkerStatements<'_>,
        job: &CompletingClaim<'_>,
    ) -> impl Future<Output = sqlx::Result<Option<ClaimRow>>> + Send {
        async move {
            if !Self::settle(conn, sql.queue, job.lease, Settle::Complete).await? {
                return Ok(None);
            }
            Ok(Some(Self::claim(conn, sql.guard, &job.claim).await?))
        }
    }

    /// Completes the jobs of a batch under their leases and claims the keys of the completed
    /// ones, in order: for each job, `None` when its lease is not held (it completed nothing and
    /// claimed nothing), else what claiming its key found. A key that an earlier job of the
    /// batch claimed is found held by this transaction. The default runs
    /// [`claim_completing`](Self::claim_completing) per job.
    fn claim_completing_many(
        conn: &mut Self::Connection,
        sql: WorkerStatements<'_>,
        jobs: &[CompletingClaim<'_>],
    ) -> impl Future<Output = sqlx::Result<Vec<Option<ClaimRow>>>> + Send {
        async move {
            let mut rows = Vec::with_capacity(jobs.len());
            for job in jobs {
                rows.push(Self::claim_completing(conn, sql, job).await?);
            }
            Ok(rows)
        }
    }
}

/// The worker's statements over both its guard and its queue table, built once per
/// [`Worker`](crate::Worker).
#[derive(Debug)]
pub struct WorkerSql {
    /// Completes the job under its lease token and claims the key in one statement, where the
    /// backend can (PostgreSQL); `None` where it takes two under the write lock (SQLite).
    pub(crate) claim_completing: Option<Arc<str>>,
    /// Completes a batch's jobs and claims their keys in one statement (PostgreSQL), or claims
    /// the keys of the jobs [`WorkerSql::complete_many`] completed (SQLite).
    pub(crate) claim_completing_many: Option<Arc<str>>,
    /// Completes a batch's jobs under their lease tokens, where that is a statement of its own.
    pub(crate) complete_many: Option<Arc<str>>,
    /// Reads the rows holding a batch's keys that it did not claim, in a new statement.
    pub(crate) held: Option<Arc<str>>,
}

impl WorkerSql {
    /// The statement a backend's [`WorkerStore::worker_sql`] built, by the backend that uses it.
    pub(crate) fn built(statement: &Option<Arc<str>>) -> &str {
        statement
            .as_deref()
            .expect("built by the backend's worker_sql")
    }
}

/// Every statement the worker's claims run: its guard table's, its queue table's and its own.
#[derive(Clone, Copy, Debug)]
pub struct WorkerStatements<'a> {
    pub(crate) guard: &'a GuardSql,
    pub(crate) queue: &'a QueueSql,
    pub(crate) worker: &'a WorkerSql,
}

/// A job to complete under its lease, and the guard row to insert for its key.
#[derive(Debug)]
pub struct CompletingClaim<'a> {
    pub(crate) claim: NewClaim<'a>,
    pub(crate) lease: Lease,
}

/// Whether a job of a batch completed under its lease, and whether it claimed its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchRow {
    pub(crate) completed: bool,
    pub(crate) claimed: bool,
}

/// A guard row as a batch's `held` statement reads it: key, applied at (micros), fingerprint,
/// result, claim token.
#[derive(Debug)]
pub(crate) struct HeldRow {
    pub(crate) key: String,
    pub(crate) record: GuardRecord,
}

impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for HeldRow
where
    usize: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<Vec<u8>>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<sqlx::types::Json<serde_json::Value>>:
        sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> sqlx::Result<Self> {
        let result: Option<sqlx::types::Json<serde_json::Value>> = row.try_get(3)?;
        Ok(HeldRow {
            key: row.try_get(0)?,
            record: GuardRecord::from_columns(
                row.try_get(1)?,
                row.try_get(2)?,
                result.map(|json| json.0),
                row.try_get(4)?,
            ),
        })
    }
}

/// The keys of a batch's jobs that completed but did not claim their key.
pub(crate) fn unclaimed_keys<'a>(jobs: &[CompletingClaim<'a>], rows: &[BatchRow]) -> Vec<&'a str> {
    jobs.iter()
        .zip(rows)
        .filter(|(_, row)| row.completed && !row.claimed)
        .map(|(job, _)| job.claim.key)
        .collect()
}

/// What [`WorkerStore::claim_completing_many`] returns, from whether each job completed and
/// claimed and the rows that hold the keys it did not claim.
pub(crate) fn batch_claim_rows(
    jobs: &[CompletingClaim<'_>],
    rows: &[BatchRow],
    held: Vec<HeldRow>,
) -> Vec<Option<ClaimRow>> {
    let held: HashMap<String, GuardRecord> =
        held.into_iter().map(|row| (row.key, row.record)).collect();
    jobs.iter()
        .zip(rows)
        .map(|(job, row)| {
            row.completed.then(|| match row.claimed {
                true => ClaimRow::Claimed,
                false => held
                    .get(job.claim.key)
                    .cloned()
                    .map_or(ClaimRow::Vanished, ClaimRow::Held),
            })
        })
        .collect()
}
