//! Kafka through `jobguard consume` processes: offsets stored with the effects, partitions
//! handed back after rebalances, consumers killed and frozen while partitions move, and the
//! policies for a stored offset the log no longer holds.

use std::time::{Duration, Instant};

use jobguard::broker::Envelope;
use jobguard::broker::kafka::KafkaConfig;

use super::{Broker, CRASH_POINT, Consumer, DEADLINE, IDLE, Queue, credit, ledger, rows};
use crate::common::{Db, Rng, jobguard, seed, spawn};

/// The next offset of each partition of `topic` in the consumers' offsets table.
async fn stored_offsets(db: &Db, topic: &str) -> Vec<(i32, i64)> {
    let sql = "select partition, next_offset from jobguard_consumer_offsets \
               where topic = $1 order by partition";
    rows(db, sql, Some(topic)).await.unwrap()
}

/// Kafka: a consumer process killed with SIGKILL between its database commit and Kafka's
/// offset commit. The offsets table says the partition's next offset is 1, Kafka was never
/// told; the next process starts at the stored offset: no duplicate, no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(feature = "faults"), ignore = "needs --features faults")]
async fn resumes_from_the_stored_offsets_after_sigkill() {
    let Some((queue, db)) = credits_on_one_partition("resume", 10).await else {
        return;
    };

    let mut first = Consumer::start(
        &queue,
        &db,
        "first",
        &["--prefetch", "1", "--crash-after-commit"],
    );
    first.wait_for(CRASH_POINT).await;
    first.sigkill();
    assert_eq!(ledger(&db).await, (1, 1), "the first credit committed");
    assert_eq!(
        stored_offsets(&db, &queue.name).await,
        [(0, 1)],
        "its offset committed with it"
    );

    let second = Consumer::start(&queue, &db, "second", &["--until-idle", IDLE, "--json"]);
    let report = second.report().await;
    assert_eq!(
        (report["applied"].as_u64(), report["duplicates"].as_u64()),
        (Some(9), Some(0)),
        "started after the stored offset: {report}"
    );
    assert_eq!(
        ledger(&db).await,
        (10, 10),
        "every credit once, none skipped"
    );
    assert_eq!(stored_offsets(&db, &queue.name).await, [(0, 10)]);
    queue.remove().await;
}

/// Kafka: consumer processes join and leave a group while every partition holds more messages
/// than a lane buffers, so that each consumer pauses its partitions in the client (a lane holding
/// `buffer`, 100, messages). A starts alone; B joins, then C, each join a rebalance that hands A
/// (and then B) back partitions it had paused; then A leaves on SIGTERM, then B, each leave a
/// rebalance that hands the others back partitions they had paused, until C holds every
/// partition. Each step waits for the group's assignments, read in the consumers' logs. A
/// partition handed back paused must resume (else the ledger stops short, for good): every key
/// applied exactly once, every copy a duplicate (a message run again by a partition's next
/// owner is one more), every partition's stored offset at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_handed_back_after_a_rebalance_resume() {
    const KEYS: usize = 3_000;
    // Each key twice: 6,000 messages, about 2,000 a partition, twenty lane buffers each. Each
    // consumer runs one partition at a time (`--prefetch 1`): the lanes of the others wait full,
    // their partitions paused, when the group hands them back.
    let Some((queue, db)) = every_key_twice("handed_back", KEYS).await else {
        return;
    };

    let mut a = kafka_member(&queue, &db, "a", &ONE_AT_A_TIME);
    wait_for_assignments(&mut a, 1).await;
    wait_for_ledger(&db, &queue.name, 1, &mut [&mut a]).await;
    let mut b = kafka_member(&queue, &db, "b", &ONE_AT_A_TIME);
    // A is handed back partitions it paused, B gets its own.
    wait_for_assignments(&mut b, 1).await;
    wait_for_assignments(&mut a, 2).await;
    let mut c = kafka_member(&queue, &db, "c", &ONE_AT_A_TIME);
    wait_for_assignments(&mut c, 1).await;
    wait_for_assignments(&mut b, 2).await;
    a.0.signal("TERM");
    let a = a.report().await;
    // B and C share A's partitions.
    wait_for_assignments(&mut b, 3).await;
    wait_for_assignments(&mut c, 2).await;
    b.0.signal("TERM");
    let b = b.report().await;
    wait_for_assignments(&mut c, 3).await;
    let keys = KEYS as i64;
    wait_for_ledger(&db, &queue.name, keys, &mut [&mut c]).await;
    c.0.signal("TERM");
    let c = c.report().await;
    let reports = [&a, &b, &c];
    let total = |field: &str| -> u64 { reports.iter().map(|r| r[field].as_u64().unwrap()).sum() };
    assert_eq!(
        (total("applied"), total("dead")),
        (KEYS as u64, 0),
        "a {a}, b {b}, c {c}"
    );
    assert!(total("duplicates") >= KEYS as u64, "a {a}, b {b}, c {c}");
    assert_eq!(
        ledger(&db).await,
        (keys, keys),
        "every key applied exactly once"
    );
    let ends = tokio::task::spawn_blocking({
        let (url, topic) = (queue.url.clone(), queue.name.clone());
        move || kafka_ends(&url, &topic)
    })
    .await
    .unwrap();
    assert_eq!(ends.iter().map(|(_, end)| end).sum::<i64>(), 2 * keys);
    assert_eq!(stored_offsets(&db, &queue.name).await, ends);
    queue.remove().await;
}

/// A one-partition topic holding credits `0..credits`, each once, and the database its
/// consumers apply them to.
async fn credits_on_one_partition(test: &str, credits: usize) -> Option<(Queue, Db)> {
    let queue = Queue::new(Broker::Kafka, test).await?;
    let db = Db::postgres_or_sqlite(&format!("brokers::{test}_kafka"));
    let envelopes: Vec<Envelope> = (0..credits).map(credit).collect();
    queue.publish(&envelopes).await;
    Some((queue, db))
}

/// The rebalance test's members run one partition at a time.
const ONE_AT_A_TIME: [&str; 2] = ["--prefetch", "1"];

/// A 3-partition topic of this run's own holding `keys` credits, each published twice, and the
/// database its consumers apply them to. A topic, and so a group, of the run's own: tansu keeps
/// a group's members killed by an earlier run waiting to rejoin.
async fn every_key_twice(test: &str, keys: usize) -> Option<(Queue, Db)> {
    let queue = Queue {
        broker: Broker::Kafka,
        url: Broker::Kafka.url()?,
        name: format!("jgcli.{test}.{}.kafka", std::process::id()),
    };
    let config = KafkaConfig {
        partitions: 3,
        ..queue.kafka()
    };
    jobguard::broker::kafka::declare(&queue.url, &config)
        .await
        .expect("create the topic");
    let db = Db::postgres_or_sqlite(&format!("brokers::{test}_kafka"));
    let envelopes: Vec<Envelope> = (0..keys)
        .flat_map(|n| std::iter::repeat_n(credit(n), 2))
        .collect();
    queue.publish(&envelopes).await;
    Some((queue, db))
}

/// A `jobguard consume --broker kafka --json` process that logs its assignments, until SIGTERM;
/// `extra` arguments after the others.
fn kafka_member(queue: &Queue, db: &Db, name: &str, extra: &[&str]) -> Consumer {
    let mut command = jobguard();
    command
        .env("JOBGUARD_LOG", "warn,jobguard::broker::kafka=debug")
        .args(["consume", "--broker", "kafka", "--url", &queue.url])
        .args(["--queue", &queue.name, "--database-url", &db.url])
        .args(["--retry-delay", "100ms", "--json"])
        .args(extra);
    Consumer(spawn(&db.dir, name, command))
}

/// Waits until `consumer` logged `count` assignments of the group (its first, or others after
/// rebalances), failing the test if it ends first or after [`DEADLINE`].
async fn wait_for_assignments(consumer: &mut Consumer, count: usize) {
    let started = Instant::now();
    loop {
        let assigned = consumer.stderr().matches("partitions assigned").count();
        if assigned >= count {
            return;
        }
        if let Some(exit) = consumer.0.exited() {
            panic!(
                "the consumer ended after {assigned} of {count} assignments: {}",
                exit.stderr
            );
        }
        assert!(
            started.elapsed() < DEADLINE,
            "{assigned} of {count} assignments within {DEADLINE:?}: {}",
            consumer.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `jobguard_ledger` holds at least `rows` rows while `consumers` run; the rows it
/// holds then. Fails the test when a consumer ends first, or when no row was added for
/// [`DEADLINE`]: the partitions left stopped (the members' last log lines of their partitions
/// and the stored offsets then said).
async fn wait_for_ledger(db: &Db, topic: &str, rows: i64, consumers: &mut [&mut Consumer]) -> i64 {
    let mut started = Instant::now();
    let mut last = -1;
    loop {
        let held = ledger_rows_so_far(db).await;
        if held >= rows {
            return held;
        }
        if held > last {
            (last, started) = (held, Instant::now());
        }
        for consumer in consumers.iter_mut() {
            if let Some(exit) = consumer.0.exited() {
                panic!(
                    "a consumer stopped with {held} of {rows} rows applied: {}",
                    exit.stdout
                );
            }
        }
        if started.elapsed() >= DEADLINE {
            // What each member last said of its partitions, and where each partition stands.
            let said: Vec<String> = consumers
                .iter()
                .map(|consumer| {
                    let stderr = consumer.stderr();
                    let lines: Vec<&str> = stderr
                        .lines()
                        .filter(|line| line.contains("partition") || line.contains("WARN"))
                        .collect();
                    lines[lines.len().saturating_sub(12)..].join("\n")
                })
                .collect();
            panic!(
                "{held} of {rows} rows applied, none for {DEADLINE:?}: a partition stopped; \
                 stored offsets {:?}; the members' last words:\n{}",
                stored_offsets(db, topic).await,
                said.join("\n----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The rows of `jobguard_ledger`, 0 before a consumer made it.
async fn ledger_rows_so_far(db: &Db) -> i64 {
    let sql = "select count(*) from jobguard_ledger";
    let counted: sqlx::Result<Vec<(i64,)>> = rows(db, sql, None).await;
    counted.map_or(0, |counted| counted[0].0)
}

/// Where each partition of `topic` ends, by partition.
fn kafka_ends(url: &str, topic: &str) -> Vec<(i32, i64)> {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set(
            "bootstrap.servers",
            jobguard::broker::kafka::bootstrap_servers(url).unwrap(),
        )
        .create()
        .expect("a client");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("the topic's metadata");
    let mut ends: Vec<(i32, i64)> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions())
        .map(|partition| {
            let (_, high) = consumer
                .fetch_watermarks(topic, partition.id(), Duration::from_secs(10))
                .expect("watermarks");
            (partition.id(), high)
        })
        .collect();
    ends.sort();
    ends
}

/// Kafka under SIGKILL and SIGSTOP: three `jobguard consume` processes in one group on a
/// 3-partition topic holding thousands of messages a partition (every key published twice),
/// while consumers are killed and started again, or frozen for less or more than the group's
/// session (6 s) and thawed, so that partitions move between them and back, some handed to a
/// new owner while their old one still holds a transaction open. Afterwards every key is
/// applied exactly once, nothing is dead-lettered, and every partition's stored offset is at
/// its end. The seed is printed; `JOBGUARD_CHAOS_SEED` replays a run's choices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_lost_or_applied_twice_with_consumers_killed_and_frozen() {
    const KEYS: usize = 3_000;
    const MEMBERS: usize = 3;
    const FAULTS: usize = 8;
    let Some((queue, db)) = every_key_twice("chaos", KEYS).await else {
        return;
    };

    let seed = seed();
    eprintln!("brokers::kafka::no_key_lost_or_applied_twice...: JOBGUARD_CHAOS_SEED={seed}");
    let mut rng = Rng(seed);
    let mut started = 0;
    let mut start = || {
        started += 1;
        // A session of 6 s, the shortest brokers take, so that a killed or frozen member's
        // partitions move soon; deliveries to spare for the runs its faults cut short.
        let extra = [
            "--prefetch",
            "3",
            "--redelivery",
            "6s",
            "--max-deliveries",
            "100",
        ];
        kafka_member(&queue, &db, &format!("member-{started}"), &extra)
    };
    let mut members: Vec<Consumer> = (0..MEMBERS).map(|_| start()).collect();
    for member in &mut members {
        wait_for_assignments(member, 1).await;
    }
    let mut faults = Vec::new();
    for _ in 0..FAULTS {
        tokio::time::sleep(Duration::from_millis(500 + rng.below(2_500))).await;
        let victim = rng.below(MEMBERS as u64) as usize;
        if rng.below(2) == 0 {
            members[victim].sigkill();
            members[victim] = start();
            faults.push(format!("kill {victim}"));
        } else {
            // Under the session the group keeps it; over it, its partitions move while its
            // transaction stays open, and it rejoins when thawed.
            let frozen = Duration::from_millis(2_000 + rng.below(8_000));
            members[victim].0.signal("STOP");
            tokio::time::sleep(frozen).await;
            members[victim].0.signal("CONT");
            faults.push(format!("freeze {victim} {frozen:?}"));
        }
    }
    eprintln!("faults: {}", faults.join(", "));
    let keys = KEYS as i64;
    let mut running: Vec<&mut Consumer> = members.iter_mut().collect();
    wait_for_ledger(&db, &queue.name, keys, &mut running).await;
    let ends = tokio::task::spawn_blocking({
        let (url, topic) = (queue.url.clone(), queue.name.clone());
        move || kafka_ends(&url, &topic)
    })
    .await
    .unwrap();
    assert_eq!(ends.iter().map(|(_, end)| end).sum::<i64>(), 2 * keys);
    // The copies behind the last keys are still being read: every partition ends at its end.
    let waiting = Instant::now();
    while stored_offsets(&db, &queue.name).await != ends {
        assert!(
            waiting.elapsed() < DEADLINE,
            "stored offsets {:?}, ends {ends:?} (seed {seed}, {faults:?})",
            stored_offsets(&db, &queue.name).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A member restarted by the last fault is past its start once it holds a partition; a stop
    // asked earlier would end it before it reports.
    for member in &mut members {
        wait_for_assignments(member, 1).await;
    }
    let mut dead = 0;
    for member in members {
        member.0.signal("TERM");
        dead += member.report().await["dead"].as_u64().unwrap();
    }
    assert_eq!(dead, 0, "nothing dead-lettered (seed {seed}, {faults:?})");
    assert_eq!(
        ledger(&db).await,
        (keys, keys),
        "every key applied exactly once (seed {seed}, {faults:?})"
    );
    queue.remove().await;
}

/// A topic deleted and made again under its name, its stored offsets past the new log's end:
/// `jobguard consume` refuses it with an error that names the flag, and consumes it from its
/// start with `--kafka-past-log-end reset`, the keys the old topic applied found duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_topic_is_refused_unless_told_to_reset() {
    let Some((queue, db)) = credits_on_one_partition("recreated", 6).await else {
        return;
    };
    let first = Consumer::start(&queue, &db, "first", &["--until-idle", IDLE, "--json"]);
    assert_eq!(first.report().await["applied"], 6);
    assert_eq!(stored_offsets(&db, &queue.name).await, [(0, 6)]);

    // The topic made again with two of its old keys and one new: its log ends at 3.
    jobguard::broker::kafka::remove(&queue.url, &queue.kafka())
        .await
        .unwrap();
    let one_partition = KafkaConfig {
        partitions: 1,
        ..queue.kafka()
    };
    jobguard::broker::kafka::declare(&queue.url, &one_partition)
        .await
        .unwrap();
    queue.publish(&[credit(0), credit(1), credit(100)]).await;

    let mut refused = Consumer::start(&queue, &db, "refused", &["--until-idle", IDLE, "--json"]);
    let exit = refused.0.finish(DEADLINE);
    assert!(!exit.ok, "refused: {}", exit.stderr);
    assert!(
        exit.stderr.contains("past") && exit.stderr.contains("--kafka-past-log-end"),
        "the error says what happened and what to do: {}",
        exit.stderr
    );
    assert_eq!(
        stored_offsets(&db, &queue.name).await,
        [(0, 6)],
        "left as it was"
    );
    assert_eq!(ledger(&db).await, (6, 6));

    let reset = Consumer::start(
        &queue,
        &db,
        "reset",
        &[
            "--kafka-past-log-end",
            "reset",
            "--until-idle",
            IDLE,
            "--json",
        ],
    );
    let report = reset.report().await;
    assert_eq!(
        (report["applied"].as_u64(), report["duplicates"].as_u64()),
        (Some(1), Some(2)),
        "{report}"
    );
    assert_eq!(ledger(&db).await, (7, 7));
    assert_eq!(stored_offsets(&db, &queue.name).await, [(0, 3)]);
    queue.remove().await;
}
