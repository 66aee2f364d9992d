//! A PostgreSQL schema of the test's own.

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, Executor, PgConnection};

/// A schema of the test's own, made empty on the PostgreSQL of an admin URL; a connection
/// through [`url`](Schema::url) or [`options`](Schema::options) finds its tables there first.
#[derive(Clone, Debug)]
pub struct Schema {
    admin: String,
    name: String,
}

impl Schema {
    /// Drops `name` if an earlier run left it, and creates it empty. `name` must be a plain
    /// identifier (lower case letters, digits and `_`).
    pub async fn create(admin: &str, name: &str) -> Schema {
        assert!(
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "{name:?} is not a plain schema name"
        );
        let mut conn = PgConnection::connect(admin)
            .await
            .expect("connect to PostgreSQL");
        conn.execute(sqlx::AssertSqlSafe(format!(
            "drop schema if exists {name} cascade; create schema {name}"
        )))
        .await
        .expect("create the test's schema");
        let _ = conn.close().await;
        Schema {
            admin: admin.to_owned(),
            name: name.to_owned(),
        }
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The admin URL it was made on.
    pub fn admin(&self) -> &str {
        &self.admin
    }

    /// The admin URL with the schema first on the search path, for a process of its own.
    pub fn url(&self) -> String {
        let separator = if self.admin.contains('?') { '&' } else { '?' };
        format!(
            "{}{separator}options=-c%20search_path%3D{}",
            self.admin, self.name
        )
    }

    /// Connect options with the schema first on the search path.
    pub fn options(&self) -> PgConnectOptions {
        let options: PgConnectOptions = self.admin.parse().expect("a PostgreSQL URL");
        options.options([("search_path", self.name.as_str())])
    }

    /// Drops the schema and everything in it, waiting at most 10 s for its locks; a schema
    /// that cannot be dropped is left for the next run's [`create`](Schema::create).
    pub async fn drop_now(&self) {
        if let Ok(mut conn) = PgConnection::connect(&self.admin).await {
            let _ = conn
                .execute(sqlx::AssertSqlSafe(format!(
                    "set lock_timeout = '10s'; drop schema if exists {} cascade",
                    self.name
                )))
                .await;
            let _ = conn.close().await;
        }
    }
}
