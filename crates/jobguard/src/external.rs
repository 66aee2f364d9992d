//! Effects outside the database, on APIs that accept an idempotency key.
//!
//! A job that charges a card cannot put the charge in its database transaction. What it can do
//! is give the payment API a key that names the operation, so the API itself drops a repeated
//! request: every delivery of `charge:order-8812` sends the same key, and the API answers the
//! second one with the charge it made for the first.
//!
//! [`ApiKey::derive`] turns a [`JobKey`] and a step name into that key, within the length and
//! alphabet the API accepts, and the same on every re-enqueue, redelivery and replay.
//! [`Guard::run_keyed`] then follows the order that keeps it safe: the API call first, outside
//! any transaction (a transaction held across a network call holds its guard row lock for as
//! long as the API takes), then the result recorded with the guard in one transaction.
//!
//! ```no_run
//! use jobguard::external::{ApiKey, ApiKeyFormat};
//! use jobguard::{JobError, JobKey, PgGuard};
//!
//! # struct Charge { id: String }
//! # async fn create_charge(amount: i64, idempotency_key: &str) -> Result<String, JobError> { todo!() }
//! # async fn f(guard: PgGuard) -> jobguard::Result<()> {
//! let key = JobKey::new("charge", ["order-8812"])?;
//! let api_key = ApiKey::derive(&key, "create-charge", ApiKeyFormat::STRIPE)?;
//! let outcome = guard
//!     .run_keyed(
//!         &key,
//!         &api_key,
//!         async |idempotency_key| create_charge(4200, idempotency_key).await,
//!         async |conn, charge_id: &String| {
//!             sqlx::query("update orders set charge_id = $1 where id = 'order-8812'")
//!                 .bind(charge_id)
//!                 .execute(&mut *conn)
//!                 .await?;
//!             Ok(())
//!         },
//!     )
//!     .await?;
//! // The charge made by this delivery, or the one the first delivery recorded.
//! let charge_id: Option<String> = outcome.into_value();
//! assert!(charge_id.is_some());
//! # Ok(()) }
//! ```
//!
//! For APIs without idempotency keys, see [`Steps`](crate::steps::Steps); for messages the job
//! publishes itself, the [`outbox`](crate::outbox).

use std::fmt;
use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, JobError, Result, effect_error};
use crate::guard::{Guard, Outcome};
use crate::key::{JobKey, KeyError};
use crate::store::Backend;

#[doc(inline)]
pub use jobguard_core::api_key::KeyAlphabet;

use jobguard_core::api_key as core;

/// The idempotency keys an API accepts: at most `max_len` characters from an alphabet.
///
/// ```
/// use jobguard::external::{ApiKeyFormat, KeyAlphabet};
///
/// assert_eq!(ApiKeyFormat::STRIPE.max_len(), 255);
/// let strict = ApiKeyFormat::new(40, KeyAlphabet::Alphanumeric)?;
/// assert_eq!(strict.max_len(), 40);
/// assert!(ApiKeyFormat::new(16, KeyAlphabet::Printable).is_err());
/// # Ok::<(), jobguard::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ApiKeyFormat(core::ApiKeyFormat);

impl ApiKeyFormat {
    /// Stripe's keys: up to 255 visible ASCII characters.
    pub const STRIPE: ApiKeyFormat = ApiKeyFormat(core::ApiKeyFormat::STRIPE);

    /// A format of at most `max_len` characters from `alphabet`.
    ///
    /// `max_len` must leave room for the 32-character hash a key falls back to, so formats
    /// shorter than 32 characters are refused with [`Error::ApiKeyFormat`].
    pub fn new(max_len: usize, alphabet: KeyAlphabet) -> Result<Self> {
        core::ApiKeyFormat::new(max_len, alphabet)
            .map(ApiKeyFormat)
            .map_err(|error| Error::ApiKeyFormat {
                reason: error.reason,
            })
    }

    /// The longest key the API accepts.
    pub fn max_len(&self) -> usize {
        self.0.max_len()
    }

    /// The characters the API accepts.
    pub fn alphabet(&self) -> KeyAlphabet {
        self.0.alphabet()
    }
}

/// An idempotency key for one step of a job on an external API.
///
/// Derived from the job key and a step name only, so every delivery, re-enqueue and replay of
/// the job sends the same key, and two steps of one job (`create-charge`, `send-receipt`) send
/// different ones. The derivation lives in `jobguard-core`, shared with the Python package.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ApiKey(core::ApiKey);

impl ApiKey {
    /// Derives the key for `step` of the job `key`, within `format`.
    ///
    /// The readable form `<job key>:<step>` is used when it fits the format; otherwise the key
    /// is a readable prefix followed by 32 hex digits of a BLAKE3 hash of the readable form.
    /// The mapping is deterministic and injective: a readable key always contains `:` and a
    /// hashed one never does, and the hash covers the whole readable form.
    ///
    /// `step` follows the rules of a job kind (an ASCII letter, then letters, digits, `_`, `-`
    /// or `.`); anything else is a [`KeyError`].
    ///
    /// ```
    /// use jobguard::JobKey;
    /// use jobguard::external::{ApiKey, ApiKeyFormat, KeyAlphabet};
    ///
    /// let key = JobKey::new("charge", ["order-8812"])?;
    /// let stripe = ApiKey::derive(&key, "create-charge", ApiKeyFormat::STRIPE)?;
    /// assert_eq!(stripe.as_str(), "charge:order-8812:create-charge");
    ///
    /// let strict = ApiKeyFormat::new(40, KeyAlphabet::Alphanumeric)?;
    /// let short = ApiKey::derive(&key, "create-charge", strict)?;
    /// assert_eq!(short.as_str().len(), 40);
    /// assert!(short.as_str().chars().all(|c| c.is_ascii_alphanumeric()));
    /// assert_eq!(short, ApiKey::derive(&key, "create-charge", strict)?);
    /// # Ok::<(), jobguard::Error>(())
    /// ```
    pub fn derive(key: &JobKey, step: &str, format: ApiKeyFormat) -> Result<ApiKey, KeyError> {
        core::ApiKey::derive(key, step, format.0).map(ApiKey)
    }

    /// The key to send to the API.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for ApiKey {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl<DB: Backend> Guard<DB> {
    /// Calls an external API with an idempotency key, then records its result with the guard.
    ///
    /// 1. If the key was already recorded, returns [`Outcome::Duplicate`] with the recorded
    ///    result and calls nothing.
    /// 2. Otherwise `call` runs with `api_key`, outside any transaction.
    /// 3. Then `record` runs in one transaction with the guard row for `key`, and the result is
    ///    stored in that row: both commit or neither does.
    ///
    /// A worker that dies between 2 and 3 leaves nothing recorded; the redelivery calls again
    /// with the same key, the API answers with the original result, and that is what gets
    /// recorded. Concurrent deliveries all call with the same key, so the API makes one effect,
    /// and one of them records it; the others report a duplicate. The guarantee is the API's:
    /// one effect per key for as long as the API remembers keys (24 hours at Stripe), so keep
    /// the job's retry and replay horizon shorter than that.
    ///
    /// An error from `call` or `record` becomes [`Error::Effect`], retryable unless the
    /// [`JobError`] was fatal; nothing is recorded.
    pub async fn run_keyed<T, C, R>(
        &self,
        key: &JobKey,
        api_key: &ApiKey,
        call: C,
        mut record: R,
    ) -> Result<Outcome<T>>
    where
        T: Serialize + DeserializeOwned + Clone + Send + Sync,
        C: AsyncFnOnce(&str) -> Result<T, JobError>,
        R: AsyncFnMut(&mut DB::Connection, &T) -> Result<(), JobError> + Send,
    {
        if let Some(recorded) = self.lookup(key).await? {
            let duplicate = crate::guard::duplicate_of(key, recorded)?;
            crate::spikes::record_outcome(key.kind(), "duplicate");
            return Ok(Outcome::Duplicate(duplicate));
        }
        let value = match call(api_key.as_str()).await {
            Ok(value) => value,
            Err(error) => {
                crate::spikes::record_outcome(key.kind(), "failed");
                return Err(effect_error(key, error));
            }
        };
        // `move`: a closure borrowing locals makes the future !Send to rustc
        // (rust-lang/rust#110338), and workers spawn it.
        self.run(key, async move |conn| {
            record(conn, &value).await?;
            Ok(value.clone())
        })
        .await
    }
}

/// A kind of job whose effect is a call to an external API that accepts an idempotency key,
/// for the [`Worker`](crate::Worker).
///
/// The worker runs it in two stages, as [`Guard::run_keyed`] does:
///
/// 1. [`call`](ExternalJob::call), outside any transaction and holding no connection, with
///    the [`ApiKey`] derived from the job key and [`STEP`](ExternalJob::STEP). Heartbeats keep
///    the job's lease while the API answers. A job whose key is already recorded skips it.
/// 2. [`record`](ExternalJob::record), in the transaction that claims the job key and
///    completes the job, all committed together.
///
/// A worker that dies between the stages leaves the job to be delivered again; the next
/// delivery calls with the same API key, and the API answers with the original result.
///
/// `Context` is shared state the call needs (an HTTP client, credentials), given once to
/// [`Worker::register_external`](crate::Worker::register_external).
///
/// ```no_run
/// use jobguard::external::{ApiKey, ExternalJob};
/// use jobguard::{JobError, JobKey, KeyError};
/// use serde::{Deserialize, Serialize};
/// use sqlx::PgConnection;
///
/// #[derive(Serialize, Deserialize)]
/// struct ChargeOrder {
///     order: String,
///     amount: i64,
/// }
///
/// # struct Payments;
/// # impl Payments { async fn charge(&self, _: i64, _: &str) -> Result<String, std::io::Error> { todo!() } }
/// impl ExternalJob<sqlx::Postgres> for ChargeOrder {
///     const KIND: &'static str = "charge";
///     const STEP: &'static str = "create-charge";
///     type Context = Payments;
///     type Output = String;
///
///     fn key(&self) -> Result<JobKey, KeyError> {
///         JobKey::new("charge", [&self.order])
///     }
///
///     async fn call(&self, payments: &Payments, api_key: &ApiKey) -> Result<String, JobError> {
///         Ok(payments.charge(self.amount, api_key.as_str()).await?)
///     }
///
///     async fn record(
///         &self,
///         _payments: &Payments,
///         conn: &mut PgConnection,
///         charge_id: &String,
///     ) -> Result<(), JobError> {
///         sqlx::query("update orders set charge_id = $1 where id = $2")
///             .bind(charge_id)
///             .bind(&self.order)
///             .execute(conn)
///             .await?;
///         Ok(())
///     }
/// }
/// ```
pub trait ExternalJob<DB: Backend>: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The kind the job is enqueued and registered under.
    const KIND: &'static str;
    /// The step name the API key is derived with; give each API a job calls its own.
    const STEP: &'static str = "call";
    /// The idempotency keys the API accepts.
    const API_KEY_FORMAT: ApiKeyFormat = ApiKeyFormat::STRIPE;

    /// What the call needs besides the payload, shared by every job of the kind.
    type Context: Send + Sync + 'static;
    /// What the API answers, handed to [`record`](ExternalJob::record).
    type Output: Send + Sync + 'static;

    /// The job's key, derived from the business operation, e.g. `charge:order-8812`.
    fn key(&self) -> Result<JobKey, KeyError>;

    /// Calls the API with `api_key`, outside any transaction.
    fn call(
        &self,
        context: &Self::Context,
        api_key: &ApiKey,
    ) -> impl Future<Output = Result<Self::Output, JobError>> + Send;

    /// Records the API's answer on the transaction that commits it with the guard row and the
    /// job's completion.
    fn record(
        &self,
        context: &Self::Context,
        conn: &mut DB::Connection,
        output: &Self::Output,
    ) -> impl Future<Output = Result<(), JobError>> + Send;
}
