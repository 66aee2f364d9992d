//! The services the tests need, found from the environment: a `JOBGUARD_TEST_*` URL, or the
//! service's default port on 127.0.0.1. A missing service skips its tests with a `SKIPPED`
//! line, and fails them with `CI=true`.

use std::time::Duration;

/// Whether the tests run on CI, where a missing service is a failure, not a skip.
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci == "true")
}

/// A missing service: a panic on CI, else a `SKIPPED` line on the process's stderr and `None`.
/// `why` says what is missing, `what` which tests did not run, `fix` how to run them.
pub fn missing<T>(why: &str, what: &str, fix: &str) -> Option<T> {
    if on_ci() {
        panic!("CI=true but {why}: run the tests with scripts/test");
    }
    // Straight to the process's stderr: `eprintln!` is captured by the test harness and
    // shown only for failing tests, so a skip would pass unseen.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!(
            "SKIPPED {}: {why}, so this {what} did not run ({fix}; with CI=true it fails \
             instead)\n",
            std::thread::current().name().unwrap_or("a test")
        )
        .as_bytes(),
    );
    None
}

/// The URL in `var`, else `default`, when something answers there; `None` (skip) otherwise,
/// or a failed test with `CI=true`.
pub fn reachable(var: &str, default: &str, port: u16) -> Option<String> {
    let url = std::env::var(var)
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| default.to_owned());
    let host_port = url
        .split_once("://")
        .map_or(url.as_str(), |(_, rest)| rest)
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let address = if host_port.contains(':') {
        host_port
    } else {
        format!("{host_port}:{port}")
    };
    let answers = std::net::ToSocketAddrs::to_socket_addrs(&address)
        .ok()
        .and_then(|mut addresses| addresses.next())
        .is_some_and(|address| {
            std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2)).is_ok()
        });
    if answers {
        return Some(url);
    }
    missing(
        &format!("nothing answers at {address} ({var})"),
        "broker test",
        &format!("start the broker or set {var}"),
    )
}
