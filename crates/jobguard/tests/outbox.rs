//! The transactional outbox's conformance suite on every backend, delivering to a real HTTP
//! receiver (`jobguard-provider`): the tests are in `suite/outbox.rs`.

mod common;

mod postgres {
    type DB = sqlx::Postgres;
    include!("suite/outbox.rs");
}

mod sqlite {
    type DB = sqlx::Sqlite;
    include!("suite/outbox.rs");
}
