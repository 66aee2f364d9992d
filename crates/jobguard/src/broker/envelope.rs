//! The envelope a job travels in through a broker: its kind, its key and its payload.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::job::Job;
use crate::key::JobKey;
use crate::store::Backend;

/// A job as a broker carries it: the body of a RabbitMQ, JetStream or SQS message, and the
/// `body` field of a Redis Streams entry, as one JSON object.
///
/// ```json
/// {"kind": "credit", "key": "credit:order-8812", "payload": {"order": "order-8812", "account": 7, "amount": 500}}
/// ```
///
/// - `kind` names the [`Job`] the consumer runs it as (its [`Job::KIND`]);
/// - `key` is the job key the guard claims, derived by the producer from the business
///   operation, so every copy of the message, however it was produced, carries the same one;
/// - `payload` deserializes into the job type; the guard records its fingerprint with the key,
///   so the same key arriving with another payload is refused rather than silently skipped.
///
/// Other fields are ignored, so that producers of a newer version can add some.
///
/// Build it with [`Envelope::for_job`] so that the key is the one the job derives, and publish
/// it with the broker's sink (`RabbitSink::publish`, `NatsSink::publish`,
/// `RedisSink::publish`, `SqsSink::publish`), which also stamp the key as the broker's message
/// id.
///
/// ```
/// use jobguard::broker::Envelope;
/// use jobguard::{Job, JobError, JobKey, KeyError};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Credit { order: String, account: i64, amount: i64 }
///
/// impl Job<sqlx::Postgres> for Credit {
///     const KIND: &'static str = "credit";
///     fn key(&self) -> Result<JobKey, KeyError> { JobKey::new("credit", [&self.order]) }
///     async fn run(&self, _conn: &mut sqlx::PgConnection) -> Result<(), JobError> { Ok(()) }
/// }
///
/// let credit = Credit { order: "order-8812".into(), account: 7, amount: 500 };
/// let envelope = Envelope::for_job::<sqlx::Postgres, _>(&credit)?;
/// assert_eq!(envelope.key.as_str(), "credit:order-8812");
/// let body = envelope.to_bytes();
/// assert_eq!(Envelope::from_bytes(&body)?, envelope);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The job kind, which the consumer looks its handler up by.
    pub kind: String,
    /// The job key the guard claims.
    pub key: JobKey,
    /// The job's fields.
    pub payload: Value,
}

impl Envelope {
    /// An envelope for a job of `kind` with `key` and `payload`.
    pub fn new<P: Serialize + ?Sized>(kind: &str, key: JobKey, payload: &P) -> Result<Self> {
        let payload = serde_json::to_value(payload).map_err(|source| Error::Payload {
            key: key.to_string(),
            source,
        })?;
        Ok(Envelope {
            kind: kind.to_owned(),
            key,
            payload,
        })
    }

    /// The envelope of a [`Job`] value: its kind, the key it derives, and its fields.
    pub fn for_job<DB: Backend, J: Job<DB>>(job: &J) -> Result<Self> {
        Self::new(J::KIND, job.key()?, job)
    }

    /// The envelope as JSON bytes, the body a broker carries.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a JSON value and a key always serialize")
    }

    /// Reads an envelope from a message body.
    pub fn from_bytes(body: &[u8]) -> std::result::Result<Self, serde_json::Error> {
        serde_json::from_slice(body)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_what_it_writes_and_refuses_the_rest() {
        let key = JobKey::new("credit", ["order-1"]).unwrap();
        let envelope = Envelope::new("credit", key, &json!({"amount": 5})).unwrap();
        let body = envelope.to_bytes();
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            json!({"kind": "credit", "key": "credit:order-1", "payload": {"amount": 5}})
        );
        assert_eq!(Envelope::from_bytes(&body).unwrap(), envelope);
        for bad in [
            &b"not json"[..],
            br#"{"kind": "credit", "payload": {}}"#,
            br#"{"kind": "credit", "key": "", "payload": {}}"#,
            br#"{"kind": "credit", "key": "credit", "payload": {}}"#,
        ] {
            assert!(Envelope::from_bytes(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
