//! Validated names for the tables jobguard creates.
//!
//! Table and schema names are the only parts of jobguard's SQL that cannot be bind parameters,
//! so they are checked here once, against a strict identifier grammar, and quoted when spliced.

use std::fmt;

/// The longest identifier PostgreSQL keeps without truncating it.
const MAX_IDENT_LEN: usize = 63;

/// Hex digits of the hash that tells apart the derived names of long tables.
const DERIVED_HASH_LEN: usize = 10;

/// A table name, optionally qualified by a PostgreSQL schema.
///
/// ```
/// use jobguard_core::table::TableName;
///
/// let table = TableName::new("processed_jobs")?.in_schema("billing")?;
/// assert_eq!(table.to_string(), "billing.processed_jobs");
/// assert!(TableName::new("jobs; drop table users").is_err());
/// # Ok::<(), jobguard_core::table::NameError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl TableName {
    /// A table name: 1 to 63 ASCII letters, digits and underscores, not starting with a digit.
    pub fn new(name: &str) -> Result<Self, NameError> {
        Ok(TableName {
            schema: None,
            name: validate("table", name)?,
        })
    }

    /// The same table in a PostgreSQL schema. SQLite has no schemas and refuses this name.
    pub fn in_schema(mut self, schema: &str) -> Result<Self, NameError> {
        self.schema = Some(validate("schema", schema)?);
        Ok(self)
    }

    /// The schema, if any.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The unqualified table name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name as it appears in SQL: quoted, and qualified when it has a schema.
    ///
    /// ```
    /// use jobguard_core::table::TableName;
    ///
    /// let table = TableName::new("charges")?.in_schema("billing")?;
    /// assert_eq!(table.quoted(), r#""billing"."charges""#);
    /// # Ok::<(), jobguard_core::table::NameError>(())
    /// ```
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".\"{}\"", self.name),
            None => format!("\"{}\"", self.name),
        }
    }

    /// A quoted name for an object that belongs to this table, such as an index, kept within
    /// PostgreSQL's identifier length.
    ///
    /// `<table>_<suffix>` when it fits in 63 bytes. A longer one keeps a readable prefix of the
    /// table name and adds a hash of the full name: cutting alone would give two tables that
    /// share their first 50-odd characters the same index and claim function names, and the
    /// second table's `create ... if not exists` or `create or replace` would then skip its own
    /// object or replace the first table's.
    pub fn derived(&self, suffix: &str) -> String {
        let full = format!("{}_{suffix}", self.name);
        if full.len() <= MAX_IDENT_LEN {
            return format!("\"{full}\"");
        }
        let hash = blake3::hash(full.as_bytes()).to_hex();
        let hash = &hash.as_str()[..DERIVED_HASH_LEN];
        let room = MAX_IDENT_LEN.saturating_sub(suffix.len() + DERIVED_HASH_LEN + 2);
        // Table names are ASCII (see `validate`), so any byte index is a char boundary.
        let stem = &self.name[..self.name.len().min(room)];
        format!("\"{stem}_{hash}_{suffix}\"")
    }

    /// The statements a PostgreSQL setup opens with: `create schema` when the table has one,
    /// none otherwise. The caller extends them with its own `create` statements.
    pub fn schema_statements(&self) -> Vec<String> {
        self.schema
            .iter()
            .map(|schema| format!("create schema if not exists \"{schema}\""))
            .collect()
    }

    /// [`derived`](Self::derived), qualified by the table's schema, for objects such as
    /// functions that do not follow their table into its schema.
    pub fn derived_qualified(&self, suffix: &str) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".{}", self.derived(suffix)),
            None => self.derived(suffix),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// A table or schema name that is not a plain identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid {what} name `{name}`: use 1 to 63 ASCII letters, digits and underscores, \
     starting with a letter or underscore"
)]
#[non_exhaustive]
pub struct NameError {
    /// What the name was for: `table` or `schema`.
    pub what: &'static str,
    /// The rejected name.
    pub name: String,
}

fn validate(what: &'static str, name: &str) -> Result<String, NameError> {
    let mut chars = name.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_plain = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if starts_well && rest_plain && name.len() <= MAX_IDENT_LEN {
        Ok(name.to_owned())
    } else {
        Err(NameError {
            what,
            name: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_identifiers() {
        for name in ["processed_jobs", "_x", "Jobs2", &"a".repeat(63)] {
            assert_eq!(TableName::new(name).unwrap().name(), name);
        }
    }

    #[test]
    fn refuses_anything_that_would_need_escaping() {
        for name in [
            "",
            "2jobs",
            "jobs\"",
            "a b",
            "jobs;drop",
            "jobs\0",
            "tâche",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(TableName::new(name), Err(NameError { what: "table", .. })),
                "{name:?} was accepted"
            );
        }
        assert!(
            TableName::new("jobs")
                .unwrap()
                .in_schema("public.x")
                .is_err()
        );
    }

    #[test]
    fn quotes_and_derives_within_the_identifier_limit() {
        let table = TableName::new(&"t".repeat(63))
            .unwrap()
            .in_schema("s")
            .unwrap();
        assert!(table.quoted().starts_with("\"s\".\"ttt"));
        let index = table.derived("applied_at_idx");
        assert_eq!(index.len(), 63 + 2);
        assert!(index.ends_with("_applied_at_idx\""));
        assert_eq!(
            TableName::new("jobs").unwrap().derived("fetch"),
            "\"jobs_fetch\""
        );
        let fits = "f".repeat(63 - "_claim".len());
        assert_eq!(
            TableName::new(&fits).unwrap().derived("claim"),
            format!("\"{fits}_claim\"")
        );
    }

    #[test]
    fn long_tables_that_share_a_prefix_derive_different_names() {
        // Cut at 63 characters, both used to derive `"processed_jobs_of_..._ledger_regi_claim"`.
        let prefix = "processed_jobs_of_the_billing_service_for_the_ledger_region";
        let a = TableName::new(&format!("{prefix}_eu")).unwrap();
        let b = TableName::new(&format!("{prefix}_us")).unwrap();
        for suffix in ["claim", "applied_at_idx", "live_key", "fetch", "relay"] {
            let (da, db) = (a.derived(suffix), b.derived(suffix));
            assert_ne!(da, db, "{suffix}");
            for derived in [&da, &db] {
                assert!(derived.len() <= 63 + 2, "{derived}");
                assert!(derived.starts_with("\"processed_jobs_of_"), "{derived}");
                assert!(derived.ends_with(&format!("_{suffix}\"")), "{derived}");
            }
            // Stable: the same table derives the same name every time, in every process.
            assert_eq!(da, a.clone().derived(suffix));
        }
    }
}
