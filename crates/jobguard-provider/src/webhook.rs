//! Webhook deliveries as the provider records them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A webhook the provider received and recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WebhookDelivery {
    /// The topic from the path, `POST /v1/webhooks/{topic}`.
    pub topic: String,
    /// The request's `Idempotency-Key` header, if it had one.
    pub idempotency_key: Option<String>,
    /// The JSON body as sent.
    pub body: Value,
    /// When the webhook was recorded, in milliseconds since the Unix epoch.
    pub received_at_ms: u64,
}
