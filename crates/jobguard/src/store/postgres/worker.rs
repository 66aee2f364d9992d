//! The worker's statements on PostgreSQL: completing a job and claiming its key in one round
//! trip, and the same for a whole batch, built once per worker from both table names.

use jobguard_core::sql::postgres::worker;
use sqlx::postgres::Postgres;
use sqlx::{AssertSqlSafe, Row};

use super::guard::claim_row;
use crate::store::guard::{ClaimRow, GuardSql};
use crate::store::queue::QueueSql;
use crate::store::worker::{
    BatchRow, CompletedRows, CompletingClaim, HeldRow, WorkerSql, WorkerStatements, WorkerStore,
    batch_claim_rows, unclaimed_keys,
};

impl WorkerStore for Postgres {
    fn worker_sql(guard: &GuardSql, queue: &QueueSql, rows: CompletedRows) -> WorkerSql {
        WorkerSql {
            // The core's text, which the Python worker runs too.
            claim_completing: Some(
                worker::claim_completing(&guard.table, &queue.table, rows).into(),
            ),
            claim_completing_many: Some(
                worker::claim_completing_many(&guard.table, &queue.table, rows).into(),
            ),
            complete_many: None,
            held: Some(worker::held(&guard.table).into()),
        }
    }

    async fn claim_completing(
        conn: &mut Self::Connection,
        sql: WorkerStatements<'_>,
        job: &CompletingClaim<'_>,
    ) -> sqlx::Result<Option<ClaimRow>> {
        let (claim, lease) = (&job.claim, job.lease);
        let statement = WorkerSql::built(&sql.worker.claim_completing);
        let row = claim
            .bind(sqlx::query(AssertSqlSafe(statement)))
            .bind(lease.job_id)
            .bind(lease.token)
            .fetch_optional(conn)
            .await?;
        // No row: the lease is not held. A null `claimed`: the key's row vanished.
        let Some(row) = row else {
            return Ok(None);
        };
        if row.try_get::<Option<bool>, _>(0)?.is_none() {
            return Ok(Some(ClaimRow::Vanished));
        }
        Ok(Some(claim_row(&row)?))
    }

    async fn claim_completing_many(
        conn: &mut Self::Connection,
        sql: WorkerStatements<'_>,
        jobs: &[CompletingClaim<'_>],
    ) -> sqlx::Result<Vec<Option<ClaimRow>>> {
        let many = WorkerSql::built(&sql.worker.claim_completing_many);
        let claims = || jobs.iter().map(|job| &job.claim);
        let rows: Vec<(bool, bool)> = sqlx::query_as(AssertSqlSafe(many))
            .bind(
                jobs.iter()
                    .map(|job| job.lease.job_id)
                    .collect::<Vec<i64>>(),
            )
            .bind(jobs.iter().map(|job| job.lease.token).collect::<Vec<i64>>())
            .bind(claims().map(|c| c.key).collect::<Vec<&str>>())
            .bind(claims().map(|c| c.kind).collect::<Vec<&str>>())
            .bind(
                claims()
                    .map(|c| c.fingerprint.map(|f| f.as_bytes().as_slice()))
                    .collect::<Vec<Option<&[u8]>>>(),
            )
            .bind(
                claims()
                    .map(|c| c.token.0.as_slice())
                    .collect::<Vec<&[u8]>>(),
            )
            .fetch_all(&mut *conn)
            .await?;
        let rows: Vec<BatchRow> = rows
            .into_iter()
            .map(|(completed, claimed)| BatchRow { completed, claimed })
            .collect();
        // Keys the batch completed a job for but did not claim: read who holds them.
        let unclaimed = unclaimed_keys(jobs, &rows);
        let mut held = Vec::new();
        if !unclaimed.is_empty() {
            held = sqlx::query_as::<_, HeldRow>(AssertSqlSafe(WorkerSql::built(&sql.worker.held)))
                .bind(unclaimed)
                .fetch_all(&mut *conn)
                .await?;
        }
        Ok(batch_claim_rows(jobs, &rows, held))
    }
}
