//! The outbox's conformance suite: every test runs on real PostgreSQL and real SQLite
//! (`backends!`), and delivers over HTTP to a real receiver, the provider's webhook endpoint.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use jobguard::outbox::{
    MessageState, Outbox, OutboxCounts, Relay, RelayConfig, RelayReport, WebhookSink,
};
use jobguard::queue::MAX_PAYLOAD_BYTES;
use jobguard::{Error, Guard, JobError, JobKey, MessageId, Outcome, RetryPolicy, TableName};
use jobguard_provider::{Provider, ProviderConfig, RunningProvider, WebhookDelivery};
use serde_json::json;
use sqlx::Pool;

use crate::common::{TestDb, schema_name};

/// The longest a relay runs in a test before the test fails: a guard against hangs only.
const DEADLINE: Duration = Duration::from_secs(60);

/// Per topic, the ids in the order they were published or first received.
type ByTopic = BTreeMap<String, Vec<String>>;

/// A migrated outbox on the test's own database. Test names get a prefix so that they cannot
/// collide with the other suites' schemas and files.
async fn open<DB: TestDb>(test: &str) -> Option<(Pool<DB>, Outbox<DB>)> {
    let pool = DB::open(&format!("o_{test}"), 8).await?;
    let outbox = Outbox::new(pool.clone());
    outbox.migrate().await.expect("migrate the outbox");
    outbox.migrate().await.expect("migrate is idempotent");
    Some((pool, outbox))
}

async fn receiver() -> RunningProvider {
    Provider::start(ProviderConfig::default())
        .await
        .expect("start the provider")
}

fn webhooks_url(base: &str) -> String {
    format!("{base}/v1/webhooks")
}

fn sink(running: &RunningProvider) -> WebhookSink {
    WebhookSink::new(&webhooks_url(&running.url())).expect("a valid URL")
}

/// Short polls and backoffs, so retries happen within a test, and attempts enough that a
/// receiver failing for a while never dead-letters a message.
fn quick() -> RelayConfig {
    RelayConfig {
        poll_interval: Duration::from_millis(20),
        retry: RetryPolicy {
            max_attempts: 1000,
            base: Duration::from_millis(20),
            max_delay: Duration::from_millis(200),
            jitter: 0.2,
        },
        lease: Duration::from_secs(2),
        ..RelayConfig::default()
    }
}

fn relay<DB: TestDb>(
    outbox: &Outbox<DB>,
    sink: WebhookSink,
    config: RelayConfig,
) -> Relay<DB, WebhookSink> {
    Relay::with_config(outbox.clone(), sink, config).expect("a valid configuration")
}

fn key(kind: &str, n: usize) -> JobKey {
    JobKey::new(kind, [format!("order-{n}")]).expect("valid key")
}

fn counts(pending: i64, sent: i64, dead: i64) -> OutboxCounts {
    OutboxCounts {
        pending,
        sent,
        dead,
    }
}

/// Publishes messages `range` of every topic, interleaved across topics, each in a committed
/// transaction of its own. Returns the ids per topic in publish order.
async fn publish_interleaved<DB: TestDb>(
    outbox: &Outbox<DB>,
    topics: &[&str],
    range: std::ops::Range<usize>,
) -> ByTopic {
    let mut published = ByTopic::new();
    for n in range {
        for topic in topics {
            let id = outbox
                .publish(&key("notify", n), topic, &json!({"n": n, "topic": topic}))
                .await
                .expect("publish");
            published
                .entry(topic.to_string())
                .or_default()
                .push(id.to_string());
        }
    }
    published
}

/// The ids each topic received, in the order of their first receipt.
fn first_receipts(webhooks: &[WebhookDelivery]) -> ByTopic {
    let mut seen = HashSet::new();
    let mut topics = ByTopic::new();
    for delivery in webhooks {
        let id = delivery
            .idempotency_key
            .clone()
            .expect("every delivery carries an Idempotency-Key");
        if seen.insert(id.clone()) {
            topics.entry(delivery.topic.clone()).or_default().push(id);
        }
    }
    topics
}

fn distinct(provider: &Provider) -> usize {
    first_receipts(&provider.webhooks())
        .values()
        .map(Vec::len)
        .sum()
}

/// Resolves when `provider` has received `expected` distinct messages, or at the deadline.
async fn received(provider: Provider, expected: usize) {
    let started = Instant::now();
    while distinct(&provider) < expected && started.elapsed() < DEADLINE {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `relay` until `provider` received `expected` distinct messages; fails after the
/// deadline.
async fn run_until_received<DB: TestDb>(
    relay: &Relay<DB, WebhookSink>,
    provider: &Provider,
    expected: usize,
) -> RelayReport {
    let report = relay
        .run(received(provider.clone(), expected))
        .await
        .expect("the relay runs");
    assert_eq!(
        distinct(provider),
        expected,
        "the receiver did not get every message within {DEADLINE:?}: {report:?}"
    );
    report
}

backends!(fn rolled_back_jobs_publish_nothing);
async fn rolled_back_jobs_publish_nothing<DB: TestDb>() {
    let Some((pool, outbox)) = open::<DB>("rolled_back_jobs_publish_nothing").await else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let running = receiver().await;
    let relay = relay::<DB>(&outbox, sink(&running), quick());

    // A plain transaction that publishes, then rolls back.
    let mut tx = pool.begin().await.unwrap();
    outbox
        .publish_tx(&mut tx, &key("refund", 1), "refunds", &json!({"n": 1}))
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    // A guarded job that publishes, then fails.
    let job = key("refund", 2);
    let failed = guard
        .run(&job, async |conn| -> Result<(), JobError> {
            outbox
                .publish_tx(conn, &job, "refunds", &json!({"n": 2}))
                .await?;
            Err(JobError::msg("the job failed after publishing"))
        })
        .await;
    assert!(matches!(failed, Err(Error::Effect { .. })), "{failed:?}");

    assert_eq!(outbox.counts().await.unwrap(), counts(0, 0, 0));
    assert_eq!(relay.drain().await.unwrap(), RelayReport::default());
    assert!(running.provider().webhooks().is_empty());

    // The retry of the job commits, and its message goes.
    let outcome = guard
        .run(&job, async |conn| -> Result<(), JobError> {
            outbox
                .publish_tx(conn, &job, "refunds", &json!({"n": 2}))
                .await?;
            Ok(())
        })
        .await
        .unwrap();
    assert!(outcome.is_applied());
    assert_eq!(relay.drain().await.unwrap().delivered, 1);
    let webhooks = running.provider().webhooks();
    assert_eq!(webhooks.len(), 1);
    assert_eq!(webhooks[0].body, json!({"n": 2}));
}

backends!(fn committed_message_is_delivered_under_its_stable_id);
async fn committed_message_is_delivered_under_its_stable_id<DB: TestDb>() {
    let Some((pool, outbox)) =
        open::<DB>("committed_message_is_delivered_under_its_stable_id").await
    else {
        return;
    };
    let guard = Guard::new(pool.clone());
    guard.migrate().await.unwrap();
    let running = receiver().await;
    let relay = relay::<DB>(&outbox, sink(&running), quick());

    let job = key("invoice", 8812);
    let payload = json!({"order": 8812, "amount": 500.25, "tags": ["é", "\u{2028}"]});
    let outcome = guard
        .run(&job, async |conn| -> Result<String, JobError> {
            let id = outbox.publish_tx(conn, &job, "invoices", &payload).await?;
            Ok(id.to_string())
        })
        .await
        .unwrap();
    let Outcome::Applied(id) = outcome else {
        panic!("the first run applies: {outcome:?}");
    };
    assert_eq!(id, MessageId::new(&job, "invoices").unwrap().as_str());

    // The job running again publishes the same id and writes no second row.
    let again = outbox.publish(&job, "invoices", &payload).await.unwrap();
    assert_eq!(again.as_str(), id);
    assert_eq!(outbox.counts().await.unwrap(), counts(1, 0, 0));

    // A key outside printable ASCII still makes a valid header.
    let cafe = JobKey::new("invoice", ["café 7"]).unwrap();
    let cafe_id = outbox
        .publish(&cafe, "invoices", &json!({"order": 7}))
        .await
        .unwrap();

    assert_eq!(relay.drain().await.unwrap().delivered, 2);
    let webhooks = running.provider().webhooks();
    assert_eq!(webhooks.len(), 2, "{webhooks:?}");
    assert_eq!(webhooks[0].topic, "invoices");
    assert_eq!(webhooks[0].idempotency_key.as_deref(), Some(id.as_str()));
    assert_eq!(webhooks[0].body, payload);
    assert_eq!(
        webhooks[1].idempotency_key.as_deref(),
        Some(cafe_id.as_str())
    );
    assert_eq!(outbox.counts().await.unwrap(), counts(0, 2, 0));

    // Publishing again after delivery writes nothing and delivers nothing.
    assert_eq!(
        outbox
            .publish(&job, "invoices", &payload)
            .await
            .unwrap()
            .as_str(),
        id
    );
    assert_eq!(relay.drain().await.unwrap(), RelayReport::default());
    assert_eq!(running.provider().webhooks().len(), 2);
    let sent = outbox.list(Some(MessageState::Sent), 10).await.unwrap();
    let row = sent.iter().find(|row| row.id.as_str() == id).unwrap();
    assert_eq!((row.attempts, row.topic.as_str()), (1, "invoices"));
    assert!(row.sent_at.is_some());
}

backends!(fn same_id_with_another_payload_is_refused_and_nothing_is_written);
async fn same_id_with_another_payload_is_refused_and_nothing_is_written<DB: TestDb>() {
    let Some((pool, outbox)) =
        open::<DB>("same_id_with_another_payload_is_refused_and_nothing_is_written").await
    else {
        return;
    };
    let job = key("ship", 1);
    let id = outbox
        .publish(&job, "shipments", &json!({"v": 1}))
        .await
        .unwrap();
    let reused = outbox.publish(&job, "shipments", &json!({"v": 2})).await;
    assert!(
        matches!(&reused, Err(Error::MessageReused { id: reused }) if reused == id.as_str()),
        "{reused:?}"
    );

    // In the caller's transaction the refusal writes nothing, and the transaction goes on.
    let mut tx = pool.begin().await.unwrap();
    let reused = outbox
        .publish_tx(&mut tx, &job, "shipments", &json!({"v": 3}))
        .await;
    assert!(
        matches!(reused, Err(Error::MessageReused { .. })),
        "{reused:?}"
    );
    outbox
        .publish_tx(&mut tx, &key("ship", 2), "shipments", &json!({"v": 3}))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // The same key on another topic is another message.
    let other = outbox
        .publish(&job, "invoices", &json!({"v": 2}))
        .await
        .unwrap();
    assert_ne!(other, id);

    let refused = [
        outbox.publish(&job, "a/b", &json!({})).await,
        outbox.publish(&job, "", &json!({})).await,
        outbox.publish(&job, "..", &json!({})).await,
    ];
    for result in refused {
        assert!(
            matches!(result, Err(Error::InvalidTopic { .. })),
            "{result:?}"
        );
    }
    let nul = outbox
        .publish(&key("ship", 3), "t", &json!({"s": "a\0b"}))
        .await;
    assert!(matches!(nul, Err(Error::InvalidMessage { .. })), "{nul:?}");
    let huge = json!({"s": "x".repeat(MAX_PAYLOAD_BYTES)});
    let huge = outbox.publish(&key("ship", 4), "t", &huge).await;
    assert!(
        matches!(huge, Err(Error::InvalidMessage { .. })),
        "{huge:?}"
    );

    assert_eq!(outbox.counts().await.unwrap(), counts(3, 0, 0));
    let rows = outbox.list(None, 10).await.unwrap();
    let first = rows.iter().find(|row| row.id == id).unwrap();
    assert_eq!(first.payload, json!({"v": 1}));
}

backends!(fn order_per_topic_holds_through_retries);
async fn order_per_topic_holds_through_retries<DB: TestDb>() {
    let Some((_pool, outbox)) = open::<DB>("order_per_topic_holds_through_retries").await else {
        return;
    };
    let running = receiver().await;
    let published = publish_interleaved::<DB>(&outbox, &["alpha", "beta", "gamma"], 0..40).await;
    // The receiver answers 503 to the next 7 requests: heads of topics back off and retry.
    running.provider().fail_next_webhooks(7);
    let config = RelayConfig {
        batch_size: 25,
        concurrency: 3,
        ..quick()
    };
    let relay = relay::<DB>(&outbox, sink(&running), config);

    let report = run_until_received::<DB>(&relay, running.provider(), 120).await;

    let webhooks = running.provider().webhooks();
    assert_eq!(first_receipts(&webhooks), published);
    assert_eq!(webhooks.len(), 120, "one relay, no crash: no duplicates");
    assert_eq!(
        report,
        RelayReport {
            delivered: 120,
            retried: 7,
            dead: 0
        }
    );
    assert_eq!(outbox.counts().await.unwrap(), counts(0, 120, 0));
    let rows = outbox.list(None, 1000).await.unwrap();
    let attempts: i32 = rows.iter().map(|row| row.attempts).sum();
    assert_eq!(attempts, 120 + 7, "every 503 was one more attempt");
    assert!(
        rows.iter()
            .any(|row| row.last_error.as_deref().is_some_and(|e| e.contains("503")))
    );
}

backends!(fn poison_message_is_dead_lettered_and_its_topic_goes_on);
async fn poison_message_is_dead_lettered_and_its_topic_goes_on<DB: TestDb>() {
    let Some((_pool, outbox)) =
        open::<DB>("poison_message_is_dead_lettered_and_its_topic_goes_on").await
    else {
        return;
    };
    let running = receiver().await;
    let relay = relay::<DB>(&outbox, sink(&running), quick());
    let m1 = outbox
        .publish(&key("o", 1), "orders", &json!({"n": 1}))
        .await
        .unwrap();
    let poison = json!({"n": 2, "reject": true});
    let m2 = outbox
        .publish(&key("o", 2), "orders", &poison)
        .await
        .unwrap();
    let m3 = outbox
        .publish(&key("o", 3), "orders", &json!({"n": 3}))
        .await
        .unwrap();
    let o1 = outbox
        .publish(&key("o", 1), "other", &json!({"n": 1}))
        .await
        .unwrap();

    let report = relay.drain().await.unwrap();
    assert_eq!(
        report,
        RelayReport {
            delivered: 3,
            retried: 0,
            dead: 1
        }
    );
    let expected = ByTopic::from([
        ("orders".into(), vec![m1.to_string(), m3.to_string()]),
        ("other".into(), vec![o1.to_string()]),
    ]);
    assert_eq!(first_receipts(&running.provider().webhooks()), expected);
    assert_eq!(outbox.counts().await.unwrap(), counts(0, 3, 1));
    let dead = outbox.list(Some(MessageState::Dead), 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((&dead[0].id, dead[0].attempts), (&m2, 1));
    assert_eq!(dead[0].payload, poison);
    let error = dead[0].last_error.as_deref().unwrap_or_default();
    assert!(error.contains("422"), "{error}");

    // Replayed, it is delivered again, and refused again.
    let replayed = outbox.replay_dead(Some(&m2)).await.unwrap();
    assert_eq!(replayed, std::slice::from_ref(&m2));
    assert_eq!(outbox.counts().await.unwrap(), counts(1, 3, 0));
    assert_eq!(relay.drain().await.unwrap().dead, 1);
    assert_eq!(outbox.replay_dead(None).await.unwrap(), [m2]);
}

backends!(fn sink_down_loses_nothing);
async fn sink_down_loses_nothing<DB: TestDb>() {
    let Some((_pool, outbox)) = open::<DB>("sink_down_loses_nothing").await else {
        return;
    };
    // A port nothing listens on: connections are refused.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let sink = WebhookSink::new(&webhooks_url(&format!("http://{addr}"))).unwrap();
    let relay = relay::<DB>(&outbox, sink, quick());
    let published = publish_interleaved::<DB>(&outbox, &["a", "b"], 0..5).await;

    let report = relay.run_once().await.unwrap();
    assert_eq!(
        report,
        RelayReport {
            delivered: 0,
            retried: 2,
            dead: 0
        },
        "each topic's head fails and holds back the rest"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(relay.run_once().await.unwrap().delivered, 0);
    assert_eq!(outbox.counts().await.unwrap(), counts(10, 0, 0));
    let pending = outbox.list(Some(MessageState::Pending), 100).await.unwrap();
    let failed: Vec<_> = pending.iter().filter(|row| row.attempts > 0).collect();
    assert_eq!(failed.len(), 2, "{pending:?}");
    assert!(failed.iter().all(|row| row.last_error.is_some()));

    // The receiver comes back on the same address.
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let provider = Provider::new(ProviderConfig::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(provider.clone().serve(listener, async {
        let _ = stopped.await;
    }));

    run_until_received::<DB>(&relay, &provider, 10).await;
    assert_eq!(first_receipts(&provider.webhooks()), published);
    assert_eq!(outbox.counts().await.unwrap(), counts(0, 10, 0));
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

backends!(fn two_relays_deliver_everything_in_order, worker_threads = 4);
async fn two_relays_deliver_everything_in_order<DB: TestDb>() {
    let Some((pool, outbox)) = open::<DB>("two_relays_deliver_everything_in_order").await else {
        return;
    };
    let running = receiver().await;
    let topics = ["t1", "t2", "t3", "t4"];
    let mut published = publish_interleaved::<DB>(&outbox, &topics, 0..30).await;
    // Two relays as two processes would run them: each its own outbox handle and lease token.
    let first = relay::<DB>(&Outbox::new(pool.clone()), sink(&running), quick());
    let second = relay::<DB>(&Outbox::new(pool.clone()), sink(&running), quick());
    let provider = running.provider().clone();

    // More messages arrive while the relays run, and the first relay stops half way.
    let publisher = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        publish_interleaved::<DB>(&outbox, &topics, 30..50).await
    };
    let (first_report, second_report, more) = tokio::join!(
        first.run(received(provider.clone(), 100)),
        run_until_received::<DB>(&second, &provider, 200),
        publisher,
    );
    for (topic, ids) in more {
        published.entry(topic).or_default().extend(ids);
    }
    let first_report = first_report.unwrap();

    assert_eq!(first_receipts(&provider.webhooks()), published);
    assert!(
        first_report.delivered + second_report.delivered >= 200,
        "{first_report:?} {second_report:?}"
    );
    assert_eq!(outbox.counts().await.unwrap(), counts(0, 200, 0));
}

backends!(fn one_relay_holds_the_lease_at_a_time);
async fn one_relay_holds_the_lease_at_a_time<DB: TestDb>() {
    let Some((pool, outbox)) = open::<DB>("one_relay_holds_the_lease_at_a_time").await else {
        return;
    };
    let running = receiver().await;
    // `quick()` leases for 2 s: long enough for the steps below on a slow machine.
    let first = relay::<DB>(&outbox, sink(&running), quick());
    let second = relay::<DB>(&Outbox::new(pool.clone()), sink(&running), quick());
    outbox.publish(&key("l", 1), "t", &json!({})).await.unwrap();

    assert_eq!(first.run_once().await.unwrap().delivered, 1);
    outbox.publish(&key("l", 2), "t", &json!({})).await.unwrap();
    for result in [second.run_once().await, second.drain().await] {
        assert!(
            matches!(&result, Err(Error::RelayLeaseHeld { table }) if table == "jobguard_outbox"),
            "{result:?}"
        );
    }
    assert_eq!(outbox.counts().await.unwrap(), counts(1, 1, 0));

    // Draining lets go of the lease: the other relay takes it at once.
    assert_eq!(first.drain().await.unwrap().delivered, 1);
    assert_eq!(second.run_once().await.unwrap(), RelayReport::default());
    assert!(matches!(
        first.run_once().await,
        Err(Error::RelayLeaseHeld { .. })
    ));

    // A relay that stopped renewing loses the lease when it runs out.
    tokio::time::sleep(quick().lease + Duration::from_millis(500)).await;
    assert!(first.run_once().await.is_ok());
    assert_eq!(running.provider().webhooks().len(), 2);
}

backends!(fn an_outbox_on_a_table_of_its_own);
async fn an_outbox_on_a_table_of_its_own<DB: TestDb>() {
    let Some((pool, _outbox)) = open::<DB>("an_outbox_on_a_table_of_its_own").await else {
        return;
    };
    let running = receiver().await;
    let table = TableName::new("events").unwrap();
    let events = Outbox::with_table(pool.clone(), table).unwrap();
    events.migrate().await.unwrap();
    events
        .publish(&key("e", 1), "t", &json!({"e": 1}))
        .await
        .unwrap();
    assert_eq!(events.counts().await.unwrap(), counts(1, 0, 0));
    assert_eq!(
        Outbox::new(pool.clone()).counts().await.unwrap(),
        counts(0, 0, 0)
    );
    let report = relay::<DB>(&events, sink(&running), quick())
        .drain()
        .await
        .unwrap();
    assert_eq!(report.delivered, 1);

    let schema = schema_name("pg_o_an_outbox_on_a_table_of_its_own");
    let qualified = TableName::new("events2")
        .unwrap()
        .in_schema(&schema)
        .unwrap();
    let qualified = Outbox::with_table(pool.clone(), qualified);
    if DB::BACKEND == "sqlite" {
        assert!(
            matches!(qualified, Err(Error::InvalidName { .. })),
            "{qualified:?}"
        );
        return;
    }
    let qualified = qualified.unwrap();
    qualified.migrate().await.unwrap();
    qualified
        .publish(&key("e", 2), "t", &json!({"e": 2}))
        .await
        .unwrap();
    let report = relay::<DB>(&qualified, sink(&running), quick())
        .drain()
        .await
        .unwrap();
    assert_eq!(report.delivered, 1);
    assert_eq!(running.provider().webhooks().len(), 2);
}

backends!(fn prune_deletes_only_old_sent_messages);
async fn prune_deletes_only_old_sent_messages<DB: TestDb>() {
    let Some((_pool, outbox)) = open::<DB>("prune_deletes_only_old_sent_messages").await else {
        return;
    };
    let running = receiver().await;
    publish_interleaved::<DB>(&outbox, &["t"], 0..2).await;
    assert_eq!(
        relay::<DB>(&outbox, sink(&running), quick())
            .drain()
            .await
            .unwrap()
            .delivered,
        2
    );
    outbox.publish(&key("p", 9), "t", &json!({})).await.unwrap();

    assert_eq!(
        outbox.prune_sent(Duration::from_secs(3600)).await.unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(outbox.prune_sent(Duration::ZERO).await.unwrap(), 2);
    assert_eq!(outbox.counts().await.unwrap(), counts(1, 0, 0));
}
