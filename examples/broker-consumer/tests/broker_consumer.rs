//! Runs the example's binary against Redis, then checks that both copies of every message
//! reached the stream and were acknowledged, and that the ledger holds each credit once.

use std::process::Command;

use jobguard_testsupport::{Service, scratch};
use sqlx::sqlite::SqlitePoolOptions;

const MESSAGES: i64 = 5;

#[tokio::test]
async fn each_message_published_twice_is_applied_once() {
    let Some(redis_url) = Service::Redis.url() else {
        return;
    };
    let run = format!("example-broker-consumer-{}", std::process::id());
    let stream = format!("{run}:credits");
    let dir = scratch("example", "broker_consumer");
    let database_url = format!("sqlite:{}", dir.join("consumer.db").display());

    let output = Command::new(env!("CARGO_BIN_EXE_example-broker-consumer"))
        .args(["--redis-url", &redis_url, "--stream", &stream])
        .args(["--database-url", &database_url])
        .args(["--messages", &MESSAGES.to_string()])
        .output()
        .expect("start the example");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the example failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("consumed: 5 applied, 5 duplicates, 0 failed, 0 dead"),
        "{stdout}"
    );

    // The stream got both copies of each message, and none is left pending.
    let mut redis = redis::Client::open(redis_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let entries: i64 = redis::cmd("XLEN")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(entries, 2 * MESSAGES);
    let pending: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
        .arg(&stream)
        .arg("jobguard")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(pending.count(), 0);
    let _: i64 = redis::cmd("DEL")
        .arg(&stream)
        .arg(format!("{stream}:dead"))
        .query_async(&mut redis)
        .await
        .unwrap();

    // One ledger row and one guard row per order.
    let pool = SqlitePoolOptions::new()
        .connect(&database_url)
        .await
        .unwrap();
    let ledger: Vec<(String, i64)> =
        sqlx::query_as("select order_id, count(*) from ledger group by order_id order by order_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected: Vec<(String, i64)> = (1..=MESSAGES).map(|n| (format!("order-{n}"), 1)).collect();
    assert_eq!(ledger, expected);
    let total: i64 = sqlx::query_scalar("select sum(amount) from ledger")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(total, 100 * (1..=MESSAGES).sum::<i64>());
    let guard_rows: i64 = sqlx::query_scalar("select count(*) from processed_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(guard_rows, MESSAGES);
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
