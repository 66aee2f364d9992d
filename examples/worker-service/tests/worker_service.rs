//! Runs the example's binary on SQLite and on PostgreSQL, then checks in the database that
//! every job took effect once.

use std::process::Command;
use std::str::FromStr;

use jobguard_testsupport::{Service, scratch};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::SqlitePoolOptions;

/// What the database holds after a run.
#[derive(Debug, PartialEq)]
struct Facts {
    /// `(order, amount)` per ledger row.
    ledger: Vec<(String, i64)>,
    orders: Vec<String>,
    receipts: i64,
    email: Option<String>,
    guard_rows: i64,
    /// `(state, jobs)`.
    jobs: Vec<(String, i64)>,
}

macro_rules! facts {
    ($pool:expr) => {{
        let pool = $pool;
        Facts {
            ledger: sqlx::query_as("select order_id, amount from ledger order by order_id")
                .fetch_all(pool)
                .await
                .unwrap(),
            orders: sqlx::query_scalar("select id from orders")
                .fetch_all(pool)
                .await
                .unwrap(),
            receipts: sqlx::query_scalar("select count(*) from receipts")
                .fetch_one(pool)
                .await
                .unwrap(),
            email: sqlx::query_scalar("select email from customers where id = 7")
                .fetch_optional(pool)
                .await
                .unwrap(),
            guard_rows: sqlx::query_scalar("select count(*) from processed_jobs")
                .fetch_one(pool)
                .await
                .unwrap(),
            jobs: sqlx::query_as(
                "select state, count(*) from jobguard_jobs group by state order by state",
            )
            .fetch_all(pool)
            .await
            .unwrap(),
        }
    }};
}

/// One ledger row per credited order, none for the rolled-back order, one receipt despite the
/// failed first attempt, and every job completed: five jobs, four keys.
fn expected() -> Facts {
    Facts {
        ledger: vec![("order-1".into(), 500), ("order-2".into(), 250)],
        orders: vec!["order-2".into()],
        receipts: 1,
        email: Some("ada@example.com".into()),
        guard_rows: 4,
        jobs: vec![("completed".into(), 5)],
    }
}

/// Runs the example on `url` and returns what it printed.
fn run_example(url: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_example-worker-service"))
        .args(["--database-url", url])
        .output()
        .expect("start the example");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the example failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn assert_printed(stdout: &str) {
    for line in [
        "enqueued credit:order-1: job 1 (new)",
        "enqueued credit:order-1: job 1 (already waiting)",
        "first run: 4 applied, 0 duplicates, 1 failed and retried, 0 dead",
        "second run: 0 applied, 1 duplicates, 0 failed and retried, 0 dead",
        "ledger: 2 rows, total 750",
    ] {
        assert!(stdout.contains(line), "no `{line}` in:\n{stdout}");
    }
}

#[tokio::test]
async fn on_sqlite_every_job_takes_effect_once() {
    let dir = scratch("example-worker-service", "sqlite");
    let url = format!("sqlite:{}", dir.join("service.db").display());

    let stdout = run_example(&url);
    assert_printed(&stdout);
    let pool = SqlitePoolOptions::new().connect(&url).await.unwrap();
    assert_eq!(facts!(&pool), expected(), "{stdout}");
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn on_postgres_every_job_takes_effect_once() {
    let Some(admin_url) = Service::Postgres.url() else {
        return;
    };
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&admin_url)
        .await
        .expect("connect to PostgreSQL");
    let database = format!("example_worker_service_{}", std::process::id());
    for statement in [
        format!("drop database if exists {database}"),
        format!("create database {database}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&admin)
            .await
            .unwrap();
    }
    let url = with_database(&admin_url, &database);

    let stdout = run_example(&url);
    assert_printed(&stdout);
    let options = PgConnectOptions::from_str(&url)
        .unwrap()
        .options([("search_path", "worker_service")]);
    let pool = PgPoolOptions::new().connect_with(options).await.unwrap();
    assert_eq!(facts!(&pool), expected(), "{stdout}");
    pool.close().await;

    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "drop database {database} with (force)"
    )))
    .execute(&admin)
    .await
    .unwrap();
}

/// `url` with its database replaced by `database`.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let authority = base.find("://").map_or(0, |at| at + 3);
    let end = base[authority..]
        .find('/')
        .map_or(base.len(), |at| authority + at);
    let mut url = format!("{}/{database}", &base[..end]);
    if let Some(query) = query {
        url.push('?');
        url.push_str(query);
    }
    url
}
