//! Kafka partitions written by a transactional producer: each commit or abort leaves a control
//! record (a transaction marker) at an offset no consumer receives, so a partition's offsets
//! skip one after each transaction, and the offset stored after a transaction's last message is
//! its marker's. The consumer must take such offsets for what they are, neither a skip of the
//! broker's to read again nor a partition the client stopped fetching.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jobguard::broker::kafka::{KafkaConfig, bootstrap_servers};
use jobguard::broker::{ConsumerStats, Envelope, Offsets};
use jobguard::metrics::{KAFKA_PARTITIONS_REREAD_TOTAL, KAFKA_PARTITIONS_RESTARTED_TOTAL};
use metrics_util::debugging::{DebugValue, Snapshot};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::Settings;
use super::consumer::{Credit, DEADLINE, Fixture, effect_runs};
use super::kafka::{Kafka, credit_consumer};
use crate::common::{self, TestDb, ledger_rows};

/// How long a broker call of the test may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Kafka's API key of `EndTxn`, the request that commits or aborts a transaction.
const END_TXN: i16 = 26;

/// A producer of credits to one topic in transactions, committed or aborted: with Kafka's
/// transactions where the broker takes them, else (tansu 0.6 answers no `EndTxn`) as plain
/// messages each followed by the control record a transaction's end writes, produced as the
/// broker writes it.
struct Transactions {
    producer: FutureProducer,
    topic: String,
    /// The broker's address, when it ends no transactions: markers are written here.
    markers: Option<String>,
}

impl Transactions {
    async fn new(url: &str, topic: &str) -> Self {
        let servers = bootstrap_servers(url).unwrap();
        let address = servers.split(',').next().unwrap().to_owned();
        let asked = address.clone();
        let ends = tokio::task::spawn_blocking(move || raw::api_keys(&asked))
            .await
            .unwrap()
            .contains(&END_TXN);
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &servers)
            .set("linger.ms", "20");
        if ends {
            config.set("transactional.id", format!("{topic}-producer"));
        } else {
            config.set("enable.idempotence", "true");
        }
        let producer: FutureProducer = config.create().expect("a producer");
        if ends {
            let init = producer.clone();
            tokio::task::spawn_blocking(move || init.init_transactions(TIMEOUT))
                .await
                .unwrap()
                .expect("the broker takes transactions");
        }
        Transactions {
            producer,
            topic: topic.to_owned(),
            markers: (!ends).then_some(address),
        }
    }

    /// Produces `credits` in one transaction, together (in one record batch when the client
    /// gathers them), and commits it, or aborts it once every credit is written.
    async fn produce(&self, credits: &[Credit], commit: bool) {
        if self.markers.is_none() {
            self.producer.begin_transaction().expect("begin");
        }
        // Keyed by the job key, as `KafkaSink::publish` does.
        let bodies: Vec<(String, Vec<u8>)> = credits
            .iter()
            .map(|credit| {
                let body = credit.body();
                let key = Envelope::from_bytes(&body).unwrap().key.to_string();
                (key, body)
            })
            .collect();
        let sends = bodies.iter().map(|(key, body)| {
            let record = FutureRecord::to(&self.topic).key(key).payload(body);
            let sent = self.producer.send_result(record).expect("queued");
            async move { sent.await.expect("delivered").map_err(|(error, _)| error) }
        });
        futures::future::try_join_all(sends)
            .await
            .expect("written in the transaction");
        let producer = self.producer.clone();
        let (markers, topic) = (self.markers.clone(), self.topic.clone());
        tokio::task::spawn_blocking(move || match markers {
            Some(address) => raw::write_marker(&address, &topic, commit),
            None if commit => producer.commit_transaction(TIMEOUT),
            None => producer.abort_transaction(TIMEOUT),
        })
        .await
        .unwrap()
        .expect("the transaction ended");
    }
}

/// Kafka's wire protocol, for the two requests the test makes by hand.
mod raw {
    use std::io::{Read as _, Write as _};
    use std::net::TcpStream;
    use std::time::{SystemTime, UNIX_EPOCH};

    use rdkafka::error::KafkaError;

    /// One request (`api_key`, version `version`, body `body`) and its answer's body, after the
    /// correlation id.
    fn call(address: &str, api_key: i16, version: i16, body: &[u8]) -> Vec<u8> {
        let mut request = Vec::new();
        request.extend(api_key.to_be_bytes());
        request.extend(version.to_be_bytes());
        request.extend(7_i32.to_be_bytes());
        string(&mut request, "jobguard-test");
        request.extend(body);
        let mut stream = TcpStream::connect(address).expect("connect to the broker");
        let size = i32::try_from(request.len()).unwrap();
        stream.write_all(&size.to_be_bytes()).unwrap();
        stream.write_all(&request).unwrap();
        let mut size = [0; 4];
        stream.read_exact(&mut size).unwrap();
        let mut answer = vec![0; usize::try_from(i32::from_be_bytes(size)).unwrap()];
        stream.read_exact(&mut answer).unwrap();
        assert_eq!(answer[..4], 7_i32.to_be_bytes(), "the correlation id");
        answer.split_off(4)
    }

    fn string(buffer: &mut Vec<u8>, value: &str) {
        buffer.extend(i16::try_from(value.len()).unwrap().to_be_bytes());
        buffer.extend(value.as_bytes());
    }

    /// The API keys the broker at `address` answers (`ApiVersions` v0).
    pub(super) fn api_keys(address: &str) -> Vec<i16> {
        let answer = call(address, 18, 0, &[]);
        assert_eq!(answer[..2], [0, 0], "ApiVersions failed");
        let count = i32::from_be_bytes(answer[2..6].try_into().unwrap());
        (0..usize::try_from(count).unwrap())
            .map(|n| i16::from_be_bytes(answer[6 + n * 6..8 + n * 6].try_into().unwrap()))
            .collect()
    }

    /// Writes to partition 0 of `topic` the control record that ends a transaction, a commit or
    /// an abort marker, in a record batch of its own (`Produce` v3), as the broker writes it.
    pub(super) fn write_marker(address: &str, topic: &str, commit: bool) -> Result<(), KafkaError> {
        // The record: key (version 0, type 1 commit or 0 abort), value (version 0, the
        // coordinator's epoch 0), no headers.
        let key = [0, 0, 0, u8::from(commit)];
        let value = [0; 6];
        let mut record = vec![0];
        for n in [0, 0, key.len() as i64] {
            varint(&mut record, n);
        }
        record.extend(key);
        varint(&mut record, value.len() as i64);
        record.extend(value);
        varint(&mut record, 0);
        let mut records = Vec::new();
        varint(&mut records, record.len() as i64);
        records.extend(record);
        let now = i64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap();
        // From the attributes on, what the CRC covers: transactional and control (0x30).
        let mut covered = Vec::new();
        covered.extend(0x30_i16.to_be_bytes());
        covered.extend(0_i32.to_be_bytes()); // the last offset delta
        covered.extend(now.to_be_bytes());
        covered.extend(now.to_be_bytes());
        covered.extend((-1_i64).to_be_bytes()); // no producer id
        covered.extend((-1_i16).to_be_bytes());
        covered.extend((-1_i32).to_be_bytes()); // no sequence
        covered.extend(1_i32.to_be_bytes());
        covered.extend(records);
        let mut after_length = Vec::new();
        after_length.extend((-1_i32).to_be_bytes()); // the partition leader's epoch
        after_length.push(2); // magic
        after_length.extend(crc32c(&covered).to_be_bytes());
        after_length.extend(covered);
        let mut batch = Vec::new();
        batch.extend(0_i64.to_be_bytes());
        batch.extend(i32::try_from(after_length.len()).unwrap().to_be_bytes());
        batch.extend(after_length);

        let mut body = Vec::new();
        body.extend((-1_i16).to_be_bytes()); // no transactional id
        body.extend((-1_i16).to_be_bytes()); // acks: all
        body.extend(30_000_i32.to_be_bytes());
        body.extend(1_i32.to_be_bytes());
        string(&mut body, topic);
        body.extend(1_i32.to_be_bytes());
        body.extend(0_i32.to_be_bytes());
        body.extend(i32::try_from(batch.len()).unwrap().to_be_bytes());
        body.extend(batch);
        let answer = call(address, 0, 3, &body);
        // One topic, its name, one partition: its index, then its error code.
        let at = 4 + 2 + topic.len() + 4 + 4;
        let code = i16::from_be_bytes(answer[at..at + 2].try_into().unwrap());
        assert_eq!(code, 0, "the broker refused the marker");
        Ok(())
    }

    fn varint(buffer: &mut Vec<u8>, n: i64) {
        let mut zigzag = ((n << 1) ^ (n >> 63)) as u64;
        loop {
            let byte = (zigzag & 0x7f) as u8;
            zigzag >>= 7;
            if zigzag == 0 {
                buffer.push(byte);
                return;
            }
            buffer.push(byte | 0x80);
        }
    }

    /// CRC-32C (Castagnoli), as record batches carry it.
    fn crc32c(data: &[u8]) -> u32 {
        let mut crc = !0_u32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x82f6_3b78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
}

/// The orders a `read_committed` client outside any group receives from `topic`'s first
/// partition, from its log start to its end.
fn read_committed_orders(url: &str, topic: &str) -> BTreeSet<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers(url).unwrap())
        .set("group.id", format!("{topic}-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .expect("a reader");
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&list).expect("assign");
    let mut orders = BTreeSet::new();
    loop {
        match consumer.poll(TIMEOUT) {
            Some(Ok(message)) => {
                let envelope = Envelope::from_bytes(message.payload().unwrap_or_default())
                    .expect("a credit's envelope");
                let order = envelope.payload["order"].as_str().expect("an order");
                orders.insert(order.to_owned());
            }
            Some(Err(KafkaError::PartitionEOF(0))) => return orders,
            Some(Err(error)) => panic!("reading `{topic}`: {error}"),
            None => panic!("`{topic}` told no end within {TIMEOUT:?}"),
        }
    }
}

/// The counters of `snapshot` for `topic`, by name.
fn counted(snapshot: Snapshot, topic: &str) -> BTreeMap<String, u64> {
    let mut counted = BTreeMap::new();
    for (key, _, _, value) in snapshot.into_vec() {
        let DebugValue::Counter(count) = value else {
            continue;
        };
        let key = key.key();
        if key
            .labels()
            .any(|label| label.key() == "topic" && label.value() == topic)
        {
            *counted.entry(key.name().to_owned()).or_default() += count;
        }
    }
    counted
}

backends!(fn transaction_markers_neither_stall_nor_rewind_a_partition, blocking);
/// Committed and aborted transactions on a one-partition topic (see [`Transactions`]: on tansu,
/// plain messages and the markers written by hand). Three consumers in turn each start at the
/// stored offset, each time a commit's marker: the first message comes one offset above it. Every committed credit applies once, the lane is
/// never read again from an earlier offset (the marker is no skipped message), and a quiet
/// partition whose log ends with a marker is never taken for one the client stopped fetching.
/// Aborted credits apply exactly when a `read_committed` client of the broker receives them:
/// never on Kafka; tansu lists no aborted transactions in its fetch answers and serves them.
fn transaction_markers_neither_stall_nor_rewind_a_partition<DB: TestDb>() {
    let (topic, snapshot) = common::recorded(markers::<DB>());
    let Some(topic) = topic else {
        return;
    };
    let counted = counted(snapshot, &topic);
    let count = |name: &str| counted.get(name).copied().unwrap_or(0);
    assert_eq!(
        count(KAFKA_PARTITIONS_REREAD_TOTAL),
        0,
        "the partition was read again from an earlier offset: {counted:?}"
    );
    assert_eq!(
        count(KAFKA_PARTITIONS_RESTARTED_TOTAL),
        0,
        "a quiet partition ending with a marker was fetched again: {counted:?}"
    );
}

/// Runs a consumer of the fixture's topic until it has been idle for long enough to check its
/// quiet partition.
async fn drain<DB: TestDb>(fixture: &Fixture<DB, Kafka>, settings: Settings) -> ConsumerStats {
    let consumer = credit_consumer(&fixture.pool, Duration::from_secs(4), 1).await;
    let config = KafkaConfig {
        stalled_after: Duration::from_secs(1),
        ..Kafka::config(&fixture.name, settings)
    };
    let source = consumer.kafka_source(&fixture.url, config).await.unwrap();
    tokio::time::timeout(DEADLINE, consumer.run_kafka(source, std::future::pending()))
        .await
        .expect("the consumer stopped before the deadline")
        .expect("the consumer ran")
}

/// Checks that the offset stored for the fixture's one partition is its last commit's marker,
/// where its log ends.
async fn stored_at_marker<DB: TestDb>(fixture: &Fixture<DB, Kafka>) {
    let topic = Kafka::topic(&fixture.name);
    let stored = Offsets::new(fixture.pool.clone())
        .read(&topic, &topic)
        .await
        .unwrap()[&0];
    let url = fixture.url.clone();
    let ends = tokio::task::spawn_blocking(move || Kafka::high_watermarks(&url, &topic))
        .await
        .unwrap();
    assert_eq!(ends, [(0, stored + 1)], "stored {stored}");
}

/// The run of [`transaction_markers_neither_stall_nor_rewind_a_partition`]; its topic.
async fn markers<DB: TestDb>() -> Option<String> {
    let fixture = Fixture::<DB, Kafka>::new("transactions").await?;
    let one = Settings {
        partitions: 1,
        prefetch: 1,
        ..Settings::default()
    };
    fixture.prepare(one).await;
    let topic = Kafka::topic(&fixture.name);
    let credit = |n: usize| Credit {
        order: format!("{}-{n}", fixture.name),
        ..Credit::new(n, 10)
    };
    let credits: Vec<Credit> = (0..20).map(credit).collect();
    let transactions = Transactions::new(&fixture.url, &topic).await;

    transactions.produce(&credits[0..5], true).await;
    let first = drain(&fixture, one).await;
    assert_eq!((first.applied, first.duplicates), (5, 0), "{first:?}");
    stored_at_marker(&fixture).await;

    transactions.produce(&credits[5..8], false).await;
    transactions.produce(&credits[8..13], true).await;
    transactions.produce(&credits[13..15], false).await;
    transactions.produce(&credits[15..19], true).await;
    let second = drain(&fixture, one).await;
    stored_at_marker(&fixture).await;

    transactions.produce(&credits[19..20], true).await;
    let third = drain(&fixture, one).await;
    stored_at_marker(&fixture).await;

    let committed: Vec<&Credit> = [0..5, 8..13, 15..20]
        .into_iter()
        .flat_map(|range| &credits[range])
        .collect();
    let aborted: Vec<&Credit> = [5..8, 13..15]
        .into_iter()
        .flat_map(|range| &credits[range])
        .collect();
    let served = {
        let (url, topic) = (fixture.url.clone(), topic.clone());
        tokio::task::spawn_blocking(move || read_committed_orders(&url, &topic))
            .await
            .unwrap()
    };
    for credit in &committed {
        assert!(
            served.contains(&credit.order),
            "{} not served",
            credit.order
        );
        assert_eq!(effect_runs::<DB>(&credit.order), 1, "{}", credit.order);
    }
    let aborted_served = aborted
        .iter()
        .filter(|credit| served.contains(&credit.order))
        .count();
    for credit in &aborted {
        let runs = usize::from(served.contains(&credit.order));
        assert_eq!(effect_runs::<DB>(&credit.order), runs, "{}", credit.order);
    }
    let applied = (committed.len() + aborted_served) as u64;
    assert_eq!(
        (
            first.applied + second.applied + third.applied,
            third.applied
        ),
        (applied, 1),
        "{first:?} {second:?} {third:?}"
    );
    assert_eq!(ledger_rows(&fixture.pool).await, applied as i64);
    fixture.cleanup().await;
    Some(topic)
}
