//! `jobguard stats`: the figures of `jobguard serve`'s dashboard, in the terminal.
//!
//! The database's figures (queue backlog, dead letters, steps needing attention, the guard's
//! memory horizon) are read from the database itself. Outcome counts per kind exist only in the
//! process that ran the jobs: `--url` reads everything, those included, from a running
//! `jobguard serve --worker`.

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use comfy_table::{Cell, CellAlignment};
use jobguard::Backend;
use sqlx::Pool;

use crate::args::{Target, Token};
use crate::database::{Database, redact};
use crate::figures::{Figures, GuardFigures, Tables};
use crate::on_pool;
use crate::report::{self, shorten, table, time};

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Read the figures from a running `jobguard serve` at this URL (e.g.
    /// http://127.0.0.1:9464), with the outcomes its worker counted, instead of the database.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// The token of that `jobguard serve`, needed when it listens on a non-loopback address.
    #[arg(long, env = "JOBGUARD_TOKEN", hide_env_values = true, value_parser = Token::parse)]
    token: Option<Token>,
    #[command(flatten)]
    target: Target,
}

pub async fn stats(args: StatsArgs) -> anyhow::Result<ExitCode> {
    let figures = match &args.url {
        Some(url) => from_serve(url, args.token.as_ref()).await?,
        None => {
            let database = redact(&args.target.database_url);
            on_pool!(Database::connect(&args.target.database_url, 2).await?, pool => read(pool, &database).await?)
        }
    };
    report::print(&figures, args.target.json, render)?;
    Ok(ExitCode::SUCCESS)
}

async fn read<DB: Backend>(pool: Pool<DB>, database: &str) -> anyhow::Result<Figures> {
    let figures = Tables::new(pool.clone()).read(database).await;
    pool.close().await;
    figures
}

async fn from_serve(url: &str, token: Option<&Token>) -> anyhow::Result<Figures> {
    let endpoint = format!("{}/api/stats", url.trim_end_matches('/'));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let mut request = client.get(&endpoint);
    if let Some(token) = token {
        request = request.bearer_auth(token.secret());
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("cannot reach jobguard serve at {endpoint}"))?;
    let status = response.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        bail!(
            "jobguard serve at {url} refused the request: it needs its token (--token or \
             JOBGUARD_TOKEN)"
        );
    }
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        bail!(
            "jobguard serve at {endpoint} answered {status}: {}",
            body.trim()
        );
    }
    response
        .json()
        .await
        .with_context(|| format!("{endpoint} did not answer with jobguard serve's figures"))
}

/// The figures as text, in the order of the dashboard.
pub fn render(figures: &Figures) -> String {
    let mut out = format!(
        "jobguard stats: {} ({}), read at {}\n\n",
        figures.database,
        figures.backend,
        time(UNIX_EPOCH + Duration::from_millis(figures.sampled_at))
    );
    match &figures.outcomes {
        Some(outcomes) if !outcomes.totals.is_empty() => {
            let mut table = table(&["kind", "applied", "duplicates", "duplicate spike"]);
            for (kind, totals) in &outcomes.totals {
                table.add_row(vec![
                    Cell::new(kind),
                    Cell::new(totals.applied).set_alignment(CellAlignment::Right),
                    Cell::new(totals.duplicates).set_alignment(CellAlignment::Right),
                    Cell::new(if totals.spike { "SPIKE" } else { "no" }),
                ]);
            }
            out += &format!("outcomes counted by this server's worker:\n{table}\n");
        }
        Some(outcomes) if outcomes.worker => {
            out += "outcomes: none counted yet by this server's worker\n";
        }
        Some(_) => {
            out += "outcomes: this server runs no worker (start it with --worker to count them)\n";
        }
        None => {
            out += "outcomes: counted only by the process that runs the jobs; use --url to read \
                    them from a running `jobguard serve --worker`\n";
        }
    }
    out.push('\n');
    match &figures.queue {
        Some(queue) => {
            out += &format!(
                "jobs: {} available, {} running, {} completed, {} dead{}\n",
                queue.available,
                queue.running,
                queue.completed,
                queue.dead,
                if queue.estimated {
                    " (finished jobs estimated: over 100,000 of a state)"
                } else {
                    ""
                }
            );
            if queue.backlog.is_empty() {
                out += "no job is waiting for a worker\n";
            } else {
                let mut table = table(&["queue", "ready", "oldest waiting"]);
                for backlog in &queue.backlog {
                    table.add_row(vec![
                        Cell::new(&backlog.queue),
                        Cell::new(backlog.ready).set_alignment(CellAlignment::Right),
                        Cell::new(age(backlog.oldest_wait)).set_alignment(CellAlignment::Right),
                    ]);
                }
                out += &format!("{table}\n");
            }
        }
        None => out += "jobs: there is no job queue in this database yet\n",
    }
    out.push('\n');
    let dead = figures.queue.as_ref().map_or(0, |queue| queue.dead);
    if figures.dead_letters.is_empty() {
        out += "dead letters: none\n";
    } else {
        let mut table = table(&["id", "kind", "key", "attempts", "error"]);
        for job in &figures.dead_letters {
            let mut row =
                report::dead_job_cells(job.id, &job.kind, &job.key, job.attempt, job.max_attempts);
            row.push(Cell::new(shorten(job.error.as_deref().unwrap_or(""), 60)));
            table.add_row(row);
        }
        out += &format!(
            "dead letters: {dead} (newest first; replay with `jobguard dead replay --id ID`)\n\
             {table}\n"
        );
    }
    out.push('\n');
    match &figures.steps {
        Some(steps) if steps.attention > 0 => {
            let mut table = table(&["key", "step", "reason"]);
            for step in &steps.steps {
                table.add_row(vec![
                    Cell::new(&step.key),
                    Cell::new(&step.step),
                    Cell::new(shorten(&step.reason, 60)),
                ]);
            }
            out += &format!(
                "external steps needing attention: {} (settle with `jobguard steps resolve`)\n\
                 {table}\n",
                steps.attention
            );
        }
        Some(_) => out += "external steps needing attention: none\n",
        None => out += "external steps needing attention: there is no step ledger\n",
    }
    match &figures.guard {
        Some(GuardFigures {
            table,
            oldest_age: Some(seconds),
        }) => {
            out += &format!(
                "guard memory horizon: the oldest key in `{table}` was applied {} ago\n",
                age(*seconds)
            );
        }
        Some(GuardFigures { table, .. }) => {
            out += &format!("guard memory horizon: `{table}` holds no key yet\n");
        }
        None => out += "guard memory horizon: there is no guard table yet\n",
    }
    out
}

/// Seconds as people read them: `250ms`, `42s`, `3d 4h`.
fn age(seconds: f64) -> String {
    let duration = Duration::from_secs_f64(seconds.max(0.0));
    if duration < Duration::from_secs(1) {
        return format!("{}ms", duration.as_millis());
    }
    let rounded = Duration::from_secs(duration.as_secs());
    humantime::format_duration(rounded).to_string()
}

#[cfg(test)]
mod tests {
    use super::age;

    #[test]
    fn ages_read_as_people_write_them() {
        assert_eq!(age(0.25), "250ms");
        assert_eq!(age(42.7), "42s");
        assert_eq!(age(90_061.0), "1day 1h 1m 1s");
    }
}
