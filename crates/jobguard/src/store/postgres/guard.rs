//! The guard on PostgreSQL: its SQL from the core crate (the Python package runs the same
//! text), and the claim, which calls the claim function that SQL creates.

use sqlx::postgres::{PgRow, Postgres};
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, Row};

use super::prune;
use crate::store::guard::{ClaimRow, GuardRecord, GuardSql, GuardStore, NewClaim};
use jobguard_core::sql::postgres as core;

/// Decodes a row of the claim function: `claimed`, then the row that holds the key.
pub(super) fn claim_row(row: &PgRow) -> sqlx::Result<ClaimRow> {
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

impl GuardStore for Postgres {
    crate::store::guard::guard_statements!(core, prune);

    async fn claim(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        claim: &NewClaim<'_>,
    ) -> sqlx::Result<ClaimRow> {
        let row = claim
            .bind(sqlx::query(AssertSqlSafe(sql.claim.clone())))
            .fetch_optional(conn)
            .await?;
        match row {
            Some(row) => claim_row(&row),
            None => Ok(ClaimRow::Vanished),
        }
    }
}
