//! The broker consumer suite, run once per database backend and broker (`brokers!`): every
//! test runs against the real broker and the real database, on a queue or stream and a schema
//! or file of its own.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use jobguard::broker::{Consumer, ConsumerConfig, ConsumerStats, Envelope};
use jobguard::{Guard, Job, JobError, JobKey, KeyError, Outcome};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::Pool;

use super::{Settings, TestBroker};
use crate::common::{TestDb, ledger_rows, ledger_total};

/// The longest a consumer runs in a test before the test fails: a guard against hangs only.
pub(super) const DEADLINE: Duration = Duration::from_secs(90);

/// Credits `amount` for `order`: one ledger row per applied job.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Credit {
    pub(super) order: String,
    pub(super) amount: i64,
    /// Fails every delivery: retryably, or fatally.
    #[serde(default)]
    pub(super) fail: Option<Failure>,
    /// Holds the transaction this long after the effect: a long job.
    #[serde(default)]
    pub(super) hold_ms: u64,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Failure {
    Retryable,
    Fatal,
}

impl Credit {
    pub(super) fn new(order: usize, amount: i64) -> Self {
        Credit {
            order: format!("order-{order}"),
            amount,
            fail: None,
            hold_ms: 0,
        }
    }

    /// The job's envelope, the same on every backend.
    pub(super) fn body(&self) -> Vec<u8> {
        Envelope::for_job::<sqlx::Sqlite, _>(self)
            .unwrap()
            .to_bytes()
    }
}

impl<DB: TestDb> Job<DB> for Credit {
    const KIND: &'static str = "credit";
    // Runs alone unless a test's consumer sets a batch size.
    const BATCH: bool = true;

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("credit", [&self.order])
    }

    async fn run(&self, conn: &mut <DB as sqlx::Database>::Connection) -> Result<(), JobError> {
        *lock_effect_runs()
            .entry((DB::BACKEND, self.order.clone()))
            .or_default() += 1;
        match self.fail {
            Some(Failure::Retryable) => return Err(JobError::msg("the ledger is busy")),
            Some(Failure::Fatal) => return Err(JobError::fatal("the account is closed")),
            None => {}
        }
        DB::insert_ledger(conn, 1, self.amount).await?;
        tokio::time::sleep(Duration::from_millis(self.hold_ms)).await;
        Ok(())
    }
}

/// How many times each credit's effect started running, by backend and order, committed or
/// not: the tests of every backend and broker run at once in this process, so a test that
/// reads it gives its credits orders of its own.
static EFFECT_RUNS: Mutex<BTreeMap<(&'static str, String), usize>> = Mutex::new(BTreeMap::new());

fn lock_effect_runs() -> std::sync::MutexGuard<'static, BTreeMap<(&'static str, String), usize>> {
    EFFECT_RUNS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(super) fn effect_runs<DB: TestDb>(order: &str) -> usize {
    lock_effect_runs()
        .get(&(DB::BACKEND, order.to_owned()))
        .copied()
        .unwrap_or(0)
}

/// The test's broker URL, queue or stream name, and database.
pub(super) struct Fixture<DB: TestDb, Broker: TestBroker> {
    pub(super) url: String,
    pub(super) name: String,
    pub(super) pool: Pool<DB>,
    broker: PhantomData<Broker>,
}

impl<DB: TestDb, Broker: TestBroker> Fixture<DB, Broker> {
    pub(super) async fn new(test: &str) -> Option<Self> {
        let url = Broker::url()?;
        let pool = DB::open(&format!("b_{}_{test}", Broker::NAME), 16).await?;
        // The process id keeps two test runs on one broker (two checkouts, two CI jobs) off
        // each other's queues and streams.
        let name = format!("{}-{test}-{}", DB::BACKEND, std::process::id());
        Broker::reset(&url, &name).await;
        Some(Fixture {
            url,
            name,
            pool,
            broker: PhantomData,
        })
    }

    /// Runs `consumer` on the test's queue or stream until `stop` resolves or it is idle.
    pub(super) async fn run(
        &self,
        consumer: Consumer<DB>,
        settings: Settings,
        stop: impl std::future::Future<Output = ()> + Send,
    ) -> ConsumerStats {
        let ran = Broker::run(consumer, &self.url, &self.name, settings, stop);
        tokio::time::timeout(DEADLINE, ran)
            .await
            .expect("the consumer stopped before the deadline")
            .expect("the consumer ran")
    }

    /// Makes the test's queue or stream as `settings` say, before anything is published.
    pub(super) async fn prepare(&self, settings: Settings) {
        Broker::prepare(&self.url, &self.name, settings).await;
    }

    pub(super) async fn publish(&self, bodies: Vec<Vec<u8>>) {
        Broker::publish(&self.url, &self.name, bodies).await;
    }

    /// A migrated consumer of `Credit` jobs that stops once nothing arrived for `idle`, running
    /// them in batches of up to `batch_size` (1: one per transaction).
    pub(super) async fn batch_consumer(&self, idle: Duration, batch_size: usize) -> Consumer<DB> {
        let config = ConsumerConfig {
            retry_delay: Duration::from_millis(100),
            shutdown_timeout: Duration::from_secs(10),
            stop_when_idle_for: Some(idle),
            batch_size,
            // Long enough that messages published before the consumer started fill a batch.
            batch_linger: Duration::from_millis(50),
        };
        let consumer =
            Consumer::with_config(Guard::new(self.pool.clone()), config).register::<Credit>();
        consumer.migrate().await.expect("migrate the guard");
        consumer
    }

    /// Runs a consumer until it has been idle for `idle`.
    pub(super) async fn drain(&self, settings: Settings, idle: Duration) -> ConsumerStats {
        self.drain_in_batches(settings, idle, 1).await
    }

    /// Runs a consumer with batches of up to `batch_size` until it has been idle for `idle`.
    pub(super) async fn drain_in_batches(
        &self,
        settings: Settings,
        idle: Duration,
        batch_size: usize,
    ) -> ConsumerStats {
        let consumer = self.batch_consumer(idle, batch_size).await;
        self.run(consumer, settings, std::future::pending()).await
    }

    pub(super) async fn cleanup(self) {
        Broker::reset(&self.url, &self.name).await;
        self.pool.close().await;
    }
}

/// Long enough without a message that anything the broker still had to deliver again (after
/// AckWait or the claim threshold) has come.
pub(super) fn settled(settings: Settings) -> Duration {
    settings.redelivery * 2 + Duration::from_secs(1)
}

brokers!(fn applies_each_key_once_and_acknowledges_the_duplicates);
/// Every message published three times, copies next to each other: each key is applied once,
/// the other deliveries are duplicates, and everything is acknowledged.
async fn applies_each_key_once_and_acknowledges_the_duplicates<DB: TestDb, Broker: TestBroker>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("once").await else {
        return;
    };
    let credits: Vec<Credit> = (0..20).map(|n| Credit::new(n, 100 + n as i64)).collect();
    let bodies = credits
        .iter()
        .flat_map(|credit| std::iter::repeat_n(credit.body(), 3))
        .collect();
    fixture.publish(bodies).await;

    let settings = Settings::default();
    let stats = fixture.drain(settings, Duration::from_secs(1)).await;
    assert_eq!((stats.applied, stats.duplicates), (20, 40), "{stats:?}");
    assert_eq!(
        (stats.failed, stats.dead, stats.unacked),
        (0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(ledger_rows(&fixture.pool).await, 20);
    let expected: i64 = credits.iter().map(|credit| credit.amount).sum();
    assert_eq!(ledger_total(&fixture.pool).await, expected);

    // Every delivery was acknowledged: nothing comes back.
    let again = fixture.drain(settings, settled(settings)).await;
    assert_eq!(again, ConsumerStats::default());
    assert_eq!(Broker::left_behind(&fixture.url, &fixture.name).await, 0);
    assert!(
        Broker::dead_letters(&fixture.url, &fixture.name)
            .await
            .is_empty()
    );
    fixture.cleanup().await;
}

brokers!(fn an_outcome_observer_that_panics_loses_no_message);
/// An `on_outcome` observer that panics on every message: each message is still settled (its
/// key applied once, acknowledged, its partition going on on Kafka), and nothing comes back.
async fn an_outcome_observer_that_panics_loses_no_message<DB: TestDb, Broker: TestBroker>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("observer_panics").await else {
        return;
    };
    let credits: Vec<Credit> = (0..10).map(|n| Credit::new(n, 100)).collect();
    fixture
        .publish(credits.iter().map(Credit::body).collect())
        .await;
    let settings = Settings::default();
    let observed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let consumer = {
        let observed = Arc::clone(&observed);
        fixture
            .batch_consumer(Duration::from_secs(1), 1)
            .await
            .on_outcome(move |key, _outcome| {
                observed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                panic!("the observer of {key} panicked");
            })
    };
    let stats = fixture
        .run(consumer, settings, std::future::pending())
        .await;
    assert_eq!((stats.applied, stats.duplicates), (10, 0), "{stats:?}");
    assert_eq!(
        (stats.failed, stats.dead, stats.unacked),
        (0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(observed.load(std::sync::atomic::Ordering::SeqCst), 10);
    assert_eq!(ledger_rows(&fixture.pool).await, 10);
    let again = fixture.drain(settings, settled(settings)).await;
    assert_eq!(again, ConsumerStats::default());
    assert_eq!(Broker::left_behind(&fixture.url, &fixture.name).await, 0);
    fixture.cleanup().await;
}

brokers!(fn a_commit_whose_ack_is_lost_comes_back_as_a_duplicate);
/// A consumer stops after a job committed and before its ack, and never acks: the broker
/// delivers the message again, the guard reports a duplicate, and it is acknowledged. On
/// Kafka the offset committed with the effect is where the next consumer starts: the message
/// does not come back at all.
async fn a_commit_whose_ack_is_lost_comes_back_as_a_duplicate<DB: TestDb, Broker: TestBroker>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("lost_ack").await else {
        return;
    };
    fixture.publish(vec![Credit::new(1, 500).body()]).await;
    let settings = Settings::default();

    let committed = Arc::new(tokio::sync::Notify::new());
    let stop = {
        let committed = Arc::clone(&committed);
        async move { committed.notified().await }
    };
    let consumer = {
        let committed = Arc::clone(&committed);
        let config = ConsumerConfig {
            shutdown_timeout: Duration::ZERO,
            ..ConsumerConfig::default()
        };
        Consumer::with_config(Guard::new(fixture.pool.clone()), config)
            .register::<Credit>()
            .before_ack(move |_key: &JobKey, _outcome: &Outcome<()>| {
                committed.notify_one();
                // The consumer dies here: the ack never comes.
                std::future::pending().boxed()
            })
    };
    consumer.migrate().await.unwrap();
    let first = fixture.run(consumer, settings, stop).await;
    assert_eq!((first.applied, first.released), (1, 1), "{first:?}");
    assert_eq!(ledger_rows(&fixture.pool).await, 1);

    let second = fixture.drain(settings, settled(settings)).await;
    let redelivered = u64::from(Broker::REDELIVERS_COMMITTED);
    assert_eq!(
        (second.applied, second.duplicates),
        (0, redelivered),
        "{second:?}"
    );
    assert_eq!(
        ledger_rows(&fixture.pool).await,
        1,
        "the effect exists once"
    );
    let third = fixture.drain(settings, settled(settings)).await;
    assert_eq!(
        third,
        ConsumerStats::default(),
        "the duplicate was acknowledged"
    );
    fixture.cleanup().await;
}

brokers!(fn poison_messages_end_in_the_dead_letters);
/// Messages that can never run, fatal failures and failures on the last delivery end in the
/// broker's dead letters; nothing is applied for them.
async fn poison_messages_end_in_the_dead_letters<DB: TestDb, Broker: TestBroker>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("poison").await else {
        return;
    };
    let key = JobKey::new("credit", ["order-9"]).unwrap();
    let retryable = Credit {
        fail: Some(Failure::Retryable),
        ..Credit::new(1, 100)
    };
    let fatal = Credit {
        fail: Some(Failure::Fatal),
        ..Credit::new(2, 100)
    };
    let poison = vec![
        b"not json".to_vec(),
        Envelope::new("email", key.clone(), &json!({"to": "a@b.c"}))
            .unwrap()
            .to_bytes(),
        Envelope::new("credit", key, &json!({"order": 9}))
            .unwrap()
            .to_bytes(),
        fatal.body(),
        retryable.body(),
    ];
    fixture.publish(poison.clone()).await;

    let settings = Settings {
        max_deliveries: 3,
        ..Settings::default()
    };
    let stats = fixture.drain(settings, settled(settings)).await;
    assert_eq!(stats.dead, 5, "{stats:?}");
    // The retryable failure was given back twice, then dead-lettered on its third delivery.
    assert_eq!(stats.failed, 2, "{stats:?}");
    assert_eq!((stats.applied, stats.duplicates), (0, 0), "{stats:?}");
    assert_eq!(ledger_rows(&fixture.pool).await, 0);

    let mut dead = Broker::dead_letters(&fixture.url, &fixture.name).await;
    let mut expected = poison;
    dead.sort();
    expected.sort();
    assert_eq!(dead, expected, "each poison message is dead-lettered once");
    assert_eq!(Broker::left_behind(&fixture.url, &fixture.name).await, 0);
    fixture.cleanup().await;
}

brokers!(fn a_key_reused_with_another_payload_is_dead_lettered);
/// A key first applied with one payload and delivered again with another is refused and
/// dead-lettered: the same key naming two operations is a producer's bug.
async fn a_key_reused_with_another_payload_is_dead_lettered<DB: TestDb, Broker: TestBroker>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("reused").await else {
        return;
    };
    let first = Credit::new(1, 100);
    let other = Credit::new(1, 999);
    fixture.publish(vec![first.body()]).await;
    let settings = Settings::default();
    let stats = fixture.drain(settings, Duration::from_secs(1)).await;
    assert_eq!(stats.applied, 1, "{stats:?}");
    fixture.publish(vec![other.body()]).await;
    let stats = fixture.drain(settings, Duration::from_secs(1)).await;
    assert_eq!((stats.applied, stats.dead), (0, 1), "{stats:?}");
    assert_eq!(ledger_total(&fixture.pool).await, 100);
    assert_eq!(
        Broker::dead_letters(&fixture.url, &fixture.name).await,
        vec![other.body()]
    );
    fixture.cleanup().await;
}

brokers!(fn an_envelope_key_the_job_does_not_derive_is_dead_lettered);
/// A producer that builds envelopes by hand, with a fresh key for each publish of the same
/// credit: the consumer checks each envelope's key against the one the job derives from its
/// payload, and dead-letters the copies that do not match. Nothing is applied for them.
async fn an_envelope_key_the_job_does_not_derive_is_dead_lettered<
    DB: TestDb,
    Broker: TestBroker,
>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("foreign_key").await else {
        return;
    };
    let credit = Credit::new(1, 100);
    let by_hand: Vec<Vec<u8>> = (0..3)
        .map(|publish| {
            let fresh = JobKey::new("credit", [format!("publish-{publish}")]).unwrap();
            Envelope::new(<Credit as Job<DB>>::KIND, fresh, &credit)
                .unwrap()
                .to_bytes()
        })
        .collect();
    let mut bodies = by_hand.clone();
    bodies.push(credit.body());
    fixture.publish(bodies).await;

    let settings = Settings::default();
    let stats = fixture.drain(settings, Duration::from_secs(1)).await;
    assert_eq!((stats.applied, stats.dead), (1, 3), "{stats:?}");
    assert_eq!(
        ledger_rows(&fixture.pool).await,
        1,
        "the credit was applied once"
    );
    let mut dead = Broker::dead_letters(&fixture.url, &fixture.name).await;
    dead.sort();
    let mut expected = by_hand;
    expected.sort();
    assert_eq!(dead, expected);
    fixture.cleanup().await;
}

brokers!(fn messages_waiting_behind_long_jobs_keep_their_deliveries);
/// More messages than the prefetch, each job running well past AckWait (NATS) or the claim
/// threshold (Redis): messages waiting for a free slot are not delivered again meanwhile, so
/// none counts a failed delivery, none is a duplicate and none ends in the dead letters.
async fn messages_waiting_behind_long_jobs_keep_their_deliveries<DB: TestDb, Broker: TestBroker>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("waiting").await else {
        return;
    };
    let settings = Settings {
        prefetch: 2,
        redelivery: Duration::from_secs(1),
        ..Settings::default()
    };
    let credits: Vec<Credit> = (0..6)
        .map(|n| Credit {
            hold_ms: 2_500,
            ..Credit::new(n, 10)
        })
        .collect();
    fixture
        .publish(credits.iter().map(Credit::body).collect())
        .await;
    let stats = fixture.drain(settings, settled(settings)).await;
    assert_eq!(
        (stats.applied, stats.duplicates, stats.failed, stats.dead),
        (6, 0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(ledger_rows(&fixture.pool).await, 6);
    assert!(
        Broker::dead_letters(&fixture.url, &fixture.name)
            .await
            .is_empty()
    );
    assert_eq!(Broker::left_behind(&fixture.url, &fixture.name).await, 0);
    fixture.cleanup().await;
}

brokers!(fn three_consumers_apply_each_key_once);
/// Three consumers on one queue or stream, as on three machines, each message published three
/// times: effects equal distinct keys. A broker delivers at least once, so a message may come
/// once more than it was published (SQS hands it out again when its visibility timeout lapses
/// on a loaded machine): each extra delivery is one more duplicate, never an effect.
async fn three_consumers_apply_each_key_once<DB: TestDb, Broker: TestBroker>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("three").await else {
        return;
    };
    let credits: Vec<Credit> = (0..30).map(|n| Credit::new(n, 10)).collect();
    let bodies = credits
        .iter()
        .flat_map(|credit| std::iter::repeat_n(credit.body(), 3))
        .collect();
    fixture.publish(bodies).await;

    let settings = Settings {
        prefetch: 4,
        ..Settings::default()
    };
    fixture.prepare(settings).await;
    let idle = Duration::from_secs(2);
    let (a, b, c) = tokio::join!(
        fixture.drain(settings, idle),
        fixture.drain(settings, idle),
        fixture.drain(settings, idle),
    );
    let applied = a.applied + b.applied + c.applied;
    let duplicates = a.duplicates + b.duplicates + c.duplicates;
    assert_eq!(applied, 30, "{a:?} {b:?} {c:?}");
    assert!(duplicates >= 60, "{a:?} {b:?} {c:?}");
    assert_eq!(ledger_rows(&fixture.pool).await, 30);
    assert_eq!(ledger_total(&fixture.pool).await, 300);
    fixture.cleanup().await;
}

brokers!(fn a_long_job_keeps_its_message);
/// A job that runs past AckWait (NATS) or the claim threshold (Redis) keeps its message with
/// progress updates: the other consumer never gets it.
async fn a_long_job_keeps_its_message<DB: TestDb, Broker: TestBroker>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("long").await else {
        return;
    };
    let settings = Settings {
        redelivery: Duration::from_secs(2),
        ..Settings::default()
    };
    let long = Credit {
        hold_ms: 5_000,
        ..Credit::new(1, 100)
    };
    fixture.publish(vec![long.body()]).await;
    let (a, b) = tokio::join!(
        fixture.drain(settings, Duration::from_secs(3)),
        fixture.drain(settings, Duration::from_secs(3)),
    );
    assert_eq!(a.applied + b.applied, 1, "{a:?} {b:?}");
    assert_eq!(
        a.duplicates + b.duplicates,
        0,
        "the message was delivered again while its job ran: {a:?} {b:?}"
    );
    assert_eq!(ledger_rows(&fixture.pool).await, 1);
    fixture.cleanup().await;
}

brokers!(fn a_message_whose_consumers_keep_dying_is_dead_lettered);
/// A message whose consumer dies while running it, on every delivery, ends in the dead
/// letters once its deliveries run out, though no consumer ever settled it.
async fn a_message_whose_consumers_keep_dying_is_dead_lettered<DB: TestDb, Broker: TestBroker>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("dying").await else {
        return;
    };
    let doomed = Credit {
        order: format!("doomed-{}", Broker::NAME),
        hold_ms: 600_000,
        ..Credit::new(1, 100)
    };
    fixture.publish(vec![doomed.body()]).await;
    let settings = Settings::default();
    for death in 1..=settings.max_deliveries as usize {
        let started = async {
            while effect_runs::<DB>(&doomed.order) < death {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let config = ConsumerConfig {
            shutdown_timeout: Duration::ZERO,
            ..ConsumerConfig::default()
        };
        let consumer =
            Consumer::with_config(Guard::new(fixture.pool.clone()), config).register::<Credit>();
        consumer.migrate().await.unwrap();
        let stats = fixture.run(consumer, settings, started).await;
        assert_eq!(stats.released, 1, "death {death}: {stats:?}");
    }
    // No consumer runs while the last delivery times out: the decision to dead-letter cannot
    // depend on someone listening at that moment. The next consumer, or the broker itself
    // (RabbitMQ's delivery limit), moves it to the dead letters.
    tokio::time::sleep(settled(settings)).await;
    let stats = fixture.drain(settings, settled(settings)).await;
    assert_eq!((stats.applied, stats.failed), (0, 0), "{stats:?}");
    assert_eq!(ledger_rows(&fixture.pool).await, 0);
    assert_eq!(
        Broker::dead_letters(&fixture.url, &fixture.name).await,
        vec![doomed.body()]
    );
    assert_eq!(Broker::left_behind(&fixture.url, &fixture.name).await, 0);
    fixture.cleanup().await;
}
