//! `jobguard relay` and `jobguard worker --relay-webhook-url` as real processes, delivering to
//! a real HTTP receiver (`jobguard-provider`).
//!
//! The main scenario kills a relay with SIGKILL in the middle of its work, after some but not
//! all of 300 messages were received, then runs `jobguard relay --once`: every message must be
//! received at least once, under its id, with each topic's first receipts in publish order, and
//! nothing may be left pending. Each scenario runs on a fresh SQLite file, and on a fresh
//! PostgreSQL schema when PostgreSQL answers. Every wait has a deadline and every child process
//! is killed when its guard is dropped, so a failing test fails instead of hanging.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use jobguard::outbox::{Outbox, OutboxCounts};
use jobguard::{Backend, JobKey};
use jobguard_provider::{Provider, ProviderConfig, RunningProvider};
use serde_json::json;

use crate::common::{COMMAND_TIMEOUT, Db};
use crate::{each_backend, on_pool};

/// Per topic, message ids in publish order or in order of first receipt.
type ByTopic = BTreeMap<String, Vec<String>>;

/// The test's database and the webhook receiver, served by the database's runtime.
struct Env<'db> {
    db: &'db Db,
    receiver: Option<RunningProvider>,
}

impl std::ops::Deref for Env<'_> {
    type Target = Db;

    fn deref(&self) -> &Db {
        self.db
    }
}

impl<'db> Env<'db> {
    fn new(db: &'db Db) -> Env<'db> {
        Env { db, receiver: None }
    }

    /// Starts the webhook receiver, each webhook taking `latency` to be recorded; returns the
    /// relay's `--webhook-url`.
    fn start_receiver(&mut self, latency: Duration) -> String {
        let config = ProviderConfig {
            webhook_latency: latency,
            ..ProviderConfig::default()
        };
        let running = self
            .db
            .block_on(Provider::start(config))
            .expect("start the receiver");
        let url = format!("{}/v1/webhooks", running.url());
        self.receiver = Some(running);
        url
    }

    fn provider(&self) -> &Provider {
        self.receiver.as_ref().expect("a receiver").provider()
    }

    /// Publishes `per_topic` messages to each topic, interleaved, through the library.
    fn publish(&self, topics: &[&str], per_topic: usize) -> ByTopic {
        async fn publish_all<DB: Backend>(
            outbox: Outbox<DB>,
            topics: &[&str],
            per_topic: usize,
        ) -> ByTopic {
            outbox.migrate().await.unwrap();
            let mut published = ByTopic::new();
            for n in 0..per_topic {
                let key = JobKey::new("notify", [format!("order-{n}")]).unwrap();
                for topic in topics {
                    let id = outbox
                        .publish(&key, topic, &json!({"order": n, "topic": topic}))
                        .await
                        .unwrap();
                    published
                        .entry(topic.to_string())
                        .or_default()
                        .push(id.to_string());
                }
            }
            published
        }
        on_pool!(self.db, |pool| publish_all(
            Outbox::new(pool.clone()),
            topics,
            per_topic
        ))
    }

    fn counts(&self) -> OutboxCounts {
        on_pool!(self.db, |pool| Outbox::new(pool.clone()).counts()).expect("count the outbox")
    }
}

impl Drop for Env<'_> {
    fn drop(&mut self) {
        if let Some(receiver) = self.receiver.take() {
            self.db.block_on(receiver.stop());
        }
    }
}

/// The ids each topic received, in the order of their first receipt.
fn first_receipts(provider: &Provider) -> ByTopic {
    let mut seen = HashSet::new();
    let mut topics = ByTopic::new();
    for delivery in provider.webhooks() {
        let id = delivery
            .idempotency_key
            .expect("every delivery carries an Idempotency-Key");
        if seen.insert(id.clone()) {
            topics.entry(delivery.topic).or_default().push(id);
        }
    }
    topics
}

fn distinct(provider: &Provider) -> usize {
    first_receipts(provider).values().map(Vec::len).sum()
}

/// 300 messages; a relay killed with SIGKILL after some were received; `relay --once` after it.
fn killed_relay_loses_nothing(db: &Db) {
    let mut env = Env::new(db);
    let webhook_url = env.start_receiver(Duration::from_millis(8));
    let topics = ["invoices", "refunds", "shipments"];
    let published = env.publish(&topics, 100);
    assert_eq!(env.counts().pending, 300);

    let relay_args = [
        "relay",
        "--webhook-url",
        &webhook_url,
        "--batch",
        "50",
        "--poll",
        "50ms",
        "--lease",
        "1s",
        "--json",
    ];
    let mut relay = env.spawn("relay", &relay_args);
    let started = Instant::now();
    while distinct(env.provider()) < 60 {
        assert!(relay.running(), "the relay exited before it was killed");
        assert!(
            started.elapsed() < COMMAND_TIMEOUT,
            "the relay delivered {} messages in {COMMAND_TIMEOUT:?}",
            distinct(env.provider())
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    relay.sigkill();
    let before = distinct(env.provider());
    assert!(
        before < 300,
        "the relay was killed after it had delivered everything"
    );
    let left = env.counts();
    assert!(left.pending > 0, "{left:?}");

    let mut once = relay_args.to_vec();
    once.push("--once");
    let report = env.spawn("relay-once", &once).finish_json(COMMAND_TIMEOUT);
    assert_eq!(
        report["outbox"],
        json!({"pending": 0, "sent": 300, "dead": 0}),
        "{report}"
    );
    assert!(
        report["delivered"].as_u64().unwrap() >= 300 - before as u64,
        "{report}"
    );

    let received = first_receipts(env.provider());
    assert_eq!(
        received, published,
        "every message, each topic in publish order"
    );
    let total = env.provider().webhooks().len();
    eprintln!(
        "{} messages received before SIGKILL, {} received again after it",
        before,
        total - 300
    );
    assert_eq!(
        env.counts(),
        OutboxCounts {
            pending: 0,
            sent: 300,
            dead: 0
        }
    );
}

each_backend!(killed_relay_loses_nothing);

/// A worker with `--relay-webhook-url --until-idle` delivers what was published before it stops.
fn worker_relays_in_process(db: &Db) {
    let mut env = Env::new(db);
    let webhook_url = env.start_receiver(Duration::ZERO);
    let published = env.publish(&["invoices", "refunds"], 5);
    let args = [
        "worker",
        "--until-idle",
        "--poll",
        "50ms",
        "--relay-webhook-url",
        &webhook_url,
        "--json",
    ];
    let report = env.spawn("worker", &args).finish_json(COMMAND_TIMEOUT);
    assert_eq!(
        report["relay"],
        json!({"delivered": 10, "retried": 0, "dead": 0}),
        "{report}"
    );
    assert_eq!(first_receipts(env.provider()), published);
    assert_eq!(
        env.counts(),
        OutboxCounts {
            pending: 0,
            sent: 10,
            dead: 0
        }
    );
}

each_backend!(worker_relays_in_process);

#[test]
fn bad_relay_flags_are_refused_before_connecting() {
    let env = Db::sqlite("relay::flags");
    for (args, expected) in [
        (
            vec!["relay", "--webhook-url", "ftp://x/y", "--once"],
            "webhook URL",
        ),
        (
            vec!["relay", "--webhook-url", "http://x/y", "--lease", "10ms"],
            "relay lease",
        ),
    ] {
        let mut proc = env.spawn("flags", &args);
        let exit = proc.wait(COMMAND_TIMEOUT).expect("exits");
        assert!(
            !exit.status.success(),
            "{args:?} succeeded: {}",
            exit.stdout
        );
        assert!(exit.stderr.contains(expected), "{args:?}: {}", exit.stderr);
    }
}
