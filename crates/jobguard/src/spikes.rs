//! Duplicate spikes: each job kind's duplicates per window, against the kind's own recent
//! baseline.
//!
//! A steady trickle of duplicates is what at-least-once delivery looks like. A spike means mass
//! redelivery: a crashed worker fleet whose jobs all come back, a lease or visibility timeout
//! shorter than the job, a producer enqueueing in a retry loop. Nothing was applied twice (the
//! guard saw to that), but something upstream is wrong and worth a look.
//!
//! A [`SpikeDetector`] counts applied and duplicate outcomes per kind in the current window.
//! When the window closes, each kind's duplicates are compared with its *baseline*, the mean of
//! its previous [`baseline_windows`](SpikeConfig::baseline_windows) windows. The window is a
//! spike when the kind has enough history ([`warmup_windows`](SpikeConfig::warmup_windows)), the
//! duplicates reach [`min_duplicates`](SpikeConfig::min_duplicates) (a few duplicates are never
//! news), and they exceed [`factor`](SpikeConfig::factor) times the baseline. A spike logs a
//! warning with the kind and the likely causes, and sets
//! [`jobguard_duplicate_spike{kind}`](crate::metrics::DUPLICATE_SPIKE) to 1 until a window that
//! is not one sets it back to 0. Spike windows join the baseline like any other, so a rate that
//! stays high becomes the new normal after a few windows instead of alerting forever.
//!
//! The detector is a plain value that closes windows when told, so tests drive it window by
//! window. A [`SpikeWatch`] feeds it every outcome this process counts (the worker's and the
//! guard's, through [`metrics`](crate::metrics)) and closes a window every
//! [`window`](SpikeConfig::window):
//!
//! ```no_run
//! use jobguard::spikes::{SpikeConfig, SpikeWatch};
//!
//! # async fn f() -> jobguard::Result<()> {
//! let watch = SpikeWatch::install(SpikeConfig::default())?;
//! // ... start the worker ...
//! watch.run(jobguard::worker::shutdown_signal()).await;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::metrics::DUPLICATE_SPIKE;

/// What a spike of duplicates usually means, as the warning says it.
pub const LIKELY_CAUSES: &str = "mass redelivery: a crashed worker fleet whose jobs came back, \
     a lease or visibility timeout shorter than the job, or a producer enqueueing in a retry loop";

/// How spikes are told from the usual trickle.
#[derive(Clone, Debug, PartialEq)]
pub struct SpikeConfig {
    /// The length of a window, for [`SpikeWatch::run`] (default a minute).
    pub window: Duration,
    /// How many earlier windows make a kind's baseline (default 10).
    pub baseline_windows: usize,
    /// How many windows a kind must have been seen for before it can spike (default 3), so
    /// that a process that just started does not take the usual rate for a spike.
    pub warmup_windows: usize,
    /// The fewest duplicates in a window that can be a spike (default 20).
    pub min_duplicates: u64,
    /// How many times its baseline a kind's duplicates must exceed (default 5).
    pub factor: f64,
    /// How many closed windows are kept for [`SpikeDetector::history`] (default 60).
    pub history: usize,
}

impl Default for SpikeConfig {
    fn default() -> Self {
        SpikeConfig {
            window: Duration::from_secs(60),
            baseline_windows: 10,
            warmup_windows: 3,
            min_duplicates: 20,
            factor: 5.0,
            history: 60,
        }
    }
}

impl SpikeConfig {
    /// Checks the settings, with a message that says what is accepted.
    pub fn validate(&self) -> Result<()> {
        let invalid = |setting, reason: &str| {
            Err(Error::InvalidConfig {
                setting,
                reason: reason.to_owned(),
            })
        };
        if self.window < Duration::from_millis(100) {
            return invalid(
                "spike window",
                "use at least 100ms; a minute suits most queues",
            );
        }
        if self.baseline_windows == 0 {
            return invalid("spike baseline windows", "use at least 1");
        }
        if self.min_duplicates == 0 {
            return invalid(
                "spike minimum duplicates",
                "use at least 1, or every first duplicate is a spike",
            );
        }
        if !(self.factor.is_finite() && self.factor >= 1.0) {
            return invalid("spike factor", "use a finite number of at least 1");
        }
        Ok(())
    }
}

/// One kind's figures in one window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KindWindow {
    /// Deliveries that applied the job's effect.
    pub applied: u64,
    /// Deliveries that found the key already applied.
    pub duplicates: u64,
    /// The kind's mean duplicates per window before this one.
    pub baseline: f64,
    /// Whether this window was a spike.
    pub spike: bool,
}

/// One window's figures, per kind.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Window {
    /// When the window ended (for the open window: now), in milliseconds since the Unix epoch.
    #[serde(serialize_with = "millis")]
    pub ended: SystemTime,
    /// The kinds seen so far, including those quiet in this window.
    pub kinds: BTreeMap<String, KindWindow>,
}

fn millis<S: serde::Serializer>(time: &SystemTime, s: S) -> std::result::Result<S::Ok, S::Error> {
    let ms = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    s.serialize_u64(ms as u64)
}

/// A kind whose duplicates spiked in the window just closed.
#[derive(Clone, Debug, PartialEq)]
pub struct Spike {
    /// The job kind.
    pub kind: String,
    /// Its duplicates in the window.
    pub duplicates: u64,
    /// Its mean duplicates per window before.
    pub baseline: f64,
}

#[derive(Debug, Default)]
struct KindState {
    /// Duplicates of the last closed windows, oldest first.
    recent: VecDeque<u64>,
    /// Windows closed since the kind was first seen.
    windows: usize,
    spiking: bool,
}

/// Tells a kind's spike of duplicates from its usual trickle, window by window; see the
/// [module documentation](self).
///
/// ```
/// use std::time::SystemTime;
/// use jobguard::spikes::{SpikeConfig, SpikeDetector};
///
/// let mut detector = SpikeDetector::new(SpikeConfig::default())?;
/// for _ in 0..5 {
///     detector.record("credit", 100, 2); // the usual: 2 duplicates a window
///     assert!(detector.close_window(SystemTime::now()).is_empty());
/// }
/// detector.record("credit", 100, 90); // the fleet crashed and its jobs came back
/// let spikes = detector.close_window(SystemTime::now());
/// assert_eq!(spikes[0].kind, "credit");
/// # Ok::<(), jobguard::Error>(())
/// ```
#[derive(Debug)]
pub struct SpikeDetector {
    config: SpikeConfig,
    /// Applied and duplicates per kind in the open window.
    open: BTreeMap<String, (u64, u64)>,
    /// Applied and duplicates per kind since the detector was made.
    totals: BTreeMap<String, (u64, u64)>,
    kinds: BTreeMap<String, KindState>,
    history: VecDeque<Window>,
}

impl SpikeDetector {
    /// A detector with no history.
    pub fn new(config: SpikeConfig) -> Result<Self> {
        config.validate()?;
        Ok(SpikeDetector {
            config,
            open: BTreeMap::new(),
            totals: BTreeMap::new(),
            kinds: BTreeMap::new(),
            history: VecDeque::new(),
        })
    }

    /// The detector's settings.
    pub fn config(&self) -> &SpikeConfig {
        &self.config
    }

    /// Adds outcomes of `kind` to the open window.
    pub fn record(&mut self, kind: &str, applied: u64, duplicates: u64) {
        let counts = match self.open.get_mut(kind) {
            Some(counts) => counts,
            None => self.open.entry(kind.to_owned()).or_default(),
        };
        counts.0 += applied;
        counts.1 += duplicates;
        let totals = match self.totals.get_mut(kind) {
            Some(totals) => totals,
            None => self.totals.entry(kind.to_owned()).or_default(),
        };
        totals.0 += applied;
        totals.1 += duplicates;
    }

    /// Applied and duplicate deliveries per kind since the detector was made.
    pub fn totals(&self) -> impl Iterator<Item = (&str, u64, u64)> {
        self.totals
            .iter()
            .map(|(kind, (applied, duplicates))| (kind.as_str(), *applied, *duplicates))
    }

    /// Closes the open window at `ended`: judges every kind seen so far against its baseline,
    /// sets its [`DUPLICATE_SPIKE`] gauge, logs a warning for each spike that starts, and
    /// returns the kinds spiking in this window.
    pub fn close_window(&mut self, ended: SystemTime) -> Vec<Spike> {
        for kind in self.open.keys() {
            if !self.kinds.contains_key(kind) {
                self.kinds.insert(kind.clone(), KindState::default());
            }
        }
        let open = std::mem::take(&mut self.open);
        let mut spikes = Vec::new();
        let mut window = Window {
            ended,
            kinds: BTreeMap::new(),
        };
        for (kind, state) in &mut self.kinds {
            let (applied, duplicates) = open.get(kind).copied().unwrap_or_default();
            let baseline = mean(&state.recent);
            let spike = state.windows >= self.config.warmup_windows
                && duplicates >= self.config.min_duplicates
                && duplicates as f64 > self.config.factor * baseline;
            if spike && !state.spiking {
                tracing::warn!(
                    job.kind = %kind,
                    duplicates,
                    baseline,
                    window = ?self.config.window,
                    "duplicate spike: {duplicates} duplicates of `{kind}` in a window against \
                     {baseline:.1} usually; nothing was applied twice, but this is likely \
                     {LIKELY_CAUSES}"
                );
            } else if !spike && state.spiking {
                tracing::info!(job.kind = %kind, duplicates, "duplicate spike over");
            }
            state.spiking = spike;
            metrics::gauge!(DUPLICATE_SPIKE, "kind" => kind.clone()).set(if spike {
                1.0
            } else {
                0.0
            });
            if spike {
                spikes.push(Spike {
                    kind: kind.clone(),
                    duplicates,
                    baseline,
                });
            }
            state.recent.push_back(duplicates);
            if state.recent.len() > self.config.baseline_windows {
                state.recent.pop_front();
            }
            state.windows += 1;
            window.kinds.insert(
                kind.clone(),
                KindWindow {
                    applied,
                    duplicates,
                    baseline,
                    spike,
                },
            );
        }
        self.history.push_back(window);
        while self.history.len() > self.config.history {
            self.history.pop_front();
        }
        spikes
    }

    /// The closed windows kept, oldest first.
    pub fn history(&self) -> impl ExactSizeIterator<Item = &Window> {
        self.history.iter()
    }

    /// The open window's figures so far, as if it ended at `now` (not judged yet: no spikes).
    pub fn open_window(&self, now: SystemTime) -> Window {
        let mut kinds: BTreeMap<String, KindWindow> = self
            .kinds
            .iter()
            .map(|(kind, state)| {
                let window = KindWindow {
                    baseline: mean(&state.recent),
                    ..KindWindow::default()
                };
                (kind.clone(), window)
            })
            .collect();
        for (kind, (applied, duplicates)) in &self.open {
            let window = kinds.entry(kind.clone()).or_default();
            window.applied = *applied;
            window.duplicates = *duplicates;
        }
        Window { ended: now, kinds }
    }

    /// The kinds whose last closed window was a spike.
    pub fn spiking(&self) -> Vec<&str> {
        self.kinds
            .iter()
            .filter(|(_, state)| state.spiking)
            .map(|(kind, _)| kind.as_str())
            .collect()
    }
}

fn mean(values: &VecDeque<u64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<u64>() as f64 / values.len() as f64
}

/// The detector that this process's outcomes feed, if a [`SpikeWatch`] is installed.
static WATCHED: RwLock<Option<Arc<Mutex<SpikeDetector>>>> = RwLock::new(None);

/// Counts an outcome in [`metrics`](crate::metrics) and feeds it to the spike watch, if any.
pub(crate) fn record_outcome(kind: &str, outcome: &'static str) {
    crate::metrics::count_outcome(kind, outcome);
    observe(kind, outcome);
}

/// Called for every outcome counted in [`metrics`](crate::metrics).
fn observe(kind: &str, outcome: &str) {
    let (applied, duplicates) = match outcome {
        "applied" => (1, 0),
        "duplicate" => (0, 1),
        _ => return,
    };
    let watched = WATCHED
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(detector) = watched.as_ref() {
        lock(detector).record(kind, applied, duplicates);
    }
}

fn lock(detector: &Mutex<SpikeDetector>) -> std::sync::MutexGuard<'_, SpikeDetector> {
    detector
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Watches the duplicates this process counts: every applied and duplicate outcome that the
/// guard and the worker count through [`metrics`](crate::metrics) goes into its
/// [`SpikeDetector`], whatever recorder (if any) is installed.
///
/// One watch is installed per process at a time; installing another replaces it, and dropping
/// the installed one stops the counting.
#[derive(Debug)]
pub struct SpikeWatch {
    detector: Arc<Mutex<SpikeDetector>>,
}

impl SpikeWatch {
    /// Starts counting this process's outcomes into a new detector.
    pub fn install(config: SpikeConfig) -> Result<Self> {
        let detector = Arc::new(Mutex::new(SpikeDetector::new(config)?));
        let mut watched = WATCHED
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *watched = Some(Arc::clone(&detector));
        Ok(SpikeWatch { detector })
    }

    /// Closes a window every [`SpikeConfig::window`] until `shutdown` resolves.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        let every = lock(&self.detector).config.window;
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticks.tick() => {
                    self.close_window();
                }
            }
        }
    }

    /// Closes the open window now; see [`SpikeDetector::close_window`].
    pub fn close_window(&self) -> Vec<Spike> {
        lock(&self.detector).close_window(SystemTime::now())
    }

    /// Runs `read` on the detector, e.g. to copy its history for a dashboard.
    pub fn read<T>(&self, read: impl FnOnce(&SpikeDetector) -> T) -> T {
        read(&lock(&self.detector))
    }
}

impl Drop for SpikeWatch {
    fn drop(&mut self) {
        let mut watched = WATCHED
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if watched
            .as_ref()
            .is_some_and(|installed| Arc::ptr_eq(installed, &self.detector))
        {
            *watched = None;
        }
    }
}
