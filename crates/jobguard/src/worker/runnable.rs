//! The worker's registered kinds: a stored payload decoded into a job whose type is erased,
//! with the stage before the transaction that an [`ExternalJob`] has.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde_json::Value;

use crate::error::JobError;
use crate::external::{ApiKey, ExternalJob};
use crate::job::Job;
use crate::key::JobKey;
use crate::store::Backend;

/// A decoded job, its type erased.
pub(super) trait Runnable<DB: Backend>: Send + Sync {
    /// The stage before the transaction, for jobs that have one.
    fn call<'a>(&'a self, _key: &'a JobKey) -> Option<BoxFuture<'a, Result<(), JobError>>> {
        None
    }

    fn run<'a>(&'a self, conn: &'a mut DB::Connection) -> BoxFuture<'a, Result<(), JobError>>;
}

impl<DB: Backend, J: Job<DB>> Runnable<DB> for J {
    fn run<'a>(&'a self, conn: &'a mut DB::Connection) -> BoxFuture<'a, Result<(), JobError>> {
        Box::pin(Job::run(self, conn))
    }
}

/// Decodes a stored payload as `J`.
pub(super) fn decode_job<DB: Backend, J: Job<DB>>(
    payload: &Value,
) -> Result<Box<dyn Runnable<DB>>, serde_json::Error> {
    Ok(Box::new(J::deserialize(payload)?))
}

/// Decodes a stored payload as the external job `J`, to run with `context`.
pub(super) fn external_decoder<DB: Backend, J: ExternalJob<DB>>(
    context: J::Context,
) -> impl Fn(&Value) -> Result<Box<dyn Runnable<DB>>, serde_json::Error> + Send + Sync + 'static {
    let context = Arc::new(context);
    move |payload| {
        Ok(Box::new(Called::<J, DB> {
            job: J::deserialize(payload)?,
            context: Arc::clone(&context),
            output: Mutex::new(None),
        }))
    }
}

/// An [`ExternalJob`] and, once its call returned, the API's answer for its transaction.
struct Called<J: ExternalJob<DB>, DB: Backend> {
    job: J,
    context: Arc<J::Context>,
    output: Mutex<Option<Arc<J::Output>>>,
}

impl<DB: Backend, J: ExternalJob<DB>> Runnable<DB> for Called<J, DB> {
    fn call<'a>(&'a self, key: &'a JobKey) -> Option<BoxFuture<'a, Result<(), JobError>>> {
        Some(Box::pin(async move {
            let api_key = ApiKey::derive(key, J::STEP, J::API_KEY_FORMAT)
                .map_err(|error| JobError::from(error).into_fatal())?;
            let output = self.job.call(&self.context, &api_key).await?;
            *self.output.lock().expect("not poisoned") = Some(Arc::new(output));
            Ok(())
        }))
    }

    fn run<'a>(&'a self, conn: &'a mut DB::Connection) -> BoxFuture<'a, Result<(), JobError>> {
        Box::pin(async move {
            let output = self.output.lock().expect("not poisoned").clone();
            let Some(output) = output else {
                return Err(JobError::msg(
                    "the job's API call has not run; it runs again",
                ));
            };
            self.job.record(&self.context, conn, &output).await
        })
    }
}
