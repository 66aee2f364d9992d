//! The worker's statements on PostgreSQL: completing a job and claiming its key in one round
//! trip, and the same for a whole batch, built once per worker from both table names.

use jobguard_core::sql::postgres::worker;
use sqlx::postgres::Postgres;
use sqlx::{AssertSqlSafe, Row};

use super::guard::claim_row;
use crate::store::guard::{ClaimRow, GuardSql};
use crate::store::queue::QueueSql;
use crate::store::worker::{
    BatchRow, CompletingClaim, HeldRow, WorkerSql, WorkerStatements, WorkerStore, batch_claim_rows,
    unclaimed_keys,
};
use crate::table::TableName;

impl WorkerStore for Postgres {
    fn worker_sql(guard: &GuardSql, queue: &QueueSql) -> WorkerSql {
        WorkerSql {
            // The core's text, which the Python worker runs too.
            claim_completing: Some(worker::claim_completing(&guard.table, &queue.table).into()),
            claim_completing_many: Some(claim_completing_many(&guard.table, &queue.table).into()),
            complete_many: None,
            held: Some(held(&guard.table).into()),
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

/// Completes a batch's jobs under their lease tokens and claims the keys of the completed ones,
/// in one statement. The inputs are parallel arrays, one element per job in batch order: job id
/// (`$1`), lease token (`$2`), key (`$3`), kind (`$4`), fingerprint (`$5`), claim token (`$6`).
///
/// One row per job, in batch order: `completed` false means its lease was taken over, so
/// nothing was completed or claimed for it; `claimed` true means its key's guard row was
/// inserted by this statement for this job. A completed job that did not claim its key either
/// shares it with an earlier job of the batch (which claimed or found it) or found it held by a
/// committed transaction: [`held`] reads those rows in a new statement.
///
/// - Only the first completed job of each key tries to claim it, so a key twice in one batch
///   is claimed once and the second job is a duplicate.
/// - The keys are inserted in key order, so two batches that share keys lock them in the same
///   order and wait for each other rather than deadlock.
/// - As in the per-job claim, `on conflict do nothing` waits for a concurrent transaction
///   holding the key, then inserts nothing when it committed (a duplicate) or inserts when it
///   rolled back (this batch applies the key).
fn claim_completing_many(guard: &TableName, jobs: &TableName) -> String {
    format!(
        "with batch as (
             select * from unnest($1::int8[], $2::int8[], $3::text[], $4::text[], $5::bytea[], $6::bytea[])
                 with ordinality as b(job_id, lease_token, job_key, kind, fingerprint, claim_token, ord)
         ),
         completed as (
             update {jobs} j set state = 'completed', finished_at = now(), leased_until = null
             from batch b
             where j.id = b.job_id and j.lease_token = b.lease_token
               and j.state = 'available' and j.leased_until is not null
             returning j.id
         ),
         first_of_key as (
             select distinct on (b.job_key) b.*
             from batch b join completed c on c.id = b.job_id
             order by b.job_key, b.ord
         ),
         claimed as (
             insert into {guard} (job_key, kind, fingerprint, claim_token)
             select job_key, kind, fingerprint, claim_token from first_of_key order by job_key
             on conflict (job_key) do nothing
             returning job_key
         )
         select c.id is not null as completed,
                coalesce(f.ord = b.ord and k.job_key is not null, false) as claimed
         from batch b
         left join completed c on c.id = b.job_id
         left join first_of_key f on f.job_key = b.job_key
         left join claimed k on k.job_key = b.job_key
         order by b.ord",
        jobs = jobs.quoted(),
        guard = guard.quoted(),
    )
}

/// Reads the guard rows holding keys (`$1`) that a batch did not claim. A new statement, so
/// under read committed it sees rows that concurrent transactions committed while the batch's
/// statement waited for them, as well as the rows the batch itself inserted.
fn held(guard: &TableName) -> String {
    format!(
        "select job_key, (extract(epoch from applied_at) * 1000000)::int8, fingerprint, result,
                claim_token
         from {} where job_key = any($1::text[])",
        guard.quoted()
    )
}
