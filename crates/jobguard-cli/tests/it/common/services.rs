//! The services the tests need, found from the environment: a missing one skips its test with
//! a loud `SKIPPED` line, or fails it when `CI=true`.

use std::time::Duration;

/// Whether this is a CI run, where a missing service fails the test instead of skipping it.
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci == "true")
}

/// Says that the running test did not run, where the developer sees it.
fn skipped(why: &str) {
    // Straight to the process's stderr: `eprintln!` is captured by the test harness and shown
    // only for failing tests, so a skip would pass unseen.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "SKIPPED {}: {why}\n",
            std::thread::current().name().unwrap_or("a test")
        )
        .as_bytes(),
    );
}

/// The PostgreSQL admin URL from `JOBGUARD_TEST_DATABASE_URL`; `None` (skip) when it is
/// unset, or a failed test on CI.
pub fn postgres_url() -> Option<String> {
    match std::env::var("JOBGUARD_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if is_ci() => {
            panic!(
                "CI=true but JOBGUARD_TEST_DATABASE_URL is unset: run the tests with scripts/test"
            )
        }
        _ => {
            skipped(
                "JOBGUARD_TEST_DATABASE_URL is unset, so this PostgreSQL test did not run (set \
                 it, e.g. to postgres://postgres@127.0.0.1:5432/test, or run scripts/test; with \
                 CI=true it fails instead)",
            );
            None
        }
    }
}

/// The URL in `var`, or `default`, when something answers at its address; `None` (skip)
/// otherwise, or a failed test on CI. `what` names the service in the messages.
pub fn service_url(var: &str, default: &str, what: &str) -> Option<String> {
    let url = std::env::var(var)
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| default.to_owned());
    let address = url
        .split_once("://")
        .map_or(url.as_str(), |(_, rest)| rest)
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let answers = std::net::ToSocketAddrs::to_socket_addrs(&address)
        .ok()
        .and_then(|mut addresses| addresses.next())
        .is_some_and(|address| {
            std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2)).is_ok()
        });
    if answers {
        return Some(url);
    }
    if is_ci() {
        panic!("CI=true but nothing answers at {address} ({var}): run the tests with scripts/test");
    }
    skipped(&format!(
        "nothing answers at {address}, so this {what} test did not run (start the {what} or set \
         {var}; with CI=true it fails instead)"
    ));
    None
}
