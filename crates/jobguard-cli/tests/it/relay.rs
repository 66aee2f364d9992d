//! `jobguard relay` and `jobguard worker --relay-webhook-url` as real processes, delivering to
//! a real HTTP receiver (`jobguard-provider`).
//!
//! The main scenario kills a relay with SIGKILL in the middle of its work, after some but not
//! all of 300 messages were received, then runs `jobguard relay --once`: every message must be
//! received at least once, under its id, with each topic's first receipts in publish order, and
//! nothing may be left pending. Each scenario runs on a fresh SQLite file, and on a fresh
//! PostgreSQL schema when `JOBGUARD_TEST_DATABASE_URL` is set. Every wait has a deadline and
//! every child process is killed when its guard is dropped, so a failing test fails instead of
//! hanging.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use jobguard::outbox::{Outbox, OutboxCounts};
use jobguard::{Backend, JobKey};
use jobguard_provider::{Provider, ProviderConfig, RunningProvider};
use serde_json::{Value, json};
use sqlx::Executor;

/// The longest any run of the binary may take before the test fails: a guard against hangs.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Per topic, message ids in publish order or in order of first receipt.
type ByTopic = BTreeMap<String, Vec<String>>;

/// A database of the test's own (a SQLite file or a PostgreSQL schema), a runtime that serves
/// the receiver, and a pool of the test process.
struct Env {
    url: String,
    dir: PathBuf,
    /// The PostgreSQL admin URL and schema to drop at the end.
    schema: Option<(String, String)>,
    rt: tokio::runtime::Runtime,
    pool: Option<Pool>,
    receiver: Option<RunningProvider>,
}

enum Pool {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

/// A child process of the binary, killed with SIGKILL when dropped unless it was waited for.
struct Proc {
    child: Option<Child>,
    name: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

struct Exit {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Proc {
    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    fn wait(&mut self, timeout: Duration) -> Option<Exit> {
        let started = Instant::now();
        let child = self.child.as_mut().expect("the process is still ours");
        loop {
            if let Some(status) = child.try_wait().expect("wait for a child") {
                self.child = None;
                return Some(Exit {
                    status,
                    stdout: std::fs::read_to_string(&self.stdout).unwrap_or_default(),
                    stderr: std::fs::read_to_string(&self.stderr).unwrap_or_default(),
                });
            }
            if started.elapsed() >= timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the process is still running.
    fn running(&mut self) -> bool {
        let child = self.child.as_mut().expect("the process is still ours");
        child.try_wait().expect("poll a child").is_none()
    }

    /// SIGKILL (what `Child::kill` sends on Unix), and reaps the process.
    fn sigkill(&mut self) {
        let mut child = self.child.take().expect("the process is still ours");
        child.kill().expect("SIGKILL the relay");
        let status = child.wait().expect("reap the relay");
        assert!(!status.success(), "{} exited on its own", self.name);
    }

    /// Waits for a command that must succeed and print JSON.
    fn finish_json(&mut self, timeout: Duration) -> Value {
        let Some(exit) = self.wait(timeout) else {
            let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
            panic!(
                "{} did not finish within {timeout:?}; stderr:\n{stderr}",
                self.name
            );
        };
        assert!(
            exit.status.success(),
            "{} failed ({}): {}",
            self.name,
            exit.status,
            exit.stderr
        );
        serde_json::from_str(&exit.stdout)
            .unwrap_or_else(|_| panic!("{} printed no JSON: {}", self.name, exit.stdout))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Env {
    fn sqlite(test: &str) -> Env {
        let dir = scratch(test);
        let url = format!("sqlite:{}", dir.join("relay.db").display());
        Env::connect(url, dir, None)
    }

    /// A fresh schema, reached through the URL's `search_path` option; `None` to skip.
    fn postgres(test: &str) -> Option<Env> {
        let admin = postgres_url()?;
        let schema = format!("jg_cli_relay_{test}_{}", std::process::id());
        let separator = if admin.contains('?') { '&' } else { '?' };
        let url = format!("{admin}{separator}options=-c%20search_path%3D{schema}");
        let env = Env::connect(url, scratch(&format!("pg-{test}")), Some((admin, schema)));
        Some(env)
    }

    fn connect(url: String, dir: PathBuf, schema: Option<(String, String)>) -> Env {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let pool = rt.block_on(async {
            match &schema {
                Some((admin, schema)) => {
                    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(admin)
                        .await
                        .expect("connect to PostgreSQL");
                    conn.execute(sqlx::AssertSqlSafe(format!(
                        "drop schema if exists {schema} cascade; create schema {schema}"
                    )))
                    .await
                    .expect("create the test's schema");
                    Pool::Postgres(
                        sqlx::postgres::PgPoolOptions::new()
                            .max_connections(2)
                            .connect(&url)
                            .await
                            .expect("connect to the test's schema"),
                    )
                }
                None => Pool::Sqlite(
                    jobguard::sqlite::connect(&url, 2)
                        .await
                        .expect("open the test's SQLite file"),
                ),
            }
        });
        Env {
            url,
            dir,
            schema,
            rt,
            pool: Some(pool),
            receiver: None,
        }
    }

    /// Starts the webhook receiver, each webhook taking `latency` to be recorded; returns the
    /// relay's `--webhook-url`.
    fn start_receiver(&mut self, latency: Duration) -> String {
        let config = ProviderConfig {
            webhook_latency: latency,
            ..ProviderConfig::default()
        };
        let running = self
            .rt
            .block_on(Provider::start(config))
            .expect("start the receiver");
        let url = format!("{}/v1/webhooks", running.url());
        self.receiver = Some(running);
        url
    }

    fn provider(&self) -> &Provider {
        self.receiver.as_ref().expect("a receiver").provider()
    }

    /// Publishes `per_topic` messages to each topic, interleaved, through the library.
    fn publish(&self, topics: &[&str], per_topic: usize) -> ByTopic {
        async fn publish_all<DB: Backend>(
            outbox: Outbox<DB>,
            topics: &[&str],
            per_topic: usize,
        ) -> ByTopic {
            outbox.migrate().await.unwrap();
            let mut published = ByTopic::new();
            for n in 0..per_topic {
                let key = JobKey::new("notify", [format!("order-{n}")]).unwrap();
                for topic in topics {
                    let id = outbox
                        .publish(&key, topic, &json!({"order": n, "topic": topic}))
                        .await
                        .unwrap();
                    published
                        .entry(topic.to_string())
                        .or_default()
                        .push(id.to_string());
                }
            }
            published
        }
        match self.pool.as_ref().unwrap() {
            Pool::Postgres(pool) => {
                self.rt
                    .block_on(publish_all(Outbox::new(pool.clone()), topics, per_topic))
            }
            Pool::Sqlite(pool) => {
                self.rt
                    .block_on(publish_all(Outbox::new(pool.clone()), topics, per_topic))
            }
        }
    }

    fn counts(&self) -> OutboxCounts {
        match self.pool.as_ref().unwrap() {
            Pool::Postgres(pool) => self.rt.block_on(Outbox::new(pool.clone()).counts()),
            Pool::Sqlite(pool) => self.rt.block_on(Outbox::new(pool.clone()).counts()),
        }
        .expect("count the outbox")
    }

    /// Starts `jobguard ARGS --database-url URL`, its output going to files of its own.
    fn spawn(&self, name: &str, args: &[&str]) -> Proc {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let stdout = self.dir.join(format!("{n:04}-{name}.out"));
        let stderr = self.dir.join(format!("{n:04}-{name}.err"));
        let child = Command::new(env!("CARGO_BIN_EXE_jobguard"))
            .args(args)
            .args(["--database-url", &self.url])
            .current_dir(&self.dir)
            .env_remove("DATABASE_URL")
            .env(
                "JOBGUARD_LOG",
                std::env::var("JOBGUARD_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("start jobguard");
        Proc {
            child: Some(child),
            name: format!("`jobguard {}` ({name})", args.join(" ")),
            stdout,
            stderr,
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(receiver) = self.receiver.take() {
            self.rt.block_on(receiver.stop());
        }
        if let Some(pool) = self.pool.take() {
            match pool {
                Pool::Postgres(pool) => self.rt.block_on(pool.close()),
                Pool::Sqlite(pool) => self.rt.block_on(pool.close()),
            }
        }
        if std::thread::panicking() {
            return;
        }
        if let Some((admin, schema)) = &self.schema {
            self.rt.block_on(async {
                if let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(admin).await
                {
                    let _ = conn
                        .execute(sqlx::AssertSqlSafe(format!(
                            "set lock_timeout = '10s'; drop schema if exists {schema} cascade"
                        )))
                        .await;
                }
            });
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A directory of the test's own, for the processes' output and the SQLite file.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("jobguard-relay-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn postgres_url() -> Option<String> {
    match std::env::var("JOBGUARD_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
            panic!(
                "CI=true but JOBGUARD_TEST_DATABASE_URL is unset: run the tests with scripts/test"
            )
        }
        _ => {
            // Straight to the process's stderr: `eprintln!` is captured by the test harness and
            // shown only for failing tests, so a skip would pass unseen.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!(
                    "SKIPPED {}: JOBGUARD_TEST_DATABASE_URL is unset, so this PostgreSQL test did \
                     not run (set it, e.g. to postgres://postgres@127.0.0.1:5432/test, or run \
                     scripts/test; with CI=true it fails instead)\n",
                    std::thread::current().name().unwrap_or("a test")
                )
                .as_bytes(),
            );
            None
        }
    }
}

/// The ids each topic received, in the order of their first receipt.
fn first_receipts(provider: &Provider) -> ByTopic {
    let mut seen = HashSet::new();
    let mut topics = ByTopic::new();
    for delivery in provider.webhooks() {
        let id = delivery
            .idempotency_key
            .expect("every delivery carries an Idempotency-Key");
        if seen.insert(id.clone()) {
            topics.entry(delivery.topic).or_default().push(id);
        }
    }
    topics
}

fn distinct(provider: &Provider) -> usize {
    first_receipts(provider).values().map(Vec::len).sum()
}

/// 300 messages; a relay killed with SIGKILL after some were received; `relay --once` after it.
fn killed_relay_loses_nothing(mut env: Env) {
    let webhook_url = env.start_receiver(Duration::from_millis(8));
    let topics = ["invoices", "refunds", "shipments"];
    let published = env.publish(&topics, 100);
    assert_eq!(env.counts().pending, 300);

    let relay_args = [
        "relay",
        "--webhook-url",
        &webhook_url,
        "--batch",
        "50",
        "--poll",
        "50ms",
        "--lease",
        "1s",
        "--json",
    ];
    let mut relay = env.spawn("relay", &relay_args);
    let started = Instant::now();
    while distinct(env.provider()) < 60 {
        assert!(relay.running(), "the relay exited before it was killed");
        assert!(
            started.elapsed() < COMMAND_TIMEOUT,
            "the relay delivered {} messages in {COMMAND_TIMEOUT:?}",
            distinct(env.provider())
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    relay.sigkill();
    let before = distinct(env.provider());
    assert!(
        before < 300,
        "the relay was killed after it had delivered everything"
    );
    let left = env.counts();
    assert!(left.pending > 0, "{left:?}");

    let mut once = relay_args.to_vec();
    once.push("--once");
    let report = env.spawn("relay-once", &once).finish_json(COMMAND_TIMEOUT);
    assert_eq!(
        report["outbox"],
        json!({"pending": 0, "sent": 300, "dead": 0}),
        "{report}"
    );
    assert!(
        report["delivered"].as_u64().unwrap() >= 300 - before as u64,
        "{report}"
    );

    let received = first_receipts(env.provider());
    assert_eq!(
        received, published,
        "every message, each topic in publish order"
    );
    let total = env.provider().webhooks().len();
    eprintln!(
        "{} messages received before SIGKILL, {} received again after it",
        before,
        total - 300
    );
    assert_eq!(
        env.counts(),
        OutboxCounts {
            pending: 0,
            sent: 300,
            dead: 0
        }
    );
}

#[test]
fn killed_relay_loses_nothing_on_sqlite() {
    killed_relay_loses_nothing(Env::sqlite("killed"));
}

#[test]
fn killed_relay_loses_nothing_on_postgres() {
    if let Some(env) = Env::postgres("killed") {
        killed_relay_loses_nothing(env);
    }
}

/// A worker with `--relay-webhook-url --until-idle` delivers what was published before it stops.
fn worker_relays_in_process(mut env: Env) {
    let webhook_url = env.start_receiver(Duration::ZERO);
    let published = env.publish(&["invoices", "refunds"], 5);
    let args = [
        "worker",
        "--until-idle",
        "--poll",
        "50ms",
        "--relay-webhook-url",
        &webhook_url,
        "--json",
    ];
    let report = env.spawn("worker", &args).finish_json(COMMAND_TIMEOUT);
    assert_eq!(
        report["relay"],
        json!({"delivered": 10, "retried": 0, "dead": 0}),
        "{report}"
    );
    assert_eq!(first_receipts(env.provider()), published);
    assert_eq!(
        env.counts(),
        OutboxCounts {
            pending: 0,
            sent: 10,
            dead: 0
        }
    );
}

#[test]
fn worker_relays_in_process_on_sqlite() {
    worker_relays_in_process(Env::sqlite("worker"));
}

#[test]
fn worker_relays_in_process_on_postgres() {
    if let Some(env) = Env::postgres("worker") {
        worker_relays_in_process(env);
    }
}

#[test]
fn bad_relay_flags_are_refused_before_connecting() {
    let env = Env::sqlite("flags");
    for (args, expected) in [
        (
            vec!["relay", "--webhook-url", "ftp://x/y", "--once"],
            "webhook URL",
        ),
        (
            vec!["relay", "--webhook-url", "http://x/y", "--lease", "10ms"],
            "relay lease",
        ),
    ] {
        let mut proc = env.spawn("flags", &args);
        let exit = proc.wait(COMMAND_TIMEOUT).expect("exits");
        assert!(
            !exit.status.success(),
            "{args:?} succeeded: {}",
            exit.stdout
        );
        assert!(exit.stderr.contains(expected), "{args:?}: {}", exit.stderr);
    }
}
