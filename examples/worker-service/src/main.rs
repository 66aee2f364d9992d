//! A service with its own jobs on jobguard's queue and worker, each applied once: a credit that
//! appends a ledger row in the guarded transaction, an email upsert that is idempotent by
//! itself, and a receipt whose first attempt fails and is retried. One credit is enqueued twice,
//! and again after it was applied; another is enqueued in the transaction that places its
//! order, and a third order's transaction rolls back with its credit. The worker runs until the
//! queue is empty, then the service prints what was applied.
//!
//! Runs on an embedded SQLite file in a temporary directory, or on PostgreSQL, in a schema
//! `worker_service` that it drops and creates afresh:
//!
//! ```sh
//! cargo run -p example-worker-service
//! cargo run -p example-worker-service -- --database-url postgres://postgres@127.0.0.1:5432/test
//! ```

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use example_worker_service::{Credit, Receipt, SetEmail, Store};
use jobguard::queue::Enqueued;
use jobguard::worker::shutdown_signal;
use jobguard::{Queue, RetryPolicy, Worker, WorkerConfig, WorkerStats};
use sqlx::Pool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[derive(Parser)]
struct Args {
    /// `postgres://...` or `sqlite:...`; by default a new SQLite file in a temporary directory.
    #[arg(long)]
    database_url: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Args::parse().database_url.as_deref() {
        Some(url) if url.starts_with("postgres") => {
            let options =
                PgConnectOptions::from_str(url)?.options([("search_path", "worker_service")]);
            let pool = PgPoolOptions::new()
                .max_connections(8)
                .connect_with(options)
                .await
                .context("connect to PostgreSQL")?;
            sqlx::raw_sql(
                "drop schema if exists worker_service cascade; create schema worker_service",
            )
            .execute(&pool)
            .await?;
            run(pool).await
        }
        Some(url) => run(jobguard::sqlite::connect(url, 8).await?).await,
        None => {
            let dir = std::env::temp_dir().join("jobguard-example-worker-service");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            let url = format!("sqlite:{}", dir.join("service.db").display());
            println!("database: {url}");
            run(jobguard::sqlite::connect(&url, 8).await?).await
        }
    }
}

async fn run<DB: Store>(pool: Pool<DB>) -> anyhow::Result<()> {
    DB::create_tables(&pool).await?;
    let queue = Queue::new(pool.clone());
    let worker = || -> jobguard::Result<Worker<DB>> {
        let config = WorkerConfig {
            concurrency: 4,
            poll_interval: Duration::from_millis(50),
            // A failed attempt runs again at once, so that this run ends when the queue is
            // empty; a service keeps the default backoff.
            retry: RetryPolicy {
                base: Duration::ZERO,
                ..RetryPolicy::default()
            },
            stop_when_idle: true,
            ..WorkerConfig::default()
        };
        Ok(Worker::with_config(queue.clone(), config)?
            .register::<Credit>()
            .register::<SetEmail>()
            .register::<Receipt>())
    };
    worker()?.migrate().await?;

    // A producer that retries: the same credit twice is one job.
    let credit = Credit {
        order: "order-1".into(),
        account: 7,
        amount: 500,
    };
    for _ in 0..2 {
        report("credit:order-1", queue.enqueue_job(&credit).await?);
    }
    // Orders placed with their credit in one transaction: enqueued on commit, never on rollback.
    for (order, commit) in [("order-2", true), ("order-3", false)] {
        let mut tx = pool.begin_with(DB::BEGIN).await?;
        DB::insert_order(&mut *tx, order).await?;
        let credit = Credit {
            order: order.into(),
            account: 7,
            amount: 250,
        };
        queue.enqueue_job_tx(&mut *tx, &credit).await?;
        if commit {
            tx.commit().await?;
            println!("placed {order} and enqueued its credit in one transaction: committed");
        } else {
            tx.rollback().await?;
            println!("placed {order} and enqueued its credit in one transaction: rolled back");
        }
    }
    let email = SetEmail {
        change: "change-41".into(),
        customer: 7,
        email: "ada@example.com".into(),
    };
    report("set-email:change-41", queue.enqueue_job(&email).await?);
    let receipt = Receipt {
        order: "order-1".into(),
    };
    report("receipt:order-1", queue.enqueue_job(&receipt).await?);
    show("first run", &worker()?.run(shutdown_signal()).await?);

    // The producer retries once more, after the credit was applied: a new job, and a duplicate.
    report("credit:order-1", queue.enqueue_job(&credit).await?);
    show("second run", &worker()?.run(shutdown_signal()).await?);

    let summary = DB::summary(&pool).await?;
    println!(
        "ledger: {} rows, total {}; orders: {}; receipts: {}; customer 7: {}",
        summary.ledger_rows,
        summary.ledger_total,
        summary.orders,
        summary.receipts,
        summary.email.as_deref().unwrap_or("no email")
    );
    pool.close().await;
    Ok(())
}

fn report(key: &str, enqueued: Enqueued) {
    let how = if enqueued.inserted {
        "new"
    } else {
        "already waiting"
    };
    println!("enqueued {key}: job {} ({how})", enqueued.id);
}

fn show(run: &str, stats: &WorkerStats) {
    println!(
        "{run}: {} applied, {} duplicates, {} failed and retried, {} dead",
        stats.applied, stats.duplicates, stats.failed, stats.dead
    );
}
