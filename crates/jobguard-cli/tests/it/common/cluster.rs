//! A throwaway PostgreSQL cluster of a test's own, made with `initdb` on a free port, which the
//! test may crash and restart; stopped and deleted when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use jobguard_testsupport::{free_port, skip, tail};

/// A throwaway PostgreSQL cluster of the test's own, stopped and deleted when dropped (also
/// when the test panics).
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// Where the server's log is copied before the cluster is deleted.
    keep_log: PathBuf,
}

impl Cluster {
    /// The newest PostgreSQL's server programs: on PATH, or in Debian's
    /// `/usr/lib/postgresql/<version>/bin`.
    fn bin_dir() -> Option<PathBuf> {
        let on_path = std::env::var_os("PATH").into_iter().flat_map(|path| {
            std::env::split_paths(&path)
                .filter(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
                .collect::<Vec<_>>()
        });
        let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let version = entry.file_name().to_str()?.parse().ok()?;
                let bin = entry.path().join("bin");
                (bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
                    .then_some((version, bin))
            })
            .collect();
        debian.sort();
        on_path
            .chain(debian.into_iter().rev().map(|(_, bin)| bin))
            .next()
    }

    fn is_root() -> bool {
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
    }

    /// Runs a server program as the cluster's owner: initdb and the server refuse to run as
    /// root, so root hands them to the `postgres` user.
    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        let mut command = if Cluster::is_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        command.current_dir(&self.dir).stdin(Stdio::null());
        command
    }

    fn as_owner(&self, program: &str, args: &[&str]) -> std::process::Output {
        self.command(program)
            .args(args)
            .output()
            .unwrap_or_else(|error| panic!("cannot run {program}: {error}"))
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self.as_owner(program, args);
        assert!(
            out.status.success(),
            "{program} {} failed ({}):\n{}\n{}\nserver log:\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            tail(&std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default())
        );
    }

    /// Creates and starts a cluster on a free port; `None` (after a loud line) when the
    /// server programs are missing outside CI.
    pub fn start(scratch: &Path) -> Option<Cluster> {
        let Some(bin) = Cluster::bin_dir() else {
            return skip(
                "PostgreSQL's initdb and pg_ctl were not found (on PATH or in \
                 /usr/lib/postgresql/*/bin)",
                "install the postgresql package",
            );
        };
        // The `postgres` user must reach it when root hands the cluster over: a TMPDIR under
        // /root would not do.
        let tmp = if Cluster::is_root() {
            PathBuf::from("/tmp")
        } else {
            std::env::temp_dir()
        };
        let dir = tmp.join(format!("jobguard-chaos-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Free now; the server takes it a moment later.
        let port = free_port();
        let cluster = Cluster {
            bin,
            dir,
            port,
            keep_log: scratch.join("server.log"),
        };
        if Cluster::is_root() {
            let status = Command::new("chown")
                .args(["postgres:", cluster.dir.to_str().unwrap()])
                .status()
                .expect("run chown");
            assert!(
                status.success(),
                "cannot give {:?} to postgres",
                cluster.dir
            );
        }
        cluster.run(
            "initdb",
            &["-D", "data", "-U", "postgres", "-A", "trust", "--no-sync"],
        );
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={dir} \
             -c max_connections=200 -c fsync=off",
            dir = cluster.dir.display()
        );
        cluster.run(
            "pg_ctl",
            &[
                "start",
                "-D",
                "data",
                "-l",
                "server.log",
                "-w",
                "-t",
                "60",
                "-o",
                &options,
            ],
        );
        Some(cluster)
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts a crash and recovery: every backend is killed without a checkpoint, and the
    /// server replays its WAL on start. The returned `pg_ctl` exits once the server accepts
    /// connections again; the workers and the test's enqueues go on meanwhile.
    pub fn begin_restart_immediate(&self) -> Child {
        let mut command = self.command("pg_ctl");
        command
            .args(["restart", "-D", "data", "-m", "immediate"])
            .args(["-l", "server.log", "-w", "-t", "60"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command.spawn().expect("run pg_ctl restart")
    }

    /// Waits for a restart begun with [`Cluster::begin_restart_immediate`].
    pub fn end_restart(&self, mut pg_ctl: Child) {
        let status = pg_ctl.wait().expect("wait for pg_ctl restart");
        assert!(
            status.success(),
            "pg_ctl restart -m immediate failed ({status}); server log:\n{}",
            tail(&std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default())
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::copy(self.dir.join("server.log"), &self.keep_log);
        let stopped = self.as_owner("pg_ctl", &["stop", "-D", "data", "-m", "immediate", "-w"]);
        if !stopped.status.success() {
            // The postmaster we started, by the pid it wrote.
            if let Some(pid) = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
                .ok()
                .and_then(|text| text.lines().next().map(str::to_owned))
            {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
