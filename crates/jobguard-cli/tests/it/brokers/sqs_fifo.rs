//! SQS FIFO through `jobguard consume` processes killed at random.

use std::time::Duration;

use jobguard::JobKey;
use jobguard::broker::Envelope;
use jobguard::broker::sqs::{self, SqsConfig, SqsSink, SqsSource};
use serde_json::json;

use super::{Broker, Consumer, Queue, ledger, redelivery, rows};
use crate::common::{Db, Rng, jobguard, seed, spawn};

/// SQS FIFO under SIGKILL: consumer processes on one FIFO queue, each message group an
/// account's credits in order, killed with SIGKILL at random moments (mid-job, between commit
/// and delete, with messages of their groups waiting behind) and started again. Every key is
/// applied once, none is lost or dead-lettered, and each account's ledger rows were written in
/// the order its credits were sent: a group's credits never ran at once or out of order. The
/// seed is printed; `JOBGUARD_CHAOS_SEED` replays a run's choices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_holds_with_consumers_killed_at_random() {
    const GROUPS: usize = 4;
    const PER_GROUP: usize = 25;
    const CONSUMERS: usize = 3;
    const KILLS: usize = 6;
    // Deliveries to spare: each kill and each message given back behind a failed one is a
    // receive more, and a message received this often without settling is dead-lettered.
    const DELIVERIES: &str = "50";
    let Some(url) = Broker::Sqs.url() else {
        return;
    };
    let queue = Queue {
        broker: Broker::Sqs,
        url,
        name: "jgcli.fifo-chaos.fifo".to_owned(),
    };
    let config = SqsConfig {
        max_deliveries: DELIVERIES.parse().unwrap(),
        ..queue.sqs()
    };
    assert!(config.is_fifo(), "{}", config.queue);
    sqs::remove(&queue.url, &config).await.unwrap();
    drop(
        SqsSource::connect(&queue.url, config.clone())
            .await
            .unwrap(),
    );
    let db = Db::postgres_or_sqlite("brokers::sqs_fifo_chaos");

    let sink = SqsSink::connect(&queue.url).unwrap();
    for seq in 0..PER_GROUP {
        for group in 1..=GROUPS {
            let order = format!("g{group}-{seq:03}");
            let key = JobKey::new("credit", [&order]).unwrap();
            let envelope = Envelope::new(
                "credit",
                key,
                &json!({"order": order, "account": group, "amount": 1, "hold_ms": 30}),
            )
            .unwrap();
            sink.publish_in_group(&config.queue, &envelope, &format!("account-{group}"))
                .await
                .unwrap();
        }
    }

    let seed = seed();
    eprintln!(
        "brokers::sqs_fifo::order_holds_with_consumers_killed_at_random: JOBGUARD_CHAOS_SEED={seed}"
    );
    let mut rng = Rng(seed);
    let start = |n: usize| {
        let redelivery = format!("{}ms", redelivery(Broker::Sqs).as_millis());
        let mut command = jobguard();
        command
            .args(["consume", "--broker", "sqs", "--url", &queue.url])
            .args(["--queue", &queue.name, "--redelivery", &redelivery])
            .args(["--max-deliveries", DELIVERIES, "--retry-delay", "100ms"])
            .args(["--prefetch", "10", "--until-idle", "8s", "--json"])
            .args(["--database-url", &db.url]);
        Consumer(spawn(&db.dir, &format!("fifo-{n}"), command))
    };
    let mut started = 0;
    let mut consumers: Vec<Consumer> = (0..CONSUMERS)
        .map(|_| {
            started += 1;
            start(started)
        })
        .collect();
    let mut kills = 0;
    while kills < KILLS {
        tokio::time::sleep(Duration::from_millis(300 + rng.below(1200))).await;
        let victim = rng.below(CONSUMERS as u64) as usize;
        if consumers[victim].0.running() {
            consumers[victim].sigkill();
            kills += 1;
        }
        started += 1;
        consumers[victim] = start(started);
    }
    let mut dead = 0;
    for consumer in consumers {
        let report = consumer.report().await;
        dead += report["dead"].as_u64().unwrap();
    }
    // Anything a killed consumer held and no survivor took up yet.
    let report = start(started + 1).report().await;
    dead += report["dead"].as_u64().unwrap();

    let rows = ledger_in_order(&db).await;
    let total = (GROUPS * PER_GROUP) as i64;
    assert_eq!(
        ledger(&db).await,
        (total, total),
        "each key applied once, none lost (seed {seed})"
    );
    assert_eq!(dead, 0, "nothing dead-lettered (seed {seed})");
    for group in 1..=GROUPS as i64 {
        let orders: Vec<&str> = rows
            .iter()
            .filter(|(account, _)| *account == group)
            .map(|(_, key)| key.as_str())
            .collect();
        let sent: Vec<String> = (0..PER_GROUP)
            .map(|seq| format!("credit:g{group}-{seq:03}"))
            .collect();
        assert_eq!(
            orders, sent,
            "account {group}'s credits applied in the order sent (seed {seed})"
        );
    }
    let client = sqs::client(&queue.url).unwrap();
    for name in [&config.queue, &config.dead_letter_queue] {
        let url = client
            .get_queue_url()
            .queue_name(name.as_str())
            .send()
            .await
            .unwrap()
            .queue_url
            .unwrap();
        let left = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap();
        assert!(left.messages().is_empty(), "{name} is empty: {left:?}");
    }
    sqs::remove(&queue.url, &config).await.unwrap();
}

/// `jobguard_ledger`'s rows in the order they were written: account and job key.
async fn ledger_in_order(db: &Db) -> Vec<(i64, String)> {
    let sql = "select account, job_key from jobguard_ledger order by id";
    rows(db, sql, None).await.unwrap()
}
