//! The small internal interface each database backend implements.
//!
//! [`Guard`](crate::Guard) holds the logic (claim first, effect second, commit both); a backend
//! only knows its SQL dialect, how to open a transaction that queues writers instead of failing
//! them, and which of its errors are worth retrying.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::{Database, Pool, Transaction};

use crate::fingerprint::Fingerprint;
use crate::table::TableName;

/// A database jobguard can guard jobs on: [`sqlx::Postgres`] or [`sqlx::Sqlite`].
///
/// The trait is sealed; its methods are an internal detail.
pub trait Backend: Database + sealed::Sealed {
    /// The backend's name as shown to users: `postgres` or `sqlite`.
    const BACKEND: &'static str;

    /// Whether the database admits one writing transaction at a time.
    #[doc(hidden)]
    const SINGLE_WRITER: bool;

    #[doc(hidden)]
    fn guard_sql(table: &TableName) -> crate::Result<GuardSql>;

    #[doc(hidden)]
    fn migrate_guard(
        pool: &Pool<Self>,
        sql: &GuardSql,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Opens the transaction a guarded job runs in.
    #[doc(hidden)]
    fn begin(
        pool: &Pool<Self>,
    ) -> impl Future<Output = sqlx::Result<Transaction<'static, Self>>> + Send;

    /// Inserts the guard row, or reads the row that holds the key.
    #[doc(hidden)]
    fn claim(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        claim: &NewClaim<'_>,
    ) -> impl Future<Output = sqlx::Result<ClaimRow>> + Send;

    #[doc(hidden)]
    fn fetch_record(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        key: &str,
    ) -> impl Future<Output = sqlx::Result<Option<GuardRecord>>> + Send;

    #[doc(hidden)]
    fn store_result(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        key: &str,
        result: &serde_json::Value,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Serialization failures, deadlocks and busy databases: rolling back and running the whole
    /// transaction again may succeed.
    #[doc(hidden)]
    fn is_transient(error: &sqlx::Error) -> bool;
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// The guard table's statements, built once per [`Guard`](crate::Guard) from its validated name.
#[doc(hidden)]
#[derive(Debug)]
pub struct GuardSql {
    pub(crate) table: TableName,
    pub(crate) create: Vec<Arc<str>>,
    pub(crate) claim: Arc<str>,
    pub(crate) record: Arc<str>,
    pub(crate) store_result: Arc<str>,
}

/// The values of a guard row about to be inserted.
#[doc(hidden)]
#[derive(Debug)]
pub struct NewClaim<'a> {
    pub(crate) key: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) fingerprint: Option<&'a Fingerprint>,
    pub(crate) token: &'a ClaimToken,
}

/// What inserting a guard row found.
#[doc(hidden)]
#[derive(Debug)]
pub enum ClaimRow {
    /// The row was inserted: this transaction holds the key.
    Claimed,
    /// A committed row holds the key.
    Held(GuardRecord),
    /// The insert conflicted, but the row was gone when read (deleted in between).
    Vanished,
}

/// Identifies one attempt to claim a key.
///
/// After a commit fails with a lost connection, the guard row is the witness of whether the
/// commit happened; the token says whether the row found is this attempt's or another's.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimToken(pub(crate) [u8; 16]);

impl ClaimToken {
    pub(crate) fn new() -> Self {
        use std::sync::OnceLock;
        use std::sync::atomic::{AtomicU64, Ordering};
        static PROCESS: OnceLock<[u8; 32]> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let process = PROCESS.get_or_init(|| {
            let started = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let mut hasher = blake3::Hasher::new();
            hasher.update(&std::process::id().to_le_bytes());
            hasher.update(&started.as_nanos().to_le_bytes());
            *hasher.finalize().as_bytes()
        });
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let hash = blake3::keyed_hash(process, &n.to_le_bytes());
        let mut token = [0; 16];
        token.copy_from_slice(&hash.as_bytes()[..16]);
        ClaimToken(token)
    }
}

/// A guard row as read back from the table.
#[derive(Clone, Debug, PartialEq)]
pub struct GuardRecord {
    /// When the key was first applied, by the database clock.
    pub applied_at: SystemTime,
    /// The fingerprint of the payload it was applied with, when one was given.
    pub fingerprint: Option<Fingerprint>,
    /// The result the first run returned, when it returned one.
    pub result: Option<serde_json::Value>,
    pub(crate) token: Option<ClaimToken>,
}

impl GuardRecord {
    pub(crate) fn from_columns(
        applied_at_micros: i64,
        fingerprint: Option<Vec<u8>>,
        result: Option<serde_json::Value>,
        token: Vec<u8>,
    ) -> Self {
        GuardRecord {
            applied_at: UNIX_EPOCH + Duration::from_micros(applied_at_micros.max(0) as u64),
            fingerprint: fingerprint.as_deref().and_then(Fingerprint::from_slice),
            result: result.filter(|value| !value.is_null()),
            token: <[u8; 16]>::try_from(token.as_slice()).ok().map(ClaimToken),
        }
    }
}
