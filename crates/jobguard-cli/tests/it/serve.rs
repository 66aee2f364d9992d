//! `jobguard serve` and `jobguard stats` as an operator runs them: the real binary, a real
//! database (a fresh SQLite file per test, and a fresh PostgreSQL schema when
//! PostgreSQL answers), real HTTP, and the dashboard in a real headless
//! Chromium driven over WebDriver.
//!
//! Every wait has a deadline (a guard against hangs, never an assertion on speed), and every
//! process a test starts (the server, chromedriver and its browser) is killed when its guard is
//! dropped, on failure too.

use std::collections::BTreeMap;
use std::process::Output;
use std::time::{Duration, Instant};

use jobguard::queue::NewJob;
use jobguard::{Backend, JobKey, Queue};
use serde_json::{Value, json};
use sqlx::Pool;

use crate::common::{AnyPool, Browser, Db, Server, block_on, get, request};
use crate::{each_backend, on_pool};

/// The longest any wait may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(120);
/// The token the tests start `jobguard serve` with.
const TOKEN: &str = "s3cret-token-5f0e9c1d2b7a";

fn enqueue(db: &Db, kind: &str, payload: Value) -> i64 {
    let payload = payload.to_string();
    let enqueued = db.json(&["enqueue", kind, "--payload", &payload]);
    enqueued["id"].as_i64().unwrap()
}

/// Enqueues `credit` for `order` and dead-letters it at once, as a job that died would be:
/// its key is then applied by another job, so replaying it is a duplicate.
fn park_dead_credit(db: &Db, order: &str) -> i64 {
    on_pool!(db, |pool| park(pool.clone(), order))
}

/// Inserts a guard row for `key` applied `ago`, as a job applied that long before would
/// have left.
fn backdate_guard_row(db: &Db, key: &str, ago: Duration) {
    match db.pool() {
        AnyPool::Postgres(pool) => db.block_on(async {
            sqlx::query(
                "insert into processed_jobs (job_key, kind, claim_token, applied_at)
                 values ($1, 'backdated', '\\x00', now() - make_interval(secs => $2))",
            )
            .bind(key)
            .bind(ago.as_secs_f64())
            .execute(pool)
            .await
            .expect("insert a backdated guard row");
        }),
        AnyPool::Sqlite(pool) => db.block_on(async {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            let applied_at = (now - ago).as_micros() as i64;
            sqlx::query(
                "insert into processed_jobs (job_key, kind, claim_token, applied_at)
                 values (?, 'backdated', x'00', ?)",
            )
            .bind(key)
            .bind(applied_at)
            .execute(pool)
            .await
            .expect("insert a backdated guard row");
        }),
    }
}

/// The state of job `id`.
fn state(db: &Db, id: i64) -> String {
    let jobs = db.json(&["jobs", "--limit", "1000"]);
    let job = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|job| job["id"] == id)
        .unwrap_or_else(|| panic!("no job {id}: {jobs}"));
    job["state"].as_str().unwrap().to_owned()
}

async fn park<DB: Backend>(pool: Pool<DB>, order: &str) -> i64 {
    let queue = Queue::new(pool);
    let key = JobKey::new("credit", [order]).unwrap();
    // The payload `jobguard enqueue` stores for the same credit, so its fingerprint matches.
    let payload = credit(order);
    let job = NewJob::new(key, &payload).unwrap();
    let enqueued = queue.enqueue(&job).await.unwrap();
    assert!(enqueued.inserted);
    let leased = queue
        .fetch("default", 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(leased.len(), 1, "only the parked job is waiting");
    assert_eq!(leased[0].lease.job_id, enqueued.id);
    queue
        .dead_letter(leased[0].lease, "parked by the test: its worker gave up")
        .await
        .unwrap();
    enqueued.id
}

/// Asks `/api/stats` until `done` holds for the figures, and returns them.
fn wait_for(server: &Server, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let answer = get(&server.url("/api/stats"), Some(TOKEN));
        let figures = answer.json();
        if answer.status == 200 && done(&figures) {
            return figures;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "gave up waiting for {what}: {} {}",
            answer.status,
            answer.body
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The queue is drained: nothing available, nothing running. The counts and the backlog are
/// sampled separately, so both must say so.
fn idle(figures: &Value) -> bool {
    let queue = &figures["queue"];
    queue["running"] == 0
        && queue["available"] == 0
        && queue["backlog"].as_array().is_some_and(Vec::is_empty)
}

fn totals(figures: &Value, kind: &str) -> (u64, u64) {
    let totals = &figures["outcomes"]["totals"][kind];
    (
        totals["applied"].as_u64().unwrap_or(0),
        totals["duplicates"].as_u64().unwrap_or(0),
    )
}

/// The series of a Prometheus text exposition: name and sorted labels to value.
type Series = BTreeMap<(String, BTreeMap<String, String>), f64>;

fn parse_metrics(text: &str) -> Series {
    let lines = text.lines().map(|line| Ok(line.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("a Prometheus text exposition");
    scrape
        .samples
        .into_iter()
        .filter_map(|sample| {
            // A histogram's `_sum` and `_count` come as samples of their own; its buckets are
            // not compared.
            let value = match sample.value {
                prometheus_parse::Value::Counter(value)
                | prometheus_parse::Value::Gauge(value)
                | prometheus_parse::Value::Untyped(value) => value,
                prometheus_parse::Value::Histogram(_) | prometheus_parse::Value::Summary(_) => {
                    return None;
                }
            };
            let labels = sample.labels.iter();
            let labels = labels.map(|(key, value)| (key.clone(), value.clone()));
            Some(((sample.metric, labels.collect()), value))
        })
        .collect()
}

/// The values of one metric, by the values of its labels.
fn metric(series: &Series, name: &str) -> BTreeMap<Vec<String>, f64> {
    series
        .iter()
        .filter(|((n, _), _)| n == name)
        .map(|((_, labels), value)| (labels.values().cloned().collect(), *value))
        .collect()
}

fn labels(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

/// How long before the test [`known_duplicates_are_counted_exactly`] dates a guard row.
const BACKDATED: Duration = Duration::from_secs(3 * 3600);

fn credit(order: &str) -> Value {
    json!({"order": order, "account": 7, "amount": 100})
}

/// Jobs with known outcomes, through `jobguard serve --worker`:
///
/// - 5 credits and 3 noops applied, a fatal `fail` dead-lettered;
/// - 3 of the credits and 1 noop enqueued again after they completed: 4 duplicates, source
///   `double_enqueue`;
/// - a dead credit whose key another job applied, replayed through the API: a duplicate,
///   source `replay`; refused without the token, accepted with it.
///
/// `/metrics` must report exactly those counts per kind, and `jobguard stats` the same figures.
fn known_duplicates_are_counted_exactly(db: &Db) {
    // Before the server: credit 7 applied by another process, then a second credit 7 parked
    // dead.
    enqueue(db, "credit", credit("order-7"));
    let worked = db.json(&["worker", "--until-idle"]);
    assert_eq!(worked["applied"], 1, "{worked}");
    let parked = park_dead_credit(db, "order-7");
    backdate_guard_row(db, "backdated:1", BACKDATED);
    for n in 1..=5 {
        enqueue(db, "credit", credit(&format!("order-{n}")));
    }
    for id in ["a", "b", "c"] {
        enqueue(db, "noop", json!({"id": id}));
    }
    enqueue(db, "fail", json!({"id": "boom", "fatal": true}));

    let server = Server::start(db, &["--worker", "--token", TOKEN], &[]);
    let figures = wait_for(&server, "the first jobs", |f| {
        idle(f) && totals(f, "credit") == (5, 0) && totals(f, "noop") == (3, 0)
    });
    assert_eq!(figures["queue"]["dead"], 2, "{figures}");

    for n in 1..=3 {
        enqueue(db, "credit", credit(&format!("order-{n}")));
    }
    enqueue(db, "noop", json!({"id": "a"}));
    wait_for(&server, "the duplicates", |f| {
        idle(f) && totals(f, "credit") == (5, 3) && totals(f, "noop") == (3, 1)
    });

    // Replaying needs the token, always.
    let replay = server.url(&format!("/api/dead/{parked}/replay"));
    let refused = request("POST", &replay, None);
    assert_eq!(refused.status, 401, "{}", refused.body);
    let refused = request("POST", &replay, Some("not-the-token-at-all"));
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert_eq!(state(db, parked), "dead");
    let replayed = request("POST", &replay, Some(TOKEN));
    assert_eq!(replayed.status, 200, "{}", replayed.body);
    assert_eq!(replayed.json(), json!({"replayed": [parked]}));
    let figures = wait_for(&server, "the replayed duplicate", |f| {
        idle(f) && totals(f, "credit") == (5, 4)
    });
    assert_eq!(state(db, parked), "completed");
    let again = request("POST", &replay, Some(TOKEN));
    assert_eq!(again.status, 409, "{}", again.body);

    let answer = get(&server.url("/metrics"), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.body.contains("# HELP jobguard_outcomes_total"),
        "{}",
        answer.body
    );
    let series = parse_metrics(&answer.body);
    let outcomes = metric(&series, "jobguard_outcomes_total");
    let expected = BTreeMap::from([
        (labels(&["credit", "applied"]), 5.0),
        (labels(&["credit", "duplicate"]), 4.0),
        (labels(&["fail", "dead"]), 1.0),
        (labels(&["noop", "applied"]), 3.0),
        (labels(&["noop", "duplicate"]), 1.0),
    ]);
    assert_eq!(outcomes, expected, "{}", answer.body);
    let sources = metric(&series, "jobguard_duplicates_total");
    let expected = BTreeMap::from([
        (labels(&["credit", "double_enqueue"]), 3.0),
        (labels(&["credit", "replay"]), 1.0),
        (labels(&["noop", "double_enqueue"]), 1.0),
    ]);
    assert_eq!(sources, expected, "{}", answer.body);
    let durations = metric(&series, "jobguard_job_duration_seconds_count");
    assert_eq!(durations[&labels(&["credit", "applied"])], 5.0);
    assert_eq!(durations[&labels(&["credit", "duplicate"])], 4.0);
    assert_eq!(durations[&labels(&["fail", "dead"])], 1.0);
    assert_eq!(metric(&series, "jobguard_dead_letters")[&labels(&[])], 1.0);
    assert_eq!(metric(&series, "jobguard_jobs_running")[&labels(&[])], 0.0);
    assert_eq!(
        metric(&series, "jobguard_queue_depth")[&labels(&["default"])],
        0.0
    );
    assert_eq!(
        metric(&series, "jobguard_steps_attention")[&labels(&[])],
        0.0
    );
    // The oldest guard row is the backdated one: the gauge is its age, a little more than how
    // far back it was dated by the time of the sample (the margin is for a slow machine only).
    let horizon = metric(&series, "jobguard_guard_oldest_age_seconds");
    let age = horizon[&labels(&["processed_jobs"])];
    let dated = BACKDATED.as_secs_f64();
    assert!(
        age >= dated && age < dated + 600.0,
        "the oldest guard row was applied {dated}s before the test: {horizon:?}"
    );

    // `jobguard stats` prints the same figures: from the database, and from the server.
    let from_db = db.json(&["stats"]);
    let from_server = db.json(&["stats", "--url", &server.base, "--token", TOKEN]);
    for figures in [&from_db, &from_server, &figures] {
        assert_eq!(figures["queue"]["dead"], 1, "{figures}");
        let dead: Vec<&Value> = figures["dead_letters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|job| &job["key"])
            .collect();
        assert_eq!(dead, [&json!("fail:boom")], "{figures}");
        assert_eq!(figures["steps"]["attention"], 0, "{figures}");
        assert!(
            figures["guard"]["oldest_age"].as_f64().is_some(),
            "{figures}"
        );
    }
    assert_eq!(
        from_db["queue"]["completed"],
        from_server["queue"]["completed"]
    );
    assert!(from_db.get("outcomes").is_none(), "{from_db}");
    assert_eq!(totals(&from_server, "credit"), (5, 4));
    assert_eq!(totals(&from_server, "noop"), (3, 1));
    let text = db.command(&["stats"]).output().unwrap();
    assert_success(&text, &["stats"]);
    let text = String::from_utf8_lossy(&text.stdout);
    for needle in [
        "jobs: 0 available, 0 running",
        "dead letters: 1",
        "fail:boom",
        "guard memory horizon: the oldest key",
        "external steps needing attention: none",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    let output = server.stop();
    assert!(!output.contains(TOKEN), "the token was printed:\n{output}");
}

each_backend!(known_duplicates_are_counted_exactly);

/// A non-loopback bind refuses to start without a token; with one, every request but the page
/// and /health needs it; the token never shows in the output, even with every log turned on.
#[test]
fn a_non_loopback_bind_needs_the_token_and_the_token_is_never_logged() {
    let db = &Db::sqlite("serve::token");
    let output = db
        .command(&["serve", "--bind", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("not a loopback address") && stderr.contains("--token"),
        "{stderr}"
    );
    let output = db
        .command(&["serve", "--bind", "127.0.0.1:0", "--token", "short"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("at least 16 characters"),
        "{output:?}"
    );

    enqueue(db, "credit", credit("order-1"));
    let server = Server::start(
        db,
        &["--bind", "0.0.0.0:0", "--worker"],
        &[("JOBGUARD_TOKEN", TOKEN), ("JOBGUARD_LOG", "trace")],
    );
    for path in ["/metrics", "/api/stats"] {
        let url = server.url(path);
        assert_eq!(get(&url, None).status, 401, "{path} without the token");
        assert_eq!(
            get(&url, Some("0123456789abcdefXX")).status,
            401,
            "{path} with another token"
        );
        let answer = get(&url, Some(TOKEN));
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    }
    let replay = server.url("/api/dead/999999/replay");
    assert_eq!(request("POST", &replay, None).status, 401);
    assert_eq!(request("POST", &replay, Some(TOKEN)).status, 409);
    let page = get(&server.url("/"), None);
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<svg") || page.body.contains("createElementNS"));
    assert!(!page.body.contains(TOKEN));
    assert_eq!(get(&server.url("/health"), None).status, 200);
    wait_for(&server, "the credit", |f| totals(f, "credit") == (1, 0));
    let stats = db
        .command(&["stats", "--url", &server.base])
        .env("JOBGUARD_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert_success(&stats, &["stats", "--url"]);
    let stats_output = format!(
        "{}{}",
        String::from_utf8_lossy(&stats.stdout),
        String::from_utf8_lossy(&stats.stderr)
    );
    assert!(!stats_output.contains(TOKEN), "{stats_output}");
    let refused = db
        .command(&["stats", "--url", &server.base])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let output = server.stop();
    assert!(
        output.contains("TRACE") || output.contains("DEBUG"),
        "the server should have logged at trace level: {output}"
    );
    assert!(!output.contains(TOKEN), "the token was logged:\n{output}");

    // On a loopback address the figures are open to local clients, replay is not; without a
    // token replay is off altogether, and a foreign Host header is turned away.
    let server = Server::start(db, &["--token", TOKEN], &[]);
    assert_eq!(get(&server.url("/metrics"), None).status, 200);
    assert_eq!(get(&server.url("/api/stats"), None).status, 200);
    assert_eq!(
        request("POST", &server.url("/api/dead/1/replay"), None).status,
        401
    );
    let rebinding = block_on(async {
        reqwest::Client::new()
            .get(server.url("/api/stats"))
            .header("Host", "attacker.example:9464")
            .send()
            .await
            .unwrap()
            .status()
    });
    assert_eq!(rebinding.as_u16(), 421);
    drop(server);
    let server = Server::start(db, &[], &[]);
    let off = request("POST", &server.url("/api/dead/1/replay"), Some(TOKEN));
    assert_eq!(off.status, 403, "{}", off.body);
    assert!(off.body.contains("--token"), "{}", off.body);
}

/// No response of `jobguard serve` may be framed: the pages, the API, /metrics and /health,
/// and the refusals and not-found answers too, each carry `X-Frame-Options: DENY` and
/// `Content-Security-Policy: frame-ancestors 'none'`.
#[test]
fn no_response_of_serve_may_be_framed() {
    let db = &Db::sqlite("serve::unframed");
    // Creates the tables, so that the API answers with what it holds.
    enqueue(db, "noop", json!({"id": "1"}));
    let server = Server::start(db, &["--token", TOKEN], &[]);
    let answers = [
        ("GET /", get(&server.url("/"), None), 200),
        ("GET /console", get(&server.url("/console"), None), 200),
        ("GET /health", get(&server.url("/health"), None), 200),
        ("GET /metrics", get(&server.url("/metrics"), None), 200),
        ("GET /api/stats", get(&server.url("/api/stats"), None), 200),
        ("GET /api/jobs", get(&server.url("/api/jobs"), None), 200),
        (
            "GET /api/queues",
            get(&server.url("/api/queues"), None),
            200,
        ),
        (
            "POST /api/queues/default/pause without the token",
            request("POST", &server.url("/api/queues/default/pause"), None),
            401,
        ),
        (
            "POST /api/dead/999999/replay",
            request("POST", &server.url("/api/dead/999999/replay"), Some(TOKEN)),
            409,
        ),
        ("GET /nowhere", get(&server.url("/nowhere"), None), 404),
    ];
    for (what, answer, status) in answers {
        assert_eq!(answer.status, status, "{what}: {}", answer.body);
        let header = |name: &str| {
            let values: Vec<_> = answer.headers.get_all(name).iter().collect();
            assert_eq!(values.len(), 1, "{what}: one {name}, got {values:?}");
            values[0].to_str().unwrap().to_owned()
        };
        assert_eq!(header("x-frame-options"), "DENY", "{what}");
        assert_eq!(
            header("content-security-policy"),
            "frame-ancestors 'none'",
            "{what}"
        );
    }
}

/// The dashboard in headless Chromium: the chart shows the duplicates, and the replay button
/// replays a dead letter with the token and is refused without it.
#[test]
fn the_dashboard_charts_duplicates_and_replays_dead_letters_in_a_browser() {
    let Some(browser) = Browser::find() else {
        return;
    };
    let db = &Db::sqlite("serve::browser");
    enqueue(db, "credit", credit("order-7"));
    assert_eq!(db.json(&["worker", "--until-idle"])["applied"], 1);
    let parked = park_dead_credit(db, "order-7");
    for n in 1..=4 {
        enqueue(db, "credit", credit(&format!("order-{n}")));
    }
    // Short windows, so the chart has a few of them by the end.
    let server = Server::start(
        db,
        &["--worker", "--token", TOKEN, "--spike-window", "1s"],
        &[],
    );
    wait_for(&server, "the credits", |f| {
        idle(f) && totals(f, "credit") == (4, 0)
    });
    for n in 1..=2 {
        enqueue(db, "credit", credit(&format!("order-{n}")));
    }
    wait_for(&server, "the duplicates", |f| {
        idle(f) && totals(f, "credit") == (4, 2)
    });

    let driver = browser.start();
    let session = driver.session();
    session.navigate(&server.url("/"));

    // The chart: the duplicates of `credit`, plotted per window.
    let values = session.wait_for_script(
        "the chart",
        "return Array.from(document.querySelectorAll(\
           'svg.chart[data-kind=\"credit\"] circle.point.duplicates'))\
           .map(c => Number(c.dataset.value));",
        |values| {
            values
                .as_array()
                .is_some_and(|v| v.iter().filter_map(Value::as_u64).sum::<u64>() == 2)
        },
    );
    let line = session.script(
        "return document.querySelector('svg.chart[data-kind=\"credit\"] \
         polyline.series.duplicates').getAttribute('points');",
    );
    assert!(line.as_str().is_some_and(|p| !p.is_empty()), "{line}");
    let legend = session.script(
        "return document.querySelector('.kind[data-kind=\"credit\"] .legend').textContent;",
    );
    assert!(
        legend.as_str().unwrap().contains("duplicates 2"),
        "{legend} {values}"
    );

    // Replay without the token: refused, and the job stays dead.
    let button = format!("button.replay[data-job-id=\"{parked}\"]");
    session.click(&button);
    session.wait_for_script(
        "the refusal",
        "return document.getElementById('replay-status').textContent;",
        |text| text.as_str().is_some_and(|t| t.contains("refused (401)")),
    );
    assert_eq!(state(db, parked), "dead");

    // With the token: replayed, and the worker completes it as a duplicate.
    session.type_into("#token", TOKEN);
    session.click(&button);
    session.wait_for_script(
        "the replay",
        "return document.getElementById('replay-status').textContent;",
        |text| {
            text.as_str()
                .is_some_and(|t| t.contains(&format!("Replayed job {parked}")))
        },
    );
    wait_for(&server, "the replayed duplicate", |f| {
        idle(f) && totals(f, "credit") == (4, 3)
    });
    assert_eq!(state(db, parked), "completed");
    session.wait_for_script(
        "the chart to catch up",
        "return document.querySelector('.kind[data-kind=\"credit\"] .legend').textContent;",
        |text| text.as_str().is_some_and(|t| t.contains("duplicates 3")),
    );
    session.wait_for_script(
        "the dead letter to leave the table",
        &format!(
            "return document.querySelector('{}') === null;",
            button.replace('\'', "\\'")
        ),
        |gone| gone == &json!(true),
    );
    let screenshot = db.dir.join("dashboard.png");
    session.screenshot(&screenshot);
    eprintln!("dashboard screenshot: {}", screenshot.display());
}

fn assert_success(output: &Output, args: &[&str]) {
    assert!(
        output.status.success(),
        "jobguard {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
