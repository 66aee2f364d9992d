//! The operations commands run as an operator runs them: `jobguard enqueue`, `worker`, `jobs`
//! and `dead`, the real binary on a fresh SQLite file per test, and on a fresh PostgreSQL
//! schema per test when PostgreSQL answers.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{COMMAND_TIMEOUT, Db, block_on};
use crate::{each_backend, on_pool};

fn enqueue(db: &Db, kind: &str, payload: &Value, extra: &[&str]) -> Value {
    let payload = payload.to_string();
    let mut args = vec!["enqueue", kind, "--payload", &payload];
    args.extend_from_slice(extra);
    db.json(&args)
}

fn worker_until_idle(db: &Db, extra: &[&str]) -> Value {
    let mut args = vec!["worker", "--until-idle"];
    args.extend_from_slice(extra);
    db.json(&args)
}

/// Rows and total amount of the credit job's ledger, read directly.
fn ledger(db: &Db) -> (i64, i64) {
    let sql = "select count(*), cast(coalesce(sum(amount), 0) as bigint) from jobguard_ledger";
    on_pool!(db, |pool| sqlx::query_as(sql).fetch_one(pool)).unwrap()
}

fn credit(n: i64) -> Value {
    json!({"order": format!("order-{n}"), "account": n, "amount": 100 + 10 * n})
}

fn counts(db: &Db) -> Value {
    db.json(&["jobs"])["counts"].clone()
}

fn stats(report: &Value) -> [u64; 6] {
    [
        "applied",
        "duplicates",
        "failed",
        "dead",
        "fenced",
        "released",
    ]
    .map(|field| report[field].as_u64().unwrap_or_else(|| panic!("{report}")))
}

/// Five credits enqueued twice are five jobs; the worker applies each once; a credit enqueued
/// again after it completed is a new job that the guard completes as a duplicate.
fn credits_apply_once(db: &Db) {
    let mut ids = Vec::new();
    for n in 1..=5 {
        let enqueued = enqueue(db, "credit", &credit(n), &[]);
        assert_eq!(enqueued["inserted"], true, "{enqueued}");
        assert_eq!(enqueued["key"], format!("credit:order-{n}"));
        ids.push(enqueued["id"].as_i64().unwrap());
    }
    for (n, id) in (1..=5).zip(&ids) {
        let again = enqueue(db, "credit", &credit(n), &[]);
        assert_eq!(again["inserted"], false, "{again}");
        assert_eq!(again["id"], *id, "the waiting job is returned");
    }
    assert_eq!(
        counts(db),
        json!({"available": 5, "running": 0, "completed": 0, "dead": 0})
    );

    let report = worker_until_idle(db, &[]);
    assert_eq!(stats(&report), [5, 0, 0, 0, 0, 0], "{report}");
    let expected_total = (1..=5).map(|n| 100 + 10 * n).sum::<i64>();
    assert_eq!(ledger(db), (5, expected_total));

    let listed = db.json(&["jobs", "--state", "completed", "--kind", "credit"]);
    assert_eq!(
        listed["counts"],
        json!({"available": 0, "running": 0, "completed": 5, "dead": 0})
    );
    let jobs = listed["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 5);
    let mut listed_ids: Vec<i64> = jobs.iter().map(|j| j["id"].as_i64().unwrap()).collect();
    listed_ids.sort();
    assert_eq!(listed_ids, ids);
    assert!(
        jobs.iter()
            .all(|j| j["attempt"] == 1 && j["state"] == "completed")
    );
    assert_eq!(jobs[0]["id"], ids[4], "newest first");
    assert_eq!(jobs[0]["payload"], credit(5));
    let limited = db.json(&["jobs", "--limit", "2"]);
    assert_eq!(limited["jobs"].as_array().unwrap().len(), 2);

    // The same credit once more: the completed job no longer holds the key, so it is a new
    // job, and the guard completes it without a second ledger row.
    let replayed = enqueue(db, "credit", &credit(3), &[]);
    assert_eq!(replayed["inserted"], true);
    let report = worker_until_idle(db, &[]);
    assert_eq!(stats(&report), [0, 1, 0, 0, 0, 0], "{report}");
    assert_eq!(ledger(db), (5, expected_total));
}

/// A fatal failure goes to the dead letters with its error, and comes back with replay; a
/// retryable one runs until its attempts run out.
fn failures_are_dead_lettered_and_replayed(db: &Db) {
    let fatal = enqueue(db, "fail", &json!({"id": "boom", "fatal": true}), &[]);
    let id = fatal["id"].as_i64().unwrap();
    let report = worker_until_idle(db, &[]);
    assert_eq!(stats(&report), [0, 0, 0, 1, 0, 0], "{report}");

    let dead = db.json(&["dead", "list"]);
    let dead = dead.as_array().unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["id"], id);
    assert_eq!(dead[0]["kind"], "fail");
    assert_eq!(dead[0]["key"], "fail:boom");
    assert_eq!(dead[0]["state"], "dead");
    assert_eq!(dead[0]["attempt"], 1, "fatal: no retry");
    let error = dead[0]["last_error"].as_str().unwrap();
    assert!(
        error.contains("fail:boom") && error.contains("fatal"),
        "{error}"
    );

    let replayed = db.json(&["dead", "replay", "--id", &id.to_string()]);
    assert_eq!(replayed, json!({"replayed": [id]}));
    assert_eq!(db.json(&["dead", "list"]), json!([]));
    let available = db.json(&["jobs", "--state", "available"]);
    assert_eq!(available["jobs"][0]["id"], id);
    assert_eq!(available["jobs"][0]["attempt"], 0, "fresh attempts");
    // Replaying it again finds nothing dead: a clear error.
    let stderr = db.fails(&["dead", "replay", "--id", &id.to_string()]);
    assert!(
        stderr.contains(&format!("job {id} was not replayed")),
        "{stderr}"
    );

    // It runs again and fails again.
    let report = worker_until_idle(db, &[]);
    assert_eq!(stats(&report), [0, 0, 0, 1, 0, 0], "{report}");

    // Retryable: two attempts, the second one dead-letters it.
    let retried = enqueue(
        db,
        "fail",
        &json!({"id": "flaky"}),
        &["--max-attempts", "2"],
    );
    let report = worker_until_idle(db, &["--backoff", "0s"]);
    assert_eq!(stats(&report), [0, 0, 1, 1, 0, 0], "{report}");
    let flaky = db.json(&["dead", "list", "--kind", "fail", "--limit", "1"]);
    assert_eq!(flaky[0]["id"], retried["id"]);
    assert_eq!(
        (&flaky[0]["attempt"], &flaky[0]["max_attempts"]),
        (&json!(2), &json!(2))
    );
    assert!(
        flaky[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("retryable"),
        "{flaky}"
    );

    // Replay by kind brings both back; the worker fails them again.
    let replayed = db.json(&["dead", "replay", "--kind", "fail"]);
    let mut replayed: Vec<i64> = serde_json::from_value(replayed["replayed"].clone()).unwrap();
    replayed.sort();
    assert_eq!(replayed, vec![id, retried["id"].as_i64().unwrap()]);
    assert_eq!(counts(db)["dead"], 0);
    assert_eq!(
        db.json(&["dead", "replay", "--all"]),
        json!({"replayed": []})
    );
}

/// Bad input exits non-zero with a message that says what is wrong, and enqueues nothing.
fn bad_input_is_refused(db: &Db) {
    // No queue yet: reading says so rather than showing an empty queue.
    let stderr = db.fails(&["jobs"]);
    assert!(stderr.contains("no job queue"), "{stderr}");

    let stderr = db.fails(&["enqueue", "credit", "--payload", "{\"order\": "]);
    assert!(stderr.contains("--payload is not valid JSON"), "{stderr}");
    let stderr = db.fails(&["enqueue", "credit", "--payload", r#"{"order": "o-1"}"#]);
    assert!(
        stderr.contains("does not fit a `credit` job") && stderr.contains("missing field"),
        "{stderr}"
    );
    let stderr = db.fails(&[
        "enqueue",
        "credit",
        "--payload",
        r#"{"order": "o-1", "account": 1, "amount": 0}"#,
    ]);
    assert!(stderr.contains("non-zero"), "{stderr}");
    let stderr = db.fails(&["enqueue", "email", "--payload", "{}"]);
    assert!(stderr.contains("--key"), "{stderr}");
    let stderr = db.fails(&["enqueue", "email", "--payload", "{}", "--key", "email:a%b"]);
    assert!(
        stderr.contains("invalid --key") && stderr.contains("malformed escape"),
        "{stderr}"
    );
    let stderr = db.fails(&["enqueue", "email", "--payload", "{}", "--key", "email"]);
    assert!(stderr.contains("no business parts"), "{stderr}");
    let stderr = db.fails(&[
        "enqueue",
        "email",
        "--payload",
        r#"{"body": "a\u0000b"}"#,
        "--key",
        "email:user-7",
    ]);
    assert!(stderr.contains("NUL"), "{stderr}");
    let stderr = db.fails(&[
        "enqueue",
        "noop",
        "--payload",
        r#"{"id": "a"}"#,
        "--key",
        "noop:b",
    ]);
    assert!(stderr.contains("derived from its payload"), "{stderr}");
    let stderr = db.fails(&["enqueue", "noop", "--payload", "{}", "--delay", "5"]);
    assert!(stderr.contains("--delay"), "{stderr}");
    let stderr = db.fails(&["dead", "replay"]);
    assert!(stderr.contains("--id"), "{stderr}");

    // A key held by a waiting job, with another payload.
    let first = enqueue(db, "credit", &credit(1), &[]);
    assert_eq!(first["inserted"], true);
    let mut other = credit(1);
    other["amount"] = json!(999);
    let stderr = db.fails(&["enqueue", "credit", "--payload", &other.to_string()]);
    assert!(
        stderr.contains("credit:order-1") && stderr.contains("another payload"),
        "{stderr}"
    );
    // A kind of the user's own reusing it too.
    let stderr = db.fails(&[
        "enqueue",
        "email",
        "--payload",
        "{}",
        "--key",
        "credit:order-1",
    ]);
    assert!(stderr.contains("another payload or kind"), "{stderr}");

    // Nothing but the first credit was enqueued.
    assert_eq!(
        counts(db),
        json!({"available": 1, "running": 0, "completed": 0, "dead": 0})
    );
}

each_backend!(credits_apply_once);

each_backend!(failures_are_dead_lettered_and_replayed);

each_backend!(bad_input_is_refused);

#[test]
fn jobs_of_other_kinds_wait_for_their_own_worker() {
    let db = Db::sqlite("ops::custom");
    let run = db.run(&[
        "enqueue",
        "email",
        "--payload",
        r#"{"to": "a@example.com"}"#,
        "--key",
        "email:welcome:user-7",
        "--queue",
        "mail",
        "--delay",
        "1h",
    ]);
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout.contains("enqueued job 1 (email:welcome:user-7)"),
        "{}",
        run.stdout
    );
    assert!(run.stderr.contains("worker of your own"), "{}", run.stderr);

    // Delayed an hour, on another queue: no worker takes it now.
    let report = worker_until_idle(&db, &["--queue", "mail"]);
    assert_eq!(stats(&report), [0; 6], "{report}");
    let listed = db.json(&["jobs", "--kind", "email"]);
    let job = &listed["jobs"][0];
    assert_eq!(
        (&job["queue"], &job["state"], &job["key"]),
        (
            &json!("mail"),
            &json!("available"),
            &json!("email:welcome:user-7")
        )
    );
    let delay_ms = job["run_at"].as_i64().unwrap() - job["created_at"].as_i64().unwrap();
    assert!((3_590_000..=3_610_000).contains(&delay_ms), "{delay_ms}");
}

#[test]
fn human_output_is_readable() {
    let db = Db::sqlite("ops::human");
    let run = db.run(&["enqueue", "credit", "--payload", &credit(1).to_string()]);
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout.contains("enqueued job 1 (credit:order-1)"),
        "{}",
        run.stdout
    );
    let run = db.run(&["enqueue", "credit", "--payload", &credit(1).to_string()]);
    assert!(
        run.stdout.contains("already waiting or running"),
        "{}",
        run.stdout
    );
    let failing = db.json(&[
        "enqueue",
        "fail",
        "--payload",
        r#"{"id": "x", "fatal": true}"#,
    ]);

    let run = db.run(&["worker", "--until-idle"]);
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stderr.contains("jobguard worker: queue `default`"),
        "{}",
        run.stderr
    );
    assert!(
        run.stdout.contains("applied") && run.stdout.contains("dead-lettered"),
        "{}",
        run.stdout
    );

    let run = db.run(&["jobs"]);
    assert!(
        run.stdout
            .contains("jobs by state: 0 available, 0 running, 1 completed, 1 dead"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("credit:order-1"), "{}", run.stdout);

    let run = db.run(&["dead", "list"]);
    assert!(
        run.stdout.contains("1 dead job, newest first"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("fail:x failed on purpose"),
        "{}",
        run.stdout
    );
    let run = db.run(&["dead", "replay", "--all"]);
    let replayed = format!("replayed 1 dead job: {}", failing["id"]);
    assert!(run.stdout.contains(&replayed), "{}", run.stdout);
}

/// Without --until-idle the worker runs until it is told to stop, and reports what it did.
#[cfg(unix)]
#[test]
fn worker_stops_on_sigterm() {
    let db = Db::sqlite("ops::signal");
    let mut worker = db.spawn("worker", &["worker", "--json", "--poll", "50ms"]);
    for n in 1..=3 {
        enqueue(&db, "credit", &credit(n), &[]);
    }
    let started = Instant::now();
    while counts(&db)["completed"] != 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the worker ran nothing"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    worker.signal("TERM");
    let run = worker.finish(COMMAND_TIMEOUT);
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(stats(&run.json), [3, 0, 0, 0, 0, 0], "{}", run.stdout);
    assert_eq!(ledger(&db), (3, (1..=3).map(|n| 100 + 10 * n).sum()));
}

/// `jobguard provider` as its own process, stopped when dropped.
struct ProviderProcess {
    child: std::process::Child,
    url: String,
}

impl ProviderProcess {
    fn start() -> ProviderProcess {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_jobguard"))
            .arg("provider")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start jobguard provider");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("read the provider's URL");
        let url = line.trim().to_owned();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        ProviderProcess { child, url }
    }

    fn charges(&self) -> Vec<jobguard_provider::Charge> {
        let client = jobguard_provider::ProviderClient::new(&self.url);
        block_on(client.charges()).expect("list the provider's charges")
    }
}

impl Drop for ProviderProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The built-in charge jobs through `jobguard enqueue` and `jobguard worker`, against
/// `jobguard provider` over HTTP: one charge per order, and a second round of the same jobs
/// finds every key recorded and calls nothing.
fn charges_apply_once(db: &Db) {
    let provider = ProviderProcess::start();
    let env = [("JOBGUARD_PROVIDER_URL", provider.url.as_str())];
    let work = |db: &Db| {
        for n in 0..3 {
            enqueue(
                db,
                "charge",
                &json!({"order": format!("order-{n}"), "amount": 500 + n}),
                &[],
            );
        }
        for n in 3..5 {
            let payload = json!({"order": format!("order-{n}"), "amount": 500 + n});
            enqueue(db, "charge-keyless", &payload, &[]);
        }
        let run = db.run_with(&["worker", "--until-idle", "--json"], &env);
        assert!(run.ok, "{}", run.stderr);
        stats(&run.json)
    };
    assert_eq!(work(db), [5, 0, 0, 0, 0, 0]);
    let charges = provider.charges();
    assert_eq!(charges.len(), 5, "{charges:?}");
    let mut orders: Vec<&str> = charges.iter().map(|c| c.order.as_str()).collect();
    orders.sort();
    assert_eq!(
        orders,
        ["order-0", "order-1", "order-2", "order-3", "order-4"]
    );

    assert_eq!(
        work(db),
        [0, 5, 0, 0, 0, 0],
        "the second round is all duplicates"
    );
    assert_eq!(provider.charges().len(), 5, "and called nothing");

    // Without a provider the job fails with a message that says what to set.
    enqueue(
        db,
        "charge",
        &json!({"order": "order-9", "amount": 900}),
        &["--max-attempts", "1"],
    );
    let run = db.run(&["worker", "--until-idle", "--json"]);
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(stats(&run.json)[3], 1, "dead-lettered: {}", run.stdout);
    let dead = db.json(&["dead", "list"]);
    assert!(dead.to_string().contains("JOBGUARD_PROVIDER_URL"), "{dead}");
    assert_eq!(provider.charges().len(), 5);
}

each_backend!(charges_apply_once);
