//! `jobguard steps list` and `jobguard steps resolve`: external steps that need attention.

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{ArgGroup, Args, Subcommand};
use comfy_table::Cell;
use jobguard::steps::{AttentionStep, Resolution, StepConfig, Steps};
use jobguard::{Backend, JobKey, TableName};
use serde::Serialize;
use sqlx::Pool;

use crate::args::Target;
use crate::database::{Database, redact};
use crate::on_pool;
use crate::report::{self, table};

#[derive(Subcommand, Debug)]
pub enum StepsCommand {
    /// Steps whose caller vanished and whose reconciler could not tell whether they happened.
    List(ListArgs),
    /// Settle a step after checking the external system: it happened (with its result), or not.
    Resolve(ResolveArgs),
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// How many steps to list, oldest first.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    limit: u32,
    /// The step ledger's table.
    #[arg(long, default_value = "jobguard_steps")]
    table: String,
    #[command(flatten)]
    target: Target,
}

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("resolution").required(true).args(["done", "not_done"])))]
pub struct ResolveArgs {
    /// The job key, e.g. `charge-keyless:order-7`.
    key: String,
    /// The step name, e.g. `charge`.
    step: String,
    /// It happened; this JSON is the result later deliveries get (e.g. the charge).
    #[arg(long, value_name = "JSON")]
    done: Option<String>,
    /// It did not happen; the next delivery calls.
    #[arg(long)]
    not_done: bool,
    /// The step ledger's table.
    #[arg(long, default_value = "jobguard_steps")]
    table: String,
    #[command(flatten)]
    target: Target,
}

#[derive(Debug, Serialize)]
struct Resolved {
    key: String,
    step: String,
    resolved: bool,
}

pub async fn steps(command: StepsCommand) -> anyhow::Result<ExitCode> {
    let (url, table) = match &command {
        StepsCommand::List(args) => (&args.target.database_url, &args.table),
        StepsCommand::Resolve(args) => (&args.target.database_url, &args.table),
    };
    let table = TableName::new(table)?;
    on_pool!(Database::connect(url, 2).await?, pool => run(pool, table, &command).await)
}

async fn run<DB: Backend>(
    pool: Pool<DB>,
    table: TableName,
    command: &StepsCommand,
) -> anyhow::Result<ExitCode> {
    let steps = Steps::with_config(pool.clone(), StepConfig::default().table(table));
    let code = match command {
        StepsCommand::List(args) => list(&steps, args).await,
        StepsCommand::Resolve(args) => resolve(&steps, args).await,
    };
    pool.close().await;
    code
}

async fn list<DB: Backend>(steps: &Steps<DB>, args: &ListArgs) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let marked: Vec<AttentionStep> = steps
        .attention(args.limit)
        .await
        .with_context(|| format!("cannot read the step ledger `{}` in {database}", args.table))?;
    #[derive(Serialize)]
    struct Row<'a> {
        key: &'a str,
        step: &'a str,
        reason: &'a str,
    }
    let rows: Vec<Row<'_>> = marked
        .iter()
        .map(|s| Row {
            key: &s.key,
            step: &s.step,
            reason: &s.reason,
        })
        .collect();
    report::print(&rows, args.target.json, |_| render(&marked))?;
    Ok(ExitCode::SUCCESS)
}

fn render(marked: &[AttentionStep]) -> String {
    if marked.is_empty() {
        return "no steps need attention\n".to_owned();
    }
    let mut table = table(&["key", "step", "why"]);
    for step in marked {
        table.add_row(vec![
            Cell::new(&step.key),
            Cell::new(&step.step),
            Cell::new(&step.reason),
        ]);
    }
    format!(
        "{} step{} need attention: each may or may not have taken effect, and is not called \
         again until resolved\n{table}\ncheck the external system, then `jobguard steps resolve \
         KEY STEP --done JSON` or `--not-done`\n",
        marked.len(),
        if marked.len() == 1 { "" } else { "s" }
    )
}

async fn resolve<DB: Backend>(steps: &Steps<DB>, args: &ResolveArgs) -> anyhow::Result<ExitCode> {
    let key = JobKey::parse(&args.key)?;
    let resolution = match &args.done {
        Some(json) => Resolution::Done(
            serde_json::from_str(json).context("--done takes the step's result as JSON")?,
        ),
        None => Resolution::NotDone,
    };
    let resolved = steps.resolve(&key, &args.step, resolution).await?;
    if !resolved {
        bail!(
            "step `{}` of `{}` does not need attention: nothing was changed (see `jobguard steps \
             list`)",
            args.step,
            args.key
        );
    }
    let report = Resolved {
        key: args.key.clone(),
        step: args.step.clone(),
        resolved,
    };
    report::print(&report, args.target.json, |_| {
        if args.not_done {
            format!(
                "resolved: the next delivery of `{}` calls again\n",
                args.key
            )
        } else {
            format!(
                "resolved: deliveries of `{}` return the recorded result\n",
                args.key
            )
        }
    })?;
    Ok(ExitCode::SUCCESS)
}
