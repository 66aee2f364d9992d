//! The demo's naive consumer on Kafka: a group member that appends every message's credit and
//! then commits Kafka's offset, as an at-least-once Kafka consumer does. Killed between the two,
//! its message is read again by the next member and credited again.

use std::time::Duration;

use anyhow::Context as _;
use jobguard::broker::Envelope;
use jobguard::broker::kafka::bootstrap_servers;
use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::Message as _;
use sqlx::Pool;

use super::ledger::{self, LedgerDb};
use crate::broker::Endpoint;
use crate::builtin_jobs::{Credit, Example};
use crate::crash_point::{CRASH_POINT, report_line};

/// Consumes `endpoint`'s topic in its group, crediting the naive ledger for every message and
/// committing its offset after; returns after `expected` messages. With `crash`, it prints
/// [`CRASH_POINT`] after its first credit and waits to be killed, never committing.
pub async fn naive_consumer<DB: LedgerDb>(
    pool: &Pool<DB>,
    endpoint: &Endpoint,
    expected: usize,
    crash: bool,
) -> anyhow::Result<usize> {
    let config = endpoint.kafka();
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap_servers(&endpoint.url)?)
        .set("group.id", &config.group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set(
            "session.timeout.ms",
            config.session_timeout.as_millis().to_string(),
        )
        .set("log_level", "4")
        .create()
        .context("connect the naive consumer to Kafka")?;
    consumer.subscribe(&[&endpoint.queue])?;
    let mut consumed = 0;
    while consumed < expected {
        let message = tokio::time::timeout(Duration::from_secs(120), consumer.recv())
            .await
            .context("no message from Kafka for two minutes")??;
        let envelope = Envelope::from_bytes(message.payload().unwrap_or_default())?;
        let credit: Credit = serde_json::from_value(envelope.payload)?;
        ledger::credit_naive(pool, &credit).await?;
        if crash {
            report_line(&format!("{CRASH_POINT} {}", credit.job_key()?));
            std::future::pending::<()>().await;
        }
        consumer.commit_message(&message, CommitMode::Async)?;
        consumed += 1;
    }
    let _ = consumer.commit_consumer_state(CommitMode::Sync);
    Ok(consumed)
}
