//! The transactional outbox: an order and the message announcing it are written in one
//! transaction, then a relay delivers the message to Redis Streams. The first order's
//! transaction rolls back, and nothing is ever published for it; the second commits, and its
//! message reaches the stream once, though the relay delivers it twice (the answer to its
//! first append is lost) and then runs once more: the message keeps one id, and the Redis sink
//! appends an id once. Needs Redis; the orders and the outbox are in an embedded SQLite file in
//! a temporary directory:
//!
//! ```sh
//! cargo run -p example-outbox-relay
//! cargo run -p example-outbox-relay -- --redis-url redis://127.0.0.1:6379
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use jobguard::broker::redis::RedisSink;
use jobguard::outbox::{OutboxMessage, RelayConfig, Sink, SinkError};
use jobguard::{JobKey, Outbox, Relay, RetryPolicy};
use redis::streams::StreamRangeReply;
use serde_json::json;
use sqlx::SqlitePool;

#[derive(Parser)]
struct Args {
    /// The Redis server.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Topic `orders` goes to the stream `<prefix>orders`, kept after the run. By default a
    /// prefix of this run's own, whose stream is deleted at the end.
    #[arg(long)]
    stream_prefix: Option<String>,
    /// A `sqlite:` URL; by default a new file in a temporary directory.
    #[arg(long)]
    database_url: Option<String>,
}

/// Appends to Redis as the sink it wraps does, but reports the first append as failed, as when
/// the answer to it is lost on the way back: the relay then delivers the message again.
struct FirstAnswerLost {
    sink: RedisSink,
    lost: AtomicBool,
}

impl Sink for FirstAnswerLost {
    async fn deliver(&self, message: &OutboxMessage) -> Result<(), SinkError> {
        self.sink.deliver(message).await?;
        if !self.lost.swap(true, Ordering::SeqCst) {
            return Err(SinkError::retryable("the answer from Redis was lost"));
        }
        Ok(())
    }
}

/// Places `order` and publishes `orders` about it in one transaction, committed or not.
async fn place(
    pool: &SqlitePool,
    outbox: &Outbox<sqlx::Sqlite>,
    order: &str,
    commit: bool,
) -> anyhow::Result<()> {
    // `begin immediate`: SQLite's write lock up front, as the outbox asks.
    let mut tx = pool.begin_with("begin immediate").await?;
    sqlx::query("insert into orders (id, amount) values ($1, 4200)")
        .bind(order)
        .execute(&mut *tx)
        .await?;
    let key = JobKey::new("place-order", [order])?;
    let id = outbox
        .publish_tx(
            &mut tx,
            &key,
            "orders",
            &json!({"order": order, "amount": 4200}),
        )
        .await?;
    if commit {
        tx.commit().await?;
        println!("{order}: committed with the message {id}");
    } else {
        tx.rollback().await?;
        println!("{order}: rolled back, and the message {id} with it");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let url = match args.database_url {
        Some(url) => url,
        None => {
            let dir = std::env::temp_dir().join("jobguard-example-outbox-relay");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            format!("sqlite:{}", dir.join("shop.db").display())
        }
    };
    let pool = jobguard::sqlite::connect(&url, 4).await?;
    sqlx::query("create table if not exists orders (id text primary key, amount integer not null)")
        .execute(&pool)
        .await?;
    let outbox = Outbox::new(pool.clone());
    outbox.migrate().await?;

    place(&pool, &outbox, "order-1", false).await?;
    place(&pool, &outbox, "order-2", true).await?;

    // Each run its own stream: the sink remembers the ids it appended to a stream for two
    // minutes, and this run's ids are the last run's.
    let prefix = args
        .stream_prefix
        .clone()
        .unwrap_or_else(|| format!("example:outbox:{}:", std::process::id()));
    let stream = format!("{prefix}orders");
    let sink = RedisSink::connect(&args.redis_url)
        .await
        .context("is Redis running? pass its URL with --redis-url")?
        .stream_prefix(&prefix);
    let config = RelayConfig {
        retry: RetryPolicy::new(10, Duration::from_millis(50), Duration::from_secs(1), 0.0)?,
        ..RelayConfig::default()
    };
    let sink = FirstAnswerLost {
        sink,
        lost: AtomicBool::new(false),
    };
    let relay = Relay::with_config(outbox.clone(), sink, config)?;
    for run in 1..=3 {
        if run > 1 {
            // Past the backoff of a failed delivery.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let report = relay.drain().await?;
        println!(
            "relay run {run}: {} delivered, {} retried, {} dead",
            report.delivered, report.retried, report.dead
        );
    }

    let mut redis = redis::Client::open(args.redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let entries: StreamRangeReply = redis::cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await?;
    println!("the stream `{stream}` holds:");
    for entry in &entries.ids {
        let id: String = redis::from_redis_value_ref(&entry.map["id"])?;
        let body: String = redis::from_redis_value_ref(&entry.map["body"])?;
        println!("  {id}: {body}");
    }
    let counts = outbox.counts().await?;
    println!(
        "outbox: {} sent, {} pending, {} dead",
        counts.sent, counts.pending, counts.dead
    );
    if args.stream_prefix.is_none() {
        let _: i64 = redis::cmd("DEL")
            .arg(&stream)
            .query_async(&mut redis)
            .await?;
    }
    pool.close().await;
    Ok(())
}
