//! SQS FIFO through `jobguard consume` processes killed at random.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use jobguard::JobKey;
use jobguard::broker::Envelope;
use jobguard::broker::sqs::{self, SqsConfig, SqsSink, SqsSource};
use jobguard_testsupport::skip;
use serde_json::json;

use super::{Broker, Consumer, Queue, ledger, redelivery, rows};
use crate::common::{Db, Rng, jobguard, seed, spawn};

/// SQS FIFO under SIGKILL: consumer processes on one FIFO queue, each message group an
/// account's credits in order, killed with SIGKILL at random moments (mid-job, between commit
/// and delete, with messages of their groups waiting behind) and started again. Every key is
/// applied once, none is lost or dead-lettered, and each account's ledger rows were written in
/// the order its credits were sent: a group's credits never ran at once or out of order. The
/// seed is printed; `JOBGUARD_CHAOS_SEED` replays a run's choices.
///
/// A group's order is the consumer's to keep only if the server handed the group out in order.
/// The tests' moto (scripts/lib/moto_sqs.py) checks each FIFO receive against SQS's rule and
/// tags the queue `moto-fifo-order-broken:<group>` when it breaks it; a group out of order in
/// the ledger whose tag is there is reported as the server's and not judged, any other fails
/// the test, and so does a run in which no group could be judged.
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
    let broken_by_server = server_order_breaches(&queue.url, &config.queue).await;
    let mut not_judged = 0;
    for group in 1..=GROUPS as i64 {
        let orders: Vec<&str> = rows
            .iter()
            .filter(|(account, _)| *account == group)
            .map(|(_, key)| key.as_str())
            .collect();
        let sent: Vec<String> = (0..PER_GROUP)
            .map(|seq| format!("credit:g{group}-{seq:03}"))
            .collect();
        if orders != sent
            && let Some(breach) = broken_by_server.get(&format!("account-{group}"))
        {
            eprintln!(
                "account {group}'s credits applied out of order, but the SQS server handed \
                 group account-{group} out of order first ({breach}): moto's fault, not the \
                 consumer's; that group is not judged (seed {seed})"
            );
            not_judged += 1;
            continue;
        }
        assert_eq!(
            orders, sent,
            "account {group}'s credits applied in the order sent (seed {seed}); the server \
             named no breach of that group's order"
        );
    }
    assert!(
        not_judged < GROUPS,
        "the SQS server broke every group's order, so the consumer's was never judged \
         (seed {seed}): {broken_by_server:?}"
    );
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

/// The groups of `queue` whose order the tests' moto says it broke, each with what it did: the
/// queue's tags `moto-fifo-order-broken:<group>` (scripts/lib/moto_sqs.py). None on a server
/// that keeps SQS's FIFO rules.
async fn server_order_breaches(url: &str, queue: &str) -> BTreeMap<String, String> {
    let client = sqs::client(url).unwrap();
    let url = client
        .get_queue_url()
        .queue_name(queue)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let tags = client
        .list_queue_tags()
        .queue_url(url)
        .send()
        .await
        .unwrap()
        .tags
        .unwrap_or_default();
    tags.into_iter()
        .filter_map(|(key, what)| {
            key.strip_prefix("moto-fifo-order-broken:")
                .map(|group| (group.to_owned(), what))
        })
        .collect()
}

/// moto as shipped hands out the last of a FIFO group's messages that time out together, not
/// the first (SQS hands out the first); moto as the tests run it hands them out in order.
/// scripts/lib/moto_fifo_order.py shows both with moto in process, on the Python that has moto
/// (`JOBGUARD_TEST_SQS_PYTHON`, set by scripts/test, else moto's cached virtualenv or
/// `python3`). The order the tests' server keeps is what is asserted; a moto that ships the
/// order kept is said on stderr (moto_sqs.py's FIFO pass and docs/sqs.md then say more than
/// they need), not failed: a fresh machine installs the newest moto.
#[test]
fn moto_inverts_a_group_timed_out_together() {
    let Some(python) = moto_python() else {
        return;
    };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/lib/moto_fifo_order.py"
    );
    let output = Command::new(&python)
        .arg(script)
        .output()
        .expect("run moto_fifo_order.py");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{printed}");
    assert!(
        output.status.success(),
        "moto_fifo_order.py ({python}): {}\n{printed}",
        output.status
    );
    if !printed.contains("moto as shipped, after the visibility timeout, hands out ['g-3']") {
        eprintln!(
            "moto as shipped no longer hands out a group's last message first: the FIFO pass \
             of scripts/lib/moto_sqs.py may go"
        );
    }
    assert!(
        printed.contains("moto as the tests run it (moto_sqs.py) hands out ['g-1', 'g-2', 'g-3']"),
        "{printed}"
    );
}

/// A Python that imports moto and boto3, or `None` after [`skip`] said so.
fn moto_python() -> Option<String> {
    let venv = std::env::var("JOBGUARD_SQS_VENV").ok().or_else(|| {
        let cache = std::env::var("XDG_CACHE_HOME").ok().or_else(|| {
            std::env::var("HOME")
                .ok()
                .map(|home| format!("{home}/.cache"))
        })?;
        Some(format!("{cache}/jobguard/moto-venv"))
    });
    let candidates = std::env::var("JOBGUARD_TEST_SQS_PYTHON")
        .ok()
        .into_iter()
        .chain(venv.map(|venv| format!("{venv}/bin/python")))
        .chain(["python3".to_owned()]);
    for python in candidates {
        let imports = Command::new(&python)
            .args(["-c", "import boto3, moto.sqs.models"])
            .output()
            .is_ok_and(|output| output.status.success());
        if imports {
            return Some(python);
        }
    }
    skip(
        "no Python with moto (JOBGUARD_TEST_SQS_PYTHON, moto's virtualenv, python3)",
        "run scripts/test, which installs moto[server], or set JOBGUARD_TEST_SQS_PYTHON",
    )
}

/// `jobguard_ledger`'s rows in the order they were written: account and job key.
async fn ledger_in_order(db: &Db) -> Vec<(i64, String)> {
    let sql = "select account, job_key from jobguard_ledger order by id";
    rows(db, sql, None).await.unwrap()
}
