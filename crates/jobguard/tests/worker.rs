//! The worker's conformance suite on every backend: the tests are in `suite/worker.rs`.

mod common;

mod postgres {
    type DB = sqlx::Postgres;
    include!("suite/worker.rs");
}

mod sqlite {
    type DB = sqlx::Sqlite;
    include!("suite/worker.rs");
}
