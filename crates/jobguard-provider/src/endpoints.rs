//! The HTTP endpoints: charges (created idempotently under a key, without one, listed) and
//! webhooks (received, listed), each a handler over the [`Provider`]'s state.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api_error::ApiError;
use crate::charge::{Charge, ChargeParams, IDEMPOTENT_REPLAYED, idempotency_key};
use crate::ledger::{Claim, now_ms};
use crate::provider::Provider;
use crate::webhook::WebhookDelivery;

/// `POST /v1/charges`: creates a charge, idempotently when the request has a key.
pub(crate) async fn create_charge(
    State(provider): State<Provider>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let params = ChargeParams::parse(&body)?;
    let Some(key) = key else {
        tokio::time::sleep(provider.config().latency).await;
        let charge = provider.ledger().create_charge(params, None);
        tracing::debug!(id = %charge.id, order = %charge.order, "charge created without a key");
        return Ok(Json(charge).into_response());
    };

    let ttl = provider.config().key_ttl;
    let claim = provider.ledger().claim(&key, &params, ttl);
    match claim {
        Claim::Claimed => {}
        Claim::Replay(charge) => {
            tracing::debug!(id = %charge.id, %key, "charge replayed");
            let replayed = (
                HeaderName::from_static(IDEMPOTENT_REPLAYED),
                HeaderValue::from_static("true"),
            );
            return Ok(([replayed], Json(charge)).into_response());
        }
        Claim::Reused => {
            return Err(ApiError::key_reused(format!(
                "idempotency key `{key}` was already used with other parameters; \
                 send the original parameters or use a new key"
            )));
        }
        Claim::InFlight => {
            return Err(ApiError::conflict(format!(
                "a request with idempotency key `{key}` is still being processed; \
                 retry later with the same key"
            )));
        }
    }

    // From here until the charge exists, the key is in flight. If the client goes away, axum
    // drops this future and the claim's drop frees the key without creating anything.
    let claim = KeyClaim {
        provider: provider.clone(),
        key: Some(key),
    };
    tokio::time::sleep(provider.config().latency).await;
    let charge = claim.create_charge(params);
    tracing::debug!(id = %charge.id, order = %charge.order, "charge created");
    Ok(Json(charge).into_response())
}

/// `POST /v1/legacy/charges`: creates a charge on every call, whatever headers it has.
pub(crate) async fn create_charge_keyless(
    State(provider): State<Provider>,
    body: Bytes,
) -> Result<Json<Charge>, ApiError> {
    let params = ChargeParams::parse(&body)?;
    tokio::time::sleep(provider.config().latency).await;
    let charge = provider.ledger().create_charge(params, None);
    tracing::debug!(id = %charge.id, order = %charge.order, "keyless charge created");
    Ok(Json(charge))
}

/// The query of `GET /v1/charges`.
#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    order: Option<String>,
}

/// `GET /v1/charges[?order=ID]`: the charges of one order, or all of them.
pub(crate) async fn list_charges(
    State(provider): State<Provider>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Vec<Charge>>, ApiError> {
    let ledger = provider.ledger();
    let Some(order) = query.order else {
        return Ok(Json(ledger.charges().to_vec()));
    };
    if !ledger.lookup_available() {
        return Err(ApiError::unavailable(
            "charge lookup is temporarily unavailable; retry later",
        ));
    }
    let charges = ledger
        .charges()
        .iter()
        .filter(|charge| charge.order == order);
    Ok(Json(charges.cloned().collect()))
}

/// `POST /v1/webhooks/{topic}`: records a delivery.
///
/// Fails with `503` while the failure budget lasts and with `422` for a body with
/// `"reject": true`, recording nothing in either case.
pub(crate) async fn receive_webhook(
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
pub(crate) async fn list_webhooks(State(provider): State<Provider>) -> Json<Vec<WebhookDelivery>> {
    Json(provider.webhooks())
}

/// An idempotency key this request holds in flight.
///
/// Dropped without [`create_charge`](Self::create_charge), it frees the key: a request that was
/// never finished leaves nothing behind, as with Stripe.
struct KeyClaim {
    provider: Provider,
    key: Option<String>,
}

impl KeyClaim {
    /// Creates the charge and stores it as the key's response, in one critical section.
    fn create_charge(mut self, params: ChargeParams) -> Charge {
        let key = self.key.take();
        self.provider.ledger().create_charge(params, key)
    }
}

impl Drop for KeyClaim {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            tracing::debug!(%key, "request abandoned before the charge was created; key freed");
            self.provider.ledger().release(&key);
        }
    }
}
