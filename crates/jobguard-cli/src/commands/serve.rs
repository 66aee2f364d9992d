//! `jobguard serve`: the operator console, Prometheus metrics and a health check over HTTP.
//!
//! Pages: the dashboard at `/` (duplicates per window, backlog, dead letters, steps needing
//! attention, the memory horizon) and the console at `/console` (jobs by state, kind, queue or
//! key; a job; a key; queues with their pause state), plain HTML with a small script, embedded
//! in the binary. The console's JSON API is in [`crate::console_api`].
//!
//! Which process exports what: outcome counters, durations and the duplicate-spike gauge are
//! recorded by the process that runs the jobs, so `jobguard serve --worker` runs the built-in
//! jobs' worker in this process and exports what it counts (`jobguard worker --metrics-bind`
//! exports its own). The database's figures (backlog, oldest waiting job, dead letters, steps
//! needing attention, the guard's memory horizon) are read from the database whenever
//! `/metrics` or `/api/stats` is asked, at most once a second, with or without `--worker`.
//!
//! Access is [`crate::access`]'s: reads open on a loopback address, the token for everything
//! but the pages and `/health` elsewhere, and for every write (replay, retry, cancel, delete,
//! pause, resume) always, refused from other sites. The token is never printed or logged. No
//! response may be shown in another site's frame.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use futures::FutureExt as _;
use jobguard::console::Console;
use jobguard::metrics::{
    DEAD_LETTERS, GUARD_OLDEST_AGE_SECONDS, JOBS_RUNNING, QUEUE_DEPTH, QUEUE_OLDEST_AGE_SECONDS,
    STEPS_ATTENTION,
};
use jobguard::queue::{DEFAULT_QUEUE, Replay};
use jobguard::worker::shutdown_signal;
use jobguard::{Queue, Worker, WorkerConfig};
use serde_json::json;
use sqlx::Pool;

use crate::access::{self, Access, failure};
use crate::args::{ConnectWait, Token, parse_duration};
use crate::builtin_jobs::{self, ExampleDb};
use crate::database::{DEFAULT_URL, Startup, redact};
use crate::exporter::Exporter;
use crate::figures::{Figures, KindTotals, OutcomeFigures, Tables, WindowFigures};
use crate::on_pool;

/// The dashboard: one page, its script and styles inline, nothing fetched from elsewhere.
const DASHBOARD: &str = include_str!("dashboard.html");
/// The console: jobs, a job, a key, queues; one page, script and styles inline.
const CONSOLE: &str = include_str!("console.html");

/// The database is read at most this often, however many dashboards and scrapers ask.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Where to listen. Any address but a loopback one needs --token.
    #[arg(long, default_value = "127.0.0.1:9464")]
    bind: SocketAddr,
    /// A secret of at least 16 characters, sent as `Authorization: Bearer TOKEN`. Replaying a
    /// dead letter always needs it; on a non-loopback address every request but the dashboard
    /// page and /health does. Never printed or logged; prefer JOBGUARD_TOKEN, since other
    /// users of the machine can see command lines.
    #[arg(long, env = "JOBGUARD_TOKEN", hide_env_values = true, value_parser = Token::parse)]
    token: Option<Token>,
    /// Also run the built-in jobs from the queue in this process, so that /metrics and the
    /// dashboard have its outcomes: applied, duplicates and their sources, failures.
    #[arg(long)]
    worker: bool,
    /// The queue the worker takes jobs from.
    #[arg(long, default_value = DEFAULT_QUEUE)]
    queue: String,
    /// Jobs the worker runs at once.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    concurrency: u32,
    /// How long a window of duplicate counting lasts: each kind's duplicates in a window are
    /// compared with its own previous windows to spot a spike.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    spike_window: Duration,
    #[command(flatten)]
    wait: ConnectWait,
    /// postgres://user@host/db, or sqlite:path.db for an embedded database.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    database_url: String,
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let open = !args.bind.ip().is_loopback();
    if open && args.token.is_none() {
        bail!(
            "--bind {} is not a loopback address, so anyone who can reach it could read the \
             figures: give a --token (or JOBGUARD_TOKEN) of at least 16 characters, or bind \
             127.0.0.1",
            args.bind
        );
    }
    let exporter = Exporter::install(args.spike_window)?;
    // A running job holds a connection; fetching, heartbeats and the figures need a few more.
    let connections = if args.worker { args.concurrency + 6 } else { 4 };
    let database = Startup::new(&args.database_url, args.wait.connect_timeout)
        .connect(&args.database_url, connections)
        .await?;
    on_pool!(database, pool => run(pool, args, exporter).await)
}

/// What the handlers share.
struct App<DB: ExampleDb> {
    tables: Tables<DB>,
    database: String,
    exporter: Exporter,
    worker: bool,
    /// The last figures read from the database, and when.
    sampled: tokio::sync::Mutex<Option<(Instant, Figures)>>,
    /// Queues whose depth was exported, so a queue that empties reads 0 instead of its last
    /// depth.
    queues: Mutex<BTreeSet<String>>,
}

async fn run<DB: ExampleDb>(
    pool: Pool<DB>,
    args: ServeArgs,
    exporter: Exporter,
) -> anyhow::Result<ExitCode> {
    let database = redact(&args.database_url);
    let worker = if args.worker {
        let config = WorkerConfig {
            queue: args.queue.clone(),
            concurrency: args.concurrency as usize,
            ..WorkerConfig::default()
        };
        let worker = builtin_jobs::register(Worker::with_config(Queue::new(pool.clone()), config)?);
        worker.migrate().await.with_context(|| {
            format!("cannot create the queue's and guard's tables in {database}")
        })?;
        builtin_jobs::migrate(&pool)
            .await
            .with_context(|| format!("cannot create the built-in jobs' tables in {database}"))?;
        Some(worker)
    } else {
        None
    };
    let app = Arc::new(App {
        tables: Tables::new(pool.clone()),
        database: database.clone(),
        exporter,
        worker: worker.is_some(),
        sampled: tokio::sync::Mutex::new(None),
        queues: Mutex::new(BTreeSet::from([args.queue.clone()])),
    });
    let access = Arc::new(Access {
        token: args.token.clone(),
        open: !args.bind.ip().is_loopback(),
        public: &["/", "/console", "/health"],
    });
    let console = Console::new(Queue::new(pool.clone()));
    let router = Router::new()
        .route("/", get(dashboard))
        .route("/console", get(console_page))
        .route("/health", get(health::<DB>))
        .route("/metrics", get(metrics::<DB>))
        .route("/api/stats", get(stats::<DB>))
        .route("/api/dead/{id}/replay", post(replay::<DB>))
        .with_state(Arc::clone(&app))
        .merge(crate::console_api::routes(console))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&access),
            access::check_access,
        ));
    let router = access::unframed(router);

    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("cannot listen on {}", args.bind))?;
    let address = listener.local_addr()?;
    eprintln!(
        "jobguard serve: listening on http://{address} (dashboard /, console /console, /metrics, \
         /health) for \
         {database} ({}); {}; {}",
        DB::BACKEND,
        match &worker {
            Some(_) => format!(
                "running the built-in jobs from queue `{}`, {} at once",
                args.queue, args.concurrency
            ),
            None => "no worker in this process (--worker runs one)".to_owned(),
        },
        match (&args.token, access.open) {
            (Some(_), true) => "every request needs the token",
            (Some(_), false) => "changes need the token",
            (None, _) => "changes are off (they need --token)",
        }
    );

    let shutdown = shutdown_signal().shared();
    let serving = async {
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.clone())
            .await
            .context("the HTTP server failed")
    };
    let working = async {
        match worker {
            Some(worker) => worker
                .run(shutdown.clone())
                .await
                .map(Some)
                .map_err(|error| {
                    anyhow::Error::new(error).context("the worker stopped with an error")
                }),
            None => Ok(None),
        }
    };
    let exporting = async {
        app.exporter.run(shutdown.clone()).await;
        anyhow::Ok(())
    };
    let ((), stats, ()) = tokio::try_join!(serving, working, exporting)?;
    if let Some(stats) = stats {
        eprintln!(
            "jobguard serve: stopped; the worker applied {}, found {} duplicates, {} failed, \
             {} dead",
            stats.applied, stats.duplicates, stats.failed, stats.dead
        );
    }
    pool.close().await;
    Ok(ExitCode::SUCCESS)
}

impl<DB: ExampleDb> App<DB> {
    /// The database's figures, read at most every [`SAMPLE_EVERY`], which also sets the
    /// sampled gauges; then this process's outcomes, always current.
    async fn figures(&self) -> anyhow::Result<Figures> {
        let mut sampled = self.sampled.lock().await;
        let mut figures = match &*sampled {
            Some((at, figures)) if at.elapsed() < SAMPLE_EVERY => figures.clone(),
            _ => {
                let figures = self.tables.read(&self.database).await?;
                self.export(&figures);
                *sampled = Some((Instant::now(), figures.clone()));
                figures
            }
        };
        drop(sampled);
        figures.outcomes = Some(self.outcomes());
        Ok(figures)
    }

    /// Sets the gauges that describe the database.
    fn export(&self, figures: &Figures) {
        if let Some(queue) = &figures.queue {
            metrics::gauge!(JOBS_RUNNING).set(queue.running as f64);
            metrics::gauge!(DEAD_LETTERS).set(queue.dead as f64);
            let mut queues = self.queues.lock().expect("not poisoned");
            for name in queues.iter() {
                if !queue.backlog.iter().any(|backlog| &backlog.queue == name) {
                    metrics::gauge!(QUEUE_DEPTH, "queue" => name.clone()).set(0.0);
                    metrics::gauge!(QUEUE_OLDEST_AGE_SECONDS, "queue" => name.clone()).set(0.0);
                }
            }
            for backlog in &queue.backlog {
                let name = backlog.queue.clone();
                metrics::gauge!(QUEUE_DEPTH, "queue" => name.clone()).set(backlog.ready as f64);
                metrics::gauge!(QUEUE_OLDEST_AGE_SECONDS, "queue" => name.clone())
                    .set(backlog.oldest_wait);
                queues.insert(name);
            }
        }
        if let Some(steps) = &figures.steps {
            metrics::gauge!(STEPS_ATTENTION).set(steps.attention as f64);
        }
        if let Some(guard) = &figures.guard {
            metrics::gauge!(GUARD_OLDEST_AGE_SECONDS, "table" => guard.table.clone())
                .set(guard.oldest_age.unwrap_or_default());
        }
    }

    /// What this process's worker counted, per kind and per window.
    fn outcomes(&self) -> OutcomeFigures {
        self.exporter.watch.read(|detector| {
            let spiking = detector.spiking();
            let totals = detector
                .totals()
                .map(|(kind, applied, duplicates)| {
                    let totals = KindTotals {
                        applied,
                        duplicates,
                        spike: spiking.contains(&kind),
                    };
                    (kind.to_owned(), totals)
                })
                .collect();
            let mut windows: Vec<WindowFigures> =
                detector.history().map(WindowFigures::from).collect();
            let mut open = WindowFigures::from(&detector.open_window(SystemTime::now()));
            open.open = true;
            windows.push(open);
            OutcomeFigures {
                worker: self.worker,
                window: detector.config().window.as_secs_f64(),
                totals,
                windows,
            }
        })
    }
}

async fn dashboard() -> Html<&'static str> {
    Html(DASHBOARD)
}

async fn console_page() -> Html<&'static str> {
    Html(CONSOLE)
}

async fn health<DB: ExampleDb>(State(app): State<Arc<App<DB>>>) -> Response {
    match app.tables.queue.pool().acquire().await {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "error": error.to_string()})),
        )
            .into_response(),
    }
}

async fn metrics<DB: ExampleDb>(State(app): State<Arc<App<DB>>>) -> Response {
    // The counters are exported even when the database cannot be read.
    if let Err(error) = app.figures().await {
        tracing::warn!(
            error = format!("{error:#}"),
            "cannot sample the database for /metrics"
        );
    }
    app.exporter.render()
}

async fn stats<DB: ExampleDb>(State(app): State<Arc<App<DB>>>) -> Response {
    match app.figures().await {
        Ok(figures) => Json(figures).into_response(),
        Err(error) => failure(StatusCode::SERVICE_UNAVAILABLE, format!("{error:#}")),
    }
}

async fn replay<DB: ExampleDb>(State(app): State<Arc<App<DB>>>, Path(id): Path<i64>) -> Response {
    match app.tables.queue.replay(&Replay::Job(id)).await {
        Ok(replayed) if replayed.is_empty() => failure(
            StatusCode::CONFLICT,
            format!(
                "job {id} was not replayed: no dead job has that id, or another job with its key \
                 is waiting or running"
            ),
        ),
        Ok(replayed) => {
            tracing::info!(job.id = id, "dead letter replayed from the dashboard");
            // The next read shows it.
            *app.sampled.lock().await = None;
            Json(json!({"replayed": replayed})).into_response()
        }
        Err(error) => failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot replay job {id}: {error}"),
        ),
    }
}
