//! [`SqsSink`]: sends job envelopes and outbox messages to SQS queues.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_sdk_sqs::Client;

use super::queue::{FIFO_SUFFIX, is_fifo, queue_url};
use super::{BROKER, MESSAGE_ID_ATTRIBUTE, SdkFailure, client, sqs_id, string_attribute};
use crate::broker::Envelope;
use crate::error::{Error, Result};
use crate::outbox::{OutboxMessage, Sink, SinkError};

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
