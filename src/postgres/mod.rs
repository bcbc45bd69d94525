//! The PostgreSQL collector: one tokio task per cluster that keeps a
//! connection, refreshes a snapshot of PostgreSQL's own IO statistics every
//! scrape interval, samples wait events, and discovers the cluster's volumes.
//!
//! PostgreSQL being down, restarting or slow never blocks a scrape or a
//! probe: the task reconnects with capped backoff, every query runs under a
//! session `statement_timeout`, and `/metrics` only reads the last snapshot.
//! The session is read-only (`default_transaction_read_only = on`): the
//! exporter never writes to PostgreSQL.

pub(crate) mod db;
pub(crate) mod discovery;
pub mod dsn;
pub(crate) mod failure;
pub(crate) mod snapshot;
pub(crate) mod startup;
pub(crate) mod tls;
pub(crate) mod views;

pub(crate) use snapshot::{ClusterSnapshot, PgStats};

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::model::ceiling::{
    ONE_COMMIT_MIN_SPAN_SECONDS, WalInterval, mean_sync_seconds, one_client_wal_seconds,
    sync_time_share,
};
use crate::types::{Collector, SyncMethod};
use db::{Db, QResult};
use dsn::Target;
use failure::{Cause, ConnectFailure, DEADLINE_MARGIN, Failures, QueryError, Report};
use snapshot::WalWindowRate;
use views::rows::Setting;

/// A cluster to watch, validated.
#[derive(Clone)]
pub(crate) struct ClusterConfig {
    pub(crate) name: String,
    /// Secret: may hold a password. Never logged; see [`Target::display`].
    pub(crate) dsn: String,
    pub(crate) password_file: Option<PathBuf>,
    pub(crate) scrape_interval: Duration,
    pub(crate) wait_sampling_interval: Duration,
    pub(crate) statement_timeout: Duration,
    pub(crate) discover_volumes: bool,
    /// Which of the statistics views are read (`postgres`, `postgres.io`,
    /// `postgres.io.zero-rows`, `postgres.waits`).
    pub(crate) collectors: crate::types::Collectors,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("name", &self.name)
            .field("dsn", &"<redacted>")
            .field("password_file", &self.password_file)
            .field("scrape_interval", &self.scrape_interval)
            .field("wait_sampling_interval", &self.wait_sampling_interval)
            .field("statement_timeout", &self.statement_timeout)
            .field("discover_volumes", &self.discover_volumes)
            .field("collectors", &self.collectors)
            .finish()
    }
}

#[derive(Debug)]
pub(crate) struct ClusterState {
    pub(crate) name: String,
    window: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    snap: ClusterSnapshot,
    /// (when, syncs, sync seconds, write seconds) readings within the
    /// window.
    wal_history: VecDeque<(Instant, f64, f64, Option<f64>)>,
    /// When the current interval started, and the reading of the counters
    /// the one-commit intervals are made of then (a [`WalInterval`] of
    /// cumulative values).
    span_start: Option<(Instant, WalInterval)>,
    /// (end, growth) of each collection interval within the window.
    intervals: VecDeque<(Instant, WalInterval)>,
    /// (when, fastest round trip) of the scrapes within the window.
    round_trips: VecDeque<(Instant, f64)>,
    /// (when, pg_stat_wal.wal_bytes, wal_fpi) readings within the window,
    /// since the counter last went back (a statistics reset, a restart).
    wal_bytes: VecDeque<(Instant, f64, Option<f64>)>,
    /// When the databases' size was last read.
    sized_at: Option<Instant>,
}

impl ClusterState {
    pub(crate) fn new(name: &str, window: Duration) -> Arc<ClusterState> {
        Arc::new(ClusterState {
            name: name.to_string(),
            window,
            inner: Mutex::new(Inner {
                snap: ClusterSnapshot {
                    name: name.to_string(),
                    window,
                    ..Default::default()
                },
                wal_history: VecDeque::new(),
                span_start: None,
                intervals: VecDeque::new(),
                round_trips: VecDeque::new(),
                wal_bytes: VecDeque::new(),
                sized_at: None,
            }),
        })
    }

    pub(crate) fn snapshot(&self) -> ClusterSnapshot {
        self.inner
            .lock()
            .map(|i| i.snap.clone())
            .unwrap_or_default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> Option<R> {
        self.inner.lock().ok().map(|mut i| f(&mut i))
    }

    fn error(&self, what: &'static str, cause: Cause) {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.with(|i| {
            *i.snap.errors.entry((what, cause.label())).or_default() += 1;
            i.snap.last_error = Some((what, cause.label(), unix));
        });
    }

    fn down(&self) {
        self.with(|i| {
            i.snap.up = false;
            i.snap.stats = None;
            Arc::make_mut(&mut i.snap.waits).pause();
            i.wal_history.clear();
            i.span_start = None;
            i.intervals.clear();
            i.round_trips.clear();
            i.snap.round_trip = None;
            i.wal_bytes.clear();
            i.snap.wal_rate = None;
            i.sized_at = None;
            i.snap.database_bytes = None;
            i.snap.wal_sync_mean = None;
            i.snap.wal_one_commit = None;
            i.snap.wal_sync_share = None;
        });
    }

    /// Keeps a round's statistics; returns whether the cluster wrote WAL
    /// since the round before (`pg_stat_wal.wal_bytes` grew).
    fn store(&self, stats: PgStats, seconds: f64, now: Instant) -> bool {
        let window = self.window;
        self.with(|i| {
            if let Some(w) = &stats.wal
                && let (Some(n), Some(s)) = (w.syncs, w.sync_seconds)
            {
                i.wal_history.push_back((now, n, s, w.write_seconds));
                while i
                    .wal_history
                    .front()
                    .is_some_and(|(t, ..)| now.saturating_duration_since(*t) > window)
                {
                    i.wal_history.pop_front();
                }
                let (a, b) = (i.wal_history.front(), i.wal_history.back());
                i.snap.wal_sync_mean = match (a, b) {
                    (Some(a), Some(b)) => mean_sync_seconds((a.1, a.2), (b.1, b.2)),
                    _ => None,
                };
                i.snap.wal_sync_share = match (a, b) {
                    (Some(a), Some(b)) => sync_time_share(
                        (a.2, b.2),
                        b.0.saturating_duration_since(a.0).as_secs_f64(),
                    ),
                    _ => None,
                };
            } else {
                i.snap.wal_sync_mean = None;
                i.snap.wal_sync_share = None;
            }
            // The growth of the counters over each interval of at least
            // ONE_COMMIT_MIN_SPAN_SECONDS (one scrape interval at the
            // default 10 s), kept per interval: which intervals describe
            // one commit per sync is decided for each, since a window's
            // totals mix whatever ran in it (a bulk load, group commit,
            // one client).
            let totals = one_commit_totals(&stats);
            match (i.span_start, totals) {
                (Some((t0, prev)), Some(t))
                    if now.saturating_duration_since(t0).as_secs_f64()
                        >= ONE_COMMIT_MIN_SPAN_SECONDS =>
                {
                    i.intervals.push_back((
                        now,
                        WalInterval {
                            syncs: t.syncs - prev.syncs,
                            seconds: t.seconds - prev.seconds,
                            bytes: t.bytes - prev.bytes,
                            commits: t.commits - prev.commits,
                            xids: t.xids - prev.xids,
                        },
                    ));
                    i.span_start = Some((now, t));
                }
                (Some(_), Some(_)) => {}
                (_, t) => i.span_start = t.map(|t| (now, t)),
            }
            while i.intervals.len() > MAX_INTERVALS
                || i.intervals
                    .front()
                    .is_some_and(|(t, _)| now.saturating_duration_since(*t) > window)
            {
                i.intervals.pop_front();
            }
            i.snap.wal_one_commit = one_client_wal_seconds(i.intervals.iter().map(|(_, d)| d));
            if let Some(rt) = stats.round_trip {
                i.round_trips.push_back((now, rt));
            }
            while i
                .round_trips
                .front()
                .is_some_and(|(t, _)| now.saturating_duration_since(*t) > window)
            {
                i.round_trips.pop_front();
            }
            // The fastest over the window: a lower bound of every round
            // trip, so the ceiling it goes into stays an upper bound.
            i.snap.round_trip = i.round_trips.iter().map(|&(_, rt)| rt).reduce(f64::min);
            let mut wrote = false;
            match stats.wal.as_ref().and_then(|w| Some((w.bytes?, w.fpi))) {
                Some((b, fpi)) => {
                    wrote = i.wal_bytes.back().is_some_and(|&(_, prev, _)| b > prev);
                    if i.wal_bytes.back().is_some_and(|&(_, prev, _)| b < prev) {
                        i.wal_bytes.clear();
                    }
                    i.wal_bytes.push_back((now, b, fpi));
                    while i
                        .wal_bytes
                        .front()
                        .is_some_and(|(t, ..)| now.saturating_duration_since(*t) > window)
                    {
                        i.wal_bytes.pop_front();
                    }
                }
                None => i.wal_bytes.clear(),
            }
            i.snap.wal_rate = wal_rate(&i.wal_bytes);
            i.snap.up = true;
            i.snap.stats = Some(Arc::new(stats));
            i.snap.scrape_seconds = Some(seconds);
            wrote
        })
        .unwrap_or(false)
    }
}

/// The most collection intervals kept per cluster: a 15-minute window at a
/// 1 s scrape interval is 900.
const MAX_INTERVALS: usize = 4096;

/// The shortest span a WAL rate is given over: a few scrapes of a quiet
/// cluster are noise, and a checkpoint's burst of full-page images
/// lasts longer than that.
const WAL_RATE_MIN_SPAN: Duration = Duration::from_secs(60);

/// WAL generated per second over the readings (first to last), and the
/// full-page images among it: what the audit sizes `max_wal_size` from.
/// `None` over less than [`WAL_RATE_MIN_SPAN`].
fn wal_rate(readings: &VecDeque<(Instant, f64, Option<f64>)>) -> Option<WalWindowRate> {
    let (&(t0, b0, f0), &(t1, b1, f1)) = (readings.front()?, readings.back()?);
    let span = t1.saturating_duration_since(t0);
    let secs = span.as_secs_f64();
    (span >= WAL_RATE_MIN_SPAN && b1 >= b0).then(|| WalWindowRate {
        bytes_per_second: (b1 - b0) / secs,
        fpi_per_second: f0
            .zip(f1)
            .filter(|(a, b)| b >= a)
            .map(|(a, b)| (b - a) / secs),
        seconds: secs,
    })
}

/// How often the databases' size is read: `pg_database_size` stats every
/// file of every database, too much for each scrape, and the size moves
/// slowly next to the audit's 5-minute pass.
const DATABASE_SIZE_EVERY: Duration = Duration::from_secs(300);

impl ClusterState {
    /// Whether the databases' size is due to be read again.
    fn size_due(&self, now: Instant) -> bool {
        self.with(|i| {
            i.sized_at
                .is_none_or(|t| now.saturating_duration_since(t) >= DATABASE_SIZE_EVERY)
        })
        .unwrap_or(false)
    }

    /// Notes a read of the databases' size; `None` (the query failed) waits
    /// the same interval before trying again, and keeps the last size.
    fn sized(&self, now: Instant, bytes: Option<f64>) {
        self.with(|i| {
            i.sized_at = Some(now);
            if bytes.is_some() {
                i.snap.database_bytes = bytes;
            }
        });
    }
}

/// The cumulative counters a [`WalInterval`] is the growth of: WAL syncs,
/// WAL write + sync seconds (the sync time alone where the server reports
/// no write time), WAL bytes, commits but the exporter's own, and the next
/// transaction id. The exporter's read-only transactions (its rounds and
/// wait samples, 10 a second at a 100 ms sampling interval) would count as
/// commits that needed no sync and push a lone client's interval over one
/// commit per sync: under a write-IOPS cap one client commits only 50 times
/// a second. `None`
/// when one is missing: no WAL timing (`track_wal_io_timing` off), no pg_stat_wal
/// (before 14), a standby (no transaction ids are assigned there).
fn one_commit_totals(stats: &PgStats) -> Option<WalInterval> {
    let w = stats.wal.as_ref()?;
    Some(WalInterval {
        syncs: w.syncs?,
        seconds: w.sync_seconds? + w.write_seconds.unwrap_or(0.0),
        bytes: w.bytes?,
        commits: stats.transactions?.commits? - stats.own_commits,
        xids: stats.transactions?.next_xid?,
    })
}

/// All clusters, for the metrics encoder.
#[derive(Debug, Default)]
pub(crate) struct ClusterSet {
    clusters: RwLock<Vec<Arc<ClusterState>>>,
}

impl ClusterSet {
    pub(crate) fn add(&self, c: Arc<ClusterState>) {
        if let Ok(mut v) = self.clusters.write() {
            v.push(c);
        }
    }

    pub(crate) fn snapshots(&self) -> Vec<ClusterSnapshot> {
        self.clusters
            .read()
            .map(|v| v.iter().map(|c| c.snapshot()).collect())
            .unwrap_or_default()
    }

    /// Each cluster's name and `data_directory` once read: what the sync
    /// tracer follows, asked every second, so without copying the rest of
    /// each snapshot.
    pub(crate) fn data_directories(&self) -> Vec<(String, Option<PathBuf>)> {
        self.clusters
            .read()
            .map(|v| {
                v.iter()
                    .map(|c| {
                        let dir = c
                            .with(|i| {
                                i.snap
                                    .setting("data_directory")
                                    .map(|s| PathBuf::from(&s.value))
                            })
                            .flatten();
                        (c.name.clone(), dir)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Forgets a cluster a reload removed, so its series go stale.
    pub(crate) fn remove(&self, name: &str) {
        if let Ok(mut v) = self.clusters.write() {
            v.retain(|c| c.name != name);
        }
    }
}

const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// How long one statement may go without an answer before the connection
/// is dropped: statement_timeout + [`DEADLINE_MARGIN`].
pub(crate) fn statement_deadline(statement_timeout: Duration) -> Duration {
    statement_timeout + DEADLINE_MARGIN
}

/// How long a whole connection attempt (TCP, TLS, authentication, start-up)
/// may take: the target's connect_timeout per host, as libpq applies it
/// (the DSN module sets 10 s when the DSN gives none). tokio-postgres itself
/// applies connect_timeout only to the socket connect, so a server whose
/// postmaster accepts TCP connections but never answers the start-up packet
/// (stopped, frozen) would otherwise hold the attempt forever. None (no
/// deadline) when there is no connect_timeout: libpq waits indefinitely
/// for `connect_timeout=0` or a negative one.
pub(crate) fn connect_deadline(config: &tokio_postgres::Config) -> Option<Duration> {
    let per_host = *config.get_connect_timeout()?;
    let hosts = u32::try_from(config.get_hosts().len().max(1)).unwrap_or(u32::MAX);
    Some(per_host.saturating_mul(hosts))
}

/// Runs the collector of one cluster until the process ends.
pub(crate) async fn run(
    cfg: ClusterConfig,
    target: Target,
    state: Arc<ClusterState>,
    discover: Option<tokio::sync::mpsc::UnboundedSender<DiscoveryRequest>>,
) {
    let mut backoff = BACKOFF_START;
    let mut failures = Failures::default();
    let mut discovered = false;
    // The settings warnings are logged once per collector, not per
    // reconnection.
    let mut settings_warned = false;
    let mut sees_all: Option<bool> = None;
    // prefer-standby may try every host twice.
    let connect_within =
        connect_deadline(&target.config).map(|d| d.saturating_mul(target.passes()));
    let deadline = statement_deadline(cfg.statement_timeout);
    loop {
        let set_up = connect(
            &cfg,
            &target,
            &state,
            &mut failures,
            connect_within,
            deadline,
        )
        .await;
        let (conn, version, all, statements) = match set_up {
            Ok(ok) => ok,
            Err(e) => {
                connect_failed(&cfg, &target, &state, &mut failures, &e, backoff);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_START;
        connected(&cfg, &mut failures, &version.1, all, &mut sees_all);
        let session = Session {
            cfg: &cfg,
            state: &state,
            db: Db::new(&conn.client, &statements, deadline),
            failures: &mut failures,
            settings: None,
        };
        let Err(lost) = session
            .serve(
                version.0,
                discover.as_ref(),
                &mut discovered,
                &mut settings_warned,
            )
            .await;
        // Closes the socket, also when a reply is still owed.
        drop(conn);
        let cause = lost.error.cause();
        state.error(lost.what, cause);
        state.down();
        log_lost(&cfg, &lost, cause);
        // Reconnection attempts failing the same way are this same outage,
        // already logged; the reconnection logs its end.
        failures.already_logged("connect", cause, Instant::now());
        tokio::time::sleep(BACKOFF_START).await;
    }
}

/// Connects and sets the session up, within `connect_within` for the
/// connection. A connection counts once its session is set up: a set-up
/// that fails is a failed connection attempt, logged once and retried with
/// backoff like one.
async fn connect(
    cfg: &ClusterConfig,
    target: &Target,
    state: &ClusterState,
    failures: &mut Failures,
    connect_within: Option<Duration>,
    deadline: Duration,
) -> Result<(tls::Connection, (u32, String), Option<bool>, db::Statements), ConnectFailure> {
    let attempt = match connect_within {
        Some(within) => match tokio::time::timeout(within, tls::connect(target)).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(ConnectFailure::Failed(e)),
            Err(_) => Err(ConnectFailure::NoAnswer(within)),
        },
        None => tls::connect(target).await.map_err(ConnectFailure::Failed),
    };
    let conn = attempt?;
    // The few statements of the set-up, not kept: the session's own
    // statements, prepared on this connection and gone with it, start
    // afresh in the protocol the set-up found.
    let statements = db::Statements::new(&cfg.name);
    let session = Session {
        cfg,
        state,
        db: Db::new(&conn.client, &statements, deadline),
        failures,
        settings: None,
    };
    match session.setup().await {
        Ok((version, all)) => Ok((conn, version, all, statements.renew())),
        Err(lost) => Err(ConnectFailure::SetUp(lost.error)),
    }
}

/// Counts a failed connection attempt and logs it, once per incident.
fn connect_failed(
    cfg: &ClusterConfig,
    target: &Target,
    state: &ClusterState,
    failures: &mut Failures,
    e: &ConnectFailure,
    backoff: Duration,
) {
    let cause = e.cause();
    state.error("connect", cause);
    state.down();
    match failures.failed("connect", cause, Instant::now()) {
        Report::New => tracing::warn!(
            cluster = %cfg.name,
            target = %target.display,
            cause = cause.label(),
            error = %e,
            retry_in = ?backoff,
            "cannot connect to PostgreSQL"
        ),
        Report::Again { failures } => tracing::warn!(
            cluster = %cfg.name,
            target = %target.display,
            cause = cause.label(),
            error = %e,
            failures,
            retry_in = ?backoff,
            "still cannot connect to PostgreSQL"
        ),
        Report::Quiet => tracing::debug!(
            cluster = %cfg.name,
            cause = cause.label(),
            error = %e,
            "cannot connect to PostgreSQL (again)"
        ),
    }
}

/// Logs a connection (the end of an outage, when there was one) and
/// whether the role sees every backend's wait events (`all`), when that
/// changed since the previous connection (`sees_all`).
fn connected(
    cfg: &ClusterConfig,
    failures: &mut Failures,
    version: &str,
    all: Option<bool>,
    sees_all: &mut Option<bool>,
) {
    match failures.succeeded("connect", Instant::now()) {
        Some((failed, down)) => tracing::info!(
            cluster = %cfg.name,
            version = %version,
            failed_attempts = failed,
            down_for = ?down,
            "reconnected to PostgreSQL"
        ),
        None => {
            tracing::info!(cluster = %cfg.name, version = %version, "connected to PostgreSQL")
        }
    }
    match all {
        Some(false) if *sees_all != Some(false) => tracing::warn!(
            cluster = %cfg.name,
            "this role is not a member of pg_read_all_stats (nor pg_monitor, nor superuser): \
             pg_stat_activity hides the wait events of the backends of other roles, so they \
             are not sampled; pgstorage_pg_wait_hidden_backends counts them"
        ),
        Some(true) if *sees_all == Some(false) => {
            tracing::info!(cluster = %cfg.name, "this role now sees every backend's wait events")
        }
        _ => {}
    }
    if all.is_some() {
        *sees_all = all;
    }
}

/// Logs a session that ended: a server that stopped answering, or a
/// connection lost.
fn log_lost(cfg: &ClusterConfig, lost: &Lost, cause: Cause) {
    if let QueryError::NoAnswer(d) = &lost.error {
        tracing::warn!(
            cluster = %cfg.name,
            query = lost.what,
            cause = cause.label(),
            deadline = ?d,
            error = %lost.error,
            "PostgreSQL stopped answering; dropped the connection, reconnecting"
        );
    } else {
        tracing::warn!(
            cluster = %cfg.name,
            query = lost.what,
            cause = cause.label(),
            error = %lost.error,
            "lost the PostgreSQL connection; reconnecting"
        );
    }
}

/// Why a session ended: what was running, and the error.
#[derive(Debug)]
struct Lost {
    what: &'static str,
    error: QueryError,
}

/// One connected session.
struct Session<'a> {
    cfg: &'a ClusterConfig,
    state: &'a ClusterState,
    db: Db<'a>,
    failures: &'a mut Failures,
    /// The settings last read, and `pg_conf_load_time()` then.
    settings: Option<(String, Vec<Setting>)>,
}

impl Session<'_> {
    /// Makes the session read-only with the timeouts, and reads the server
    /// version and whether this role sees every backend.
    async fn setup(&self) -> Result<((u32, String), Option<bool>), Lost> {
        let cfg = self.cfg;
        let setup = |error| Lost {
            what: "connect",
            error,
        };
        let timeout_ms = cfg.statement_timeout.as_millis().max(1);
        self.db
            .batch_execute(&format!(
                "SET statement_timeout = {timeout_ms}; SET lock_timeout = {timeout_ms}; \
                 SET default_transaction_read_only = on"
            ))
            .await
            .map_err(setup)?;
        let version = views::version::read(self.db).await.map_err(setup)?;
        if version.0 < views::version::OLDEST {
            tracing::error!(cluster = %cfg.name, version = %version.1, "PostgreSQL older than 14 is not supported: WAL, checkpoint and pg_stat_io statistics are not read");
        } else if views::version::newer_than_known(version.0) {
            tracing::info!(cluster = %cfg.name, version = %version.1, "newer than 18: using the PostgreSQL 18 queries");
        }
        self.state.with(|i| i.snap.version = Some(version.clone()));
        // Whether this role sees every backend: logged by the caller, after
        // the line saying it connected.
        let all = match views::activity::sees_all_backends(self.db).await {
            Ok(all) => Some(all),
            Err(e) if e.ends_session() => return Err(setup(e)),
            Err(e) => {
                tracing::debug!(cluster = %cfg.name, error = %e, "cannot check for pg_read_all_stats");
                None
            }
        };
        Ok((version, all))
    }

    /// Scrapes and samples until the connection is lost or the server stops
    /// answering.
    async fn serve(
        mut self,
        version: u32,
        discover: Option<&tokio::sync::mpsc::UnboundedSender<DiscoveryRequest>>,
        discovered: &mut bool,
        settings_warned: &mut bool,
    ) -> Result<std::convert::Infallible, Lost> {
        let cfg = self.cfg;
        // The first round and sample at once, the later ones on boundaries
        // of their interval (see `next_boundary`).
        let round = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(round);
        let base = cfg.wait_sampling_interval;
        let mut schedule = views::activity::Schedule::new(base);
        let mut planned = views::rows::Planned::every(base);
        let sample = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(sample);
        let mut draws = 0u64;
        let r = views::round_trip::local(self.db).await;
        let local = self.keep("round_trip", r)?.unwrap_or(false);
        loop {
            tokio::select! {
                () = &mut round => {
                    let t0 = Instant::now();
                    let stats = self.scrape_once(version, local).await?;
                    if !*settings_warned && !stats.settings.is_empty() {
                        warn_settings(&cfg.name, &stats.settings);
                        *settings_warned = true;
                    }
                    if let Some(tx) = discover.filter(|_| !*discovered && cfg.discover_volumes) {
                        *discovered = self.discover(tx, &stats, version).await?;
                    }
                    // The wait sampling keeps its base interval while the
                    // cluster writes WAL (`Schedule::hold`).
                    let wrote = self.state.store(stats, t0.elapsed().as_secs_f64(), Instant::now());
                    if schedule.hold(wrote) {
                        planned = views::rows::Planned::every(base);
                        sample.as_mut().reset(next_boundary(base, base / 2));
                    }
                    // A round that overran its interval moves the next one
                    // to the boundary after, as a tokio interval that
                    // delays missed ticks would.
                    let interval = cfg.scrape_interval;
                    round.as_mut().reset(next_boundary(interval, interval / 2));
                }
                () = &mut sample, if cfg.collectors.on(Collector::PostgresWaits) => {
                    let r = views::activity::sample(self.db).await;
                    if let Some(s) = self.keep("waits", r)? {
                        schedule.observe(s.busy());
                        let interval = schedule.interval();
                        self.state.with(|i| {
                            let waits = Arc::make_mut(&mut i.snap.waits);
                            waits.add(Instant::now(), planned, &s.waiting);
                            waits.hidden = Some(s.hidden);
                            waits.interval = Some(interval);
                        });
                    }
                    draws += 1;
                    planned = schedule.next(uniform(draws));
                    // The next base interval's boundary, then as many more
                    // intervals as the schedule skips. A sample that came
                    // late moves the ones after it.
                    let skipped = planned.gap.saturating_sub(base);
                    sample.as_mut().reset(next_boundary(base, base / 2) + skipped);
                }
            }
        }
    }

    /// A query error that is about the query (permission, timeout, missing
    /// view) is counted with its cause and the rest of the round goes on; it
    /// is logged when it starts (or changes cause, or every 5 minutes while
    /// it lasts), and once when the query succeeds again. A closed
    /// connection or no answer at all ends the session.
    fn keep<T>(&mut self, what: &'static str, r: QResult<T>) -> Result<Option<T>, Lost> {
        let cluster = &self.cfg.name;
        match r {
            Ok(v) => {
                if let Some((failures, after)) = self.failures.succeeded(what, Instant::now()) {
                    tracing::info!(cluster = %cluster, query = what, failures, after = ?after, "query succeeds again");
                }
                Ok(Some(v))
            }
            Err(error) if error.ends_session() => Err(Lost { what, error }),
            Err(e) => {
                let cause = e.cause();
                self.state.error(what, cause);
                match self.failures.failed(what, cause, Instant::now()) {
                    Report::New => tracing::warn!(
                        cluster = %cluster,
                        query = what,
                        cause = cause.label(),
                        error = %e,
                        "query failed (repeats are counted, not logged, until it succeeds again)"
                    ),
                    Report::Again { failures } => tracing::warn!(
                        cluster = %cluster,
                        query = what,
                        cause = cause.label(),
                        error = %e,
                        failures,
                        "query still failing"
                    ),
                    Report::Quiet => tracing::debug!(
                        cluster = %cluster,
                        query = what,
                        cause = cause.label(),
                        error = %e,
                        "query failed again"
                    ),
                }
                Ok(None)
            }
        }
    }

    async fn scrape_once(&mut self, version: u32, local: bool) -> Result<PgStats, Lost> {
        let db = self.db;
        let want = self.cfg.collectors;
        // The exporter's commits that pg_stat_database can count by now: a
        // backend reports its counts when it goes idle, so those of this
        // round come in later readings, as a client's do.
        let own_commits = db.own_commits() as f64;
        // Settings feed pgstorage_pg_setting*, the start warnings and volume
        // discovery's sync method: read even with the statistics views off.
        if !want.on(Collector::Postgres) {
            let r = views::settings::read(db).await;
            let settings = self.keep("settings", r)?.unwrap_or_default();
            return Ok(PgStats {
                settings,
                ..PgStats::default()
            });
        }
        // The round's statements go out together and the server answers
        // them in turn: the backend and the exporter wake once per round
        // rather than once per statement. Each statement's client deadline
        // counts the ones ahead of it (`Db::behind`); an error that ends
        // the session ends the round at once, the others are kept per
        // statement as before.
        let io = async {
            if want.on(Collector::PostgresIo) {
                views::io::read(db.behind(1), version).await
            } else {
                Ok(None)
            }
        };
        let (loaded, io, wal, transactions, checkpoints) = tokio::try_join!(
            session("settings", views::settings::loaded(db)),
            session("io", io),
            session("wal", views::wal::read(db.behind(2), version)),
            session("database", views::database::read(db.behind(4))),
            session(
                "checkpoints",
                views::checkpoints::read(db.behind(5), version)
            ),
        )?;
        // pg_settings again only after a configuration reload (see
        // `views::settings::loaded`). Without the load time (its query
        // failed) pg_settings is read every round, as it always was, and
        // its result alone is counted and logged.
        let settings = match (loaded, self.settings.take()) {
            (Ok(at), Some((then, settings))) if at == then => {
                self.settings = Some((then, settings.clone()));
                settings
            }
            (loaded, _) => {
                let r = views::settings::read(db).await;
                let settings = self.keep("settings", r)?;
                if let (Ok(at), Some(s)) = (loaded, &settings) {
                    self.settings = Some((at, s.clone()));
                }
                settings.unwrap_or_default()
            }
        };
        let on = |n: &str| settings.iter().any(|s| s.name == n && s.value == "on");
        let wal_timing = on("track_wal_io_timing");
        let io = self.keep("io", io)?.flatten().map(|mut rows| {
            if !want.on(Collector::PostgresIoBuffers) {
                views::io::drop_buffer_ops(&mut rows);
            }
            if !want.on(Collector::PostgresIoZeroRows) {
                rows = views::io::drop_zero_rows(rows);
            }
            views::io::strip_untimed(rows, on("track_io_timing"), wal_timing)
        });
        let wal = views::wal::keep_timed(self.keep("wal", wal)?.flatten(), wal_timing);
        let transactions = self.keep("database", transactions)?;
        let checkpoints = self.keep("checkpoints", checkpoints)?.flatten();
        let now = Instant::now();
        if self.state.size_due(now) {
            let r = views::database::size(db).await;
            let bytes = self.keep("database_size", r)?.flatten();
            self.state.sized(now, bytes);
        }
        let round_trip = if local {
            let r = views::round_trip::read(db).await;
            self.keep("round_trip", r)?
        } else {
            None
        };
        Ok(PgStats {
            settings,
            io,
            wal,
            transactions,
            checkpoints,
            round_trip,
            own_commits,
        })
    }
}

/// A statement's result, or the end of the session when its error ends it
/// (a lost connection, no answer): what a pipelined round stops at.
async fn session<T>(
    what: &'static str,
    f: impl std::future::Future<Output = QResult<T>>,
) -> Result<QResult<T>, Lost> {
    match f.await {
        Err(error) if error.ends_session() => Err(Lost { what, error }),
        r => Ok(r),
    }
}

/// The first boundary of `grain` since the UNIX epoch at least `min` from
/// now: the collector's rounds and samples end their waits there, with
/// the limits pass and the probe watchdog, so that tasks due at about the
/// same moment wake the process once (`model::pacing::until_boundary`).
fn next_boundary(grain: Duration, min: Duration) -> tokio::time::Instant {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    tokio::time::Instant::now() + crate::model::pacing::until_boundary(unix, grain, min)
}

/// A uniform draw in [0, 1) for the wait sampling schedule. std's
/// `RandomState` takes its keys from the operating system once per thread
/// and steps them for each new one, so hashing a counter with a new one
/// gives fresh bits without a generator of the crate's own.
fn uniform(n: u64) -> f64 {
    use std::hash::BuildHasher;
    let x = std::hash::RandomState::new().hash_one(n);
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// What volume discovery needs from a cluster, read over its connection.
/// Planning it touches the filesystem (and may hang on a dead network
/// volume), so the collector only sends this; the daemon plans and adds
/// volumes on a blocking thread.
#[derive(Debug, Clone)]
pub(crate) struct DiscoveryRequest {
    pub(crate) cluster: String,
    /// The server's major version (e.g. 16), checked against PG_VERSION.
    pub(crate) major: u32,
    pub(crate) data_directory: PathBuf,
    /// (name, location) of each tablespace.
    pub(crate) tablespaces: Vec<(String, String)>,
    pub(crate) sync_method: SyncMethod,
}

impl Session<'_> {
    /// Asks for the cluster's volumes to be discovered. Returns true when
    /// done (also when discovery is impossible, which is logged once).
    async fn discover(
        &mut self,
        tx: &tokio::sync::mpsc::UnboundedSender<DiscoveryRequest>,
        stats: &PgStats,
        version: u32,
    ) -> Result<bool, Lost> {
        let cfg = self.cfg;
        let Some(data_dir) = stats
            .settings
            .iter()
            .find(|s| s.name == "data_directory")
            .map(|s| PathBuf::from(&s.value))
        else {
            tracing::warn!(
                cluster = %cfg.name,
                code = "no_discovered_volume",
                "data_directory is not visible to this role (grant pg_monitor): volume discovery \
                 skipped, no volume of this cluster is probed unless --probe.path or a [[volume]] \
                 names its directories"
            );
            return Ok(true);
        };
        let r = views::tablespaces::read(self.db).await;
        let tablespaces = self.keep("tablespaces", r)?.unwrap_or_default();
        let sync_method = match stats.settings.iter().find(|s| s.name == "wal_sync_method") {
            Some(s) => SyncMethod::parse(&s.value).unwrap_or_else(|| {
                tracing::warn!(cluster = %cfg.name, wal_sync_method = %s.value, "wal_sync_method has no Linux equivalent; probing with fdatasync");
                SyncMethod::Fdatasync
            }),
            None => SyncMethod::Fdatasync,
        };
        // The receiver is gone only while the daemon shuts down.
        let _ = tx.send(DiscoveryRequest {
            cluster: cfg.name.clone(),
            major: version / 10000,
            data_directory: data_dir,
            tablespaces,
            sync_method,
        });
        Ok(true)
    }
}

/// One `warn` line per setting of the cluster that leaves figures out
/// (`track_wal_io_timing`, `track_io_timing` off): after the first scrape
/// that read the settings, and again after each reload.
pub(crate) fn warn_settings(cluster: &str, settings: &[Setting]) {
    let pairs = settings.iter().map(|s| (s.name.as_str(), s.value.as_str()));
    for w in crate::model::verdict::settings_warnings(pairs) {
        tracing::warn!(cluster, code = w.code, "{}", w.message);
    }
}

impl ClusterState {
    /// Which volumes hold this cluster's directories: (volume, role).
    pub(crate) fn set_volumes(&self, roles: Vec<(String, String)>) {
        self.with(|i| i.snap.volumes = roles);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_deadlines() {
        assert_eq!(
            statement_deadline(Duration::from_secs(5)),
            Duration::from_secs(7)
        );
        assert_eq!(
            statement_deadline(Duration::from_millis(100)),
            Duration::from_millis(2100)
        );
        let mut c = tokio_postgres::Config::new();
        c.host("db1");
        assert_eq!(connect_deadline(&c), None, "connect_timeout=0: wait");
        c.connect_timeout(Duration::from_secs(3));
        assert_eq!(connect_deadline(&c), Some(Duration::from_secs(3)));
        // tokio-postgres tries the hosts in turn, each with connect_timeout.
        c.host("db2");
        assert_eq!(connect_deadline(&c), Some(Duration::from_secs(6)));
    }

    /// Cumulative readings: syncs, sync and write seconds, WAL bytes and
    /// the next transaction id.
    fn wal(
        syncs: f64,
        sync_seconds: f64,
        write_seconds: Option<f64>,
        bytes: f64,
        xid: f64,
    ) -> PgStats {
        PgStats {
            wal: Some(views::rows::WalStats {
                syncs: Some(syncs),
                sync_seconds: Some(sync_seconds),
                write_seconds,
                bytes: Some(bytes),
                ..Default::default()
            }),
            transactions: Some(views::rows::Transactions {
                commits: Some(xid),
                next_xid: Some(xid),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_wal_rate_spans_the_window_and_restarts_after_a_reset() {
        let c = ClusterState::new("c", Duration::from_secs(600));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mib = 1024.0 * 1024.0;
        let rate = |c: &ClusterState| c.snapshot().wal_rate;
        let reading = |bytes: f64, fpi: Option<f64>| {
            let mut s = wal(1.0, 0.001, None, bytes, 1.0);
            if let Some(w) = s.wal.as_mut() {
                w.fpi = fpi;
            }
            s
        };
        let want = |bytes_per_second, fpi_per_second, seconds| {
            Some(WalWindowRate {
                bytes_per_second,
                fpi_per_second,
                seconds,
            })
        };
        assert!(!c.store(reading(100.0 * mib, Some(10.0)), 0.01, at(0)));
        assert!(
            c.store(reading(130.0 * mib, Some(40.0)), 0.01, at(30)),
            "WAL written since the round before"
        );
        assert_eq!(rate(&c), None, "under a minute: no rate");
        c.store(reading(220.0 * mib, Some(70.0)), 0.01, at(60));
        assert_eq!(rate(&c), want(2.0 * mib, Some(1.0), 60.0));
        // Ten minutes on at 1 MiB/s: the first readings leave the window,
        // and the rate is the window's, not the first minute's.
        c.store(reading(820.0 * mib, Some(670.0)), 0.01, at(660));
        assert_eq!(rate(&c), want(1.0 * mib, Some(1.0), 600.0));
        // A statistics reset: the counter goes back, and the rate waits for
        // a minute of new readings.
        assert!(
            !c.store(reading(1.0 * mib, Some(1.0)), 0.01, at(670)),
            "a counter reset is no write"
        );
        assert_eq!(rate(&c), None);
        c.store(reading(31.0 * mib, None), 0.01, at(730));
        assert_eq!(rate(&c), want(0.5 * mib, None, 60.0));
        c.down();
        assert_eq!(rate(&c), None);
    }

    #[test]
    fn the_databases_size_is_read_every_few_minutes_and_kept_meanwhile() {
        let c = ClusterState::new("c", Duration::from_secs(600));
        let t0 = Instant::now();
        assert!(c.size_due(t0));
        c.sized(t0, Some(157e6));
        assert!(!c.size_due(t0 + Duration::from_secs(60)));
        assert_eq!(c.snapshot().database_bytes, Some(157e6));
        // A failed read keeps the last size and waits as long again.
        let later = t0 + DATABASE_SIZE_EVERY;
        assert!(c.size_due(later));
        c.sized(later, None);
        assert!(!c.size_due(later + Duration::from_secs(60)));
        assert_eq!(c.snapshot().database_bytes, Some(157e6));
        c.down();
        assert!(c.size_due(later + Duration::from_secs(60)));
        assert_eq!(c.snapshot().database_bytes, None);
    }

    #[test]
    fn the_exporters_own_commits_do_not_count_as_a_clients() {
        let c = ClusterState::new("c", Duration::from_secs(60));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // One client under a write-IOPS cap: 50 commits a second, each its
        // own 1 ms sync, and the exporter sampling wait events every
        // 100 ms: 10 read-only commits a second beside them, 1.2 commits
        // per sync in pg_stat_database.
        let reading = |s: u64, own: f64| {
            let n = 50.0 * s as f64;
            let mut r = wal(n, n * 0.001, Some(0.0), n * 170.0, n);
            if let Some(t) = r.transactions.as_mut() {
                t.commits = Some(n + own);
            }
            r.own_commits = own;
            r
        };
        c.store(reading(0, 0.0), 0.01, at(0));
        c.store(reading(10, 100.0), 0.01, at(10));
        let one = c.snapshot().wal_one_commit;
        assert!(one.is_some_and(|s| (s - 0.001).abs() < 1e-12), "{one:?}");
        // Others' read-only commits still count, as they may be group
        // commit's: an interval with 200 of them (and slower syncs) is
        // left out.
        let mut others = wal(1000.0, 2.0, Some(0.0), 1000.0 * 170.0, 1000.0);
        others.transactions = Some(views::rows::Transactions {
            commits: Some(1000.0 + 200.0 + 300.0),
            next_xid: Some(1000.0),
            ..Default::default()
        });
        others.own_commits = 200.0;
        c.store(others, 0.01, at(20));
        let one = c.snapshot().wal_one_commit;
        assert!(one.is_some_and(|s| (s - 0.001).abs() < 1e-12), "{one:?}");
    }

    #[test]
    fn the_one_commit_figure_comes_from_intervals_of_one_commit_per_sync() {
        let c = ClusterState::new("c", Duration::from_secs(60));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-12);
        c.store(wal(100.0, 0.010, Some(0.002), 1e6, 1000.0), 0.01, at(0));
        // A bulk load: 60 syncs of 2 MB, 4 ms each, 3 transactions.
        c.store(wal(160.0, 0.250, Some(0.002), 121e6, 1003.0), 0.01, at(10));
        let s = c.snapshot();
        assert_eq!(s.wal_one_commit, None, "a bulk load is not one commit");
        // Its sync mean still counts in the window's, which compares
        // PostgreSQL's syncs with the probe's.
        assert!(
            close(s.wal_sync_mean, 0.240 / 60.0),
            "{:?}",
            s.wal_sync_mean
        );
        // Group commit: 1,000 syncs for 2,000 transactions.
        c.store(
            wal(1160.0, 0.750, Some(0.012), 121.6e6, 3003.0),
            0.01,
            at(20),
        );
        assert_eq!(c.snapshot().wal_one_commit, None, "group commit");
        // One client: 1,000 syncs, 168 ms of sync and 16 ms of write time,
        // 1,000 transactions of 170 bytes each.
        c.store(
            wal(2160.0, 0.918, Some(0.028), 121.77e6, 4003.0),
            0.01,
            at(30),
        );
        assert!(close(c.snapshot().wal_one_commit, 184e-6));
        // A second one-client interval: 1,000 syncs in 400 ms. The mean
        // over both intervals' syncs.
        c.store(
            wal(3160.0, 1.318, Some(0.028), 121.94e6, 5003.0),
            0.01,
            at(40),
        );
        assert!(close(c.snapshot().wal_one_commit, 292e-6));
        // The first leaves the window.
        c.store(
            wal(3160.0, 1.318, Some(0.028), 121.94e6, 5003.0),
            0.01,
            at(91),
        );
        assert!(close(c.snapshot().wal_one_commit, 400e-6));
        // A counter reset (statistics reset, server restart): that interval
        // does not count.
        c.store(wal(5.0, 0.001, Some(0.0), 1e3, 5010.0), 0.01, at(95));
        assert!(close(c.snapshot().wal_one_commit, 400e-6));
        // No WAL timing: no figure from then on.
        let mut off = wal(1005.0, 0.0, None, 1.7e5, 6010.0);
        if let Some(w) = off.wal.as_mut() {
            w.sync_seconds = None;
        }
        c.store(off, 0.01, at(160));
        assert_eq!(c.snapshot().wal_one_commit, None);
        c.down();
        assert_eq!(c.snapshot().wal_one_commit, None);
    }
}
