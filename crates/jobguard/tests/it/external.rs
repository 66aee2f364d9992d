//! Effects outside the database, on every backend (`backends!`): keyed calls recorded with the
//! guard, and the started/done step ledger with reconciliation. Every charge goes to a real
//! HTTP payment provider on loopback, which keeps its own record: the tests count charges where
//! they happen.
//!
//! A worker "dies" by having its delivery future dropped at the chosen point: its transaction
//! is rolled back and nothing after that point runs, as when the process is killed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use jobguard::external::{ApiKey, ApiKeyFormat};
use jobguard::steps::{Reconciled, Resolution, StepConfig, StepOutcome, Steps};
use jobguard::{Error, Guard, JobError, JobKey, Outcome};
use jobguard_provider::{Charge, Provider, ProviderClient, ProviderConfig, ProviderError};
use serde_json::json;
use tokio::sync::oneshot;

use crate::common::{TestDb, ledger_rows};

fn job_error(error: ProviderError) -> JobError {
    if error.is_retryable() {
        error.into()
    } else {
        JobError::from(error).into_fatal()
    }
}

fn charge_key(order: &str) -> JobKey {
    JobKey::new("charge", [order]).unwrap()
}

/// Drives `delivery` until `died` fires, then drops it: the worker died at that point.
async fn die_when<F: Future>(delivery: F, died: oneshot::Receiver<()>) {
    tokio::select! {
        _ = delivery => panic!("the delivery finished before the point it should die at"),
        _ = died => {}
    }
}

/// One delivery of the seed's `charge_order`: the API call with the derived key, then the
/// order's ledger row and the guard row in one transaction.
async fn charge_order<DB: TestDb>(
    guard: &Guard<DB>,
    client: &ProviderClient,
    order: &str,
    amount: i64,
) -> jobguard::Result<Outcome<Charge>> {
    let key = charge_key(order);
    let api_key = ApiKey::derive(&key, "create-charge", ApiKeyFormat::STRIPE)?;
    // `move`: a closure borrowing from an async fn's arguments makes its future !Send to
    // rustc (rust-lang/rust#110338), and the concurrent test spawns it.
    let (client, order) = (client.clone(), order.to_owned());
    guard
        .run_keyed(
            &key,
            &api_key,
            async move |idempotency_key| {
                client
                    .create_charge(&order, amount, Some(idempotency_key))
                    .await
                    .map_err(job_error)
            },
            async move |conn, charge: &Charge| {
                DB::insert_ledger(conn, 7, charge.amount).await?;
                Ok(())
            },
        )
        .await
}

backends!(fn keyed_crash_before_commit_records_the_original);
async fn keyed_crash_before_commit_records_the_original<DB: TestDb>() {
    let Some(pool) = DB::open("keyed_crash_before_commit_records_the_original", 4).await else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let provider = Provider::start(ProviderConfig::default()).await.unwrap();
    let client = ProviderClient::new(provider.url());
    let key = charge_key("order-8812");
    let api_key = ApiKey::derive(&key, "create-charge", ApiKeyFormat::STRIPE).unwrap();

    // The first delivery charges, then dies inside its transaction, before the commit.
    let (died, dead) = oneshot::channel();
    let mut died = Some(died);
    let first = guard.run_keyed(
        &key,
        &api_key,
        async |idempotency_key| {
            client
                .create_charge("order-8812", 4200, Some(idempotency_key))
                .await
                .map_err(job_error)
        },
        async |conn, charge: &Charge| {
            DB::insert_ledger(conn, 7, charge.amount).await?;
            died.take().unwrap().send(()).unwrap();
            std::future::pending::<()>().await;
            Ok(())
        },
    );
    die_when(first, dead).await;
    let charged = provider.provider().charges();
    assert_eq!(charged.len(), 1, "the first delivery's charge happened");
    assert_eq!(ledger_rows(&pool).await, 0, "its transaction rolled back");
    assert!(guard.lookup(&key).await.unwrap().is_none());

    // The redelivery calls with the same key: the provider answers with the original charge.
    let outcome = charge_order::<DB>(&guard, &client, "order-8812", 4200)
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Applied(charged[0].clone()));
    assert_eq!(provider.provider().charges().len(), 1, "no second charge");
    assert_eq!(ledger_rows(&pool).await, 1);
    let recorded = guard.lookup(&key).await.unwrap().unwrap();
    assert_eq!(recorded.result, Some(json!(charged[0])));

    // Later deliveries return the recorded charge without calling.
    let again = charge_order::<DB>(&guard, &client, "order-8812", 4200)
        .await
        .unwrap();
    assert!(again.is_duplicate());
    assert_eq!(again.into_value(), Some(charged[0].clone()));
    assert_eq!(provider.provider().charges().len(), 1);
    assert_eq!(ledger_rows(&pool).await, 1);
    provider.stop().await;
}

backends!(fn naive_crash_before_commit_charges_twice);
/// The control: without a key, the same crash makes a second charge.
async fn naive_crash_before_commit_charges_twice<DB: TestDb>() {
    let Some(pool) = DB::open("naive_crash_before_commit_charges_twice", 4).await else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let provider = Provider::start(ProviderConfig::default()).await.unwrap();
    let client = ProviderClient::new(provider.url());
    let key = charge_key("order-1");

    let (died, dead) = oneshot::channel();
    let mut died = Some(died);
    let first = guard.run(&key, async |conn| {
        let charge = client
            .create_charge("order-1", 900, None)
            .await
            .map_err(job_error)?;
        DB::insert_ledger(conn, 7, charge.amount).await?;
        died.take().unwrap().send(()).unwrap();
        std::future::pending::<()>().await;
        Ok(charge)
    });
    die_when(first, dead).await;
    let outcome = guard
        .run(&key, async |conn| {
            let charge = client
                .create_charge("order-1", 900, None)
                .await
                .map_err(job_error)?;
            DB::insert_ledger(conn, 7, charge.amount).await?;
            Ok(charge)
        })
        .await
        .unwrap();
    assert!(outcome.is_applied());
    assert_eq!(ledger_rows(&pool).await, 1, "the database saw one charge");
    assert_eq!(
        provider.provider().charges().len(),
        2,
        "the customer paid twice"
    );
    provider.stop().await;
}

backends!(fn concurrent_keyed_deliveries_charge_once);
async fn concurrent_keyed_deliveries_charge_once<DB: TestDb>() {
    let Some(pool) = DB::open("concurrent_keyed_deliveries_charge_once", 8).await else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    // Slow enough that the deliveries overlap at the provider.
    let config = ProviderConfig {
        latency: Duration::from_millis(300),
        ..ProviderConfig::default()
    };
    let provider = Provider::start(config).await.unwrap();
    let client = ProviderClient::new(provider.url());
    let in_flight = Arc::new(AtomicUsize::new(0));

    let deliveries = (0..5).map(|_| {
        let (guard, client, in_flight) = (guard.clone(), client.clone(), in_flight.clone());
        tokio::spawn(async move {
            loop {
                match charge_order::<DB>(&guard, &client, "order-77", 1500).await {
                    Ok(outcome) => return outcome,
                    Err(error) if error.is_retryable() => {
                        in_flight.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(error) => panic!("{error}"),
                }
            }
        })
    });
    let outcomes: Vec<Outcome<Charge>> = futures::future::try_join_all(deliveries).await.unwrap();

    let applied = outcomes.iter().filter(|o| o.is_applied()).count();
    assert_eq!(applied, 1, "{outcomes:?}");
    assert!(
        in_flight.load(Ordering::Relaxed) >= 1,
        "the provider saw overlapping requests"
    );
    let charges = provider.provider().charges();
    assert_eq!(charges.len(), 1, "one charge: {charges:?}");
    for outcome in outcomes {
        assert_eq!(outcome.into_value(), Some(charges[0].clone()));
    }
    assert_eq!(ledger_rows(&pool).await, 1);
    provider.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The keyless API: started/done with reconciliation
// ---------------------------------------------------------------------------------------------

const LEASE: Duration = Duration::from_millis(300);

struct Keyless<DB: TestDb> {
    steps: Steps<DB>,
    client: ProviderClient,
    calls: AtomicUsize,
}

impl<DB: TestDb> Keyless<DB> {
    async fn new(pool: sqlx::Pool<DB>, url: String) -> Self {
        let steps = Steps::with_config(pool, StepConfig::default().lease(LEASE));
        steps.migrate().await.unwrap();
        Keyless {
            steps,
            client: ProviderClient::new(url),
            calls: AtomicUsize::new(0),
        }
    }

    async fn call(&self, order: &str) -> Result<Charge, JobError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.client
            .create_charge_keyless(order, 2500)
            .await
            .map_err(job_error)
    }

    /// Asks the provider's lookup. An unavailable lookup cannot tell: `Unknown`.
    async fn reconcile(&self, order: &str) -> Result<Reconciled<Charge>, JobError> {
        match self.client.find_charges(order).await {
            Ok(charges) => Ok(match charges.into_iter().next() {
                Some(charge) => Reconciled::Done(charge),
                None => Reconciled::NotDone,
            }),
            Err(ProviderError::Unavailable { status }) => Ok(Reconciled::Unknown(format!(
                "the provider's lookup answered {status}"
            ))),
            Err(error) => Err(job_error(error)),
        }
    }

    async fn deliver(&self, order: &str) -> jobguard::Result<StepOutcome<Charge>> {
        self.steps
            .run(
                &charge_key(order),
                "charge",
                async || self.call(order).await,
                async || self.reconcile(order).await,
            )
            .await
    }

    /// A delivery that dies after the provider charged, before `done` is recorded.
    async fn die_after_call(&self, order: &str) {
        let (died, dead) = oneshot::channel();
        let key = charge_key(order);
        let delivery = self.steps.run(
            &key,
            "charge",
            async || {
                let charge = self.call(order).await;
                died.send(()).unwrap();
                std::future::pending::<()>().await;
                charge
            },
            async || -> Result<Reconciled<Charge>, JobError> { unreachable!() },
        );
        die_when(delivery, dead).await;
    }

    /// A delivery that dies after `started` is committed, before the call.
    async fn die_before_call(&self, order: &str) {
        let (died, dead) = oneshot::channel();
        let key = charge_key(order);
        let delivery = self.steps.run(
            &key,
            "charge",
            async || -> Result<Charge, JobError> {
                died.send(()).unwrap();
                std::future::pending().await
            },
            async || -> Result<Reconciled<Charge>, JobError> { unreachable!() },
        );
        die_when(delivery, dead).await;
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

backends!(fn keyless_crash_after_call_reconciles_as_done);
async fn keyless_crash_after_call_reconciles_as_done<DB: TestDb>() {
    let Some(pool) = DB::open("keyless_crash_after_call_reconciles_as_done", 4).await else {
        return;
    };
    let provider = Provider::start(ProviderConfig::default()).await.unwrap();
    let keyless = Keyless::new(pool, provider.url()).await;

    keyless.die_after_call("order-5").await;
    let charged = provider.provider().charges();
    assert_eq!(charged.len(), 1);

    // While the dead caller's lease runs, nobody calls.
    let early = keyless.deliver("order-5").await;
    assert!(
        matches!(early, Err(Error::StepInFlight { .. })),
        "{early:?}"
    );
    assert!(early.unwrap_err().is_retryable());
    assert_eq!(keyless.calls(), 1);

    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let outcome = keyless.deliver("order-5").await.unwrap();
    assert_eq!(outcome, StepOutcome::Reconciled(charged[0].clone()));
    assert_eq!(keyless.calls(), 1, "reconciled, not called again");

    let again = keyless.deliver("order-5").await.unwrap();
    assert_eq!(again, StepOutcome::Recorded(charged[0].clone()));
    assert_eq!(
        provider.provider().charges().len(),
        1,
        "one charge for the order"
    );
    provider.stop().await;
}

backends!(fn keyless_crash_before_call_reconciles_and_calls);
async fn keyless_crash_before_call_reconciles_and_calls<DB: TestDb>() {
    let Some(pool) = DB::open("keyless_crash_before_call_reconciles_and_calls", 4).await else {
        return;
    };
    let provider = Provider::start(ProviderConfig::default()).await.unwrap();
    let keyless = Keyless::new(pool, provider.url()).await;

    keyless.die_before_call("order-6").await;
    assert!(provider.provider().charges().is_empty());
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;

    let outcome = keyless.deliver("order-6").await.unwrap();
    assert!(outcome.called(), "{outcome:?}");
    let charges = provider.provider().charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(outcome.into_value(), charges[0]);
    provider.stop().await;
}

backends!(fn keyless_unknown_marks_attention_and_never_calls);
async fn keyless_unknown_marks_attention_and_never_calls<DB: TestDb>() {
    let Some(pool) = DB::open("keyless_unknown_marks_attention_and_never_calls", 4).await else {
        return;
    };
    let provider = Provider::start(ProviderConfig::default()).await.unwrap();
    let keyless = Keyless::new(pool, provider.url()).await;
    let key = charge_key("order-9");

    keyless.die_after_call("order-9").await;
    provider.provider().set_lookup_available(false);
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;

    for _ in 0..3 {
        let outcome = keyless.deliver("order-9").await;
        let Err(error) = outcome else {
            panic!("{outcome:?}")
        };
        assert!(
            matches!(error, Error::StepNeedsAttention { .. }),
            "{error:?}"
        );
        assert!(!error.is_retryable());
    }
    assert_eq!(keyless.calls(), 1, "no call after the unknown answer");
    assert_eq!(provider.provider().charges().len(), 1);
    let marked = keyless.steps.attention(10).await.unwrap();
    assert_eq!(marked.len(), 1);
    assert_eq!(
        (marked[0].key.as_str(), marked[0].step.as_str()),
        (key.as_str(), "charge")
    );
    assert!(marked[0].reason.contains("503"), "{}", marked[0].reason);

    // The operator looks the charge up and settles the step; deliveries then return it.
    let charge = provider.provider().charges()[0].clone();
    let resolved = keyless
        .steps
        .resolve(&key, "charge", Resolution::Done(json!(charge)))
        .await
        .unwrap();
    assert!(resolved);
    assert_eq!(
        keyless.deliver("order-9").await.unwrap(),
        StepOutcome::Recorded(charge)
    );
    assert!(keyless.steps.attention(10).await.unwrap().is_empty());
    assert_eq!(keyless.calls(), 1);
    provider.stop().await;
}

backends!(fn keyless_failed_call_is_reconciled_not_repeated);
async fn keyless_failed_call_is_reconciled_not_repeated<DB: TestDb>() {
    let Some(pool) = DB::open("keyless_failed_call_is_reconciled_not_repeated", 4).await else {
        return;
    };
    let provider = Provider::start(ProviderConfig::default()).await.unwrap();
    let keyless = Keyless::new(pool, provider.url()).await;

    // The provider charges, but the caller sees a timeout.
    let failed = keyless
        .steps
        .run(
            &charge_key("order-3"),
            "charge",
            async || -> Result<Charge, JobError> {
                keyless.call("order-3").await?;
                Err(JobError::msg("timed out waiting for the provider"))
            },
            async || -> Result<Reconciled<Charge>, JobError> { unreachable!() },
        )
        .await;
    assert!(
        matches!(failed, Err(Error::Effect { fatal: false, .. })),
        "{failed:?}"
    );

    // The retry does not wait out the lease, and asks before calling.
    let outcome = keyless.deliver("order-3").await.unwrap();
    assert!(matches!(outcome, StepOutcome::Reconciled(_)), "{outcome:?}");
    assert_eq!(keyless.calls(), 1);
    assert_eq!(provider.provider().charges().len(), 1);
    provider.stop().await;
}

backends!(fn concurrent_keyless_deliveries_call_once);
async fn concurrent_keyless_deliveries_call_once<DB: TestDb>() {
    let Some(pool) = DB::open("concurrent_keyless_deliveries_call_once", 8).await else {
        return;
    };
    let config = ProviderConfig {
        latency: Duration::from_millis(200),
        ..ProviderConfig::default()
    };
    let provider = Provider::start(config).await.unwrap();
    let keyless = Arc::new(Keyless::new(pool, provider.url()).await);

    let deliveries = (0..5).map(|_| {
        let keyless = keyless.clone();
        tokio::spawn(async move {
            let mut in_flight = 0;
            loop {
                match keyless.deliver("order-42").await {
                    Ok(outcome) => return (outcome, in_flight),
                    Err(Error::StepInFlight { .. }) => {
                        in_flight += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(error) => panic!("{error}"),
                }
            }
        })
    });
    let results = futures::future::try_join_all(deliveries).await.unwrap();

    assert_eq!(keyless.calls(), 1, "one delivery called, the others waited");
    let charges = provider.provider().charges();
    assert_eq!(charges.len(), 1);
    let called = results
        .iter()
        .filter(|(outcome, _)| outcome.called())
        .count();
    assert_eq!(called, 1);
    assert!(results.iter().map(|(_, n)| n).sum::<u32>() >= 1);
    for (outcome, _) in results {
        assert_eq!(outcome.into_value(), charges[0]);
    }
    provider.stop().await;
}

backends!(fn sweep_reconciles_stale_steps);
async fn sweep_reconciles_stale_steps<DB: TestDb>() {
    let Some(pool) = DB::open("sweep_reconciles_stale_steps", 4).await else {
        return;
    };
    let provider = Provider::start(ProviderConfig::default()).await.unwrap();
    let keyless = Keyless::new(pool, provider.url()).await;
    for order in ["order-a", "order-b", "order-c"] {
        keyless.die_after_call(order).await;
    }
    for order in ["order-d", "order-e"] {
        keyless.die_before_call(order).await;
    }
    // A sweep before the leases expire touches nothing.
    let early = keyless
        .steps
        .sweep(100, |_| async { unreachable!() })
        .await
        .unwrap();
    assert_eq!(early, Default::default());
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;

    let client = keyless.client.clone();
    let report = keyless
        .steps
        .sweep(100, |stale| {
            let client = client.clone();
            async move {
                let order = JobKey::parse(&stale.key).unwrap().parts()[0].clone();
                let found = client.find_charges(&order).await.map_err(job_error)?;
                Ok(match found.into_iter().next() {
                    Some(charge) => Reconciled::Done(json!(charge)),
                    None => Reconciled::NotDone,
                })
            }
        })
        .await
        .unwrap();
    assert_eq!(
        (
            report.done,
            report.not_done,
            report.attention,
            report.failed
        ),
        (3, 2, 0, 0)
    );

    // Swept-done steps return the charge; swept-not-done steps call once, now.
    for order in ["order-a", "order-b", "order-c"] {
        let outcome = keyless.deliver(order).await.unwrap();
        assert!(matches!(outcome, StepOutcome::Recorded(_)), "{outcome:?}");
    }
    for order in ["order-d", "order-e"] {
        assert!(keyless.deliver(order).await.unwrap().called());
    }
    assert_eq!(keyless.calls(), 5);
    assert_eq!(provider.provider().charges().len(), 5);
    provider.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The worker's external jobs
// ---------------------------------------------------------------------------------------------

#[derive(serde::Serialize, serde::Deserialize)]
struct ChargeJob {
    order: String,
    amount: i64,
}

impl<DB: TestDb> jobguard::external::ExternalJob<DB> for ChargeJob {
    const KIND: &'static str = "charge";
    const STEP: &'static str = "create-charge";
    type Context = ProviderClient;
    type Output = Charge;

    fn key(&self) -> Result<JobKey, jobguard::KeyError> {
        JobKey::new("charge", [&self.order])
    }

    async fn call(&self, client: &ProviderClient, api_key: &ApiKey) -> Result<Charge, JobError> {
        client
            .create_charge(&self.order, self.amount, Some(api_key.as_str()))
            .await
            .map_err(job_error)
    }

    async fn record(
        &self,
        _client: &ProviderClient,
        conn: &mut <DB as sqlx::Database>::Connection,
        charge: &Charge,
    ) -> Result<(), JobError> {
        DB::insert_ledger(conn, 7, charge.amount).await?;
        Ok(())
    }
}

backends!(fn worker_runs_external_jobs_once);
/// Five orders were charged by a worker that died before recording; the worker charges the
/// other fifteen and records all twenty, with twenty charges at the provider.
async fn worker_runs_external_jobs_once<DB: TestDb>() {
    let Some(pool) = DB::open("worker_runs_external_jobs_once", 8).await else {
        return;
    };
    let provider = Provider::start(ProviderConfig::default()).await.unwrap();
    let client = ProviderClient::new(provider.url());
    let queue = jobguard::Queue::new(pool.clone());
    let config = jobguard::WorkerConfig {
        concurrency: 4,
        stop_when_idle: true,
        poll_interval: Duration::from_millis(50),
        ..Default::default()
    };
    let worker = jobguard::Worker::with_config(queue.clone(), config)
        .unwrap()
        .register_external::<ChargeJob>(client.clone());
    worker.migrate().await.unwrap();
    for n in 0..20 {
        let order = format!("order-{n}");
        queue
            .enqueue_external(&ChargeJob {
                order: order.clone(),
                amount: 100 + n,
            })
            .await
            .unwrap();
        if n < 5 {
            let api_key =
                ApiKey::derive(&charge_key(&order), "create-charge", ApiKeyFormat::STRIPE).unwrap();
            client
                .create_charge(&order, 100 + n, Some(api_key.as_str()))
                .await
                .unwrap();
        }
    }

    let stats = worker.run(std::future::pending()).await.unwrap();
    assert_eq!(
        (stats.applied, stats.duplicates, stats.dead),
        (20, 0, 0),
        "{stats:?}"
    );
    let charges = provider.provider().charges();
    assert_eq!(
        charges.len(),
        20,
        "the five earlier charges were answered, not repeated"
    );
    assert_eq!(ledger_rows(&pool).await, 20);
    assert_eq!(
        crate::common::ledger_total(&pool).await,
        (100..120).sum::<i64>()
    );
    provider.stop().await;
}
