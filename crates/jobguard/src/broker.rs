//! Consumers for the brokers users already run, and outbox sinks for them.
