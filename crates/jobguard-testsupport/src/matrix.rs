//! The test matrices: one test function, stamped out once per case.

/// Stamps out a module `name` holding one test per case, each running the case's expression
/// (awaited after `async fn`), under the attributes written before `fn`:
///
/// ```ignore
/// cases!(#[tokio::test] async fn applies_once {
///     postgres => super::applies_once::<sqlx::Postgres>(),
///     sqlite => super::applies_once::<sqlx::Sqlite>(),
/// });
/// ```
///
/// gives `applies_once::postgres` and `applies_once::sqlite`. The expressions run inside the
/// module, so `super::` names what sits beside the macro.
#[macro_export]
macro_rules! cases {
    ($(#[$attr:meta])* async fn $name:ident { $($case:ident => $run:expr),+ $(,)? }) => {
        $crate::cases!(@module [$(#[$attr])*] async $name { $($case => $run),+ });
    };
    ($(#[$attr:meta])* fn $name:ident { $($case:ident => $run:expr),+ $(,)? }) => {
        $crate::cases!(@module [$(#[$attr])*] $name { $($case => $run),+ });
    };
    // The attributes travel as one group, so that every case repeats all of them.
    (@module $attrs:tt async $name:ident { $($case:ident => $run:expr),+ }) => {
        mod $name {
            $($crate::cases!(@case $attrs async $case => $run);)+
        }
    };
    (@module $attrs:tt $name:ident { $($case:ident => $run:expr),+ }) => {
        mod $name {
            $($crate::cases!(@case $attrs $case => $run);)+
        }
    };
    (@case [$(#[$attr:meta])*] async $case:ident => $run:expr) => {
        $(#[$attr])*
        async fn $case() {
            $run.await;
        }
    };
    (@case [$(#[$attr:meta])*] $case:ident => $run:expr) => {
        $(#[$attr])*
        fn $case() {
            $run;
        }
    };
}

/// Stamps out one test per database backend over a generic `async fn name<DB>()` defined next
/// to it: `backends!(fn name);` gives `name::postgres` and `name::sqlite`, on a multi-thread
/// runtime with two workers unless `worker_threads = N` says otherwise.
/// `backends!(fn name, blocking);` stamps out plain `#[test]`s over a synchronous
/// `fn name<DB>()`, for tests that build their own runtime.
#[macro_export]
macro_rules! backends {
    (fn $name:ident) => {
        $crate::backends!(fn $name, worker_threads = 2);
    };
    (fn $name:ident, blocking) => {
        $crate::cases!(#[test] fn $name {
            postgres => super::$name::<sqlx::Postgres>(),
            sqlite => super::$name::<sqlx::Sqlite>(),
        });
    };
    (fn $name:ident, worker_threads = $threads:literal) => {
        $crate::cases!(
            #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
            async fn $name {
                postgres => super::$name::<sqlx::Postgres>(),
                sqlite => super::$name::<sqlx::Sqlite>(),
            }
        );
    };
}

/// Stamps out one test per [`Broker`](crate::Broker) over `async fn name(broker: Broker)`:
/// `each_broker!(demo_through);` gives `demo_through::rabbitmq`, `::nats`, `::redis`, `::sqs`
/// and `::kafka`, each on a multi-thread runtime with two workers. Attributes before a name
/// (an `ignore` without a feature) go on each of its tests.
#[macro_export]
macro_rules! each_broker {
    ($($(#[$attr:meta])* $name:ident),+ $(,)?) => {$(
        $crate::cases!(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$attr])*
            async fn $name {
                rabbitmq => super::$name($crate::Broker::Rabbitmq),
                nats => super::$name($crate::Broker::Nats),
                redis => super::$name($crate::Broker::Redis),
                sqs => super::$name($crate::Broker::Sqs),
                kafka => super::$name($crate::Broker::Kafka),
            }
        );
    )+};
}
