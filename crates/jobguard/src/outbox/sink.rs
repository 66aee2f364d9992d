//! Where the relay delivers messages: the [`Sink`] trait, the message it receives and the
//! error it returns.

use std::error::Error as StdError;
use std::fmt;

use super::OutboxMessage;

/// A destination for outbox messages: a webhook ([`WebhookSink`](super::WebhookSink)), a broker,
/// another service.
///
/// The relay calls [`deliver`](Sink::deliver) with one message at a time per topic, and calls it
/// again with the same message (and the same id) when it returned a retryable error, when the
/// relay died before recording the success, or when two relays overlapped: a sink delivers at
/// least once, and the receiver deduplicates by [`OutboxMessage::id`]. A sink bounds the time
/// each call takes (a timeout), since the next message of the topic waits for it.
///
/// ```
/// use jobguard::outbox::{OutboxMessage, Sink, SinkError};
///
/// /// Prints messages; refuses those without an `order` field.
/// struct Print;
///
/// impl Sink for Print {
///     async fn deliver(&self, message: &OutboxMessage) -> Result<(), SinkError> {
///         if message.payload.get("order").is_none() {
///             return Err(SinkError::permanent("the message names no order"));
///         }
///         println!("{} {}: {}", message.topic, message.id, message.payload);
///         Ok(())
///     }
/// }
/// ```
pub trait Sink: Send + Sync + 'static {
    /// Delivers one message. `Ok` means the receiver has it: the relay marks it sent and never
    /// delivers it again. A [retryable](SinkError::retryable) error makes the relay try again
    /// after a backoff, holding back the topic's later messages meanwhile; a
    /// [permanent](SinkError::permanent) one dead-letters the message and the topic moves on.
    fn deliver(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;
}

/// Why a [`Sink`] did not deliver a message, and whether trying again may help.
#[derive(Debug)]
pub struct SinkError {
    message: String,
    permanent: bool,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl SinkError {
    /// A failure that may pass: the receiver is down, overloaded or timed out. The relay tries
    /// again after a backoff, and dead-letters the message when its attempts run out.
    pub fn retryable(message: impl fmt::Display) -> Self {
        SinkError {
            message: message.to_string(),
            permanent: false,
            source: None,
        }
    }

    /// A message the receiver will never accept (a poison message): the relay dead-letters it
    /// at once, and the topic's later messages go on.
    pub fn permanent(message: impl fmt::Display) -> Self {
        SinkError {
            message: message.to_string(),
            permanent: true,
            source: None,
        }
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// Whether the receiver will never accept the message.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The error with its chain of sources, as recorded in the message's `last_error`.
    pub(crate) fn describe(&self) -> String {
        let mut text = self.message.clone();
        let mut source = StdError::source(self);
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            // reqwest repeats part of its inner error in its own message.
            if !text.contains(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        text
    }
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for SinkError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_the_whole_chain() {
        let io = std::io::Error::other("connection refused");
        let error = SinkError::retryable("POST http://x/t failed").with_source(io);
        assert!(!error.is_permanent());
        assert_eq!(
            error.describe(),
            "POST http://x/t failed: connection refused"
        );
        assert!(SinkError::permanent("422").is_permanent());
    }
}
