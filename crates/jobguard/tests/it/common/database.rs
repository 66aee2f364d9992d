//! Test databases: one fresh PostgreSQL schema or SQLite file per test, and the ledger table
//! the seed's credit job writes to.

use std::future::Future;
use std::time::Duration;

use jobguard::Backend;
use jobguard_testsupport::{Schema, Service, sqlite};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, Postgres};
use sqlx::sqlite::Sqlite;
use sqlx::{Executor, Pool};

/// A backend the conformance suite runs on, with the few statements the tests need.
pub trait TestDb: Backend {
    /// A pool on a database of this test's own, holding an empty `ledger` table.
    fn open(test: &str, connections: u32) -> impl Future<Output = Option<Pool<Self>>> + Send;

    fn insert_ledger(
        conn: &mut Self::Connection,
        account: i64,
        amount: i64,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    fn count(pool: &Pool<Self>, sql: &'static str) -> impl Future<Output = i64> + Send;

    /// Runs a statement on a connection or transaction.
    fn execute(
        conn: &mut Self::Connection,
        sql: &'static str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// The one number `sql` selects, with `arg` bound to `$1`.
    fn fetch_i64(
        conn: &mut Self::Connection,
        sql: &'static str,
        arg: i64,
    ) -> impl Future<Output = sqlx::Result<i64>> + Send;
}

pub async fn ledger_rows<DB: TestDb>(pool: &Pool<DB>) -> i64 {
    DB::count(pool, "select count(*) from ledger").await
}

pub async fn ledger_total<DB: TestDb>(pool: &Pool<DB>) -> i64 {
    DB::count(
        pool,
        "select cast(coalesce(sum(amount), 0) as bigint) from ledger",
    )
    .await
}

pub async fn guard_rows<DB: TestDb>(pool: &Pool<DB>) -> i64 {
    DB::count(pool, "select count(*) from processed_jobs").await
}

/// The ledger's rows and the guard table's rows, the pair most fault tests check.
pub async fn ledger_and_guard_rows<DB: TestDb>(pool: &Pool<DB>) -> (i64, i64) {
    (ledger_rows(pool).await, guard_rows(pool).await)
}

pub const LEDGER: &str = "create table ledger (account bigint not null, amount bigint not null)";

/// The schema a PostgreSQL test owns.
pub fn schema_name(test: &str) -> String {
    format!("jg_{test}")
}

/// Connect options for a PostgreSQL test's own schema, created empty; `None` to skip when no
/// PostgreSQL answers.
pub async fn postgres_options(test: &str) -> Option<PgConnectOptions> {
    let url = Service::Postgres.url()?;
    Some(Schema::create(&url, &schema_name(test)).await.options())
}

/// The statements that read the same on every backend, written once for each `impl TestDb`.
macro_rules! statements {
    () => {
        async fn insert_ledger(
            conn: &mut Self::Connection,
            account: i64,
            amount: i64,
        ) -> sqlx::Result<()> {
            sqlx::query("insert into ledger (account, amount) values ($1, $2)")
                .bind(account)
                .bind(amount)
                .execute(conn)
                .await?;
            Ok(())
        }

        async fn count(pool: &Pool<Self>, sql: &'static str) -> i64 {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(pool)
                .await
                .expect(sql)
        }

        async fn execute(conn: &mut Self::Connection, sql: &'static str) -> sqlx::Result<()> {
            sqlx::query(sql).execute(conn).await?;
            Ok(())
        }

        async fn fetch_i64(
            conn: &mut Self::Connection,
            sql: &'static str,
            arg: i64,
        ) -> sqlx::Result<i64> {
            sqlx::query_scalar(sql).bind(arg).fetch_one(conn).await
        }
    };
}

impl TestDb for Postgres {
    async fn open(test: &str, connections: u32) -> Option<Pool<Self>> {
        let options = postgres_options(&format!("pg_{test}")).await?;
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await
            .expect("connect to the test schema");
        pool.execute(LEDGER).await.expect("create ledger");
        Some(pool)
    }

    statements!();
}

impl TestDb for Sqlite {
    async fn open(test: &str, connections: u32) -> Option<Pool<Self>> {
        let (_, url) = sqlite::fresh(test);
        let pool = jobguard::sqlite::connect(&url, connections)
            .await
            .expect("open SQLite");
        pool.execute(LEDGER).await.expect("create ledger");
        Some(pool)
    }

    statements!();
}
