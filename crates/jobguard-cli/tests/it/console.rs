//! The operator console as an operator uses it: the real `jobguard serve --worker` and
//! `jobguard worker` processes on SQLite and PostgreSQL, its JSON API over real HTTP, the
//! `jobguard jobs`, `key` and `queue` commands, the metrics endpoint of `jobguard worker`
//! against the Grafana dashboard and alert rules in `docs/`, and the pages in a real headless
//! Chromium.
//!
//! Every wait has a deadline (a guard against hangs, never an assertion on speed).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Browser, Db, Server, get, request, request_with};
use crate::each_backend;

/// The longest any wait may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(120);
/// The token the tests start `jobguard serve` with.
const TOKEN: &str = "console-token-8d41f0a2c9";

fn credit(order: &str) -> Value {
    json!({"order": order, "account": 7, "amount": 100})
}

fn enqueue(db: &Db, kind: &str, payload: Value) -> i64 {
    let payload = payload.to_string();
    db.json(&["enqueue", kind, "--payload", &payload])["id"]
        .as_i64()
        .unwrap()
}

/// Asks until `found` returns something, and returns it.
fn wait_until<T>(what: &str, mut found: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(started.elapsed() < DEADLINE, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Job `id` as `GET /api/jobs/{id}` answers, once `done` holds for it.
fn job_when(server: &Server, id: i64, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    wait_until(what, || {
        let answer = get(&server.url(&format!("/api/jobs/{id}")), None);
        (answer.status == 200 && done(&answer.json())).then(|| answer.json())
    })
}

/// The value of one series in a Prometheus text exposition, e.g.
/// `jobguard_outcomes_total{kind="fail",outcome="dead"}`.
fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Through `jobguard serve --worker`: a credit applied and enqueued again shows on its key's
/// page with both jobs; a fatal failure is listed dead and retried with the token only; the
/// job actions refuse unknown ids and wrong states; a paused queue's jobs wait until resumed,
/// for the server's worker and for a worker process of their own.
fn the_console_api_finds_keys_and_acts_on_jobs_and_queues(db: &Db) {
    let first = enqueue(db, "credit", credit("o-1"));
    let server = Server::start(db, &["--worker", "--token", TOKEN], &[]);
    job_when(&server, first, "the first credit", |job| {
        job["state"] == "completed"
    });
    let second = enqueue(db, "credit", credit("o-1"));
    assert_ne!(
        first, second,
        "the first job completed: a new job carries the key"
    );
    job_when(&server, second, "the duplicate", |job| {
        job["state"] == "completed"
    });

    // The key: applied once, carried by both jobs, newest first.
    let answer = get(&server.url("/api/keys/credit:o-1"), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let key = answer.json();
    assert!(key["guard"]["applied_at"].as_u64().is_some(), "{key}");
    assert_eq!(key["guard"]["kind"], "credit", "{key}");
    assert!(key["guard"]["fingerprint"].as_str().is_some(), "{key}");
    let ids: Vec<i64> = key["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [second, first], "{key}");
    // The job page has the guard row of its key too.
    let job = get(&server.url(&format!("/api/jobs/{first}")), None).json();
    assert_eq!(job["guard"], key["guard"], "{job}");
    assert_eq!(job["payload"], credit("o-1"), "{job}");
    assert_eq!(get(&server.url("/api/keys/credit:never"), None).status, 404);
    // The same from the command line.
    // Nothing known of a key: said, and exit 1, as the API's 404.
    let unknown = db.run(&["key", "credit:never"]);
    assert!(
        !unknown.ok && unknown.stdout.contains("not applied") && unknown.stdout.contains("no job"),
        "{}{}",
        unknown.stdout,
        unknown.stderr
    );
    let from_cli = db.json(&["key", "credit:o-1"]);
    assert_eq!(from_cli["guard"], key["guard"], "{from_cli}");
    assert_eq!(from_cli["jobs"].as_array().unwrap().len(), 2, "{from_cli}");

    // A fatal failure is listed dead.
    let dead = enqueue(db, "fail", json!({"id": "boom", "fatal": true}));
    let listed = wait_until("the dead job in the list", || {
        let answer = get(&server.url("/api/jobs?state=dead"), None);
        let jobs = answer.json()["jobs"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        jobs.iter().any(|job| job["id"] == dead).then_some(jobs)
    });
    assert!(
        listed.iter().all(|job| job["state"] == "dead"),
        "{listed:?}"
    );
    let by_kind = get(&server.url("/api/jobs?kind=fail&state=dead&limit=5"), None).json();
    assert_eq!(by_kind["jobs"][0]["id"], dead, "{by_kind}");
    assert_eq!(
        get(&server.url("/api/jobs?state=gone"), None).status,
        400,
        "an unknown state is bad input"
    );
    // Paging: two pages of one job each, newest first.
    let page = get(&server.url("/api/jobs?key=credit:o-1&limit=1"), None).json();
    assert_eq!(page["jobs"][0]["id"], second, "{page}");
    let before = page["next_before"].as_i64().unwrap();
    let next = get(
        &server.url(&format!("/api/jobs?key=credit:o-1&limit=1&before={before}")),
        None,
    )
    .json();
    assert_eq!(next["jobs"][0]["id"], first, "{next}");

    // Retrying needs the token, in the header, from this site.
    let retry = server.url(&format!("/api/jobs/{dead}/retry"));
    let refused = request("POST", &retry, None);
    assert_eq!(refused.status, 401, "{}", refused.body);
    let cross = request_with(
        "POST",
        &retry,
        Some(TOKEN),
        &[("Origin", "http://attacker.example")],
    );
    assert_eq!(cross.status, 403, "{}", cross.body);
    let cross = request_with(
        "POST",
        &retry,
        Some(TOKEN),
        &[("Sec-Fetch-Site", "cross-site")],
    );
    assert_eq!(cross.status, 403, "{}", cross.body);
    let metrics = || get(&server.url("/metrics"), None).body;
    let dead_count = || {
        series_value(
            &metrics(),
            r#"jobguard_outcomes_total{kind="fail",outcome="dead"}"#,
        )
    };
    wait_until("the first death counted", || {
        (dead_count() == Some(1.0)).then_some(())
    });
    let retried = request("POST", &retry, Some(TOKEN));
    assert_eq!(retried.status, 200, "{}", retried.body);
    assert_eq!(retried.json()["done"], "retried");
    // It ran again: the worker counted a second death, and the job is dead once more.
    wait_until("the retried job to run again", || {
        (dead_count() == Some(2.0)).then_some(())
    });
    job_when(&server, dead, "the retried job dead again", |job| {
        job["state"] == "dead" && job["attempt"] == 1
    });

    // Wrong states and unknown ids: clear refusals, nothing changed.
    let cancel = request(
        "POST",
        &server.url(&format!("/api/jobs/{first}/cancel")),
        Some(TOKEN),
    );
    assert_eq!(cancel.status, 409, "{}", cancel.body);
    assert!(
        cancel.json()["error"]
            .as_str()
            .unwrap()
            .contains("only a job waiting to run can be cancelled"),
        "{}",
        cancel.body
    );
    let again = request(
        "POST",
        &server.url(&format!("/api/jobs/{first}/retry")),
        Some(TOKEN),
    );
    assert_eq!(again.status, 409, "{}", again.body);
    for (method, path) in [
        ("POST", "/api/jobs/987654/retry"),
        ("POST", "/api/jobs/987654/cancel"),
        ("DELETE", "/api/jobs/987654"),
    ] {
        let answer = request(method, &server.url(path), Some(TOKEN));
        assert_eq!(answer.status, 404, "{method} {path}: {}", answer.body);
    }
    let stderr = db.fails(&["jobs", "cancel", &first.to_string()]);
    assert!(stderr.contains("cannot be cancelled"), "{stderr}");

    // Pause: neither the server's worker nor a worker process of its own fetches the queue's
    // jobs; a worker that finds nothing to fetch stops idle, leaving the job waiting.
    let paused = request(
        "POST",
        &server.url("/api/queues/default/pause"),
        Some(TOKEN),
    );
    assert_eq!(paused.status, 200, "{}", paused.body);
    let queues = get(&server.url("/api/queues"), None).json();
    assert_eq!(queues["queues"][0]["name"], "default", "{queues}");
    assert_eq!(queues["queues"][0]["paused"], true, "{queues}");
    let waiting = enqueue(db, "credit", credit("o-2"));
    // A job cancelled while it waits never runs.
    let cancelled = enqueue(db, "credit", credit("o-3"));
    let answer = request(
        "POST",
        &server.url(&format!("/api/jobs/{cancelled}/cancel")),
        Some(TOKEN),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["job"]["state"], "dead", "{}", answer.body);
    let idle = db.json(&["worker", "--until-idle"]);
    assert_eq!(idle["applied"], 0, "a paused queue gave out a job: {idle}");
    let job = get(&server.url(&format!("/api/jobs/{waiting}")), None).json();
    assert_eq!(job["state"], "available", "{job}");
    assert_eq!(job["attempt"], 0, "{job}");
    assert_eq!(db.json(&["queue", "list"])[0]["paused"], true);
    let resumed = request(
        "POST",
        &server.url("/api/queues/default/resume"),
        Some(TOKEN),
    );
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    job_when(&server, waiting, "the resumed queue's job", |job| {
        job["state"] == "completed"
    });
    let key = get(&server.url("/api/keys/credit:o-3"), None).json();
    assert!(key["guard"].is_null(), "the cancelled job ran: {key}");
    assert_eq!(key["jobs"][0]["state"], "dead", "{key}");

    // The CLI pauses too, and deletes.
    assert_eq!(db.json(&["queue", "pause", "default"])["paused"], true);
    let queues = get(&server.url("/api/queues"), None).json();
    assert_eq!(queues["queues"][0]["paused"], true, "{queues}");
    assert_eq!(db.json(&["queue", "resume", "default"])["paused"], false);
    let deleted = db.json(&["jobs", "delete", &cancelled.to_string()]);
    assert_eq!(deleted["job"], Value::Null, "{deleted}");
    assert_eq!(
        get(&server.url(&format!("/api/jobs/{cancelled}")), None).status,
        404
    );
    let output = server.stop();
    assert!(!output.contains(TOKEN), "the token was printed:\n{output}");
}

each_backend!(the_console_api_finds_keys_and_acts_on_jobs_and_queues);

/// Every series the Grafana dashboard and the alert rules in `docs/` name.
fn series_named_in_docs() -> BTreeSet<String> {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let dashboard = std::fs::read_to_string(docs.join("grafana-dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().expect("an expr").to_owned());
        }
    }
    assert!(!exprs.is_empty(), "the dashboard queries nothing");
    let alerts = std::fs::read_to_string(docs.join("prometheus-alerts.yml")).unwrap();
    assert!(alerts.contains("alert: JobguardDuplicateSpike"), "{alerts}");
    exprs.push(alerts);
    let mut names = BTreeSet::new();
    for text in exprs {
        let mut rest = text.as_str();
        while let Some(at) = rest.find("jobguard_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            names.insert(name);
        }
    }
    names
}

/// `jobguard worker --metrics-bind` serves the outcome series itself, and every series the
/// shipped dashboard and alert rules name is in what it serves once it ran jobs.
#[test]
fn a_worker_serves_its_metrics_and_the_docs_name_only_real_series() {
    let named = series_named_in_docs();
    let db = &Db::sqlite("console::metrics");
    let refused = db.fails(&["worker", "--metrics-bind", "0.0.0.0:0", "--until-idle"]);
    assert!(
        refused.contains("not a loopback address") && refused.contains("--metrics-token"),
        "{refused}"
    );
    let first = enqueue(db, "credit", credit("o-1"));
    enqueue(db, "fail", json!({"id": "boom", "fatal": true}));
    enqueue(db, "fail", json!({"id": "again"}));
    let mut worker = db.spawn(
        "worker",
        &[
            "worker",
            "--metrics-bind",
            "127.0.0.1:0",
            "--backoff",
            "50ms",
        ],
    );
    let address = wait_until("the metrics address", || {
        let (_, stderr) = worker.output();
        stderr
            .split("metrics on http://")
            .nth(1)
            .and_then(|rest| rest.split("/metrics").next())
            .map(str::to_owned)
    });
    let url = |path: &str| format!("http://{address}{path}");
    assert_eq!(get(&url("/health"), None).status, 200);
    // The credit applied, then enqueued again once completed: a duplicate.
    wait_until("the first credit", || {
        let text = get(&url("/metrics"), None).body;
        (series_value(
            &text,
            r#"jobguard_outcomes_total{kind="credit",outcome="applied"}"#,
        ) == Some(1.0))
        .then_some(())
    });
    let again = enqueue(db, "credit", credit("o-1"));
    assert_ne!(again, first);
    let text = wait_until("every series the docs name", || {
        let answer = get(&url("/metrics"), None);
        assert_eq!(answer.status, 200, "{}", answer.body);
        let text = answer.body;
        let duplicate = series_value(
            &text,
            r#"jobguard_outcomes_total{kind="credit",outcome="duplicate"}"#,
        );
        let dead = series_value(
            &text,
            r#"jobguard_outcomes_total{kind="fail",outcome="dead"}"#,
        );
        let failed = series_value(
            &text,
            r#"jobguard_outcomes_total{kind="fail",outcome="failed"}"#,
        );
        (duplicate == Some(1.0) && dead == Some(1.0) && failed.is_some_and(|n| n >= 1.0))
            .then_some(text)
    });
    let served: BTreeSet<String> = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| line.split(['{', ' ']).next().unwrap_or_default().to_owned())
        .collect();
    let missing: Vec<&String> = named.difference(&served).collect();
    assert!(
        missing.is_empty(),
        "the docs name series the worker does not serve: {missing:?}\nserved: {served:?}"
    );
    worker.signal("TERM");
    let exit = worker.finish(DEADLINE);
    assert!(exit.ok, "{}", exit.stderr);
}

/// The pages in headless Chromium: search a key, open its job, retry a dead job (refused
/// without the token, done with it), pause and resume a queue, and a screenshot.
#[test]
fn the_console_pages_find_a_key_retry_a_job_and_pause_a_queue_in_a_browser() {
    let Some(browser) = Browser::find() else {
        return;
    };
    let db = &Db::sqlite("console::browser");
    let first = enqueue(db, "credit", credit("o-1"));
    let dead = enqueue(db, "fail", json!({"id": "boom", "fatal": true}));
    let server = Server::start(db, &["--worker", "--token", TOKEN], &[]);
    job_when(&server, first, "the credit", |job| {
        job["state"] == "completed"
    });
    job_when(&server, dead, "the dead job", |job| job["state"] == "dead");
    let metrics = || get(&server.url("/metrics"), None).body;
    let dead_count = || {
        series_value(
            &metrics(),
            r#"jobguard_outcomes_total{kind="fail",outcome="dead"}"#,
        )
    };

    let driver = browser.start();
    let session = driver.session();
    session.navigate(&server.url("/console"));
    // Search a key: its page shows the guard row and the job that applied it.
    session.type_into("#key-search", "credit:o-1");
    session.click("#search-form button");
    session.wait_for_script(
        "the key's page",
        "const at = document.getElementById('applied-at');\
         const row = document.querySelector('#key-jobs tr.job');\
         return at && row ? [at.textContent, row.dataset.jobId] : null;",
        |found| {
            found[1] == json!(first.to_string())
                && found[0].as_str().is_some_and(|t| t.contains('T'))
        },
    );
    // Open the job.
    session.click(&format!(
        "#key-jobs tr.job[data-job-id=\"{first}\"] a.job-link"
    ));
    session.wait_for_script(
        "the job's page",
        "const s = document.getElementById('job-state'); return s && s.textContent;",
        |state| state == "completed",
    );

    // The dead job from the list of dead jobs; retry refused without the token.
    session.navigate(&server.url("/console#/jobs?state=dead"));
    session.click(&format!("#jobs tr.job[data-job-id=\"{dead}\"] a.job-link"));
    session.wait_for_script(
        "the dead job's page",
        "const s = document.getElementById('job-state'); return s && s.textContent;",
        |state| state == "dead",
    );
    session.click("#retry");
    session.wait_for_script(
        "the refusal",
        "return document.getElementById('action-status').textContent;",
        |text| text.as_str().is_some_and(|t| t.contains("refused (401)")),
    );
    assert_eq!(dead_count(), Some(1.0), "refused, yet the job ran again");
    session.type_into("#token", TOKEN);
    session.click("#retry");
    session.wait_for_script(
        "the retry",
        "return document.getElementById('action-status').textContent;",
        |text| text.as_str().is_some_and(|t| t.ends_with(": done")),
    );
    wait_until("the retried job to run again", || {
        (dead_count() == Some(2.0)).then_some(())
    });

    // Pause the queue by name from the queues page (nothing waits in it, so it is not listed
    // yet), then resume it from its row.
    session.navigate(&server.url("/console#/queues"));
    session.type_into("#queue-name", "default");
    session.click("#pause-named");
    session.wait_for_script(
        "the paused queue",
        "const s = document.querySelector('tr.queue[data-queue=\"default\"] .queue-state');\
         return s && s.textContent;",
        |state| state == "paused",
    );
    let queues = get(&server.url("/api/queues"), None).json();
    assert_eq!(queues["queues"][0]["paused"], true, "{queues}");
    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-queues.png");
    session.screenshot(&screenshot);
    session.click("tr.queue[data-queue=\"default\"] button.resume");
    session.wait_for_script(
        "the resumed queue",
        "const s = document.querySelector('tr.queue[data-queue=\"default\"] .queue-state');\
         return s && s.textContent;",
        |state| state == "running",
    );
    let queues = get(&server.url("/api/queues"), None).json();
    assert_eq!(queues["queues"][0]["paused"], false, "{queues}");

    // The dead job's page after the retry, for the screenshot.
    session.navigate(&server.url("/console#/key/fail%3Aboom"));
    session.wait_for_script(
        "the failed key's page",
        "return document.querySelectorAll('#key-jobs tr.job').length;",
        |rows| rows == 1,
    );
    let screenshot_key = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-key.png");
    session.screenshot(&screenshot_key);
    eprintln!(
        "console screenshots: {} {}",
        screenshot.display(),
        screenshot_key.display()
    );
}
