//! Broker consumers running messages in batches (`ConsumerConfig::batch_size`), once per
//! database backend and broker (`brokers!`): a failing message rolls its batch back and runs
//! alone while the others apply once; the same key twice in one batch applies once; a batch's
//! messages are all acknowledged after its commit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use jobguard::JobKey;
use jobguard::broker::ConsumerStats;

use super::consumer::{Credit, Failure, Fixture, effect_runs, settled};
use super::{Settings, TestBroker};
use crate::common::{TestDb, ledger_rows, ledger_total};

/// Messages per batch in these tests; the prefetch holds one batch.
const BATCH: usize = 10;

/// Credits with orders of the test's own, `<test>-<broker>-<n>`, so that their effect runs
/// can be counted while other tests run.
fn credits<Broker: TestBroker>(test: &str, count: usize) -> Vec<Credit> {
    (0..count)
        .map(|n| Credit {
            order: format!("{test}-{}-{n}", Broker::NAME),
            ..Credit::new(n, 10 + n as i64)
        })
        .collect()
}

/// Drains the fixture's queue with batches of [`BATCH`], recording the keys each committed
/// transaction claimed.
async fn drain_recording<DB: TestDb, Broker: TestBroker>(
    fixture: &Fixture<DB, Broker>,
    settings: Settings,
    idle: Duration,
) -> (ConsumerStats, Vec<Vec<JobKey>>) {
    let committed = Arc::new(Mutex::new(Vec::new()));
    let consumer = {
        let committed = Arc::clone(&committed);
        fixture
            .batch_consumer(idle, BATCH)
            .await
            .before_commit(move |keys: Vec<JobKey>| {
                committed.lock().unwrap().push(keys);
                std::future::ready(()).boxed()
            })
    };
    let stats = fixture
        .run(consumer, settings, std::future::pending())
        .await;
    let committed = committed.lock().unwrap().clone();
    (stats, committed)
}

brokers!(fn a_failing_message_rolls_its_batch_back_and_runs_alone);
/// A batch whose last message fails on every delivery: the batch rolls back, its messages run
/// again one per transaction, the others apply once and the failing one is given back alone
/// until its deliveries run out.
async fn a_failing_message_rolls_its_batch_back_and_runs_alone<DB: TestDb, Broker: TestBroker>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("batch_fail").await else {
        return;
    };
    let mut credits = credits::<Broker>("batch-fail", BATCH);
    credits[BATCH - 1].fail = Some(Failure::Retryable);
    fixture
        .publish(credits.iter().map(Credit::body).collect())
        .await;

    let settings = Settings {
        prefetch: BATCH,
        max_deliveries: 3,
        ..Settings::default()
    };
    let (stats, _) = drain_recording(&fixture, settings, settled(settings)).await;
    assert_eq!(
        (stats.applied, stats.duplicates, stats.failed, stats.dead),
        (BATCH as u64 - 1, 0, 2, 1),
        "{stats:?}"
    );
    assert_eq!(ledger_rows(&fixture.pool).await, BATCH as i64 - 1);
    let expected: i64 = credits[..BATCH - 1].iter().map(|c| c.amount).sum();
    assert_eq!(ledger_total(&fixture.pool).await, expected);
    // The credits that shared the failing one's batch ran twice: rolled back with it, then
    // applied alone.
    let rerun = credits[..BATCH - 1]
        .iter()
        .filter(|credit| effect_runs::<DB>(&credit.order) == 2)
        .count();
    assert!(rerun > 0, "no credit ran in the failing batch");
    assert!(
        credits[..BATCH - 1]
            .iter()
            .all(|credit| (1..=2).contains(&effect_runs::<DB>(&credit.order))),
        "a credit ran more than in its batch and alone"
    );
    assert_eq!(
        Broker::dead_letters(&fixture.url, &fixture.name).await,
        vec![credits[BATCH - 1].body()]
    );
    assert_eq!(Broker::left_behind(&fixture.url, &fixture.name).await, 0);
    fixture.cleanup().await;
}

brokers!(fn the_same_key_twice_in_a_batch_applies_once);
/// One credit published three times among others, all in one batch: the first copy claims the
/// key in the batch's transaction, the later copies find the batch's own claim and are
/// duplicates, and every message is acknowledged after the one commit.
async fn the_same_key_twice_in_a_batch_applies_once<DB: TestDb, Broker: TestBroker>() {
    let Some(fixture) = Fixture::<DB, Broker>::new("batch_dup").await else {
        return;
    };
    let credits = credits::<Broker>("batch-dup", 4);
    let twice = &credits[1];
    let bodies = vec![
        credits[0].body(),
        twice.body(),
        credits[2].body(),
        twice.body(),
        credits[3].body(),
        twice.body(),
    ];
    fixture.publish(bodies).await;

    let settings = Settings {
        prefetch: BATCH,
        ..Settings::default()
    };
    let (stats, committed) = drain_recording(&fixture, settings, Duration::from_secs(1)).await;
    assert_eq!((stats.applied, stats.duplicates), (4, 2), "{stats:?}");
    assert_eq!(
        (stats.failed, stats.dead, stats.unacked),
        (0, 0, 0),
        "{stats:?}"
    );
    assert!(
        committed.iter().any(|keys| keys.len() > 1),
        "no batch committed: {committed:?}"
    );
    assert_eq!(
        effect_runs::<DB>(&twice.order),
        1,
        "the copies never ran the effect"
    );
    assert_eq!(ledger_rows(&fixture.pool).await, 4);
    let expected: i64 = credits.iter().map(|c| c.amount).sum();
    assert_eq!(ledger_total(&fixture.pool).await, expected);

    // Every message of the batch was acknowledged: nothing comes back.
    let again = fixture
        .drain_in_batches(settings, settled(settings), BATCH)
        .await;
    assert_eq!(again, ConsumerStats::default());
    assert_eq!(Broker::left_behind(&fixture.url, &fixture.name).await, 0);
    fixture.cleanup().await;
}
