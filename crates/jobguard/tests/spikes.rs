//! Duplicate spikes, window by window: a simulated mass redelivery trips
//! `jobguard_duplicate_spike{kind}`, a steady trickle never does. Windows are closed by the
//! test, so nothing depends on timing.
//!
//! The recorder is thread-local (`metrics::with_local_recorder`): each test runs everything on
//! its own thread, and the worker test on a current-thread runtime.

// The installed watch is process-wide and every outcome in the process feeds it, so these tests
// run in a binary of their own rather than in `it`, beside tests of other kinds.
#[path = "it/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use jobguard::metrics::DUPLICATE_SPIKE;
use jobguard::queue::NewJob;
use jobguard::retention::PruneConfig;
use jobguard::spikes::{SpikeConfig, SpikeDetector, SpikeWatch};
use jobguard::{Job, JobError, JobKey, KeyError, Queue, Worker, WorkerConfig};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde::{Deserialize, Serialize};

use common::TestDb;

/// The spike gauge per kind, as last set.
fn spike_gauges(snapshotter: &Snapshotter) -> BTreeMap<String, f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == DUPLICATE_SPIKE)
        .map(|(key, _, _, value)| {
            let kind = key
                .key()
                .labels()
                .find(|label| label.key() == "kind")
                .expect("a kind label")
                .value()
                .to_owned();
            let DebugValue::Gauge(value) = value else {
                panic!("{key:?} is not a gauge: {value:?}")
            };
            (kind, value.into_inner())
        })
        .collect()
}

/// Runs `test` with a fresh recorder of its own and returns the spike gauges it left.
fn with_recorder(test: impl FnOnce()) -> BTreeMap<String, f64> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, test);
    spike_gauges(&snapshotter)
}

/// Window `n` of a test, a minute apart.
fn at(n: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + 60 * n)
}

fn detector() -> SpikeDetector {
    SpikeDetector::new(SpikeConfig::default()).unwrap()
}

#[test]
fn a_mass_redelivery_trips_the_gauge_and_a_quiet_window_clears_it() {
    let gauges = with_recorder(|| {
        let mut detector = detector();
        // The usual: 100 credits a window, 3 of them delivered twice.
        for n in 0..10 {
            detector.record("credit", 100, 3);
            assert_eq!(detector.close_window(at(n)), [], "window {n}");
        }
        // A worker fleet crashed and its 250 jobs came back after they had been applied.
        detector.record("credit", 40, 250);
        let spikes = detector.close_window(at(10));
        assert_eq!(spikes.len(), 1, "{spikes:?}");
        assert_eq!(spikes[0].kind, "credit");
        assert_eq!(spikes[0].duplicates, 250);
        assert!((spikes[0].baseline - 3.0).abs() < 1e-9, "{spikes:?}");
        assert_eq!(detector.spiking(), ["credit"]);
        let last = detector.history().last().unwrap();
        assert!(last.kinds["credit"].spike, "{last:?}");
    });
    assert_eq!(gauges, BTreeMap::from([("credit".to_owned(), 1.0)]));

    let gauges = with_recorder(|| {
        let mut detector = detector();
        for n in 0..10 {
            detector.record("credit", 100, 3);
            detector.close_window(at(n));
        }
        detector.record("credit", 40, 250);
        assert_eq!(detector.close_window(at(10)).len(), 1);
        detector.record("credit", 100, 4);
        assert_eq!(detector.close_window(at(11)), []);
        assert!(detector.spiking().is_empty());
    });
    assert_eq!(gauges, BTreeMap::from([("credit".to_owned(), 0.0)]));
}

#[test]
fn a_steady_trickle_never_spikes() {
    let gauges = with_recorder(|| {
        let mut detector = detector();
        // 25 to 35 duplicates every window, well over the minimum of 20, for two hours.
        for n in 0..120 {
            detector.record("credit", 1000, 25 + (n * 7) % 11);
            assert_eq!(detector.close_window(at(n)), [], "window {n}");
        }
        // Quiet windows and a kind that only ever has a few duplicates.
        for n in 120..130 {
            detector.record("fee", 10, n % 3);
            assert_eq!(detector.close_window(at(n)), [], "window {n}");
        }
    });
    assert_eq!(
        gauges,
        BTreeMap::from([("credit".to_owned(), 0.0), ("fee".to_owned(), 0.0)])
    );
}

#[test]
fn each_kind_is_judged_against_its_own_baseline() {
    let gauges = with_recorder(|| {
        let mut detector = detector();
        for n in 0..10 {
            detector.record("busy", 5000, 100);
            detector.record("rare", 50, 1);
            detector.close_window(at(n));
        }
        // 150 duplicates is the busy kind's usual rate and a half; for the rare kind, 60 is a
        // spike.
        detector.record("busy", 5000, 150);
        detector.record("rare", 50, 60);
        let spikes = detector.close_window(at(10));
        let kinds: Vec<&str> = spikes.iter().map(|spike| spike.kind.as_str()).collect();
        assert_eq!(kinds, ["rare"]);
    });
    assert_eq!(
        gauges,
        BTreeMap::from([("busy".to_owned(), 0.0), ("rare".to_owned(), 1.0)])
    );
}

#[test]
fn a_few_duplicates_or_a_process_just_started_are_no_spike() {
    let mut detector = detector();
    // The first windows of a kind only build its baseline, however many duplicates they hold.
    detector.record("credit", 0, 500);
    assert_eq!(detector.close_window(at(0)), []);
    detector.record("credit", 0, 500);
    assert_eq!(detector.close_window(at(1)), []);
    detector.record("credit", 0, 500);
    assert_eq!(detector.close_window(at(2)), []);

    // A kind that never had a duplicate: 19 in a window are below the minimum, 20 are not.
    let config = SpikeConfig {
        warmup_windows: 1,
        ..SpikeConfig::default()
    };
    for (duplicates, spikes) in [(19, 0), (20, 1)] {
        let mut detector = detector_with(config.clone());
        detector.record("fee", 10, 0);
        detector.close_window(at(0));
        detector.record("fee", 10, duplicates);
        assert_eq!(detector.close_window(at(1)).len(), spikes, "{duplicates}");
    }
}

#[test]
fn a_rate_that_stays_high_becomes_the_baseline() {
    let mut detector = detector();
    for n in 0..5 {
        detector.record("credit", 100, 2);
        detector.close_window(at(n));
    }
    let mut spiking = Vec::new();
    for n in 5..20 {
        detector.record("credit", 100, 80);
        spiking.push(!detector.close_window(at(n)).is_empty());
    }
    assert!(spiking[0], "the jump is a spike");
    assert!(
        !spiking[14],
        "fifteen windows later it is the usual: {spiking:?}"
    );
}

#[test]
fn history_and_open_window_feed_the_chart() {
    let mut detector = detector_with(SpikeConfig {
        history: 3,
        ..SpikeConfig::default()
    });
    for n in 0..5 {
        detector.record("credit", n, 1);
        detector.close_window(at(n));
    }
    let ended: Vec<SystemTime> = detector.history().map(|w| w.ended).collect();
    assert_eq!(ended, [at(2), at(3), at(4)]);
    detector.record("credit", 7, 2);
    detector.record("fee", 1, 0);
    let open = detector.open_window(at(5));
    assert_eq!(
        (
            open.kinds["credit"].applied,
            open.kinds["credit"].duplicates
        ),
        (7, 2)
    );
    assert_eq!(open.kinds["fee"].applied, 1);
    let totals: Vec<(&str, u64, u64)> = detector.totals().collect();
    assert_eq!(totals, [("credit", 17, 7), ("fee", 1, 0)]);
}

#[test]
fn settings_are_checked() {
    for config in [
        SpikeConfig {
            window: Duration::ZERO,
            ..SpikeConfig::default()
        },
        SpikeConfig {
            baseline_windows: 0,
            ..SpikeConfig::default()
        },
        SpikeConfig {
            min_duplicates: 0,
            ..SpikeConfig::default()
        },
        SpikeConfig {
            factor: f64::NAN,
            ..SpikeConfig::default()
        },
        SpikeConfig {
            factor: 0.5,
            ..SpikeConfig::default()
        },
    ] {
        let error = SpikeDetector::new(config.clone()).unwrap_err();
        assert!(
            matches!(error, jobguard::Error::InvalidConfig { .. }),
            "{config:?}: {error:?}"
        );
    }
}

fn detector_with(config: SpikeConfig) -> SpikeDetector {
    SpikeDetector::new(config).unwrap()
}

/// A job that does nothing but be applied once per key.
#[derive(Serialize, Deserialize)]
struct Ping {
    n: u32,
}

impl<DB: TestDb> Job<DB> for Ping {
    const KIND: &'static str = "ping";

    fn key(&self) -> Result<JobKey, KeyError> {
        JobKey::new("ping", [self.n.to_string()])
    }

    async fn run(&self, conn: &mut DB::Connection) -> Result<(), JobError> {
        DB::insert_ledger(conn, 1, 1).await?;
        Ok(())
    }
}

/// The worker's outcomes reach an installed watch: quiet windows of pings, then a producer
/// that enqueues the same 40 pings again (a retry loop) makes a spike of `ping`.
async fn worker_feeds_the_watch<DB: TestDb>(test: &str, watch: &SpikeWatch) -> Option<()> {
    let pool = DB::open(test, 6).await?;
    let queue = Queue::new(pool.clone());
    let config = WorkerConfig {
        stop_when_idle: true,
        concurrency: 2,
        // Not about pruning: no scheduled prune task alongside each short run.
        prune: PruneConfig {
            schedule: None,
            ..PruneConfig::default()
        },
        ..WorkerConfig::default()
    };
    let worker = || {
        Worker::with_config(queue.clone(), config.clone())
            .unwrap()
            .register::<Ping>()
    };
    worker().migrate().await.unwrap();
    let enqueue = async |range: std::ops::Range<u32>| {
        for n in range {
            let job = NewJob::new(JobKey::new("ping", [n.to_string()]).unwrap(), &Ping { n })
                .unwrap()
                .kind("ping")
                .unwrap();
            queue.enqueue(&job).await.unwrap();
        }
    };

    // Three windows of new pings, and one of them delivered again: the usual trickle.
    for window in 0..3 {
        enqueue(window * 10..window * 10 + 10).await;
        let stats = worker().run(std::future::pending()).await.unwrap();
        assert_eq!((stats.applied, stats.duplicates), (10, 0));
        enqueue(window * 10..window * 10 + 1).await;
        let stats = worker().run(std::future::pending()).await.unwrap();
        assert_eq!((stats.applied, stats.duplicates), (0, 1));
        assert_eq!(watch.close_window(), [], "window {window}");
    }
    // The same 30 pings and 10 new ones, all at once.
    enqueue(0..40).await;
    let stats = worker().run(std::future::pending()).await.unwrap();
    assert_eq!((stats.applied, stats.duplicates), (10, 30));
    let spikes = watch.close_window();
    assert_eq!(spikes.len(), 1, "{spikes:?}");
    assert_eq!(
        (spikes[0].kind.as_str(), spikes[0].duplicates),
        ("ping", 30)
    );
    let history: Vec<(u64, u64)> = watch.read(|detector| {
        detector
            .history()
            .map(|w| (w.kinds["ping"].applied, w.kinds["ping"].duplicates))
            .collect()
    });
    assert_eq!(
        history[history.len() - 4..],
        [(10, 1), (10, 1), (10, 1), (10, 30)]
    );
    Some(())
}

/// One test installs the process's watch, and runs both backends in turn.
#[test]
fn the_worker_feeds_the_installed_watch_on_every_backend() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for backend in ["sqlite", "postgres"] {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let ran = metrics::with_local_recorder(&recorder, || {
            let watch = SpikeWatch::install(SpikeConfig::default()).unwrap();
            runtime.block_on(async {
                match backend {
                    "sqlite" => {
                        worker_feeds_the_watch::<sqlx::Sqlite>("spikes_watch", &watch).await
                    }
                    _ => worker_feeds_the_watch::<sqlx::Postgres>("spikes_watch", &watch).await,
                }
            })
        });
        if ran.is_none() {
            assert_eq!(backend, "postgres", "SQLite is always there");
            continue;
        }
        assert_eq!(
            spike_gauges(&snapshotter),
            BTreeMap::from([("ping".to_owned(), 1.0)]),
            "{backend}"
        );
    }
}
