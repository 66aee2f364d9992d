//! The guard on SQLite: its SQL from the core crate (the Python package runs the same text),
//! and the claim: the insert, then under the write lock the row that holds the key.

use sqlx::AssertSqlSafe;
use sqlx::sqlite::Sqlite;

use super::no_schema;
use super::prune;
use crate::store::guard::{ClaimRow, GuardSql, GuardStore, NewClaim};
use jobguard_core::sql::sqlite as core;

impl GuardStore for Sqlite {
    crate::store::guard::guard_statements!(core, prune, no_schema);

    async fn claim(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        claim: &NewClaim<'_>,
    ) -> sqlx::Result<ClaimRow> {
        let row = claim
            .bind(sqlx::query(AssertSqlSafe(sql.claim.clone())))
            .fetch_optional(&mut *conn)
            .await?;
        if row.is_some() {
            return Ok(ClaimRow::Claimed);
        }
        // Under `begin immediate` no other writer runs, so the row read is the one that
        // conflicted, unless it was deleted before this transaction began.
        Ok(match Self::fetch_record(conn, sql, claim.key).await? {
            Some(record) => ClaimRow::Held(record),
            None => ClaimRow::Vanished,
        })
    }
}
