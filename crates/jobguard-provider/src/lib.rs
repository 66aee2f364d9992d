//! A payment provider over HTTP with Stripe's idempotency semantics, for jobguard's tests and
//! demo.
//!
//! jobguard makes a job take effect exactly once on top of at-least-once delivery. Proving that
//! takes an effect that lives outside the database and can be counted: this crate is that
//! effect. [`Provider`] is a real HTTP server (axum) that creates charges and receives
//! webhooks, and [`ProviderClient`] is a real HTTP client (reqwest) for it. Tests and the demo
//! run both over loopback and then count what the provider actually did with
//! [`Provider::charges`] and [`Provider::webhooks`].
//!
//! The charge endpoint follows Stripe's idempotency rules: a request with an `Idempotency-Key`
//! header that was already answered gets the original charge back (with `Idempotent-Replayed:
//! true`), the same key with other parameters is refused, and a second request while the first
//! is still being processed gets `409 Conflict`. A request the client abandons before the
//! provider finishes it creates nothing and leaves the key free. The legacy endpoint has no
//! idempotency at all and creates a charge on every call, as a naive API does.
//!
//! ```
//! use jobguard_provider::{Provider, ProviderClient, ProviderConfig};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let running = Provider::start(ProviderConfig::default()).await?;
//! let client = ProviderClient::new(running.url());
//!
//! // A redelivered job sends the same request with the same key twice...
//! let first = client.create_charge("order-1", 500, Some("charge:order-1")).await?;
//! let again = client.create_charge("order-1", 500, Some("charge:order-1")).await?;
//!
//! // ...and the customer is charged once.
//! assert_eq!(first.id, again.id);
//! assert_eq!(running.provider().charges().len(), 1);
//!
//! running.stop().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Endpoints
//!
//! | method and path | what it does |
//! |---|---|
//! | `POST /v1/charges` | creates a charge; idempotent under an `Idempotency-Key` header |
//! | `POST /v1/legacy/charges` | creates a charge every time; ignores `Idempotency-Key` |
//! | `GET /v1/charges?order=ID` | the charges of one order, for reconciliation; can be made to fail |
//! | `GET /v1/charges` | every charge, in creation order |
//! | `POST /v1/webhooks/{topic}` | records a webhook delivery; see [`Provider::fail_next_webhooks`] |
//! | `GET /v1/webhooks` | every webhook delivery, in arrival order |
//! | `GET /health` | `200 ok` |
//!
//! Errors have the body `{"error": {"type": ..., "message": ...}}`; [`ProviderClient`] turns
//! them into [`ProviderError`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod api_error;
mod charge;
mod client;
mod endpoints;
mod error;
mod ledger;
mod provider;
mod server;
mod webhook;

pub use charge::Charge;
pub use client::ProviderClient;
pub use error::ProviderError;
pub use provider::{Provider, ProviderConfig};
pub use server::RunningProvider;
pub use webhook::WebhookDelivery;
