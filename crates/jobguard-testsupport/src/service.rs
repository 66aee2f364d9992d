//! The services the tests need, found from the environment, and the one rule for a service that
//! is not there.

use std::time::Duration;

/// A service the tests run against. Each is found at the URL in its `JOBGUARD_TEST_*`
/// variable (scripts/test and scripts/services set them), else at its default port on
/// 127.0.0.1, and counts as there when something answers at that address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// PostgreSQL: `JOBGUARD_TEST_DATABASE_URL`, an admin URL the tests make schemas with.
    Postgres,
    /// Redis: `JOBGUARD_TEST_REDIS_URL`.
    Redis,
    /// RabbitMQ: `JOBGUARD_TEST_AMQP_URL`.
    Amqp,
    /// NATS with JetStream: `JOBGUARD_TEST_NATS_URL`.
    Nats,
    /// SQS (moto's server in the tests): `JOBGUARD_TEST_SQS_URL`.
    Sqs,
    /// Kafka (tansu in the tests): `JOBGUARD_TEST_KAFKA_URL`.
    Kafka,
}

impl Service {
    /// The variable that holds the service's URL.
    pub fn var(self) -> &'static str {
        match self {
            Service::Postgres => "JOBGUARD_TEST_DATABASE_URL",
            Service::Redis => "JOBGUARD_TEST_REDIS_URL",
            Service::Amqp => "JOBGUARD_TEST_AMQP_URL",
            Service::Nats => "JOBGUARD_TEST_NATS_URL",
            Service::Sqs => "JOBGUARD_TEST_SQS_URL",
            Service::Kafka => "JOBGUARD_TEST_KAFKA_URL",
        }
    }

    /// The URL when the variable is unset or empty.
    pub fn default_url(self) -> &'static str {
        match self {
            Service::Postgres => "postgres://postgres@127.0.0.1:5432/test",
            Service::Redis => "redis://127.0.0.1:6379",
            Service::Amqp => "amqp://127.0.0.1:5672",
            Service::Nats => "nats://127.0.0.1:4222",
            Service::Sqs => "http://127.0.0.1:9324",
            Service::Kafka => "kafka://127.0.0.1:9092",
        }
    }

    /// The port of a URL that names none.
    fn default_port(self) -> u16 {
        match self {
            Service::Postgres => 5432,
            Service::Redis => 6379,
            Service::Amqp => 5672,
            Service::Nats => 4222,
            Service::Sqs => 9324,
            Service::Kafka => 9092,
        }
    }

    /// The service's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Service::Postgres => "PostgreSQL",
            Service::Redis => "Redis",
            Service::Amqp => "RabbitMQ",
            Service::Nats => "NATS",
            Service::Sqs => "SQS",
            Service::Kafka => "Kafka",
        }
    }

    /// The service's URL, from its variable or the default.
    pub fn configured(self) -> String {
        std::env::var(self.var())
            .ok()
            .filter(|url| !url.is_empty())
            .unwrap_or_else(|| self.default_url().to_owned())
    }

    /// The host and port the URL points at.
    fn address(self, url: &str) -> String {
        let host_port = url
            .split_once("://")
            .map_or(url, |(_, rest)| rest)
            .split(['/', '?'])
            .next()
            .unwrap_or_default()
            .rsplit('@')
            .next()
            .unwrap_or_default();
        if host_port.contains(':') {
            host_port.to_owned()
        } else {
            format!("{host_port}:{}", self.default_port())
        }
    }

    /// The service's URL when something answers there, else `None`, without a word: for a
    /// test that has another way to go (a SQLite file when PostgreSQL is not there).
    pub fn answering(self) -> Option<String> {
        let url = self.configured();
        answers(&self.address(&url)).then_some(url)
    }

    /// The service's URL when something answers there; otherwise the test does not run:
    /// [`skip`] says so and returns `None`, or, with `CI=true`, fails the test.
    pub fn url(self) -> Option<String> {
        if let Some(url) = self.answering() {
            return Some(url);
        }
        let url = self.configured();
        skip(
            &format!(
                "no {} answers at {} ({})",
                self.name(),
                self.address(&url),
                self.var()
            ),
            &format!("start it or set {}, or run scripts/test", self.var()),
        )
    }
}

/// Whether something accepts a TCP connection at `address` within two seconds.
fn answers(address: &str) -> bool {
    std::net::ToSocketAddrs::to_socket_addrs(address)
        .ok()
        .and_then(|mut addresses| addresses.next())
        .is_some_and(|address| {
            std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2)).is_ok()
        })
}

/// Whether the tests run on CI (`CI=true`), where a missing service is a failure, not a skip.
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci == "true")
}

/// The one rule for a test whose service is missing: with `CI=true` the test fails; otherwise
/// it says `SKIPPED` where the developer sees it and returns `None`, for the test to return.
/// `why` says what is missing, `fix` how to run the test.
pub fn skip<T>(why: &str, fix: &str) -> Option<T> {
    if on_ci() {
        panic!("CI=true but {why}: run the tests with scripts/test");
    }
    // Straight to the process's stderr: `eprintln!` is captured by the test harness and
    // shown only for failing tests, so a skip would pass unseen.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "SKIPPED {}: {why}, so it did not run ({fix}; with CI=true it fails instead)\n",
            std::thread::current().name().unwrap_or("a test")
        )
        .as_bytes(),
    );
    None
}

#[cfg(test)]
mod tests {
    use super::Service;

    #[test]
    fn the_address_is_the_host_and_port_of_the_url() {
        let cases = [
            (
                Service::Postgres,
                "postgres://postgres@127.0.0.1:5433/test",
                "127.0.0.1:5433",
            ),
            (
                Service::Postgres,
                "postgres://u:p@db?sslmode=disable",
                "db:5432",
            ),
            (
                Service::Amqp,
                "amqp://guest:guest@localhost/%2f",
                "localhost:5672",
            ),
            (Service::Sqs, "http://127.0.0.1:9324", "127.0.0.1:9324"),
            (Service::Kafka, "kafka://broker", "broker:9092"),
        ];
        for (service, url, address) in cases {
            assert_eq!(service.address(url), address, "{url}");
        }
    }
}
