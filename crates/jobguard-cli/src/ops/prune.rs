//! `jobguard prune`.

use std::process::ExitCode;

use clap::Args;

/// Arguments of `jobguard prune`.
#[derive(Args, Debug)]
pub struct PruneArgs {}

/// Runs `jobguard prune`.
pub async fn prune(_args: PruneArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`jobguard prune` is not built yet")
}
