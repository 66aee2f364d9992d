//! Enqueueing, in one place: one job or a batch, a [`NewJob`] or a [`Job`] value,
//! on the queue's own connection or inside the caller's transaction, and the notification that
//! wakes idle workers. Every other way in (the worker's `enqueue_job`, the CLI's `enqueue`, the
//! console's retry) calls these.
//!
//! Two paths reach the database: [`Queue::enqueue_tx`] inserts one job with the statement the
//! Python package shares (or, for a job whose unique policy keeps its key past the live states,
//! the one that stores the policy), [`Queue::enqueue_many_tx`] a batch in one statement. Both
//! settle a key that a job holds the same way ([`Queue::settle_conflict`], by the job's
//! [`OnConflict`](crate::unique::OnConflict)) and announce through [`Queue::notify`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Enqueued, NOTIFY_CHANNEL, NewJob, Queue};
use crate::error::{Error, Result};
use crate::external::ExternalJob;
use crate::job::Job;
use crate::store::Backend;
use crate::store::queue::Holder;
use crate::unique::Conflict;

/// How many times an enqueue inserts and reads again: a live job holding a key can finish
/// between the insert and the read, and then the key is inserted on the next round.
const ROUNDS: usize = 3;

/// The job as stored: its key with the queue and period its policy appends. Borrowed when the
/// policy appends neither, as for every job without one.
fn resolved(job: &NewJob) -> Result<Cow<'_, NewJob>> {
    let unique = job.unique_opts();
    if unique.period_len().is_none() && !unique.is_by_queue() {
        return Ok(Cow::Borrowed(job));
    }
    Ok(Cow::Owned(job.clone().resolve_key()?))
}

/// Of the jobs found holding `job`'s key, the one its insert conflicted with: a live one, else
/// (when `job` has a policy of its own, so is in the kept-key index) a finished one kept by
/// its policy. `None`: the holder went away since the insert, and the next round inserts.
fn conflicting(job: &NewJob, holders: Vec<Holder>) -> Option<Holder> {
    let kept = job.unique.states_kept().mask() != 0;
    let mut found = None;
    for holder in holders {
        if holder.live {
            return Some(holder);
        }
        if kept && found.is_none() {
            found = Some(holder);
        }
    }
    found
}

/// The job that holds the key, returned (its kind and payload are the enqueued job's).
fn returned(holder: Holder) -> Enqueued {
    Enqueued {
        id: holder.id,
        inserted: false,
        replaced: false,
        existing_state: Some(holder.state),
    }
}

/// The error of a key whose live job came and went on every round.
fn kept_changing(job: &NewJob) -> Error {
    Error::Database(sqlx::Error::Protocol(format!(
        "the live job of `{}` kept changing while enqueueing",
        job.key
    )))
}

/// Where a notification is sent from, which sets how often it may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Announce {
    /// Inside the caller's transaction, delivered when it commits. PostgreSQL serialises the
    /// commits of transactions that notify, each holding a lock through its WAL flush, so these
    /// go at most once per [`NOTIFY_IN_TX_EVERY`].
    InTransaction,
    /// After the jobs' own transaction committed, as a statement of its own: such a transaction
    /// writes no WAL and holds the lock for microseconds, so these may go every
    /// [`NOTIFY_COMMITTED_EVERY`], which bounds the wait of a job enqueued inside a window.
    Committed,
}

impl Announce {
    fn every(self) -> Duration {
        match self {
            Announce::InTransaction => NOTIFY_IN_TX_EVERY,
            Announce::Committed => NOTIFY_COMMITTED_EVERY,
        }
    }
}

/// When a queue was last announced, and whether a trailing announcement is due.
pub(super) struct Announced {
    at: Instant,
    /// An enqueue inside the window was not announced: a notification goes out at the window's
    /// end, so that job does not wait for a worker's poll.
    trailing: bool,
}

/// The window of notifications sent inside a caller's transaction.
const NOTIFY_IN_TX_EVERY: Duration = Duration::from_millis(20);

/// The window of notifications sent after the jobs committed.
const NOTIFY_COMMITTED_EVERY: Duration = Duration::from_millis(1);

impl NewJob {
    /// The job for a [`Job`] value: its kind, key and payload.
    pub fn from_job<DB: Backend, J: Job<DB>>(job: &J) -> Result<Self> {
        Ok(NewJob::new(job.key()?, job)?
            .kind(J::KIND)?
            .unique(J::unique_opts()))
    }

    /// The job for an [`ExternalJob`] value: its kind, key and payload.
    pub fn from_external<DB: Backend, J: ExternalJob<DB>>(job: &J) -> Result<Self> {
        NewJob::new(job.key()?, job)?.kind(J::KIND)
    }
}

impl<DB: Backend> Queue<DB> {
    /// Enqueues a job, or returns the job with the same key that is already waiting or
    /// running. Visible to workers as soon as this returns.
    ///
    /// The same key with another payload or kind is refused with [`Error::KeyReused`].
    pub async fn enqueue(&self, job: &NewJob) -> Result<Enqueued> {
        let _writer = self.inner.writer.acquire().await;
        let mut conn = self.inner.pool.acquire().await?;
        // No transaction is open on `conn`: each statement commits as it runs, and the job is
        // announced after its insert committed.
        self.enqueue_on(&mut conn, job, Announce::Committed).await
    }

    /// Enqueues a job inside the caller's transaction. Workers see it when the transaction
    /// **commits**; on **rollback** it was never enqueued. Enqueue a job in the same
    /// transaction as the state change that calls for it, and the two cannot disagree.
    pub async fn enqueue_tx(&self, conn: &mut DB::Connection, job: &NewJob) -> Result<Enqueued> {
        self.enqueue_on(conn, job, Announce::InTransaction).await
    }

    async fn enqueue_on(
        &self,
        conn: &mut DB::Connection,
        job: &NewJob,
        announce: Announce,
    ) -> Result<Enqueued> {
        let job = resolved(job)?;
        let sql = &self.inner.sql;
        let kept = job.unique.states_kept().mask() != 0;
        // A live job holding the key can finish between the insert and the read; then the
        // insert succeeds on the next round.
        for _ in 0..ROUNDS {
            if let Some(id) = DB::enqueue(conn, sql, &job).await? {
                self.notify(conn, &job.queue, announce).await?;
                return Ok(Enqueued::inserted(id));
            }
            if let Some(holder) = DB::holder(conn, sql, job.key.as_str(), kept).await? {
                return self
                    .settle_conflict(conn, &job, holder, Some(announce))
                    .await;
            }
        }
        Err(kept_changing(&job))
    }

    /// What `job`'s enqueue does about `holder`, the job holding its key, by the job's
    /// [`OnConflict`](crate::unique::OnConflict): return it, refuse, or replace its payload and run time while it waits
    /// (then announced as `announce` says, when given) and, when it no longer waits, return it
    /// or refuse.
    async fn settle_conflict(
        &self,
        conn: &mut DB::Connection,
        job: &NewJob,
        holder: Holder,
        announce: Option<Announce>,
    ) -> Result<Enqueued> {
        let same_kind = holder.kind == job.kind;
        let same_payload = holder.payload == job.payload;
        let or_reject = match job.unique.conflict_action().settle(same_kind, same_payload) {
            Conflict::Return => return Ok(returned(holder)),
            Conflict::KeyReused => return Err(Error::KeyReused { key: holder.key }),
            Conflict::Reject => {
                return Err(Error::EnqueueRejected {
                    key: holder.key,
                    existing_id: holder.id,
                    state: holder.state.to_string(),
                });
            }
            Conflict::Replace { or_reject } => or_reject,
        };
        let sql = &self.inner.sql;
        // Only a live holder can still wait; the statement decides whether it does.
        if holder.live && DB::replace(conn, sql, holder.id, job).await? {
            if let Some(announce) = announce {
                self.notify(conn, &job.queue, announce).await?;
            }
            return Ok(Enqueued {
                id: holder.id,
                inserted: false,
                replaced: true,
                existing_state: Some(holder.state),
            });
        }
        // A worker holds it (or took it since the read), or it finished: it runs, or ran,
        // with the payload it has. Report the state it is in now.
        let state = match holder.live {
            true => DB::holder(conn, sql, &holder.key, true)
                .await?
                .filter(|now| now.id == holder.id)
                .map_or(holder.state, |now| now.state),
            false => holder.state,
        };
        if or_reject {
            return Err(Error::ReplaceRejected {
                key: holder.key,
                existing_id: holder.id,
                state: state.to_string(),
            });
        }
        Ok(Enqueued {
            id: holder.id,
            inserted: false,
            replaced: false,
            existing_state: Some(state),
        })
    }

    /// Enqueues many jobs in one transaction and, on PostgreSQL, one insert statement: what
    /// [`enqueue`](Self::enqueue) does for each, at a fraction of the round trips. Returns what
    /// happened to each job, in the order given: inserted, or the id of the job with the same
    /// key that was already waiting or running. Visible to workers as soon as this returns.
    ///
    /// The batch is all or nothing: a key already live with another payload or kind fails it
    /// with [`Error::KeyReused`] and none of its jobs is enqueued. The same key twice in one
    /// batch is one job, reported for both entries as if they were enqueued one by one: the
    /// first as inserted, the second as finding it (another payload or kind for it is
    /// [`Error::KeyReused`] too).
    ///
    /// On PostgreSQL the batch is one `insert ... select from unnest(...)`, then one `select`
    /// for the keys a live job held; on SQLite one insert from a JSON array, under this
    /// process's turn to write. Each queue that received jobs is notified once.
    ///
    /// ```no_run
    /// use jobguard::queue::{NewJob, Queue};
    /// use jobguard::JobKey;
    ///
    /// # async fn f(queue: Queue<sqlx::Postgres>) -> jobguard::Result<()> {
    /// let jobs = (1..=3)
    ///     .map(|order| {
    ///         let key = JobKey::new("credit", [format!("order-{order}")])?;
    ///         NewJob::new(key, &serde_json::json!({"order": order, "amount": 500}))
    ///     })
    ///     .collect::<jobguard::Result<Vec<_>>>()?;
    /// let enqueued = queue.enqueue_many(&jobs).await?;
    /// assert_eq!(enqueued.len(), 3);
    /// # Ok(()) }
    /// ```
    pub async fn enqueue_many(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let _writer = self.inner.writer.acquire().await;
        let mut conn = self.inner.pool.acquire().await?;
        self.enqueue_many_tx(&mut conn, jobs).await
    }

    /// [`enqueue_many`](Self::enqueue_many) inside the caller's transaction. Workers see the
    /// jobs when the transaction **commits**; on **rollback** none was enqueued. When this
    /// fails, the batch's own inserts are already undone (it runs in a savepoint) and the
    /// caller's transaction can go on.
    ///
    /// On SQLite, pass a transaction begun with `begin immediate` or a connection outside
    /// any transaction, as for [`enqueue_tx`](Self::enqueue_tx).
    pub async fn enqueue_many_tx(
        &self,
        conn: &mut DB::Connection,
        jobs: &[NewJob],
    ) -> Result<Vec<Enqueued>> {
        let jobs: Vec<Cow<'_, NewJob>> = jobs.iter().map(resolved).collect::<Result<_>>()?;
        // One entry per key: a key twice in the batch is one job, and must be the same job.
        let mut first_of_key: HashMap<&str, &NewJob> = HashMap::with_capacity(jobs.len());
        for job in &jobs {
            let first = *first_of_key.entry(job.key.as_str()).or_insert(job);
            if first.kind != job.kind || first.payload != job.payload {
                return Err(Error::KeyReused {
                    key: job.key.to_string(),
                });
            }
        }
        if first_of_key.is_empty() {
            return Ok(Vec::new());
        }
        // Keys in one order in every batch: two batches sharing keys on PostgreSQL wait for
        // each other's insert in the same order and cannot deadlock.
        let mut distinct: Vec<&NewJob> = first_of_key.into_values().collect();
        distinct.sort_unstable_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
        let slot_of_key: HashMap<&str, usize> = distinct
            .iter()
            .enumerate()
            .map(|(slot, job)| (job.key.as_str(), slot))
            .collect();

        let sql = &self.inner.sql;
        let mut results: Vec<Option<Enqueued>> = vec![None; distinct.len()];
        // A savepoint in the caller's transaction, else a transaction of its own (`begin
        // immediate` on SQLite): a refused key undoes the whole batch.
        let mut tx = if sqlx::Connection::is_in_transaction(conn) {
            sqlx::Connection::begin(conn).await?
        } else {
            DB::begin_on(conn).await?
        };
        let mut pending: Vec<usize> = (0..distinct.len()).collect();
        // A live job holding a key can finish between the insert and the read; then that key
        // is inserted on the next round.
        for _ in 0..ROUNDS {
            let batch: Vec<&NewJob> = pending.iter().map(|&slot| distinct[slot]).collect();
            let mut waiting: HashMap<&str, usize> = pending
                .iter()
                .map(|&slot| (distinct[slot].key.as_str(), slot))
                .collect();
            for inserted in DB::enqueue_many(&mut tx, sql, &batch).await? {
                if let Some(slot) = waiting.remove(inserted.key.as_str()) {
                    results[slot] = Some(Enqueued::inserted(inserted.id));
                }
            }
            if waiting.is_empty() {
                pending.clear();
                break;
            }
            let keys: Vec<&str> = waiting.keys().copied().collect();
            let mut holders_of_key: HashMap<String, Vec<Holder>> = HashMap::new();
            for holder in DB::holders(&mut tx, sql, &keys).await? {
                holders_of_key
                    .entry(holder.key.clone())
                    .or_default()
                    .push(holder);
            }
            let mut settled = Vec::new();
            for (key, &slot) in &waiting {
                let holders = holders_of_key.remove(*key).unwrap_or_default();
                let Some(holder) = conflicting(distinct[slot], holders) else {
                    continue;
                };
                // A refused key returns here: dropping the transaction rolls the batch back.
                // Replaced jobs are announced below, with the queues that received jobs.
                let job = distinct[slot];
                results[slot] = Some(self.settle_conflict(&mut tx, job, holder, None).await?);
                settled.push(*key);
            }
            for key in settled {
                waiting.remove(key);
            }
            pending = waiting.into_values().collect();
            if pending.is_empty() {
                break;
            }
        }
        if let Some(&slot) = pending.first() {
            return Err(kept_changing(distinct[slot]));
        }
        tx.commit().await?;

        // One notification per queue that received jobs.
        let mut queues: Vec<&str> = distinct
            .iter()
            .zip(&results)
            .filter(|(_, result)| result.is_some_and(|r| r.inserted || r.replaced))
            .map(|(job, _)| job.queue.as_str())
            .collect();
        queues.sort_unstable();
        queues.dedup();
        for queue in queues {
            self.notify(conn, queue, Announce::Committed).await?;
        }
        // As if enqueued one by one in order: a key's later entries find its first one's job.
        let mut reported = vec![false; distinct.len()];
        Ok(jobs
            .iter()
            .map(|job| {
                let slot = slot_of_key[job.key.as_str()];
                let mut result = results[slot].expect("inserted or found live");
                let again = std::mem::replace(&mut reported[slot], true);
                result.inserted &= !again;
                result.replaced &= !again;
                result
            })
            .collect())
    }

    /// Enqueues many [`Job`] values; see [`enqueue_many`](Self::enqueue_many). A
    /// value whose key or payload cannot be enqueued fails the batch with
    /// [`Error::InvalidBatchJob`] naming its index, before anything is written.
    pub async fn enqueue_jobs<J: crate::Job<DB>>(&self, jobs: &[J]) -> Result<Vec<Enqueued>> {
        self.enqueue_many(&Self::new_jobs(jobs)?).await
    }

    /// Enqueues many [`Job`] values inside the caller's transaction; see
    /// [`enqueue_many_tx`](Self::enqueue_many_tx). Workers see them when the transaction
    /// **commits**; on **rollback** none was enqueued.
    pub async fn enqueue_jobs_tx<J: crate::Job<DB>>(
        &self,
        conn: &mut DB::Connection,
        jobs: &[J],
    ) -> Result<Vec<Enqueued>> {
        self.enqueue_many_tx(conn, &Self::new_jobs(jobs)?).await
    }

    fn new_jobs<J: crate::Job<DB>>(jobs: &[J]) -> Result<Vec<NewJob>> {
        jobs.iter()
            .enumerate()
            .map(|(index, job)| {
                NewJob::from_job::<DB, J>(job).map_err(|source| Error::InvalidBatchJob {
                    index,
                    source: Box::new(source),
                })
            })
            .collect()
    }

    /// Wakes idle workers of `queue` (on PostgreSQL): at once when the window of `announce` is
    /// open, else once at the window's end for every enqueue inside it.
    pub(crate) async fn notify(
        &self,
        conn: &mut DB::Connection,
        queue: &str,
        announce: Announce,
    ) -> Result<()> {
        let Some(notify) = &self.inner.sql.notify else {
            return Ok(());
        };
        let now = Instant::now();
        let every = announce.every();
        {
            let mut last = self.inner.last_notify.lock().expect("not poisoned");
            let last = &mut last[announce as usize];
            match last.get_mut(queue) {
                Some(announced) if now.duration_since(announced.at) < every => {
                    if !announced.trailing {
                        announced.trailing = true;
                        self.notify_later(queue, announce, announced.at + every);
                    }
                    return Ok(());
                }
                Some(announced) => announced.at = now,
                None => {
                    let announced = Announced {
                        at: now,
                        trailing: false,
                    };
                    last.insert(queue.to_owned(), announced);
                }
            }
        }
        Ok(DB::notify(conn, notify, NOTIFY_CHANNEL, queue).await?)
    }

    /// The trailing notification of a window in which an enqueue went unannounced: sent at
    /// `at` on a connection of its own, outside the enqueue's transaction, which has usually
    /// committed by then. If it has not, the job is found by the next notification or poll.
    fn notify_later(&self, queue: &str, announce: Announce, at: Instant) {
        let (queue, inner) = (queue.to_owned(), Arc::clone(&self.inner));
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            if let Some(announced) =
                inner.last_notify.lock().expect("not poisoned")[announce as usize].get_mut(&queue)
            {
                announced.at = Instant::now();
                announced.trailing = false;
            }
            let Some(notify) = &inner.sql.notify else {
                return;
            };
            let sent = async {
                let mut conn = inner.pool.acquire().await?;
                DB::notify(&mut conn, notify, NOTIFY_CHANNEL, &queue).await
            };
            if let Err(error) = sent.await {
                tracing::debug!(%error, queue, "the trailing job notification failed; workers poll");
            }
        });
    }

    /// Enqueues a [`Job`] value; see [`enqueue`](Queue::enqueue).
    pub async fn enqueue_job<J: Job<DB>>(&self, job: &J) -> Result<Enqueued> {
        self.enqueue(&NewJob::from_job::<DB, J>(job)?).await
    }

    /// Enqueues a [`Job`] value inside the caller's transaction; see
    /// [`enqueue_tx`](Queue::enqueue_tx). Workers see it when the transaction **commits**; on
    /// **rollback** it was never enqueued.
    ///
    /// ```no_run
    /// # use jobguard::{Job, JobError, JobKey, KeyError, Queue};
    /// # #[derive(serde::Serialize, serde::Deserialize)]
    /// # struct Credit { order: String }
    /// # impl Job<sqlx::Postgres> for Credit {
    /// #     const KIND: &'static str = "credit";
    /// #     fn key(&self) -> Result<JobKey, KeyError> { JobKey::new("credit", [&self.order]) }
    /// #     async fn run(&self, _: &mut sqlx::PgConnection) -> Result<(), JobError> { Ok(()) }
    /// # }
    /// # async fn f(pool: sqlx::PgPool, queue: Queue<sqlx::Postgres>) -> jobguard::Result<()> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("update orders set state = 'paid' where id = 'order-8812'")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// queue.enqueue_job_tx(&mut tx, &Credit { order: "order-8812".into() }).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn enqueue_job_tx<J: Job<DB>>(
        &self,
        conn: &mut DB::Connection,
        job: &J,
    ) -> Result<Enqueued> {
        self.enqueue_tx(conn, &NewJob::from_job::<DB, J>(job)?)
            .await
    }

    /// Enqueues an [`ExternalJob`] value; see [`enqueue`](Queue::enqueue).
    pub async fn enqueue_external<J: ExternalJob<DB>>(&self, job: &J) -> Result<Enqueued> {
        self.enqueue(&NewJob::from_external::<DB, J>(job)?).await
    }
}
