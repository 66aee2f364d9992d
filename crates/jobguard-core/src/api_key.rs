//! Idempotency keys for external APIs, derived from a job key and a step name.
//!
//! [`ApiKey::derive`] turns a [`JobKey`] and a step name into the key an API that accepts
//! idempotency keys is sent, within the length and alphabet the API accepts, and the same on
//! every re-enqueue, redelivery and replay.

use std::fmt;

use crate::key::{JobKey, KeyError, check_kind};

/// Hex digits of the BLAKE3 hash in a hashed key: 128 bits.
const HASH_LEN: usize = 32;

/// The characters an API accepts in an idempotency key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyAlphabet {
    /// Visible ASCII, `!` to `~` (Stripe, most HTTP APIs).
    Printable,
    /// ASCII letters, digits and `-`, `_`, `.`, `:`.
    Token,
    /// ASCII letters and digits only.
    Alphanumeric,
}

impl KeyAlphabet {
    /// Whether `c` may appear in a key.
    pub fn allows(self, c: char) -> bool {
        match self {
            KeyAlphabet::Printable => c.is_ascii_graphic(),
            KeyAlphabet::Token => c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'),
            KeyAlphabet::Alphanumeric => c.is_ascii_alphanumeric(),
        }
    }
}

/// The idempotency keys an API accepts: at most `max_len` characters from an alphabet.
///
/// ```
/// use jobguard_core::api_key::{ApiKeyFormat, KeyAlphabet};
///
/// assert_eq!(ApiKeyFormat::STRIPE.max_len(), 255);
/// let strict = ApiKeyFormat::new(40, KeyAlphabet::Alphanumeric)?;
/// assert_eq!(strict.max_len(), 40);
/// assert!(ApiKeyFormat::new(16, KeyAlphabet::Printable).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ApiKeyFormat {
    max_len: usize,
    alphabet: KeyAlphabet,
}

impl ApiKeyFormat {
    /// Stripe's keys: up to 255 visible ASCII characters.
    pub const STRIPE: ApiKeyFormat = ApiKeyFormat {
        max_len: 255,
        alphabet: KeyAlphabet::Printable,
    };

    /// A format of at most `max_len` characters from `alphabet`.
    ///
    /// `max_len` must leave room for the 32-character hash a key falls back to, so formats
    /// shorter than 32 characters are refused with a [`FormatError`].
    pub fn new(max_len: usize, alphabet: KeyAlphabet) -> Result<Self, FormatError> {
        if max_len < HASH_LEN {
            return Err(FormatError {
                reason: format!(
                    "a maximum length of {max_len} leaves no room for the {HASH_LEN}-character \
                     hash that keeps keys distinct; allow at least {HASH_LEN} characters"
                ),
            });
        }
        Ok(ApiKeyFormat { max_len, alphabet })
    }

    /// The longest key the API accepts.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The characters the API accepts.
    pub fn alphabet(&self) -> KeyAlphabet {
        self.alphabet
    }
}

/// An idempotency key for one step of a job on an external API.
///
/// Derived from the job key and a step name only, so every delivery, re-enqueue and replay of
/// the job sends the same key, and two steps of one job (`create-charge`, `send-receipt`) send
/// different ones.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ApiKey(String);

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
    /// use jobguard_core::key::JobKey;
    /// use jobguard_core::api_key::{ApiKey, ApiKeyFormat, KeyAlphabet};
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
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn derive(key: &JobKey, step: &str, format: ApiKeyFormat) -> Result<ApiKey, KeyError> {
        check_kind(step)?;
        let readable = format!("{key}:{step}");
        let fits = readable.len() <= format.max_len
            && format.alphabet.allows(':')
            && readable.chars().all(|c| format.alphabet.allows(c));
        if fits {
            return Ok(ApiKey(readable));
        }
        let hash = blake3::hash(readable.as_bytes()).to_hex();
        let hash = &hash[..HASH_LEN];
        let separator = if format.alphabet.allows('-') { "-" } else { "" };
        let room = format.max_len.saturating_sub(HASH_LEN + separator.len());
        // The prefix only helps a person reading the API's logs: the hash alone keeps keys apart.
        let mut prefix = String::with_capacity(room);
        for c in readable.chars() {
            if prefix.len() == room {
                break;
            }
            if c != ':' && format.alphabet.allows(c) {
                prefix.push(c);
            } else if format.alphabet.allows('-') && !prefix.ends_with('-') {
                prefix.push('-');
            }
        }
        let prefix = prefix.trim_end_matches('-');
        if prefix.is_empty() {
            return Ok(ApiKey(hash.to_owned()));
        }
        Ok(ApiKey(format!("{prefix}{separator}{hash}")))
    }

    /// The key to send to the API.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ApiKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// An idempotency-key format an API cannot be served with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid idempotency-key format: {reason}")]
#[non_exhaustive]
pub struct FormatError {
    /// What is wrong with it.
    pub reason: String,
}
