//! Crashes a delivery after the provider charged and before the commit, delivers again, and
//! counts the charges at the provider and in the database.

use std::time::Duration;

use example_external_call::{Payments, STEP_LEASE};
use jobguard::Outcome;
use jobguard::steps::StepOutcome;
use jobguard_provider::{Provider, ProviderConfig, RunningProvider};
use jobguard_testsupport::scratch;
use sqlx::SqlitePool;

async fn setup(test: &str) -> (SqlitePool, RunningProvider, Payments) {
    let dir = scratch("example-external-call", test);
    let url = format!("sqlite:{}", dir.join("payments.db").display());
    let pool = jobguard::sqlite::connect(&url, 4).await.unwrap();
    let provider = Provider::start(ProviderConfig::default()).await.unwrap();
    let payments = Payments::open(pool.clone(), &provider.url()).await.unwrap();
    (pool, provider, payments)
}

/// The charges recorded for `order` in the database.
async fn recorded_charges(pool: &SqlitePool, order: &str) -> Vec<String> {
    sqlx::query_scalar("select charge_id from charges where order_id = $1")
        .bind(order)
        .fetch_all(pool)
        .await
        .unwrap()
}

fn charges_of(provider: &RunningProvider, order: &str) -> Vec<String> {
    provider
        .provider()
        .charges()
        .into_iter()
        .filter(|charge| charge.order == order)
        .map(|charge| charge.id)
        .collect()
}

#[tokio::test]
async fn with_a_key_the_redelivery_after_a_crash_gets_the_first_charge_back() {
    let (pool, provider, payments) = setup("keyed").await;

    payments.crash_after_next_call();
    let crashed = payments.charge_with_key("order-1", 4200).await.unwrap();
    assert!(crashed.is_none(), "{crashed:?}");
    // The provider charged, and nothing was recorded: the window a crash leaves.
    let charged = charges_of(&provider, "order-1");
    assert_eq!(charged.len(), 1);
    assert!(recorded_charges(&pool, "order-1").await.is_empty());

    let again = payments.charge_with_key("order-1", 4200).await.unwrap();
    assert_eq!(again, Some(Outcome::Applied(charged[0].clone())));
    let once_more = payments.charge_with_key("order-1", 4200).await.unwrap();
    assert!(
        matches!(once_more, Some(Outcome::Duplicate(_))),
        "{once_more:?}"
    );

    assert_eq!(charges_of(&provider, "order-1"), charged);
    assert_eq!(recorded_charges(&pool, "order-1").await, charged);
    provider.stop().await;
}

#[tokio::test]
async fn without_a_key_the_redelivery_after_a_crash_reconciles_instead_of_charging() {
    let (pool, provider, payments) = setup("keyless").await;

    payments.crash_after_next_call();
    let crashed = payments.charge_without_key("order-2", 1800).await.unwrap();
    assert!(crashed.is_none(), "{crashed:?}");
    let charged = charges_of(&provider, "order-2");
    assert_eq!(charged.len(), 1);
    assert!(recorded_charges(&pool, "order-2").await.is_empty());

    // While the crashed caller's step is still leased, a redelivery calls nothing.
    let early = payments.charge_without_key("order-2", 1800).await;
    assert!(
        matches!(early, Err(jobguard::Error::StepInFlight { .. })),
        "{early:?}"
    );

    tokio::time::sleep(STEP_LEASE + Duration::from_millis(200)).await;
    let (step, recorded) = payments
        .charge_without_key("order-2", 1800)
        .await
        .unwrap()
        .expect("no crash this time");
    assert_eq!(step, StepOutcome::Reconciled(charged[0].clone()));
    assert!(recorded.is_applied());
    let (step, recorded) = payments
        .charge_without_key("order-2", 1800)
        .await
        .unwrap()
        .expect("no crash this time");
    assert_eq!(step, StepOutcome::Recorded(charged[0].clone()));
    assert!(recorded.is_duplicate());

    assert_eq!(charges_of(&provider, "order-2"), charged);
    assert_eq!(recorded_charges(&pool, "order-2").await, charged);
    let state: String = sqlx::query_scalar("select state from jobguard_steps")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, "done");
    provider.stop().await;
}
