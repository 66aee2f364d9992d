//! Webhook deliveries and the endpoints that receive and list them.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::api_error::ApiError;
use crate::charge::idempotency_key;
use crate::ledger::now_ms;
use crate::provider::Provider;

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

/// `POST /v1/webhooks/{topic}`: records a delivery.
///
/// Fails with `503` while the failure budget lasts and with `422` for a body with
/// `"reject": true`, recording nothing in either case.
pub(crate) async fn receive(
    State(provider): State<Provider>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    // The outage comes first: an unavailable receiver does not look at the request.
    if provider.ledger().take_webhook_failure() {
        return Err(ApiError::unavailable(
            "the webhook receiver is temporarily unavailable; retry later",
        ));
    }
    let key = idempotency_key(&headers)?;
    let body: Value = serde_json::from_slice(&body).map_err(|error| {
        ApiError::invalid_request(format!("send the webhook body as json: {error}"))
    })?;
    if body.get("reject") == Some(&Value::Bool(true)) {
        return Err(ApiError::unprocessable(
            "the webhook was rejected and will be every time; do not retry it",
        ));
    }
    tokio::time::sleep(provider.config().webhook_latency).await;
    provider.ledger().record_webhook(WebhookDelivery {
        topic,
        idempotency_key: key,
        body,
        received_at_ms: now_ms(),
    });
    Ok(Json(json!({ "received": true })))
}

/// `GET /v1/webhooks`: every delivery, in arrival order.
pub(crate) async fn list(State(provider): State<Provider>) -> Json<Vec<WebhookDelivery>> {
    Json(provider.webhooks())
}
