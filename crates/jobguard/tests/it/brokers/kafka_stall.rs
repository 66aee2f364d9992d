//! The Kafka stall check on partitions assigned with no stored offset: the client starts them
//! where it says (Kafka's committed offset, `auto.offset.reset`), and the check must not guess.

use std::time::{Duration, Instant};

use jobguard::broker::Offsets;
use jobguard::broker::kafka::KafkaConfig;

use super::Settings;
use super::consumer::{Credit, DEADLINE, Fixture, effect_runs};
use super::kafka::{Kafka, credit_consumer};
use crate::common::{TestDb, ledger_rows};

backends!(fn a_new_group_starting_at_the_log_end_applies_nothing_old);
/// A new group told `auto.offset.reset=latest` (through the client settings) joins a topic with
/// ten credits in it: it has no stored offset, and the client starts the partition at its end.
/// The partition stays quiet for several `stalled_after`; the check must not take it for a
/// stalled one (a guess of offset 0 read the whole retained log again, every old credit
/// applied). Credits published afterwards apply; the old ones never run.
async fn a_new_group_starting_at_the_log_end_applies_nothing_old<DB: TestDb>() {
    let Some(fixture) = Fixture::<DB, Kafka>::new("latest_new_group").await else {
        return;
    };
    let one = Settings {
        partitions: 1,
        prefetch: 1,
        ..Settings::default()
    };
    fixture.prepare(one).await;
    let credit = |n: usize| Credit {
        order: format!("latest-{n}"),
        ..Credit::new(n, 10)
    };
    let old: Vec<Credit> = (0..10).map(credit).collect();
    fixture
        .publish(old.iter().map(Credit::body).collect())
        .await;

    // Stopped by the test: idle would stop it while the partition is quiet, as it must be.
    let consumer = credit_consumer(&fixture.pool, DEADLINE, 1).await;
    let config = KafkaConfig {
        stalled_after: Duration::from_secs(1),
        client_settings: vec![("auto.offset.reset".to_owned(), "latest".to_owned())],
        ..Kafka::config(&fixture.name, one)
    };
    let source = consumer
        .kafka_source(&fixture.url, config)
        .await
        .expect("join the group");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(consumer.run_kafka(source, async move {
        let _ = stopped.await;
    }));

    // The group joins and the partition stays quiet: the stall check has its turns.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let replayed = ledger_rows(&fixture.pool).await;
    assert_eq!(
        replayed, 0,
        "old credits applied while the partition was quiet"
    );

    // New credits, one every half second until one applies: published before the group took
    // the partition, one is skipped by `latest`, as it should be.
    let started = Instant::now();
    let mut fresh = Vec::new();
    while ledger_rows(&fixture.pool).await == 0 {
        assert!(started.elapsed() < DEADLINE, "a new credit applied");
        let next = credit(100 + fresh.len());
        fixture.publish(vec![next.body()]).await;
        fresh.push(next);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.send(()).unwrap();
    let stats = run.await.unwrap().expect("the consumer ran");
    let applied: usize = fresh.iter().map(|c| effect_runs::<DB>(&c.order)).sum();
    assert!(applied >= 1, "{stats:?}");
    assert_eq!(
        (stats.applied, stats.duplicates),
        (applied as u64, 0),
        "{stats:?}"
    );
    for credit in &old {
        assert_eq!(effect_runs::<DB>(&credit.order), 0, "{}", credit.order);
    }
    fixture.cleanup().await;
}

backends!(fn a_group_whose_stored_offsets_were_forgotten_reads_nothing_again);
/// A group applies ten credits, then its stored offsets are deleted (`Offsets::forget`): the
/// next consumer has none and starts where Kafka's committed offset says, the log end. The
/// partition stays quiet past `stalled_after`; the check must not read it again from offset 0
/// (the guard would catch the copies here, not once their guard rows are pruned).
async fn a_group_whose_stored_offsets_were_forgotten_reads_nothing_again<DB: TestDb>() {
    let Some(fixture) = Fixture::<DB, Kafka>::new("forgotten").await else {
        return;
    };
    let one = Settings {
        partitions: 1,
        prefetch: 1,
        ..Settings::default()
    };
    fixture.prepare(one).await;
    let credits: Vec<Credit> = (0..10)
        .map(|n| Credit {
            order: format!("forgotten-{n}"),
            ..Credit::new(n, 10)
        })
        .collect();
    fixture
        .publish(credits.iter().map(Credit::body).collect())
        .await;
    let config = KafkaConfig {
        stalled_after: Duration::from_secs(1),
        ..Kafka::config(&fixture.name, one)
    };
    let consumer = credit_consumer(&fixture.pool, Duration::from_secs(2), 1).await;
    let source = consumer
        .kafka_source(&fixture.url, config.clone())
        .await
        .unwrap();
    let first = consumer
        .run_kafka(source, std::future::pending())
        .await
        .unwrap();
    assert_eq!(first.applied, 10, "{first:?}");
    let offsets = Offsets::new(fixture.pool.clone());
    assert_eq!(
        offsets.forget(&config.group, &config.topic).await.unwrap(),
        1
    );

    // Idle for 6 s from the assignment: several checks of the quiet partition.
    let consumer = credit_consumer(&fixture.pool, Duration::from_secs(6), 1).await;
    let source = consumer.kafka_source(&fixture.url, config).await.unwrap();
    let second = tokio::time::timeout(DEADLINE, consumer.run_kafka(source, std::future::pending()))
        .await
        .expect("the consumer stopped before the deadline")
        .expect("the consumer ran");
    assert_eq!((second.applied, second.duplicates), (0, 0), "{second:?}");
    for credit in &credits {
        assert_eq!(effect_runs::<DB>(&credit.order), 1, "{}", credit.order);
    }
    fixture.cleanup().await;
}
