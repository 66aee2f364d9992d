//! Effects outside the database, against a real payment provider over loopback HTTP: keyed
//! calls recorded with the guard, and the started/done step ledger with reconciliation. The
//! tests are in `suite/external.rs`, run on every backend.

mod common;

mod postgres {
    type DB = sqlx::Postgres;
    include!("suite/external.rs");
}

mod sqlite {
    type DB = sqlx::Sqlite;
    include!("suite/external.rs");
}
