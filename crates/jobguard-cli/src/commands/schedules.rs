//! Periodic schedules: the file `jobguard worker --schedule FILE` reads, and `jobguard
//! schedules`, each schedule's last and next firing and the job its last firing produced.
//!
//! The file is TOML (or JSON when its name ends in `.json`), a list of schedules:
//!
//! ```toml
//! [[schedule]]
//! name = "nightly-credit"
//! cron = "0 3 * * *"          # five fields, or six with seconds first
//! kind = "credit"
//! payload = { order = "nightly", account = 7, amount = 5 }
//! zone = "Europe/Paris"       # IANA name; UTC when left out
//! missed = "latest"           # skip (default), latest, all, all:N
//! # queue = "reports"         # the worker's --queue when left out
//! # grace = "1m"              # how late a firing may be reached and still be on time
//! # firing_field = "order"    # a payload field set to each firing's time
//! ```

use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::{Context, bail};
use clap::Args;
use jobguard::periodic::{Missed, Periodic, ScheduleStatus, Scheduler, format_firing};
use jobguard::{Backend, Queue};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::Pool;

use crate::args::{Target, parse_duration};
use crate::builtin_jobs;
use crate::database::{Database, redact};
use crate::on_pool;
use crate::report::{self, table};

/// One schedule as the file writes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleEntry {
    name: String,
    cron: String,
    kind: String,
    #[serde(default = "empty_object")]
    payload: Value,
    #[serde(default)]
    zone: Option<String>,
    #[serde(default)]
    missed: Option<String>,
    #[serde(default)]
    queue: Option<String>,
    #[serde(default)]
    grace: Option<String>,
    #[serde(default)]
    firing_field: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// The file: `[[schedule]]` tables in TOML, `{"schedule": [...]}` or a bare array in JSON.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleFile {
    #[serde(default)]
    schedule: Vec<ScheduleEntry>,
}

/// The schedules in `path`, each checked (cron expression, time zone, policy, and for a
/// built-in kind its payload), their jobs on `queue` unless they name another.
pub fn load(path: &Path, queue: &str) -> anyhow::Result<Vec<Periodic>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the schedule file {}", path.display()))?;
    let entries = parse(path, &text)
        .with_context(|| format!("cannot read the schedule file {}", path.display()))?;
    if entries.is_empty() {
        bail!("the schedule file {} has no schedule", path.display());
    }
    entries
        .into_iter()
        .map(|entry| {
            let name = entry.name.clone();
            periodic(entry, queue)
                .with_context(|| format!("in the schedule file {}", path.display()))
                .with_context(|| format!("schedule `{name}` is refused"))
        })
        .collect()
}

fn parse(path: &Path, text: &str) -> anyhow::Result<Vec<ScheduleEntry>> {
    let json = path
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("json"));
    if !json {
        return Ok(toml::from_str::<ScheduleFile>(text)?.schedule);
    }
    let value: Value = serde_json::from_str(text)?;
    Ok(match value {
        Value::Array(_) => serde_json::from_value(value)?,
        _ => serde_json::from_value::<ScheduleFile>(value)?.schedule,
    })
}

fn periodic(entry: ScheduleEntry, queue: &str) -> anyhow::Result<Periodic> {
    let ScheduleEntry {
        name,
        cron,
        kind,
        payload,
        zone,
        missed,
        queue: own_queue,
        grace,
        firing_field,
    } = entry;
    let mut periodic = Periodic::new(&name, &cron, &kind, &payload)?;
    if let Some(zone) = zone {
        periodic = periodic.zone(&zone)?;
    }
    if let Some(field) = firing_field {
        periodic = periodic.firing_field(&field)?;
    }
    // A built-in kind's payload in its canonical form (defaults written out), checked as
    // `jobguard enqueue` checks it.
    if let Some(checked) = builtin_jobs::check(&kind, &periodic.payload_at(0))? {
        let mut canonical = Periodic::new(&name, &cron, &kind, &checked.payload)?;
        if let Some(zone) = (periodic.zone_name() != "UTC").then(|| periodic.zone_name()) {
            canonical = canonical.zone(zone)?;
        }
        if let Some(field) = periodic.firing_field_name() {
            canonical = canonical.firing_field(field)?;
        }
        periodic = canonical;
    }
    if let Some(missed) = missed {
        periodic = periodic.missed(missed.parse::<Missed>()?);
    }
    if let Some(grace) = grace {
        periodic = periodic.grace(parse_duration(&grace).map_err(anyhow::Error::msg)?);
    }
    Ok(periodic.queue(own_queue.as_deref().unwrap_or(queue)))
}

#[derive(Args, Debug)]
pub struct SchedulesArgs {
    #[command(flatten)]
    target: Target,
}

/// What `jobguard schedules` prints.
#[derive(Debug, Serialize)]
struct SchedulesReport {
    database: String,
    schedules: Vec<ScheduleStatus>,
}

pub async fn schedules(args: SchedulesArgs) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let schedules = on_pool!(Database::connect(&args.target.database_url, 2).await?, pool => read(pool, &database).await?);
    let report = SchedulesReport {
        database,
        schedules,
    };
    report::print(&report, args.target.json, render)?;
    Ok(ExitCode::SUCCESS)
}

async fn read<DB: Backend>(pool: Pool<DB>, database: &str) -> anyhow::Result<Vec<ScheduleStatus>> {
    let statuses = Scheduler::status(&Queue::new(pool.clone()), SystemTime::now())
        .await
        .with_context(|| format!("cannot read the schedules in {database}"))?;
    pool.close().await;
    Ok(statuses)
}

fn when(at: Option<i64>) -> String {
    at.map_or_else(|| "-".to_owned(), format_firing)
}

fn render(report: &SchedulesReport) -> String {
    if report.schedules.is_empty() {
        return format!(
            "no schedule in {}: run `jobguard worker --schedule FILE`",
            report.database
        );
    }
    let mut out = table(&[
        "schedule",
        "cron",
        "zone",
        "kind",
        "queue",
        "last firing",
        "its job",
        "next firing",
    ]);
    for s in &report.schedules {
        let job = match (s.last_job_id, &s.last_job_state) {
            (Some(id), Some(state)) => format!("{id} ({state})"),
            (Some(id), None) => format!("{id} (pruned)"),
            _ => "-".to_owned(),
        };
        out.add_row(vec![
            s.name.clone(),
            s.cron.clone(),
            s.zone.clone(),
            s.kind.clone(),
            s.queue.clone(),
            when(s.last_fired_at),
            job,
            when(s.next_firing),
        ]);
    }
    out.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(name: &str, text: &str) -> anyhow::Result<Vec<Periodic>> {
        let dir = std::env::temp_dir().join(format!("jobguard-schedules-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        load(&path, "default")
    }

    #[test]
    fn toml_and_json_files_give_the_same_schedules() {
        let toml = load_text(
            "s.toml",
            r#"
            [[schedule]]
            name = "nightly"
            cron = "0 3 * * *"
            kind = "credit"
            payload = { order = "n", account = 7, amount = 5 }
            zone = "Europe/Paris"
            missed = "all:5"
            "#,
        )
        .unwrap();
        let json = load_text(
            "s.json",
            r#"[{"name": "nightly", "cron": "0 3 * * *", "kind": "credit",
                "payload": {"order": "n", "account": 7, "amount": 5},
                "zone": "Europe/Paris", "missed": "all:5"}]"#,
        )
        .unwrap();
        for schedules in [&toml, &json] {
            assert_eq!(schedules.len(), 1);
            assert_eq!(schedules[0].zone_name(), "Europe/Paris");
            assert_eq!(schedules[0].missed_policy(), Missed::All { limit: 5 });
            assert_eq!(schedules[0].queue_name(), "default");
        }
    }

    #[test]
    fn bad_entries_are_refused_naming_the_schedule() {
        for (text, says) in [
            (
                r#"[[schedule]]
                name = "a"
                cron = "every day"
                kind = "noop"
                payload = { id = "x" }"#,
                "not a cron expression",
            ),
            (
                r#"[[schedule]]
                name = "a"
                cron = "* * * * *"
                kind = "noop"
                payload = { id = "x" }
                zone = "Moon/Base""#,
                "unknown time zone `Moon/Base`",
            ),
            (
                r#"[[schedule]]
                name = "a"
                cron = "* * * * *"
                kind = "credit"
                payload = { order = "x", account = 7, amount = 0 }"#,
                "non-zero",
            ),
            (
                r#"[[schedule]]
                name = "a"
                cron = "* * * * *"
                kind = "noop"
                payload = { id = "x" }
                missed = "some""#,
                "missed-firings policy",
            ),
        ] {
            let error = format!("{:#}", load_text("bad.toml", text).unwrap_err());
            assert!(error.contains("schedule `a`"), "{error}");
            assert!(error.contains(says), "{error}");
        }
    }
}
