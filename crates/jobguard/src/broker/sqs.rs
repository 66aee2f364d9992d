//! Amazon SQS with aws-sdk-sqs: a [`Source`] long-polling a queue, with the visibility timeout
//! extended while a job runs, `DeleteMessage` after the commit, `ApproximateReceiveCount` as
//! the delivery count and a dead-letter queue, and [`SqsSink`], the outbox's sink, sending with
//! `MessageDeduplicationId` on FIFO queues.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use jobguard::broker::sqs::{SqsConfig, SqsSink, SqsSource};
//! use jobguard::broker::{Consumer, Envelope};
//! use jobguard::{Job, JobError, JobKey, KeyError, PgGuard};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Credit { order: String, account: i64, amount: i64 }
//!
//! impl Job<sqlx::Postgres> for Credit {
//!     const KIND: &'static str = "credit";
//!     fn key(&self) -> Result<JobKey, KeyError> { JobKey::new("credit", [&self.order]) }
//!     async fn run(&self, conn: &mut sqlx::PgConnection) -> Result<(), JobError> {
//!         sqlx::query("insert into ledger (account, amount) values ($1, $2)")
//!             .bind(self.account).bind(self.amount).execute(conn).await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
//! // Any SQS endpoint: a local server here, `https://sqs.<region>.amazonaws.com` in AWS.
//! let url = "http://127.0.0.1:9324";
//! let config = SqsConfig {
//!     visibility_timeout: Duration::from_secs(60),
//!     ..SqsConfig::new("credits")
//! };
//! // The consumer declares the queue and its dead-letter queue when missing.
//! let source = SqsSource::connect(url, config.clone()).await?;
//!
//! // The producer.
//! let credit = Credit { order: "order-8812".into(), account: 7, amount: 500 };
//! let sink = SqsSink::connect(url)?;
//! sink.publish(&config.queue, &Envelope::for_job::<sqlx::Postgres, _>(&credit)?).await?;
//!
//! // A consumer, in as many processes as needed.
//! let consumer = Consumer::new(PgGuard::new(pool)).register::<Credit>();
//! consumer.migrate().await?;
//! let stats = consumer.run(source, jobguard::worker::shutdown_signal()).await?;
//! println!("{} applied, {} duplicates", stats.applied, stats.duplicates);
//! # Ok(()) }
//! ```
//!
//! # Topology
//!
//! [`declare`] (run by [`SqsSource::connect`] unless [`SqsConfig::declare`] is off) creates,
//! when missing, the dead-letter queue [`SqsConfig::dead_letter_queue`] and the queue
//! [`SqsConfig::queue`] with a redrive policy to it after
//! [`max_deliveries`](SqsConfig::max_deliveries) receives. A queue whose name ends in `.fifo`
//! is a FIFO queue, and so is its dead-letter queue.
//!
//! A source on a queue that has a redrive policy of its own dead-letters to the policy's
//! target and counts against the smaller of its `maxReceiveCount` and
//! [`max_deliveries`](SqsConfig::max_deliveries); a queue without one dead-letters to
//! [`SqsConfig::dead_letter_queue`], which must exist.
//!
//! # How messages are settled
//!
//! | the job | the message |
//! |---|---|
//! | running | `ChangeMessageVisibility` back to the full visibility timeout every third of it, so it is not received by another consumer meanwhile |
//! | committed, or its key was already applied | `DeleteMessage` after the commit; `DeleteMessageBatch` for a committed batch |
//! | failed, retryable, deliveries left | `ChangeMessageVisibility` to the retry delay: received again after it |
//! | failed on the last delivery, fatal, or the message cannot run | sent to the dead-letter queue with why (`Jobguard-Dead-Reason`), then deleted |
//!
//! SQS counts the receives of each message (`ApproximateReceiveCount`), which is the delivery
//! count the consumer goes by. A message whose consumers died running it on every allowed
//! delivery is moved to the dead-letter queue by SQS itself, by the redrive policy, when it
//! would be received once more; without one, the consumer that receives it past
//! [`max_deliveries`](SqsConfig::max_deliveries) dead-letters it without running it.
//!
//! # FIFO queues
//!
//! [`SqsSink::publish`] sends a job to a FIFO queue with its job key as
//! `MessageDeduplicationId`, so a job published again within SQS's five-minute deduplication
//! window is stored once, and as `MessageGroupId` unless a group is given
//! ([`SqsSink::publish_in_group`]): jobs that must not run at once or out of order (the credits
//! of one account) share a group. Outside the window the guard deduplicates.
//!
//! One `ReceiveMessage` can hand over several messages of a group at once. The consumer runs
//! them one at a time, in the order received, each in its own transaction once the one before
//! it was deleted or dead-lettered, extending the visibility of those waiting behind it; the
//! messages of other groups run alongside. A failed job's message, given back with the retry
//! delay, holds its group: the messages behind it are given back at once without running, and
//! since SQS hands out nothing of a group while one of its messages is in flight, they come
//! again after it, until it succeeds or is dead-lettered. Each such give-back is a receive that
//! counts toward `maxReceiveCount` (and [`max_deliveries`](SqsConfig::max_deliveries)), so a
//! FIFO queue whose jobs fail now and then wants deliveries to spare. Messages of a FIFO queue
//! never run in batches ([`ConsumerConfig::batch_size`](super::ConsumerConfig::batch_size)).
//!
//! # A delete after the visibility timeout
//!
//! A job that outlives the visibility timeout without extending it (a consumer that stalled)
//! has its message received by another consumer while it still runs. SQS may then take the
//! first consumer's delete, or ignore it; either way the guard, not the delete, carries the
//! guarantee: the second delivery waits on the guard row and reports a duplicate.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName,
    QueueAttributeName,
};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};

mod queue;
mod sink;

use self::queue::{RedrivePolicy, attribute, queue_url};
pub use self::queue::{SqsConfig, declare, remove};
pub use self::sink::{SqsSink, queue_name};
use super::consumer::{Delivery, Source};
use crate::error::{Error, Result};
use jobguard_core::url::redact;

const BROKER: &str = "sqs";

/// How long [`SqsSource::receive`](Source::receive) long-polls for a first message.
const POLL: Duration = Duration::from_secs(1);

/// The most messages one `ReceiveMessage` or `DeleteMessageBatch` takes.
const SQS_BATCH: usize = 10;

/// The longest visibility timeout SQS allows: 12 hours.
const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);

/// The message attribute a message's id is sent in by [`SqsSink`].
pub const MESSAGE_ID_ATTRIBUTE: &str = "Jobguard-Message-Id";
/// The message attribute a dead letter says why in.
pub const DEAD_REASON_ATTRIBUTE: &str = "Jobguard-Dead-Reason";
/// The message attribute a dead letter names the queue it came from in.
pub const DEAD_QUEUE_ATTRIBUTE: &str = "Jobguard-Dead-Queue";

/// An SQS client for the endpoint `url` (`http://127.0.0.1:9324` for a local server, or
/// `https://sqs.<region>.amazonaws.com`), signing with the credentials in
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` and the region in
/// `AWS_REGION` or `AWS_DEFAULT_REGION`. Without them it signs with a placeholder key in
/// `us-east-1`, which local servers accept. TLS is rustls on ring.
///
/// A client of the caller's ([`SqsSource::on`], [`SqsSink::on`]) can be built with
/// `aws-config` and its whole credential chain instead.
pub fn client(url: &str) -> Result<Client> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(Error::InvalidConfig {
            setting: "SQS URL",
            reason: format!(
                "{} is not an http:// or https:// endpoint, such as http://127.0.0.1:9324",
                redact(url)
            ),
        });
    }
    let env = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
    let region = env("AWS_REGION")
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|| "us-east-1".to_owned());
    let credentials = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        (Some(id), Some(secret)) => {
            Credentials::new(id, secret, env("AWS_SESSION_TOKEN"), None, "environment")
        }
        _ => Credentials::new("jobguard", "jobguard", None, None, "placeholder"),
    };
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(5))
        // A long poll takes up to 20 s.
        .operation_attempt_timeout(Duration::from_secs(30))
        .build();
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(url)
        .region(Region::new(region))
        .credentials_provider(credentials)
        .http_client(http)
        .timeout_config(timeouts)
        .build();
    Ok(Client::from_conf(config))
}

/// Long-polls an SQS queue, for a [`Consumer`](super::Consumer).
pub struct SqsSource {
    client: Client,
    config: SqsConfig,
    queue: Arc<Queues>,
    visibility: i32,
}

/// The URLs a delivery settles through.
#[derive(Debug)]
struct Queues {
    name: String,
    url: String,
    dead_letters: String,
    fifo: bool,
}

impl SqsSource {
    /// Connects to the endpoint `url` (see [`client`]), creates the queues unless told not to,
    /// and consumes from the first receive.
    pub async fn connect(url: &str, config: SqsConfig) -> Result<Self> {
        Self::on(client(url)?, config).await
    }

    /// Consumes through a client of the caller's.
    pub async fn on(client: Client, mut config: SqsConfig) -> Result<Self> {
        config.check()?;
        let url = if config.declare {
            declare(&client, &config).await?
        } else {
            queue_url(&client, &config.queue).await?.ok_or_else(|| {
                refused(
                    format!("find the queue `{}`", config.queue),
                    "there is no such queue (let jobguard declare it, or create it)",
                )
            })?
        };
        let policy = attribute(&client, &url, QueueAttributeName::RedrivePolicy)
            .await?
            .and_then(|policy| RedrivePolicy::parse(&policy));
        let dead_letter_queue = match &policy {
            Some(policy) => {
                config.max_deliveries = config.max_deliveries.min(policy.max_receive_count);
                policy.dead_letter_queue().to_owned()
            }
            None => config.dead_letter_queue.clone(),
        };
        let dead_letters = queue_url(&client, &dead_letter_queue)
            .await?
            .ok_or_else(|| {
                refused(
                    format!("find the dead-letter queue `{dead_letter_queue}`"),
                    "there is no such queue",
                )
            })?;
        let queue = Arc::new(Queues {
            name: config.queue.clone(),
            url,
            dead_letters,
            fifo: config.is_fifo(),
        });
        let visibility = config.visibility_seconds()?;
        Ok(SqsSource {
            client,
            config,
            queue,
            visibility,
        })
    }

    /// The queue's URL.
    pub fn queue_url(&self) -> &str {
        &self.queue.url
    }
}

impl SqsSource {
    /// One `ReceiveMessage` of up to `max` messages (at most ten), long-polling up to `wait`.
    async fn receive_once(&self, max: usize, wait: Duration) -> Result<Vec<SqsDelivery>> {
        let wait = seconds(wait.min(Duration::from_secs(20)));
        let received = self
            .client
            .receive_message()
            .queue_url(&self.queue.url)
            .max_number_of_messages(i32::try_from(max.clamp(1, SQS_BATCH)).unwrap_or(1))
            .visibility_timeout(self.visibility)
            .wait_time_seconds(wait)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .send()
            .await
            .map_err(|error| broker_error(format!("receive from `{}`", self.queue.name), error))?;
        let mut deliveries = Vec::new();
        for message in received.messages.unwrap_or_default() {
            let Some(receipt) = message.receipt_handle else {
                continue;
            };
            let attributes = message.attributes.unwrap_or_default();
            let attempt = attributes
                .get(&MessageSystemAttributeName::ApproximateReceiveCount)
                .and_then(|count| count.parse::<u32>().ok())
                .unwrap_or(1)
                .max(1);
            deliveries.push(SqsDelivery {
                client: self.client.clone(),
                queue: Arc::clone(&self.queue),
                body: message.body.unwrap_or_default(),
                message_id: message.message_id.unwrap_or_default(),
                receipt,
                attempt,
                group: attributes
                    .get(&MessageSystemAttributeName::MessageGroupId)
                    .cloned(),
                visibility: self.visibility,
            });
        }
        Ok(deliveries)
    }
}

impl Source for SqsSource {
    type Delivery = SqsDelivery;

    super::consumer::source_settings!(visibility_timeout);

    async fn receive(&mut self, max: usize) -> Result<Vec<SqsDelivery>> {
        self.receive_within(max, POLL).await
    }

    async fn receive_within(&mut self, max: usize, wait: Duration) -> Result<Vec<SqsDelivery>> {
        // SQS hands out at most ten messages a call: more are asked for without waiting, as
        // long as full answers come back.
        let mut deliveries = self.receive_once(max, wait).await?;
        while deliveries.len() < max && deliveries.len() % SQS_BATCH == 0 && !deliveries.is_empty()
        {
            let more = self
                .receive_once(max - deliveries.len(), Duration::ZERO)
                .await?;
            let full = more.len() == SQS_BATCH;
            deliveries.extend(more);
            if !full {
                break;
            }
        }
        Ok(deliveries)
    }

    async fn close(self) {
        // Messages received and not deleted are received again after their visibility
        // timeout.
    }
}

/// A message from an [`SqsSource`].
pub struct SqsDelivery {
    client: Client,
    queue: Arc<Queues>,
    body: String,
    message_id: String,
    receipt: String,
    attempt: u32,
    /// The message's `MessageGroupId`, on a FIFO queue.
    group: Option<String>,
    visibility: i32,
}

impl SqsDelivery {
    async fn change_visibility(&self, seconds: i32) -> Result<()> {
        self.client
            .change_message_visibility()
            .queue_url(&self.queue.url)
            .receipt_handle(&self.receipt)
            .visibility_timeout(seconds)
            .send()
            .await
            .map_err(|error| broker_error("change a message's visibility".into(), error))?;
        Ok(())
    }
}

impl Delivery for SqsDelivery {
    fn body(&self) -> &[u8] {
        self.body.as_bytes()
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    async fn ack(self) -> Result<()> {
        self.client
            .delete_message()
            .queue_url(&self.queue.url)
            .receipt_handle(&self.receipt)
            .send()
            .await
            .map_err(|error| broker_error("delete a message".into(), error))?;
        Ok(())
    }

    async fn ack_all(deliveries: Vec<Self>) -> Result<()> {
        // One `DeleteMessageBatch` per ten messages of a queue.
        let mut by_queue: HashMap<String, Vec<SqsDelivery>> = HashMap::new();
        for delivery in deliveries {
            by_queue
                .entry(delivery.queue.url.clone())
                .or_default()
                .push(delivery);
        }
        let mut deleted = Ok(());
        for (url, deliveries) in by_queue {
            for chunk in deliveries.chunks(SQS_BATCH) {
                let entries = chunk.iter().enumerate().map(|(n, delivery)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(n.to_string())
                        .receipt_handle(&delivery.receipt)
                        .build()
                        .expect("an id and a receipt handle")
                });
                let outcome = chunk[0]
                    .client
                    .delete_message_batch()
                    .queue_url(&url)
                    .set_entries(Some(entries.collect()))
                    .send()
                    .await;
                let failure = match outcome {
                    Ok(output) => output.failed().first().map(|failed| {
                        refused(
                            format!(
                                "delete {} of a batch of {} messages",
                                output.failed().len(),
                                chunk.len()
                            ),
                            &format!("{}: {}", failed.code(), failed.message().unwrap_or("")),
                        )
                    }),
                    Err(error) => Some(broker_error("delete a batch of messages".into(), error)),
                };
                if let (Some(error), Ok(())) = (failure, &deleted) {
                    deleted = Err(error);
                }
            }
        }
        deleted
    }

    async fn retry(self, delay: Duration) -> Result<()> {
        // Invisible for the delay, then any consumer's next receive takes it.
        self.change_visibility(seconds(delay.min(MAX_VISIBILITY)))
            .await
    }

    async fn dead_letter(self, reason: String) -> Result<()> {
        // Attribute values are at most a few hundred characters here: the reason, cut.
        let reason: String = reason.chars().take(1000).collect();
        let mut send = self
            .client
            .send_message()
            .queue_url(&self.queue.dead_letters)
            .message_body(&self.body)
            .message_attributes(DEAD_REASON_ATTRIBUTE, string_attribute(&reason))
            .message_attributes(DEAD_QUEUE_ATTRIBUTE, string_attribute(&self.queue.name));
        if self.queue.fifo {
            // A consumer that dies between the send and the delete sends it again: stored once.
            send = send
                .message_group_id(self.group.as_deref().unwrap_or("dead"))
                .message_deduplication_id(sqs_id(&format!("dead:{}", self.message_id)));
        }
        send.send().await.map_err(|error| {
            broker_error(
                format!("send a dead letter to {}", self.queue.dead_letters),
                error,
            )
        })?;
        self.ack().await
    }

    async fn progress(&self) -> Result<()> {
        self.change_visibility(self.visibility).await
    }

    fn order_group(&self) -> Option<&str> {
        // A standard queue keeps a group id it was sent with, but promises no order by it.
        self.group.as_deref().filter(|_| self.queue.fifo)
    }
}

/// `id` as a `MessageDeduplicationId` or `MessageGroupId`: itself when SQS takes it (at most
/// 128 printable ASCII characters), else `b3:` and its BLAKE3 hash, the same for the same id.
fn sqs_id(id: &str) -> String {
    if !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_graphic()) {
        id.to_owned()
    } else {
        format!("b3:{}", blake3::hash(id.as_bytes()).to_hex())
    }
}

fn string_attribute(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .expect("a data type")
}

/// Whole seconds, rounded up: a delay or timeout is never shorter than asked.
fn seconds(duration: Duration) -> i32 {
    let whole = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    i32::try_from(whole).unwrap_or(i32::MAX)
}

/// An SDK error with its whole chain in its message: the SDK's own says only "service error".
#[derive(Debug)]
struct SdkFailure(String);

impl SdkFailure {
    fn of(error: &(impl std::error::Error + 'static)) -> Self {
        SdkFailure(DisplayErrorContext(error).to_string())
    }
}

impl std::fmt::Display for SdkFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SdkFailure {}

/// An SDK call that failed.
fn broker_error(action: String, error: impl std::error::Error + 'static) -> Error {
    Error::Broker {
        broker: BROKER,
        action,
        source: Box::new(SdkFailure::of(&error)),
    }
}

/// An answer SQS gave that does not do.
fn refused(action: String, why: &str) -> Error {
    Error::Broker {
        broker: BROKER,
        action,
        source: why.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sqs_refuses_are_hashed() {
        assert_eq!(sqs_id("credit:order-1"), "credit:order-1");
        let long = "x".repeat(129);
        assert!(sqs_id(&long).starts_with("b3:"));
        assert_eq!(sqs_id(&long), sqs_id(&long));
        assert!(sqs_id("credit:ordre été").starts_with("b3:"));
        assert!(sqs_id("").starts_with("b3:"));
    }

    #[test]
    fn delays_round_up_to_whole_seconds() {
        assert_eq!(seconds(Duration::ZERO), 0);
        assert_eq!(seconds(Duration::from_millis(100)), 1);
        assert_eq!(seconds(Duration::from_secs(2)), 2);
    }

    #[test]
    fn an_endpoint_that_is_not_http_is_a_typed_error() {
        assert!(matches!(
            client("127.0.0.1:9324"),
            Err(Error::InvalidConfig { .. })
        ));
    }
}
