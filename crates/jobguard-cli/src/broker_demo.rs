//! `jobguard demo --broker NAME`: the seed's experiment through a real broker.

use std::process::ExitCode;

use clap::ValueEnum;
use serde::Serialize;

use crate::experiment::Shape;

/// A broker the demo runs through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Broker {
    /// RabbitMQ on amqp://127.0.0.1:5672.
    Rabbitmq,
    /// NATS JetStream on nats://127.0.0.1:4222.
    Nats,
    /// Redis Streams on redis://127.0.0.1:6379.
    Redis,
}

/// Runs the demo through `broker`.
pub async fn run(
    broker: Broker,
    _database_url: &str,
    _shape: Shape,
    _json: bool,
) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`jobguard demo --broker {broker:?}` is not built yet")
}
