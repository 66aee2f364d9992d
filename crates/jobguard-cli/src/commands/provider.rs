//! `jobguard provider`: the payment provider of the charge jobs, on its own, until Ctrl-C.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use jobguard_provider::{Provider, ProviderConfig};

use crate::args::parse_duration;

#[derive(Args, Debug)]
pub struct ProviderArgs {
    /// The port to listen on, on 127.0.0.1; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// How long each charge takes, during which a second request with its idempotency key is
    /// answered 409.
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    latency: Duration,
    /// How long an idempotency key is remembered after its charge (Stripe: 24h); a request
    /// with a forgotten key charges again. Keys are remembered forever when absent.
    #[arg(long, value_parser = parse_duration)]
    key_ttl: Option<Duration>,
}

/// Serves the provider; the first line printed is its URL.
pub async fn provider(args: ProviderArgs) -> anyhow::Result<ExitCode> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{}", args.port))?;
    let url = format!("http://{}", listener.local_addr()?);
    println!("{url}");
    eprintln!(
        "payment provider listening; point workers at it with {}={url}; Ctrl-C stops it",
        crate::builtin_jobs::charges::PROVIDER_URL_ENV
    );
    let provider = Provider::new(ProviderConfig {
        latency: args.latency,
        key_ttl: args.key_ttl,
        ..ProviderConfig::default()
    });
    provider
        .serve(listener, jobguard::worker::shutdown_signal())
        .await
        .context("the provider stopped")?;
    Ok(ExitCode::SUCCESS)
}
