//! The provider: shared state, the router, and a running server.

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::charge::{self, Charge};
use crate::ledger::Ledger;
use crate::webhook::{self, WebhookDelivery};

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

    /// The router with every endpoint listed in the [crate docs](crate#endpoints).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/charges", post(charge::create).get(charge::list))
            .route("/v1/legacy/charges", post(charge::create_keyless))
            .route("/v1/webhooks", get(webhook::list))
            .route("/v1/webhooks/{topic}", post(webhook::receive))
            .route("/health", get(|| async { "ok" }))
            .with_state(self.clone())
    }

    /// Serves the provider on `listener` until `shutdown` completes.
    ///
    /// Shutdown is graceful: requests already being processed are answered first.
    ///
    /// # Errors
    ///
    /// Returns an error when the server cannot run on the listener.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }

    /// Starts a provider on `127.0.0.1` on an ephemeral port, on the current tokio runtime.
    ///
    /// The server runs until [`RunningProvider::stop`] is called or the [`RunningProvider`] is
    /// dropped.
    ///
    /// # Errors
    ///
    /// Returns an error when no loopback port can be bound.
    pub async fn start(config: ProviderConfig) -> io::Result<RunningProvider> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let provider = Self::new(config);
        let (shutdown, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(provider.clone().serve(listener, async {
            // A dropped sender means the same as a sent signal: stop.
            let _ = stopped.await;
        }));
        tracing::debug!(%addr, "provider started");
        Ok(RunningProvider {
            provider,
            addr,
            shutdown: Some(shutdown),
            task: Some(task),
        })
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

/// A provider serving on loopback, from [`Provider::start`].
///
/// Dropping it signals the server to shut down without waiting for it; [`stop`](Self::stop)
/// waits.
#[derive(Debug)]
pub struct RunningProvider {
    provider: Provider,
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl RunningProvider {
    /// The base URL, `http://127.0.0.1:PORT`, for [`ProviderClient::new`](crate::ProviderClient::new).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The provider's state, to inspect charges and webhooks or flip its switches.
    pub fn provider(&self) -> &Provider {
        &self.provider
    }

    /// Shuts the server down gracefully and waits until it has stopped.
    ///
    /// Requests already being processed are answered first.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(Ok(())) => tracing::debug!(addr = %self.addr, "provider stopped"),
                Ok(Err(error)) => tracing::warn!(addr = %self.addr, %error, "provider failed"),
                Err(error) => tracing::warn!(addr = %self.addr, %error, "provider task failed"),
            }
        }
    }
}

impl Drop for RunningProvider {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}
