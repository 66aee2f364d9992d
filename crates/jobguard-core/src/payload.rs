//! The payload rules jobs and outbox messages share: JSON of at most [`MAX_PAYLOAD_BYTES`],
//! without NUL characters (PostgreSQL rejects `\u0000` in `jsonb`, so SQLite refuses it too and
//! a job moves between backends unchanged). The Rust queue and outbox and the Python
//! `jobguard.enqueue` apply this one rule.
//!
//! ```
//! use jobguard_core::payload::{payload_problem, MAX_PAYLOAD_BYTES};
//!
//! assert_eq!(MAX_PAYLOAD_BYTES, 1 << 20);
//! assert_eq!(payload_problem(&serde_json::json!({"order": "o-1"}), "it", "enqueue"), None);
//! let nul = payload_problem(&serde_json::json!({"note": "a\u{0}b"}), "it", "enqueue");
//! assert_eq!(nul.as_deref(), Some("it contains a NUL character, which PostgreSQL cannot store"));
//! ```

use serde_json::Value;

/// The largest payload, as JSON bytes, that a job or an outbox message may carry.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// Why a payload breaks the rules, phrased to follow `subject` ("it", "its payload"); `None`
/// when it keeps them. `what` is "enqueue" or "publish", for the advice.
pub fn payload_problem(payload: &Value, subject: &str, what: &str) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_payload_at_the_limit_passes_and_one_byte_over_is_refused() {
        // `"` + n bytes + `"`: the JSON text is n + 2 bytes.
        let at = Value::String("x".repeat(MAX_PAYLOAD_BYTES - 2));
        assert_eq!(payload_problem(&at, "it", "enqueue"), None);
        let over = Value::String("x".repeat(MAX_PAYLOAD_BYTES - 1));
        let reason = payload_problem(&over, "it", "enqueue").expect("over the limit");
        assert!(
            reason.starts_with("it is 1048577 bytes of JSON"),
            "{reason}"
        );
        assert!(reason.ends_with("enqueue a reference to it"), "{reason}");
    }

    #[test]
    fn a_nul_in_a_nested_key_or_value_is_refused() {
        for payload in [json!({"a": ["x\u{0}"]}), json!({"k\u{0}": 1})] {
            assert!(payload_problem(&payload, "its payload", "publish").is_some());
        }
    }
}
