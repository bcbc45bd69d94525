//! The PostgreSQL collector: one tokio task per cluster that keeps a
//! connection, refreshes a snapshot of PostgreSQL's own IO statistics every
//! scrape interval, samples wait events, and discovers the cluster's volumes.
//!
//! PostgreSQL being down, restarting or slow never blocks a scrape or a
//! probe: the task reconnects with capped backoff, every query runs under a
//! session `statement_timeout`, and `/metrics` only reads the last snapshot.
//! The session is read-only (`default_transaction_read_only = on`): the
//! exporter never writes to PostgreSQL.

pub mod discovery;
pub mod dsn;
pub mod queries;
pub mod tls;
pub mod waits;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::config::VolumeDefaults;
use crate::model::ceiling::mean_sync_seconds;
use crate::probe::set::VolumeSet;
use crate::types::SyncMethod;
use dsn::Target;
use queries::{Checkpoints, IoRow, Setting, WalStats};
use waits::WaitTotals;

/// A cluster to watch, validated.
#[derive(Clone)]
pub struct ClusterConfig {
    pub name: String,
    /// Secret: may hold a password. Never logged; see [`Target::display`].
    pub dsn: String,
    pub password_file: Option<PathBuf>,
    pub scrape_interval: Duration,
    pub wait_sampling_interval: Duration,
    pub statement_timeout: Duration,
    pub discover_volumes: bool,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("name", &self.name)
            .field("dsn", &"<redacted>")
            .field("password_file", &self.password_file)
            .field("scrape_interval", &self.scrape_interval)
            .field("wait_sampling_interval", &self.wait_sampling_interval)
            .field("discover_volumes", &self.discover_volumes)
            .finish()
    }
}

/// The latest statistics read from a cluster.
#[derive(Debug, Clone, Default)]
pub struct PgStats {
    pub settings: Vec<Setting>,
    pub io: Option<Vec<IoRow>>,
    pub wal: Option<WalStats>,
    pub commits: Option<f64>,
    pub rollbacks: Option<f64>,
    pub checkpoints: Option<Checkpoints>,
}

/// What the metrics encoder reads about a cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterSnapshot {
    pub name: String,
    pub up: bool,
    pub version: Option<(u32, String)>,
    pub stats: Option<PgStats>,
    pub scrape_seconds: Option<f64>,
    pub errors: BTreeMap<&'static str, u64>,
    pub waits: WaitTotals,
    /// (volume, role) pairs from discovery or matching configured volumes.
    pub volumes: Vec<(String, String)>,
    /// Mean WAL sync seconds over the window, from PostgreSQL's counters.
    pub wal_sync_mean: Option<f64>,
}

impl ClusterSnapshot {
    pub fn setting(&self, name: &str) -> Option<&Setting> {
        self.stats
            .as_ref()?
            .settings
            .iter()
            .find(|s| s.name == name)
    }

    pub fn wal_volume(&self) -> Option<&str> {
        self.volumes
            .iter()
            .find(|(_, r)| r == "wal")
            .map(|(v, _)| v.as_str())
    }
}

#[derive(Debug)]
pub struct ClusterState {
    pub name: String,
    window: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    snap: ClusterSnapshot,
    /// (when, syncs, sync seconds) readings within the window.
    wal_history: VecDeque<(Instant, f64, f64)>,
}

impl ClusterState {
    pub fn new(name: &str, window: Duration) -> Arc<ClusterState> {
        Arc::new(ClusterState {
            name: name.to_string(),
            window,
            inner: Mutex::new(Inner {
                snap: ClusterSnapshot {
                    name: name.to_string(),
                    ..Default::default()
                },
                wal_history: VecDeque::new(),
            }),
        })
    }

    pub fn snapshot(&self) -> ClusterSnapshot {
        self.inner
            .lock()
            .map(|i| i.snap.clone())
            .unwrap_or_default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> Option<R> {
        self.inner.lock().ok().map(|mut i| f(&mut i))
    }

    fn error(&self, what: &'static str) {
        self.with(|i| *i.snap.errors.entry(what).or_default() += 1);
    }

    fn down(&self) {
        self.with(|i| {
            i.snap.up = false;
            i.snap.stats = None;
            i.snap.waits.pause();
            i.wal_history.clear();
            i.snap.wal_sync_mean = None;
        });
    }

    fn store(&self, stats: PgStats, seconds: f64, now: Instant) {
        let window = self.window;
        self.with(|i| {
            if let Some(w) = &stats.wal
                && let (Some(n), Some(s)) = (w.syncs, w.sync_seconds)
            {
                i.wal_history.push_back((now, n, s));
                while i
                    .wal_history
                    .front()
                    .is_some_and(|(t, _, _)| now.saturating_duration_since(*t) > window)
                {
                    i.wal_history.pop_front();
                }
                i.snap.wal_sync_mean = match (i.wal_history.front(), i.wal_history.back()) {
                    (Some(a), Some(b)) => mean_sync_seconds((a.1, a.2), (b.1, b.2)),
                    _ => None,
                };
            } else {
                i.snap.wal_sync_mean = None;
            }
            i.snap.up = true;
            i.snap.stats = Some(stats);
            i.snap.scrape_seconds = Some(seconds);
        });
    }
}

/// All clusters, for the metrics encoder.
#[derive(Debug, Default)]
pub struct ClusterSet {
    clusters: RwLock<Vec<Arc<ClusterState>>>,
}

impl ClusterSet {
    pub fn add(&self, c: Arc<ClusterState>) {
        if let Ok(mut v) = self.clusters.write() {
            v.push(c);
        }
    }

    pub fn snapshots(&self) -> Vec<ClusterSnapshot> {
        self.clusters
            .read()
            .map(|v| v.iter().map(|c| c.snapshot()).collect())
            .unwrap_or_default()
    }

    /// Forgets a cluster a reload removed, so its series go stale.
    pub fn remove(&self, name: &str) {
        if let Ok(mut v) = self.clusters.write() {
            v.retain(|c| c.name != name);
        }
    }
}

const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const LOG_REPEAT: Duration = Duration::from_secs(300);

/// Runs the collector of one cluster until the process ends.
pub async fn run(
    cfg: ClusterConfig,
    target: Target,
    state: Arc<ClusterState>,
    volumes: Arc<VolumeSet>,
    defaults: VolumeDefaults,
) {
    let mut backoff = BACKOFF_START;
    let mut last_logged: Option<(String, Instant)> = None;
    let mut discovered = false;
    loop {
        let client = match tls::connect(&target).await {
            Ok(c) => c,
            Err(e) => {
                state.error("connect");
                state.down();
                let msg = e.to_string();
                let repeat = last_logged
                    .as_ref()
                    .is_some_and(|(m, t)| *m == msg && t.elapsed() < LOG_REPEAT);
                if !repeat {
                    tracing::warn!(
                        cluster = %cfg.name,
                        target = %target.display,
                        error = %msg,
                        retry_in = ?backoff,
                        "cannot connect to PostgreSQL"
                    );
                    last_logged = Some((msg, Instant::now()));
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_START;
        last_logged = None;
        match session(&cfg, &client, &state, &volumes, &defaults, &mut discovered).await {
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(cluster = %cfg.name, error = %tls::describe(&e), "lost the PostgreSQL connection; reconnecting");
            }
        }
        state.down();
        tokio::time::sleep(BACKOFF_START).await;
    }
}

/// One connected session: set it up, then scrape and sample until an error
/// says the connection is gone.
async fn session(
    cfg: &ClusterConfig,
    client: &tokio_postgres::Client,
    state: &ClusterState,
    volumes: &VolumeSet,
    defaults: &VolumeDefaults,
    discovered: &mut bool,
) -> Result<(), tokio_postgres::Error> {
    let timeout_ms = cfg.statement_timeout.as_millis().max(1);
    client
        .batch_execute(&format!(
            "SET statement_timeout = {timeout_ms}; SET lock_timeout = {timeout_ms}; \
             SET default_transaction_read_only = on"
        ))
        .await?;
    let version = queries::version(client).await?;
    if version.0 < 140000 {
        tracing::error!(cluster = %cfg.name, version = %version.1, "PostgreSQL older than 14 is not supported: WAL, checkpoint and pg_stat_io statistics are not read");
    } else if version.0 >= 190000 {
        tracing::info!(cluster = %cfg.name, version = %version.1, "newer than 18: using the PostgreSQL 18 queries");
    } else {
        tracing::info!(cluster = %cfg.name, version = %version.1, "connected to PostgreSQL");
    }
    state.with(|i| i.snap.version = Some(version.clone()));

    let mut scrape = tokio::time::interval(cfg.scrape_interval);
    scrape.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sample = tokio::time::interval(cfg.wait_sampling_interval);
    sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = scrape.tick() => {
                let t0 = Instant::now();
                let stats = scrape_once(client, state, version.0).await?;
                if !*discovered && cfg.discover_volumes {
                    *discovered = discover(cfg, client, state, volumes, defaults, &stats, version.0).await?;
                }
                state.store(stats, t0.elapsed().as_secs_f64(), Instant::now());
            }
            _ = sample.tick() => {
                match queries::waits(client).await {
                    Ok(rows) => {
                        let interval = cfg.wait_sampling_interval;
                        state.with(|i| i.snap.waits.add(Instant::now(), interval, &rows));
                    }
                    Err(e) if e.is_closed() => return Err(e),
                    Err(e) => {
                        state.error("waits");
                        tracing::debug!(cluster = %cfg.name, error = %tls::describe(&e), "wait event sample failed");
                    }
                }
            }
        }
    }
}

/// A query error that is about the query (permission, missing view) is
/// counted and the rest of the scrape goes on; a closed connection ends the
/// session.
fn keep<T>(
    state: &ClusterState,
    what: &'static str,
    r: Result<T, tokio_postgres::Error>,
) -> Result<Option<T>, tokio_postgres::Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_closed() => Err(e),
        Err(e) => {
            state.error(what);
            tracing::warn!(cluster = %state.name, query = what, error = %tls::describe(&e), "query failed");
            Ok(None)
        }
    }
}

async fn scrape_once(
    client: &tokio_postgres::Client,
    state: &ClusterState,
    version: u32,
) -> Result<PgStats, tokio_postgres::Error> {
    let settings = keep(state, "settings", queries::settings(client).await)?.unwrap_or_default();
    let on = |n: &str| settings.iter().any(|s| s.name == n && s.value == "on");
    let io = keep(state, "io", queries::io(client, version).await)?.flatten();
    let wal_timing = on("track_wal_io_timing");
    let wal = keep(
        state,
        "wal",
        queries::wal(client, version, wal_timing).await,
    )?
    .flatten();
    let (commits, rollbacks) =
        keep(state, "database", queries::commits(client).await)?.unwrap_or((None, None));
    let checkpoints = if version >= 140000 {
        keep(
            state,
            "checkpoints",
            queries::checkpoints(client, version).await,
        )?
    } else {
        None
    };
    let io = io.map(|rows| strip_untimed(rows, on("track_io_timing"), wal_timing));
    Ok(PgStats {
        settings,
        io,
        wal,
        commits,
        rollbacks,
        checkpoints,
    })
}

/// With timing off PostgreSQL reports 0 ms, not NULL: drop those times so
/// they are absent rather than a false zero. WAL rows follow
/// track_wal_io_timing, all others track_io_timing.
fn strip_untimed(mut rows: Vec<IoRow>, io_timing: bool, wal_timing: bool) -> Vec<IoRow> {
    for r in &mut rows {
        let timed = if r.object == "wal" {
            wal_timing
        } else {
            io_timing
        };
        if !timed {
            for op in &mut r.ops {
                op.seconds = None;
            }
        }
    }
    rows
}

/// Discovers and adds the cluster's volumes. Returns true when done (also
/// when discovery is impossible, which is logged once).
async fn discover(
    cfg: &ClusterConfig,
    client: &tokio_postgres::Client,
    state: &ClusterState,
    volumes: &VolumeSet,
    defaults: &VolumeDefaults,
    stats: &PgStats,
    version: u32,
) -> Result<bool, tokio_postgres::Error> {
    let Some(data_dir) = stats
        .settings
        .iter()
        .find(|s| s.name == "data_directory")
        .map(|s| PathBuf::from(&s.value))
    else {
        tracing::warn!(cluster = %cfg.name, "data_directory is not visible to this role (grant pg_monitor); volume discovery skipped");
        return Ok(true);
    };
    let tablespaces =
        keep(state, "tablespaces", queries::tablespaces(client).await)?.unwrap_or_default();
    let sync_method = match stats.settings.iter().find(|s| s.name == "wal_sync_method") {
        Some(s) => SyncMethod::parse(&s.value).unwrap_or_else(|| {
            tracing::warn!(cluster = %cfg.name, wal_sync_method = %s.value, "wal_sync_method has no Linux equivalent; probing with fdatasync");
            SyncMethod::Fdatasync
        }),
        None => SyncMethod::Fdatasync,
    };
    let plan = match discovery::plan(&cfg.name, version / 10000, &data_dir, &tablespaces) {
        Ok(p) => p,
        Err(why) => {
            tracing::info!(cluster = %cfg.name, reason = %why, "volume discovery skipped");
            return Ok(true);
        }
    };
    let mut roles = Vec::new();
    for p in plan {
        let labels: Vec<String> = p.roles.iter().map(|r| r.label()).collect();
        if let Some(existing) = volumes.on_device(p.dev) {
            tracing::info!(cluster = %cfg.name, volume = %existing.name, roles = ?labels, "filesystem already probed by another volume");
            roles.extend(labels.into_iter().map(|r| (existing.name.clone(), r)));
            continue;
        }
        let Some(probe_dir) = p.probe_dir.clone() else {
            tracing::warn!(cluster = %cfg.name, path = %p.path.display(), roles = ?labels, reason = ?p.skipped, "not probing this filesystem");
            continue;
        };
        let vc = defaults.volume(
            p.name.clone(),
            p.path.clone(),
            probe_dir,
            p.commit_probe(),
            p.read_probe(),
            sync_method,
        );
        match volumes.add(vc) {
            Ok(v) => roles.extend(labels.into_iter().map(|r| (v.name.clone(), r))),
            Err(e) => {
                tracing::warn!(cluster = %cfg.name, volume = %p.name, error = %e, "cannot add discovered volume")
            }
        }
    }
    state.with(|i| i.snap.volumes = roles);
    Ok(true)
}
