//! Guard retention on every backend: the horizon check, batched pruning, the step ledger's
//! `started` and `attention` steps surviving it, scheduled pruning one worker at a time, and
//! the seed's pitfall, "pruning too early". The conformance tests are in `prune.rs` and `replay.rs`;
//! the metrics tests, which need a thread-local recorder, are here.

use std::future::Future;
use std::time::Duration;

use jobguard::metrics::{DUPLICATE_AGE_SECONDS, GUARD_OLDEST_AGE_SECONDS, PRUNED_ROWS_TOTAL};
use jobguard::{Guard, JobKey, Pruner, RetentionConfig, RetryPolicy};
use metrics_util::debugging::{DebugValue, Snapshot};
use sqlx::Pool;
use sqlx::postgres::Postgres;
use sqlx::sqlite::Sqlite;

use crate::common::{self, TestDb};

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Moving rows back in time, which the tests need instead of waiting days.
trait Aging: TestDb {
    /// Makes every row of the guard table `by` older.
    fn age_guard(pool: &Pool<Self>, by: Duration) -> impl Future<Output = ()> + Send;

    /// Inserts `rows` guard rows of `kind`, applied about `age` ago.
    fn insert_guard_rows(
        pool: &Pool<Self>,
        kind: &str,
        rows: i64,
        age: Duration,
    ) -> impl Future<Output = ()> + Send;

    /// Makes every step of the `jobguard_steps` ledger `by` older.
    fn age_steps(pool: &Pool<Self>, by: Duration) -> impl Future<Output = ()> + Send;

    /// Makes every finished job `by` older (when it finished; when it runs stays).
    fn age_jobs(pool: &Pool<Self>, by: Duration) -> impl Future<Output = ()> + Send;

    /// Inserts `rows` jobs finished now in `state`.
    fn insert_finished_jobs(
        pool: &Pool<Self>,
        state: &'static str,
        rows: i64,
    ) -> impl Future<Output = ()> + Send;

    /// Refreshes the planner's statistics.
    fn analyze(pool: &Pool<Self>) -> impl Future<Output = ()> + Send;

    /// The plan of `sql`, as text.
    fn explain(pool: &Pool<Self>, sql: &str) -> impl Future<Output = String> + Send;

    /// Whether `plan` reads the whole jobs table.
    fn full_scan(plan: &str) -> bool;
}

fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap()
}

impl Aging for Postgres {
    async fn age_guard(pool: &Pool<Self>, by: Duration) {
        sqlx::query(
            "update processed_jobs set applied_at = applied_at - $1 * interval '1 microsecond'",
        )
        .bind(micros(by))
        .execute(pool)
        .await
        .unwrap();
    }

    async fn insert_guard_rows(pool: &Pool<Self>, kind: &str, rows: i64, age: Duration) {
        sqlx::query(
            "insert into processed_jobs (job_key, kind, claim_token, applied_at)
             select $3 || ':' || n, $3, '\\x00'::bytea,
                    now() - $2 * interval '1 microsecond' + n * interval '1 millisecond'
             from generate_series(1, $1) n",
        )
        .bind(rows)
        .bind(micros(age))
        .bind(kind)
        .execute(pool)
        .await
        .unwrap();
    }

    async fn age_steps(pool: &Pool<Self>, by: Duration) {
        sqlx::query(
            "update jobguard_steps set updated_at = updated_at - $1 * interval '1 microsecond',
                                       started_at = started_at - $1 * interval '1 microsecond'",
        )
        .bind(micros(by))
        .execute(pool)
        .await
        .unwrap();
    }
    async fn age_jobs(pool: &Pool<Self>, by: Duration) {
        sqlx::query(
            "update jobguard_jobs set finished_at = finished_at - $1 * interval '1 microsecond'",
        )
        .bind(micros(by))
        .execute(pool)
        .await
        .unwrap();
    }

    async fn insert_finished_jobs(pool: &Pool<Self>, state: &'static str, rows: i64) {
        sqlx::query(
            "insert into jobguard_jobs
                 (kind, job_key, queue, payload, state, attempt, max_attempts, finished_at)
             select 'bulk', 'bulk:' || $1 || ':' || n, 'default', '{}'::jsonb, $1, 1, 1, now()
             from generate_series(1, $2) n",
        )
        .bind(state)
        .bind(rows)
        .execute(pool)
        .await
        .unwrap();
    }

    async fn analyze(pool: &Pool<Self>) {
        sqlx::query("analyze jobguard_jobs")
            .execute(pool)
            .await
            .unwrap();
    }

    async fn explain(pool: &Pool<Self>, sql: &str) -> String {
        let lines: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("explain {sql}")))
            .fetch_all(pool)
            .await
            .unwrap();
        lines.join("\n")
    }

    fn full_scan(plan: &str) -> bool {
        plan.contains("Seq Scan on jobguard_jobs")
    }
}

impl Aging for Sqlite {
    async fn age_guard(pool: &Pool<Self>, by: Duration) {
        sqlx::query("update processed_jobs set applied_at = applied_at - $1")
            .bind(micros(by))
            .execute(pool)
            .await
            .unwrap();
    }

    async fn insert_guard_rows(pool: &Pool<Self>, kind: &str, rows: i64, age: Duration) {
        sqlx::query(
            "with recursive n(i) as (select 1 union all select i + 1 from n where i < $1)
             insert into processed_jobs (job_key, kind, claim_token, applied_at)
             select $3 || ':' || i, $3, x'00',
                    cast((julianday('now') - 2440587.5) * 86400000000.0 as integer) - $2
                    + i * 1000
             from n",
        )
        .bind(rows)
        .bind(micros(age))
        .bind(kind)
        .execute(pool)
        .await
        .unwrap();
    }

    async fn age_steps(pool: &Pool<Self>, by: Duration) {
        sqlx::query(
            "update jobguard_steps set updated_at = updated_at - $1, started_at = started_at - $1",
        )
        .bind(micros(by))
        .execute(pool)
        .await
        .unwrap();
    }
    async fn age_jobs(pool: &Pool<Self>, by: Duration) {
        sqlx::query("update jobguard_jobs set finished_at = finished_at - $1")
            .bind(micros(by))
            .execute(pool)
            .await
            .unwrap();
    }

    async fn insert_finished_jobs(pool: &Pool<Self>, state: &'static str, rows: i64) {
        sqlx::query(
            "with recursive n(i) as (select 1 union all select i + 1 from n where i < $2)
             insert into jobguard_jobs (kind, job_key, queue, payload, state, attempt,
                                        max_attempts, run_at, created_at, finished_at)
             select 'bulk', 'bulk:' || $1 || ':' || i, 'default', '{}', $1, 1, 1, 0, 0,
                    cast((julianday('now') - 2440587.5) * 86400000000.0 as integer)
             from n",
        )
        .bind(state)
        .bind(rows)
        .execute(pool)
        .await
        .unwrap();
    }

    async fn analyze(pool: &Pool<Self>) {
        sqlx::query("analyze").execute(pool).await.unwrap();
    }

    /// Each node of the plan on a line, after its ancestors: `CO-ROUTINE c > SCAN ...`.
    async fn explain(pool: &Pool<Self>, sql: &str) -> String {
        let rows: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("explain query plan {sql}")))
                .fetch_all(pool)
                .await
                .unwrap();
        let mut paths = std::collections::HashMap::new();
        let mut lines = Vec::new();
        for (id, parent, _, detail) in rows {
            let path = match paths.get(&parent) {
                Some(above) => format!("{above} > {detail}"),
                None => detail,
            };
            lines.push(path.clone());
            paths.insert(id, path);
        }
        lines.join("\n")
    }

    /// A scan of the table, or of an index over every row (not one of the partial indexes
    /// of live or dead jobs), outside the `limit`ed subqueries (SQLite's co-routines).
    fn full_scan(plan: &str) -> bool {
        plan.lines().any(|line| {
            let node = line.rsplit(" > ").next().unwrap_or(line);
            let whole = !node.contains("INDEX") || node.contains("jobguard_jobs_finished");
            node.starts_with("SCAN jobguard_jobs") && whole && !line.contains("CO-ROUTINE")
        })
    }
}

mod prune;
mod replay;

/// A key applied, its row aged two days, delivered again; then five 30-day-old rows pruned.
async fn age_and_prune<DB: Aging>(test: &str) -> Option<()> {
    let pool = DB::open(test, 4).await?;
    let guard = Guard::<DB>::new(pool.clone());
    guard.migrate().await.unwrap();
    let key = JobKey::new("credit", ["order-1"]).unwrap();
    let first = guard
        .run(
            &key,
            async |conn| Ok(DB::insert_ledger(conn, 7, 500).await?),
        )
        .await
        .unwrap();
    assert!(first.is_applied());
    DB::age_guard(&pool, 2 * DAY).await;
    let again = guard
        .run(
            &key,
            async |conn| Ok(DB::insert_ledger(conn, 7, 500).await?),
        )
        .await
        .unwrap();
    assert!(again.is_duplicate(), "{again:?}");

    DB::insert_guard_rows(&pool, "old", 5, 30 * DAY).await;
    let retention = RetentionConfig::default()
        .validate(&RetryPolicy::default(), Duration::from_secs(30))
        .unwrap();
    let report = Pruner::new(&guard, retention).run().await.unwrap().unwrap();
    assert_eq!(report.guard_rows, 5);
    Some(())
}

/// Runs [`age_and_prune`] with a fresh recorder.
fn recorded<DB: Aging>(test: &str) -> Option<Snapshot> {
    let (ran, snapshot) = common::recorded(age_and_prune::<DB>(test));
    ran?;
    Some(snapshot)
}

/// The duplicate's age went into the histogram, the prune into the counter, and the gauge says
/// how old the oldest row left is: the aged credit key, two days.
fn check_series(snapshot: Snapshot) {
    let (mut ages, mut oldest, mut pruned) = (None, None, None);
    for (key, _unit, _description, value) in snapshot.into_vec() {
        let labels: Vec<(String, String)> = key
            .key()
            .labels()
            .map(|label| (label.key().to_owned(), label.value().to_owned()))
            .collect();
        match (key.key().name(), value) {
            (DUPLICATE_AGE_SECONDS, DebugValue::Histogram(values)) => {
                assert_eq!(labels, [("kind".to_owned(), "credit".to_owned())]);
                ages = Some(values);
            }
            (GUARD_OLDEST_AGE_SECONDS, DebugValue::Gauge(age)) => {
                assert_eq!(labels, [("table".to_owned(), "processed_jobs".to_owned())]);
                oldest = Some(age.into_inner());
            }
            (PRUNED_ROWS_TOTAL, DebugValue::Counter(rows)) => {
                assert_eq!(labels, [("table".to_owned(), "processed_jobs".to_owned())]);
                pruned = Some(rows);
            }
            _ => {}
        }
    }
    let two_days = (2 * DAY).as_secs_f64();
    let ages = ages.expect("no duplicate age recorded");
    assert_eq!(ages.len(), 1, "{ages:?}");
    let age = ages[0].into_inner();
    assert!(age >= two_days - 60.0 && age < two_days + 3600.0, "{age}");
    let oldest = oldest.expect("no oldest age recorded");
    assert!(
        oldest >= two_days - 60.0 && oldest < two_days + 3600.0,
        "{oldest}"
    );
    assert_eq!(pruned, Some(5));
}

backends!(fn duplicate_ages_and_the_memory_horizon_are_recorded, blocking);
fn duplicate_ages_and_the_memory_horizon_are_recorded<DB: Aging>() {
    let Some(snapshot) = recorded::<DB>("retention_metrics") else {
        assert_ne!(DB::BACKEND, "sqlite", "SQLite is always there");
        return;
    };
    check_series(snapshot);
}
