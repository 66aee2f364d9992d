//! Heartbeats of SQLite leases, kept beside the database file rather than in it.
//!
//! A heartbeat written to the database needs SQLite's one write lock. A job waiting for that
//! lock (behind the jobs of its own process, or behind a process that keeps the lock for a run
//! of transactions, handing it from one of its jobs to the next) could then not extend its
//! lease, and another process's rescue, which got the lock first, would take the job from a
//! worker that is alive and only waiting. A job that waits for the lock is not a job whose
//! worker died.
//!
//! So on SQLite a heartbeat is a small file in `<database>-jobguard-leases/`, named after the
//! lease (table, job id, fencing token) and holding when the lease ends, in microseconds since
//! the Unix epoch by the system clock, the clock SQLite's own time functions read on this
//! host. Writing it takes no database lock. Rescue reads the files under the write lock and
//! leaves running the jobs whose file says their lease still holds; a worker that dies or
//! freezes stops writing, and its jobs are rescued once both its lease in the table and its
//! file have expired. The files of a job are removed when it ends, and stale ones by rescue.

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::SqlitePool;

use crate::store::queue::Lease;
use crate::table::TableName;

/// How long after its lease ended a heartbeat file is removed by rescue: long enough that a
/// worker that froze and resumed is not told its lease holds by a file it is rewriting.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// The heartbeat files of one queue table.
pub(crate) struct Heartbeats {
    dir: PathBuf,
    prefix: String,
}

impl Heartbeats {
    /// The heartbeats of `table` in the database `pool` opens; `None` for an in-memory
    /// database, which has no file to keep them beside (and no other process to rescue).
    pub(crate) fn of(pool: &SqlitePool, table: &TableName) -> Option<Heartbeats> {
        let options = pool.connect_options();
        let file = options.get_filename().as_os_str();
        if file.is_empty() || file == ":memory:" {
            return None;
        }
        let mut dir = file.to_owned();
        dir.push("-jobguard-leases");
        Some(Heartbeats {
            dir: dir.into(),
            prefix: format!("{}.", table.name()),
        })
    }

    fn path(&self, lease: Lease) -> PathBuf {
        self.dir
            .join(format!("{}{}.{}", self.prefix, lease.job_id, lease.token))
    }

    /// Records that `lease` holds until `until`. The file is replaced whole (written aside,
    /// then renamed), so a reader sees the old time or the new one.
    pub(crate) fn beat(&self, lease: Lease, until: SystemTime) -> io::Result<()> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(lease);
        let aside = self.dir.join(format!(
            ".{}{}.{}.{}.tmp",
            self.prefix,
            lease.job_id,
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let mut file = std::fs::File::create(&aside)?;
        file.write_all(micros(until).to_string().as_bytes())?;
        drop(file);
        std::fs::rename(&aside, &path).inspect_err(|_| {
            let _ = std::fs::remove_file(&aside);
        })
    }

    /// Removes the heartbeat of a lease that ended.
    pub(crate) fn forget(&self, lease: Lease) {
        let _ = std::fs::remove_file(self.path(lease));
    }

    /// The leases whose heartbeat says they hold at `now`, as `job_id:token`; removes the
    /// files of leases that ended long ago.
    pub(crate) fn holding(&self, now: SystemTime) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let now = micros(now);
        let stale = now.saturating_sub(STALE_AFTER.as_micros() as i64);
        let mut holding = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(lease) = name
                .to_str()
                .and_then(|name| name.strip_prefix(&self.prefix))
            else {
                continue;
            };
            let Some((id, token)) = lease.split_once('.') else {
                continue;
            };
            if id.parse::<i64>().is_err() || token.parse::<i64>().is_err() {
                continue;
            }
            match read_until(&entry.path()) {
                Some(until) if until >= now => holding.push(format!("{id}:{token}")),
                Some(until) if until < stale => {
                    let _ = std::fs::remove_file(entry.path());
                }
                _ => {}
            }
        }
        holding
    }
}

fn read_until(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn micros(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
    })
}
