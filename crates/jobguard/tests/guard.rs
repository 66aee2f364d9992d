//! The guard's conformance suite on every backend: the tests are in `suite/guard.rs`.

mod common;

mod postgres {
    type DB = sqlx::Postgres;
    include!("suite/guard.rs");
}

mod sqlite {
    type DB = sqlx::Sqlite;
    include!("suite/guard.rs");
}
