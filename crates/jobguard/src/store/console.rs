//! What an operator's console reads and changes, and its interface to the backends: the rows
//! it returns, the statements each backend builds from the table names, and their binding and
//! decoding, written once in [`console_statements`] and expanded in each backend's
//! `console.rs`. `jobguard::console` re-exports the types users name.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;
use serde_json::Value;
use sqlx::Pool;

use crate::store::queue::{HELD, JobRow, JobState, STATE, serialize_optional_time, serialize_time};
use crate::table::TableName;

pub use crate::store::queue::{JobFilter, MAX_PAGE};

/// One job in full: [`Console::job`](crate::console::Console::job).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobDetail {
    /// What the listing shows, payload included.
    #[serde(flatten)]
    pub job: JobRow,
    /// Until when its current attempt's lease holds, while it runs.
    #[serde(serialize_with = "serialize_optional_time")]
    pub leased_until: Option<SystemTime>,
    /// How many times it was fetched: the fencing token of its newest lease.
    pub lease_token: i64,
    /// The guard row of its key, when the key was applied.
    pub guard: Option<KeyRecord>,
    /// Whether it applied its key or completed as a duplicate, when known.
    #[serde(flatten)]
    pub outcome: KeyOutcome,
}

/// A key's guard row: the proof that its effect was applied, once.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KeyRecord {
    /// The kind that applied it.
    pub kind: String,
    /// When it was applied, by the database clock.
    #[serde(serialize_with = "serialize_time")]
    pub applied_at: SystemTime,
    /// The fingerprint of the payload it was applied with, in hex, when one was stored.
    pub fingerprint: Option<String>,
    /// What the job returned, stored with the key.
    pub result: Option<Value>,
    /// The queued job whose attempt applied the key, as its claim recorded it; `None` when it
    /// was applied outside the queue ([`Guard::run`](crate::Guard::run), the Python package)
    /// or before jobs recorded it.
    pub applied_by: Option<i64>,
}

/// What a job that carried a key did with it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KeyOutcome {
    /// `applied` for the job whose attempt applied the key, `duplicate` for a completed job
    /// that found it applied; `None` for a job that has not completed, or when the guard row
    /// does not say which job applied (applied outside the queue, or pruned).
    pub outcome: Option<JobOutcome>,
    /// For a duplicate: the job that applied the key.
    pub duplicate_of: Option<i64>,
}

/// See [`KeyOutcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobOutcome {
    /// Its attempt claimed the key and its effect committed.
    Applied,
    /// It completed without running its effect: the key was applied already.
    Duplicate,
}

impl KeyOutcome {
    /// The outcome of `job`, by the job that applied its key (`applied_by`, checked to be one
    /// of the key's jobs).
    pub(crate) fn of(job: &JobRow, applied_by: Option<i64>) -> Self {
        let Some(applier) = applied_by else {
            return KeyOutcome::default();
        };
        match job.state {
            _ if job.id == applier => KeyOutcome {
                outcome: Some(JobOutcome::Applied),
                duplicate_of: None,
            },
            JobState::Completed => KeyOutcome {
                outcome: Some(JobOutcome::Duplicate),
                duplicate_of: Some(applier),
            },
            _ => KeyOutcome::default(),
        }
    }
}

/// A job that carried a key, with what it did with it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KeyJob {
    /// The job as listed.
    #[serde(flatten)]
    pub job: JobRow,
    /// Applied or duplicate.
    #[serde(flatten)]
    pub outcome: KeyOutcome,
}

/// The job that holds a key now, which a repeated enqueue of the key finds: what it returns,
/// refuses or replaces, by the enqueue's
/// [`OnConflict`](crate::unique::OnConflict).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KeyHolder {
    /// The job.
    pub id: i64,
    /// Its state.
    pub state: JobState,
    /// False when it is finished and holds the key only because its unique policy keeps it in
    /// that state; such a job holds it against enqueues with a policy of their own.
    pub live: bool,
}

/// An external step of a key, from the step ledger.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KeyStep {
    /// The step's name.
    pub step: String,
    /// The job kind that ran it.
    pub kind: String,
    /// `started`, `done` or `attention`.
    pub state: String,
    /// Times it was started.
    pub attempts: i32,
    /// What the call returned, once done.
    pub result: Option<Value>,
    /// Why it needs attention.
    pub reason: Option<String>,
    /// When it was first started.
    #[serde(serialize_with = "serialize_time")]
    pub started_at: SystemTime,
    /// When it last changed.
    #[serde(serialize_with = "serialize_time")]
    pub updated_at: SystemTime,
}

/// An outbox message a key's job published.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KeyMessage {
    /// The message id, `<key>/<topic>`.
    pub id: String,
    /// The topic.
    pub topic: String,
    /// `pending`, `sent` or `dead`.
    pub state: String,
    /// Deliveries tried.
    pub attempts: i32,
    /// The error of the last failed delivery.
    pub last_error: Option<String>,
    /// When the job published it.
    #[serde(serialize_with = "serialize_time")]
    pub created_at: SystemTime,
    /// When it was delivered.
    #[serde(serialize_with = "serialize_optional_time")]
    pub sent_at: Option<SystemTime>,
}

/// Everything stored about one key: [`Console::key`](crate::console::Console::key).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KeyReport {
    /// The key.
    pub key: String,
    /// Its guard row; `None` when it was never applied (or was pruned).
    pub guard: Option<KeyRecord>,
    /// The jobs that carried it, newest first, each with whether it applied the key or
    /// completed as a duplicate of the one that did.
    pub jobs: Vec<KeyJob>,
    /// The job that holds the key now: why a repeated enqueue of it is returned, refused or
    /// replaces it, rather than inserted.
    pub holder: Option<KeyHolder>,
    /// Its external steps.
    pub steps: Vec<KeyStep>,
    /// The outbox messages its job published.
    pub messages: Vec<KeyMessage>,
}

/// A queue as the console shows it: [`Console::queues`](crate::console::Console::queues).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueState {
    /// The queue's name.
    pub name: String,
    /// Whether workers leave its jobs waiting.
    pub paused: bool,
    /// When it was last paused or resumed.
    #[serde(serialize_with = "serialize_optional_time")]
    pub changed_at: Option<SystemTime>,
    /// Jobs ready to run now.
    pub ready: i64,
}

/// A job's state, as stored, and its key: what an action refused explains itself with.
#[derive(Debug)]
pub struct JobStateOf {
    pub(crate) state: String,
    pub(crate) key: String,
}

/// The console's statements, built once from the validated names of the tables it reads.
#[derive(Debug)]
pub struct ConsoleSql {
    /// One job by id (`$1`): its row's columns, then its lease and token.
    pub(crate) job: Arc<str>,
    /// A job's state and key by id.
    pub(crate) state_of: Arc<str>,
    /// Another live job holding a key: `$1` key, `$2` the id to leave out.
    pub(crate) live_holder: Arc<str>,
    pub(crate) retry: Arc<str>,
    /// `$1` id, `$2` the error to record.
    pub(crate) cancel: Arc<str>,
    pub(crate) delete: Arc<str>,
    /// `$1` queue, `$2` paused.
    pub(crate) set_paused: Arc<str>,
    pub(crate) queues: Arc<str>,
    pub(crate) key_record: Arc<str>,
    pub(crate) key_steps: Arc<str>,
    /// The outbox messages whose id lies in `[$1, $2)`: every id that starts with `<key>/`.
    pub(crate) key_messages: Arc<str>,
}

/// The tables the console reads, by concept.
#[derive(Clone, Debug)]
pub struct ConsoleTables {
    pub(crate) jobs: TableName,
    pub(crate) guard: TableName,
    pub(crate) steps: TableName,
    pub(crate) outbox: TableName,
}

// The console's statements that every dialect writes alike, on the jobs table `t` (quoted);
// each backend's `console_sql` takes them from here.

pub(crate) fn state_of(t: &str) -> String {
    format!("select {STATE}, job_key from {t} where id = $1")
}

pub(crate) fn live_holder(t: &str) -> String {
    format!(
        "select id from {t} where job_key = $1 and {} and id <> $2",
        jobguard_core::sql::LIVE_STATES
    )
}

/// Only a job no worker holds.
pub(crate) fn delete(t: &str) -> String {
    format!("delete from {t} where id = $1 and not ({HELD}) returning queue")
}

/// The console's statements each backend implements.
pub trait ConsoleStore: sqlx::Database {
    fn console_sql(tables: &ConsoleTables) -> ConsoleSql;

    /// Job `id` in full, but for its key's guard row (`guard` is `None`).
    fn console_job(
        pool: &Pool<Self>,
        sql: &ConsoleSql,
        id: i64,
    ) -> impl Future<Output = crate::Result<Option<JobDetail>>> + Send;

    /// The state and key of job `id`.
    fn console_state(
        pool: &Pool<Self>,
        sql: &ConsoleSql,
        id: i64,
    ) -> impl Future<Output = sqlx::Result<Option<JobStateOf>>> + Send;

    fn console_live_holder(
        pool: &Pool<Self>,
        sql: &ConsoleSql,
        key: &str,
        id: i64,
    ) -> impl Future<Output = sqlx::Result<Option<i64>>> + Send;

    /// Runs the statement of an action on job `id`, with `text` bound second when given;
    /// returns the queue of the job it changed, or `None` when no job was in a state it applies
    /// to.
    fn console_act(
        pool: &Pool<Self>,
        statement: &Arc<str>,
        id: i64,
        text: Option<&str>,
    ) -> impl Future<Output = sqlx::Result<Option<String>>> + Send;

    fn console_set_paused(
        pool: &Pool<Self>,
        sql: &ConsoleSql,
        queue: &str,
        paused: bool,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Every queue paused or resumed once (`ready` left at 0).
    fn console_queues(
        pool: &Pool<Self>,
        sql: &ConsoleSql,
    ) -> impl Future<Output = sqlx::Result<Vec<QueueState>>> + Send;

    fn console_key_record(
        pool: &Pool<Self>,
        sql: &ConsoleSql,
        key: &str,
    ) -> impl Future<Output = sqlx::Result<Option<KeyRecord>>> + Send;

    fn console_key_steps(
        pool: &Pool<Self>,
        sql: &ConsoleSql,
        key: &str,
    ) -> impl Future<Output = sqlx::Result<Vec<KeyStep>>> + Send;

    /// The outbox messages whose id lies in `ids`.
    fn console_key_messages(
        pool: &Pool<Self>,
        sql: &ConsoleSql,
        ids: Range<&str>,
    ) -> impl Future<Output = sqlx::Result<Vec<KeyMessage>>> + Send;
}

/// The console statements whose binding and decoding are the same on every backend: only their
/// SQL differs, and that comes from the backend's [`ConsoleSql`]. Expanded inside each
/// `impl ConsoleStore`, where the backend's types are concrete.
macro_rules! console_statements {
    () => {
        async fn console_job(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::console::ConsoleSql,
            id: i64,
        ) -> $crate::Result<Option<$crate::store::console::JobDetail>> {
            use sqlx::Row as _;
            let Some(row) = sqlx::query(sqlx::AssertSqlSafe(sql.job.clone()))
                .bind(id)
                .fetch_optional(pool)
                .await?
            else {
                return Ok(None);
            };
            let leased_until: Option<i64> = row.try_get(14)?;
            Ok(Some($crate::store::console::JobDetail {
                job: $crate::store::queue::JobRow::from_row(&row)?,
                leased_until: leased_until.map($crate::time::micros_to_time),
                lease_token: row.try_get(15)?,
                guard: None,
                outcome: $crate::store::console::KeyOutcome::default(),
            }))
        }

        async fn console_state(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::console::ConsoleSql,
            id: i64,
        ) -> sqlx::Result<Option<$crate::store::console::JobStateOf>> {
            let row: Option<(String, String)> =
                sqlx::query_as(sqlx::AssertSqlSafe(sql.state_of.clone()))
                    .bind(id)
                    .fetch_optional(pool)
                    .await?;
            Ok(row.map(|(state, key)| $crate::store::console::JobStateOf { state, key }))
        }

        async fn console_live_holder(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::console::ConsoleSql,
            key: &str,
            id: i64,
        ) -> sqlx::Result<Option<i64>> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.live_holder.clone()))
                .bind(key)
                .bind(id)
                .fetch_optional(pool)
                .await
        }

        async fn console_act(
            pool: &sqlx::Pool<Self>,
            statement: &std::sync::Arc<str>,
            id: i64,
            text: Option<&str>,
        ) -> sqlx::Result<Option<String>> {
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(statement.clone())).bind(id);
            if let Some(text) = text {
                query = query.bind(text);
            }
            query.fetch_optional(pool).await
        }

        async fn console_set_paused(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::console::ConsoleSql,
            queue: &str,
            paused: bool,
        ) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(sql.set_paused.clone()))
                .bind(queue)
                .bind(paused)
                .execute(pool)
                .await?;
            Ok(())
        }

        async fn console_queues(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::console::ConsoleSql,
        ) -> sqlx::Result<Vec<$crate::store::console::QueueState>> {
            let rows: Vec<(String, bool, i64)> =
                sqlx::query_as(sqlx::AssertSqlSafe(sql.queues.clone()))
                    .fetch_all(pool)
                    .await?;
            Ok(rows
                .into_iter()
                .map(
                    |(name, paused, changed_at)| $crate::store::console::QueueState {
                        name,
                        paused,
                        changed_at: Some($crate::time::micros_to_time(changed_at)),
                        ready: 0,
                    },
                )
                .collect())
        }

        async fn console_key_record(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::console::ConsoleSql,
            key: &str,
        ) -> sqlx::Result<Option<$crate::store::console::KeyRecord>> {
            let row: Option<(
                String,
                i64,
                Option<Vec<u8>>,
                Option<sqlx::types::Json<serde_json::Value>>,
                Vec<u8>,
            )> = sqlx::query_as(sqlx::AssertSqlSafe(sql.key_record.clone()))
                .bind(key)
                .fetch_optional(pool)
                .await?;
            Ok(row.map(|(kind, applied_at, fingerprint, result, token)| {
                $crate::store::console::KeyRecord {
                    kind,
                    applied_at: $crate::time::micros_to_time(applied_at),
                    fingerprint: fingerprint
                        .map(|bytes| bytes.iter().map(|byte| format!("{byte:02x}")).collect()),
                    result: result.map(|json| json.0),
                    applied_by: $crate::store::guard::ClaimToken::applied_by(&token),
                }
            }))
        }

        async fn console_key_steps(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::console::ConsoleSql,
            key: &str,
        ) -> sqlx::Result<Vec<$crate::store::console::KeyStep>> {
            use sqlx::Row as _;
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.key_steps.clone()))
                .bind(key)
                .fetch_all(pool)
                .await?;
            rows.into_iter()
                .map(|row| {
                    let result: Option<sqlx::types::Json<serde_json::Value>> = row.try_get(4)?;
                    Ok($crate::store::console::KeyStep {
                        step: row.try_get(0)?,
                        kind: row.try_get(1)?,
                        state: row.try_get(2)?,
                        attempts: row.try_get(3)?,
                        result: result.map(|json| json.0),
                        reason: row.try_get(5)?,
                        started_at: $crate::time::micros_to_time(row.try_get(6)?),
                        updated_at: $crate::time::micros_to_time(row.try_get(7)?),
                    })
                })
                .collect()
        }

        async fn console_key_messages(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::console::ConsoleSql,
            ids: std::ops::Range<&str>,
        ) -> sqlx::Result<Vec<$crate::store::console::KeyMessage>> {
            use sqlx::Row as _;
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.key_messages.clone()))
                .bind(ids.start)
                .bind(ids.end)
                .fetch_all(pool)
                .await?;
            rows.into_iter()
                .map(|row| {
                    let sent_at: Option<i64> = row.try_get(6)?;
                    Ok($crate::store::console::KeyMessage {
                        id: row.try_get(0)?,
                        topic: row.try_get(1)?,
                        state: row.try_get(2)?,
                        attempts: row.try_get(3)?,
                        last_error: row.try_get(4)?,
                        created_at: $crate::time::micros_to_time(row.try_get(5)?),
                        sent_at: sent_at.map($crate::time::micros_to_time),
                    })
                })
                .collect()
        }
    };
}
pub(crate) use console_statements;
