//! Fetch and lease: disjoint fetches, skipped locks, order and delays, fenced leases, extend, release and complete.

use super::*;

// 6.
backends!(fn concurrent_fetches_take_disjoint_jobs, worker_threads = 4);
async fn concurrent_fetches_take_disjoint_jobs<DB: TestDb>() {
    let Some((_pool, queue)) = open::<DB>("concurrent_fetches_take_disjoint_jobs", 10).await else {
        return;
    };
    let mut ids = BTreeSet::new();
    for n in 0..50 {
        ids.insert(queue.enqueue(&job("credit", n)).await.unwrap().id);
    }
    let start = Arc::new(tokio::sync::Barrier::new(2));

    let before = SystemTime::now();
    let fetchers: Vec<_> = (0..2)
        .map(|_| {
            let (queue, start) = (queue.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                queue.fetch(DEFAULT_QUEUE, 30, LONG).await
            })
        })
        .collect();
    let mut batches = Vec::new();
    for fetcher in fetchers {
        batches.push(fetcher.await.unwrap().expect("fetch succeeds"));
    }
    let after = SystemTime::now();

    let sets: Vec<BTreeSet<i64>> = batches
        .iter()
        .map(|batch| batch.iter().map(|job| job.lease.job_id).collect())
        .collect();
    assert_eq!(sets[0].len(), batches[0].len(), "no job twice in one batch");
    assert_eq!(sets[1].len(), batches[1].len(), "no job twice in one batch");
    assert!(
        sets[0].is_disjoint(&sets[1]),
        "both fetchers leased {:?}",
        sets[0].intersection(&sets[1])
    );
    assert!(
        batches.iter().all(|batch| batch.len() <= 30),
        "a batch over the limit"
    );
    let union: BTreeSet<i64> = sets[0].union(&sets[1]).copied().collect();
    assert_eq!(union, ids, "together they leased every job");
    for job in batches.iter().flatten() {
        assert_eq!(job.lease.attempt, 1, "{job:?}");
        assert_eq!(job.max_attempts, 10);
        assert_eq!(job.kind, "credit");
        assert!(
            job.leased_until > before + LONG - SLACK,
            "{job:?} leased from {before:?}"
        );
        assert!(
            job.leased_until < after + LONG + SLACK,
            "{job:?} leased until {after:?}"
        );
    }
    assert_eq!(queue.counts().await.unwrap(), counts(0, 50, 0, 0));
    assert!(
        queue
            .fetch(DEFAULT_QUEUE, 30, LONG)
            .await
            .unwrap()
            .is_empty()
    );
}

// 6, PostgreSQL only: a fetch skips jobs another transaction has locked instead of waiting for
// it (`skip locked`). Two fetchers taking disjoint jobs do not show this: without `skip locked`
// the second waits for the first and then skips the rows it took, with the same result. SQLite
// has no row locks; its single writer makes fetchers take turns.
backends!(fn fetch_skips_jobs_locked_by_another_transaction);
async fn fetch_skips_jobs_locked_by_another_transaction<DB: TestDb>() {
    if <DB as Backend>::BACKEND != "postgres" {
        return;
    }
    let Some((pool, queue)) = open::<DB>("fetch_skips_jobs_locked_by_another_transaction", 4).await
    else {
        return;
    };
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(queue.enqueue(&job("credit", n)).await.unwrap().id);
    }
    // Another fetcher, mid-statement: it holds the oldest job's row lock.
    let mut tx = pool.begin().await.unwrap();
    let locked = DB::fetch_i64(
        &mut tx,
        "select id from jobguard_jobs where id = $1 for update",
        ids[0],
    )
    .await
    .unwrap();

    let fetch = queue.fetch(DEFAULT_QUEUE, 10, LONG);
    let fetched = tokio::time::timeout(SLACK, fetch).await;
    tx.rollback().await.unwrap();
    let fetched = fetched
        .expect("the fetch waited for the locked row")
        .unwrap();
    let fetched: Vec<i64> = fetched.iter().map(|job| job.lease.job_id).collect();
    assert_eq!(fetched, ids[1..], "every job but the locked one");
    assert_eq!(fetch_one::<DB>(&queue, LONG).await.lease.job_id, locked);
}

// 6, continued.
backends!(fn fetch_respects_queues_delays_and_order);
async fn fetch_respects_queues_delays_and_order<DB: TestDb>() {
    let Some((_pool, queue)) = open::<DB>("fetch_respects_queues_delays_and_order", 4).await else {
        return;
    };
    let oldest = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    let second = queue.enqueue(&job("credit", 2)).await.unwrap().id;
    let mail = queue
        .enqueue(&job("credit", 3).queue("mail").unwrap())
        .await
        .unwrap()
        .id;
    let delayed = queue
        .enqueue(&job("credit", 4).delay(HOUR))
        .await
        .unwrap()
        .id;
    let third = queue.enqueue(&job("credit", 5)).await.unwrap().id;
    assert_eq!(queue.counts().await.unwrap(), counts(5, 0, 0, 0));
    let delayed_row = row::<DB>(&queue, delayed).await;
    assert_near(
        delayed_row.run_at,
        SystemTime::now() + HOUR,
        "run time of the delayed job",
    );
    assert_eq!(row::<DB>(&queue, mail).await.queue, "mail");

    let first_two = queue.fetch(DEFAULT_QUEUE, 2, LONG).await.unwrap();
    let ids: Vec<i64> = first_two.iter().map(|job| job.lease.job_id).collect();
    assert_eq!(ids, [oldest, second], "oldest run time first");
    let rest = queue.fetch(DEFAULT_QUEUE, 10, LONG).await.unwrap();
    let ids: Vec<i64> = rest.iter().map(|job| job.lease.job_id).collect();
    assert_eq!(
        ids,
        [third],
        "neither the other queue's job nor the delayed one"
    );
    assert!(
        queue
            .fetch("nothing-here", 10, LONG)
            .await
            .unwrap()
            .is_empty()
    );

    let on_mail = queue.fetch("mail", 10, LONG).await.unwrap();
    assert_eq!(on_mail.len(), 1);
    assert_lease(on_mail[0].lease, mail, 1);
    assert_eq!(row::<DB>(&queue, delayed).await.state, JobState::Available);
    assert_eq!(queue.counts().await.unwrap(), counts(1, 4, 0, 0));
}

backends!(fn counts_and_backlog_tell_held_jobs_from_waiting_ones_past_the_span);
/// The live counts and the backlog read the held jobs' rows among each queue's first
/// [`HELD_COUNT_SPAN`] jobs only: with more jobs than that waiting, the split is still exact,
/// per queue, with delayed jobs and finished ones left out where they should be.
async fn counts_and_backlog_tell_held_jobs_from_waiting_ones_past_the_span<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("counts_past_the_span", 4).await else {
        return;
    };
    let waiting = HELD_COUNT_SPAN as usize + 50;
    let jobs: Vec<NewJob> = (0..waiting).map(|n| job("credit", n)).collect();
    for chunk in jobs.chunks(2_000) {
        queue.enqueue_many(chunk).await.unwrap();
    }
    for n in 0..5 {
        let on_mail = job("mail", n).queue("mail").unwrap();
        queue.enqueue(&on_mail).await.unwrap();
    }
    for n in 0..3 {
        queue.enqueue(&job("later", n).delay(HOUR)).await.unwrap();
    }
    let held = queue.fetch(DEFAULT_QUEUE, 30, LONG).await.unwrap();
    assert_eq!(held.len(), 30);
    assert_eq!(queue.fetch("mail", 2, LONG).await.unwrap().len(), 2);
    let done = queue.fetch(DEFAULT_QUEUE, 4, LONG).await.unwrap();
    for leased in &done {
        complete::<DB>(&pool, &queue, leased.lease).await.unwrap();
    }

    let default_waiting = (waiting - 34) as i64;
    assert_eq!(
        queue.counts().await.unwrap(),
        counts(default_waiting + 3 + 3, 32, 4, 0)
    );
    let backlog: Vec<(String, i64)> = queue
        .backlog()
        .await
        .unwrap()
        .into_iter()
        .map(|b| (b.queue, b.ready))
        .collect();
    assert_eq!(
        backlog,
        [
            (DEFAULT_QUEUE.to_string(), default_waiting),
            ("mail".to_string(), 3)
        ]
    );

    // Every job of the other queue held: it has no backlog left.
    assert_eq!(queue.fetch("mail", 10, LONG).await.unwrap().len(), 3);
    let queues: Vec<String> = queue
        .backlog()
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.queue)
        .collect();
    assert_eq!(queues, [DEFAULT_QUEUE]);
    assert_eq!(
        queue.counts().await.unwrap(),
        counts(default_waiting + 3, 35, 4, 0)
    );
}

// 7.
backends!(fn expired_lease_is_fenced_after_rescue);
async fn expired_lease_is_fenced_after_rescue<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("expired_lease_is_fenced_after_rescue", 4).await else {
        return;
    };
    let id = queue.enqueue(&job("credit", 7)).await.unwrap().id;
    let first = fetch_one::<DB>(&queue, SHORT).await;
    assert_lease(first.lease, id, 1);
    assert_eq!(
        queue.rescue().await.unwrap(),
        0,
        "the lease has not expired yet"
    );

    sleep_past(first.leased_until).await;
    assert_eq!(queue.rescue().await.unwrap(), 1);
    let rescued = row::<DB>(&queue, id).await;
    assert_eq!((rescued.state, rescued.attempt), (JobState::Available, 1));
    let error = rescued.last_error.unwrap_or_default();
    assert!(error.contains("lease"), "{error}");
    let second = fetch_one::<DB>(&queue, LONG).await;
    assert_lease(second.lease, id, 2);
    assert!(
        second.lease.token > first.lease.token,
        "a new token: {second:?}"
    );

    // The worker of attempt 1 comes back: whatever it did in its transaction rolls back.
    let mut tx = pool.begin().await.unwrap();
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    let stale = queue.complete_tx(&mut tx, first.lease).await;
    assert!(is_fenced(&stale, first.lease), "{stale:?}");
    tx.rollback().await.unwrap();
    let stale = queue.extend(first.lease, LONG).await;
    assert!(is_fenced(&stale, first.lease), "{stale:?}");
    for stale in [
        queue.retry(first.lease, Duration::ZERO, "stale").await,
        queue.dead_letter(first.lease, "stale").await,
        queue.release(first.lease).await,
    ] {
        assert!(is_fenced(&stale, first.lease), "{stale:?}");
    }
    let running = row::<DB>(&queue, id).await;
    assert_eq!((running.state, running.attempt), (JobState::Running, 2));

    queue
        .extend(second.lease, LONG)
        .await
        .expect("the holder extends its lease");
    let mut tx = pool.begin().await.unwrap();
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    queue
        .complete_tx(&mut tx, second.lease)
        .await
        .expect("the holder completes");
    tx.commit().await.unwrap();
    assert_eq!(row::<DB>(&queue, id).await.state, JobState::Completed);
    assert_eq!(
        ledger_rows(&pool).await,
        1,
        "only the holder's effect committed"
    );
    assert_eq!(queue.counts().await.unwrap(), counts(0, 0, 1, 0));

    // A completed job's lease is over too.
    let again = complete::<DB>(&pool, &queue, second.lease).await;
    assert!(is_fenced(&again, second.lease), "{again:?}");
    let again = queue.extend(second.lease, LONG).await;
    assert!(is_fenced(&again, second.lease), "{again:?}");
}

// 7, continued.
backends!(fn extend_keeps_the_lease_and_release_gives_the_job_back);
async fn extend_keeps_the_lease_and_release_gives_the_job_back<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("extend_keeps_the_lease_and_release_gives_back", 4).await
    else {
        return;
    };
    let id = queue.enqueue(&job("credit", 8)).await.unwrap().id;
    let leased = fetch_one::<DB>(&queue, SHORT).await;
    queue.extend(leased.lease, LONG).await.unwrap();
    sleep_past(leased.leased_until).await;
    assert_eq!(
        queue.rescue().await.unwrap(),
        0,
        "the extended lease still holds"
    );
    assert_eq!(row::<DB>(&queue, id).await.state, JobState::Running);

    queue
        .release(leased.lease)
        .await
        .expect("the holder releases");
    let released = row::<DB>(&queue, id).await;
    assert_eq!(
        (released.state, released.attempt),
        (JobState::Available, 0),
        "{released:?}"
    );
    assert_eq!(queue.counts().await.unwrap(), counts(1, 0, 0, 0));
    let again = fetch_one::<DB>(&queue, LONG).await;
    assert_lease(again.lease, id, 1);
    assert_ne!(
        again.lease.token, leased.lease.token,
        "the release did not count as an attempt, the fetch drew a new token"
    );
    // The released lease is over, although the new one has the same attempt number.
    let released = complete::<DB>(&pool, &queue, leased.lease).await;
    assert!(is_fenced(&released, leased.lease), "{released:?}");
    let released = queue.extend(leased.lease, LONG).await;
    assert!(is_fenced(&released, leased.lease), "{released:?}");

    // Extending a lease that expired and was taken over is fenced.
    queue.release(again.lease).await.unwrap();
    let short = fetch_one::<DB>(&queue, SHORT).await;
    sleep_past(short.leased_until).await;
    assert_eq!(queue.rescue().await.unwrap(), 1);
    let taken_over = fetch_one::<DB>(&queue, LONG).await;
    assert_eq!(taken_over.lease.attempt, 2);
    let stale = queue.extend(short.lease, LONG).await;
    assert!(is_fenced(&stale, short.lease), "{stale:?}");
    queue.extend(taken_over.lease, LONG).await.unwrap();
}

// 11.
backends!(fn complete_tx_follows_the_callers_commit_and_rollback);
async fn complete_tx_follows_the_callers_commit_and_rollback<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("complete_tx_follows_commit_and_rollback", 4).await else {
        return;
    };
    let id = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    let leased = fetch_one::<DB>(&queue, SHORT).await;

    let mut tx = pool.begin().await.unwrap();
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    queue.complete_tx(&mut tx, leased.lease).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        row::<DB>(&queue, id).await.state,
        JobState::Running,
        "rolled back with the effect"
    );
    assert_eq!(ledger_rows(&pool).await, 0);

    sleep_past(leased.leased_until).await;
    assert_eq!(queue.rescue().await.unwrap(), 1);
    assert_eq!(row::<DB>(&queue, id).await.state, JobState::Available);
    let again = fetch_one::<DB>(&queue, LONG).await;
    assert_lease(again.lease, id, 2);

    let mut tx = pool.begin().await.unwrap();
    DB::insert_ledger(&mut tx, 7, 500).await.unwrap();
    queue.complete_tx(&mut tx, again.lease).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(row::<DB>(&queue, id).await.state, JobState::Completed);
    assert_eq!(
        ledger_rows(&pool).await,
        1,
        "the job is done together with its effect"
    );
}

// 11, PostgreSQL only: a job whose completion is in flight (its worker's transaction holds the
// row) is not rescued when its lease runs out meanwhile, and rescue does not wait for it. SQLite
// has no row locks: the open transaction holds the one write lock, which rescue would wait for.
backends!(fn rescue_skips_a_job_whose_completion_is_in_flight);
async fn rescue_skips_a_job_whose_completion_is_in_flight<DB: TestDb>() {
    if <DB as Backend>::BACKEND != "postgres" {
        return;
    }
    let Some((pool, queue)) =
        open::<DB>("rescue_skips_a_job_whose_completion_is_in_flight", 4).await
    else {
        return;
    };
    let id = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    let leased = fetch_one::<DB>(&queue, SHORT).await;
    let mut tx = pool.begin().await.unwrap();
    queue.complete_tx(&mut tx, leased.lease).await.unwrap();
    sleep_past(leased.leased_until).await;

    let rescued = tokio::time::timeout(SLACK, queue.rescue()).await;
    let committed = tx.commit().await;
    let rescued = rescued
        .expect("rescue waited for the completing transaction")
        .unwrap();
    assert_eq!(rescued, 0, "the job being completed was rescued");
    committed.unwrap();
    assert_eq!(row::<DB>(&queue, id).await.state, JobState::Completed);
    assert_eq!(queue.rescue().await.unwrap(), 0);
}

/// On PostgreSQL a lease changes no indexed column: taking it, extending it and giving it back
/// are heap-only updates, which write no index entry. (Were the lease to change the job's
/// stored state, every one of them would write an entry in most of the table's indexes.) Four
/// jobs, so that all their row versions fit on their page without pruning, which other
/// transactions' snapshots can hold back.
#[tokio::test]
async fn postgres_leases_are_heap_only_updates() {
    use sqlx::Postgres;

    let Some((pool, queue)) = open::<Postgres>("postgres_leases_are_heap_only_updates", 1).await
    else {
        return;
    };
    for n in 0..4 {
        queue.enqueue(&job("credit", n)).await.unwrap();
    }
    let leased = queue.fetch(DEFAULT_QUEUE, 4, LONG).await.unwrap();
    assert_eq!(leased.len(), 4);
    for job in &leased {
        queue.extend(job.lease, LONG).await.unwrap();
    }
    for job in &leased[..2] {
        queue.release(job.lease).await.unwrap();
    }
    assert_eq!(queue.counts().await.unwrap(), counts(2, 2, 0, 0));
    // The pool's one connection made every update: its statistics reach the shared counters
    // at its next idle moment, which this asks to be now.
    let updates = "select n_tup_upd, n_tup_hot_upd from pg_stat_user_tables
                   where relid = 'jobguard_jobs'::regclass";
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (all, hot) = loop {
        sqlx::query("select pg_stat_force_next_flush()")
            .execute(&pool)
            .await
            .unwrap();
        let (all, hot): (i64, i64) = sqlx::query_as(updates).fetch_one(&pool).await.unwrap();
        if all >= 10 || std::time::Instant::now() > deadline {
            break (all, hot);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(all, 10, "4 leases taken, 4 extended, 2 given back");
    assert_eq!(hot, all, "every lease update was heap-only");
}

// A job that a worker of the earlier schema leased is stored as `running`: the migration leaves
// it so (that worker may still run it; see upgrade.rs), reported and counted running, never
// fetched while its lease lasts, and a lease of this schema cannot complete it.
backends!(fn a_job_leased_under_the_earlier_schema_is_held_after_the_migration);
async fn a_job_leased_under_the_earlier_schema_is_held_after_the_migration<DB: TestDb>() {
    let Some((pool, queue)) = open::<DB>("a_job_leased_under_the_earlier_schema_is_held", 2).await
    else {
        return;
    };
    let id = queue.enqueue(&job("credit", 1)).await.unwrap().id;
    queue.enqueue(&job("credit", 2)).await.unwrap();
    let leased = fetch_one::<DB>(&queue, LONG).await;
    assert_eq!(leased.lease.job_id, id);
    // The earlier schema: a leased job's state `running`, and an index of those leases.
    let mut conn = pool.acquire().await.unwrap();
    DB::execute(
        &mut conn,
        "update jobguard_jobs set state = 'running' where leased_until is not null",
    )
    .await
    .unwrap();
    DB::execute(
        &mut conn,
        "create index jobguard_jobs_leases on jobguard_jobs (leased_until) where state = 'running'",
    )
    .await
    .unwrap();
    let postgres = DB::BACKEND == "postgres";
    if postgres {
        // PostgreSQL migrates a table whose schema marker is not this schema's.
        DB::execute(&mut conn, "comment on table jobguard_jobs is null")
            .await
            .unwrap();
    }
    drop(conn);
    queue.migrate().await.unwrap();

    assert_eq!(row::<DB>(&queue, id).await.state, JobState::Running);
    assert_eq!(queue.counts().await.unwrap(), counts(1, 1, 0, 0));
    let others = queue.fetch(DEFAULT_QUEUE, 10, LONG).await.unwrap();
    assert_eq!(
        others.len(),
        1,
        "the held job is not fetched again: {others:?}"
    );
    assert_ne!(others[0].lease.job_id, id);
    let stored = "select count(*) from jobguard_jobs where state = 'running'";
    assert_eq!(
        DB::count(&pool, stored).await,
        1,
        "left as the earlier worker stored it"
    );
    let done = complete::<DB>(&pool, &queue, leased.lease).await;
    assert!(
        done.is_err(),
        "only the earlier worker's own statements complete it: {done:?}"
    );
    let index = if postgres {
        "select count(*) from pg_indexes where indexname = 'jobguard_jobs_leases'"
    } else {
        "select count(*) from sqlite_master where name = 'jobguard_jobs_leases'"
    };
    assert_eq!(
        DB::count(&pool, index).await,
        0,
        "the index of leases is gone"
    );
}
