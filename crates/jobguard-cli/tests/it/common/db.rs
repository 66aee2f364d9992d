//! A database of the test's own: a SQLite file in a directory of its own, or a PostgreSQL
//! schema reached through the URL's `search_path` option; the binary run against it; and a
//! pool of the test process for the reads and writes that must be quick.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use jobguard_testsupport::{Exit, Proc, Schema, Service, off_runtime, scratch, spawn};
use serde_json::Value;
use sqlx::Executor;

use super::jobguard;
use super::machine::{Share, share};

/// The longest any single command of the binary may take before the test fails.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// A pool of either backend.
pub enum AnyPool {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

/// Runs the same async code on either backend's pool of a [`Db`], on the pool's runtime:
/// `on_pool!(db, |pool| Queue::new(pool.clone()).counts())`.
#[macro_export]
macro_rules! on_pool {
    ($db:expr, |$pool:ident| $body:expr) => {
        match $db.pool() {
            $crate::common::AnyPool::Postgres($pool) => $db.block_on($body),
            $crate::common::AnyPool::Sqlite($pool) => $db.block_on($body),
        }
    };
}

/// A runtime and a pool of the test process. The pool's connections belong to the runtime
/// that opened them, so everything done with the pool runs on it.
struct Direct {
    rt: tokio::runtime::Runtime,
    pool: AnyPool,
}

/// A database of the test's own, dropped with its directory when the test passes (both are
/// kept when it fails, for a look at the processes' logs).
pub struct Db {
    pub url: String,
    /// The processes' working directory and output files (and the SQLite file).
    pub dir: PathBuf,
    /// The PostgreSQL schema to drop at the end.
    schema: Option<Schema>,
    /// Whether dropping this removes `dir`.
    owns_dir: bool,
    acquire_timeout: Duration,
    direct: OnceLock<Direct>,
    /// This test's share of the machine, for a database made by [`Db::sqlite`] or
    /// [`Db::postgres`]; dropped last.
    machine: Option<Share>,
}

impl Db {
    /// A directory of the test's own, emptied, for the processes' output.
    pub fn scratch(test: &str) -> PathBuf {
        scratch("jobguard-cli", test)
    }

    /// A database at `url`, its processes working in `dir`; dropping it closes the test's
    /// pool and, when `owns_dir`, removes `dir`, but drops no schema.
    pub fn at(url: String, dir: PathBuf, owns_dir: bool) -> Db {
        Db {
            url,
            dir,
            schema: None,
            owns_dir,
            acquire_timeout: Duration::from_secs(30),
            direct: OnceLock::new(),
            machine: None,
        }
    }

    /// How long the test's pool waits for a connection (30 s unless told).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Db {
        self.acquire_timeout = timeout;
        self
    }

    /// A fresh SQLite file of `test`'s own.
    pub fn sqlite(test: &str) -> Db {
        let machine = share();
        let dir = Db::scratch(test);
        let url = format!("sqlite:{}", dir.join("test.db").display());
        let mut db = Db::at(url, dir, true);
        db.machine = machine;
        db
    }

    /// A fresh schema of `test`'s own; `None` to skip when no PostgreSQL answers.
    pub fn postgres(test: &str) -> Option<Db> {
        Some(Db::postgres_at(&Service::Postgres.url()?, test))
    }

    /// A fresh schema when PostgreSQL answers, else a SQLite file, never a skip: for tests
    /// about something else (a broker) that need a database of either kind.
    pub fn postgres_or_sqlite(test: &str) -> Db {
        match Service::Postgres.answering() {
            Some(admin) => Db::postgres_at(&admin, test),
            None => Db::sqlite(test),
        }
    }

    fn postgres_at(admin: &str, test: &str) -> Db {
        let machine = share();
        let name = format!(
            "jg_cli_{}_{}",
            jobguard_testsupport::slug(test),
            std::process::id()
        );
        let schema = off_runtime(Schema::create(admin, &name));
        let mut db = Db::at(schema.url(), Db::scratch(&format!("{test}::pg")), true);
        db.schema = Some(schema);
        db.machine = machine;
        db
    }

    /// Another fresh database of `test`'s own on the same backend as this one (made by
    /// [`Db::sqlite`] or [`Db::postgres`]).
    pub fn another(&self, test: &str) -> Db {
        match &self.schema {
            Some(schema) => Db::postgres_at(schema.admin(), test),
            None => Db::sqlite(test),
        }
    }

    pub fn is_postgres(&self) -> bool {
        !self.url.starts_with("sqlite:")
    }

    /// `postgres` or `sqlite`, for failure messages.
    pub fn backend(&self) -> &'static str {
        if self.is_postgres() {
            "postgres"
        } else {
            "sqlite"
        }
    }

    /// `jobguard ARGS --database-url URL`, run in the test's directory.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = jobguard();
        command
            .args(args)
            .args(["--database-url", &self.url])
            .current_dir(&self.dir);
        command
    }

    /// Starts `jobguard ARGS --database-url URL` logging at `info` (or `JOBGUARD_LOG`), its
    /// output going to files of its own.
    pub fn spawn(&self, name: &str, args: &[&str]) -> Proc {
        let mut command = self.command(args);
        command
            .env(
                "JOBGUARD_LOG",
                std::env::var("JOBGUARD_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1");
        spawn(&self.dir, name, command)
    }

    /// Runs `jobguard ARGS --database-url URL` to its end.
    pub fn run(&self, args: &[&str]) -> Exit {
        self.run_with(args, &[])
    }

    /// Runs `jobguard ARGS --database-url URL` to its end, with environment variables set.
    pub fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Exit {
        let mut command = self.command(args);
        command.envs(env.iter().copied());
        spawn(&self.dir, args[0], command).finish(COMMAND_TIMEOUT)
    }

    /// Runs a command that must succeed, with `--json`, and returns what it printed.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        spawn(&self.dir, args[0], self.command(&args)).finish_json(COMMAND_TIMEOUT)
    }

    /// Runs a command that must fail, and returns its error output.
    pub fn fails(&self, args: &[&str]) -> String {
        let run = self.run(args);
        assert!(!run.ok, "jobguard {args:?} succeeded: {}", run.stdout);
        assert!(
            run.stderr.contains("error"),
            "no error message: {}",
            run.stderr
        );
        run.stderr
    }

    fn direct(&self) -> &Direct {
        self.direct.get_or_init(|| {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let pool = if self.is_postgres() {
                AnyPool::Postgres(
                    rt.block_on(
                        sqlx::postgres::PgPoolOptions::new()
                            .max_connections(2)
                            .acquire_timeout(self.acquire_timeout)
                            .connect(&self.url),
                    )
                    .expect("connect to the test's database"),
                )
            } else {
                AnyPool::Sqlite(
                    rt.block_on(jobguard::sqlite::connect(&self.url, 2))
                        .expect("open the test's SQLite file"),
                )
            };
            Direct { rt, pool }
        })
    }

    /// The test's own pool, opened on first use; see [`on_pool!`](crate::on_pool).
    pub fn pool(&self) -> &AnyPool {
        &self.direct().pool
    }

    /// Runs `future` on the runtime of the test's pool, which also serves what the test
    /// starts there (a webhook receiver) until the database is dropped.
    pub fn block_on<T>(&self, future: impl Future<Output = T>) -> T {
        self.direct().rt.block_on(future)
    }

    /// Runs a statement directly.
    pub fn execute(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        on_pool!(self, |pool| async {
            pool.execute(sql).await.unwrap();
        })
    }

    /// The one number a query returns.
    pub fn count(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        on_pool!(self, |pool| async {
            sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
        })
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some(direct) = self.direct.take() {
            match direct.pool {
                AnyPool::Postgres(pool) => direct.rt.block_on(pool.close()),
                AnyPool::Sqlite(pool) => direct.rt.block_on(pool.close()),
            }
        }
        if std::thread::panicking() {
            if self.owns_dir {
                eprintln!("the processes' logs are in {}", self.dir.display());
            }
            return;
        }
        if let Some(schema) = &self.schema {
            off_runtime(schema.drop_now());
        }
        if self.owns_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
