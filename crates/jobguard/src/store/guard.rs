//! The guard's interface to the backends: the statements over a guard table, the claim that
//! inserts a guard row or reads the row holding its key, and the rows it reads back. The
//! binding and decoding that are the same on every backend are written once in
//! [`guard_statements`] and expanded in each backend's `guard.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::fingerprint::Fingerprint;
use crate::store::database::Store;
use crate::table::TableName;
use crate::time::micros_to_time;

/// What the guard calls on a backend: its statements, the claim, the record of a key and the
/// result stored with it.
pub trait GuardStore: Store {
    fn guard_sql(table: &TableName) -> crate::Result<GuardSql>;

    /// Inserts the guard row, or reads the row that holds the key.
    fn claim(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        claim: &NewClaim<'_>,
    ) -> impl Future<Output = sqlx::Result<ClaimRow>> + Send;

    /// The committed row holding `key`, if any.
    fn fetch_record(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        key: &str,
    ) -> impl Future<Output = sqlx::Result<Option<GuardRecord>>> + Send;

    /// Stores what a claimed key's effect returned, so that duplicates can return it.
    fn store_result(
        conn: &mut Self::Connection,
        sql: &GuardSql,
        key: &str,
        result: &serde_json::Value,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
}

/// The guard table's statements, built once per [`Guard`](crate::Guard) from its validated name.
#[derive(Debug)]
pub struct GuardSql {
    pub(crate) table: TableName,
    pub(crate) create: Vec<Arc<str>>,
    pub(crate) claim: Arc<str>,
    pub(crate) record: Arc<str>,
    pub(crate) store_result: Arc<str>,
    pub(crate) prune: Arc<str>,
    pub(crate) count_prunable: Arc<str>,
    pub(crate) oldest_age: Arc<str>,
}

/// The values of a guard row about to be inserted.
#[derive(Debug)]
pub struct NewClaim<'a> {
    pub(crate) key: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) fingerprint: Option<&'a Fingerprint>,
    pub(crate) token: &'a ClaimToken,
}

impl NewClaim<'_> {
    /// Binds the row's values in the order every claim statement takes them: `$1` key, `$2`
    /// kind, `$3` fingerprint, `$4` claim token.
    pub(crate) fn bind<'q, DB>(
        &self,
        query: sqlx::query::Query<'q, DB, DB::Arguments>,
    ) -> sqlx::query::Query<'q, DB, DB::Arguments>
    where
        DB: sqlx::Database,
        for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> Option<&'t [u8]>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> &'t [u8]: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    {
        query
            .bind(self.key)
            .bind(self.kind)
            .bind(self.fingerprint.map(|f| f.as_bytes().as_slice()))
            .bind(self.token.0.as_slice())
    }
}

/// What inserting a guard row found.
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

    /// The token of a queued job's attempt, which names the job: a marker, the job's id (48
    /// bits), its lease token (32 bits) and 32 random bits. The guard row it is stored in
    /// then records which job applied the key ([`applied_by`](Self::applied_by)), at no cost
    /// to the claim. The witness of a lost commit still tells attempts apart: a job's lease
    /// token grows with every fetch, and the random bits separate jobs of two queues that
    /// share one guard table.
    pub(crate) fn for_attempt(job_id: i64, lease_token: i64) -> Self {
        let mut token = ClaimToken::new().0;
        token[..2].copy_from_slice(&JOB_TOKEN_MARKER);
        token[2..8].copy_from_slice(&job_id.to_be_bytes()[2..]);
        token[8..12].copy_from_slice(&(lease_token as u32).to_be_bytes());
        ClaimToken(token)
    }

    /// The id of the job whose attempt claimed with this token, when it was a queued job's
    /// ([`for_attempt`](Self::for_attempt)). A token of another claim carries the marker
    /// once in 65,536: check that the id is one of the key's jobs.
    pub(crate) fn applied_by(token: &[u8]) -> Option<i64> {
        if token.len() != 16 || token[..2] != JOB_TOKEN_MARKER {
            return None;
        }
        let mut id = [0; 8];
        id[2..].copy_from_slice(&token[2..8]);
        Some(i64::from_be_bytes(id))
    }
}

/// The first bytes of a claim token that names a queued job's attempt.
const JOB_TOKEN_MARKER: [u8; 2] = *b"jq";

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
            applied_at: micros_to_time(applied_at_micros),
            fingerprint: fingerprint.as_deref().and_then(Fingerprint::from_slice),
            result: result.filter(|value| !value.is_null()),
            token: <[u8; 16]>::try_from(token.as_slice()).ok().map(ClaimToken),
        }
    }
}

/// [`GuardStore::guard_sql`], [`GuardStore::fetch_record`] and [`GuardStore::store_result`]:
/// their binding and decoding are the same on every backend. `$core` names the module of the
/// dialect's guard SQL in the core crate (`create`, `claim`, `record`, `store_result`),
/// `$prune` the module of its prune statements (`prune_guard`, `count_guard`,
/// `oldest_guard_age`); `$check` refuses a table name the dialect cannot hold. Expanded inside
/// each `impl GuardStore`, where the backend's `Row` and `Connection` types are concrete.
macro_rules! guard_statements {
    ($core:ident, $prune:ident $(, $check:path)?) => {
        fn guard_sql(
            table: &$crate::table::TableName,
        ) -> $crate::Result<$crate::store::guard::GuardSql> {
            $($check(table)?;)?
            Ok($crate::store::guard::GuardSql {
                table: table.clone(),
                create: $core::create(table)
                    .into_iter()
                    .map(std::sync::Arc::from)
                    .collect(),
                claim: $core::claim(table).into(),
                record: $core::record(table).into(),
                store_result: $core::store_result(table).into(),
                prune: $prune::prune_guard(table).into(),
                count_prunable: $prune::count_guard(table).into(),
                oldest_age: $prune::oldest_guard_age(table).into(),
            })
        }

        async fn fetch_record(
            conn: &mut Self::Connection,
            sql: &$crate::store::guard::GuardSql,
            key: &str,
        ) -> sqlx::Result<Option<$crate::store::guard::GuardRecord>> {
            use sqlx::Row as _;
            let row = sqlx::query(sqlx::AssertSqlSafe(sql.record.clone()))
                .bind(key)
                .fetch_optional(conn)
                .await?;
            row.map(|row| {
                let result: Option<sqlx::types::Json<serde_json::Value>> = row.try_get(2)?;
                Ok($crate::store::guard::GuardRecord::from_columns(
                    row.try_get(0)?,
                    row.try_get(1)?,
                    result.map(|json| json.0),
                    row.try_get(3)?,
                ))
            })
            .transpose()
        }

        async fn store_result(
            conn: &mut Self::Connection,
            sql: &$crate::store::guard::GuardSql,
            key: &str,
            result: &serde_json::Value,
        ) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(sql.store_result.clone()))
                .bind(key)
                .bind(sqlx::types::Json(result))
                .execute(conn)
                .await?;
            Ok(())
        }
    };
}
pub(crate) use guard_statements;
