//! What the [`Worker`](crate::Worker) and the broker consumer share when they run a job: the
//! registry that turns a kind and a payload into a runnable job, and the capture of a job's
//! panic as its failure.
//!
//! Each runner erases the job's type behind its own trait (the worker's jobs have a stage
//! before the transaction, the consumer's run under [`Guard::run`](crate::Guard::run)); the
//! registry is generic over it, so the lookup, the decoding and their error messages are
//! written once. Both runners refuse a kind nobody registered with the same message, naming
//! themselves: "unknown job kind `credit`: no handler is registered for it in this worker".
//!
//! ```no_run
//! # use jobguard::{Job, JobError, JobKey, KeyError, Queue, Worker};
//! # #[derive(serde::Serialize, serde::Deserialize)]
//! # struct Credit { order: String }
//! # impl Job<sqlx::Postgres> for Credit {
//! #     const KIND: &'static str = "credit";
//! #     fn key(&self) -> Result<JobKey, KeyError> { JobKey::new("credit", [&self.order]) }
//! #     async fn run(&self, _: &mut sqlx::PgConnection) -> Result<(), JobError> { Ok(()) }
//! # }
//! # async fn f(queue: Queue<sqlx::Postgres>) -> jobguard::Result<()> {
//! // One registration per kind; the worker decodes each stored payload through it.
//! let worker = Worker::new(queue)?.register::<Credit>();
//! # drop(worker);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt as _;
use serde_json::Value;

/// Decodes a payload into a runnable job of one kind.
type Decoder<R> = Arc<dyn Fn(&Value) -> Result<Box<R>, serde_json::Error> + Send + Sync>;

/// The job kinds a runner can run, each with the decoder of its payload.
pub(crate) struct Registry<R: ?Sized> {
    decoders: HashMap<String, Decoder<R>>,
}

impl<R: ?Sized> Default for Registry<R> {
    fn default() -> Self {
        Registry {
            decoders: HashMap::new(),
        }
    }
}

impl<R: ?Sized> Registry<R> {
    /// Runs jobs of `kind` as what `decode` makes of their payload; a later registration of
    /// the same kind replaces an earlier one.
    pub(crate) fn insert(
        &mut self,
        kind: &str,
        decode: impl Fn(&Value) -> Result<Box<R>, serde_json::Error> + Send + Sync + 'static,
    ) {
        self.decoders.insert(kind.to_owned(), Arc::new(decode));
    }

    /// The registered kinds, in no order.
    pub(crate) fn kinds(&self) -> Vec<String> {
        self.decoders.keys().cloned().collect()
    }

    /// Whether a handler for `kind` is registered.
    pub(crate) fn contains(&self, kind: &str) -> bool {
        self.decoders.contains_key(kind)
    }

    /// The runnable job for `kind` and `payload`, or why it can never run. `runner` names who
    /// asks ("worker", "consumer"), for the message.
    pub(crate) fn decode(
        &self,
        kind: &str,
        payload: &Value,
        runner: &str,
    ) -> Result<Box<R>, String> {
        let Some(decode) = self.decoders.get(kind) else {
            return Err(format!(
                "unknown job kind `{kind}`: no handler is registered for it in this {runner}"
            ));
        };
        decode(payload).map_err(|error| {
            format!("the payload does not deserialize into a `{kind}` job: {error}")
        })
    }
}

/// Runs `work`, turning a panic in it into a failure of the job: `the job panicked: ...`.
pub(crate) async fn catch_panic<F: Future>(work: F) -> Result<F::Output, String> {
    AssertUnwindSafe(work)
        .catch_unwind()
        .await
        .map_err(|panic| format!("the job panicked: {}", panic_message(&*panic)))
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned())
}

/// Logs a task that panicked outside the job's own panic capture.
pub(crate) fn log_join(joined: Result<(), tokio::task::JoinError>, what: &'static str) {
    if let Err(error) = joined
        && error.is_panic()
    {
        tracing::error!(%error, "{what}");
    }
}
