//! Unique-job policies for Python: the core's rules ([`jobguard_core::unique`]) and the
//! statements a unique enqueue runs, so a policy means the same from Python as from Rust.

use jobguard_core::key::JobKey;
use jobguard_core::sql;
use jobguard_core::unique::{
    Conflict, OnConflict, UniqueOpts, UniqueStates, period_error, period_start,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{table_name, value_error};

/// A policy checked as the Rust queue checks it: `states` (a comma-separated list, `None` for
/// the live states), `period` (whole seconds, `None` for none) and `on_conflict`. Returns the
/// stored `unique_states` mask and the canonical states and action; raises `ValueError` with
/// the core's message naming the setting.
#[pyfunction]
#[pyo3(signature = (states, period, on_conflict))]
fn unique_policy(
    states: Option<&str>,
    period: Option<f64>,
    on_conflict: &str,
) -> PyResult<(i32, String, String)> {
    let states = match states {
        Some(list) => list.parse::<UniqueStates>().map_err(value_error)?,
        None => UniqueStates::LIVE,
    };
    if let Some(seconds) = period {
        // Whole seconds, as the Rust queue's `Duration` period must be.
        if seconds.fract() != 0.0 || !(1.0..=u64::MAX as f64).contains(&seconds) {
            return Err(value_error(period_error(format!("{seconds}s"))));
        }
    }
    let action = on_conflict.parse::<OnConflict>().map_err(value_error)?;
    Ok((
        states.mask(),
        states.to_string(),
        action.as_str().to_owned(),
    ))
}

/// The key a job is stored under: `key`, then `queue` when `by_queue`, then the start of the
/// `period` (seconds) that `run_at` (seconds since the epoch) falls in.
#[pyfunction]
#[pyo3(signature = (key, queue, by_queue, period, run_at))]
fn unique_key(
    key: &str,
    queue: &str,
    by_queue: bool,
    period: Option<u64>,
    run_at: i64,
) -> PyResult<String> {
    let mut opts = UniqueOpts::new();
    if by_queue {
        opts = opts.by_queue();
    }
    if let Some(seconds) = period {
        opts = opts.period_secs(seconds).map_err(value_error)?;
    }
    let key = JobKey::parse(key).map_err(value_error)?;
    let stored = opts.stored_key(&key, queue, run_at).map_err(value_error)?;
    Ok(stored.into_string())
}

/// The start of the period of `length` seconds that `at` falls in, as a key part.
#[pyfunction]
fn unique_period_start(at: i64, length: u64) -> String {
    period_start(at, length)
}

/// What an enqueue under `on_conflict` does about the job holding its key: `return`,
/// `key_reused`, `reject`, `replace` or `replace_or_reject`.
#[pyfunction]
fn unique_settle(on_conflict: &str, same_kind: bool, same_payload: bool) -> PyResult<&'static str> {
    let action = on_conflict.parse::<OnConflict>().map_err(value_error)?;
    Ok(match action.settle(same_kind, same_payload) {
        Conflict::Return => "return",
        Conflict::KeyReused => "key_reused",
        Conflict::Reject => "reject",
        Conflict::Replace { or_reject: false } => "replace",
        Conflict::Replace { or_reject: true } => "replace_or_reject",
    })
}

/// The message of an enqueue refused by `reject` (`replace_or_reject` false) or by
/// `replace-or-reject` finding the holder no longer waiting (true), as the Rust error says it.
#[pyfunction]
fn unique_refusal(key: &str, existing_id: i64, state: &str, replace_or_reject: bool) -> String {
    match replace_or_reject {
        false => jobguard_core::unique::rejected(key, existing_id, state),
        true => jobguard_core::unique::replace_rejected(key, existing_id, state),
    }
}

/// The statements of a unique enqueue for `dialect` on the jobs table `table` (in `schema`,
/// on PostgreSQL): `enqueue_unique`, `holder`, `replace`, exactly as the Rust queue runs them.
#[pyfunction]
#[pyo3(signature = (dialect, table, schema=None))]
fn unique_sql<'py>(
    py: Python<'py>,
    dialect: &str,
    table: &str,
    schema: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let name = table_name(dialect, table, schema)?;
    let out = PyDict::new(py);
    let (enqueue_unique, clock) = match dialect {
        "postgres" => (
            sql::postgres::queue::enqueue_unique(&name),
            sql::lease::POSTGRES,
        ),
        _ => (
            sql::sqlite::queue::enqueue_unique(&name),
            sql::lease::SQLITE,
        ),
    };
    out.set_item("enqueue_unique", enqueue_unique)?;
    out.set_item("holder", sql::holder(&name))?;
    out.set_item("replace", sql::replace(&name, clock))?;
    Ok(out)
}

/// Adds the unique-policy functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(unique_policy, m)?)?;
    m.add_function(wrap_pyfunction!(unique_key, m)?)?;
    m.add_function(wrap_pyfunction!(unique_period_start, m)?)?;
    m.add_function(wrap_pyfunction!(unique_settle, m)?)?;
    m.add_function(wrap_pyfunction!(unique_refusal, m)?)?;
    m.add_function(wrap_pyfunction!(unique_sql, m)?)?;
    Ok(())
}
