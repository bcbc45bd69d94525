//! What the encoders and the status page read about a cluster: one
//! `ClusterSnapshot` per cluster, cloned from its `ClusterState` at each
//! scrape, and the families with one series per cluster that every view's
//! encoder writes with.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::families::{self, Encoder};
use crate::postgres::views::rows::{
    Checkpoints, IoRow, Setting, Transactions, WaitTotals, WalStats,
};

/// The latest statistics read from a cluster.
#[derive(Debug, Clone, Default)]
pub(crate) struct PgStats {
    pub(crate) settings: Vec<Setting>,
    pub(crate) io: Option<Vec<IoRow>>,
    pub(crate) wal: Option<WalStats>,
    pub(crate) transactions: Option<Transactions>,
    pub(crate) checkpoints: Option<Checkpoints>,
    /// The fastest round trip of `SELECT 1` this scrape, in seconds; `None`
    /// over a network (see `views::round_trip`).
    pub(crate) round_trip: Option<f64>,
    /// The transactions the exporter's connection committed before this
    /// reading (`Db::own_commits`): pg_stat_database counts them with
    /// every client's.
    pub(crate) own_commits: f64,
}

/// WAL generated per second over the collector's window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WalWindowRate {
    /// pg_stat_wal.wal_bytes per second.
    pub(crate) bytes_per_second: f64,
    /// pg_stat_wal.wal_fpi (full-page images) per second.
    pub(crate) fpi_per_second: Option<f64>,
    /// The span of the readings.
    pub(crate) seconds: f64,
}

/// What the metrics encoder reads about a cluster.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterSnapshot {
    pub(crate) name: String,
    pub(crate) up: bool,
    pub(crate) version: Option<(u32, String)>,
    /// Behind an `Arc`, like `waits`: every scrape takes a snapshot, and
    /// the statistics (settings, pg_stat_io rows) change once per
    /// collection, so a snapshot shares them instead of copying them.
    pub(crate) stats: Option<Arc<PgStats>>,
    pub(crate) scrape_seconds: Option<f64>,
    /// Failures by (what failed: `connect` or a query, cause label).
    pub(crate) errors: BTreeMap<(&'static str, &'static str), u64>,
    /// Changed in place (`Arc::make_mut`): copied only when a scrape
    /// still holds the previous totals.
    pub(crate) waits: Arc<WaitTotals>,
    /// (volume, role) pairs from discovery or matching configured volumes.
    pub(crate) volumes: Vec<(String, String)>,
    /// The span the figures below are over (the configured `window`): the
    /// status page states it beside them.
    pub(crate) window: std::time::Duration,
    /// Mean WAL sync seconds over the window, from PostgreSQL's counters.
    pub(crate) wal_sync_mean: Option<f64>,
    /// What one client's commit waits on its WAL by PostgreSQL's own
    /// figures (the write of its record into the kernel, then the sync):
    /// the mean WAL write + sync seconds per sync over the collection
    /// intervals of the window in which each sync was one small commit's
    /// (`model::ceiling::one_client_wal_seconds`), the `postgres` commit
    /// ceiling basis. `None` when no interval qualifies: only group
    /// commit, bulk loads or no writes in the window, or no WAL timing.
    pub(crate) wal_one_commit: Option<f64>,
    /// Seconds PostgreSQL spent in WAL syncs per second of wall time over
    /// the window (the sync seconds counter's rate): 0.5 is half the time.
    pub(crate) wal_sync_share: Option<f64>,
    /// The fastest round trip of `SELECT 1` over the window, in seconds
    /// (`views::round_trip`): added to the WAL time in the `postgres`
    /// commit ceiling basis.
    pub(crate) round_trip: Option<f64>,
    /// WAL generated per second over the window (pg_stat_wal); `None`
    /// before a minute of readings, and on servers without pg_stat_wal.
    pub(crate) wal_rate: Option<WalWindowRate>,
    /// The size of all its databases (`pg_database_size`), read every few
    /// minutes: what bounds the full-page images one checkpoint cycle can
    /// write.
    pub(crate) database_bytes: Option<f64>,
    /// The latest failure: (what failed, cause label, unix time).
    pub(crate) last_error: Option<(&'static str, &'static str, f64)>,
}

impl ClusterSnapshot {
    pub(crate) fn setting(&self, name: &str) -> Option<&Setting> {
        self.stats
            .as_ref()?
            .settings
            .iter()
            .find(|s| s.name == name)
    }

    pub(crate) fn wal_volume(&self) -> Option<&str> {
        self.volumes
            .iter()
            .find(|(_, r)| r == "wal")
            .map(|(v, _)| v.as_str())
    }
}

/// A gauge family with one series per cluster that has a value.
pub(crate) fn cluster_gauge(
    enc: &mut Encoder<'_>,
    name: &str,
    help: &str,
    clusters: &[ClusterSnapshot],
    get: impl Fn(&ClusterSnapshot) -> Option<f64>,
) -> fmt::Result {
    families::gauge(
        enc,
        name,
        help,
        clusters
            .iter()
            .filter_map(|c| Some(([("cluster", c.name.as_str())], get(c)?))),
    )
}

/// A counter family (`base` without `_total`) with one series per cluster
/// that has a value.
pub(crate) fn cluster_counter(
    enc: &mut Encoder<'_>,
    base: &str,
    help: &str,
    clusters: &[ClusterSnapshot],
    get: impl Fn(&ClusterSnapshot) -> Option<f64>,
) -> fmt::Result {
    families::counter(
        enc,
        base,
        help,
        clusters
            .iter()
            .filter_map(|c| Some(([("cluster", c.name.as_str())], get(c)?))),
    )
}
