//! A volume's cumulative probe counts: the latency histogram per (op,
//! phase), errors by cause, and reads served by a cache. Plain data owned by
//! the volume's state, written by its probe thread (and the watchdog),
//! encoded at scrape time. When a reload removes the volume its counts go
//! with it, so its series disappear instead of freezing at their last value.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::buckets::probe_buckets;
use crate::types::{Op, Phase, SERIES, series};

/// One latency histogram: counts per bucket (not cumulative; the last
/// bucket is +Inf), total count and sum.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HistogramSnapshot {
    pub(crate) sum: f64,
    pub(crate) count: u64,
    /// (upper bound, count in this bucket alone), +Inf last.
    pub(crate) buckets: Vec<(f64, u64)>,
}

#[derive(Debug)]
struct Hist {
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

/// Cumulative counts of one volume.
#[derive(Debug)]
pub(crate) struct ProbeCounts {
    bounds: &'static [f64],
    // One lock for all histograms: the probe thread takes it a few times a
    // second and a scrape once; contention is not a cost worth atomics.
    hists: Mutex<Vec<Hist>>,
    /// (op label, error label) → count. Ops are "commit", "read", "setup",
    /// "sweep"; errors an errno name or a cause label.
    errors: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    cache_served: AtomicU64,
    read_probe: bool,
    /// Whether the latest commit or read probe succeeded, and its latency.
    last: Mutex<(bool, Option<f64>)>,
    /// The latest setup error in words, while it stands (see
    /// [`ProbeCounts::setup_error`]).
    setup_error: Mutex<Option<SetupNote>>,
}

/// Why the probe files could not be set up, for the status page: the cause
/// label of the `setup` error series, the error in words and when.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SetupNote {
    pub(crate) cause: &'static str,
    pub(crate) message: String,
    /// Unix time of the failed attempt.
    pub(crate) unix: f64,
}

impl ProbeCounts {
    /// Counts for a volume running the given probes. The `timeout` error
    /// series of each probed op exist from the start (at 0), so `rate()` and
    /// alerts see the first increment.
    pub(crate) fn new(commit_probe: bool, read_probe: bool) -> ProbeCounts {
        let bounds = probe_buckets();
        let hists = (0..SERIES)
            .map(|_| Hist {
                counts: vec![0; bounds.len() + 1],
                count: 0,
                sum: 0.0,
            })
            .collect();
        let mut errors = BTreeMap::new();
        if commit_probe {
            errors.insert((Op::Commit.as_str(), "timeout"), 0);
        }
        if read_probe {
            errors.insert((Op::Read.as_str(), "timeout"), 0);
        }
        ProbeCounts {
            bounds,
            hists: Mutex::new(hists),
            errors: Mutex::new(errors),
            cache_served: AtomicU64::new(0),
            read_probe,
            last: Mutex::new((true, None)),
            setup_error: Mutex::new(None),
        }
    }

    /// The samples of one probe (a commit's write, sync and commit) under
    /// one taking of each lock.
    pub(crate) fn observe_all(&self, phase: Phase, samples: &[(Op, f64)]) {
        if let Ok(mut h) = self.hists.lock() {
            for &(op, seconds) in samples {
                // Prometheus buckets are "less than or equal": the first
                // bound not below the value.
                let i = self.bounds.partition_point(|b| *b < seconds);
                let h = &mut h[series(op, phase)];
                h.counts[i] += 1;
                h.count += 1;
                h.sum += seconds;
            }
        }
        let last = samples
            .iter()
            .rev()
            .find(|(op, _)| matches!(op, Op::Commit | Op::Read));
        if let Some(&(_, seconds)) = last
            && let Ok(mut l) = self.last.lock()
        {
            *l = (true, Some(seconds));
        }
    }

    pub(crate) fn error(&self, op: &'static str, error: &'static str) {
        if let Ok(mut e) = self.errors.lock() {
            *e.entry((op, error)).or_insert(0) += 1;
        }
        if let Ok(mut l) = self.last.lock() {
            l.0 = false;
        }
    }

    /// Counts a setup error (op `setup`) and keeps it in words until
    /// [`ProbeCounts::setup_done`].
    pub(crate) fn setup_error(&self, cause: &'static str, message: String) {
        self.error("setup", cause);
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        if let Ok(mut n) = self.setup_error.lock() {
            *n = Some(SetupNote {
                cause,
                message,
                unix,
            });
        }
    }

    /// Setup succeeded: the latest setup error no longer stands.
    pub(crate) fn setup_done(&self) {
        if let Ok(mut n) = self.setup_error.lock() {
            *n = None;
        }
    }

    /// The setup error that stands, if any: the probe directory cannot be
    /// set up, or a probe was given up at setup (a read probe on a
    /// filesystem without O_DIRECT).
    pub(crate) fn last_setup_error(&self) -> Option<SetupNote> {
        self.setup_error.lock().ok()?.clone()
    }

    /// (latest probe succeeded, its latency): the probe thread's collector
    /// health. True before the first probe: nothing has failed yet.
    pub(crate) fn last_run(&self) -> (bool, Option<f64>) {
        self.last.lock().map(|l| *l).unwrap_or((false, None))
    }

    pub(crate) fn cache_served(&self) {
        self.cache_served.fetch_add(1, Ordering::Relaxed);
    }

    /// The histogram of (op, phase), absent until its first observation.
    pub(crate) fn histogram(&self, op: Op, phase: Phase) -> Option<HistogramSnapshot> {
        let h = self.hists.lock().ok()?;
        let h = &h[series(op, phase)];
        (h.count > 0).then(|| HistogramSnapshot {
            sum: h.sum,
            count: h.count,
            buckets: self
                .bounds
                .iter()
                .copied()
                .chain([f64::INFINITY])
                .zip(h.counts.iter().copied())
                .collect(),
        })
    }

    /// Errors so far: ((op, error), count), in a stable order.
    pub(crate) fn errors(&self) -> Vec<((&'static str, &'static str), u64)> {
        self.errors
            .lock()
            .map(|e| e.iter().map(|(k, v)| (*k, *v)).collect())
            .unwrap_or_default()
    }

    /// Reads served by a cache, for a volume with a read probe.
    pub(crate) fn cache_served_reads(&self) -> Option<u64> {
        self.read_probe
            .then(|| self.cache_served.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_less_or_equal_and_counts_add_up() {
        let c = ProbeCounts::new(true, false);
        assert!(c.histogram(Op::Commit, Phase::Busy).is_none());
        c.observe_all(Phase::Busy, &[(Op::Commit, 1e-5)]);
        c.observe_all(Phase::Busy, &[(Op::Commit, 2e-4)]);
        c.observe_all(Phase::Busy, &[(Op::Commit, 100.0)]);
        let h = c.histogram(Op::Commit, Phase::Busy).unwrap();
        assert_eq!(h.count, 3);
        assert!((h.sum - 100.00021).abs() < 1e-9);
        // 1e-5 is the first bound and lands in it.
        assert_eq!(h.buckets[0], (1e-5, 1));
        assert_eq!(h.buckets.last(), Some(&(f64::INFINITY, 1)));
        assert_eq!(h.buckets.iter().map(|b| b.1).sum::<u64>(), 3);
        assert!(c.histogram(Op::Commit, Phase::AfterIdle).is_none());
    }

    #[test]
    fn a_commits_samples_at_once_are_three_observations() {
        let one = ProbeCounts::new(true, false);
        let all = ProbeCounts::new(true, false);
        let samples = [(Op::Write, 3e-5), (Op::Sync, 2e-4), (Op::Commit, 2.3e-4)];
        for &(op, s) in &samples {
            one.observe_all(Phase::AfterIdle, &[(op, s)]);
        }
        all.observe_all(Phase::AfterIdle, &samples);
        for op in [Op::Write, Op::Sync, Op::Commit] {
            let (a, b) = (
                one.histogram(op, Phase::AfterIdle).unwrap(),
                all.histogram(op, Phase::AfterIdle).unwrap(),
            );
            assert_eq!((a.count, a.sum, &a.buckets), (b.count, b.sum, &b.buckets));
            assert!(all.histogram(op, Phase::Busy).is_none());
        }
        // The collector's health reports the commit's latency, not the sync's.
        assert_eq!(all.last_run(), (true, Some(2.3e-4)));
        assert_eq!(one.last_run(), all.last_run());
    }

    #[test]
    fn timeout_series_exist_from_the_start_for_probed_ops() {
        let c = ProbeCounts::new(true, false);
        assert_eq!(c.errors(), vec![(("commit", "timeout"), 0)]);
        c.error("commit", "EIO");
        c.error("commit", "EIO");
        assert_eq!(
            c.errors(),
            vec![(("commit", "EIO"), 2), (("commit", "timeout"), 0)]
        );
        assert_eq!(c.cache_served_reads(), None);
        let r = ProbeCounts::new(false, true);
        r.cache_served();
        assert_eq!(r.cache_served_reads(), Some(1));
    }
}
