//! Runs the example's binary against Redis, then checks the stream and the outbox: the
//! committed order's message was appended once, the rolled-back order's never.

use std::process::Command;

use jobguard_testsupport::{Service, scratch};
use redis::streams::StreamRangeReply;
use sqlx::sqlite::SqlitePoolOptions;

#[tokio::test]
async fn a_committed_message_reaches_the_stream_once_and_a_rolled_back_one_never() {
    let Some(redis_url) = Service::Redis.url() else {
        return;
    };
    let run = format!("example-outbox-relay-{}", std::process::id());
    let prefix = format!("{run}:");
    let stream = format!("{prefix}orders");
    let dir = scratch("example", "outbox_relay");
    let database_url = format!("sqlite:{}", dir.join("shop.db").display());

    let output = Command::new(env!("CARGO_BIN_EXE_example-outbox-relay"))
        .args(["--redis-url", &redis_url, "--stream-prefix", &prefix])
        .args(["--database-url", &database_url])
        .output()
        .expect("start the example");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the example failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The relay did deliver twice: once with the answer lost, once confirmed.
    for line in [
        "relay run 1: 0 delivered, 1 retried, 0 dead",
        "relay run 2: 1 delivered, 0 retried, 0 dead",
        "relay run 3: 0 delivered, 0 retried, 0 dead",
    ] {
        assert!(stdout.contains(line), "no `{line}` in:\n{stdout}");
    }

    let mut redis = redis::Client::open(redis_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let entries: StreamRangeReply = redis::cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await
        .unwrap();
    let ids: Vec<String> = entries
        .ids
        .iter()
        .map(|entry| redis::from_redis_value_ref(&entry.map["id"]).unwrap())
        .collect();
    assert_eq!(ids, ["place-order:order-2/orders"], "{stdout}");
    let _: i64 = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();

    let pool = SqlitePoolOptions::new()
        .connect(&database_url)
        .await
        .unwrap();
    let orders: Vec<String> = sqlx::query_scalar("select id from orders")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(orders, ["order-2"]);
    let messages: Vec<(String, String)> = sqlx::query_as("select id, state from jobguard_outbox")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        messages,
        [("place-order:order-2/orders".to_owned(), "sent".to_owned())]
    );
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
