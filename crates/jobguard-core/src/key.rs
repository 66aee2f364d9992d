//! Job keys: the stable identity of a job's effect.
//!
//! A job key names *the business operation a job performs*, not the job run that performs it.
//! jobguard records each key at most once per effect, so two deliveries of the same job, or two
//! producers that both enqueue "credit order 8812", collapse into a single effect as long as they
//! compute the same key. The key is therefore derived from the business operation itself: a kind
//! such as `credit` followed by the identifiers that make the operation unique, such as the order
//! id: `credit:order-8812`.
//!
//! A job that legitimately repeats puts its period in the key. A monthly fee is one effect per
//! account per month, so its key is `fee:account-7:2026-10`; next month's fee is
//! `fee:account-7:2026-11`, a different key, and it runs once more.
//!
//! # Do not use random ids or timestamps
//!
//! Never build a key from a value that changes each time the job is enqueued:
//!
//! * a random id such as a UUID generated per enqueue, or
//! * a timestamp such as the enqueue time (`credit:2026-10-02T10:15`).
//!
//! Producer-side duplicates (a retried HTTP request, a redelivered event, a double click) then get
//! *different* keys, jobguard sees two distinct operations, and **both run**: the customer is
//! credited twice. The only time that belongs in a key is a business period that the operation is
//! defined over (the month of the fee), never the moment the job happened to be created.
//!
//! # Encoding
//!
//! A key is made of a *kind* and one or more *parts*. The kind is a plain identifier (an ASCII
//! letter followed by ASCII letters, digits, `_`, `-` or `.`, at most [`MAX_KIND_LEN`] bytes).
//! Parts are arbitrary non-empty Unicode strings without NUL. The encoded form is the kind
//! followed by `:` and each escaped part; escaping turns `%` into `%25` and `:` into `%3A`, so
//! `("a:b", "c")` and `("a", "b:c")` encode to the distinct keys `k:a%3Ab:c` and `k:a:b%3Ac`. The
//! encoding is canonical: [`JobKey::parse`] accepts exactly the strings that [`JobKey::new`] can
//! produce, and the encoded form is at most [`MAX_KEY_LEN`] bytes. Equality and ordering compare
//! the encoded form.
//!
//! Hash business values that are long (or that you would rather not store in clear) with
//! `blake3` and put the hex digest in the key.
//!
//! # Example
//!
//! ```
//! use jobguard_core::key::JobKey;
//!
//! let credit = JobKey::new("credit", ["order-8812"])?;
//! assert_eq!(credit.as_str(), "credit:order-8812");
//! assert_eq!(credit.kind(), "credit");
//!
//! // A monthly fee: the period is part of the key.
//! let fee = JobKey::new("fee", ["account-7", "2026-10"])?;
//! assert_eq!(fee.to_string(), "fee:account-7:2026-10");
//! assert_eq!(fee.parts(), ["account-7", "2026-10"]);
//! assert_eq!(JobKey::parse("fee:account-7:2026-10")?, fee);
//!
//! // Separators inside parts are escaped, so keys stay unambiguous.
//! let a = JobKey::new("k", ["a:b", "c"])?;
//! let b = JobKey::new("k", ["a", "b:c"])?;
//! assert_eq!(a.as_str(), "k:a%3Ab:c");
//! assert_eq!(b.as_str(), "k:a:b%3Ac");
//! assert_ne!(a, b);
//!
//! // Long business values: hash them.
//! let manifest = "s3://imports/2026/10/02/batch-0001.csv ... (thousands of file names)";
//! let digest = blake3::hash(manifest.as_bytes()).to_hex();
//! let import = JobKey::new("import", ["manifest", digest.as_str()])?;
//! assert_eq!(import.as_str().len(), "import:manifest:".len() + 64);
//! # Ok::<(), jobguard_core::key::KeyError>(())
//! ```

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Maximum length of an encoded job key, in bytes.
///
/// Keys are stored in a uniquely indexed text column. PostgreSQL rejects btree index rows larger
/// than about 2,700 bytes (a third of an 8 KiB page); 512 bytes keeps keys well under that limit
/// with room for the other columns of a composite index. Hash long business values (`blake3`)
/// rather than raising this limit.
pub const MAX_KEY_LEN: usize = 512;

/// Maximum length of a job key's kind, in bytes.
pub const MAX_KIND_LEN: usize = 64;

/// The separator between the kind and the parts, and between parts.
const SEP: char = ':';

/// A validated job key: a kind plus one or more business parts, stored in encoded form.
///
/// See the [module documentation](self) for how to choose a key. Build one with [`JobKey::new`],
/// or read back an encoded key with [`JobKey::parse`]. [`Display`](fmt::Display),
/// [`as_str`](JobKey::as_str) and serde serialization all produce the encoded form, e.g.
/// `credit:order-8812`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobKey {
    /// The canonical encoded form.
    encoded: String,
    /// Length of the kind: the kind is `encoded[..kind_len]`, followed by `:`.
    kind_len: usize,
}

impl JobKey {
    /// Builds a key from a kind and the business parts that identify the operation.
    ///
    /// ```
    /// # use jobguard_core::key::JobKey;
    /// let key = JobKey::new("fee", ["account-7", "2026-10"])?;
    /// assert_eq!(key.as_str(), "fee:account-7:2026-10");
    /// # Ok::<(), jobguard_core::key::KeyError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Returns [`KeyError::EmptyKind`], [`KeyError::NulByte`], [`KeyError::KindTooLong`] or
    /// [`KeyError::InvalidKind`] if the kind is not a plain identifier of at most
    /// [`MAX_KIND_LEN`] bytes; [`KeyError::NoParts`] if `parts` is empty;
    /// [`KeyError::EmptyPart`] or [`KeyError::NulByte`] for an empty part or a part containing
    /// NUL; and [`KeyError::TooLong`] if the encoded key exceeds [`MAX_KEY_LEN`] bytes.
    pub fn new<I, P>(kind: &str, parts: I) -> Result<JobKey, KeyError>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<str>,
    {
        check_kind(kind)?;
        let parts: Vec<P> = parts.into_iter().collect();
        if parts.is_empty() {
            return Err(KeyError::NoParts {
                kind: kind.to_owned(),
            });
        }
        let mut len = kind.len();
        for (index, part) in parts.iter().enumerate() {
            let part = part.as_ref();
            if part.is_empty() {
                return Err(KeyError::EmptyPart {
                    kind: kind.to_owned(),
                    index,
                });
            }
            if part.contains('\0') {
                return Err(KeyError::NulByte);
            }
            len = len.saturating_add(1).saturating_add(escaped_len(part));
        }
        if len > MAX_KEY_LEN {
            return Err(KeyError::TooLong {
                len,
                max: MAX_KEY_LEN,
            });
        }
        let mut encoded = String::with_capacity(len);
        encoded.push_str(kind);
        for part in &parts {
            encoded.push(SEP);
            push_escaped(&mut encoded, part.as_ref());
        }
        debug_assert_eq!(encoded.len(), len);
        Ok(JobKey {
            encoded,
            kind_len: kind.len(),
        })
    }

    /// Parses an encoded key, the inverse of [`Display`](fmt::Display).
    ///
    /// The same rules as [`JobKey::new`] apply, and escapes must be canonical (`%25` or `%3A`),
    /// so `JobKey::parse(s)?.to_string() == s` for every accepted `s`.
    ///
    /// ```
    /// # use jobguard_core::key::JobKey;
    /// let key = JobKey::parse("k:a%3Ab:c")?;
    /// assert_eq!(key.kind(), "k");
    /// assert_eq!(key.parts(), ["a:b", "c"]);
    /// # Ok::<(), jobguard_core::key::KeyError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Returns the errors of [`JobKey::new`] (with [`KeyError::NoParts`] for a string without
    /// `:`, and [`KeyError::EmptyPart`] for `k::x` or a trailing `:`), and
    /// [`KeyError::MalformedEscape`] for a `%` not followed by `25` or `3A`.
    pub fn parse(encoded: &str) -> Result<JobKey, KeyError> {
        let kind_len = validate_encoded(encoded)?;
        Ok(JobKey {
            encoded: encoded.to_owned(),
            kind_len,
        })
    }

    /// The kind of operation, e.g. `credit` for `credit:order-8812`.
    pub fn kind(&self) -> &str {
        &self.encoded[..self.kind_len]
    }

    /// The encoded key, e.g. `credit:order-8812`. This is what is stored and compared.
    pub fn as_str(&self) -> &str {
        &self.encoded
    }

    /// The business parts, unescaped: `["a:b", "c"]` for `k:a%3Ab:c`.
    pub fn parts(&self) -> Vec<String> {
        self.encoded
            .get(self.kind_len + SEP.len_utf8()..)
            .unwrap_or_default()
            .split(SEP)
            .map(unescape)
            .collect()
    }

    /// Consumes the key and returns the encoded form.
    pub fn into_string(self) -> String {
        self.encoded
    }
}

impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encoded)
    }
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("JobKey").field(&self.encoded).finish()
    }
}

impl FromStr for JobKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobKey::parse(s)
    }
}

impl AsRef<str> for JobKey {
    fn as_ref(&self) -> &str {
        &self.encoded
    }
}

impl TryFrom<&str> for JobKey {
    type Error = KeyError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        JobKey::parse(s)
    }
}

impl TryFrom<String> for JobKey {
    type Error = KeyError;

    /// Validates `s` as an encoded key, reusing its allocation.
    fn try_from(s: String) -> Result<Self, Self::Error> {
        let kind_len = validate_encoded(&s)?;
        Ok(JobKey {
            encoded: s,
            kind_len,
        })
    }
}

impl From<JobKey> for String {
    fn from(key: JobKey) -> Self {
        key.encoded
    }
}

impl Serialize for JobKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.encoded)
    }
}

impl<'de> Deserialize<'de> for JobKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(JobKeyVisitor)
    }
}

/// Deserializes a [`JobKey`] from its encoded string.
struct JobKeyVisitor;

impl Visitor<'_> for JobKeyVisitor {
    type Value = JobKey;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an encoded job key such as `credit:order-8812`")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<JobKey, E> {
        JobKey::parse(v).map_err(E::custom)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<JobKey, E> {
        JobKey::try_from(v).map_err(E::custom)
    }
}

/// Why a job key was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The kind is empty.
    #[error(
        "job key kind is empty: name the kind of operation, e.g. `credit` in `credit:order-8812`"
    )]
    EmptyKind,

    /// The kind is not a plain identifier.
    #[error(
        "job key kind {kind:?} is not a plain identifier: start it with an ASCII letter and use \
         only ASCII letters, digits, `_`, `-` and `.`; put business values in the parts"
    )]
    InvalidKind {
        /// The rejected kind.
        kind: String,
    },

    /// The kind is longer than [`MAX_KIND_LEN`].
    #[error(
        "job key kind is {len} bytes, over the maximum of {max}: use a short name for the kind of \
         operation and put business values in the parts"
    )]
    KindTooLong {
        /// Length of the kind in bytes.
        len: usize,
        /// The maximum, [`MAX_KIND_LEN`].
        max: usize,
    },

    /// The key has a kind but no business parts.
    #[error(
        "job key `{kind}` has no business parts: derive the key from the operation, e.g. \
         `{kind}:order-8812`"
    )]
    NoParts {
        /// The kind of the key.
        kind: String,
    },

    /// A business part is empty.
    #[error(
        "part {index} of job key `{kind}` is empty: every part must carry a business value such \
         as an order or account id"
    )]
    EmptyPart {
        /// The kind of the key.
        kind: String,
        /// Zero-based index of the empty part.
        index: usize,
    },

    /// The kind or a part contains a NUL character.
    #[error(
        "job key contains a NUL character: remove it (databases such as PostgreSQL cannot store \
         NUL in text)"
    )]
    NulByte,

    /// The encoded key is longer than [`MAX_KEY_LEN`].
    #[error(
        "job key is {len} bytes once encoded, over the maximum of {max}: hash long business parts \
         (blake3) or shorten them"
    )]
    TooLong {
        /// Length of the encoded key in bytes.
        len: usize,
        /// The maximum, [`MAX_KEY_LEN`].
        max: usize,
    },

    /// An encoded key has a `%` that does not start `%25` or `%3A` (only from parsing).
    #[error(
        "malformed escape at byte {at} of encoded job key: `%` must be followed by `25` or `3A` \
         (uppercase); build keys with `JobKey::new` rather than by hand"
    )]
    MalformedEscape {
        /// Byte offset of the offending `%` in the encoded key.
        at: usize,
    },
}

/// Checks the kind rules shared by [`JobKey::new`] and [`JobKey::parse`] (and by the step
/// names of [`ApiKey::derive`](crate::api_key::ApiKey::derive)).
///
/// ```
/// use jobguard_core::key::check_kind;
///
/// assert!(check_kind("credit").is_ok());
/// assert!(check_kind("2fa").is_err());
/// ```
///
/// # Errors
///
/// The kind errors of [`JobKey::new`].
pub fn check_kind(kind: &str) -> Result<(), KeyError> {
    if kind.is_empty() {
        return Err(KeyError::EmptyKind);
    }
    if kind.contains('\0') {
        return Err(KeyError::NulByte);
    }
    if kind.len() > MAX_KIND_LEN {
        return Err(KeyError::KindTooLong {
            len: kind.len(),
            max: MAX_KIND_LEN,
        });
    }
    let mut bytes = kind.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic());
    if !first_ok || !bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) {
        return Err(KeyError::InvalidKind {
            kind: kind.to_owned(),
        });
    }
    Ok(())
}

/// Validates an encoded key, returning the length of its kind.
///
/// Checks happen in the same order as in [`JobKey::new`], so parsing the encoding of any
/// `(kind, parts)` (with a kind free of `:`) fails with the error `new` would report.
fn validate_encoded(encoded: &str) -> Result<usize, KeyError> {
    let (kind, rest) = match encoded.split_once(SEP) {
        Some((kind, rest)) => (kind, Some(rest)),
        None => (encoded, None),
    };
    check_kind(kind)?;
    let Some(rest) = rest else {
        return Err(KeyError::NoParts {
            kind: kind.to_owned(),
        });
    };
    let mut offset = kind.len() + SEP.len_utf8();
    for (index, part) in rest.split(SEP).enumerate() {
        if part.is_empty() {
            return Err(KeyError::EmptyPart {
                kind: kind.to_owned(),
                index,
            });
        }
        check_encoded_part(part, offset)?;
        offset += part.len() + SEP.len_utf8();
    }
    if encoded.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong {
            len: encoded.len(),
            max: MAX_KEY_LEN,
        });
    }
    Ok(kind.len())
}

/// Checks one encoded part (which starts at byte `offset` of the key) for NUL and bad escapes.
fn check_encoded_part(part: &str, offset: usize) -> Result<(), KeyError> {
    let bytes = part.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            0 => return Err(KeyError::NulByte),
            b'%' => match bytes.get(i + 1..i + 3) {
                Some([b'2', b'5'] | [b'3', b'A']) => {}
                _ => return Err(KeyError::MalformedEscape { at: offset + i }),
            },
            _ => {}
        }
    }
    Ok(())
}

/// Length of `part` once escaped.
fn escaped_len(part: &str) -> usize {
    let specials = part.bytes().filter(|b| matches!(b, b'%' | b':')).count();
    part.len() + 2 * specials
}

/// Appends `part` to `out`, escaping `%` as `%25` and `:` as `%3A`.
fn push_escaped(out: &mut String, part: &str) {
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
}

/// Decodes a part that [`check_encoded_part`] accepted.
fn unescape(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(pos) = rest.find('%') {
        out.push_str(&rest[..pos]);
        out.push(if rest.get(pos + 1..pos + 3) == Some("3A") {
            ':'
        } else {
            '%'
        });
        rest = rest.get(pos + 3..).unwrap_or_default();
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_round_trips_escape_lookalikes() {
        let key = JobKey::new("k", ["%3A", "%25", ":%", "%"]).unwrap();
        assert_eq!(key.as_str(), "k:%253A:%2525:%3A%25:%25");
        assert_eq!(key.parts(), ["%3A", "%25", ":%", "%"]);
        assert_eq!(JobKey::parse(key.as_str()).unwrap(), key);
    }

    #[test]
    fn escaped_len_matches_encoding() {
        for part in ["", "abc", "a:b%c", "::%%", "é:ü"] {
            let mut out = String::new();
            push_escaped(&mut out, part);
            assert_eq!(out.len(), escaped_len(part), "{part:?}");
        }
    }
}
