//! The queues of an SQS source: [`SqsConfig`], and the calls that find, create and delete
//! queues and read their redrive policies.

use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::error::ProvideErrorMetadata;
use aws_sdk_sqs::types::QueueAttributeName;

use super::{MAX_VISIBILITY, broker_error, client, refused, seconds};
use crate::error::{Error, Result};

/// Where an [`SqsSource`](super::SqsSource) consumes from, and how.
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
    pub(super) fn visibility_seconds(&self) -> Result<i32> {
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

    pub(super) fn check(&self) -> Result<()> {
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

pub(super) const FIFO_SUFFIX: &str = ".fifo";

pub(super) fn is_fifo(queue: &str) -> bool {
    queue.ends_with(FIFO_SUFFIX)
}

/// The URL of the queue `name`, or `None` when there is no such queue.
pub(super) async fn queue_url(client: &Client, name: &str) -> Result<Option<String>> {
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

pub(super) async fn attribute(
    client: &Client,
    url: &str,
    name: QueueAttributeName,
) -> Result<Option<String>> {
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
pub(super) struct RedrivePolicy {
    dead_letter_arn: String,
    pub(super) max_receive_count: u32,
}

impl RedrivePolicy {
    pub(super) fn parse(policy: &str) -> Option<Self> {
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
    pub(super) fn dead_letter_queue(&self) -> &str {
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
    }
}
