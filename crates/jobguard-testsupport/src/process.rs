//! Processes of the `jobguard` binary and the examples': started with their output in files of
//! their own, waited for (a line, the exit) with a deadline, sent signals, and killed when
//! dropped so a failing test fails instead of hanging.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `jobguard` binary under test, with no database or log settings inherited from the
/// environment: `built`, the one cargo built (`env!("CARGO_BIN_EXE_jobguard")` in the CLI's
/// tests), or `JOBGUARD_TEST_BIN` when set (checkouts that share one target directory
/// overwrite each other's `debug/jobguard`; a copy of one's own is stable).
pub fn jobguard(built: &str) -> Command {
    let binary = std::env::var_os("JOBGUARD_TEST_BIN").unwrap_or_else(|| built.into());
    let mut command = Command::new(binary);
    command
        .env_remove("DATABASE_URL")
        .env_remove("JOBGUARD_LOG")
        .env_remove("JOBGUARD_PROVIDER_URL")
        .env_remove("JOBGUARD_TOKEN")
        .env_remove("JOBGUARD_BROKER_URL");
    command
}

/// Starts `command` in `dir`, its stdout and stderr going to files named after `name` there.
pub fn spawn(dir: &Path, name: &str, mut command: Command) -> Proc {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let stdout = dir.join(format!("{n:04}-{name}.out"));
    let stderr = dir.join(format!("{n:04}-{name}.err"));
    let args: Vec<String> = command
        .get_args()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let program = command.get_program().to_string_lossy().into_owned();
    let program = program.rsplit('/').next().unwrap_or_default().to_owned();
    let child = command
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start {name}: {error}"));
    Proc {
        child: Some(child),
        name: format!("`{program} {}` ({name})", args.join(" ")),
        stdout,
        stderr,
    }
}

/// A child process, killed with SIGKILL when dropped unless it was waited for.
pub struct Proc {
    child: Option<Child>,
    /// The command line and the name it was started under, for failure messages.
    pub name: String,
    /// The file its stdout goes to.
    pub stdout: PathBuf,
    /// The file its stderr goes to.
    pub stderr: PathBuf,
}

/// How a process ended.
pub struct Exit {
    /// Its exit status.
    pub status: ExitStatus,
    /// Whether it exited with success.
    pub ok: bool,
    /// Everything it printed on stdout.
    pub stdout: String,
    /// Everything it printed on stderr.
    pub stderr: String,
    /// What it printed on stdout, as JSON; `Null` if it was not JSON.
    pub json: Value,
}

impl Exit {
    fn new(status: ExitStatus, stdout: String, stderr: String) -> Exit {
        Exit {
            status,
            ok: status.success(),
            json: serde_json::from_str(&stdout).unwrap_or(Value::Null),
            stdout,
            stderr,
        }
    }
}

impl From<std::process::Output> for Exit {
    fn from(output: std::process::Output) -> Exit {
        Exit::new(
            output.status,
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

impl Proc {
    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the process is still ours")
    }

    /// The process id, as `kill` takes it.
    pub fn pid(&self) -> String {
        self.child
            .as_ref()
            .expect("the process is still ours")
            .id()
            .to_string()
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`, `TERM`) with the `kill` binary.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {} failed", self.name);
    }

    /// SIGKILL, and reaps the process so it is gone when this returns.
    pub fn sigkill(&mut self) -> Exit {
        self.signal("KILL");
        let exit = self.wait(Duration::from_secs(10)).unwrap_or_else(|| {
            panic!("{} survived SIGKILL for 10 s", self.name);
        });
        assert!(!exit.status.success(), "{} exited on its own", self.name);
        exit
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child().try_wait().expect("poll a child").is_none()
    }

    /// What the process printed so far on stdout and stderr.
    pub fn output(&self) -> (String, String) {
        (
            std::fs::read_to_string(&self.stdout).unwrap_or_default(),
            std::fs::read_to_string(&self.stderr).unwrap_or_default(),
        )
    }

    /// Whether a line the process printed on stdout starts with `prefix`.
    pub fn printed(&self, prefix: &str) -> bool {
        self.output().0.lines().any(|line| line.starts_with(prefix))
    }

    /// Waits up to `timeout` for a line on stdout starting with `prefix`; fails the test when
    /// the process ends first or the time runs out.
    pub fn wait_for_line(&mut self, prefix: &str, timeout: Duration) {
        let started = Instant::now();
        while !self.printed(prefix) {
            if let Some(exit) = self.exited() {
                panic!(
                    "{} ended ({}) before printing {prefix}: {}",
                    self.name,
                    exit.status,
                    tail(&exit.stderr)
                );
            }
            assert!(
                started.elapsed() < timeout,
                "{} printed no {prefix} within {timeout:?}: {}",
                self.name,
                tail(&self.output().1)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The exit, if the process has exited.
    pub fn exited(&mut self) -> Option<Exit> {
        let status = self.child.as_mut()?.try_wait().expect("wait for a child")?;
        self.child = None;
        let (stdout, stderr) = self.output();
        Some(Exit::new(status, stdout, stderr))
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still running.
    pub fn wait(&mut self, timeout: Duration) -> Option<Exit> {
        let started = Instant::now();
        self.child();
        loop {
            if let Some(exit) = self.exited() {
                return Some(exit);
            }
            if started.elapsed() >= timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the process to exit, or kills it and fails the test after `timeout`.
    pub fn finish(&mut self, timeout: Duration) -> Exit {
        match self.wait(timeout) {
            Some(exit) => exit,
            None => {
                let (_, stderr) = self.output();
                self.sigkill();
                panic!(
                    "{} did not finish within {timeout:?}; killed it. stderr:\n{}",
                    self.name,
                    tail(&stderr)
                );
            }
        }
    }

    /// Waits for a command that must succeed and print JSON.
    pub fn finish_json(&mut self, timeout: Duration) -> Value {
        let exit = self.finish(timeout);
        assert!(
            exit.status.success(),
            "{} failed ({}): {}",
            self.name,
            exit.status,
            exit.stderr
        );
        let json = exit.json;
        assert_ne!(
            json,
            Value::Null,
            "{} printed no JSON: {}",
            self.name,
            exit.stdout
        );
        json
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            // SIGKILL ends a stopped process too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The last lines of a log, for a failure message.
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
