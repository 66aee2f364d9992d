//! The provider: its configuration and shared state, behind the endpoints of `endpoints.rs`
//! and the server of `server.rs`.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::charge::Charge;
use crate::ledger::Ledger;
use crate::webhook::WebhookDelivery;

/// How the provider behaves.
///
/// The default answers as fast as it can.
#[derive(Clone, Debug, Default)]
pub struct ProviderConfig {
    /// How long a charge takes to process.
    ///
    /// An idempotency key stays in flight for this long, so a concurrent request with the same
    /// key sees `409 Conflict`, and a client whose timeout is shorter gives up before the charge
    /// exists.
    pub latency: Duration,
    /// How long a webhook takes to be recorded.
    pub webhook_latency: Duration,
    /// How long an idempotency key is remembered after its charge was made; `None` (the
    /// default) remembers keys forever. Stripe forgets keys after 24 hours: a request with a
    /// forgotten key creates a new charge, as a first request would.
    pub key_ttl: Option<Duration>,
}

/// A payment provider: the state behind the HTTP endpoints.
///
/// Cloning is cheap and every clone shares the same charges, webhooks and switches, so a test can
/// keep one to inspect what the server did. Serve it with [`Provider::start`] (loopback, an
/// ephemeral port) or [`Provider::serve`] (a listener of your own).
#[derive(Clone, Debug)]
pub struct Provider {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    config: ProviderConfig,
    ledger: Mutex<Ledger>,
}

impl Provider {
    /// Creates a provider with no charges and no webhooks.
    pub fn new(config: ProviderConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                config,
                ledger: Mutex::new(Ledger::default()),
            }),
        }
    }

    /// Every charge created so far, in creation order.
    pub fn charges(&self) -> Vec<Charge> {
        self.ledger().charges().to_vec()
    }

    /// Every webhook recorded so far, in arrival order.
    pub fn webhooks(&self) -> Vec<WebhookDelivery> {
        self.ledger().webhooks().to_vec()
    }

    /// Turns the charge lookup (`GET /v1/charges?order=...`) on or off.
    ///
    /// While off, a lookup answers `503 Service Unavailable`, so a reconciler cannot tell whether
    /// a charge exists. Listing every charge keeps working, so tests can still count.
    pub fn set_lookup_available(&self, available: bool) {
        self.ledger().set_lookup_available(available);
    }

    /// Makes the next `n` webhook requests fail with `503 Service Unavailable`.
    ///
    /// A failed webhook is not recorded. Calling this again replaces the remaining budget.
    pub fn fail_next_webhooks(&self, n: u32) {
        self.ledger().fail_next_webhooks(n);
    }

    pub(crate) fn config(&self) -> &ProviderConfig {
        &self.shared.config
    }

    /// Locks the state. Callers never hold the guard across an `.await`.
    pub(crate) fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // Every update of the ledger is complete before it can panic, so a poisoned lock still
        // guards consistent state.
        self.shared
            .ledger
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
