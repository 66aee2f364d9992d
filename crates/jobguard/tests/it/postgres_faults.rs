//! Fault injection on a real PostgreSQL: serialization failures and deadlocks raised by the
//! server, contention that never clears, a real serialization conflict between two serializable
//! transactions, connections cut around `COMMIT` by a proxy (also a worker batch's, in
//! `postgres_faults/batch.rs`), and a job that panics mid-effect.
//!
//! Every test has its own schema and fails (rather than hangs) within [`TEST_TIMEOUT`].

use std::future::Future;
use std::time::Duration;

use jobguard::{Claim, Error, GuardConfig, JobError, JobKey, Outcome, PgGuard};
use sqlx::postgres::{PgPool, PgPoolOptions, PgSslMode, Postgres};
use sqlx::{Executor, PgConnection};

use crate::common::{TestDb, guard_rows, ledger_and_guard_rows, ledger_rows};

const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a test body, failing it when it takes longer than [`TEST_TIMEOUT`].
async fn bounded<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(TEST_TIMEOUT, body)
        .await
        .expect("the test did not finish within its timeout");
}

fn key(n: usize) -> JobKey {
    JobKey::new("credit", [format!("order-{n}")]).expect("valid key")
}

fn sqlstate(error: &sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|db| db.code())
        .map(|code| code.into_owned())
}

/// Raises a real server error with the given SQLSTATE.
async fn raise(conn: &mut PgConnection, sqlstate: &str) -> sqlx::Result<()> {
    let statement = format!(
        "do $$ begin raise exception 'injected fault' using errcode = '{sqlstate}'; end $$"
    );
    conn.execute(sqlx::AssertSqlSafe(statement)).await?;
    Ok(())
}

/// A transient server error in the first run of the effect is retried in a fresh transaction;
/// the first run's writes are rolled back.
async fn transient_error_is_retried(test: &str, code: &str) {
    let Some(pool) = Postgres::open(test, 4).await else {
        return;
    };
    let guard = PgGuard::new(pool.clone());
    guard.migrate().await.unwrap();

    let mut calls = 0_u32;
    let outcome = guard
        .run(&key(1), async |conn| -> Result<u32, JobError> {
            calls += 1;
            Postgres::insert_ledger(conn, 7, 500).await?;
            if calls == 1 {
                raise(conn, code).await?;
            }
            Ok(calls)
        })
        .await;

    assert!(matches!(outcome, Ok(Outcome::Applied(2))), "{outcome:?}");
    assert_eq!(calls, 2, "the effect ran once more after the {code}");
    assert_eq!(
        ledger_rows(&pool).await,
        1,
        "the first run's row was rolled back"
    );
    assert_eq!(guard_rows(&pool).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serialization_failure_is_retried() {
    bounded(transient_error_is_retried(
        "fault_serialization_retried",
        "40001",
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlock_is_retried() {
    bounded(transient_error_is_retried(
        "fault_deadlock_retried",
        "40P01",
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_gives_up_after_the_configured_attempts() {
    bounded(async {
        let Some(pool) = Postgres::open("fault_contention_exhausted", 4).await else {
            return;
        };
        let config = GuardConfig::default().contention_attempts(3);
        let guard = PgGuard::with_config(pool.clone(), config).unwrap();
        guard.migrate().await.unwrap();

        let mut calls = 0_u32;
        let result = guard
            .run(&key(1), async |conn| -> Result<(), JobError> {
                calls += 1;
                Postgres::insert_ledger(conn, 7, 500).await?;
                raise(conn, "40001").await?;
                Ok(())
            })
            .await;

        let Err(error @ Error::Contention { attempts, .. }) = &result else {
            panic!("expected contention: {result:?}")
        };
        assert_eq!(*attempts, 3, "{error}");
        assert_eq!(calls, 3, "one run per attempt");
        assert!(error.is_retryable());
        let Error::Contention { source, .. } = error else {
            unreachable!()
        };
        assert_eq!(sqlstate(source).as_deref(), Some("40001"), "{source:?}");
        assert_eq!(ledger_rows(&pool).await, 0);
        assert_eq!(guard_rows(&pool).await, 0);

        let later = guard
            .run(&key(1), async |conn| {
                Postgres::insert_ledger(conn, 7, 500).await?;
                Ok(())
            })
            .await
            .unwrap();
        assert!(later.is_applied(), "{later:?}");
        assert_eq!(ledger_and_guard_rows(&pool).await, (1, 1));
    })
    .await;
}

/// Two serializable transactions claim different keys and both read-then-write one counter.
/// The statements are interleaved in a fixed order so the conflict is certain: the second
/// transaction's snapshot predates the first's commit, so its update of the counter fails with
/// a serialization failure. Its claim disappears with the rollback and a retry applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serializable_claims_conflict_on_a_shared_counter() {
    bounded(async {
        let Some(pool) = Postgres::open("fault_serializable_counter", 4).await else {
            return;
        };
        let guard = PgGuard::new(pool.clone());
        guard.migrate().await.unwrap();
        pool.execute("create table counter (id int primary key, n bigint not null)")
            .await
            .unwrap();
        pool.execute("insert into counter values (1, 0)")
            .await
            .unwrap();
        const SERIALIZABLE: &str = "begin isolation level serializable";
        let read = "select n from counter where id = 1";
        let write = "update counter set n = $1 where id = 1";

        let mut first = pool.begin_with(SERIALIZABLE).await.unwrap();
        assert_eq!(
            guard.claim_tx(&mut first, &key(1)).await.unwrap(),
            Claim::Claimed
        );
        let n1: i64 = sqlx::query_scalar(read)
            .fetch_one(&mut *first)
            .await
            .unwrap();

        let mut second = pool.begin_with(SERIALIZABLE).await.unwrap();
        assert_eq!(
            guard.claim_tx(&mut second, &key(2)).await.unwrap(),
            Claim::Claimed
        );
        let n2: i64 = sqlx::query_scalar(read)
            .fetch_one(&mut *second)
            .await
            .unwrap();

        sqlx::query(write)
            .bind(n1 + 1)
            .execute(&mut *first)
            .await
            .unwrap();
        first
            .commit()
            .await
            .expect("the first transaction to commit wins");

        let conflict = async {
            sqlx::query(write)
                .bind(n2 + 1)
                .execute(&mut *second)
                .await?;
            second.commit().await
        }
        .await
        .expect_err("the second transaction read a counter the first then changed");
        assert_eq!(
            sqlstate(&conflict).as_deref(),
            Some("40001"),
            "{conflict:?}"
        );
        assert!(
            guard.lookup(&key(2)).await.unwrap().is_none(),
            "the claim was rolled back"
        );

        // The redelivery of the second key, in a fresh serializable transaction, applies.
        let mut retry = pool.begin_with(SERIALIZABLE).await.unwrap();
        assert_eq!(
            guard.claim_tx(&mut retry, &key(2)).await.unwrap(),
            Claim::Claimed
        );
        let n: i64 = sqlx::query_scalar(read)
            .fetch_one(&mut *retry)
            .await
            .unwrap();
        sqlx::query(write)
            .bind(n + 1)
            .execute(&mut *retry)
            .await
            .unwrap();
        retry.commit().await.unwrap();

        let total: i64 = sqlx::query_scalar(read).fetch_one(&pool).await.unwrap();
        assert_eq!(total, 2, "each key incremented the counter once");
        assert_eq!(guard_rows(&pool).await, 2);
    })
    .await;
}

/// As documented on `claim_tx`: under `serializable`, claiming a key that a transaction
/// committed after this transaction's snapshot fails with a serialization failure (the row is
/// there but invisible), and the redelivery then sees a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serializable_claim_of_a_key_committed_after_the_snapshot_fails() {
    bounded(async {
        let Some(pool) = Postgres::open("fault_serializable_same_key", 4).await else {
            return;
        };
        let guard = PgGuard::new(pool.clone());
        guard.migrate().await.unwrap();
        const SERIALIZABLE: &str = "begin isolation level serializable";

        let mut late = pool.begin_with(SERIALIZABLE).await.unwrap();
        sqlx::query("select 1").execute(&mut *late).await.unwrap(); // takes the snapshot

        let mut early = pool.begin_with(SERIALIZABLE).await.unwrap();
        assert_eq!(
            guard.claim_tx(&mut early, &key(1)).await.unwrap(),
            Claim::Claimed
        );
        Postgres::insert_ledger(&mut early, 7, 500).await.unwrap();
        early.commit().await.unwrap();

        let conflict = guard.claim_tx(&mut late, &key(1)).await;
        let Err(Error::Database(source)) = &conflict else {
            panic!("{conflict:?}")
        };
        assert_eq!(sqlstate(source).as_deref(), Some("40001"), "{source:?}");
        late.rollback().await.unwrap();

        let mut redelivery = pool.begin_with(SERIALIZABLE).await.unwrap();
        let claim = guard.claim_tx(&mut redelivery, &key(1)).await.unwrap();
        assert!(matches!(claim, Claim::Duplicate(_)), "{claim:?}");
        redelivery.rollback().await.unwrap();
        assert_eq!(ledger_and_guard_rows(&pool).await, (1, 1));
    })
    .await;
}

/// A job that panics in its effect, after writing: the task's transaction is dropped, the
/// server rolls it back, and a redelivery applies (it would wait forever on the guard row's
/// lock if the dropped transaction had been left open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_mid_effect_rolls_back() {
    bounded(async {
        let Some(pool) = Postgres::open("fault_panic_mid_effect", 4).await else {
            return;
        };
        let guard = PgGuard::new(pool.clone());
        guard.migrate().await.unwrap();

        let job = tokio::spawn({
            let (guard, key) = (guard.clone(), key(1));
            async move {
                guard
                    .run(&key, async move |conn| -> Result<(), JobError> {
                        Postgres::insert_ledger(conn, 7, 500).await?;
                        panic!("a bug in the job, after its first write");
                    })
                    .await
            }
        });
        let joined = job.await;
        let Err(join_error) = joined else {
            panic!("the job returned: {joined:?}")
        };
        assert!(join_error.is_panic(), "{join_error:?}");
        assert_eq!(ledger_rows(&pool).await, 0);
        assert_eq!(guard_rows(&pool).await, 0);

        let redelivery = guard
            .run(&key(1), async |conn| {
                Postgres::insert_ledger(conn, 7, 500).await?;
                Ok(())
            })
            .await
            .unwrap();
        assert!(redelivery.is_applied(), "{redelivery:?}");
        assert_eq!(ledger_and_guard_rows(&pool).await, (1, 1));
    })
    .await;
}

mod batch;
mod proxy;
mod transient;

use proxy::{Fault, Proxy};

/// A pool straight to the test's schema (for checks), a proxy in front of PostgreSQL, and a
/// pool of `connections` through the proxy.
async fn proxied(test: &str, connections: u32) -> Option<(PgPool, Proxy, PgPool)> {
    let options = crate::common::postgres_options(&format!("pf_{test}")).await?;
    let direct = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options.clone())
        .await
        .expect("connect to the test schema");
    direct
        .execute(crate::common::LEDGER)
        .await
        .expect("create ledger");

    let host = options.get_host();
    assert!(
        !host.starts_with('/'),
        "the proxy needs PostgreSQL on TCP, not {host}"
    );
    let upstream = tokio::net::lookup_host((host, options.get_port()))
        .await
        .expect("resolve the PostgreSQL host")
        .next()
        .expect("an address for the PostgreSQL host");
    let proxy = Proxy::start(upstream).await;
    // Plain TCP, or the proxy would see TLS records instead of `COMMIT`.
    let through = options
        .host("127.0.0.1")
        .port(proxy.port())
        .ssl_mode(PgSslMode::Disable);
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(through)
        .await
        .expect("connect through the proxy");
    Some((direct, proxy, pool))
}

/// [`proxied`] with two connections, and a migrated guard on the pool through the proxy.
async fn proxied_guard(test: &str) -> Option<(PgPool, Proxy, PgGuard)> {
    let (direct, proxy, pool) = proxied(test, 2).await?;
    let guard = PgGuard::new(pool);
    guard.migrate().await.unwrap();
    Some((direct, proxy, guard))
}

async fn credit(guard: &PgGuard, key: &JobKey) -> jobguard::Result<Outcome<i64>> {
    guard
        .run(key, async move |conn| {
            Postgres::insert_ledger(conn, 7, 500).await?;
            Ok(500_i64)
        })
        .await
}

/// The connection drops after the server committed: the guard row, read on a new connection,
/// holds this run's claim token, so the run reports the effect as applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_lost_after_commit_is_applied() {
    bounded(async {
        let Some((direct, proxy, guard)) = proxied_guard("after_commit").await else {
            return;
        };

        proxy.arm(Fault::AfterCommit);
        let outcome = credit(&guard, &key(1)).await;
        assert_eq!(proxy.fired().await, 1, "the commit was cut");
        assert!(proxy.server_committed(), "the server committed");
        assert!(matches!(outcome, Ok(Outcome::Applied(500))), "{outcome:?}");
        assert_eq!(ledger_rows(&direct).await, 1);

        let again = credit(&guard, &key(1)).await.unwrap();
        let Outcome::Duplicate(dup) = again else {
            panic!("{again:?}")
        };
        assert_eq!(dup.result, Some(500));
        assert_eq!(ledger_and_guard_rows(&direct).await, (1, 1));
    })
    .await;
}

/// The connection drops before the server saw the commit: it rolls back, the guard row is not
/// there, and the run fails with a retryable error that is not `OutcomeUnknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_lost_before_commit_is_retryable() {
    bounded(async {
        let Some((direct, proxy, guard)) = proxied_guard("before_commit").await else {
            return;
        };

        proxy.arm(Fault::BeforeCommit);
        let result = credit(&guard, &key(1)).await;
        assert_eq!(proxy.fired().await, 1, "the commit was cut");
        assert!(!proxy.server_committed());
        let Err(error) = &result else {
            panic!("expected an error: {result:?}")
        };
        assert!(error.is_retryable(), "{error:?}");
        assert!(!matches!(error, Error::OutcomeUnknown { .. }), "{error:?}");
        assert_eq!(ledger_and_guard_rows(&direct).await, (0, 0));

        proxy.disarm();
        let retry = credit(&guard, &key(1)).await.unwrap();
        assert!(matches!(retry, Outcome::Applied(500)), "{retry:?}");
        assert_eq!(ledger_and_guard_rows(&direct).await, (1, 1));
    })
    .await;
}

/// The connection drops after the commit and the database cannot be reached to check: the
/// outcome is unknown. A redelivery once the database is back reports a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_lost_with_unreachable_witness_is_unknown() {
    bounded(async {
        let Some((direct, proxy, guard)) = proxied_guard("unreachable_witness").await else {
            return;
        };

        proxy.arm(Fault::AfterCommitThenUnreachable);
        let result = credit(&guard, &key(1)).await;
        assert_eq!(proxy.fired().await, 1, "the commit was cut");
        assert!(proxy.server_committed(), "the server committed");
        let Err(error @ Error::OutcomeUnknown { key: unknown, .. }) = &result else {
            panic!("expected OutcomeUnknown: {result:?}")
        };
        assert_eq!(unknown, "credit:order-1");
        assert!(error.is_retryable());
        assert_eq!(ledger_rows(&direct).await, 1, "the commit did happen");

        proxy.accept_again();
        let redelivery = credit(&guard, &key(1)).await.unwrap();
        let Outcome::Duplicate(dup) = redelivery else {
            panic!("{redelivery:?}")
        };
        assert_eq!(dup.result, Some(500));
        assert_eq!(ledger_and_guard_rows(&direct).await, (1, 1));
    })
    .await;
}

/// A serialization failure raised by the server at `COMMIT` (here by a deferred constraint
/// trigger, which runs at commit) is retried like one raised by the effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serialization_failure_at_commit_is_retried() {
    bounded(async {
        let Some(pool) = Postgres::open("fault_serialization_at_commit", 4).await else {
            return;
        };
        let guard = PgGuard::new(pool.clone());
        guard.migrate().await.unwrap();
        // A sequence, not a table: its counter survives the rollback of the failed commit.
        pool.execute(
            "create sequence commit_faults;
             create function fail_first_commit() returns trigger language plpgsql as $$
             begin
                 if nextval('commit_faults') = 1 then
                     raise exception 'conflict at commit' using errcode = '40001';
                 end if;
                 return null;
             end $$;
             create constraint trigger fail_first_commit after insert on ledger
                 deferrable initially deferred for each row execute function fail_first_commit()",
        )
        .await
        .unwrap();

        let mut calls = 0_u32;
        let outcome = guard
            .run(&key(1), async |conn| -> Result<u32, JobError> {
                calls += 1;
                Postgres::insert_ledger(conn, 7, 500).await?;
                Ok(calls)
            })
            .await;

        assert!(matches!(outcome, Ok(Outcome::Applied(2))), "{outcome:?}");
        assert_eq!(calls, 2, "the effect ran again after the failed commit");
        let faults: i64 = sqlx::query_scalar("select last_value from commit_faults")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(faults, 2, "the trigger ran at both commits");
        assert_eq!(ledger_and_guard_rows(&pool).await, (1, 1));
    })
    .await;
}

/// The client's side of the connection drops right after it sent `COMMIT`, while the server is
/// still committing (a deferred trigger makes the commit take a second). The witness looks
/// before the commit lands, so it finds no guard row; but "no row yet" does not mean "rolled
/// back": the run must not report an error that says nothing was applied (only
/// `OutcomeUnknown`, or `Applied` after waiting for the old transaction to end, are true).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_lost_while_commit_in_flight_is_not_reported_as_rolled_back() {
    bounded(async {
        let Some((direct, proxy, guard)) = proxied_guard("commit_in_flight").await else {
            return;
        };
        direct
            .execute(
                "create function slow_commit() returns trigger language plpgsql as $$
                 begin perform pg_sleep(1); return null; end $$;
                 create constraint trigger slow_commit after insert on ledger
                     deferrable initially deferred for each row execute function slow_commit()",
            )
            .await
            .unwrap();

        proxy.arm(Fault::CommitInFlight);
        let result = credit(&guard, &key(1)).await;
        assert_eq!(proxy.fired().await, 1, "the commit was cut");
        assert!(proxy.server_committed(), "the server committed");
        assert_eq!(ledger_rows(&direct).await, 1, "the commit landed");
        match &result {
            Ok(Outcome::Applied(500)) | Err(Error::OutcomeUnknown { .. }) => {}
            other => panic!(
                "the commit landed, but the run reported {other:?}: an error other than \
                 OutcomeUnknown says nothing was applied"
            ),
        }

        let redelivery = credit(&guard, &key(1)).await.unwrap();
        assert!(redelivery.is_duplicate(), "{redelivery:?}");
        assert_eq!(ledger_and_guard_rows(&direct).await, (1, 1));
    })
    .await;
}

/// A worker starting while jobs run must not wait for them: migrating an existing guard table
/// does no DDL, which would queue behind every transaction writing the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_a_migrated_table_does_not_wait_for_running_jobs() {
    bounded(async {
        let Some(pool) = Postgres::open("migrate_does_not_wait", 4).await else {
            return;
        };
        let guard = PgGuard::new(pool.clone());
        guard.migrate().await.unwrap();

        // A job in flight: its transaction has written the guard table and stays open.
        let mut tx = pool.begin().await.unwrap();
        assert_eq!(
            guard.claim_tx(&mut tx, &key(1)).await.unwrap(),
            Claim::Claimed
        );

        let again = tokio::time::timeout(Duration::from_secs(5), guard.migrate()).await;
        assert!(
            matches!(again, Ok(Ok(()))),
            "migrate waited for the open transaction: {again:?}"
        );
        tx.rollback().await.unwrap();
    })
    .await;
}
