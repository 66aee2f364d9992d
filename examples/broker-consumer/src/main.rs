//! Jobs consumed from a real broker, Redis Streams, through the guard: each of N credit
//! messages is published twice, as a producer that retries after a lost answer does, and the
//! consumer applies N credits and reports N duplicates, acknowledging every entry only after
//! its transaction committed. Needs Redis 6.2 or later; the guard rows and the ledger are in
//! an embedded SQLite file in a temporary directory:
//!
//! ```sh
//! cargo run -p example-broker-consumer
//! cargo run -p example-broker-consumer -- --redis-url redis://127.0.0.1:6379 --messages 10
//! ```

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use jobguard::broker::redis::{RedisConfig, RedisSink, RedisSource};
use jobguard::broker::{Consumer, ConsumerConfig, Envelope};
use jobguard::{Job, JobError, JobKey, KeyError, SqliteGuard};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqliteConnection};

#[derive(Parser)]
struct Args {
    /// The Redis server.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// The stream the credits go through; deleted first, so each run starts empty.
    #[arg(long, default_value = "example:credits")]
    stream: String,
    /// How many credits to publish (each twice).
    #[arg(long, default_value_t = 5)]
    messages: u32,
    /// A `sqlite:` URL; by default a new file in a temporary directory.
    #[arg(long)]
    database_url: Option<String>,
}

/// Credits an account for an order: appends a ledger row, so a second run would credit twice.
#[derive(Serialize, Deserialize)]
struct Credit {
    order: String,
    account: i64,
    amount: i64,
}

impl Job<Sqlite> for Credit {
    const KIND: &'static str = "credit";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("credit", [&self.order])
    }

    async fn run(&self, conn: &mut SqliteConnection) -> Result<(), JobError> {
        sqlx::query("insert into ledger (order_id, account, amount) values ($1, $2, $3)")
            .bind(&self.order)
            .bind(self.account)
            .bind(self.amount)
            .execute(conn)
            .await?;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let url = match args.database_url {
        Some(url) => url,
        None => {
            let dir = std::env::temp_dir().join("jobguard-example-broker-consumer");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            format!("sqlite:{}", dir.join("consumer.db").display())
        }
    };
    let pool = jobguard::sqlite::connect(&url, 8).await?;
    sqlx::query(
        "create table if not exists ledger (order_id text not null, account integer not null, \
         amount integer not null)",
    )
    .execute(&pool)
    .await?;

    let config = RedisConfig::new(&args.stream);
    jobguard::broker::redis::remove(&args.redis_url, &config)
        .await
        .context("is Redis running? pass its URL with --redis-url")?;

    // The producer. Its sink appends a key once within a window; a zero window turns that off,
    // so that both copies of each message reach the stream, as copies from two producers would.
    let sink = RedisSink::connect(&args.redis_url)
        .await?
        .dedupe_window(Duration::ZERO);
    for n in 1..=args.messages {
        let credit = Credit {
            order: format!("order-{n}"),
            account: 7,
            amount: 100 * i64::from(n),
        };
        let envelope = Envelope::for_job::<Sqlite, _>(&credit)?;
        sink.publish(&args.stream, &envelope).await?;
        sink.publish(&args.stream, &envelope).await?;
    }
    println!(
        "published {} credits twice each to the stream `{}`",
        args.messages, args.stream
    );

    // The consumer, in as many processes as needed; this one stops once the stream is quiet.
    let consumer = Consumer::with_config(
        SqliteGuard::new(pool.clone()),
        ConsumerConfig {
            stop_when_idle_for: Some(Duration::from_secs(2)),
            ..ConsumerConfig::default()
        },
    )
    .register::<Credit>()
    // Called after each delivery's transaction, before its entry is acknowledged.
    .on_outcome(|key, outcome| println!("{key}: {}", outcome.label()));
    consumer.migrate().await?;
    let source = RedisSource::connect(&args.redis_url, config).await?;
    let stats = consumer
        .run(source, jobguard::worker::shutdown_signal())
        .await?;
    println!(
        "consumed: {} applied, {} duplicates, {} failed, {} dead",
        stats.applied, stats.duplicates, stats.failed, stats.dead
    );

    let (rows, total): (i64, i64) =
        sqlx::query_as("select count(*), coalesce(sum(amount), 0) from ledger")
            .fetch_one(&pool)
            .await?;
    println!("ledger: {rows} rows, total {total}");
    pool.close().await;
    Ok(())
}
