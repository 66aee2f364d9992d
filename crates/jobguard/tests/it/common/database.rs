//! Test databases: one fresh PostgreSQL schema or SQLite file per test, and the ledger table
//! the seed's credit job writes to.

use std::future::Future;
use std::time::Duration;

use jobguard::Backend;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, Postgres};
use sqlx::sqlite::Sqlite;
use sqlx::{Executor, Pool};

use super::missing;

/// The admin URL of the PostgreSQL the tests use, or `None` to skip PostgreSQL tests. On CI a
/// missing database fails the test instead.
pub fn postgres_url() -> Option<String> {
    match std::env::var("JOBGUARD_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => missing(
            "JOBGUARD_TEST_DATABASE_URL is unset",
            "PostgreSQL test",
            "set it, e.g. to postgres://postgres@127.0.0.1:5432/test, or run scripts/test",
        ),
    }
}

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

/// Connect options for a PostgreSQL test's own schema, created empty.
pub async fn postgres_options(test: &str) -> Option<PgConnectOptions> {
    let url = postgres_url()?;
    let schema = schema_name(test);
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect to PostgreSQL");
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "drop schema if exists {schema} cascade; create schema {schema}"
        )))
        .await
        .expect("create the test's schema");
    admin.close().await;
    let options: PgConnectOptions = url.parse().expect("a PostgreSQL URL");
    Some(options.options([("search_path", schema.as_str())]))
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

/// The SQLite file a test owns.
pub fn sqlite_path(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join("jobguard-tests");
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(format!("{test}-{}.db", std::process::id()))
}

/// Removes a SQLite database: the file, its WAL and shared-memory files, and the folder of
/// lease heartbeats the queue keeps beside it (`<database>-jobguard-leases/`).
pub fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let _ = std::fs::remove_dir_all(format!("{}-jobguard-leases", path.display()));
}

/// Removes the databases that earlier runs of `test` left in `dir`, once their process has
/// ended: each run names its files after its process id.
pub fn remove_ended_runs(dir: &std::path::Path, test: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!("{test}-");
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(&prefix))
            .and_then(|rest| rest.strip_suffix(".db"))
        else {
            continue;
        };
        if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) && !running(pid) {
            remove_sqlite(&entry.path());
        }
    }
}

/// Whether process `pid` is running; `true` where that cannot be told (no `/proc`).
fn running(pid: &str) -> bool {
    let proc = std::path::Path::new("/proc");
    !proc.is_dir() || proc.join(pid).exists()
}

impl TestDb for Sqlite {
    async fn open(test: &str, connections: u32) -> Option<Pool<Self>> {
        let path = sqlite_path(test);
        remove_sqlite(&path);
        remove_ended_runs(path.parent().expect("a folder"), test);
        let url = format!("sqlite:{}", path.display());
        let pool = jobguard::sqlite::connect(&url, connections)
            .await
            .expect("open SQLite");
        pool.execute(LEDGER).await.expect("create ledger");
        Some(pool)
    }

    statements!();
}
