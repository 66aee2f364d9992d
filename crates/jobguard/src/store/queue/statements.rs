//! The binding and decoding of the queue's statements, the same on every backend: only their
//! SQL differs, and that comes from the backend's [`QueueSql`](super::QueueSql). The order in
//! which each statement's parameters are bound here is the contract its SQL text meets.

/// The [`QueueStore`](super::QueueStore) methods whose binding and decoding are the same on
/// every backend, with [`QueueStore::queue_sql`](super::QueueStore::queue_sql) from a module
/// named `queue` in scope (its `queue_sql(table)`), and the backend's `kinds_param(kinds)`, the
/// kinds a fetch takes as its statement's `$4` binds them. Expanded inside each `impl QueueStore`,
/// where the backend's `Row` and `Connection` types are concrete.
macro_rules! queue_statements {
    () => {
        fn queue_sql(
            table: &$crate::table::TableName,
        ) -> $crate::Result<$crate::store::queue::QueueSql> {
            <Self as $crate::store::guard::GuardStore>::guard_sql(table)?;
            Ok(queue_sql(table))
        }

        async fn enqueue(
            conn: &mut Self::Connection,
            sql: &$crate::store::queue::QueueSql,
            job: &$crate::store::queue::NewJob,
        ) -> sqlx::Result<Option<i64>> {
            // A job whose policy keeps its key past the live states takes the statement that
            // stores its policy; every other the one the Python package shares.
            let mask = job.unique.states_kept().mask();
            let statement = if mask == 0 { &sql.enqueue } else { &sql.enqueue_unique };
            let query = sqlx::query_scalar(sqlx::AssertSqlSafe(statement.clone()))
                .bind(&job.kind)
                .bind(job.key.as_str())
                .bind(&job.queue)
                .bind(sqlx::types::Json(&job.payload))
                .bind(job.max_attempts as i32)
                .bind($crate::time::duration_micros(job.delay));
            let query = if mask == 0 { query } else { query.bind(mask) };
            query.fetch_optional(conn).await
        }

        async fn holder(
            conn: &mut Self::Connection,
            sql: &$crate::store::queue::QueueSql,
            key: &str,
            kept: bool,
        ) -> $crate::Result<Option<$crate::store::queue::Holder>> {
            let row: Option<$crate::store::queue::HolderColumns> =
                sqlx::query_as(sqlx::AssertSqlSafe(sql.holder.clone()))
                    .bind(key)
                    .bind(i32::from(kept))
                    .fetch_optional(conn)
                    .await?;
            row.map($crate::store::queue::Holder::try_from).transpose()
        }

        async fn replace(
            conn: &mut Self::Connection,
            sql: &$crate::store::queue::QueueSql,
            id: i64,
            job: &$crate::store::queue::NewJob,
        ) -> sqlx::Result<bool> {
            let replaced: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.replace.clone()))
                .bind(id)
                .bind(sqlx::types::Json(&job.payload))
                .bind($crate::time::duration_micros(job.delay))
                .fetch_optional(conn)
                .await?;
            Ok(replaced.is_some())
        }

        async fn notify(
            conn: &mut Self::Connection,
            statement: &std::sync::Arc<str>,
            channel: &str,
            payload: &str,
        ) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
                .bind(channel)
                .bind(payload)
                .execute(conn)
                .await?;
            Ok(())
        }

        async fn fetch(
            conn: &mut Self::Connection,
            sql: &$crate::store::queue::QueueSql,
            fetch: $crate::store::queue::Fetch<'_>,
        ) -> sqlx::Result<Vec<$crate::store::queue::LeasedJob>> {
            use sqlx::Row as _;
            let statement = match (fetch.kinds, fetch.after) {
                (None, None) => &sql.fetch,
                (None, Some(_)) => &sql.fetch_after,
                (Some(_), None) => &sql.fetch_kinds,
                (Some(_), Some(_)) => &sql.fetch_kinds_after,
            };
            let query = sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
                .bind(fetch.queue)
                .bind(i64::from(fetch.limit))
                .bind($crate::time::duration_micros(fetch.lease));
            let query = match fetch.kinds {
                Some(kinds) => query.bind(kinds_param(kinds)),
                None => query,
            };
            let query = match fetch.after {
                Some(place) => query.bind(place.run_at_us).bind(place.id),
                None => query,
            };
            let rows = query.fetch_all(conn).await?;
            rows.into_iter()
                .map(|row| {
                    let payload: sqlx::types::Json<serde_json::Value> = row.try_get(3)?;
                    Ok($crate::store::queue::LeasedJob {
                        lease: $crate::store::queue::Lease {
                            job_id: row.try_get(0)?,
                            attempt: row.try_get(4)?,
                            token: row.try_get(7)?,
                        },
                        kind: row.try_get(1)?,
                        key: row.try_get(2)?,
                        payload: payload.0,
                        max_attempts: row.try_get(5)?,
                        leased_until: $crate::time::micros_to_time(row.try_get(6)?),
                        run_at: $crate::time::micros_to_time(row.try_get(8)?),
                        replayed: row.try_get(9)?,
                    })
                })
                .collect()
        }

        async fn settle(
            conn: &mut Self::Connection,
            sql: &$crate::store::queue::QueueSql,
            lease: $crate::store::queue::Lease,
            how: $crate::store::queue::Settle<'_>,
        ) -> sqlx::Result<bool> {
            use $crate::store::queue::Settle;
            use $crate::time::duration_micros;
            let statement = match how {
                Settle::Complete => &sql.complete,
                Settle::Retry { .. } => &sql.retry,
                Settle::Dead { .. } => &sql.dead,
                Settle::Release => &sql.release,
                Settle::GiveBack { .. } => &sql.give_back,
                Settle::Extend { .. } => &sql.heartbeat,
            };
            let query = sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
                .bind(lease.job_id)
                .bind(lease.token);
            let query = match how {
                Settle::Complete | Settle::Release => query,
                Settle::Retry { delay, error } => query.bind(duration_micros(delay)).bind(error),
                Settle::Dead { error } => query.bind(error),
                Settle::Extend { lease } => query.bind(duration_micros(lease)),
                Settle::GiveBack { delay } => query.bind(duration_micros(delay)),
            };
            Ok(query.execute(conn).await?.rows_affected() == 1)
        }

        async fn extend_leases(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
            leases: &[$crate::store::queue::Lease],
            by: std::time::Duration,
        ) -> sqlx::Result<Vec<i64>> {
            let held: Vec<serde_json::Value> = leases
                .iter()
                .map(|lease| serde_json::json!({ "id": lease.job_id, "token": lease.token }))
                .collect();
            let held = serde_json::Value::Array(held).to_string();
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.heartbeat_many.clone()))
                .bind(held)
                .bind($crate::time::duration_micros(by))
                .fetch_all(pool)
                .await
        }

        async fn rescue(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
            max_attempts: i32,
            mut held: Vec<String>,
            kinds: Option<&[String]>,
        ) -> sqlx::Result<u64> {
            // The heartbeats kept outside the table are read once the transaction holds the
            // write lock (SQLite's `begin immediate`): read before, they would miss the
            // heartbeats written while the rescue waited for the lock, however long that was.
            let mut tx = <Self as $crate::store::database::Store>::begin(pool).await?;
            held.extend(Self::held_aside(pool, sql));
            let held = serde_json::to_string(&held).expect("strings serialize");
            let done = sqlx::query(sqlx::AssertSqlSafe(sql.rescue.clone()))
                .bind(max_attempts)
                .bind(held)
                .bind(kinds.map(kinds_param))
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(done.rows_affected())
        }

        async fn counts(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
        ) -> sqlx::Result<Vec<$crate::store::database::StateCount>> {
            let rows: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql.counts.clone()))
                .fetch_all(pool)
                .await?;
            Ok(rows.into_iter().map($crate::store::database::StateCount::from).collect())
        }

        async fn backlog(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
        ) -> sqlx::Result<Vec<$crate::store::queue::Backlog>> {
            let rows: Vec<(String, i64, i64)> =
                sqlx::query_as(sqlx::AssertSqlSafe(sql.backlog.clone()))
                    .fetch_all(pool)
                    .await?;
            Ok(rows
                .into_iter()
                .map(|(queue, ready, oldest_micros)| $crate::store::queue::Backlog {
                    queue,
                    ready,
                    oldest_wait: std::time::Duration::from_micros(oldest_micros.max(0) as u64),
                })
                .collect())
        }

        async fn list(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
            filter: &$crate::store::queue::JobFilter,
            limit: i64,
        ) -> $crate::Result<Vec<$crate::store::queue::JobRow>> {
            let statement = format!("{} {}", sql.list, filter.clause(&sql.held));
            let mut query = sqlx::query(sqlx::AssertSqlSafe(statement));
            if let Some(state) = filter.state {
                query = query.bind(state.stored());
            }
            for text in [&filter.kind, &filter.queue, &filter.key]
                .into_iter()
                .flatten()
            {
                query = query.bind(text.as_str());
            }
            if let Some(before) = filter.before {
                query = query.bind(before);
            }
            let rows = query.bind(limit).fetch_all(pool).await?;
            rows.iter().map($crate::store::queue::JobRow::from_row).collect()
        }

        async fn replay(
            pool: &sqlx::Pool<Self>,
            sql: &$crate::store::queue::QueueSql,
            id: Option<i64>,
            kind: Option<&str>,
        ) -> sqlx::Result<Vec<i64>> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.replay.clone()))
                .bind(id)
                .bind(kind)
                .fetch_all(pool)
                .await
        }
    };
}
pub(crate) use queue_statements;
