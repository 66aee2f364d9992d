//! Delivery to HTTP webhooks.

use std::time::Duration;

use reqwest::StatusCode;

use super::{OutboxMessage, Sink, SinkError};
use crate::error::{Error, Result};

/// The longest a receiver's answer to an error is quoted in the message's `last_error`.
const MAX_QUOTED_BODY: usize = 300;

/// Delivers each message as an HTTP `POST {base_url}/{topic}` whose JSON body is the payload
/// and whose `Idempotency-Key` header is the [message id](super::MessageId), the same on every
/// delivery of the message: the receiver deduplicates on it.
///
/// | answer | what the relay does |
/// |---|---|
/// | 2xx | delivered: marks the message sent |
/// | 408, 429, 5xx, no answer (refused, reset, timed out) | retries after a backoff |
/// | any other status (400, 404, 422, a redirect) | dead-letters the message at once |
///
/// Each request times out after [`WebhookSink::DEFAULT_TIMEOUT`] unless the client given to
/// [`with_client`](Self::with_client) says otherwise.
///
/// ```no_run
/// use jobguard::outbox::{Outbox, Relay, WebhookSink};
///
/// # async fn f(pool: sqlx::PgPool) -> jobguard::Result<()> {
/// // Messages on topic `invoices` go to https://hooks.example.com/v1/invoices.
/// let sink = WebhookSink::new("https://hooks.example.com/v1")?;
/// let report = Relay::new(Outbox::new(pool), sink).drain().await?;
/// assert_eq!(report.retried + report.dead, 0, "{report:?}");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct WebhookSink {
    client: reqwest::Client,
    base_url: String,
}

impl WebhookSink {
    /// How long a delivery may take, from connecting to the end of the answer.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// A sink posting to `base_url` (`http://` or `https://`), with its own client.
    pub fn new(base_url: &str) -> Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(Self::DEFAULT_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            // A redirected POST turns into a GET without the message: refuse it instead.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("jobguard/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| Error::InvalidConfig {
                setting: "webhook client",
                reason: error.to_string(),
            })?;
        Self::with_client(client, base_url)
    }

    /// A sink posting to `base_url` with a client of the caller's (its timeouts, proxies,
    /// TLS roots and default headers, such as a signature).
    pub fn with_client(client: reqwest::Client, base_url: &str) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidConfig {
            setting: "webhook URL",
            reason,
        };
        let url = reqwest::Url::parse(base_url)
            .map_err(|error| invalid(format!("`{base_url}` is not a URL: {error}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "`{base_url}` is not an http:// or https:// URL"
            )));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(invalid(format!(
                "`{base_url}` has a query or fragment; the topic is appended to its path"
            )));
        }
        Ok(WebhookSink {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
        })
    }

    /// Where messages of `topic` are posted.
    pub fn url_for(&self, topic: &str) -> String {
        format!("{}/{topic}", self.base_url)
    }
}

impl Sink for WebhookSink {
    async fn deliver(&self, message: &OutboxMessage) -> Result<(), SinkError> {
        let url = self.url_for(&message.topic);
        let response = self
            .client
            .post(&url)
            .header("Idempotency-Key", message.id.as_str())
            .json(&message.payload)
            .send()
            .await
            .map_err(|error| {
                let failure = format!("POST {url} got no answer");
                // A request that cannot even be built fails the same way every time.
                let failure = if error.is_builder() {
                    SinkError::permanent(failure)
                } else {
                    SinkError::retryable(failure)
                };
                failure.with_source(error)
            })?;
        let status = response.status();
        if status.is_success() {
            // Reading the answer lets the connection serve the next message.
            let _ = response.bytes().await;
            return Ok(());
        }
        let body = response.text().await.unwrap_or_default();
        let quoted: String = body.trim().chars().take(MAX_QUOTED_BODY).collect();
        let failure = format!("POST {url} answered {status}: {quoted}");
        Err(if is_retryable(status) {
            SinkError::retryable(failure)
        } else {
            SinkError::permanent(failure)
        })
    }
}

/// Timeouts, rate limits and server errors pass; other refusals are about the message.
fn is_retryable(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_answers_into_retryable_and_permanent() {
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(is_retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
        for code in [301, 400, 401, 403, 404, 409, 410, 422] {
            assert!(!is_retryable(StatusCode::from_u16(code).unwrap()), "{code}");
        }
    }

    #[test]
    fn checks_the_base_url() {
        let sink = WebhookSink::new("http://127.0.0.1:9/v1/webhooks/").unwrap();
        assert_eq!(sink.url_for("t"), "http://127.0.0.1:9/v1/webhooks/t");
        for bad in ["", "127.0.0.1:9", "ftp://x/y", "http://x/y?a=1"] {
            assert!(
                matches!(
                    WebhookSink::new(bad),
                    Err(Error::InvalidConfig {
                        setting: "webhook URL",
                        ..
                    })
                ),
                "{bad:?} was accepted"
            );
        }
    }
}
