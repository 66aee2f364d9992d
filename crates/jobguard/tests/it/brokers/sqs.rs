//! SQS as the suite uses it (moto's server, `JOBGUARD_TEST_SQS_URL`), and what only SQS has:
//! FIFO queues, which deduplicate a job sent again and need a FIFO dead-letter queue.

use std::future::Future;
use std::time::Duration;

use jobguard::broker::sqs::{self, SqsConfig, SqsSink, SqsSource};
use jobguard::broker::{Consumer, ConsumerStats, Envelope};
use jobguard::{Guard, JobKey};
use jobguard_testsupport::Broker;
use serde_json::Value;
use sqlx::Sqlite;

use super::{Publish, Settings, TestBroker};
use crate::common::TestDb;

impl Publish for SqsSink {
    async fn publish_envelope(&self, to: &str, envelope: &Envelope) {
        self.publish(&sqs::queue_name(to), envelope)
            .await
            .expect("publish");
    }
}

pub(super) struct Sqs;

impl Sqs {
    fn config(name: &str) -> SqsConfig {
        SqsConfig::new(format!("jg-test-{name}"))
    }

    fn client(url: &str) -> aws_sdk_sqs::Client {
        sqs::client(url).expect("an SQS client")
    }

    async fn url_of(client: &aws_sdk_sqs::Client, queue: &str) -> String {
        client
            .get_queue_url()
            .queue_name(queue)
            .send()
            .await
            .expect("the queue's URL")
            .queue_url()
            .expect("a URL")
            .to_owned()
    }

    /// Every message waiting in `queue`, received and deleted: bodies and their
    /// `Jobguard-Message-Id` attributes.
    async fn take_all(url: &str, queue: &str) -> Vec<(String, Option<String>)> {
        let client = Self::client(url);
        let queue_url = Self::url_of(&client, queue).await;
        let mut taken = Vec::new();
        loop {
            let received = client
                .receive_message()
                .queue_url(&queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(0)
                .message_attribute_names("All")
                .send()
                .await
                .expect("receive");
            let messages = received.messages.unwrap_or_default();
            if messages.is_empty() {
                return taken;
            }
            for message in messages {
                client
                    .delete_message()
                    .queue_url(&queue_url)
                    .receipt_handle(message.receipt_handle().expect("a receipt"))
                    .send()
                    .await
                    .expect("delete");
                let id = message
                    .message_attributes()
                    .and_then(|attributes| attributes.get(sqs::MESSAGE_ID_ATTRIBUTE))
                    .and_then(|id| id.string_value())
                    .map(str::to_owned);
                taken.push((message.body.unwrap_or_default(), id));
            }
        }
    }
}

impl Sqs {
    async fn source(url: &str, name: &str, settings: Settings) -> SqsSource {
        let config = SqsConfig {
            prefetch: settings.prefetch,
            max_deliveries: settings.max_deliveries,
            visibility_timeout: settings.redelivery,
            ..Self::config(name)
        };
        SqsSource::connect(url, config)
            .await
            .expect("consume from SQS")
    }
}

impl TestBroker for Sqs {
    const BROKER: Broker = Broker::Sqs;

    async fn reset(url: &str, name: &str) {
        sqs::remove(url, &Self::config(name))
            .await
            .expect("delete the queues");
    }

    async fn run<DB: TestDb>(
        consumer: Consumer<DB>,
        url: &str,
        name: &str,
        settings: Settings,
        stop: impl Future<Output = ()> + Send,
    ) -> jobguard::Result<ConsumerStats> {
        consumer
            .run(Self::source(url, name, settings).await, stop)
            .await
    }

    async fn publish(url: &str, name: &str, bodies: Vec<Vec<u8>>) {
        let client = Self::client(url);
        // The queues as the test's sources declare them, so that messages sent first wait.
        let config = SqsConfig {
            max_deliveries: Settings::default().max_deliveries,
            ..Self::config(name)
        };
        let queue_url = sqs::declare(&client, &config)
            .await
            .expect("declare the queues");
        for body in bodies {
            client
                .send_message()
                .queue_url(&queue_url)
                .message_body(String::from_utf8(body).expect("UTF-8"))
                .send()
                .await
                .expect("send");
        }
    }

    async fn dead_letters(url: &str, name: &str) -> Vec<Vec<u8>> {
        Self::take_all(url, &Self::config(name).dead_letter_queue)
            .await
            .into_iter()
            .map(|(body, _)| body.into_bytes())
            .collect()
    }

    async fn left_behind(url: &str, name: &str) -> u64 {
        use aws_sdk_sqs::types::QueueAttributeName;
        let client = Self::client(url);
        let queue_url = Self::url_of(&client, &Self::config(name).queue).await;
        let counts = [
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            QueueAttributeName::ApproximateNumberOfMessagesDelayed,
        ];
        let attributes = client
            .get_queue_attributes()
            .queue_url(&queue_url)
            .set_attribute_names(Some(counts.to_vec()))
            .send()
            .await
            .expect("the queue's attributes");
        let attributes = attributes.attributes().expect("attributes");
        counts
            .iter()
            .map(|count| attributes[count].parse::<u64>().expect("a count"))
            .sum()
    }

    type Sink = SqsSink;
    // Standard queues keep every send; FIFO queues deduplicate (`sqs_fifo_*` below).
    const DEDUPES: bool = false;

    async fn sink(url: &str) -> SqsSink {
        SqsSink::connect(url).expect("an SQS sink")
    }

    async fn prepare_topic(url: &str, topic: &str) {
        let config = SqsConfig::new(sqs::queue_name(topic));
        sqs::remove(url, &config).await.expect("delete the queue");
        Self::client(url)
            .create_queue()
            .queue_name(&config.queue)
            .send()
            .await
            .expect("create the queue");
    }

    async fn received(url: &str, topic: &str) -> Vec<(String, Value)> {
        Self::take_all(url, &sqs::queue_name(topic))
            .await
            .into_iter()
            .map(|(body, id)| {
                (
                    id.expect("a Jobguard-Message-Id"),
                    serde_json::from_str(&body).expect("JSON"),
                )
            })
            .collect()
    }
}

/// A FIFO queue: the sink sends a job with its key as `MessageDeduplicationId`, so a job
/// published three times is stored once and applied once; a message that can never run goes to
/// the FIFO dead-letter queue (which needs a group and a deduplication id of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_fifo_queues_store_a_job_published_again_once() {
    use jobguard::broker::{Consumer, ConsumerConfig};

    use super::consumer::Credit;
    use crate::common::ledger_rows;

    let Some(url) = Sqs::url() else {
        return;
    };
    let name = format!("fifo-{}.fifo", std::process::id());
    let config = SqsConfig {
        max_deliveries: 3,
        visibility_timeout: Duration::from_secs(2),
        ..Sqs::config(&name)
    };
    assert!(config.is_fifo() && config.dead_letter_queue.ends_with("-dead.fifo"));
    sqs::remove(&url, &config).await.expect("delete the queues");
    let source = SqsSource::connect(&url, config.clone())
        .await
        .expect("declare the FIFO queues");

    let credit = Credit::new(1, 100);
    let envelope = Envelope::for_job::<Sqlite, _>(&credit).unwrap();
    let foreign = Envelope::new(
        "credit",
        JobKey::new("credit", ["minted-per-publish"]).unwrap(),
        &credit,
    )
    .unwrap();
    let sink = SqsSink::connect(&url).expect("an SQS sink");
    for _ in 0..3 {
        sink.publish(&config.queue, &envelope).await.expect("send");
    }
    sink.publish(&config.queue, &foreign).await.expect("send");

    let pool = Sqlite::open("sqs_fifo", 4).await.expect("a SQLite file");
    let consumer = Consumer::with_config(
        Guard::new(pool.clone()),
        ConsumerConfig {
            stop_when_idle_for: Some(Duration::from_secs(5)),
            ..ConsumerConfig::default()
        },
    )
    .register::<Credit>();
    consumer.migrate().await.unwrap();
    let stats = tokio::time::timeout(
        Duration::from_secs(90),
        consumer.run(source, std::future::pending()),
    )
    .await
    .expect("the consumer stopped before the deadline")
    .expect("the consumer ran");
    assert_eq!(
        (stats.applied, stats.duplicates, stats.dead),
        (1, 0, 1),
        "the copies were deduplicated by SQS: {stats:?}"
    );
    assert_eq!(ledger_rows(&pool).await, 1);
    let dead = Sqs::take_all(&url, &config.dead_letter_queue).await;
    assert_eq!(
        dead.iter()
            .map(|(body, _)| body.as_bytes().to_vec())
            .collect::<Vec<_>>(),
        vec![foreign.to_bytes()]
    );
    let left = Sqs::take_all(&url, &config.queue).await;
    assert!(left.is_empty(), "{left:?}");
    sqs::remove(&url, &config).await.expect("delete the queues");
    pool.close().await;
}

/// One step of an account's history, for the FIFO order tests: runs in the message group
/// `group`, records when its effect starts and ends, holds its transaction `hold_ms`, and with
/// `fail_first` fails its first delivery, retryably.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Step {
    /// Which test run the step belongs to: the tests of both backends share this process.
    run: String,
    group: String,
    seq: u32,
    hold_ms: u64,
    fail_first: bool,
}

/// What the steps' effects did, in the order they did it: (run, group, seq, started).
static STEP_EVENTS: std::sync::Mutex<Vec<(String, String, u32, bool)>> =
    std::sync::Mutex::new(Vec::new());

fn step_events() -> std::sync::MutexGuard<'static, Vec<(String, String, u32, bool)>> {
    STEP_EVENTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<DB: crate::common::TestDb> jobguard::Job<DB> for Step {
    const KIND: &'static str = "step";

    fn key(&self) -> Result<JobKey, jobguard::KeyError> {
        JobKey::new("step", [&self.run, &self.group, &self.seq.to_string()])
    }

    async fn run(
        &self,
        conn: &mut <DB as sqlx::Database>::Connection,
    ) -> Result<(), jobguard::JobError> {
        let event = |started| (self.run.clone(), self.group.clone(), self.seq, started);
        let first = {
            let mut events = step_events();
            let first = !events.contains(&event(true));
            events.push(event(true));
            first
        };
        DB::insert_ledger(conn, 1, 1).await?;
        tokio::time::sleep(Duration::from_millis(self.hold_ms)).await;
        step_events().push(event(false));
        if self.fail_first && first {
            return Err(jobguard::JobError::msg("the account is locked"));
        }
        Ok(())
    }
}

/// A FIFO queue's message groups run one message at a time, in the order sent, even when one
/// receive hands over several messages of a group: the effects of a group never overlap and
/// commit in send order. The first message of group `a` fails its first delivery: it holds
/// its group (the rest of `a` commits after it) and not the other group.
async fn sqs_fifo_groups_run_one_at_a_time_in_order<DB: crate::common::TestDb>() {
    use std::sync::{Arc, Mutex};

    use jobguard::Outcome;
    use jobguard::broker::ConsumerConfig;

    use crate::common::ledger_rows;

    let Some(url) = Sqs::url() else {
        return;
    };
    let Some(pool) = DB::open("sqs_fifo_order", 8).await else {
        return;
    };
    let run = format!("{}-{}", DB::BACKEND, std::process::id());
    let name = format!("order-{run}.fifo");
    let config = SqsConfig {
        prefetch: 10,
        max_deliveries: 5,
        visibility_timeout: Duration::from_secs(6),
        ..Sqs::config(&name)
    };
    sqs::remove(&url, &config).await.expect("delete the queues");
    let source = SqsSource::connect(&url, config.clone())
        .await
        .expect("declare the FIFO queues");

    const STEPS: u32 = 4;
    let sink = SqsSink::connect(&url).expect("an SQS sink");
    // Sent interleaved: a0 b0 a1 b1 ...
    for seq in 0..STEPS {
        for group in ["a", "b"] {
            let step = Step {
                run: run.clone(),
                group: group.to_owned(),
                seq,
                hold_ms: 200,
                fail_first: group == "a" && seq == 0,
            };
            let envelope = Envelope::for_job::<DB, _>(&step).unwrap();
            sink.publish_in_group(&config.queue, &envelope, group)
                .await
                .expect("send");
        }
    }

    let committed: Arc<Mutex<Vec<String>>> = Arc::default();
    let consumer = {
        let committed = Arc::clone(&committed);
        Consumer::with_config(
            Guard::new(pool.clone()),
            ConsumerConfig {
                retry_delay: Duration::from_millis(500),
                stop_when_idle_for: Some(Duration::from_secs(6)),
                ..ConsumerConfig::default()
            },
        )
        .register::<Step>()
        .on_outcome(move |key, outcome| {
            if matches!(outcome, Outcome::Applied(())) {
                committed.lock().unwrap().push(key.to_string());
            }
        })
    };
    consumer.migrate().await.unwrap();
    let stats = tokio::time::timeout(
        Duration::from_secs(120),
        consumer.run(source, std::future::pending()),
    )
    .await
    .expect("the consumer stopped before the deadline")
    .expect("the consumer ran");

    // Each group's effects, in the order they started and ended: never two at once.
    for group in ["a", "b"] {
        let events: Vec<(u32, bool)> = step_events()
            .iter()
            .filter(|(r, g, _, _)| *r == run && g == group)
            .map(|(_, _, seq, started)| (*seq, *started))
            .collect();
        for pair in events.chunks(2) {
            assert!(
                matches!(pair, [(s, true), (e, false)] if s == e),
                "group {group}: one step started before the one before it ended: {events:?}"
            );
        }
        let runs: Vec<u32> = events
            .iter()
            .filter(|(_, started)| *started)
            .map(|(seq, _)| *seq)
            .collect();
        let expected: Vec<u32> = match group {
            // a0 failed once and ran again before a1.
            "a" => [0].into_iter().chain(0..STEPS).collect(),
            _ => (0..STEPS).collect(),
        };
        assert_eq!(runs, expected, "group {group} ran out of order");
        let commits: Vec<String> = committed
            .lock()
            .unwrap()
            .iter()
            .filter(|key| key.starts_with(&format!("step:{run}:{group}:")))
            .cloned()
            .collect();
        let in_order: Vec<String> = (0..STEPS)
            .map(|seq| format!("step:{run}:{group}:{seq}"))
            .collect();
        assert_eq!(commits, in_order, "group {group} committed out of order");
    }
    let total = u64::from(2 * STEPS);
    assert_eq!(
        (stats.applied, stats.duplicates, stats.failed, stats.dead),
        (total, 0, 1, 0),
        "{stats:?}"
    );
    assert_eq!(ledger_rows(&pool).await, total as i64);
    assert!(Sqs::take_all(&url, &config.queue).await.is_empty());
    assert!(
        Sqs::take_all(&url, &config.dead_letter_queue)
            .await
            .is_empty()
    );
    sqs::remove(&url, &config).await.expect("delete the queues");
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_fifo_groups_run_one_at_a_time_in_order_postgres() {
    sqs_fifo_groups_run_one_at_a_time_in_order::<sqlx::Postgres>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_fifo_groups_run_one_at_a_time_in_order_sqlite() {
    sqs_fifo_groups_run_one_at_a_time_in_order::<Sqlite>().await;
}
