//! The error type shared by every part of jobguard.

use std::error::Error as StdError;
use std::fmt;

use crate::key::{JobKey, KeyError};

/// `Result` with jobguard's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while guarding a job.
///
/// Variants that come from a caller's mistake (a malformed key, a key reused for other work, a
/// bad table name) carry what is needed to fix it. None of them leaves a half-applied job behind:
/// whenever an error is returned from [`Guard::run`](crate::Guard::run), the guard row and the
/// job's effect were rolled back together, except for [`Error::OutcomeUnknown`], which says so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The job key is malformed.
    #[error(transparent)]
    Key(#[from] KeyError),

    /// A table or schema name is not a plain SQL identifier.
    #[error(
        "invalid {what} name `{name}`: use 1 to 63 ASCII letters, digits and underscores, \
         starting with a letter or underscore"
    )]
    InvalidName {
        /// What the name was for: `table` or `schema`.
        what: &'static str,
        /// The rejected name.
        name: String,
    },

    /// A periodic schedule cannot run: its cron expression, time zone, kind or payload is
    /// wrong. Refused when the schedule is made or when the worker starts, before any firing
    /// is enqueued.
    #[error("schedule `{schedule}`: {reason}")]
    InvalidSchedule {
        /// The schedule's name.
        schedule: String,
        /// What is wrong and what is accepted.
        reason: String,
    },

    /// The key was first applied with a different payload.
    ///
    /// Nothing was applied. Either the producer derived the same key for different work (derive
    /// a key that names the operation exactly), or the payload changed between deliveries.
    #[error(
        "job key `{key}` was already used with a different payload: nothing was applied; \
         give different work its own key, or deliver the original payload"
    )]
    KeyReused {
        /// The reused key.
        key: String,
    },

    /// A unique-job policy given at enqueue is not valid: an unknown state, a list of states
    /// without both live ones, a zero or fractional period, an unknown on-conflict action.
    #[error("invalid unique {setting} `{given}`: {reason}")]
    InvalidUnique {
        /// What was invalid: `states`, `period` or `on-conflict action`.
        setting: &'static str,
        /// What was given.
        given: String,
        /// Why, and what to give instead.
        reason: String,
    },

    /// An enqueue whose policy rejects conflicts found a job holding its key: nothing was
    /// enqueued.
    #[error("{}", jobguard_core::unique::rejected(.key, *.existing_id, .state))]
    EnqueueRejected {
        /// The key as stored, with any queue and period appended.
        key: String,
        /// The job that holds the key.
        existing_id: i64,
        /// Its state when the enqueue found it.
        state: String,
    },

    /// An enqueue whose policy replaces a waiting job or else rejects
    /// ([`OnConflict::ReplaceOrReject`](crate::unique::OnConflict::ReplaceOrReject)) found the
    /// job holding its key no longer waiting: a worker holds it, or it finished. That job keeps
    /// its payload; nothing was enqueued or replaced.
    #[error("{}", jobguard_core::unique::replace_rejected(.key, *.existing_id, .state))]
    ReplaceRejected {
        /// The key as stored, with any queue and period appended.
        key: String,
        /// The job that holds the key.
        existing_id: i64,
        /// Its state when the enqueue found it: `running` while a worker holds it.
        state: String,
    },

    /// The payload could not be turned into JSON for its fingerprint.
    #[error("the payload of job `{key}` cannot be serialized to JSON: {source}")]
    Payload {
        /// The job key.
        key: String,
        /// Why serialization failed.
        #[source]
        source: serde_json::Error,
    },

    /// A payload the queue cannot store.
    #[error("the payload of job `{key}` cannot be enqueued: {reason}")]
    InvalidPayload {
        /// The job key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A job of a batch cannot be enqueued (its key or payload breaks the rules); nothing of
    /// the batch was enqueued.
    #[error("job {index} of the batch cannot be enqueued, so none of the batch was: {source}")]
    InvalidBatchJob {
        /// The job's position in the batch, from 0.
        index: usize,
        /// What is wrong with it.
        #[source]
        source: Box<Error>,
    },

    /// An outbox topic that is not a plain name.
    #[error(
        "invalid outbox topic `{topic}`: use 1 to 200 ASCII letters, digits, `.`, `_` and `-`, \
         starting with a letter or digit"
    )]
    InvalidTopic {
        /// The rejected topic.
        topic: String,
    },

    /// An outbox message that cannot be published. Nothing was written.
    #[error("outbox message `{id}` cannot be published: {reason}")]
    InvalidMessage {
        /// The message id.
        id: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The message id was already published with a different payload. Nothing was written.
    ///
    /// A message id is derived from the job key and the topic, so a job that publishes two
    /// different messages to one topic must give each its own key.
    #[error(
        "outbox message `{id}` was already published with a different payload: nothing was \
         written; publish each message of a job under a key of its own (e.g. \
         `JobKey::new(\"invoice-line\", [order, line])`), or publish the original payload"
    )]
    MessageReused {
        /// The message id.
        id: String,
    },

    /// A setting is out of range.
    #[error("invalid {setting}: {reason}")]
    InvalidConfig {
        /// The setting, e.g. `relay batch size`.
        setting: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },

    /// Another relay holds the lease on the outbox and is delivering its messages.
    #[error(
        "another relay holds the lease on outbox `{table}` and is delivering its messages; one \
         relay delivers an outbox at a time, and a relay that died lets go when its lease runs out"
    )]
    RelayLeaseHeld {
        /// The outbox table.
        table: String,
    },

    /// The job's lease is no longer held: it expired and the job was handed out again, or it
    /// was released. Whatever this worker did in the transaction must roll back.
    #[error(
        "the lease on attempt {attempt} of job {job_id} is no longer held (it expired and the \
         job was handed out again); roll back, the current holder runs the job"
    )]
    Fenced {
        /// The job's id.
        job_id: i64,
        /// The attempt whose lease was lost.
        attempt: i32,
    },

    /// The job's effect returned an error. The guard row was rolled back with the effect, so a
    /// later delivery of the same key applies it.
    #[error("the effect of job `{key}` failed and was rolled back{}: {source}",
        if *.fatal { " (fatal: retrying will not help)" } else { ", a retry will apply it" })]
    Effect {
        /// The job key.
        key: String,
        /// Whether the effect marked the error as fatal, see [`JobError::fatal`].
        fatal: bool,
        /// The error the effect returned.
        #[source]
        source: Box<dyn StdError + Send + Sync + 'static>,
    },

    /// The value the job returned could not be stored, or a stored value could not be read back
    /// as the type the job returns now.
    #[error("the stored result of job `{key}` does not match the job's result type: {source}")]
    StoredResult {
        /// The job key.
        key: String,
        /// The serialization error.
        #[source]
        source: serde_json::Error,
    },

    /// The transaction kept failing with serialization failures or deadlocks.
    #[error(
        "job `{key}` hit {attempts} serialization failures or deadlocks in a row and was rolled \
         back each time; lower contention on the rows its effect writes, then retry"
    )]
    Contention {
        /// The job key.
        key: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last database error.
        #[source]
        source: sqlx::Error,
    },

    /// The connection failed while committing and the guard row could not be checked afterwards,
    /// so whether the job was applied is unknown. Deliver the job again: the guard makes the
    /// redelivery apply it if it was not, and report a duplicate if it was.
    #[error(
        "the commit of job `{key}` failed and its guard row could not be checked, so whether it \
         was applied is unknown; deliver it again and the guard settles it: {source}"
    )]
    OutcomeUnknown {
        /// The job key.
        key: String,
        /// The error from the witness check.
        #[source]
        source: sqlx::Error,
    },

    /// An idempotency-key format an API cannot be served with.
    #[error("invalid idempotency-key format: {reason}")]
    ApiKeyFormat {
        /// What is wrong with it.
        reason: String,
    },

    /// Another delivery started this external step and its lease has not expired: it may be
    /// calling the API right now. Nothing was called; deliver again after `retry_after`.
    #[error(
        "step `{step}` of job `{key}` was started by another delivery whose lease runs for \
         {retry_after:?} more; nothing was called, deliver again later"
    )]
    StepInFlight {
        /// The job key.
        key: String,
        /// The step name.
        step: String,
        /// How long the other delivery's lease still runs.
        retry_after: std::time::Duration,
    },

    /// An external step was started, its caller vanished, and the reconciler could not tell
    /// whether the effect happened. The step is marked and never called again by itself: look
    /// at the external system, then settle it with [`Steps::resolve`](crate::steps::Steps::resolve).
    #[error(
        "step `{step}` of job `{key}` needs attention: it may or may not have taken effect \
         ({reason}); check the external system and resolve the step, it will not be called again \
         until then"
    )]
    StepNeedsAttention {
        /// The job key.
        key: String,
        /// The step name.
        step: String,
        /// What the reconciler reported.
        reason: String,
    },

    /// A message broker failed an operation: connecting, declaring a queue or stream,
    /// receiving, acknowledging or publishing. A message whose acknowledgement failed is
    /// delivered again, and the guard reports the redelivery as a duplicate.
    #[error("{broker}: cannot {action}: {source}")]
    Broker {
        /// The broker: `rabbitmq`, `nats` or `redis`.
        broker: &'static str,
        /// What was being done, e.g. `connect to amqp://127.0.0.1:5672`.
        action: String,
        /// The broker client's error.
        #[source]
        source: Box<dyn StdError + Send + Sync + 'static>,
    },

    /// A broker message's envelope carries a key other than the one its job derives from its
    /// payload. Nothing was applied and the message was dead-lettered: a producer that builds
    /// envelopes by hand with a fresh key per publish would otherwise apply each copy once.
    #[error(
        "the envelope of a `{kind}` job carries the key `{envelope}`, but the job derives \
         `{derived}` from its payload: nothing was applied; build envelopes with \
         `Envelope::for_job` so that every copy of a message carries the key its job derives"
    )]
    EnvelopeKeyMismatch {
        /// The job kind.
        kind: String,
        /// The key the envelope carried.
        envelope: String,
        /// The key the job derives from the envelope's payload.
        derived: String,
    },

    /// The guard's retention is shorter than the time within which a duplicate can still
    /// arrive: a duplicate delivered after the retention would find its key pruned and apply
    /// again. Nothing was pruned and the worker did not start.
    #[error(
        "guard retention {} is shorter than the horizon within which a duplicate can still \
         arrive, {breakdown}: a duplicate delivered after {} would find its key pruned and apply \
         again; keep guard rows for at least {}, or shorten the retry policy, the lease or the \
         declared windows, or override the check if you accept duplicates after {}",
        crate::duration::format_duration(*.retention),
        crate::duration::format_duration(*.retention),
        crate::duration::format_duration(*.horizon),
        crate::duration::format_duration(*.retention)
    )]
    RetentionTooShort {
        /// How long guard rows would be kept.
        retention: std::time::Duration,
        /// The longest time a duplicate can still arrive.
        horizon: std::time::Duration,
        /// The horizon term by term, as in `7d 15m 13s (retries 10m 13s + leases 5m + ...)`.
        breakdown: String,
    },

    /// A job that calls an external API with an idempotency key can still be repeated (retried,
    /// or replayed within the replay window and retried again) after the provider has forgotten
    /// the key, and would then take effect twice (a second charge). Nothing was pruned and the
    /// worker did not start.
    #[error(
        "provider key lifetime {} is not longer than the horizon of a keyed external job, \
         {breakdown}: a job repeated after {} finds its idempotency key forgotten by the provider \
         and takes effect again; shorten the replay window {} (to at most {} with these retries \
         and leases) or the retry policy and lease, or declare the provider key lifetime 0s if \
         no job calls a keyed external API",
        crate::duration::format_duration(*.provider_key_lifetime),
        crate::duration::format_duration(*.provider_key_lifetime),
        crate::duration::format_duration(*.replay_window),
        crate::duration::format_duration(*.replay_window_fits)
    )]
    ProviderKeyLifetimeTooShort {
        /// How long the provider keeps an idempotency key, as declared.
        provider_key_lifetime: std::time::Duration,
        /// The longest time after its first attempt that a keyed job can still be repeated.
        horizon: std::time::Duration,
        /// The horizon term by term.
        breakdown: String,
        /// The declared replay window.
        replay_window: std::time::Duration,
        /// The longest replay window that would fit under the provider key lifetime, with the
        /// same retries and leases (zero when even those do not fit).
        replay_window_fits: std::time::Duration,
    },

    /// Dead jobs would be deleted before the replay window ends, so a dead job could no longer
    /// be replayed within the window the retention was computed for. Nothing was pruned and
    /// the worker did not start.
    #[error(
        "dead-job retention {} is shorter than the replay window {}: a dead job deleted before \
         the window ends can no longer be replayed; keep dead jobs at least {}, or shorten the \
         replay window",
        crate::duration::format_duration(*.keep_dead),
        crate::duration::format_duration(*.replay_window),
        crate::duration::format_duration(*.replay_window)
    )]
    DeadRetentionTooShort {
        /// How long dead jobs would be kept.
        keep_dead: std::time::Duration,
        /// How long a dead job may be replayed, as declared.
        replay_window: std::time::Duration,
    },

    /// No job has this id: it never existed, or it was deleted or pruned. Nothing changed.
    #[error("no job has id {id}: it never existed, or it was deleted or pruned")]
    JobNotFound {
        /// The id asked for.
        id: i64,
    },

    /// The job is not in a state the operator's action applies to (cancelling a running job,
    /// retrying a completed one). Nothing changed; the reason says what would.
    #[error("job {id} cannot be {action}: {reason}")]
    JobConflict {
        /// The job's id.
        id: i64,
        /// What was asked: `retried`, `cancelled` or `deleted`.
        action: &'static str,
        /// Why not, and what to do instead.
        reason: String,
    },

    /// Any other database error. Nothing was applied.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl Error {
    /// Whether delivering the same job again may succeed.
    ///
    /// True for failed effects, contention, unknown outcomes and database errors; false for
    /// mistakes in the key, payload or configuration, which fail the same way every time.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Effect { fatal, .. } => !fatal,
            Error::Contention { .. }
            | Error::OutcomeUnknown { .. }
            | Error::StepInFlight { .. }
            | Error::Database(_) => true,
            _ => false,
        }
    }
}

/// The error a job's effect returns.
///
/// Any error type converts into it with `?`, so an effect can use `sqlx` and its own errors
/// freely. It is retryable unless built with [`JobError::fatal`]: a fatal error says that no
/// redelivery can succeed (the order does not exist, the payload is invalid).
///
/// ```
/// use jobguard::JobError;
///
/// let retry: JobError = std::io::Error::other("upstream timed out").into();
/// assert!(retry.is_retryable());
/// let fatal = JobError::fatal("order 8812 does not exist");
/// assert!(!fatal.is_retryable());
/// ```
pub struct JobError {
    source: Box<dyn StdError + Send + Sync + 'static>,
    fatal: bool,
}

impl JobError {
    /// A retryable error with a message.
    pub fn msg(message: impl fmt::Display) -> Self {
        JobError {
            source: message.to_string().into(),
            fatal: false,
        }
    }

    /// An error that no redelivery can fix.
    pub fn fatal(message: impl fmt::Display) -> Self {
        JobError {
            source: message.to_string().into(),
            fatal: true,
        }
    }

    /// Marks any error as fatal.
    pub fn into_fatal(mut self) -> Self {
        self.fatal = true;
        self
    }

    /// Whether a redelivery may succeed.
    pub fn is_retryable(&self) -> bool {
        !self.fatal
    }

    /// The underlying error, to downcast.
    pub fn inner(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.source
    }

    /// The database error inside, if the effect failed on the database.
    pub fn as_database_error(&self) -> Option<&sqlx::Error> {
        self.source.downcast_ref::<sqlx::Error>()
    }
}

impl<E: StdError + Send + Sync + 'static> From<E> for JobError {
    fn from(error: E) -> Self {
        JobError {
            source: Box::new(error),
            fatal: false,
        }
    }
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobError")
            .field("source", &self.source)
            .field("fatal", &self.fatal)
            .finish()
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl JobError {
    // `JobError` cannot implement `std::error::Error` (the blanket `From` above would then
    // overlap with `From<T> for T`), so `Error::Effect` keeps its parts instead.
    pub(crate) fn into_parts(self) -> (Box<dyn StdError + Send + Sync + 'static>, bool) {
        (self.source, self.fatal)
    }
}

/// A job's own error as the [`Error::Effect`] of the job with `key`.
pub(crate) fn effect_error(key: &JobKey, error: JobError) -> Error {
    let (source, fatal) = error.into_parts();
    Error::Effect {
        key: key.to_string(),
        fatal,
        source,
    }
}
