//! `jobguard._native`: the pure parts of jobguard for Python, from `jobguard-core`.
//!
//! Everything here is synchronous and touches no database: keys, fingerprints, the payload
//! rules, API keys, the retention horizon, the retry backoff, and the guard's, the queue's and
//! the worker's SQL text. The Python package runs
//! that SQL on the caller's own connection, so a key, a fingerprint, a payload rule or a
//! statement is the same from Rust and Python.
//! Errors come out as `ValueError` with jobguard's message; the Python layer turns them into
//! its typed errors.

mod periodic;
mod unique;

use std::time::Duration;

use jobguard_core::api_key::{ApiKey, ApiKeyFormat, KeyAlphabet};
use jobguard_core::fingerprint::Fingerprint;
use jobguard_core::key::{JobKey, MAX_KEY_LEN, MAX_KIND_LEN};
use jobguard_core::payload::{MAX_PAYLOAD_BYTES, payload_problem};
use jobguard_core::retention::{Backoff, Horizon};
use jobguard_core::sql;
use jobguard_core::table::TableName;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

fn value_error(error: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(error.to_string())
}

/// The table `table` of `dialect` (`postgres` or `sqlite`), in `schema` on PostgreSQL.
fn table_name(dialect: &str, table: &str, schema: Option<&str>) -> PyResult<TableName> {
    let name = TableName::new(table).map_err(value_error)?;
    match (dialect, schema) {
        ("postgres", Some(schema)) => name.in_schema(schema).map_err(value_error),
        ("postgres" | "sqlite", None) => Ok(name),
        ("sqlite", Some(schema)) => Err(value_error(format!(
            "SQLite has no schemas: name the table alone, not `{schema}.{table}`"
        ))),
        (other, _) => Err(value_error(format!(
            "unknown dialect {other:?}: use `postgres` or `sqlite`"
        ))),
    }
}

/// The encoded job key of `kind` and `parts`, e.g. `credit:order-8812`.
#[pyfunction]
fn key(kind: &str, parts: Vec<String>) -> PyResult<String> {
    JobKey::new(kind, parts)
        .map(JobKey::into_string)
        .map_err(value_error)
}

/// The kind and unescaped parts of an encoded key.
#[pyfunction]
fn parse_key(encoded: &str) -> PyResult<(String, Vec<String>)> {
    let key = JobKey::parse(encoded).map_err(value_error)?;
    Ok((key.kind().to_owned(), key.parts()))
}

/// The kind of an encoded key (`credit` for `credit:order-8812`), the whole key checked: what
/// the guard needs of a key on every claim, without building its parts.
#[pyfunction]
fn kind_of(encoded: &str) -> PyResult<String> {
    let key = JobKey::parse(encoded).map_err(value_error)?;
    Ok(key.kind().to_owned())
}

/// The 32 bytes of the fingerprint of a payload given as JSON text, as the guard table keeps it.
#[pyfunction]
fn fingerprint<'py>(py: Python<'py>, json: &str) -> PyResult<Bound<'py, PyBytes>> {
    let fingerprint = Fingerprint::of_json(json).map_err(value_error)?;
    Ok(PyBytes::new(py, fingerprint.as_bytes()))
}

/// Why a job payload given as JSON text breaks the queue's payload rules (over
/// `MAX_PAYLOAD_BYTES` of JSON, or a NUL character), phrased as the Rust queue phrases it;
/// `None` when it keeps them. The size is of the JSON the Rust queue would store.
#[pyfunction]
fn payload_problem_of(json: &str) -> PyResult<Option<String>> {
    let value: serde_json::Value = serde_json::from_str(json).map_err(value_error)?;
    Ok(payload_problem(&value, "it", "enqueue"))
}

/// The idempotency key for `step` of the job `key` within `max_len` characters of `alphabet`
/// (`printable`, `token` or `alphanumeric`).
#[pyfunction]
fn api_key(key: &str, step: &str, max_len: usize, alphabet: &str) -> PyResult<String> {
    let alphabet = match alphabet {
        "printable" => KeyAlphabet::Printable,
        "token" => KeyAlphabet::Token,
        "alphanumeric" => KeyAlphabet::Alphanumeric,
        other => {
            return Err(value_error(format!(
                "unknown key alphabet {other:?}: use `printable`, `token` or `alphanumeric`"
            )));
        }
    };
    let format = ApiKeyFormat::new(max_len, alphabet).map_err(value_error)?;
    let key = JobKey::parse(key).map_err(value_error)?;
    let derived = ApiKey::derive(&key, step, format).map_err(value_error)?;
    Ok(derived.as_str().to_owned())
}

fn seconds(what: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        value_error(format!(
            "{what} must be a number of seconds >= 0, not {value}"
        ))
    })
}

/// A horizon's terms as `(name, seconds, source)`, its total in seconds and printed form.
type HorizonReport = (Vec<(String, f64, String)>, f64, String);

/// The retention horizon's terms as `(name, seconds, source)`, then the total in seconds and
/// its printed form.
#[pyfunction]
#[pyo3(signature = (max_attempts, base, max_delay, jitter, lease, replay_window))]
fn horizon(
    max_attempts: u32,
    base: f64,
    max_delay: f64,
    jitter: f64,
    lease: f64,
    replay_window: f64,
) -> PyResult<HorizonReport> {
    let backoff = Backoff {
        max_attempts,
        base: seconds("base", base)?,
        max_delay: seconds("max_delay", max_delay)?,
        jitter,
    };
    let horizon = Horizon::new(
        &backoff,
        seconds("lease", lease)?,
        seconds("replay_window", replay_window)?,
    );
    let terms = horizon
        .terms()
        .iter()
        .map(|term| {
            (
                term.name.to_owned(),
                term.duration.as_secs_f64(),
                term.source.to_owned(),
            )
        })
        .collect();
    Ok((terms, horizon.total().as_secs_f64(), horizon.to_string()))
}

/// The guard's statements for `dialect` (`postgres` or `sqlite`) on `table` (in `schema`, on
/// PostgreSQL), exactly as the Rust guard runs them.
#[pyfunction]
#[pyo3(signature = (dialect, table, schema=None))]
fn guard_sql<'py>(
    py: Python<'py>,
    dialect: &str,
    table: &str,
    schema: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let name = table_name(dialect, table, schema)?;
    let out = PyDict::new(py);
    match dialect {
        "postgres" => {
            postgres_migration(&out, &name, sql::postgres::create(&name))?;
            out.set_item("claim", sql::postgres::claim(&name))?;
            out.set_item("claim_bare", sql::postgres::claim_bare(&name))?;
            out.set_item("record", sql::postgres::record(&name))?;
            out.set_item("store_result", sql::postgres::store_result(&name))?;
        }
        "sqlite" => {
            out.set_item("create", sql::sqlite::create(&name))?;
            out.set_item("claim", sql::sqlite::claim(&name))?;
            // SQLite's claim is already the bare insert; the row is read in a second statement.
            out.set_item("claim_bare", sql::sqlite::claim(&name))?;
            out.set_item("record", sql::sqlite::record(&name))?;
            out.set_item("store_result", sql::sqlite::store_result(&name))?;
        }
        _ => unreachable!("table_name accepts postgres and sqlite only"),
    }
    out.set_item("quoted", name.quoted())?;
    Ok(out)
}

/// The queue's enqueue statements for `dialect` on the jobs table `table` (in `schema`, on
/// PostgreSQL), exactly as the Rust `Queue::enqueue_tx` runs them.
#[pyfunction]
#[pyo3(signature = (dialect, table, schema=None))]
fn queue_sql<'py>(
    py: Python<'py>,
    dialect: &str,
    table: &str,
    schema: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let name = table_name(dialect, table, schema)?;
    let out = PyDict::new(py);
    match dialect {
        "postgres" => {
            out.set_item("enqueue", sql::postgres::queue::enqueue(&name))?;
            out.set_item(
                "enqueue_notifying",
                sql::postgres::queue::enqueue_notifying(&name),
            )?;
            out.set_item(
                "enqueue_many_notifying",
                sql::postgres::queue::enqueue_many_notifying(&name),
            )?;
            out.set_item("live_job", sql::postgres::queue::live_job(&name))?;
            out.set_item("notify", sql::postgres::queue::NOTIFY)?;
            out.set_item("notify_channel", sql::postgres::queue::NOTIFY_CHANNEL)?;
        }
        "sqlite" => {
            out.set_item("enqueue", sql::sqlite::queue::enqueue(&name))?;
            out.set_item("live_job", sql::sqlite::queue::live_job(&name))?;
        }
        _ => unreachable!("table_name accepts postgres and sqlite only"),
    }
    Ok(out)
}

/// The worker's statements for `dialect` on the jobs table `jobs` and the guard table `guard`
/// (each in its schema, on PostgreSQL), exactly as the Rust worker runs them: the fetch of the
/// registered kinds, complete-and-claim (PostgreSQL; SQLite completes, then claims), and on
/// PostgreSQL the same for a batch with the read of the keys it did not claim, the
/// statements that settle or extend one lease, the heartbeats of many and the rescue.
#[pyfunction]
#[pyo3(signature = (dialect, jobs, guard, jobs_schema=None, guard_schema=None))]
fn worker_sql<'py>(
    py: Python<'py>,
    dialect: &str,
    jobs: &str,
    guard: &str,
    jobs_schema: Option<&str>,
    guard_schema: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let jobs = table_name(dialect, jobs, jobs_schema)?;
    let guard = table_name(dialect, guard, guard_schema)?;
    let out = PyDict::new(py);
    let clock = match dialect {
        "postgres" => {
            use sql::postgres::worker;
            out.set_item("fetch", worker::fetch(&jobs, worker::Scope::Kinds))?;
            out.set_item(
                "fetch_after",
                worker::fetch(&jobs, worker::Scope::KindsAfter),
            )?;
            out.set_item(
                "claim_completing",
                worker::claim_completing(&guard, &jobs, worker::CompletedRows::Kept),
            )?;
            out.set_item(
                "claim_completing_many",
                worker::claim_completing_many(&guard, &jobs, worker::CompletedRows::Kept),
            )?;
            out.set_item("held", worker::held(&guard))?;
            out.set_item("heartbeat_many", worker::heartbeat_many(&jobs))?;
            out.set_item("rescue", worker::rescue(&jobs))?;
            out.set_item("notify_channel", sql::postgres::queue::NOTIFY_CHANNEL)?;
            sql::lease::POSTGRES
        }
        "sqlite" => {
            use sql::sqlite::worker;
            out.set_item("fetch", worker::fetch(&jobs, worker::Scope::Kinds))?;
            out.set_item("claim", sql::sqlite::claim(&guard))?;
            out.set_item("record", sql::sqlite::record(&guard))?;
            out.set_item("rescue", worker::rescue(&jobs))?;
            sql::lease::SQLITE
        }
        _ => unreachable!("table_name accepts postgres and sqlite only"),
    };
    out.set_item("complete", sql::lease::complete(&jobs, clock))?;
    out.set_item("retry", sql::lease::retry(&jobs, clock))?;
    out.set_item("dead", sql::lease::dead(&jobs, clock))?;
    out.set_item("release", sql::lease::release(&jobs))?;
    out.set_item("give_back", sql::lease::give_back(&jobs, clock))?;
    out.set_item("heartbeat", sql::lease::heartbeat(&jobs, clock))?;
    Ok(out)
}

/// A PostgreSQL migration of `table` as the Rust store runs it (`migrate_statements`): the
/// statements (`create`), the schema `marker` they leave as the table's comment and the
/// statements that read it (`migrated`, given `quoted`) and leave it (`mark_migrated`), and the
/// per-table lock taken around them (`migrate_lock` on `migrate_lock_key`, waiting at most
/// `migrate_lock_timeout`), so Python and Rust processes migrating at once take turns.
pub(crate) fn postgres_migration(
    out: &Bound<'_, PyDict>,
    table: &TableName,
    create: Vec<String>,
) -> PyResult<()> {
    let marker = sql::schema_marker(&create);
    out.set_item(
        "mark_migrated",
        sql::postgres::mark_migrated(table, &marker),
    )?;
    out.set_item("marker", marker)?;
    out.set_item("create", create)?;
    out.set_item("quoted", table.quoted())?;
    out.set_item("migrated", sql::postgres::MIGRATED)?;
    out.set_item("migrate_lock", sql::postgres::MIGRATE_LOCK)?;
    out.set_item("migrate_lock_key", sql::postgres::migrate_lock_key(table))?;
    out.set_item("migrate_lock_timeout", sql::postgres::MIGRATE_LOCK_TIMEOUT)?;
    Ok(())
}

/// The queue's migration for `dialect` on the jobs table `table` (in `schema`, on PostgreSQL),
/// exactly as the Rust `Queue::migrate` runs it: `create`, the statements in order (the core's
/// `queue::create`, the list the Rust queue runs); on PostgreSQL the table's schema `marker`
/// and the statements that read it, take the per-table migration lock and leave the marker, as
/// the guard's migration has them; on SQLite `optional`, per statement, whether a `duplicate
/// column name` error skips it.
#[pyfunction]
#[pyo3(signature = (dialect, table, schema=None))]
fn queue_migration<'py>(
    py: Python<'py>,
    dialect: &str,
    table: &str,
    schema: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let name = table_name(dialect, table, schema)?;
    let out = PyDict::new(py);
    match dialect {
        "postgres" => {
            postgres_migration(&out, &name, sql::postgres::queue::create(&name))?;
        }
        "sqlite" => {
            let create = sql::sqlite::queue::create(&name);
            let optional: Vec<bool> = create
                .iter()
                .map(|statement| sql::queue_schema::is_optional_on_sqlite(statement))
                .collect();
            out.set_item("create", create)?;
            out.set_item("optional", optional)?;
        }
        _ => unreachable!("table_name accepts postgres and sqlite only"),
    }
    out.set_item("quoted", name.quoted())?;
    Ok(out)
}

/// A retry policy's numbers as `(max_attempts, base, max_delay, jitter)`, seconds as floats,
/// checked as the Rust worker checks them.
type Policy = (u32, f64, f64, f64);

fn backoff((max_attempts, base, max_delay, jitter): Policy) -> PyResult<Backoff> {
    if max_attempts == 0 {
        return Err(value_error("max_attempts must be at least 1"));
    }
    if !(0.0..=1.0).contains(&jitter) {
        return Err(value_error(format!(
            "jitter must be a fraction from 0 to 1, not {jitter}"
        )));
    }
    let backoff = Backoff {
        max_attempts,
        base: seconds("base", base)?,
        max_delay: seconds("max_delay", max_delay)?,
        jitter,
    };
    for (what, delay) in [("base", backoff.base), ("max_delay", backoff.max_delay)] {
        if delay > Backoff::MAX_DELAY {
            return Err(value_error(format!(
                "{what} must be at most 365 days between attempts, not {delay:?}"
            )));
        }
    }
    Ok(backoff)
}

/// The Rust worker's default retry policy: `(max_attempts, base, max_delay, jitter)`.
#[pyfunction]
fn retry_defaults() -> Policy {
    let d = Backoff::default();
    (
        d.max_attempts,
        d.base.as_secs_f64(),
        d.max_delay.as_secs_f64(),
        d.jitter,
    )
}

/// Checks a retry policy; raises `ValueError` naming the first field out of range.
#[pyfunction]
fn check_retry(policy: Policy) -> PyResult<()> {
    backoff(policy).map(drop)
}

/// The delay in seconds after failed attempt `attempt` under `policy`, jitter drawn from
/// `unit` in `[0, 1]`: the Rust worker's backoff.
#[pyfunction]
fn retry_delay(policy: Policy, attempt: u32, unit: f64) -> PyResult<f64> {
    Ok(backoff(policy)?.delay(attempt, unit).as_secs_f64())
}

/// The last attempt of a job enqueued with `job_max_attempts` under `policy`: a failure on
/// it (or past it) is dead-lettered.
#[pyfunction]
fn last_attempt(policy: Policy, job_max_attempts: i32) -> PyResult<i32> {
    Ok(backoff(policy)?.last_attempt(job_max_attempts))
}

/// How the error code `code` on `dialect` may pass when its transaction runs again:
/// `"contention"` (run it again), `"connection"` (run it again on another connection), or
/// `None` (it would fail the same way): the table the Rust runners classify by.
#[pyfunction]
fn transient(dialect: &str, code: &str) -> Option<&'static str> {
    jobguard_core::transient::classify(dialect, code).map(|class| class.as_str())
}

/// The wait in seconds before running a transaction again after its `run`-th run (from 1)
/// ended in a transient error, scaled by `0.5 + jitter` (a `jitter` in `[0, 1)`).
#[pyfunction]
fn transient_backoff(run: u32, jitter: f64) -> f64 {
    jobguard_core::transient::backoff(run, jitter).as_secs_f64()
}

/// Seconds of a duration written as the command lines take it (`30s`, `500ms`, `2m`); a
/// `ValueError` that says how to write one otherwise.
#[pyfunction]
fn parse_duration(text: &str) -> PyResult<f64> {
    jobguard_core::duration::parse_duration(text)
        .map(|duration| duration.as_secs_f64())
        .map_err(value_error)
}

/// The module `jobguard._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(key, m)?)?;
    m.add_function(wrap_pyfunction!(parse_key, m)?)?;
    m.add_function(wrap_pyfunction!(kind_of, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(payload_problem_of, m)?)?;
    m.add_function(wrap_pyfunction!(api_key, m)?)?;
    m.add_function(wrap_pyfunction!(horizon, m)?)?;
    m.add_function(wrap_pyfunction!(guard_sql, m)?)?;
    m.add_function(wrap_pyfunction!(queue_sql, m)?)?;
    m.add_function(wrap_pyfunction!(worker_sql, m)?)?;
    m.add_function(wrap_pyfunction!(queue_migration, m)?)?;
    m.add_function(wrap_pyfunction!(retry_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(check_retry, m)?)?;
    m.add_function(wrap_pyfunction!(retry_delay, m)?)?;
    m.add_function(wrap_pyfunction!(last_attempt, m)?)?;
    m.add_function(wrap_pyfunction!(transient, m)?)?;
    m.add_function(wrap_pyfunction!(transient_backoff, m)?)?;
    m.add_function(wrap_pyfunction!(parse_duration, m)?)?;
    m.add("TRANSIENT_RUNS", jobguard_core::transient::RUNS)?;
    unique::register(m)?;
    periodic::register(m)?;
    m.add("MAX_KEY_LEN", MAX_KEY_LEN)?;
    m.add("MAX_KIND_LEN", MAX_KIND_LEN)?;
    m.add("MAX_PAYLOAD_BYTES", MAX_PAYLOAD_BYTES)?;
    Ok(())
}
