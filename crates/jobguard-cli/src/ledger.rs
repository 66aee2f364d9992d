//! The seed's credit job: append a row to a ledger, the canonical effect that must not repeat.
//!
//! The demo and the benchmark run it twice over: a naive version that appends on every
//! delivery, and a guarded version that appends once per job key.

use std::future::Future;

use jobguard::{Backend, Guard, GuardConfig, JobKey, Outcome, TableName};
use sqlx::postgres::Postgres;
use sqlx::sqlite::Sqlite;
use sqlx::{Executor, Pool};

/// The demo's own tables; nothing else in the database is touched.
pub const NAIVE_LEDGER: &str = "jobguard_demo_ledger_naive";
/// The ledger the guarded job writes to.
pub const GUARDED_LEDGER: &str = "jobguard_demo_ledger_guarded";
/// The guard table of the demo.
pub const GUARD_TABLE: &str = "jobguard_demo_processed_jobs";

/// One credit job: a key derived from the order, and what it credits.
#[derive(Clone, Debug)]
pub struct Credit {
    pub key: JobKey,
    pub account: i64,
    pub amount: i64,
}

impl Credit {
    /// The credit for order `n`: a stable key, an account and an amount derived from the order.
    pub fn for_order(n: usize) -> anyhow::Result<Self> {
        Ok(Credit {
            key: JobKey::new("credit", [format!("order-{n}")])?,
            account: (n % 10) as i64 + 1,
            amount: 100 + (n % 7) as i64 * 25,
        })
    }
}

/// A database the credit job runs on.
pub trait LedgerDb: Backend {
    /// Drops and creates the demo's ledgers and guard table.
    fn reset(pool: &Pool<Self>) -> impl Future<Output = anyhow::Result<Guard<Self>>> + Send;

    /// The naive job: one transaction that appends the credit, on every delivery.
    fn credit_naive(
        pool: &Pool<Self>,
        credit: &Credit,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// The effect of the guarded job, inside the guard's transaction.
    fn append(
        conn: &mut Self::Connection,
        credit: &Credit,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Rows and total amount in a ledger.
    fn read(
        pool: &Pool<Self>,
        ledger: &'static str,
    ) -> impl Future<Output = sqlx::Result<(i64, i64)>> + Send;
}

/// The guarded job: claim the key, append the credit, commit both together.
pub async fn credit_guarded<DB: LedgerDb>(
    guard: &Guard<DB>,
    credit: Credit,
) -> jobguard::Result<Outcome<()>> {
    let key = credit.key.clone();
    guard
        .run(&key, async move |conn| {
            DB::append(conn, &credit).await?;
            Ok(())
        })
        .await
}

fn guard_for<DB: Backend>(pool: &Pool<DB>) -> anyhow::Result<Guard<DB>> {
    let config = GuardConfig::default().table(TableName::new(GUARD_TABLE)?);
    Ok(Guard::with_config(pool.clone(), config)?)
}

macro_rules! ledger_sql {
    ($ledger:expr, $id:literal) => {
        concat!(
            "create table ",
            $ledger,
            " (id ",
            $id,
            ", account bigint not null, amount bigint not null)"
        )
    };
}

impl LedgerDb for Postgres {
    async fn reset(pool: &Pool<Self>) -> anyhow::Result<Guard<Self>> {
        let mut tx = pool.begin().await?;
        for table in [NAIVE_LEDGER, GUARDED_LEDGER, GUARD_TABLE] {
            tx.execute(sqlx::AssertSqlSafe(format!("drop table if exists {table}")))
                .await?;
        }
        tx.execute(ledger_sql!(
            "jobguard_demo_ledger_naive",
            "bigserial primary key"
        ))
        .await?;
        tx.execute(ledger_sql!(
            "jobguard_demo_ledger_guarded",
            "bigserial primary key"
        ))
        .await?;
        tx.commit().await?;
        let guard = guard_for(pool)?;
        guard.migrate().await?;
        Ok(guard)
    }

    async fn credit_naive(pool: &Pool<Self>, credit: &Credit) -> sqlx::Result<()> {
        let mut tx = pool.begin().await?;
        sqlx::query("insert into jobguard_demo_ledger_naive (account, amount) values ($1, $2)")
            .bind(credit.account)
            .bind(credit.amount)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }

    async fn append(conn: &mut Self::Connection, credit: &Credit) -> sqlx::Result<()> {
        sqlx::query("insert into jobguard_demo_ledger_guarded (account, amount) values ($1, $2)")
            .bind(credit.account)
            .bind(credit.amount)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn read(pool: &Pool<Self>, ledger: &'static str) -> sqlx::Result<(i64, i64)> {
        let sql = match ledger {
            NAIVE_LEDGER => {
                "select count(*), coalesce(sum(amount), 0)::int8 from jobguard_demo_ledger_naive"
            }
            _ => {
                "select count(*), coalesce(sum(amount), 0)::int8 from jobguard_demo_ledger_guarded"
            }
        };
        sqlx::query_as(sql).fetch_one(pool).await
    }
}

impl LedgerDb for Sqlite {
    async fn reset(pool: &Pool<Self>) -> anyhow::Result<Guard<Self>> {
        let mut tx = pool.begin_with("begin immediate").await?;
        for table in [NAIVE_LEDGER, GUARDED_LEDGER, GUARD_TABLE] {
            tx.execute(sqlx::AssertSqlSafe(format!("drop table if exists {table}")))
                .await?;
        }
        tx.execute(ledger_sql!(
            "jobguard_demo_ledger_naive",
            "integer primary key"
        ))
        .await?;
        tx.execute(ledger_sql!(
            "jobguard_demo_ledger_guarded",
            "integer primary key"
        ))
        .await?;
        tx.commit().await?;
        let guard = guard_for(pool)?;
        guard.migrate().await?;
        Ok(guard)
    }

    async fn credit_naive(pool: &Pool<Self>, credit: &Credit) -> sqlx::Result<()> {
        let mut tx = pool.begin_with("begin immediate").await?;
        sqlx::query("insert into jobguard_demo_ledger_naive (account, amount) values ($1, $2)")
            .bind(credit.account)
            .bind(credit.amount)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }

    async fn append(conn: &mut Self::Connection, credit: &Credit) -> sqlx::Result<()> {
        sqlx::query("insert into jobguard_demo_ledger_guarded (account, amount) values ($1, $2)")
            .bind(credit.account)
            .bind(credit.amount)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn read(pool: &Pool<Self>, ledger: &'static str) -> sqlx::Result<(i64, i64)> {
        let sql = match ledger {
            NAIVE_LEDGER => {
                "select count(*), coalesce(sum(amount), 0) from jobguard_demo_ledger_naive"
            }
            _ => "select count(*), coalesce(sum(amount), 0) from jobguard_demo_ledger_guarded",
        };
        sqlx::query_as(sql).fetch_one(pool).await
    }
}
