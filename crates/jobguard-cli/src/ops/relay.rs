//! `jobguard relay`: delivers the outbox's messages.

use clap::Args;

/// Arguments of `jobguard relay`.
#[derive(Args, Debug)]
pub struct RelayArgs {}

/// Runs the relay until Ctrl-C.
pub async fn relay(_args: RelayArgs) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("the relay is not wired yet")
}
