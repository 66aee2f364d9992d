//! A worker whose database is not there: started before it is reachable, it waits up to
//! `--connect-timeout` with a line per try and then exits 1 naming the database, or runs the
//! queue once the database comes up; a one-shot command fails at once.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{COMMAND_TIMEOUT, enqueue_credit, ledger};
use crate::common::{Db, Proc, free_port, jobguard, spawn};

/// Starts `jobguard ARGS --database-url URL` in `dir`, logging at `info`.
fn spawn_at(dir: &Path, url: &str, name: &str, args: &[&str]) -> Proc {
    let mut command = jobguard();
    command
        .args(args)
        .args(["--database-url", url])
        .env("JOBGUARD_LOG", "info")
        .env("NO_COLOR", "1");
    spawn(dir, name, command)
}

/// A worker that cannot reach its database retries with a line per try, then exits 1 after
/// `--connect-timeout` with a message naming the database, its password hidden; SIGTERM while it
/// waits stops it cleanly; a one-shot command fails at once instead.
#[test]
fn worker_gives_up_on_an_unreachable_database() {
    let dir = Db::scratch("faults::unreachable");
    let url = format!(
        "postgres://jobguard:hunter2@127.0.0.1:{}/jobguard",
        free_port()
    );
    let shown = url.replace("hunter2", "***");

    let started = Instant::now();
    let exit = spawn_at(
        &dir,
        &url,
        "worker",
        &["worker", "--until-idle", "--connect-timeout", "2s"],
    )
    .finish(COMMAND_TIMEOUT);
    let took = started.elapsed();
    assert_eq!(exit.status.code(), Some(1), "{}", exit.stderr);
    assert!(took >= Duration::from_secs(2), "gave up after {took:?}");
    let tries = exit.stderr.matches("is not reachable yet").count();
    assert!(tries >= 2, "a line per try: {}", exit.stderr);
    assert!(
        exit.stderr.contains(&format!(
            "error: gave up waiting for the database at {shown} after 2s (--connect-timeout)"
        )),
        "{}",
        exit.stderr
    );
    assert!(
        exit.stderr.contains("Connection refused"),
        "{}",
        exit.stderr
    );
    assert!(!exit.stderr.contains("hunter2"), "{}", exit.stderr);

    let mut waiting = spawn_at(
        &dir,
        &url,
        "worker",
        &["worker", "--json", "--connect-timeout", "60s"],
    );
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    while !waiting.output().1.contains("is not reachable yet") {
        assert!(
            waiting.running(),
            "the worker exited: {}",
            waiting.output().1
        );
        assert!(Instant::now() < deadline, "the worker never retried");
        std::thread::sleep(Duration::from_millis(20));
    }
    waiting.signal("TERM");
    let stopped = waiting.finish(Duration::from_secs(10));
    assert!(stopped.ok, "{}: {}", stopped.status, stopped.stderr);
    assert!(
        stopped.stderr.contains("stopped while starting"),
        "{}",
        stopped.stderr
    );

    let jobs = spawn_at(&dir, &url, "jobs", &["jobs"]).finish(COMMAND_TIMEOUT);
    assert_eq!(jobs.status.code(), Some(1), "{}", jobs.stderr);
    assert!(
        !jobs.stderr.contains("not reachable yet")
            && jobs
                .stderr
                .contains(&format!("cannot connect to PostgreSQL at {shown}")),
        "{}",
        jobs.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Forwards every connection to `listener` to `upstream`, in threads of its own, for the rest
/// of the test process.
fn forward(listener: TcpListener, upstream: String) {
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
}

/// A worker started before its database accepts connections waits for it, then runs the queue:
/// the database is reached through a port that starts forwarding to PostgreSQL only once the
/// worker has retried.
#[test]
fn worker_waits_for_a_database_that_comes_up_late() {
    let Some(db) = Db::postgres("faults::late") else {
        return;
    };
    enqueue_credit(&db, &json!({"order": "late", "account": 1, "amount": 100}));
    // The URL with its host and port swapped for a port where nothing listens yet.
    let (scheme, rest) = db.url.split_once("://").unwrap();
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let (user, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    let upstream = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    };
    let port = free_port();
    let late = format!("{scheme}://{user}127.0.0.1:{port}{path}");

    let mut worker = spawn_at(
        &db.dir,
        &late,
        "worker",
        &[
            "worker",
            "--until-idle",
            "--json",
            "--connect-timeout",
            "60s",
        ],
    );
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    while !worker.output().1.contains("is not reachable yet") {
        assert!(worker.running(), "the worker exited: {}", worker.output().1);
        assert!(Instant::now() < deadline, "the worker never retried");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A few tries later, the database comes up.
    std::thread::sleep(Duration::from_secs(1));
    forward(
        TcpListener::bind(("127.0.0.1", port)).expect("the port is still free"),
        upstream,
    );

    let report = worker.finish_json(COMMAND_TIMEOUT);
    assert_eq!(report["applied"], 1, "{report}");
    assert_eq!(ledger(&db).0, 1);
}
