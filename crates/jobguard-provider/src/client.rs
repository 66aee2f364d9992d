//! An HTTP client for the provider.

use std::time::Duration;

use reqwest::{RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;

use crate::api_error::{ErrorBody, IDEMPOTENCY_ERROR};
use crate::charge::{Charge, ChargeParams, IDEMPOTENCY_KEY};
use crate::error::ProviderError;
use crate::webhook::WebhookDelivery;

/// How long to wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long to wait for a whole request, response included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A client for a [`Provider`](crate::Provider) over HTTP.
///
/// Cloning is cheap and clones share one connection pool.
#[derive(Clone, Debug)]
pub struct ProviderClient {
    http: reqwest::Client,
    base_url: String,
}

impl ProviderClient {
    /// A client for the provider at `base_url`, such as [`RunningProvider::url`], with a 5 s
    /// connect timeout and a 30 s request timeout.
    ///
    /// [`RunningProvider::url`]: crate::RunningProvider::url
    ///
    /// # Panics
    ///
    /// Panics if the TLS backend cannot be initialised, as [`reqwest::Client::new`] does.
    pub fn new(base_url: impl Into<String>) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("the tls backend could not be initialised; check the rustls configuration");
        Self::with_http_client(base_url, http)
    }

    /// A client for the provider at `base_url` that sends with `http`, for other timeouts.
    pub fn with_http_client(base_url: impl Into<String>, http: reqwest::Client) -> Self {
        let mut base_url = base_url.into();
        while base_url.ends_with('/') {
            base_url.pop();
        }
        Self { http, base_url }
    }

    /// The base URL requests go to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Charges `amount` for `order`: `POST /v1/charges`.
    ///
    /// With an idempotency key, every call with the same key and parameters returns the charge
    /// the first one created, and the provider creates it at most once. Without one, every call
    /// creates a charge.
    ///
    /// # Errors
    ///
    /// [`ProviderError::InFlight`] while another request with the key is being processed,
    /// [`ProviderError::KeyReused`] when the key was used with other parameters, and the
    /// transport and status errors of any call.
    pub async fn create_charge(
        &self,
        order: &str,
        amount: i64,
        idempotency_key: Option<&str>,
    ) -> Result<Charge, ProviderError> {
        let mut request = self
            .http
            .post(self.url("/v1/charges"))
            .json(&params(order, amount));
        if let Some(key) = idempotency_key {
            request = request.header(IDEMPOTENCY_KEY, key);
        }
        self.send(request, idempotency_key).await
    }

    /// Charges `amount` for `order` on the keyless API: `POST /v1/legacy/charges`.
    ///
    /// Every call creates a charge, so a retry after a lost response charges twice.
    ///
    /// # Errors
    ///
    /// The transport and status errors of any call.
    pub async fn create_charge_keyless(
        &self,
        order: &str,
        amount: i64,
    ) -> Result<Charge, ProviderError> {
        let request = self
            .http
            .post(self.url("/v1/legacy/charges"))
            .json(&params(order, amount));
        self.send(request, None).await
    }

    /// The charges for `order`, in creation order: `GET /v1/charges?order=...`.
    ///
    /// This is the lookup a reconciler uses to learn whether a charge it is unsure about exists.
    ///
    /// # Errors
    ///
    /// [`ProviderError::Unavailable`] while the lookup is switched off with
    /// [`Provider::set_lookup_available`](crate::Provider::set_lookup_available), and the
    /// transport and status errors of any call.
    pub async fn find_charges(&self, order: &str) -> Result<Vec<Charge>, ProviderError> {
        let request = self
            .http
            .get(self.url("/v1/charges"))
            .query(&[("order", order)]);
        self.send(request, None).await
    }

    /// Every charge, in creation order: `GET /v1/charges`.
    ///
    /// # Errors
    ///
    /// The transport and status errors of any call.
    pub async fn charges(&self) -> Result<Vec<Charge>, ProviderError> {
        self.send(self.http.get(self.url("/v1/charges")), None)
            .await
    }

    /// Every webhook delivery, in arrival order: `GET /v1/webhooks`.
    ///
    /// # Errors
    ///
    /// The transport and status errors of any call.
    pub async fn webhooks(&self) -> Result<Vec<WebhookDelivery>, ProviderError> {
        self.send(self.http.get(self.url("/v1/webhooks")), None)
            .await
    }

    /// Delivers a webhook with a JSON `body` under `topic`: `POST /v1/webhooks/{topic}`.
    ///
    /// The provider records the delivery with its idempotency key; it does not deduplicate, so
    /// every successful call is one recorded delivery.
    ///
    /// # Errors
    ///
    /// [`ProviderError::Unavailable`] while the provider is failing webhooks (see
    /// [`Provider::fail_next_webhooks`](crate::Provider::fail_next_webhooks)),
    /// [`ProviderError::Rejected`] with status `422` for a body with `"reject": true`, and the
    /// transport and status errors of any call.
    pub async fn send_webhook(
        &self,
        topic: &str,
        body: &serde_json::Value,
        idempotency_key: Option<&str>,
    ) -> Result<(), ProviderError> {
        let path = format!("/v1/webhooks/{}", encode_path_segment(topic));
        let mut request = self.http.post(self.url(&path)).json(body);
        if let Some(key) = idempotency_key {
            request = request.header(IDEMPOTENCY_KEY, key);
        }
        self.send::<serde_json::Value>(request, idempotency_key)
            .await
            .map(drop)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// Sends `request` and decodes a success body as `T`. `key` is the request's idempotency
    /// key, for [`ProviderError::KeyReused`].
    async fn send<T: DeserializeOwned>(
        &self,
        request: RequestBuilder,
        key: Option<&str>,
    ) -> Result<T, ProviderError> {
        let response = request.send().await.map_err(ProviderError::Transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(ProviderError::Transport)?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(ProviderError::Decode);
        }
        Err(status_error(status, &body, key))
    }
}

fn params(order: &str, amount: i64) -> ChargeParams {
    ChargeParams {
        order: order.to_owned(),
        amount,
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters, so any topic is one segment.
fn encode_path_segment(segment: &str) -> String {
    let mut encoded = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The error for a non-success response.
fn status_error(status: StatusCode, body: &[u8], key: Option<&str>) -> ProviderError {
    if status == StatusCode::CONFLICT {
        return ProviderError::InFlight;
    }
    if status.is_server_error() {
        return ProviderError::Unavailable {
            status: status.as_u16(),
        };
    }
    let (kind, message) = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(body) => (Some(body.error.kind), body.error.message),
        // Not one of the provider's error bodies, e.g. a router rejection: keep the text.
        Err(_) => (None, String::from_utf8_lossy(body).into_owned()),
    };
    match key {
        Some(key)
            if status == StatusCode::UNPROCESSABLE_ENTITY
                && kind.as_deref() == Some(IDEMPOTENCY_ERROR) =>
        {
            ProviderError::KeyReused {
                key: key.to_owned(),
            }
        }
        _ => ProviderError::Rejected {
            status: status.as_u16(),
            message,
        },
    }
}
