//! The harness itself: what it promises every test about its database.

use std::path::Path;

use jobguard_testsupport::sqlite;
use sqlx::Sqlite;

use crate::common::TestDb;

/// Beyond any process id Linux hands out (`pid_max` is at most 2^22), so never running.
const ENDED_PID: u32 = 4_194_305;

fn touch(path: &Path) {
    std::fs::write(path, b"").expect("write a file");
}

/// A SQLite test's database goes with everything the queue keeps beside it, the lease
/// heartbeats in `<database>-jobguard-leases/` included, and so do the databases of runs
/// that have ended.
#[tokio::test]
async fn sqlite_databases_are_removed_with_their_lease_folders() {
    let test = "harness_leases";
    let path = sqlite::path(test);
    let leases = format!("{}-jobguard-leases", path.display());
    std::fs::create_dir_all(&leases).unwrap();
    touch(&Path::new(&leases).join("1"));
    touch(&path);
    let ended = path.with_file_name(format!("{test}-{ENDED_PID}.db"));
    let ended_leases = format!("{}-jobguard-leases", ended.display());
    std::fs::create_dir_all(&ended_leases).unwrap();
    touch(&Path::new(&ended_leases).join("1"));
    touch(&ended);
    touch(Path::new(&format!("{}-wal", ended.display())));

    let pool = Sqlite::open(test, 1).await.expect("SQLite is always there");
    pool.close().await;

    assert!(!Path::new(&leases).exists(), "{leases} was left behind");
    assert!(!ended.exists(), "{} was left behind", ended.display());
    assert!(
        !Path::new(&ended_leases).exists(),
        "{ended_leases} was left behind"
    );
    assert!(!Path::new(&format!("{}-wal", ended.display())).exists());
}
