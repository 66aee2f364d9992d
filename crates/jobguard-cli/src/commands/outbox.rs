//! `jobguard outbox list` and `jobguard outbox replay`: the messages jobs published.

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{ArgGroup, Args, Subcommand, ValueEnum};
use comfy_table::{Cell, CellAlignment};
use jobguard::Backend;
use jobguard::outbox::{MessageId, MessageRow, MessageState, Outbox, OutboxCounts};
use serde::Serialize;
use sqlx::Pool;

use crate::args::Target;
use crate::database::{Database, is_missing_table, redact};
use crate::on_pool;
use crate::report::{self, shorten, table, time};

#[derive(Subcommand, Debug)]
pub enum OutboxCommand {
    /// Message counts by state, and the newest messages with their last error.
    List(ListArgs),
    /// Deliver dead-lettered messages again, with fresh attempts.
    Replay(ReplayArgs),
}

/// A message state, as given on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum State {
    Pending,
    Sent,
    Dead,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// List only messages in this state.
    #[arg(long, value_enum)]
    state: Option<State>,
    /// How many of the newest messages to list.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    limit: u32,
    #[command(flatten)]
    target: Target,
}

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("which").required(true).args(["id", "all"])))]
pub struct ReplayArgs {
    /// Replay the dead message with this id (`<job key>/<topic>`, as listed).
    #[arg(long)]
    id: Option<String>,
    /// Replay every dead message.
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    target: Target,
}

#[derive(Debug, Serialize)]
struct Listing {
    counts: OutboxCounts,
    messages: Vec<MessageRow>,
}

#[derive(Debug, Serialize)]
struct Replayed {
    replayed: Vec<MessageId>,
}

pub async fn outbox(command: OutboxCommand) -> anyhow::Result<ExitCode> {
    let url = match &command {
        OutboxCommand::List(args) => &args.target.database_url,
        OutboxCommand::Replay(args) => &args.target.database_url,
    };
    on_pool!(Database::connect(url, 2).await?, pool => run(pool, &command).await)
}

async fn run<DB: Backend>(pool: Pool<DB>, command: &OutboxCommand) -> anyhow::Result<ExitCode> {
    let outbox = Outbox::new(pool.clone());
    let code = match command {
        OutboxCommand::List(args) => list(&outbox, args).await,
        OutboxCommand::Replay(args) => replay(&outbox, args).await,
    };
    pool.close().await;
    code
}

fn render(listing: &Listing, database: &str) -> String {
    let counts = &listing.counts;
    let mut out = format!(
        "outbox in {database}: {} pending, {} sent, {} dead\n",
        counts.pending, counts.sent, counts.dead
    );
    if listing.messages.is_empty() {
        return out;
    }
    let mut table = table(&["id", "state", "attempts", "published (UTC)", "last error"]);
    for message in &listing.messages {
        table.add_row(vec![
            Cell::new(message.id.as_str()),
            Cell::new(message.state.as_str()),
            Cell::new(message.attempts).set_alignment(CellAlignment::Right),
            Cell::new(time(message.created_at)),
            Cell::new(shorten(message.last_error.as_deref().unwrap_or(""), 80)),
        ]);
    }
    out += &format!("{table}\n");
    if counts.dead > 0 {
        out += "replay dead messages with `jobguard outbox replay --id ID` or `--all`\n";
    }
    out
}

fn missing(error: jobguard::Error, database: &str) -> anyhow::Error {
    if is_missing_table(&error) {
        anyhow::anyhow!(
            "there is no outbox in {database} yet (table `jobguard_outbox` is missing): check \
             --database-url; jobs create it when they first publish after `Outbox::migrate`"
        )
    } else {
        anyhow::Error::new(error).context(format!("cannot read the outbox in {database}"))
    }
}

async fn list<DB: Backend>(outbox: &Outbox<DB>, args: &ListArgs) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let state = args.state.map(|state| match state {
        State::Pending => MessageState::Pending,
        State::Sent => MessageState::Sent,
        State::Dead => MessageState::Dead,
    });
    let counts = outbox.counts().await.map_err(|e| missing(e, &database))?;
    let messages = outbox
        .list(state, args.limit)
        .await
        .map_err(|e| missing(e, &database))?;
    let listing = Listing { counts, messages };
    report::print(&listing, args.target.json, |listing| {
        render(listing, &database)
    })?;
    Ok(ExitCode::SUCCESS)
}

async fn replay<DB: Backend>(outbox: &Outbox<DB>, args: &ReplayArgs) -> anyhow::Result<ExitCode> {
    let database = redact(&args.target.database_url);
    let id: Option<MessageId> = match args.id.as_deref() {
        Some(id) => Some(id.parse().map_err(|_| {
            anyhow::anyhow!(
                "`{id}` is not a message id: write `<job key>/<topic>` as `jobguard outbox list` \
                 shows it"
            )
        })?),
        None => None,
    };
    let replayed = match outbox.replay_dead(id.as_ref()).await {
        Err(error) if is_missing_table(&error) => return Err(missing(error, &database)),
        result => result.with_context(|| format!("cannot replay dead messages in {database}"))?,
    };
    if let (Some(id), true) = (&id, replayed.is_empty()) {
        bail!("message `{id}` was not replayed: no dead message has that id");
    }
    report::print(
        &Replayed { replayed },
        args.target.json,
        |Replayed { replayed }| {
            if replayed.is_empty() {
                "no dead messages to replay\n".to_owned()
            } else {
                format!(
                    "replayed {} dead message{}; the next relay delivers them, with the same ids\n",
                    replayed.len(),
                    if replayed.len() == 1 { "" } else { "s" }
                )
            }
        },
    )?;
    Ok(ExitCode::SUCCESS)
}
