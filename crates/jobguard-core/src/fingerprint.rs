//! Payload fingerprints: how the guard tells a redelivery from a reused key.
//!
//! A redelivery carries the same payload as the first delivery; the same key with another payload
//! means the producer derived one key for two different operations. The guard stores a hash of the
//! payload with the key and refuses a mismatch, as payment APIs do with idempotency keys.

use std::fmt;

use serde::Serialize;
use serde_json::Value;

/// A blake3 hash of a payload's canonical JSON form.
///
/// Canonical means object keys are hashed in sorted order and every value is tagged with its
/// type, so the fingerprint does not depend on map ordering or on serde_json's features.
///
/// ```
/// use jobguard_core::fingerprint::Fingerprint;
/// use serde_json::json;
///
/// let a = Fingerprint::of(&json!({"account": 7, "amount": 500}))?;
/// let b = Fingerprint::of(&json!({"amount": 500, "account": 7}))?;
/// assert_eq!(a, b);
/// assert_ne!(a, Fingerprint::of(&json!({"account": 7, "amount": 501}))?);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of any serializable payload.
    pub fn of<P: Serialize + ?Sized>(payload: &P) -> Result<Self, serde_json::Error> {
        let value = serde_json::to_value(payload)?;
        let mut hasher = blake3::Hasher::new();
        feed(&mut hasher, &value);
        Ok(Fingerprint(*hasher.finalize().as_bytes()))
    }

    /// The raw 32 bytes, as stored in the guard table.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fingerprint read back from the guard table's 32 bytes; `None` for any other length.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Fingerprint)
    }

    /// The fingerprint of a payload given as JSON text, as another language serialised it.
    ///
    /// The same value gives the same fingerprint as [`Fingerprint::of`], whatever the text's
    /// key order or spacing: `{"b": 1, "a": 2}` and `{"a":2,"b":1}` agree.
    ///
    /// ```
    /// use jobguard_core::fingerprint::Fingerprint;
    /// use serde_json::json;
    ///
    /// let text = Fingerprint::of_json(r#"{"amount": 500, "account": 7}"#)?;
    /// assert_eq!(text, Fingerprint::of(&json!({"account": 7, "amount": 500}))?);
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The text is not JSON.
    pub fn of_json(text: &str) -> Result<Self, serde_json::Error> {
        let value: Value = serde_json::from_str(text)?;
        Fingerprint::of(&value)
    }

    /// The 64 lowercase hex digits of the hash.
    ///
    /// ```
    /// use jobguard_core::fingerprint::Fingerprint;
    ///
    /// assert_eq!(Fingerprint::of(&1)?.to_hex().len(), 64);
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn to_hex(&self) -> String {
        use fmt::Write;
        let mut out = String::with_capacity(64);
        for byte in &self.0 {
            let _ = write!(out, "{byte:02x}");
        }
        out
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint(")?;
        for byte in &self.0[..8] {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "…)")
    }
}

// Every value is prefixed with a type tag and every string with its length, so no two
// different values feed the hasher the same bytes.
fn feed(hasher: &mut blake3::Hasher, value: &Value) {
    match value {
        Value::Null => {
            hasher.update(b"n");
        }
        Value::Bool(b) => {
            hasher.update(if *b { b"t" } else { b"f" });
        }
        Value::Number(n) => feed_str(hasher, b'#', &n.to_string()),
        Value::String(s) => feed_str(hasher, b's', s),
        Value::Array(items) => {
            hasher.update(b"[");
            hasher.update(&(items.len() as u64).to_le_bytes());
            for item in items {
                feed(hasher, item);
            }
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            hasher.update(b"{");
            hasher.update(&(entries.len() as u64).to_le_bytes());
            for (key, item) in entries {
                feed_str(hasher, b'k', key);
                feed(hasher, item);
            }
        }
    }
}

fn feed_str(hasher: &mut blake3::Hasher, tag: u8, s: &str) {
    hasher.update(&[tag]);
    hasher.update(&(s.len() as u64).to_le_bytes());
    hasher.update(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn distinguishes_values_that_print_alike() {
        let pairs = [
            (json!(["ab", "c"]), json!(["a", "bc"])),
            (json!({"a": "b"}), json!({"ab": ""})),
            (json!(1), json!("1")),
            (json!(null), json!([])),
            (json!([[]]), json!([[], []])),
        ];
        for (a, b) in pairs {
            assert_ne!(
                Fingerprint::of(&a).unwrap(),
                Fingerprint::of(&b).unwrap(),
                "{a} vs {b}"
            );
        }
    }

    #[test]
    fn ignores_object_key_order_at_every_depth() {
        let a = json!({"x": {"b": 1, "a": [ {"q": 1, "p": 2} ]}, "y": true});
        let b = json!({"y": true, "x": {"a": [ {"p": 2, "q": 1} ], "b": 1}});
        assert_eq!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
    }
}
