//! The worker's batch statements on SQLite, built once per worker from both table names.
//!
//! A batch holds SQLite's one write lock from its `begin immediate`, so no other writer runs
//! between these statements: three statements for the whole batch (complete, claim, read the
//! held keys when there are some) instead of two per job, each a hop to the connection's thread.

use std::collections::HashSet;

use sqlx::AssertSqlSafe;
use sqlx::sqlite::Sqlite;

use crate::store::guard::{ClaimRow, GuardSql, NewClaim};
use crate::store::queue::QueueSql;
use crate::store::worker::{
    BatchRow, CompletedRows, CompletingClaim, HeldRow, WorkerSql, WorkerStatements, WorkerStore,
    batch_claim_rows, unclaimed_keys,
};
use crate::table::TableName;
use jobguard_core::sql::sqlite::NOW_MICROS;

/// Completes the jobs (`$1`, a JSON array of `[id, lease token]`) whose lease still holds;
/// returns their ids. A job whose lease was taken over is left alone: fenced.
fn complete_many(jobs: &TableName) -> String {
    format!(
        "update {jobs} set state = 'completed', finished_at = {NOW_MICROS}, leased_until = null
         from (select json_extract(value, '$[0]') as job_id, json_extract(value, '$[1]') as lease
               from json_each($1)) as batch
         where {jobs}.id = batch.job_id and {jobs}.lease_token = batch.lease
           and {jobs}.state = 'available' and {jobs}.leased_until is not null
         returning id",
        jobs = jobs.quoted(),
    )
}

/// Inserts the guard rows (`$1`, a JSON array of `[key, kind, fingerprint hex or null, claim
/// token hex]`, one per key) of keys nobody holds; returns the keys inserted.
fn claim_many(guard: &TableName) -> String {
    format!(
        "insert into {} (job_key, kind, fingerprint, claim_token, applied_at)
         select json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                unhex(json_extract(value, '$[2]')), unhex(json_extract(value, '$[3]')),
                {NOW_MICROS}
         from json_each($1) where true
         on conflict (job_key) do nothing
         returning job_key",
        guard.quoted()
    )
}

/// The guard rows holding the keys (`$1`, a JSON array) a batch did not claim.
fn held(guard: &TableName) -> String {
    format!(
        "select job_key, applied_at, fingerprint, result, claim_token
         from {} where job_key in (select value from json_each($1))",
        guard.quoted()
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl WorkerStore for Sqlite {
    /// Completed rows are kept on SQLite whatever the retention: the prune deletes them.
    fn worker_sql(guard: &GuardSql, queue: &QueueSql, _rows: CompletedRows) -> WorkerSql {
        WorkerSql {
            claim_completing: None,
            complete_many: Some(complete_many(&queue.table).into()),
            claim_completing_many: Some(claim_many(&guard.table).into()),
            held: Some(held(&guard.table).into()),
        }
    }

    /// Three statements for the whole batch under the write lock: complete, claim, read the
    /// held keys.
    async fn claim_completing_many(
        conn: &mut Self::Connection,
        sql: WorkerStatements<'_>,
        jobs: &[CompletingClaim<'_>],
    ) -> sqlx::Result<Vec<Option<ClaimRow>>> {
        let statements = sql.worker;
        let leases: Vec<(i64, i64)> = jobs
            .iter()
            .map(|job| (job.lease.job_id, job.lease.token))
            .collect();
        let complete = WorkerSql::built(&statements.complete_many);
        let completed: HashSet<i64> = sqlx::query_scalar(AssertSqlSafe(complete))
            .bind(serde_json::to_string(&leases).expect("integers serialize"))
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect();
        // The first completed job of each key claims it; a later one of the same key is a
        // duplicate of it. In key order, as on PostgreSQL.
        let mut firsts: Vec<(usize, &NewClaim<'_>)> = Vec::new();
        let mut seen = HashSet::new();
        for (i, job) in jobs.iter().enumerate() {
            if completed.contains(&job.lease.job_id) && seen.insert(job.claim.key) {
                firsts.push((i, &job.claim));
            }
        }
        firsts.sort_by_key(|(_, claim)| claim.key);
        let mut inserted = HashSet::new();
        if !firsts.is_empty() {
            let rows: Vec<(&str, &str, Option<String>, String)> = firsts
                .iter()
                .map(|(_, claim)| {
                    let fingerprint = claim.fingerprint.map(|f| hex(f.as_bytes()));
                    (claim.key, claim.kind, fingerprint, hex(&claim.token.0))
                })
                .collect();
            let claim = WorkerSql::built(&statements.claim_completing_many);
            inserted = sqlx::query_scalar::<_, String>(AssertSqlSafe(claim))
                .bind(serde_json::to_string(&rows).expect("strings serialize"))
                .fetch_all(&mut *conn)
                .await?
                .into_iter()
                .collect();
        }
        let first: HashSet<usize> = firsts.iter().map(|(i, _)| *i).collect();
        let rows: Vec<BatchRow> = jobs
            .iter()
            .enumerate()
            .map(|(i, job)| BatchRow {
                completed: completed.contains(&job.lease.job_id),
                claimed: first.contains(&i) && inserted.contains(job.claim.key),
            })
            .collect();
        let unclaimed = unclaimed_keys(jobs, &rows);
        let mut held_rows: Vec<HeldRow> = Vec::new();
        if !unclaimed.is_empty() {
            let statement = WorkerSql::built(&statements.held);
            held_rows = sqlx::query_as(AssertSqlSafe(statement))
                .bind(serde_json::to_string(&unclaimed).expect("strings serialize"))
                .fetch_all(&mut *conn)
                .await?;
        }
        Ok(batch_claim_rows(jobs, &rows, held_rows))
    }
}
