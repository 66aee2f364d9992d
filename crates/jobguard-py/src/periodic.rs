//! Periodic jobs for Python: cron expressions evaluated by the core (croner on chrono-tz),
//! the firing keys, the missed-firings plan and the schedules table's statements, so a Python
//! scheduler computes the same firings, keys and plan as a Rust one.

use jobguard_core::cron::{ZonedCron, parse_zone};
use jobguard_core::periodic::{self, Missed};
use jobguard_core::sql::schedules;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{postgres_migration, table_name, value_error};

/// A cron expression in a time zone: `Cron("0 3 * * *", "Europe/Paris")`. A bad expression
/// or an unknown zone raises `ValueError` with the core's reason.
#[pyclass(frozen, module = "jobguard._native")]
struct Cron {
    cron: ZonedCron,
}

#[pymethods]
impl Cron {
    #[new]
    fn new(expression: &str, zone: &str) -> PyResult<Self> {
        let zone = parse_zone(zone).map_err(value_error)?;
        let cron = ZonedCron::new(expression, zone).map_err(value_error)?;
        Ok(Cron { cron })
    }

    /// The first firing strictly after `seconds` since the epoch, if any.
    fn next_after(&self, seconds: i64) -> Option<i64> {
        self.cron.next_after(seconds)
    }

    /// The firings after `after` and at or before `through`, oldest first (the most recent
    /// ones when there are very many), and whether older ones were left out.
    fn due(&self, after: i64, through: i64) -> (Vec<i64>, bool) {
        self.cron.due(after, through)
    }
}

/// The key of the firing of `schedule` at `at`: `periodic:<schedule>:<time>`.
#[pyfunction]
fn firing_key(schedule: &str, at: i64) -> PyResult<String> {
    periodic::firing_key(schedule, at)
        .map(|key| key.into_string())
        .map_err(value_error)
}

/// A firing's time as its key shows it: `2026-12-06T03:00:00Z`.
#[pyfunction]
fn format_firing(at: i64) -> String {
    periodic::format_firing(at)
}

/// The missed-firings policy `text` (`skip`, `latest`, `all`, `all:N`) in its canonical form.
#[pyfunction]
fn missed_policy(text: &str) -> PyResult<String> {
    let missed: Missed = text.parse().map_err(value_error)?;
    Ok(missed.to_string())
}

/// Of `due` firings (oldest first), those a scheduler at `now` enqueues and those it counts
/// missed, under `missed` with a grace of `grace` seconds: the core's plan.
#[pyfunction]
fn plan(due: Vec<i64>, now: i64, grace: i64, missed: &str) -> PyResult<(Vec<i64>, Vec<i64>)> {
    let missed: Missed = missed.parse().map_err(value_error)?;
    let plan = periodic::plan(&due, now, grace, missed);
    Ok((plan.enqueue, plan.missed))
}

/// The unique states of every firing's job, as a list of states: its key stays taken while it
/// waits, runs, and after it completed or died, until retention prunes it.
#[pyfunction]
fn firing_unique_states() -> String {
    periodic::firing_states().to_string()
}

/// The schedules table's statements for `dialect`, beside the jobs table `jobs` (in `schema`
/// on PostgreSQL): `create` (a list), `register`, `read`, `fired`, `list`, and `table`.
#[pyfunction]
#[pyo3(signature = (dialect, jobs, schema=None))]
fn schedule_sql<'py>(
    py: Python<'py>,
    dialect: &str,
    jobs: &str,
    schema: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let jobs = table_name(dialect, jobs, schema)?;
    let table = schedules::table(&jobs).map_err(value_error)?;
    let out = PyDict::new(py);
    if dialect == "postgres" {
        // The statements the Rust scheduler runs, under the same lock and marker.
        let mut create = table.schema_statements();
        create.push(schedules::create(&table));
        postgres_migration(&out, &table, create)?;
    } else {
        out.set_item("create", vec![schedules::create(&table)])?;
    }
    out.set_item("register", schedules::register(&table))?;
    out.set_item("read", schedules::read(&table))?;
    out.set_item("advance", schedules::advance(&table))?;
    out.set_item("fired", schedules::fired(&table))?;
    out.set_item("firing_job", schedules::firing_job(&table))?;
    out.set_item("list", schedules::list(&table))?;
    out.set_item("table", table.to_string())?;
    Ok(out)
}

/// Adds the periodic functions to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Cron>()?;
    m.add_function(wrap_pyfunction!(firing_key, m)?)?;
    m.add_function(wrap_pyfunction!(format_firing, m)?)?;
    m.add_function(wrap_pyfunction!(missed_policy, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(firing_unique_states, m)?)?;
    m.add_function(wrap_pyfunction!(schedule_sql, m)?)?;
    m.add("DEFAULT_ALL_LIMIT", periodic::DEFAULT_ALL_LIMIT)?;
    Ok(())
}
