//! The Prometheus exporter every long-running command shares: the recorder with its buckets,
//! the duplicate-spike watch, and for `jobguard worker` and `jobguard consume` a small HTTP
//! server of their own (`--metrics-bind`) with `/metrics` and `/health`, under the same access
//! rules as `jobguard serve` ([`crate::access`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router, middleware};
use clap::Args;
use jobguard::Backend;
use jobguard::metrics::{DUPLICATE_AGE_SECONDS, JOB_DURATION_SECONDS};
use jobguard::spikes::{SpikeConfig, SpikeWatch};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use sqlx::Pool;

use crate::access::{self, Access};
use crate::args::{Token, parse_duration};

/// Job durations: from a few milliseconds to a minute.
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Ages of the guard rows duplicates find: from a second to the default retention, two weeks.
const AGE_BUCKETS: &[f64] = &[
    1.0,
    10.0,
    60.0,
    600.0,
    3600.0,
    21_600.0,
    86_400.0,
    604_800.0,
    1_209_600.0,
];

/// This process's metrics: the Prometheus recorder and the duplicate-spike watch.
pub struct Exporter {
    pub prometheus: PrometheusHandle,
    pub watch: SpikeWatch,
}

impl Exporter {
    /// Installs the recorder for the whole process: every outcome counted from now on is
    /// exported. Once per process.
    pub fn install(spike_window: Duration) -> anyhow::Result<Exporter> {
        let prometheus = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(JOB_DURATION_SECONDS.into()), DURATION_BUCKETS)?
            .set_buckets_for_metric(Matcher::Full(DUPLICATE_AGE_SECONDS.into()), AGE_BUCKETS)?
            .install_recorder()
            .context("cannot install the Prometheus recorder")?;
        jobguard::metrics::describe();
        let watch = SpikeWatch::install(SpikeConfig {
            window: spike_window,
            ..SpikeConfig::default()
        })?;
        Ok(Exporter { prometheus, watch })
    }

    /// The text exposition, as `/metrics` answers it.
    pub fn render(&self) -> Response {
        self.prometheus.run_upkeep();
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            self.prometheus.render(),
        )
            .into_response()
    }

    /// Closes spike windows and runs the recorder's upkeep until `shutdown`.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Clone) {
        let stop = shutdown.clone();
        let upkeep = async move {
            let mut ticks = tokio::time::interval(Duration::from_secs(5));
            let mut stop = std::pin::pin!(stop);
            loop {
                tokio::select! {
                    () = &mut stop => return,
                    _ = ticks.tick() => self.prometheus.run_upkeep(),
                }
            }
        };
        tokio::join!(upkeep, self.watch.run(shutdown));
    }
}

/// `--metrics-bind` and its token, for `jobguard worker` and `jobguard consume`.
#[derive(Args, Debug)]
pub struct MetricsArgs {
    /// Serve /metrics (Prometheus text: outcomes, duplicates and their sources, durations,
    /// batches, the duplicate-spike gauge) and /health on this address, e.g. 127.0.0.1:9465.
    /// Any address but a loopback one needs --metrics-token.
    #[arg(long, value_name = "ADDR")]
    metrics_bind: Option<SocketAddr>,
    /// The token a non-loopback --metrics-bind asks of every request but /health, as
    /// `Authorization: Bearer TOKEN` (at least 16 characters; prefer JOBGUARD_TOKEN).
    #[arg(long, env = "JOBGUARD_TOKEN", hide_env_values = true, value_parser = Token::parse)]
    metrics_token: Option<Token>,
    /// How long a window of duplicate counting lasts for the duplicate-spike gauge.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    spike_window: Duration,
}

/// A running metrics endpoint; it stops with the shutdown it was started with, or with the
/// process.
pub struct MetricsEndpoint {
    pub address: SocketAddr,
}

impl MetricsArgs {
    /// With `--metrics-bind`: installs the recorder and serves `/metrics` and `/health` (the
    /// database answering) until `shutdown`. Without it, nothing.
    pub async fn start<DB: Backend>(
        &self,
        pool: Pool<DB>,
        shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
    ) -> anyhow::Result<Option<MetricsEndpoint>> {
        let Some(bind) = self.metrics_bind else {
            return Ok(None);
        };
        let open = !bind.ip().is_loopback();
        if open && self.metrics_token.is_none() {
            anyhow::bail!(
                "--metrics-bind {bind} is not a loopback address, so anyone who can reach it could \
                 read the metrics: give a --metrics-token (or JOBGUARD_TOKEN) of at least 16 \
                 characters, or bind 127.0.0.1"
            );
        }
        let exporter = Arc::new(Exporter::install(self.spike_window)?);
        let access = Arc::new(Access {
            token: self.metrics_token.clone(),
            open,
            public: &["/health"],
        });
        let router = Router::new()
            .route("/metrics", get(metrics))
            .with_state(Arc::clone(&exporter))
            .route("/health", get(health::<DB>))
            .with_state(pool)
            .layer(middleware::from_fn_with_state(access, access::check_access));
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .with_context(|| format!("cannot listen on {bind} for the metrics"))?;
        let address = listener.local_addr()?;
        tokio::spawn(async move {
            let server = axum::serve(listener, router).with_graceful_shutdown(shutdown.clone());
            let (served, ()) = tokio::join!(server, exporter.run(shutdown));
            if let Err(error) = served {
                tracing::warn!(%error, "the metrics endpoint failed");
            }
        });
        Ok(Some(MetricsEndpoint { address }))
    }
}

async fn metrics(State(exporter): State<Arc<Exporter>>) -> Response {
    exporter.render()
}

async fn health<DB: Backend>(State(pool): State<Pool<DB>>) -> Response {
    match pool.acquire().await {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "error": error.to_string()})),
        )
            .into_response(),
    }
}
