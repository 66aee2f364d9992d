//! The guarded unit of work, written once: one transaction that claims one key or many (with
//! or without completing the jobs that carry them), runs their effects, and commits them all
//! or none; how its failures are classified; how a lost commit is settled; and how contention
//! is retried. [`Guard::run`](super::Guard::run), the worker (one job, or a batch), the broker
//! consumer (one message, or a batch) and the Kafka consumer all run their effects through it.
//!
//! - A claim inserts the key's guard row in the unit's transaction, under a token of the
//!   unit's own: on commit the key is recorded with the effects, on rollback it is not.
//! - A claim that completes a job does so under the job's lease token first: a unit whose lease
//!   was taken over ends [`Failure::Fenced`] and claims nothing.
//! - A commit whose answer was lost (the connection broke while committing) is settled by the
//!   guard row of the first key the unit claimed: the row holds the unit's token when the
//!   commit happened, and a row of another token, or none, means it did not.

use std::time::Duration;

use sqlx::Transaction;

use super::{Claim, Guard, check_claim};
use crate::error::{Error, JobError};
use crate::fingerprint::Fingerprint;
use crate::key::JobKey;
use crate::retry::contention_backoff;
use crate::store::queue::{Lease, QueueSql};
use crate::store::worker::CompletingClaim;
use crate::store::{
    Backend, ClaimRow, ClaimToken, GuardRecord, NewClaim, WorkerSql, WorkerStatements,
};
use jobguard_core::transient::Transient;

/// Why a unit did not commit, or could not say that it did.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Rolled back by contention (a serialization failure, a deadlock, a busy SQLite
    /// database), or a guard row that vanished between its conflict and its read: running the
    /// unit again may succeed.
    Contention(sqlx::Error),
    /// The connection broke before the commit, or the commit's answer was lost and no guard
    /// row of the unit can tell: run the unit again, on another connection.
    Connection(sqlx::Error),
    /// The commit did not happen, and another delivery's committed row holds the key.
    HeldElsewhere(GuardRecord),
    /// A job's lease was taken over: the unit completed and claimed nothing for it.
    Fenced,
    /// Anything else: the effect's error, a key reused with another payload, a statement the
    /// database refused, a lost commit whose witness could not be read.
    Failed(Error),
}

impl Failure {
    /// The failure an error of the guard's own statements stands for.
    pub(crate) fn of(error: Error) -> Self {
        match error {
            Error::Database(sqlx::Error::RowNotFound) => {
                Failure::Contention(sqlx::Error::RowNotFound)
            }
            Error::Database(db) => Failure::Failed(Error::Database(db)),
            Error::Fenced { .. } => Failure::Fenced,
            error => Failure::Failed(error),
        }
    }

    /// The failure a database error stands for on `DB`.
    pub(crate) fn database<DB: Backend>(error: sqlx::Error) -> Self {
        match DB::transient(&error) {
            Some(Transient::Contention) => Failure::Contention(error),
            Some(Transient::Connection) => Failure::Connection(error),
            None => Failure::Failed(Error::Database(error)),
        }
    }

    /// The failure of an effect that returned `error` for `key`: contention and broken
    /// connections are told apart from the job's own errors.
    pub(crate) fn effect<DB: Backend>(key: &JobKey, error: JobError) -> Self {
        let (source, fatal) = error.into_parts();
        match source.downcast::<sqlx::Error>() {
            Ok(db) => match DB::transient(&db) {
                Some(Transient::Contention) => Failure::Contention(*db),
                Some(Transient::Connection) => Failure::Connection(*db),
                None => Failure::Failed(Error::Effect {
                    key: key.to_string(),
                    fatal,
                    source: db,
                }),
            },
            Err(source) => Failure::Failed(Error::Effect {
                key: key.to_string(),
                fatal,
                source,
            }),
        }
    }

    /// The error a runner that settles by [`Error`] reports: contention and lost connections as
    /// the database errors they are (retryable), a key held elsewhere as a commit that did not
    /// happen.
    pub(crate) fn into_error(self) -> Error {
        match self {
            Failure::Contention(error) | Failure::Connection(error) => Error::Database(error),
            Failure::HeldElsewhere(_) => Error::Database(sqlx::Error::Protocol(
                "the commit did not happen: another delivery applied the key".into(),
            )),
            Failure::Fenced => {
                Error::Database(sqlx::Error::Protocol("the lease was taken over".into()))
            }
            Failure::Failed(error) => error,
        }
    }

    /// Whether running the unit again may succeed at once.
    pub(crate) fn runs_again(&self) -> bool {
        matches!(
            self,
            Failure::Contention(_) | Failure::Connection(_) | Failure::HeldElsewhere(_)
        )
    }

    /// Whether contention caused it: smaller batches make that rarer.
    pub(crate) fn is_contention(&self) -> bool {
        matches!(self, Failure::Contention(_))
    }

    /// The message a job's failure is recorded with, and whether it is fatal.
    pub(crate) fn message(&self) -> (String, bool) {
        match self {
            Failure::Failed(Error::Effect { source, fatal, .. }) => (source.to_string(), *fatal),
            Failure::Failed(error) => (error.to_string(), !error.is_retryable()),
            Failure::Contention(error) | Failure::Connection(error) => (error.to_string(), false),
            Failure::HeldElsewhere(_) => ("the key was applied by another delivery".into(), false),
            Failure::Fenced => ("the lease was taken over".into(), false),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message().0)
    }
}

/// The runs of a unit: again after contention or a lost connection, with a short backoff, up
/// to the guard's [`contention_attempts`](super::GuardConfig::contention_attempts).
pub(crate) struct Runs {
    limit: u32,
    done: u32,
}

impl Runs {
    pub(crate) fn new<DB: Backend>(guard: &Guard<DB>) -> Self {
        Runs {
            limit: guard.contention_attempts(),
            done: 1,
        }
    }

    /// Whether to run the unit again after `failure`; waits out the backoff when so.
    pub(crate) async fn again(&mut self, failure: &Failure) -> bool {
        if !failure.runs_again() || self.done >= self.limit {
            return false;
        }
        tracing::debug!(run = self.done, %failure, "rolled back by contention or a lost connection; running again");
        tokio::time::sleep(contention_backoff(self.done)).await;
        self.done += 1;
        true
    }

    /// How many times the unit ran.
    pub(crate) fn done(&self) -> u32 {
        self.done
    }
}

/// A job to complete under its lease while claiming its key.
pub(crate) struct Completing<'a> {
    pub(crate) key: &'a JobKey,
    pub(crate) fingerprint: Option<&'a Fingerprint>,
    pub(crate) lease: Lease,
}

/// The worker's statements with its guard's.
fn statements<'s, DB: Backend>(
    guard: &'s Guard<DB>,
    queue: &'s QueueSql,
    worker: &'s WorkerSql,
) -> WorkerStatements<'s> {
    WorkerStatements {
        guard: &guard.inner.sql,
        queue,
        worker,
    }
}

/// One guarded transaction; see the [module documentation](self).
pub(crate) struct UnitOfWork<'g, 'c, DB: Backend> {
    guard: &'g Guard<DB>,
    tx: Transaction<'c, DB>,
    /// The keys this unit claimed, with their tokens: the first is the witness of a lost commit.
    claimed: Vec<(JobKey, ClaimToken)>,
}

/// How long the check after a lost commit waits for a commit still in flight.
const WITNESS_TIMEOUT: Duration = Duration::from_secs(30);

impl<'g, DB: Backend> UnitOfWork<'g, 'static, DB> {
    /// A unit on a connection of the guard's pool.
    pub(crate) async fn begin(guard: &'g Guard<DB>) -> Result<Self, Failure> {
        let tx = DB::begin(guard.pool())
            .await
            .map_err(Failure::database::<DB>)?;
        Ok(UnitOfWork::on(guard, tx))
    }
}

impl<'g, 'c, DB: Backend> UnitOfWork<'g, 'c, DB> {
    /// A unit on `conn`, which the caller checked out (on SQLite holding its process's turn to
    /// write, taken before the connection).
    pub(crate) async fn begin_on(
        guard: &'g Guard<DB>,
        conn: &'c mut DB::Connection,
    ) -> Result<Self, Failure> {
        let tx = DB::begin_on(conn).await.map_err(Failure::database::<DB>)?;
        Ok(UnitOfWork::on(guard, tx))
    }

    fn on(guard: &'g Guard<DB>, tx: Transaction<'c, DB>) -> Self {
        UnitOfWork {
            guard,
            tx,
            claimed: Vec::new(),
        }
    }

    /// The unit's transaction, for the effects.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        &mut self.tx
    }

    /// Claims `key`: [`Claim::Claimed`] when this unit inserted its guard row, else the
    /// committed row that holds it (or this unit's own, for a key it claimed before). A key
    /// reused with another payload fails. Waits for a concurrent transaction holding the key.
    pub(crate) async fn claim(
        &mut self,
        key: &JobKey,
        fingerprint: Option<&Fingerprint>,
    ) -> Result<Claim, Failure> {
        let token = ClaimToken::new();
        let new = NewClaim {
            key: key.as_str(),
            kind: key.kind(),
            fingerprint,
            token: &token,
        };
        let row = DB::claim(&mut self.tx, &self.guard.inner.sql, &new)
            .await
            .map_err(Failure::database::<DB>)?;
        self.checked(key, fingerprint, row, token)
    }

    /// Completes the job of `job.lease` and claims its key, in one statement where the backend
    /// can; [`Failure::Fenced`] when the lease is no longer held (nothing was claimed then).
    pub(crate) async fn claim_completing(
        &mut self,
        queue: &QueueSql,
        worker: &WorkerSql,
        job: Completing<'_>,
    ) -> Result<Claim, Failure> {
        let token = ClaimToken::for_attempt(job.lease.job_id, job.lease.token);
        let claim = CompletingClaim {
            claim: NewClaim {
                key: job.key.as_str(),
                kind: job.key.kind(),
                fingerprint: job.fingerprint,
                token: &token,
            },
            lease: job.lease,
        };
        let row = DB::claim_completing(&mut self.tx, statements(self.guard, queue, worker), &claim)
            .await
            .map_err(Failure::database::<DB>)?;
        let Some(row) = row else {
            return Err(Failure::Fenced);
        };
        self.checked(job.key, job.fingerprint, row, token)
    }

    /// [`claim_completing`](Self::claim_completing) for a batch, in one statement on
    /// PostgreSQL: for each job, `None` when its lease is no longer held. A key claimed by an
    /// earlier job of the batch is a duplicate.
    pub(crate) async fn claim_completing_many(
        &mut self,
        queue: &QueueSql,
        worker: &WorkerSql,
        jobs: &[Completing<'_>],
    ) -> Result<Vec<Option<Claim>>, Failure> {
        let tokens: Vec<ClaimToken> = jobs
            .iter()
            .map(|job| ClaimToken::for_attempt(job.lease.job_id, job.lease.token))
            .collect();
        let claims: Vec<CompletingClaim<'_>> = jobs
            .iter()
            .zip(&tokens)
            .map(|(job, token)| CompletingClaim {
                claim: NewClaim {
                    key: job.key.as_str(),
                    kind: job.key.kind(),
                    fingerprint: job.fingerprint,
                    token,
                },
                lease: job.lease,
            })
            .collect();
        let rows =
            DB::claim_completing_many(&mut self.tx, statements(self.guard, queue, worker), &claims)
                .await
                .map_err(Failure::database::<DB>)?;
        drop(claims);
        let mut claims = Vec::with_capacity(jobs.len());
        for ((job, row), token) in jobs.iter().zip(rows).zip(tokens) {
            claims.push(match row {
                None => None,
                Some(row) => Some(self.checked(job.key, job.fingerprint, row, token)?),
            });
        }
        Ok(claims)
    }

    fn checked(
        &mut self,
        key: &JobKey,
        fingerprint: Option<&Fingerprint>,
        row: ClaimRow,
        token: ClaimToken,
    ) -> Result<Claim, Failure> {
        let claim = check_claim(key, fingerprint, row).map_err(Failure::of)?;
        if claim == Claim::Claimed {
            self.claimed.push((key.clone(), token));
        }
        Ok(claim)
    }

    /// Stores the value a claimed key's effect returned, so duplicates can return it.
    pub(crate) async fn store_result(
        &mut self,
        key: &JobKey,
        value: &serde_json::Value,
    ) -> Result<(), Failure> {
        DB::store_result(&mut self.tx, &self.guard.inner.sql, key.as_str(), value)
            .await
            .map_err(Failure::database::<DB>)
    }

    /// The keys this unit claimed, in order.
    pub(crate) fn claimed(&self) -> impl Iterator<Item = &JobKey> {
        self.claimed.iter().map(|(key, _)| key)
    }

    /// Commits the claims and the effects together. A commit whose answer was lost is settled
    /// by the guard row of the first key the unit claimed; with none claimed, or on SQLite,
    /// whose commit answers in process, it did not happen.
    pub(crate) async fn commit(self) -> Result<(), Failure> {
        let UnitOfWork { guard, tx, claimed } = self;
        let error = match tx.commit().await {
            Ok(()) => return Ok(()),
            Err(error) => match DB::transient(&error) {
                Some(Transient::Contention) => return Err(Failure::Contention(error)),
                // The session ended around the commit (the server terminated it, shut down, or
                // the link broke): whether it committed is settled by the witness below.
                Some(Transient::Connection) => error,
                // The server answered the commit with an error: it did not commit.
                None if matches!(error, sqlx::Error::Database(_)) => {
                    return Err(Failure::Failed(Error::Database(error)));
                }
                None => error,
            },
        };
        let Some((key, token)) = claimed.first().filter(|_| !DB::SINGLE_WRITER) else {
            return Err(Failure::Connection(error));
        };
        tracing::warn!(job.key = %key, %error, "the commit's answer was lost; checking the guard row");
        match guard.holder(key).await {
            Ok(Some(record)) if record.token.as_ref() == Some(token) => Ok(()),
            Ok(Some(record)) => Err(Failure::HeldElsewhere(record)),
            Ok(None) => Err(Failure::Connection(error)),
            Err(source) => Err(Failure::Failed(Error::OutcomeUnknown {
                key: key.to_string(),
                source,
            })),
        }
    }

    /// Rolls back now, rather than when the connection is next used: until then the
    /// transaction would hold what it locked. A failed rollback needs no handling: the
    /// connection is closed and the server discards the transaction.
    pub(crate) async fn rollback(self) {
        if let Err(error) = self.tx.rollback().await {
            tracing::debug!(%error, "rollback failed; the connection is dropped instead");
        }
    }
}

impl<DB: Backend> Guard<DB> {
    /// The committed row holding `key`, if any: the witness of whether a transaction whose
    /// commit failed with a lost connection did commit (the row holds its claim token) or not.
    ///
    /// Claiming the key in a new transaction waits for the old one if the server is still
    /// committing it: inserted means it rolled back, a conflict means it committed. A plain read
    /// could miss a commit that is still in flight.
    pub(crate) async fn holder(&self, key: &JobKey) -> sqlx::Result<Option<GuardRecord>> {
        let probe = async {
            let mut tx = DB::begin(&self.inner.pool).await?;
            let probe_token = ClaimToken::new();
            let new = NewClaim {
                key: key.as_str(),
                kind: key.kind(),
                fingerprint: None,
                token: &probe_token,
            };
            let record = match DB::claim(&mut tx, &self.inner.sql, &new).await? {
                ClaimRow::Held(record) => Some(record),
                ClaimRow::Claimed | ClaimRow::Vanished => None,
            };
            tx.rollback().await?;
            Ok::<_, sqlx::Error>(record)
        };
        tokio::time::timeout(WITNESS_TIMEOUT, probe)
            .await
            .unwrap_or_else(|_| {
                Err(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the guard row stayed locked while checking whether the commit happened",
                )))
            })
    }
}
