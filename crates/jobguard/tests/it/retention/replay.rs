//! Replays against the retention: a dead letter replayed within it is a duplicate, one
//! replayed after it applies again, and a replay after the provider forgot its idempotency key
//! charges twice, which the retention check refuses to configure.

use std::time::Duration;

use jobguard::queue::{JobState, Replay};
use jobguard::retention::{Pruner, RetentionConfig};
use jobguard::{Error, JobError, JobKey, KeyError, Queue, Worker, WorkerConfig};

use super::prune::{drain, retention};
use super::{Aging, DAY};
use crate::common::{Credit, draining, guard_rows, ledger_rows, setup};

/// Applies a credit through the worker, ages its guard row by `age`, then enqueues the same
/// credit again and dead-letters it by hand: a dead letter whose key the guard applied `age`
/// ago. Returns the dead job's id.
async fn applied_then_dead_lettered<DB: Aging>(
    pool: &sqlx::Pool<DB>,
    queue: &Queue<DB>,
    age: Duration,
) -> i64 {
    let credit = Credit {
        order: 5,
        amount: 500,
    };
    queue.enqueue_job(&credit).await.unwrap();
    assert_eq!(drain::<DB>(queue).await.applied, 1);
    DB::age_guard(pool, age).await;

    let second = queue.enqueue_job(&credit).await.unwrap();
    assert!(
        second.inserted,
        "the first job is completed, so this is a new job"
    );
    let leased = queue
        .fetch("default", 1, Duration::from_secs(30))
        .await
        .unwrap();
    queue
        .dead_letter(leased[0].lease, "dead-lettered by hand")
        .await
        .unwrap();
    assert_eq!(
        queue
            .list(Some(JobState::Dead), None, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    second.id
}

backends!(fn a_dead_letter_replayed_within_the_retention_is_a_duplicate);
async fn a_dead_letter_replayed_within_the_retention_is_a_duplicate<DB: Aging>() {
    let Some((pool, queue)) = setup::<DB>("retention_replay_within").await else {
        return;
    };
    let dead = applied_then_dead_lettered::<DB>(&pool, &queue, 3 * DAY).await;

    // Two weeks cover the default 7-day replay window; a prune now keeps the 3-day-old key.
    let guard = queue.guard(Default::default()).unwrap();
    let pruner = Pruner::new(&guard, retention(RetentionConfig::default()));
    assert_eq!(pruner.run().await.unwrap().unwrap().guard_rows, 0);

    assert_eq!(queue.replay(&Replay::Job(dead)).await.unwrap(), vec![dead]);
    let stats = drain::<DB>(&queue).await;
    assert_eq!((stats.applied, stats.duplicates), (0, 1), "{stats:?}");
    assert_eq!(ledger_rows(&pool).await, 1, "the replay changed nothing");
}

backends!(fn a_replay_older_than_the_retention_applies_again);
/// The seed's pitfall, "pruning too early", on purpose. The operator declared a 12-hour replay
/// window, so a one-day retention covers the horizon (about 12 h 10 m) and passes the check.
/// Then they replay a dead letter three days later, outside the window they declared: the
/// guard no longer holds the key, because the prune deleted it as the retention said it could,
/// and the job applies a second time. The horizon is only as good as what is declared; a replay
/// after the declared window is exactly the duplicate no retention shorter than it can stop.
async fn a_replay_older_than_the_retention_applies_again<DB: Aging>() {
    let Some((pool, queue)) = setup::<DB>("retention_replay_after").await else {
        return;
    };
    let dead = applied_then_dead_lettered::<DB>(&pool, &queue, 3 * DAY).await;

    let config = RetentionConfig {
        keep: DAY,
        replay_window: Duration::from_secs(12 * 3600),
        ..RetentionConfig::default()
    };
    let retention = retention(config);
    assert!(
        !retention.is_overridden(),
        "one day covers a 12-hour replay window"
    );
    let guard = queue.guard(Default::default()).unwrap();
    let report = Pruner::new(&guard, retention).run().await.unwrap().unwrap();
    assert_eq!(
        report.guard_rows, 1,
        "the 3-day-old key is past the 1-day retention"
    );
    assert_eq!(guard_rows(&pool).await, 0);

    queue.replay(&Replay::Job(dead)).await.unwrap();
    let stats = drain::<DB>(&queue).await;
    assert_eq!((stats.applied, stats.duplicates), (1, 0), "{stats:?}");
    assert_eq!(ledger_rows(&pool).await, 2, "the credit was applied twice");
}

/// A charge at a provider with idempotency keys, whose record fails (fatally) while `broken`
/// is set: the provider charged, the database recorded nothing, and the job is dead.
#[derive(serde::Serialize, serde::Deserialize)]
struct RecordedCharge {
    order: String,
    amount: i64,
}

struct ChargeContext {
    client: jobguard_provider::ProviderClient,
    broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<DB: Aging> jobguard::external::ExternalJob<DB> for RecordedCharge {
    const KIND: &'static str = "charge";
    const STEP: &'static str = "create-charge";
    type Context = ChargeContext;
    type Output = jobguard_provider::Charge;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("charge", [&self.order])
    }

    async fn call(
        &self,
        context: &ChargeContext,
        api_key: &jobguard::external::ApiKey,
    ) -> Result<Self::Output, JobError> {
        context
            .client
            .create_charge(&self.order, self.amount, Some(api_key.as_str()))
            .await
            .map_err(JobError::from)
    }

    async fn record(
        &self,
        context: &ChargeContext,
        conn: &mut DB::Connection,
        charge: &Self::Output,
    ) -> Result<(), JobError> {
        if context.broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(JobError::fatal("the charge could not be recorded"));
        }
        DB::insert_ledger(conn, 7, charge.amount).await?;
        Ok(())
    }
}

backends!(fn a_replay_after_the_provider_forgot_the_key_charges_twice_and_is_refused);
/// The double charge, end to end: a provider that forgets idempotency keys after a
/// few seconds (Stripe: 24 hours), a worker whose charge was made but not recorded, the dead
/// job replayed. Replayed while the provider still remembers the key, the charge comes back
/// and is recorded: one charge. Replayed after the provider forgot it, the same key charges
/// again: two charges for one order. The retention check refuses the configuration that
/// allows that (a replay window past the provider key lifetime), and the worker does not
/// start with it.
async fn a_replay_after_the_provider_forgot_the_key_charges_twice_and_is_refused<DB: Aging>() {
    use jobguard_provider::{Provider, ProviderClient, ProviderConfig};
    let Some((pool, queue)) = setup::<DB>("retention_provider_ttl").await else {
        return;
    };
    let key_ttl = Duration::from_secs(3);
    let provider = Provider::start(ProviderConfig {
        key_ttl: Some(key_ttl),
        ..ProviderConfig::default()
    })
    .await
    .unwrap();
    let broken = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let context = || ChargeContext {
        client: ProviderClient::new(provider.url()),
        broken: broken.clone(),
    };
    let charges_of = |order: &str| {
        provider
            .provider()
            .charges()
            .into_iter()
            .filter(|charge| charge.order == order)
            .count()
    };

    // The operator's declaration: a provider keeping keys `key_ttl`, an hour of replay.
    let declared = RetentionConfig {
        replay_window: Duration::from_secs(3600),
        provider_key_lifetime: key_ttl,
        ..RetentionConfig::default()
    };
    let refused = WorkerConfig {
        retention: declared.clone(),
        ..draining()
    };
    let worker = Worker::with_config(queue.clone(), refused)
        .unwrap()
        .register_external::<RecordedCharge>(context());
    let error = worker.run(std::future::pending()).await.unwrap_err();
    let Error::ProviderKeyLifetimeTooShort {
        provider_key_lifetime,
        ..
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(*provider_key_lifetime, key_ttl);
    let message = error.to_string();
    for needle in ["provider key lifetime 3s", "replay window 1h"] {
        assert!(
            message.contains(needle),
            "{needle:?} missing from: {message}"
        );
    }

    // What happens without the check (no provider declared): two charges die unrecorded.
    let worker = || {
        Worker::with_config(queue.clone(), draining())
            .unwrap()
            .register_external::<RecordedCharge>(context())
    };
    for order in ["order-early", "order-late"] {
        queue
            .enqueue_external(&RecordedCharge {
                order: order.into(),
                amount: 500,
            })
            .await
            .unwrap();
    }
    let stats = worker().run(std::future::pending()).await.unwrap();
    assert_eq!((stats.applied, stats.dead), (0, 2), "{stats:?}");
    assert_eq!(
        (charges_of("order-early"), charges_of("order-late")),
        (1, 1)
    );
    let dead = queue.list(Some(JobState::Dead), None, 10).await.unwrap();
    let id_of = |order: &str| {
        dead.iter()
            .find(|job| job.payload["order"] == order)
            .map(|job| job.id)
            .unwrap()
    };
    broken.store(false, std::sync::atomic::Ordering::SeqCst);

    // Replayed at once, within the key's lifetime: the provider answers with the first charge.
    assert_eq!(
        queue
            .replay(&Replay::Job(id_of("order-early")))
            .await
            .unwrap()
            .len(),
        1
    );
    let stats = worker().run(std::future::pending()).await.unwrap();
    assert_eq!(stats.applied, 1, "{stats:?}");
    assert_eq!(
        charges_of("order-early"),
        1,
        "the key was remembered: one charge"
    );

    // Replayed after the provider forgot the key: the same key charges a second time.
    tokio::time::sleep(key_ttl + Duration::from_millis(500)).await;
    assert_eq!(
        queue
            .replay(&Replay::Job(id_of("order-late")))
            .await
            .unwrap()
            .len(),
        1
    );
    let stats = worker().run(std::future::pending()).await.unwrap();
    assert_eq!(stats.applied, 1, "{stats:?}");
    assert_eq!(charges_of("order-late"), 2, "the customer paid twice");
    assert_eq!(
        ledger_rows(&pool).await,
        2,
        "each order recorded once, one of them charged twice"
    );

    // A replay window that keeps every repeat inside the key's lifetime passes the check.
    let fits = RetentionConfig {
        replay_window: Duration::from_secs(1),
        ..declared
    };
    let mut tight = draining();
    tight.lease = Duration::from_millis(100);
    tight.retry.max_attempts = 1;
    assert!(fits.validate(&tight.retry, tight.lease).is_ok());
    provider.stop().await;
}
