//! The `postgres.syncs` collector: how long PostgreSQL's own processes
//! spend in each WAL and data-file sync, timed in the kernel by eBPF
//! programs on the sync syscalls' tracepoints (src/ebpf/syncs.bpf.c).
//!
//! PostgreSQL reports only totals (a count and, with
//! `track_wal_io_timing`, a time): a mean. The probe's histogram is a few
//! dozen imitation commits a minute. These histograms are every real sync
//! of the watched clusters, so a p99 drift alert can watch the commits
//! themselves. The kernel aggregates into per-CPU maps; the `pg-syncs`
//! thread reads them every 5 seconds (a scrape never makes a syscall for
//! them), so no event ever wakes user space.
//!
//! A sync belongs to a cluster when its process descends from the cluster's
//! postmaster (the kernel follows forks from the pids [`seed`] finds), and
//! its kind comes from the file synced: `wal` (a file in pg_wal: the
//! `fdatasync`/`fsync` of `wal_sync_method`, or the `pwrite` on an O_DSYNC
//! WAL file for `open_datasync`/`open_sync`), `data` (relation files) or
//! `other` (SLRU segments, pg_control, state files, directories).
//!
//! Optional by construction: without the `bpf` cargo feature, without the
//! privileges (root, or CAP_BPF with CAP_PERFMON), outside the host's PID
//! namespace, without tracefs or BTF, the collector is off with one log
//! line and a reason ([`Off`]), and nothing else changes.

#[cfg(feature = "bpf")]
mod loader;
// Without the `bpf` feature nothing seeds a kernel map.
#[cfg_attr(not(feature = "bpf"), allow(dead_code))]
pub(crate) mod seed;

pub(crate) use seed::Off;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The kinds of sync, in the kernel program's order.
pub(crate) const KINDS: [&str; 3] = ["wal", "data", "other"];

/// How often the maps are read and the watched clusters reconciled. The
/// histograms are cumulative and a scrape every 15 s or so reads them, so
/// reading more often adds nothing but wakeups of an otherwise idle
/// process (each one cost this thread about 150 µs of CPU on a 2-vCPU
/// virtual machine, most of it the wakeup itself, at 1 s the largest
/// share of the exporter's CPU after the probes). A cluster restarted in
/// between is traced from the next round: its first few seconds of syncs
/// can be missed.
const ROUND: Duration = Duration::from_secs(5);

/// One histogram: per-bucket counts (the probe layout's 37 bounds, then
/// +Inf), the sum in nanoseconds, the count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Histogram {
    pub(crate) buckets: Vec<u64>,
    pub(crate) sum_ns: u64,
    pub(crate) count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: vec![0; crate::model::buckets::probe_buckets().len() + 1],
            sum_ns: 0,
            count: 0,
        }
    }
}

impl Histogram {
    /// From a kernel histogram's words: the bucket counts, then the sum in
    /// nanoseconds, then the count.
    #[cfg_attr(not(feature = "bpf"), allow(dead_code))]
    fn from_words(w: &[u64]) -> Histogram {
        let n = crate::model::buckets::probe_buckets().len() + 1;
        Histogram {
            buckets: w.iter().take(n).copied().collect(),
            sum_ns: w.get(n).copied().unwrap_or(0),
            count: w.get(n + 1).copied().unwrap_or(0),
        }
    }
}

impl Histogram {
    /// The upper bound of the bucket holding the nearest-rank `q`
    /// quantile, in seconds; `None` without syncs, infinite past the last
    /// bound.
    pub(crate) fn quantile_bound(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).max(1);
        let bounds = crate::model::buckets::probe_buckets();
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(bounds.get(i).copied().unwrap_or(f64::INFINITY));
            }
        }
        Some(f64::INFINITY)
    }

    /// The syncs since `earlier`, a previous reading of the same histogram.
    pub(crate) fn since(&self, earlier: &Histogram) -> Histogram {
        Histogram {
            buckets: self
                .buckets
                .iter()
                .zip(&earlier.buckets)
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
            count: self.count.saturating_sub(earlier.count),
        }
    }
}

/// A watched cluster as the tracer sees it.
#[derive(Debug, Clone)]
pub(crate) struct ClusterSyncs {
    /// `Ok` while its processes are traced, else why not (a bounded label:
    /// `no_data_directory`, `not_local`, `not_running`, `too_many_clusters`).
    pub(crate) traced: Result<(), &'static str>,
    /// By kind ([`KINDS`]); `None` until it was first traced.
    pub(crate) kinds: Option<[Histogram; 3]>,
    /// By kind, the syncs of about the last [`RECENT`] (less while the
    /// exporter has been tracing for less): for the status page.
    pub(crate) recent: Option<[Histogram; 3]>,
}

/// How far back [`ClusterSyncs::recent`] reaches.
pub(crate) const RECENT: Duration = Duration::from_secs(60);

/// What the collector has: off (and why), or the watched clusters.
#[derive(Debug, Clone, Default)]
pub(crate) struct SyncSnapshot {
    /// `None` while starting or when the collector is disabled by flag.
    pub(crate) off: Option<Off>,
    pub(crate) running: bool,
    pub(crate) clusters: BTreeMap<String, ClusterSyncs>,
}

/// Shared between the `pg-syncs` thread, which writes it, and the scrape.
#[derive(Debug, Default)]
pub(crate) struct SyncState(Mutex<SyncSnapshot>);

impl SyncState {
    pub(crate) fn snapshot(&self) -> SyncSnapshot {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn set(&self, f: impl FnOnce(&mut SyncSnapshot)) {
        if let Ok(mut s) = self.0.lock() {
            f(&mut s);
        }
    }
}

/// A cluster to trace: its name and, once its collector has read it, its
/// `data_directory`.
pub(crate) type Target = (String, Option<PathBuf>);

/// Starts the collector on its own thread. Off with a reason when the
/// kernel side cannot load (logged once, at warn: the operator asked for
/// nothing unusual, the host just cannot do it).
pub(crate) fn spawn(
    state: Arc<SyncState>,
    targets: Box<dyn Fn() -> Vec<Target> + Send>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("pg-syncs".into())
        .spawn(move || run(&state, targets.as_ref()))
        .map(|_| ())
}

fn run(state: &SyncState, targets: &dyn Fn() -> Vec<Target>) {
    let mut tracer = match start() {
        Ok(t) => t,
        // A build without the feature is a choice, not a fault of the host.
        Err((off @ Off::NotBuilt, detail)) => {
            tracing::info!(
                collector = "postgres.syncs",
                reason = off.as_str(),
                detail = %detail,
                "PostgreSQL sync tracing is off; every other collector is unaffected"
            );
            state.set(|s| s.off = Some(off));
            return;
        }
        Err((off, detail)) => {
            tracing::warn!(
                collector = "postgres.syncs",
                reason = off.as_str(),
                detail = %detail,
                "PostgreSQL sync tracing is off; every other collector is unaffected"
            );
            state.set(|s| s.off = Some(off));
            return;
        }
    };
    tracing::info!(
        collector = "postgres.syncs",
        "tracing PostgreSQL's WAL and data-file syncs in the kernel"
    );
    state.set(|s| s.running = true);
    // Earlier readings, one per round, as far back as RECENT.
    let mut history: VecDeque<BTreeMap<String, [Histogram; 3]>> = VecDeque::new();
    loop {
        let clusters: BTreeMap<String, ClusterSyncs> = tracer
            .round(&targets())
            .into_iter()
            .map(|(name, traced, words)| {
                let kinds = words.map(|w| w.map(|w| Histogram::from_words(&w)));
                let recent =
                    kinds
                        .as_ref()
                        .map(|now| match history.front().and_then(|h| h.get(&name)) {
                            Some(then) => [0, 1, 2].map(|k| now[k].since(&then[k])),
                            None => now.clone(),
                        });
                (
                    name,
                    ClusterSyncs {
                        traced,
                        kinds,
                        recent,
                    },
                )
            })
            .collect();
        history.push_back(
            clusters
                .iter()
                .filter_map(|(n, c)| Some((n.clone(), c.kinds.clone()?)))
                .collect(),
        );
        while history.len() as u64 > RECENT.as_secs() / ROUND.as_secs() {
            history.pop_front();
        }
        state.set(|s| s.clusters = clusters);
        std::thread::sleep(ROUND);
    }
}

/// Traces the cluster at `data_dir` for `duration` (`check --pg.dsn`):
/// its syncs by kind, or why they could not be traced.
pub(crate) fn trace_once(
    data_dir: &std::path::Path,
    duration: Duration,
) -> Result<[Histogram; 3], String> {
    let mut tracer = start().map_err(|(off, detail)| format!("{}: {detail}", off.as_str()))?;
    let targets = [(String::from("c"), Some(data_dir.to_path_buf()))];
    let read = |tracer: &mut _| -> Result<[Histogram; 3], String> {
        let (_, traced, words) = round_of(tracer, &targets)
            .into_iter()
            .next()
            .ok_or("no reading")?;
        traced?;
        let words = words.ok_or("not traced")?;
        Ok(words.map(|w| Histogram::from_words(&w)))
    };
    let before = read(&mut tracer)?;
    std::thread::sleep(duration);
    let after = read(&mut tracer)?;
    Ok([0, 1, 2].map(|k| after[k].since(&before[k])))
}

#[cfg(feature = "bpf")]
fn round_of(t: &mut loader::Tracer, targets: &[Target]) -> Vec<seed::Reading> {
    t.round(targets)
}

#[cfg(not(feature = "bpf"))]
fn round_of(t: &mut NoTracer, targets: &[Target]) -> Vec<seed::Reading> {
    t.round(targets)
}

#[cfg(feature = "bpf")]
fn start() -> Result<loader::Tracer, (Off, String)> {
    seed::preflight()?;
    loader::Tracer::start()
}

#[cfg(not(feature = "bpf"))]
fn start() -> Result<NoTracer, (Off, String)> {
    Err((
        Off::NotBuilt,
        "built without the bpf cargo feature".to_string(),
    ))
}

/// The stand-in without the `bpf` feature: never started.
#[cfg(not(feature = "bpf"))]
#[derive(Debug)]
struct NoTracer;

#[cfg(not(feature = "bpf"))]
impl NoTracer {
    fn round(&mut self, _: &[Target]) -> Vec<seed::Reading> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_bound_is_the_bucket_of_the_rank() {
        let mut h = Histogram::default();
        // 98 syncs in the 1 ms bucket (index 12), 2 in the 10 ms one (18).
        h.buckets[12] = 98;
        h.buckets[18] = 2;
        h.count = 100;
        assert_eq!(h.quantile_bound(0.5), Some(0.001));
        assert_eq!(h.quantile_bound(0.98), Some(0.001));
        assert_eq!(h.quantile_bound(0.99), Some(0.01));
        assert_eq!(Histogram::default().quantile_bound(0.99), None);
        assert_eq!(h.since(&Histogram::default()), h);
        assert_eq!(h.since(&h).count, 0);
    }
}
