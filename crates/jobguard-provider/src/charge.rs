//! Charges and the endpoints that create and look them up.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::api_error::ApiError;
use crate::ledger::Claim;
use crate::provider::Provider;

/// The request header that carries an idempotency key.
pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The response header set when a stored response is replayed for a key.
pub(crate) const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The longest idempotency key accepted, in characters, as Stripe allows.
const MAX_KEY_CHARS: usize = 255;

/// A charge: money the provider took from a customer, the effect jobguard counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The provider's id: `ch_000001`, `ch_000002`, ... in creation order.
    pub id: String,
    /// The order the charge is for.
    pub order: String,
    /// The amount, in the smallest currency unit; always positive.
    pub amount: i64,
    /// The idempotency key of the request that created the charge; `None` for a request without
    /// one and for the keyless endpoint.
    pub idempotency_key: Option<String>,
    /// When the charge was created, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
}

/// The body of a charge request; an idempotency key is bound to these parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChargeParams {
    pub(crate) order: String,
    pub(crate) amount: i64,
}

impl ChargeParams {
    fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let params: Self = serde_json::from_slice(body).map_err(|error| {
            ApiError::invalid_request(format!(
                "send a json body like {{\"order\": \"order-1\", \"amount\": 500}}: {error}"
            ))
        })?;
        if params.order.is_empty() {
            return Err(ApiError::invalid_request("`order` must not be empty"));
        }
        if params.amount <= 0 {
            return Err(ApiError::invalid_request(
                "`amount` must be greater than zero",
            ));
        }
        Ok(params)
    }
}

/// `POST /v1/charges`: creates a charge, idempotently when the request has a key.
pub(crate) async fn create(
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
pub(crate) async fn create_keyless(
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
pub(crate) async fn list(
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

/// The request's idempotency key, if it has one.
///
/// # Errors
///
/// A `400` when the key is not 1 to 255 printable ASCII characters.
pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::invalid_request(format!(
            "the `Idempotency-Key` header must be 1 to {MAX_KEY_CHARS} printable ascii characters"
        ))
    };
    let key = value.to_str().map_err(|_| invalid())?;
    if key.is_empty() || key.chars().count() > MAX_KEY_CHARS {
        return Err(invalid());
    }
    Ok(Some(key.to_owned()))
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
