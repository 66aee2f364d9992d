//! The guard's conformance suite: every test runs on real PostgreSQL and real SQLite
//! (`backends!`).

use std::time::{Duration, SystemTime};

use jobguard::testkit::{self, deliver_concurrently};
use jobguard::{Claim, Error, Guard, GuardConfig, JobError, JobKey, Outcome, TableName};
use serde_json::json;

use crate::common::{TestDb, guard_rows, ledger_and_guard_rows, ledger_rows, ledger_total};

fn key(n: usize) -> JobKey {
    JobKey::new("credit", [format!("order-{n}")]).expect("valid key")
}

async fn credit<DB: TestDb>(
    guard: &Guard<DB>,
    key: &JobKey,
    amount: i64,
) -> jobguard::Result<Outcome<()>> {
    // `move`: a closure borrowing from an async fn's arguments makes its future !Send to
    // rustc (rust-lang/rust#110338), and `deliver_concurrently` spawns it.
    guard
        .run(key, async move |conn| {
            DB::insert_ledger(conn, 7, amount).await?;
            Ok(())
        })
        .await
}

backends!(fn concurrent_deliveries_apply_each_key_once);
/// The seed's experiment: 100 jobs, each delivered three times at once over 20 connections.
async fn concurrent_deliveries_apply_each_key_once<DB: TestDb>() {
    let Some(pool) = DB::open("concurrent_deliveries_apply_each_key_once", 20).await else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let keys: Vec<JobKey> = (0..100).map(key).collect();

    let report = deliver_concurrently(&keys, 3, move |key| {
        let guard = guard.clone();
        async move { credit::<DB>(&guard, &key, 500).await }
    })
    .await;

    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!((report.applied, report.duplicates), (100, 200));
    assert!(report.is_exactly_once(keys.len()));
    assert_eq!(ledger_rows(&pool).await, 100);
    assert_eq!(ledger_total(&pool).await, 100 * 500);
    assert_eq!(guard_rows(&pool).await, 100);
}

backends!(fn failed_effect_rolls_back_the_guard_row_and_the_retry_applies);
async fn failed_effect_rolls_back_the_guard_row_and_the_retry_applies<DB: TestDb>() {
    let Some(pool) = DB::open(
        "failed_effect_rolls_back_the_guard_row_and_the_retry_applies",
        4,
    )
    .await
    else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let key = key(1);

    let failed = guard
        .run(&key, async |conn| -> Result<(), JobError> {
            DB::insert_ledger(conn, 7, 500).await?;
            Err(JobError::msg("the card network timed out"))
        })
        .await;
    let Err(error @ Error::Effect { fatal: false, .. }) = failed else {
        panic!("{failed:?}")
    };
    assert!(error.is_retryable());
    assert_eq!(ledger_rows(&pool).await, 0, "the effect was rolled back");
    assert_eq!(
        guard_rows(&pool).await,
        0,
        "the guard row was rolled back with it"
    );

    assert!(
        credit::<DB>(&guard, &key, 500).await.unwrap().is_applied(),
        "the retry applies"
    );
    assert!(
        credit::<DB>(&guard, &key, 500)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(ledger_rows(&pool).await, 1);
}

backends!(fn rollback_lets_the_waiting_concurrent_delivery_apply);
/// A second delivery that arrives while the first is still running waits for it; when the
/// first rolls back, the second applies.
async fn rollback_lets_the_waiting_concurrent_delivery_apply<DB: TestDb>() {
    let Some(pool) = DB::open("rollback_lets_the_waiting_concurrent_delivery_apply", 4).await
    else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let key = key(2);
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<()>();

    let first = tokio::spawn({
        let (guard, key) = (guard.clone(), key.clone());
        async move {
            let mut claimed = Some(claimed_tx);
            guard
                .run(&key, async move |conn| -> Result<(), JobError> {
                    DB::insert_ledger(conn, 7, 500).await?;
                    if let Some(tx) = claimed.take() {
                        let _ = tx.send(());
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Err(JobError::msg("crashed mid-job"))
                })
                .await
        }
    });
    claimed_rx.await.unwrap();
    let second = credit::<DB>(&guard, &key, 500).await.unwrap();

    assert!(matches!(first.await.unwrap(), Err(Error::Effect { .. })));
    assert!(
        second.is_applied(),
        "the waiting delivery applied after the rollback: {second:?}"
    );
    assert_eq!(ledger_rows(&pool).await, 1);
}

backends!(fn duplicate_carries_the_first_result_and_time);
async fn duplicate_carries_the_first_result_and_time<DB: TestDb>() {
    let Some(pool) = DB::open("duplicate_carries_the_first_result_and_time", 4).await else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let key = JobKey::new("charge", ["order-8812"]).unwrap();
    let before = SystemTime::now() - Duration::from_secs(5);

    let mut runs = 0;
    let mut charge =
        async |conn: &mut <DB as sqlx::Database>::Connection| -> Result<String, JobError> {
            runs += 1;
            DB::insert_ledger(conn, 7, 500).await?;
            Ok(format!("ch_{runs}"))
        };
    let first = guard.run(&key, &mut charge).await.unwrap();
    let second = guard.run(&key, &mut charge).await.unwrap();

    assert_eq!(first, Outcome::Applied("ch_1".to_owned()));
    let Outcome::Duplicate(dup) = second else {
        panic!("{second:?}")
    };
    assert_eq!(
        dup.result.as_deref(),
        Some("ch_1"),
        "the first run's result comes back"
    );
    assert!(
        dup.first_applied_at > before
            && dup.first_applied_at < SystemTime::now() + Duration::from_secs(5)
    );
    assert_eq!(runs, 1, "the duplicate did not run the effect");

    let record = guard.lookup(&key).await.unwrap().expect("a guard row");
    assert_eq!(record.result, Some(json!("ch_1")));
    assert!(
        guard
            .lookup(&JobKey::new("charge", ["order-1"]).unwrap())
            .await
            .unwrap()
            .is_none()
    );
}

backends!(fn reused_key_with_another_payload_applies_nothing);
async fn reused_key_with_another_payload_applies_nothing<DB: TestDb>() {
    let Some(pool) = DB::open("reused_key_with_another_payload_applies_nothing", 4).await else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let key = key(3);
    let job = |amount: i64| {
        let guard = guard.clone();
        let key = key.clone();
        async move {
            guard
                .run_with_payload(
                    &key,
                    &json!({"account": 7, "amount": amount}),
                    async |conn| {
                        DB::insert_ledger(conn, 7, amount).await?;
                        Ok(())
                    },
                )
                .await
        }
    };

    assert!(job(500).await.unwrap().is_applied());
    let reused = job(900).await;
    assert!(
        matches!(&reused, Err(Error::KeyReused { key }) if key == "credit:order-3"),
        "{reused:?}"
    );
    assert!(!reused.unwrap_err().is_retryable());
    assert!(
        job(500).await.unwrap().is_duplicate(),
        "the same payload is a plain duplicate"
    );
    assert_eq!(
        (ledger_rows(&pool).await, ledger_total(&pool).await),
        (1, 500)
    );
}

backends!(fn claim_tx_follows_the_callers_commit_and_rollback);
async fn claim_tx_follows_the_callers_commit_and_rollback<DB: TestDb>() {
    let Some(pool) = DB::open("claim_tx_follows_the_callers_commit_and_rollback", 4).await else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let key = key(4);

    let mut tx = pool.begin().await.unwrap();
    assert_eq!(guard.claim_tx(&mut tx, &key).await.unwrap(), Claim::Claimed);
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        ledger_and_guard_rows(&pool).await,
        (0, 0),
        "rollback removes both"
    );

    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        guard.claim_tx(&mut tx, &key).await.unwrap(),
        Claim::Claimed,
        "claimable again"
    );
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    guard
        .store_result_tx(&mut tx, &key, &json!({"ledger": 1}))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    let claim = guard.claim_tx(&mut tx, &key).await.unwrap();
    let Claim::Duplicate(record) = claim else {
        panic!("{claim:?}")
    };
    assert_eq!(record.result, Some(json!({"ledger": 1})));
    tx.rollback().await.unwrap();
    assert_eq!(ledger_and_guard_rows(&pool).await, (1, 1));
}

backends!(fn running_twice_leaves_the_state_of_one_run);
async fn running_twice_leaves_the_state_of_one_run<DB: TestDb>() {
    let Some(pool) = DB::open("running_twice_leaves_the_state_of_one_run", 4).await else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let key = key(5);
    let state = async || Ok((ledger_rows(&pool).await, ledger_total(&pool).await));

    let guarded = testkit::run_twice(
        async || credit::<DB>(&guard, &key, 500).await.map(drop),
        state,
    )
    .await
    .unwrap();
    assert!(guarded.is_idempotent(), "{guarded:?}");
    assert_eq!(guarded.after_two, (1, 500));

    // The same check catches a job that is not idempotent, so it can fail.
    let naive = testkit::run_twice(
        async || {
            let mut conn = pool.acquire().await?;
            DB::insert_ledger(&mut conn, 7, 500).await?;
            Ok(())
        },
        state,
    )
    .await
    .unwrap();
    assert!(!naive.is_idempotent(), "{naive:?}");
}

backends!(fn fatal_and_retryable_effect_errors_are_told_apart);
async fn fatal_and_retryable_effect_errors_are_told_apart<DB: TestDb>() {
    let Some(pool) = DB::open("fatal_and_retryable_effect_errors_are_told_apart", 4).await else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();

    let fatal = guard
        .run(&key(6), async |_conn| -> Result<(), JobError> {
            Err(JobError::fatal("order 6 does not exist"))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(fatal, Error::Effect { fatal: true, .. }) && !fatal.is_retryable(),
        "{fatal:?}"
    );
    assert!(
        fatal.to_string().contains("order 6 does not exist"),
        "{fatal}"
    );

    // A database error inside the effect (here a missing table) is kept as the source.
    let broken = guard
        .run(&key(7), async |conn| {
            DB::insert_ledger(conn, 7, 500).await?;
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            DB::execute(&mut tx, "insert into no_such_table values (1)").await?;
            Ok(())
        })
        .await
        .unwrap_err();
    let Error::Effect { source, .. } = &broken else {
        panic!("{broken:?}")
    };
    assert!(source.downcast_ref::<sqlx::Error>().is_some(), "{source:?}");
    assert_eq!(ledger_and_guard_rows(&pool).await, (0, 0));
}

backends!(fn configured_table_holds_the_guard);
async fn configured_table_holds_the_guard<DB: TestDb>() {
    let Some(pool) = DB::open("configured_table_holds_the_guard", 4).await else {
        return;
    };
    let table = TableName::new("billing_guard").unwrap();
    let guard = Guard::with_config(pool.clone(), GuardConfig::default().table(table)).unwrap();
    guard.migrate().await.unwrap();
    guard.migrate().await.expect("migrate is idempotent");

    assert!(
        credit::<DB>(&guard, &key(8), 500)
            .await
            .unwrap()
            .is_applied()
    );
    assert!(
        credit::<DB>(&guard, &key(8), 500)
            .await
            .unwrap()
            .is_duplicate()
    );
    assert_eq!(
        DB::count(&pool, "select count(*) from billing_guard").await,
        1
    );
}
