//! `jobguard consume`.

use std::process::ExitCode;

use clap::Args;

/// Arguments of `jobguard consume`.
#[derive(Args, Debug)]
pub struct ConsumeArgs {}

/// Runs `jobguard consume`.
pub async fn consume(_args: ConsumeArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`jobguard consume` is not built yet")
}
