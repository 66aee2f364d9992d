//! Command-line arguments that several commands share: where a command runs and how it prints,
//! durations as people write them, and the token of `jobguard serve`.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::database::DEFAULT_URL;

/// Where a command runs and how it prints.
#[derive(Args, Debug)]
pub struct Target {
    /// postgres://user@host/db, or sqlite:path.db for an embedded database.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    pub database_url: String,
    /// Print JSON on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// How long a command that runs until stopped waits for its database at startup.
#[derive(Args, Debug, Clone, Copy)]
pub struct ConnectWait {
    /// How long to keep trying at startup while the database refuses connections or is still
    /// starting up (a restart, a failover, a deploy that starts this first), with a line on
    /// stderr per try; then exit 1. `0s` fails at once.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
}

/// Parses `30s`, `500ms`, `2m`, `1h 30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    jobguard_core::duration::parse_duration(text)
}

/// The shared secret of `jobguard serve`, which `jobguard stats --url` sends too; its `Debug`
/// hides it.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl Token {
    /// Accepts a token of at least 16 characters, without spaces.
    pub fn parse(text: &str) -> Result<Token, String> {
        if text.chars().count() < 16 || text.chars().any(char::is_whitespace) {
            return Err(
                "use at least 16 characters without spaces, e.g. the output of `openssl rand \
                 -hex 16`"
                    .into(),
            );
        }
        Ok(Token(text.into()))
    }

    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        let error = parse_duration("30").unwrap_err();
        assert!(error.contains("such as 30s"), "{error}");
        assert!(parse_duration("soon").is_err());
    }
}
