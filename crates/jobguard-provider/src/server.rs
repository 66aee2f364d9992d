//! The provider as an HTTP server: its router, serving it on a listener, and a running server
//! on loopback.

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};

use axum::Router;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::endpoints;
use crate::provider::{Provider, ProviderConfig};

impl Provider {
    /// The router with every endpoint listed in the [crate docs](crate#endpoints).
    pub fn router(&self) -> Router {
        Router::new()
            .route(
                "/v1/charges",
                post(endpoints::create_charge).get(endpoints::list_charges),
            )
            .route("/v1/legacy/charges", post(endpoints::create_charge_keyless))
            .route("/v1/webhooks", get(endpoints::list_webhooks))
            .route("/v1/webhooks/{topic}", post(endpoints::receive_webhook))
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
