//! The payload rules jobs and outbox messages share: JSON of at most [`MAX_PAYLOAD_BYTES`],
//! without NUL characters (PostgreSQL rejects `\u0000` in `jsonb`, so SQLite refuses it too and
//! a job moves between backends unchanged).
//!
//! ```
//! assert_eq!(jobguard::queue::MAX_PAYLOAD_BYTES, 1 << 20);
//! ```

use serde_json::Value;

/// The largest payload, as JSON bytes, that a job or an outbox message may carry.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// Why a payload breaks the rules, phrased to follow "it" (the job or the message's payload);
/// `None` when it keeps them. `what` is "enqueue" or "publish", for the advice.
pub(crate) fn payload_problem(payload: &Value, subject: &str, what: &str) -> Option<String> {
    fn has_nul(value: &Value) -> bool {
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().any(has_nul),
            Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
            _ => false,
        }
    }
    if has_nul(payload) {
        return Some(format!(
            "{subject} contains a NUL character, which PostgreSQL cannot store"
        ));
    }
    let size = serde_json::to_vec(payload).map_or(usize::MAX, |bytes| bytes.len());
    if size > MAX_PAYLOAD_BYTES {
        return Some(format!(
            "{subject} is {size} bytes of JSON, over the limit of {MAX_PAYLOAD_BYTES}; store \
             large data elsewhere and {what} a reference to it"
        ));
    }
    None
}
