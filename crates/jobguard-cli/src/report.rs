//! How every command prints what it did: one JSON object with `--json`, text and tables
//! otherwise.

use std::process::ExitCode;
use std::time::SystemTime;

use comfy_table::{Cell, CellAlignment, ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use serde::Serialize;

/// Prints `report` as pretty JSON when `json`, else the text `render` makes of it.
pub fn print<T: Serialize>(
    report: &T,
    json: bool,
    render: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", render(report));
    }
    Ok(())
}

/// Prints a demo's or a benchmark's report, and exits non-zero unless every job took effect
/// once.
pub fn verdict<T: Serialize>(
    report: &T,
    json: bool,
    render: impl FnOnce(&T) -> String,
    exactly_once: bool,
) -> anyhow::Result<ExitCode> {
    print(report, json, render)?;
    Ok(if exactly_once {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A table in the style of the demo's report.
pub fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    table
}

/// A table of counts by outcome, each with what it means: `header` names the three columns.
pub fn outcomes(header: [&str; 3], rows: &[(&str, u64, &str)]) -> Table {
    let mut table = table(&header);
    for &(name, n, meaning) in rows {
        table.add_row(vec![
            Cell::new(name),
            Cell::new(n).set_alignment(CellAlignment::Right),
            Cell::new(meaning),
        ]);
    }
    table
}

/// A time by the database clock, to the second, in UTC.
pub fn time(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// `text` cut to `max` characters.
pub fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(max.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// The cells that open a dead job's row in a table: id, kind, key and attempts.
pub fn dead_job_cells(
    id: i64,
    kind: &str,
    key: &str,
    attempt: i32,
    max_attempts: i32,
) -> Vec<Cell> {
    vec![
        Cell::new(id).set_alignment(CellAlignment::Right),
        Cell::new(kind),
        Cell::new(key),
        Cell::new(format!("{attempt}/{max_attempts}")).set_alignment(CellAlignment::Right),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_shortened() {
        assert_eq!(shorten("abc", 3), "abc");
        assert_eq!(shorten("abcdef", 4), "abc…");
    }
}
