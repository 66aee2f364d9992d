//! `jobguard bench brokers` with a few messages.

use serde_json::Value;

use super::Broker;
use crate::common::Db;

/// `jobguard bench brokers` with a few messages: every broker that answers is measured one
/// per transaction and in batches, each run applying every message once; one that does not
/// answer is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applies_every_message_once() {
    let db = Db::postgres_or_sqlite("brokers::bench");
    // A broker that does not answer gets a port nothing listens on, and must be skipped.
    let urls: Vec<(Broker, Option<String>)> = Broker::ALL.iter().map(|b| (*b, b.url())).collect();
    let flag = |broker: Broker| format!("--{}-url", broker.name());
    let mut args: Vec<String> = [
        "bench",
        "brokers",
        "--messages",
        "120",
        "--batch-size",
        "20",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend([
        "--concurrency".to_owned(),
        "4".to_owned(),
        "--json".to_owned(),
    ]);
    for (broker, url) in &urls {
        let url = url.clone().unwrap_or_else(|| match broker {
            Broker::Rabbitmq => "amqp://127.0.0.1:1".to_owned(),
            Broker::Nats => "nats://127.0.0.1:1".to_owned(),
            Broker::Redis => "redis://127.0.0.1:1".to_owned(),
            Broker::Sqs => "http://127.0.0.1:1".to_owned(),
            Broker::Kafka => "kafka://127.0.0.1:1".to_owned(),
        });
        args.extend([flag(*broker), url]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = db
        .command(&args)
        .output()
        .expect("run jobguard bench brokers");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["messages"], 120, "{report}");
    assert_eq!(report["batch_size"], 20, "{report}");
    assert_eq!(report["exactly_once"], true, "{report}");
    let measured = report["brokers"].as_array().expect("brokers");
    let skipped = report["skipped"].as_array().expect("skipped");
    for (broker, url) in &urls {
        let name = broker.name();
        if url.is_none() {
            assert!(skipped.iter().any(|s| s["broker"] == name), "{report}");
            continue;
        }
        let figures = measured
            .iter()
            .find(|f| f["broker"] == name)
            .unwrap_or_else(|| panic!("{name} was not measured: {report}"));
        for (run, size) in [("per_message", 1), ("batched", 20)] {
            let run = &figures[run];
            assert_eq!(run["batch_size"], size, "{report}");
            assert_eq!(run["ledger_rows"], 120, "{report}");
            assert_eq!(run["applied"], 120, "{report}");
            assert_eq!(run["duplicates"], 0, "{report}");
            assert!(run["messages_per_s"].as_f64().unwrap() > 0.0, "{report}");
        }
        assert!(figures["ratio"].as_f64().unwrap() > 0.0, "{report}");
        assert_eq!(figures["exactly_once"], true, "{report}");
    }
}

/// `--brokers redis` measures Redis alone and reports every other broker as not selected,
/// without trying to reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measures_only_the_selected_brokers() {
    let Some(url) = Broker::Redis.url() else {
        return;
    };
    let db = Db::postgres_or_sqlite("brokers::bench_selected");
    let output = db
        .command(&[
            "bench",
            "brokers",
            "--brokers",
            "redis",
            "--messages",
            "40",
            "--batch-size",
            "10",
            "--concurrency",
            "4",
            "--redis-url",
            &url,
            // Nothing listens here: a broker not selected is never dialled.
            "--rabbitmq-url",
            "amqp://127.0.0.1:1",
            "--json",
        ])
        .output()
        .expect("run jobguard bench brokers");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let measured = report["brokers"].as_array().expect("brokers");
    assert_eq!(measured.len(), 1, "{report}");
    assert_eq!(measured[0]["broker"], "redis", "{report}");
    assert_eq!(measured[0]["batched"]["ledger_rows"], 40, "{report}");
    let skipped = report["skipped"].as_array().expect("skipped");
    for name in ["rabbitmq", "nats", "sqs", "kafka"] {
        let entry = skipped
            .iter()
            .find(|s| s["broker"] == name)
            .unwrap_or_else(|| panic!("{name} not reported: {report}"));
        assert_eq!(entry["reason"], "not selected with --brokers", "{report}");
    }
}
