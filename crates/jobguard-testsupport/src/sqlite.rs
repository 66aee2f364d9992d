//! SQLite files of the tests' own, and their removal with everything the queue keeps beside
//! them.

use std::path::{Path, PathBuf};

/// `<temp>/jobguard-tests/<test>-<process id>.db`: the SQLite file `test` owns in this run.
pub fn path(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join("jobguard-tests");
    std::fs::create_dir_all(&dir).expect("create the tests' temp dir");
    dir.join(format!("{test}-{}.db", std::process::id()))
}

/// Removes a SQLite database: the file, its WAL and shared-memory files, and the folder of
/// lease heartbeats the queue keeps beside it (`<database>-jobguard-leases/`).
pub fn remove(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let _ = std::fs::remove_dir_all(format!("{}-jobguard-leases", path.display()));
}

/// Removes the databases that earlier runs of `test` left in `dir`, once their process has
/// ended: each run names its files after its process id ([`path`]).
pub fn remove_ended_runs(dir: &Path, test: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!("{test}-");
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(&prefix))
            .and_then(|rest| rest.strip_suffix(".db"))
        else {
            continue;
        };
        if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) && !running(pid) {
            remove(&entry.path());
        }
    }
}

/// A fresh SQLite file of `test`'s own: [`path`], with what this and ended runs left there
/// removed. Returns the file and its `sqlite:` URL.
pub fn fresh(test: &str) -> (PathBuf, String) {
    let path = path(test);
    remove(&path);
    remove_ended_runs(path.parent().expect("a folder"), test);
    let url = format!("sqlite:{}", path.display());
    (path, url)
}

/// Whether process `pid` is running; `true` where that cannot be told (no `/proc`).
fn running(pid: &str) -> bool {
    let proc = Path::new("/proc");
    !proc.is_dir() || proc.join(pid).exists()
}
