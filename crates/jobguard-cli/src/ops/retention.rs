//! `jobguard retention`.

use std::process::ExitCode;

use clap::Args;

/// Arguments of `jobguard retention`.
#[derive(Args, Debug)]
pub struct RetentionArgs {}

/// Runs `jobguard retention`.
pub async fn retention(_args: RetentionArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`jobguard retention` is not built yet")
}
