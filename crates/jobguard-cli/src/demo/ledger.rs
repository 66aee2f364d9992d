//! The demo's ledgers: where the seed's credit job appends a row, the canonical effect that
//! must not repeat.
//!
//! The demo and the benchmark run the built-in [`Credit`] twice over: a naive version that
//! appends on every delivery, and a guarded version that appends once per job key.

use std::future::Future;

use jobguard::{Backend, Guard, GuardConfig, Outcome, TableName};
use sqlx::postgres::Postgres;
use sqlx::sqlite::Sqlite;
use sqlx::{Executor, Pool, Transaction};

use crate::builtin_jobs::{Credit, Example};

/// The demo's own tables; nothing else in the database is touched.
pub const NAIVE_LEDGER: &str = "jobguard_demo_ledger_naive";
/// The ledger the guarded job writes to.
pub const GUARDED_LEDGER: &str = "jobguard_demo_ledger_guarded";
/// The ledger of `jobguard bench queue`.
pub const BENCH_LEDGER: &str = "jobguard_bench_ledger";
/// The guard table of the demo.
pub const GUARD_TABLE: &str = "jobguard_demo_processed_jobs";

/// The queue table of the naive run of `jobguard demo --scenario`.
pub const NAIVE_JOBS: &str = "jobguard_demo_jobs_naive";
/// The queue table of its guarded run.
pub const GUARDED_JOBS: &str = "jobguard_demo_jobs_guarded";

/// The credit for order `n`: a stable key (`credit:order-<n>`), an account and an amount
/// derived from the order.
pub fn credit_for_order(n: usize) -> Credit {
    Credit {
        order: format!("order-{n}"),
        account: (n % 10) as i64 + 1,
        amount: 100 + (n % 7) as i64 * 25,
        hold_ms: 0,
    }
}

/// Which ledger a job appends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ledger {
    Naive,
    Guarded,
    /// The ledger of `jobguard bench queue`.
    Bench,
}

impl Ledger {
    pub fn table(self) -> &'static str {
        match self {
            Ledger::Naive => NAIVE_LEDGER,
            Ledger::Guarded => GUARDED_LEDGER,
            Ledger::Bench => BENCH_LEDGER,
        }
    }
}

/// A database the credit job runs on.
pub trait LedgerDb: Backend {
    /// Drops and creates the demo's ledgers and guard table.
    fn reset(pool: &Pool<Self>) -> impl Future<Output = anyhow::Result<Guard<Self>>> + Send;

    /// Opens the transaction a naive job runs in.
    fn open_tx(
        pool: &Pool<Self>,
    ) -> impl Future<Output = sqlx::Result<Transaction<'static, Self>>> + Send;

    /// Appends `amount` for `account` to a ledger.
    fn append(
        conn: &mut Self::Connection,
        ledger: Ledger,
        account: i64,
        amount: i64,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Rows and total amount in a ledger.
    fn read(
        pool: &Pool<Self>,
        ledger: Ledger,
    ) -> impl Future<Output = sqlx::Result<(i64, i64)>> + Send;
}

/// The naive job: one transaction that appends the credit, on every delivery.
pub async fn credit_naive<DB: LedgerDb>(pool: &Pool<DB>, credit: &Credit) -> sqlx::Result<()> {
    let mut tx = DB::open_tx(pool).await?;
    DB::append(&mut tx, Ledger::Naive, credit.account, credit.amount).await?;
    tx.commit().await
}

/// The guarded job: claim the key, append the credit, commit both together.
pub async fn credit_guarded<DB: LedgerDb>(
    guard: &Guard<DB>,
    credit: Credit,
) -> jobguard::Result<Outcome<()>> {
    let key = credit.job_key()?;
    guard
        .run(&key, async move |conn| {
            DB::append(conn, Ledger::Guarded, credit.account, credit.amount).await?;
            Ok(())
        })
        .await
}

pub fn guard_for<DB: Backend>(pool: &Pool<DB>) -> anyhow::Result<Guard<DB>> {
    let config = GuardConfig::default().table(TableName::new(GUARD_TABLE)?);
    Ok(Guard::with_config(pool.clone(), config)?)
}

/// The ledgers' DDL; the same on both backends but for the id column.
fn create_ledger(ledger: Ledger, id: &str) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(format!(
        "create table {} (id {id}, account bigint not null, amount bigint not null)",
        ledger.table()
    ))
}

/// Drops the demo's tables, creates its ledgers and migrates its guard.
async fn recreate<DB: LedgerDb>(
    mut tx: Transaction<'static, DB>,
    pool: &Pool<DB>,
    id: &str,
) -> anyhow::Result<Guard<DB>>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    for table in DEMO_TABLES {
        tx.execute(sqlx::AssertSqlSafe(format!("drop table if exists {table}")))
            .await?;
    }
    for ledger in [Ledger::Naive, Ledger::Guarded] {
        tx.execute(create_ledger(ledger, id)).await?;
    }
    tx.commit().await?;
    let guard = guard_for(pool)?;
    guard.migrate().await?;
    Ok(guard)
}

/// Every table the demo owns, dropped and recreated on each run.
pub const DEMO_TABLES: [&str; 5] = [
    NAIVE_LEDGER,
    GUARDED_LEDGER,
    GUARD_TABLE,
    NAIVE_JOBS,
    GUARDED_JOBS,
];

async fn append_to<'c, DB: Backend>(
    conn: &'c mut DB::Connection,
    ledger: Ledger,
    account: i64,
    amount: i64,
) -> sqlx::Result<()>
where
    &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> <DB as sqlx::Database>::Arguments: sqlx::IntoArguments<DB>,
{
    let sql = format!(
        "insert into {} (account, amount) values ($1, $2)",
        ledger.table()
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(account)
        .bind(amount)
        .execute(conn)
        .await?;
    Ok(())
}

/// The ledger statements whose text and binding are the same on both backends, expanded in
/// each `impl LedgerDb`, where the backend's types are concrete.
macro_rules! ledger_statements {
    () => {
        async fn append(
            conn: &mut Self::Connection,
            ledger: Ledger,
            account: i64,
            amount: i64,
        ) -> sqlx::Result<()> {
            append_to::<Self>(conn, ledger, account, amount).await
        }

        async fn read(pool: &Pool<Self>, ledger: Ledger) -> sqlx::Result<(i64, i64)> {
            let sql = format!(
                "select count(*), cast(coalesce(sum(amount), 0) as bigint) from {}",
                ledger.table()
            );
            sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .fetch_one(pool)
                .await
        }
    };
}

impl LedgerDb for Postgres {
    async fn reset(pool: &Pool<Self>) -> anyhow::Result<Guard<Self>> {
        recreate(pool.begin().await?, pool, "bigserial primary key").await
    }

    async fn open_tx(pool: &Pool<Self>) -> sqlx::Result<Transaction<'static, Self>> {
        pool.begin().await
    }

    ledger_statements!();
}

impl LedgerDb for Sqlite {
    async fn reset(pool: &Pool<Self>) -> anyhow::Result<Guard<Self>> {
        recreate(
            pool.begin_with("begin immediate").await?,
            pool,
            "integer primary key",
        )
        .await
    }

    async fn open_tx(pool: &Pool<Self>) -> sqlx::Result<Transaction<'static, Self>> {
        // Take the write lock up front, as the guard does, so writers queue instead of failing.
        pool.begin_with("begin immediate").await
    }

    ledger_statements!();
}
