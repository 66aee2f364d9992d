//! The PostgreSQL dialect of the store: the [`Backend`] implementation, with its statements
//! named by concept in `postgres/` (guard, queue, outbox, steps), each built once per table.
//!
//! Guarded jobs run in `read committed`, PostgreSQL's default: the guard row's primary key
//! makes concurrent deliveries of one key wait for each other, so no stronger isolation is
//! needed for the guard. Serialization failures (`40001`) and deadlocks (`40P01`) that the
//! job's own effect runs into are retried a bounded number of times.

mod console;
mod guard;
mod offsets;
mod outbox;
mod prune;
mod queue;
mod steps;
mod worker;

use std::sync::Arc;

use sqlx::postgres::Postgres;
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, Pool, Row, Transaction};

use futures::future::BoxFuture;
use sqlx::postgres::{PgListener, PgRow};

use crate::store::queue::{Lease, NewJob, QueueSql};

use super::{
    Backend, ClaimRow, GuardRecord, GuardSql, NewClaim, Store, Wakeup, WakeupSource, WorkerSql,
    batch_claim_rows, unclaimed_keys,
};
use crate::table::TableName;
use jobguard_core::sql::postgres as guard_sql;

/// Names the exact DDL a table was migrated with, stored as the table's comment.
fn schema_marker(statements: &[Arc<str>]) -> String {
    jobguard_core::sql::schema_marker(statements)
}

/// Decodes a row of the claim function: `claimed`, then the row that holds the key.
fn claim_row(row: &PgRow) -> sqlx::Result<ClaimRow> {
    if row.try_get::<bool, _>(0)? {
        return Ok(ClaimRow::Claimed);
    }
    let result: Option<Json<serde_json::Value>> = row.try_get(3)?;
    Ok(ClaimRow::Held(GuardRecord::from_columns(
        row.try_get(1)?,
        row.try_get(2)?,
        result.map(|json| json.0),
        row.try_get(4)?,
    )))
}

impl WakeupSource for PgListener {
    fn next(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            // The listener reconnects by itself; after an error the worker's polling covers
            // the gap, so wait a little rather than spin.
            if let Err(error) = self.recv().await {
                tracing::debug!(%error, "the job notification listener failed; polling meanwhile");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        })
    }
}

impl Backend for Postgres {
    const BACKEND: &'static str = "postgres";
}

impl Store for Postgres {
    const SINGLE_WRITER: bool = false;

    crate::store::table_sql!();

    async fn migrate_statements(
        pool: &Pool<Self>,
        table: &TableName,
        statements: &[Arc<str>],
    ) -> sqlx::Result<()> {
        // A schema already in place is left alone: `create index if not exists` would still
        // wait for every transaction writing the table, stalling a running queue.
        let marker = schema_marker(statements);
        let table_name = table.quoted();
        let migrated = guard_sql::MIGRATED;
        let done: Option<bool> = sqlx::query_scalar(migrated)
            .bind(&table_name)
            .bind(&marker)
            .fetch_one(pool)
            .await?;
        if done == Some(true) {
            return Ok(());
        }
        let mut tx = pool.begin().await?;
        // Workers starting together would race on `create ... if not exists`, which is not
        // atomic in PostgreSQL's catalog; one lock per table makes them take turns.
        sqlx::query(guard_sql::MIGRATE_LOCK)
            .bind(guard_sql::migrate_lock_key(table))
            .execute(&mut *tx)
            .await?;
        let done: Option<bool> = sqlx::query_scalar(migrated)
            .bind(&table_name)
            .bind(&marker)
            .fetch_one(&mut *tx)
            .await?;
        if done == Some(true) {
            return tx.commit().await;
        }
        sqlx::query(guard_sql::MIGRATE_LOCK_TIMEOUT)
            .execute(&mut *tx)
            .await?;
        for statement in statements {
            sqlx::query(AssertSqlSafe(statement.clone()))
                .execute(&mut *tx)
                .await?;
        }
        let comment = guard_sql::mark_migrated(table, &marker);
        sqlx::query(AssertSqlSafe(comment))
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }

    async fn begin(pool: &Pool<Self>) -> sqlx::Result<Transaction<'static, Self>> {
        pool.begin().await
    }

    async fn begin_on(conn: &mut Self::Connection) -> sqlx::Result<Transaction<'_, Self>> {
        sqlx::Connection::begin(conn).await
    }

    async fn claim(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        claim: &NewClaim<'_>,
    ) -> sqlx::Result<ClaimRow> {
        let row = sqlx::query(AssertSqlSafe(sql.claim.clone()))
            .bind(claim.key)
            .bind(claim.kind)
            .bind(claim.fingerprint.map(|f| f.as_bytes().as_slice()))
            .bind(claim.token.0.as_slice())
            .fetch_optional(conn)
            .await?;
        match row {
            Some(row) => claim_row(&row),
            None => Ok(ClaimRow::Vanished),
        }
    }

    fn worker_sql(guard: &GuardSql, queue: &QueueSql) -> WorkerSql {
        WorkerSql {
            claim_completing: Some(worker::claim_completing(&guard.table, &queue.table).into()),
            claim_completing_many: Some(
                worker::claim_completing_many(&guard.table, &queue.table).into(),
            ),
            complete_many: None,
            held: Some(worker::held(&guard.table).into()),
        }
    }

    async fn claim_completing(
        conn: &mut Self::Connection,
        sql: (&GuardSql, &QueueSql, &WorkerSql),
        claim: &NewClaim<'_>,
        lease: Lease,
    ) -> sqlx::Result<(ClaimRow, bool)> {
        let statement = sql
            .2
            .claim_completing
            .as_deref()
            .expect("built by Postgres::worker_sql");
        let row = sqlx::query(AssertSqlSafe(statement))
            .bind(claim.key)
            .bind(claim.kind)
            .bind(claim.fingerprint.map(|f| f.as_bytes().as_slice()))
            .bind(claim.token.0.as_slice())
            .bind(lease.job_id)
            .bind(lease.token)
            .fetch_optional(conn)
            .await?;
        // No row: the lease is not held. A null `claimed`: the key's row vanished.
        let Some(row) = row else {
            return Ok((ClaimRow::Vanished, false));
        };
        if row.try_get::<Option<bool>, _>(0)?.is_none() {
            return Ok((ClaimRow::Vanished, true));
        }
        Ok((claim_row(&row)?, true))
    }

    async fn claim_completing_many(
        conn: &mut Self::Connection,
        sql: (&GuardSql, &QueueSql, &WorkerSql),
        claims: &[(NewClaim<'_>, Lease)],
    ) -> sqlx::Result<Vec<Option<ClaimRow>>> {
        let statements = sql.2;
        let many = statements
            .claim_completing_many
            .as_deref()
            .expect("built by Postgres::worker_sql");
        let rows: Vec<(bool, bool)> = sqlx::query_as(AssertSqlSafe(many))
            .bind(claims.iter().map(|(_, l)| l.job_id).collect::<Vec<i64>>())
            .bind(claims.iter().map(|(_, l)| l.token).collect::<Vec<i64>>())
            .bind(claims.iter().map(|(c, _)| c.key).collect::<Vec<&str>>())
            .bind(claims.iter().map(|(c, _)| c.kind).collect::<Vec<&str>>())
            .bind(
                claims
                    .iter()
                    .map(|(c, _)| c.fingerprint.map(|f| f.as_bytes().as_slice()))
                    .collect::<Vec<Option<&[u8]>>>(),
            )
            .bind(
                claims
                    .iter()
                    .map(|(c, _)| c.token.0.as_slice())
                    .collect::<Vec<&[u8]>>(),
            )
            .fetch_all(&mut *conn)
            .await?;
        // Keys the batch completed a job for but did not claim: read who holds them.
        let unclaimed = unclaimed_keys(claims, &rows);
        let mut held = Vec::new();
        if !unclaimed.is_empty() {
            let statement = statements
                .held
                .as_deref()
                .expect("built by Postgres::worker_sql");
            held = sqlx::query_as(AssertSqlSafe(statement))
                .bind(unclaimed)
                .fetch_all(&mut *conn)
                .await?;
        }
        Ok(batch_claim_rows(claims, &rows, held))
    }

    crate::store::shared_statements!();

    async fn enqueue_many(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        jobs: &[&NewJob],
    ) -> sqlx::Result<Vec<(i64, String)>> {
        queue::enqueue_many(conn, sql, jobs).await
    }

    async fn live_jobs(
        conn: &mut Self::Connection,
        sql: &QueueSql,
        keys: &[&str],
    ) -> sqlx::Result<Vec<crate::store::LiveJob>> {
        queue::live_jobs(conn, sql, keys).await
    }

    async fn listen(pool: &Pool<Self>) -> sqlx::Result<Option<Wakeup>> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(crate::store::queue::NOTIFY_CHANNEL).await?;
        Ok(Some(Wakeup(Box::new(listener))))
    }

    fn is_transient(error: &sqlx::Error) -> bool {
        let code = error.as_database_error().and_then(|e| e.code());
        matches!(code.as_deref(), Some("40001" | "40P01"))
    }
}
