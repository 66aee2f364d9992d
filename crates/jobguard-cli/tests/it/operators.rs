//! The operator commands for effects outside the database, run as the real binary on a fresh
//! SQLite file: `jobguard outbox list|replay` and `jobguard steps list|resolve`.

use std::time::Duration;

use jobguard::outbox::Outbox;
use jobguard::steps::{Reconciled, StepConfig, Steps};
use jobguard::{JobError, JobKey};
use jobguard_provider::{Provider, ProviderConfig};
use serde_json::json;

use crate::common::{self, Db, Exit};

async fn jobguard(url: &str, args: &[&str]) -> Exit {
    let mut command = common::jobguard();
    command.args(args).args(["--database-url", url]);
    let output = tokio::process::Command::from(command)
        .output()
        .await
        .expect("run jobguard");
    Exit::from(output)
}

/// Runs `jobguard ARGS` and checks that it fails with `reason` on stderr.
async fn refused(url: &str, args: &[&str], reason: &str) {
    let run = jobguard(url, args).await;
    assert!(!run.ok && run.stderr.contains(reason), "{}", run.stderr);
}

/// A poison message is dead-lettered by `jobguard relay`, listed by `jobguard outbox list`,
/// and delivered once replayed and no longer refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_list_and_replay() {
    let db = Db::sqlite("operators::outbox");
    let url = &db.url;
    let pool = jobguard::sqlite::connect(url, 2).await.unwrap();
    let outbox = Outbox::new(pool.clone());
    outbox.migrate().await.unwrap();
    let provider = Provider::start(ProviderConfig::default()).await.unwrap();
    let webhooks = format!("{}/v1/webhooks", provider.url());

    let good = JobKey::new("invoice", ["order-1"]).unwrap();
    let poison = JobKey::new("invoice", ["order-2"]).unwrap();
    outbox
        .publish(&good, "invoices", &json!({"order": 1}))
        .await
        .unwrap();
    let poison_id = outbox
        .publish(&poison, "refunds", &json!({"order": 2, "reject": true}))
        .await
        .unwrap();

    let run = jobguard(
        url,
        &["relay", "--once", "--webhook-url", &webhooks, "--json"],
    )
    .await;
    assert!(run.ok, "{}", run.stderr);
    let run = jobguard(url, &["outbox", "list", "--json"]).await;
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(
        run.json["counts"],
        json!({"pending": 0, "sent": 1, "dead": 1}),
        "{}",
        run.stdout
    );
    let run = jobguard(url, &["outbox", "list", "--state", "dead", "--json"]).await;
    let dead = run.json["messages"].as_array().unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["id"], poison_id.as_str());
    assert!(
        dead[0]["last_error"].as_str().unwrap().contains("422"),
        "{}",
        run.stdout
    );
    let text = jobguard(url, &["outbox", "list"]).await;
    assert!(text.stdout.contains("1 dead"), "{}", text.stdout);
    assert!(
        text.stdout.contains("jobguard outbox replay"),
        "{}",
        text.stdout
    );

    // Bad ids are refused with a reason; unknown ones say nothing was replayed.
    refused(
        url,
        &["outbox", "replay", "--id", "no-topic"],
        "<job key>/<topic>",
    )
    .await;
    refused(
        url,
        &["outbox", "replay", "--id", "invoice:order-9/invoices"],
        "not replayed",
    )
    .await;

    let run = jobguard(
        url,
        &["outbox", "replay", "--id", poison_id.as_str(), "--json"],
    )
    .await;
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(run.json["replayed"], json!([poison_id.as_str()]));
    let run = jobguard(url, &["outbox", "list", "--json"]).await;
    assert_eq!(
        run.json["counts"],
        json!({"pending": 1, "sent": 1, "dead": 0})
    );
    provider.stop().await;
}

/// A step whose reconciler could not tell is listed by `jobguard steps list` and settled by
/// `jobguard steps resolve`; deliveries then return the recorded result without calling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_list_and_resolve() {
    let db = Db::sqlite("operators::steps");
    let url = &db.url;
    let pool = jobguard::sqlite::connect(url, 2).await.unwrap();
    let steps = Steps::with_config(pool.clone(), StepConfig::default().lease(Duration::ZERO));
    steps.migrate().await.unwrap();
    let key = JobKey::new("payout", ["invoice-311"]).unwrap();

    // A call that failed after it may have taken effect, then a reconciler that cannot tell.
    let failed = steps
        .run(
            &key,
            "transfer",
            async || -> Result<String, JobError> { Err(JobError::msg("timed out")) },
            async || -> Result<Reconciled<String>, JobError> { unreachable!() },
        )
        .await;
    assert!(failed.is_err());
    let unknown = steps
        .run(
            &key,
            "transfer",
            async || -> Result<String, JobError> { unreachable!("never called blindly") },
            async || Ok(Reconciled::Unknown("the bank's lookup is down".into())),
        )
        .await;
    assert!(matches!(
        unknown,
        Err(jobguard::Error::StepNeedsAttention { .. })
    ));

    let run = jobguard(url, &["steps", "list", "--json"]).await;
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(
        run.json,
        json!([{"key": "payout:invoice-311", "step": "transfer", "reason": "the bank's lookup is down"}])
    );
    let text = jobguard(url, &["steps", "list"]).await;
    assert!(text.stdout.contains("need attention"), "{}", text.stdout);

    let args = [
        "steps",
        "resolve",
        "payout:invoice-311",
        "transfer",
        "--done",
        "\"tr_77\"",
    ];
    let run = jobguard(url, &args).await;
    assert!(run.ok, "{}", run.stderr);
    refused(url, &args, "does not need attention").await;
    let run = jobguard(url, &["steps", "list", "--json"]).await;
    assert_eq!(run.json, json!([]));

    let outcome = steps
        .run(
            &key,
            "transfer",
            async || -> Result<String, JobError> { unreachable!("resolved as done") },
            async || -> Result<Reconciled<String>, JobError> { unreachable!() },
        )
        .await
        .unwrap();
    assert_eq!(outcome.into_value(), "tr_77");
}
