//! The job queue's conformance suite on every backend: the tests are in `suite/queue.rs`.

mod common;

mod postgres {
    type DB = sqlx::Postgres;
    include!("suite/queue.rs");
}

mod sqlite {
    type DB = sqlx::Sqlite;
    include!("suite/queue.rs");
}
