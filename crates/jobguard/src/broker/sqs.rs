//! Amazon SQS with aws-sdk-sqs: a [`Source`] long-polling a queue, with the visibility timeout
//! extended while a job runs, `DeleteMessage` after the commit, `ApproximateReceiveCount` as
//! the delivery count and a dead-letter queue, and [`SqsSink`], the outbox's sink, sending with
//! `MessageDeduplicationId` on FIFO queues.
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
//! ([`SqsSink::publish_in_group`]): SQS hands out the messages of one group in order, one
//! in flight at a time, so jobs that must not run at once or out of order (the credits of one
//! account) share a group. Outside the window the guard deduplicates.
//!
//! # A delete after the visibility timeout
//!
//! A job that outlives the visibility timeout without extending it (a consumer that stalled)
//! has its message received by another consumer while it still runs. SQS may then take the
//! first consumer's delete, or ignore it; either way the guard, not the delete, carries the
//! guarantee: the second delivery waits on the guard row and reports a duplicate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName,
    QueueAttributeName,
};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};

use super::consumer::{Delivery, Source};
use super::envelope::Envelope;
use super::redact;
use crate::error::{Error, Result};
use crate::outbox::{OutboxMessage, Sink, SinkError};

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

/// Where an [`SqsSource`] consumes from, and how.
#[derive(Clone, Debug)]
pub struct SqsConfig {
    /// The queue's name; one ending in `.fifo` is a FIFO queue.
    pub queue: String,
    /// Messages received at once, and the jobs run at once (default 10).
    pub prefetch: usize,
    /// Deliveries a message gets (default 5): the redrive policy's `maxReceiveCount` of a
    /// queue [`declare`] creates. A queue with a smaller one of its own counts with that.
    pub max_deliveries: u32,
    /// How long a received message stays invisible to other consumers (default 30 s), in
    /// whole seconds, at most 12 hours. A running job extends it every third of it.
    pub visibility_timeout: Duration,
    /// Where dead letters go when the queue has no redrive policy of its own, and the target
    /// of the policy [`declare`] gives a new queue (default `<queue>-dead`, `<name>-dead.fifo`
    /// for a FIFO queue).
    pub dead_letter_queue: String,
    /// Create the queue and its dead-letter queue when missing (default true).
    pub declare: bool,
}

impl SqsConfig {
    /// Consumes `queue` with the defaults.
    pub fn new(queue: impl Into<String>) -> Self {
        let queue = queue.into();
        let dead_letter_queue = match queue.strip_suffix(FIFO_SUFFIX) {
            Some(name) => format!("{name}-dead{FIFO_SUFFIX}"),
            None => format!("{queue}-dead"),
        };
        SqsConfig {
            queue,
            prefetch: 10,
            max_deliveries: 5,
            visibility_timeout: Duration::from_secs(30),
            dead_letter_queue,
            declare: true,
        }
    }

    /// Whether the queue is a FIFO queue.
    pub fn is_fifo(&self) -> bool {
        is_fifo(&self.queue)
    }

    /// The visibility timeout in seconds, checked.
    fn visibility_seconds(&self) -> Result<i32> {
        let visibility = self.visibility_timeout;
        if visibility < Duration::from_secs(1)
            || visibility > MAX_VISIBILITY
            || visibility.subsec_nanos() != 0
        {
            return Err(Error::InvalidConfig {
                setting: "SQS visibility timeout",
                reason: format!(
                    "{visibility:?} is not a whole number of seconds from 1 s to 12 h, which is \
                     what SQS accepts"
                ),
            });
        }
        Ok(seconds(visibility))
    }

    fn check(&self) -> Result<()> {
        self.visibility_seconds()?;
        if !(1..=1000).contains(&self.max_deliveries) {
            return Err(Error::InvalidConfig {
                setting: "SQS max deliveries",
                reason: format!(
                    "{} is outside 1 to 1000, the receive counts a redrive policy accepts",
                    self.max_deliveries
                ),
            });
        }
        if self.is_fifo() != is_fifo(&self.dead_letter_queue) {
            return Err(Error::InvalidConfig {
                setting: "SQS dead-letter queue",
                reason: format!(
                    "the queue `{}` and its dead-letter queue `{}` must both be FIFO queues \
                     (names ending in `.fifo`) or neither",
                    self.queue, self.dead_letter_queue
                ),
            });
        }
        Ok(())
    }
}

const FIFO_SUFFIX: &str = ".fifo";

fn is_fifo(queue: &str) -> bool {
    queue.ends_with(FIFO_SUFFIX)
}

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

/// The URL of the queue `name`, or `None` when there is no such queue.
async fn queue_url(client: &Client, name: &str) -> Result<Option<String>> {
    match client.get_queue_url().queue_name(name).send().await {
        Ok(output) => Ok(output.queue_url().map(str::to_owned)),
        Err(error) if is_missing_queue(&error) => Ok(None),
        Err(error) => Err(broker_error(
            format!("find the queue `{name}` (is SQS running there?)"),
            error,
        )),
    }
}

fn is_missing_queue(error: &impl ProvideErrorMetadata) -> bool {
    error
        .code()
        .is_some_and(|code| code.contains("NonExistentQueue") || code.contains("QueueDoesNotExist"))
}

/// Creates the queue `name` with `attributes` unless it exists; its URL.
async fn create_queue(
    client: &Client,
    name: &str,
    attributes: &[(QueueAttributeName, String)],
) -> Result<String> {
    if let Some(url) = queue_url(client, name).await? {
        return Ok(url);
    }
    let mut create = client.create_queue().queue_name(name);
    if is_fifo(name) {
        create = create.attributes(QueueAttributeName::FifoQueue, "true");
    }
    for (attribute, value) in attributes {
        create = create.attributes(attribute.clone(), value);
    }
    // Two consumers declaring at once send the same attributes: SQS takes both.
    let created = create
        .send()
        .await
        .map_err(|error| broker_error(format!("create the queue `{name}`"), error))?;
    created.queue_url().map(str::to_owned).ok_or_else(|| {
        refused(
            format!("create the queue `{name}`"),
            "SQS answered without a queue URL",
        )
    })
}

/// The ARN of the queue at `url`.
async fn queue_arn(client: &Client, url: &str) -> Result<String> {
    attribute(client, url, QueueAttributeName::QueueArn)
        .await?
        .ok_or_else(|| refused(format!("read the ARN of {url}"), "SQS did not say"))
}

async fn attribute(client: &Client, url: &str, name: QueueAttributeName) -> Result<Option<String>> {
    let output = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(name.clone())
        .send()
        .await
        .map_err(|error| broker_error(format!("read the attribute {name} of {url}"), error))?;
    Ok(output
        .attributes()
        .and_then(|attributes| attributes.get(&name))
        .cloned())
}

/// A queue's redrive policy: where its dead letters go, after how many receives.
#[derive(Debug, PartialEq)]
struct RedrivePolicy {
    dead_letter_arn: String,
    max_receive_count: u32,
}

impl RedrivePolicy {
    fn parse(policy: &str) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_str(policy).ok()?;
        let count = &value["maxReceiveCount"];
        // SQS writes the count as a number; some tools as a string.
        let max_receive_count = count
            .as_u64()
            .or_else(|| count.as_str()?.parse().ok())
            .and_then(|count| u32::try_from(count).ok())?;
        Some(RedrivePolicy {
            dead_letter_arn: value["deadLetterTargetArn"].as_str()?.to_owned(),
            max_receive_count,
        })
    }

    fn to_json(&self) -> String {
        serde_json::json!({
            "deadLetterTargetArn": self.dead_letter_arn,
            "maxReceiveCount": self.max_receive_count,
        })
        .to_string()
    }

    /// The name of the dead-letter queue: the ARN's last field.
    fn dead_letter_queue(&self) -> &str {
        self.dead_letter_arn
            .rsplit(':')
            .next()
            .unwrap_or(&self.dead_letter_arn)
    }
}

/// Creates the dead-letter queue and the queue of `config` when missing, the queue with a
/// redrive policy to the dead-letter queue after `max_deliveries` receives; returns the
/// queue's URL.
pub async fn declare(client: &Client, config: &SqsConfig) -> Result<String> {
    config.check()?;
    let dead = create_queue(client, &config.dead_letter_queue, &[]).await?;
    let policy = RedrivePolicy {
        dead_letter_arn: queue_arn(client, &dead).await?,
        max_receive_count: config.max_deliveries,
    };
    create_queue(
        client,
        &config.queue,
        &[(QueueAttributeName::RedrivePolicy, policy.to_json())],
    )
    .await
}

/// Deletes the queue of `config` and its dead-letter queue, with their messages. For tests and
/// demos that make their own queues. (SQS takes a minute to let a deleted queue's name be
/// used again; local servers do not wait.)
pub async fn remove(url: &str, config: &SqsConfig) -> Result<()> {
    let client = client(url)?;
    for queue in [&config.queue, &config.dead_letter_queue] {
        let Some(queue_url) = queue_url(&client, queue).await? else {
            continue;
        };
        match client.delete_queue().queue_url(&queue_url).send().await {
            Ok(_) => {}
            Err(error) if is_missing_queue(&error) => {}
            Err(error) => {
                return Err(broker_error(format!("delete the queue `{queue}`"), error));
            }
        }
    }
    Ok(())
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
}

/// Sends to SQS queues: the outbox's [`Sink`], and a producer of job [`Envelope`]s.
///
/// As a sink, each outbox message is sent to the queue named after its topic (see
/// [`queue_name`]) with the payload as JSON for its body and the
/// [message id](crate::outbox::MessageId) in the message attribute `Jobguard-Message-Id`. On a
/// FIFO queue the id is also the `MessageDeduplicationId`: a message delivered again within
/// SQS's five-minute window (a relay that died before recording the success) is stored once.
/// Outside the window, and on standard queues, receivers deduplicate by the id.
///
/// | SQS | what the relay does |
/// |---|---|
/// | stored (or a duplicate within the window) | delivered: marks the message sent |
/// | no such queue, no answer, an error | retries after a backoff |
///
/// ```no_run
/// use jobguard::broker::sqs::SqsSink;
/// use jobguard::outbox::{Outbox, Relay};
///
/// # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
/// // Messages on topic `invoices` go to the queue `events-invoices`.
/// let sink = SqsSink::connect("http://127.0.0.1:9324")?.queue_prefix("events-");
/// let report = Relay::new(Outbox::new(pool), sink).drain().await?;
/// assert_eq!(report.dead, 0);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqsSink {
    client: Client,
    prefix: String,
    /// Queue URLs by name, looked up once.
    urls: Arc<Mutex<HashMap<String, String>>>,
}

impl SqsSink {
    /// A sink on the endpoint `url` (see [`client`]); topics go to queues of the same name.
    pub fn connect(url: &str) -> Result<Self> {
        Ok(Self::on(client(url)?))
    }

    /// Sends through a client of the caller's.
    pub fn on(client: Client) -> Self {
        SqsSink {
            client,
            prefix: String::new(),
            urls: Arc::default(),
        }
    }

    /// Sends topic `t` to the queue named `<prefix>t`.
    pub fn queue_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sends a job's envelope to the queue `queue` (a name or a queue URL). On a FIFO queue the
    /// job key is the `MessageDeduplicationId` and the `MessageGroupId`: the job is stored
    /// once if sent again within five minutes, and runs in parallel with other keys.
    pub async fn publish(&self, queue: &str, envelope: &Envelope) -> Result<()> {
        self.publish_in_group(queue, envelope, envelope.key.as_str())
            .await
    }

    /// [`publish`](Self::publish) with a `MessageGroupId` of the caller's on a FIFO queue: the
    /// jobs of one group are received in the order sent, one at a time. Standard queues have
    /// no groups and ignore it.
    pub async fn publish_in_group(
        &self,
        queue: &str,
        envelope: &Envelope,
        group: &str,
    ) -> Result<()> {
        let body = String::from_utf8(envelope.to_bytes()).expect("JSON is UTF-8");
        self.send(queue, envelope.key.as_str(), group, body)
            .await
            .map_err(|error| Error::Broker {
                broker: BROKER,
                action: format!("send job `{}` to `{queue}`", envelope.key),
                source: Box::new(error),
            })
    }

    async fn url(&self, queue: &str) -> std::result::Result<String, SinkError> {
        if queue.contains("://") {
            return Ok(queue.to_owned());
        }
        if let Some(url) = self.urls.lock().expect("never poisoned").get(queue) {
            return Ok(url.clone());
        }
        let url = queue_url(&self.client, queue)
            .await
            .map_err(|error| {
                SinkError::retryable(format!("finding the queue `{queue}` failed"))
                    .with_source(error)
            })?
            .ok_or_else(|| {
                SinkError::retryable(format!("there is no queue `{queue}` (create it)"))
            })?;
        self.urls
            .lock()
            .expect("never poisoned")
            .insert(queue.to_owned(), url.clone());
        Ok(url)
    }

    async fn send(
        &self,
        queue: &str,
        id: &str,
        group: &str,
        body: String,
    ) -> std::result::Result<(), SinkError> {
        let url = self.url(queue).await?;
        let mut send = self
            .client
            .send_message()
            .queue_url(&url)
            .message_body(body)
            .message_attributes(MESSAGE_ID_ATTRIBUTE, string_attribute(id));
        if is_fifo(queue) {
            send = send
                .message_deduplication_id(sqs_id(id))
                .message_group_id(sqs_id(group));
        }
        send.send().await.map_err(|error| {
            SinkError::retryable(format!("sending to the queue `{queue}` failed"))
                .with_source(SdkFailure::of(&error))
        })?;
        Ok(())
    }
}

impl Sink for SqsSink {
    async fn deliver(&self, message: &OutboxMessage) -> std::result::Result<(), SinkError> {
        let body = serde_json::to_string(&message.payload)
            .map_err(|error| SinkError::permanent("the payload is not JSON").with_source(error))?;
        let queue = queue_name(&format!("{}{}", self.prefix, message.topic));
        self.send(&queue, message.id.as_str(), &queue, body).await
    }
}

/// The queue a topic is sent to: the topic with every character SQS does not allow in a queue
/// name (anything but ASCII letters, digits, `-` and `_`) as `-`, a final `.fifo` kept.
///
/// ```
/// use jobguard::broker::sqs::queue_name;
///
/// assert_eq!(queue_name("billing.invoices"), "billing-invoices");
/// assert_eq!(queue_name("billing.invoices.fifo"), "billing-invoices.fifo");
/// ```
pub fn queue_name(topic: &str) -> String {
    let (name, suffix) = match topic.strip_suffix(FIFO_SUFFIX) {
        Some(name) => (name, FIFO_SUFFIX),
        None => (topic, ""),
    };
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("{name}{suffix}")
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
    fn redrive_policies_are_read_with_counts_as_numbers_or_strings() {
        let arn = "arn:aws:sqs:us-east-1:123456789012:jobs-dead";
        let policy = RedrivePolicy {
            dead_letter_arn: arn.to_owned(),
            max_receive_count: 5,
        };
        assert_eq!(RedrivePolicy::parse(&policy.to_json()), Some(policy));
        let quoted = format!(r#"{{"deadLetterTargetArn": "{arn}", "maxReceiveCount": "7"}}"#);
        let parsed = RedrivePolicy::parse(&quoted).unwrap();
        assert_eq!(parsed.max_receive_count, 7);
        assert_eq!(parsed.dead_letter_queue(), "jobs-dead");
        assert_eq!(RedrivePolicy::parse("{}"), None);
    }

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
    fn configs_sqs_would_refuse_are_typed_errors() {
        let config = SqsConfig::new("jobs.fifo");
        assert_eq!(config.dead_letter_queue, "jobs-dead.fifo");
        assert!(config.check().is_ok());
        for bad in [
            SqsConfig {
                visibility_timeout: Duration::from_millis(1500),
                ..SqsConfig::new("jobs")
            },
            SqsConfig {
                visibility_timeout: Duration::ZERO,
                ..SqsConfig::new("jobs")
            },
            SqsConfig {
                max_deliveries: 0,
                ..SqsConfig::new("jobs")
            },
            SqsConfig {
                dead_letter_queue: "dead".into(),
                ..SqsConfig::new("jobs.fifo")
            },
        ] {
            assert!(
                matches!(bad.check(), Err(Error::InvalidConfig { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            client("127.0.0.1:9324"),
            Err(Error::InvalidConfig { .. })
        ));
    }

    #[test]
    fn delays_round_up_to_whole_seconds() {
        assert_eq!(seconds(Duration::ZERO), 0);
        assert_eq!(seconds(Duration::from_millis(100)), 1);
        assert_eq!(seconds(Duration::from_secs(2)), 2);
    }
}
