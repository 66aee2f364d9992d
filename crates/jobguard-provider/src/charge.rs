//! Charges, their parameters and the idempotency key header.

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};

use crate::api_error::ApiError;

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
    pub(crate) fn parse(body: &[u8]) -> Result<Self, ApiError> {
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
