//! What a volume's probe thread shares with the rest of the process: the
//! sliding windows, the probe in flight, and what is being probed. Writers
//! are the probe thread; readers are the metrics encoder and the watchdog.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::model::window::Window;
use crate::probe::counts::{HistogramSnapshot, ProbeCounts};
use crate::probe::files::ProbeDir;
use crate::probe::fsinfo::FsInfo;
use crate::probe::settings::{
    MAX_WINDOW_SAMPLES, VolumeLimits, VolumeSpec, rate_min_bursts, rate_min_samples,
};
use crate::types::{EngineKind, Op, Phase, SERIES, SyncMethod, series};

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn to_ns(t: Instant) -> u64 {
    // +1 so that 0 always means idle.
    t.saturating_duration_since(base()).as_nanos() as u64 + 1
}

/// Shared state of one volume.
#[derive(Debug)]
pub(crate) struct VolumeState {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    pub(crate) probe_dir_path: PathBuf,
    pub(crate) sync_method: SyncMethod,
    pub(crate) commit_probe: bool,
    pub(crate) read_probe: bool,
    pub(crate) timeout: Duration,
    /// Configured time between lone probes, and between bursts (zero: none).
    pub(crate) interval: Duration,
    pub(crate) busy_every: Duration,
    /// The sliding window's length: how many bursts it can hold decides how
    /// many rates wait for ([`crate::probe::settings::rate_min_samples`]).
    pub(crate) window: Duration,
    /// Provisioned limits and the configured cgroup. Behind a lock because
    /// a reload that changes only these updates them in place (the probe
    /// thread never reads them), so the window and counters are kept; the
    /// limits collector reads them on each pass.
    limits: Mutex<VolumeLimits>,
    /// Cumulative histogram and error counts.
    pub(crate) counts: ProbeCounts,
    fs: Mutex<FsInfo>,
    engine: Mutex<Option<EngineKind>>,
    windows: Mutex<Windows>,
    in_flight_since: AtomicU64,
    in_flight_op: AtomicU8,
    timeout_counted: AtomicBool,
    probe_dir: Mutex<Option<Arc<ProbeDir>>>,
    sweep: Mutex<Option<SweepResult>>,
    /// How much the probe schedule is stretched, in thousandths (1000 = as
    /// configured), so the exporter's own writes stay a small share of a
    /// write-IOPS cap that counts them. Set by the limits collector, read by
    /// the probe thread before each sleep.
    slowdown_milli: AtomicU64,
    /// The latest burst's commits as a multiple of BURST_COMMITS (×1000).
    burst_stretch_milli: AtomicU64,
    /// Commits per second (×1000) over the whole throttle cycles of the
    /// latest burst; 0 when it met no throttle.
    throttled_rate_milli: AtomicU64,
    /// Commit probes done since start, warm-ups of bursts included: the
    /// divisor of the exporter's own device writes per commit.
    commit_probes: AtomicU64,
}

/// The latest queue-depth sweep of a volume.
#[derive(Debug, Clone)]
pub(crate) struct SweepResult {
    /// One table per workload that ran (reads only when the sweep file
    /// could not be created), each with its plateau, if it showed one.
    pub(crate) tables: Vec<crate::probe::sweep::Table>,
    /// Unix time the sweep finished.
    pub(crate) finished_unix: f64,
}

/// Per (op, phase) windows plus lifetime count and sum (the `_count`/`_sum`
/// of the window summary, which Prometheus expects to be cumulative),
/// indexed by [`series`].
#[derive(Debug)]
struct Windows {
    window: Vec<Window>,
    /// When each burst of commits (index 0) and reads (index 1) recorded
    /// its last busy sample, and how many bursts it counts for, oldest
    /// first, while inside the window.
    bursts: [std::collections::VecDeque<(Instant, u32)>; 2],
    count: [u64; SERIES],
    sum: [f64; SERIES],
}

/// A consistent copy of a volume's state for one scrape.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) fs: FsInfo,
    pub(crate) engine: Option<EngineKind>,
    /// Per (op, phase), indexed by [`series`]: window quantiles, if any
    /// samples.
    pub(crate) quantiles: [Option<Vec<f64>>; SERIES],
    pub(crate) samples: [usize; SERIES],
    /// Per (op, phase): mean over the window.
    pub(crate) means: [Option<f64>; SERIES],
    /// Lifetime number and sum of samples per (op, phase).
    pub(crate) count: [u64; SERIES],
    pub(crate) sum: [f64; SERIES],
    /// Per (op, phase): the latency histogram, taken with the window.
    pub(crate) histograms: [Option<HistogramSnapshot>; SERIES],
    pub(crate) in_flight: Option<(Op, Duration)>,
    /// Commit probes done since start, burst warm-ups included.
    pub(crate) commit_probes: u64,
    /// Busy samples a commit op's (index 0) and the read op's (index 1)
    /// window needs before rates derive from it; `None` when bursts are off.
    pub(crate) rate_min_samples: [Option<usize>; 2],
    /// Bursts of commits (index 0) and reads (index 1) the window needs
    /// besides those samples; `None` when bursts are off.
    pub(crate) rate_min_bursts: [Option<usize>; 2],
    /// Bursts of commits (index 0) and reads (index 1) whose last recorded
    /// sample is in the window, a burst through a steady throttle counted
    /// as [`RATE_BURSTS`](crate::probe::settings::RATE_BURSTS).
    pub(crate) bursts: [usize; 2],
}

/// A stretch factor in thousandths for an atomic: values below 1 (and
/// non-finite ones) mean 1, as configured.
fn stretch_milli(factor: f64) -> u64 {
    if factor.is_finite() {
        (factor.max(1.0) * 1000.0).round().min(1e9) as u64
    } else {
        1000
    }
}

impl VolumeState {
    /// The filesystem type the volume is on (`ext4`, `tmpfs`, ...).
    pub(crate) fn fstype(&self) -> String {
        self.fs.lock().map(|f| f.fstype.clone()).unwrap_or_default()
    }

    pub(crate) fn new(cfg: &VolumeSpec, window: Duration, fs: FsInfo) -> VolumeState {
        let cap = MAX_WINDOW_SAMPLES as usize;
        VolumeState {
            name: cfg.name.clone(),
            path: cfg.path.clone(),
            probe_dir_path: cfg.probe_dir.clone(),
            sync_method: cfg.probe.sync_method,
            commit_probe: cfg.probe.commit_probe,
            read_probe: cfg.probe.read_probe,
            timeout: cfg.probe.timeout,
            interval: cfg.probe.interval,
            busy_every: cfg.probe.busy_every,
            window,
            limits: Mutex::new(cfg.limits()),
            counts: ProbeCounts::new(cfg.probe.commit_probe, cfg.probe.read_probe),
            fs: Mutex::new(fs),
            engine: Mutex::new(None),
            windows: Mutex::new(Windows {
                window: (0..SERIES).map(|_| Window::new(window, cap)).collect(),
                bursts: Default::default(),
                count: [0; SERIES],
                sum: [0.0; SERIES],
            }),
            in_flight_since: AtomicU64::new(0),
            in_flight_op: AtomicU8::new(0),
            timeout_counted: AtomicBool::new(false),
            probe_dir: Mutex::new(None),
            sweep: Mutex::new(None),
            slowdown_milli: AtomicU64::new(1000),
            burst_stretch_milli: AtomicU64::new(1000),
            throttled_rate_milli: AtomicU64::new(0),
            commit_probes: AtomicU64::new(0),
        }
    }

    /// The volume's provisioned limits and configured cgroup, as of now.
    pub(crate) fn limits(&self) -> VolumeLimits {
        self.limits.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Replaces the provisioned limits and cgroup (a reload that changed
    /// only these); the limits collector uses them from its next pass on.
    pub(crate) fn set_limits(&self, limits: VolumeLimits) {
        if let Ok(mut l) = self.limits.lock() {
            *l = limits;
        }
    }

    /// Counts one commit probe that reached the device, recorded or not.
    pub(crate) fn count_commit_probe(&self) {
        self.commit_probes.fetch_add(1, Ordering::Relaxed);
    }

    /// The factor the probe schedule is stretched by (1.0 = as configured).
    pub(crate) fn slowdown(&self) -> f64 {
        self.slowdown_milli.load(Ordering::Relaxed) as f64 / 1000.0
    }

    /// Sets the stretch factor; values below 1 mean 1. Returns the previous
    /// factor, so the caller can log a change once.
    pub(crate) fn set_slowdown(&self, factor: f64) -> f64 {
        self.slowdown_milli
            .swap(stretch_milli(factor), Ordering::Relaxed) as f64
            / 1000.0
    }

    /// How many times the usual length the latest commit burst was: above
    /// 1 when it met a throttle and ran on for whole cycles. The next burst
    /// is put off by the same factor.
    pub(crate) fn burst_stretch(&self) -> f64 {
        self.burst_stretch_milli.load(Ordering::Relaxed) as f64 / 1000.0
    }

    /// Sets [`Self::burst_stretch`]; values below 1 mean 1.
    pub(crate) fn set_burst_stretch(&self, factor: f64) {
        self.burst_stretch_milli
            .store(stretch_milli(factor), Ordering::Relaxed);
    }

    /// The commit rate a throttle allowed the latest burst (commits per
    /// second over its whole throttle cycles); `None` when it met none.
    pub(crate) fn throttled_commit_rate(&self) -> Option<f64> {
        let milli = self.throttled_rate_milli.load(Ordering::Relaxed);
        (milli > 0).then(|| milli as f64 / 1000.0)
    }

    /// Sets [`Self::throttled_commit_rate`].
    pub(crate) fn set_throttled_commit_rate(&self, rate: Option<f64>) {
        let milli = rate
            .filter(|r| r.is_finite() && *r > 0.0)
            .map_or(0, |r| (r * 1000.0).round().clamp(1.0, 1e12) as u64);
        self.throttled_rate_milli.store(milli, Ordering::Relaxed);
    }

    pub(crate) fn set_engine(&self, kind: EngineKind) {
        if let Ok(mut e) = self.engine.lock() {
            *e = Some(kind);
        }
    }

    pub(crate) fn engine(&self) -> Option<EngineKind> {
        self.engine.lock().ok().and_then(|e| *e)
    }

    pub(crate) fn set_probe_dir(&self, dir: Arc<ProbeDir>) {
        if let Ok(mut d) = self.probe_dir.lock() {
            *d = Some(dir);
        }
    }

    pub(crate) fn set_sweep(&self, r: SweepResult) {
        if let Ok(mut s) = self.sweep.lock() {
            *s = Some(r);
        }
    }

    pub(crate) fn sweep(&self) -> Option<SweepResult> {
        self.sweep.lock().ok().and_then(|s| s.clone())
    }

    pub(crate) fn probe_dir(&self) -> Option<Arc<ProbeDir>> {
        self.probe_dir.lock().ok().and_then(|d| d.clone())
    }

    /// One sample into the window and the histogram together, under the
    /// window's lock, which [`Self::snapshot`] also holds while it reads
    /// both: a scrape's histogram `_count` and summary `_count` then agree
    /// exactly, instead of differing by a sample recorded between the two
    /// reads.
    pub(crate) fn record(&self, op: Op, phase: Phase, at: Instant, seconds: f64) {
        self.record_all(phase, at, &[(op, seconds)]);
    }

    /// [`Self::record`] for all the samples of one probe (a commit's write,
    /// sync and commit) under one taking of the locks: the probe thread
    /// comes back to them cold after each pause.
    pub(crate) fn record_all(&self, phase: Phase, at: Instant, samples: &[(Op, f64)]) {
        if let Ok(mut w) = self.windows.lock() {
            self.counts.observe_all(phase, samples);
            for &(op, seconds) in samples {
                let i = series(op, phase);
                if let Some(win) = w.window.get_mut(i) {
                    win.push(at, seconds);
                }
                w.count[i] += 1;
                w.sum[i] += seconds;
            }
        }
    }

    /// Notes that a burst of commits (`read` false) or reads recorded its
    /// last busy sample at `at`: rates wait for several bursts, not only
    /// for their samples ([`rate_min_bursts`]). `counts_for` is how many
    /// bursts it stands for: 1, or
    /// [`RATE_BURSTS`](crate::probe::settings::RATE_BURSTS) for commits
    /// that ran through a steady throttle
    /// (`model::pacing::steady_throttle`), whose rate is the throttle's
    /// and not one moment of the host.
    pub(crate) fn burst_recorded(&self, read: bool, at: Instant, counts_for: u32) {
        if let Ok(mut w) = self.windows.lock() {
            let q = &mut w.bursts[usize::from(read)];
            q.push_back((at, counts_for.max(1)));
            // Bounded by the window at snapshot time; a volume never
            // scraped keeps no more than a few hundred.
            while q.len() > 1024 {
                q.pop_front();
            }
        }
    }

    pub(crate) fn begin(&self, op: Op) {
        self.timeout_counted.store(false, Ordering::SeqCst);
        self.in_flight_op.store(op.index() as u8, Ordering::SeqCst);
        self.in_flight_since
            .store(to_ns(Instant::now()), Ordering::SeqCst);
    }

    pub(crate) fn end(&self) {
        self.in_flight_since.store(0, Ordering::SeqCst);
    }

    /// The op in flight and its age, if any.
    pub(crate) fn in_flight(&self, now: Instant) -> Option<(Op, Duration)> {
        let since = self.in_flight_since.load(Ordering::SeqCst);
        if since == 0 {
            return None;
        }
        let op = Op::ALL
            .get(self.in_flight_op.load(Ordering::SeqCst) as usize)
            .copied()
            .unwrap_or(Op::Commit);
        let now_ns = to_ns(now);
        Some((op, Duration::from_nanos(now_ns.saturating_sub(since))))
    }

    /// For the watchdog: the earliest moment after `now` at which a probe
    /// of this volume could have been in flight longer than the timeout:
    /// the one in flight now (not yet counted), at its start plus the
    /// timeout; else one that starts from now on, at now plus the timeout.
    pub(crate) fn timeout_due(&self, now: Instant) -> Instant {
        // Just past the timeout: `take_timeout` counts an age above it.
        let past = self.timeout + Duration::from_millis(1);
        match self.in_flight(now) {
            Some((_, age)) if !self.timeout_counted.load(Ordering::SeqCst) => {
                now + past.saturating_sub(age)
            }
            _ => now + past,
        }
    }

    /// For the watchdog: true exactly once per probe that has been in flight
    /// longer than the timeout.
    pub(crate) fn take_timeout(&self, now: Instant) -> Option<Op> {
        match self.in_flight(now) {
            Some((op, age)) if age > self.timeout => {
                if self.timeout_counted.swap(true, Ordering::SeqCst) {
                    None
                } else {
                    Some(op)
                }
            }
            _ => None,
        }
    }

    pub(crate) fn snapshot(&self, now: Instant, qs: &[f64]) -> Snapshot {
        let mut quantiles: [Option<Vec<f64>>; SERIES] = Default::default();
        let mut samples = [0usize; SERIES];
        let mut means = [None; SERIES];
        let mut count = [0u64; SERIES];
        let mut sum = [0f64; SERIES];
        let mut histograms: [Option<HistogramSnapshot>; SERIES] = Default::default();
        let mut bursts = [0usize; 2];
        if let Ok(mut w) = self.windows.lock() {
            for (i, win) in w.window.iter_mut().enumerate().take(SERIES) {
                // Expired samples out first: the quantiles are then rank
                // lookups in the window's sorted copy, not a sort.
                win.evict(now);
                quantiles[i] = win.quantiles(now, qs);
                samples[i] = win.live_len(now);
                means[i] = win.mean(now);
            }
            for (i, q) in w.bursts.iter_mut().enumerate() {
                while q
                    .front()
                    .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= self.window)
                {
                    q.pop_front();
                }
                bursts[i] = q.iter().map(|&(_, n)| n as usize).sum();
            }
            count = w.count;
            sum = w.sum;
            for op in Op::ALL {
                for phase in Phase::ALL {
                    histograms[series(op, phase)] = self.counts.histogram(op, phase);
                }
            }
        }
        Snapshot {
            fs: self.fs.lock().map(|f| f.clone()).unwrap_or_default(),
            engine: self.engine(),
            quantiles,
            samples,
            means,
            count,
            sum,
            histograms,
            in_flight: self.in_flight(now),
            commit_probes: self.commit_probes.load(Ordering::Relaxed),
            rate_min_samples: [false, true].map(|read| {
                rate_min_samples(
                    read,
                    self.window,
                    self.busy_every,
                    self.interval,
                    self.slowdown() * self.burst_stretch(),
                )
            }),
            rate_min_bursts: [rate_min_bursts(
                self.window,
                self.busy_every,
                self.interval,
                self.slowdown() * self.burst_stretch(),
            ); 2],
            bursts,
        }
    }
}

impl Snapshot {
    /// Window quantiles of one (op, phase), in the order asked for.
    pub(crate) fn quantiles(&self, op: Op, phase: Phase) -> Option<&[f64]> {
        self.quantiles[series(op, phase)].as_deref()
    }

    /// Window mean of one (op, phase).
    pub(crate) fn mean(&self, op: Op, phase: Phase) -> Option<f64> {
        self.means[series(op, phase)]
    }

    /// The phase rates (ceilings, PostgreSQL's sync against the probe's)
    /// are derived from: busy once the window holds enough bursts of `op`
    /// ([`rate_min_samples`]); after-idle when bursts are off, the only
    /// figure there is; `None` while the first bursts are still to come, so
    /// that no rate rests on one moment of the host, nor on the after-idle
    /// figure that underestimates a busy server.
    pub(crate) fn rate_phase(&self, op: Op) -> Option<Phase> {
        let i = usize::from(op == Op::Read);
        match (self.rate_min_samples[i], self.rate_min_bursts[i]) {
            (None, _) | (_, None) => Some(Phase::AfterIdle),
            (Some(n), Some(b))
                if self.samples[series(op, Phase::Busy)] >= n
                    && self.bursts[i] >= b
                    && self.quantiles[series(op, Phase::Busy)].is_some() =>
            {
                Some(Phase::Busy)
            }
            _ => None,
        }
    }

    /// The probe's mean sync time in [`Self::rate_phase`] (the commit's
    /// write + sync where the sync method has no separate sync), for
    /// comparing PostgreSQL's WAL syncs with it; `None` until rates may
    /// use the window.
    pub(crate) fn rate_sync_mean(&self) -> Option<f64> {
        let phase = self.rate_phase(Op::Commit)?;
        self.mean(Op::Sync, phase).or(self.mean(Op::Commit, phase))
    }

    /// Window mean of `op` in [`Self::rate_phase`], if rates may use it
    /// yet: the time per operation a client doing them back to back
    /// spends, whose inverse is its rate.
    pub(crate) fn rate_mean(&self, op: Op) -> Option<f64> {
        let phase = self.rate_phase(op)?;
        self.mean(op, phase)
    }

    /// The phase a report describes `op` in: busy when the window has any
    /// busy samples of it, else after-idle. Unlike [`Self::rate_phase`] it
    /// does not wait for several bursts: a description of what the probes
    /// saw does not claim a rate.
    pub(crate) fn report_phase(&self, op: Op) -> Phase {
        if self.quantiles[series(op, Phase::Busy)].is_some() {
            Phase::Busy
        } else {
            Phase::AfterIdle
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::settings::{ProbeSettings, VolumeSpec};

    fn volume(window_secs: u64) -> VolumeState {
        let spec = VolumeSpec {
            name: "v".into(),
            path: "/v".into(),
            probe_dir: "/v/p".into(),
            probe: ProbeSettings::default(),
            provisioned: Vec::new(),
            cgroup: None,
        };
        VolumeState::new(&spec, Duration::from_secs(window_secs), Default::default())
    }

    /// A burst that ran on through stalls (a throttle's cycles, or a busy
    /// host's that look like them) records many commits, but it is one
    /// moment: with the default 15 min window rates wait for three bursts
    /// however many samples the first one brought.
    #[test]
    fn rates_wait_for_bursts_not_only_for_samples() {
        let v = volume(900);
        let t0 = Instant::now();
        let burst = |at: Instant, n: usize| {
            for _ in 0..n {
                v.record_all(Phase::Busy, at, &[(Op::Commit, 1e-3)]);
            }
            v.burst_recorded(false, at, 1);
        };
        let phase = |at: Instant| {
            v.snapshot(at, &crate::model::WINDOW_QUANTILES)
                .rate_phase(Op::Commit)
        };
        burst(t0, 200);
        assert_eq!(phase(t0), None, "one stretched burst");
        burst(t0 + Duration::from_secs(43), 12);
        assert_eq!(phase(t0 + Duration::from_secs(43)), None, "two bursts");
        let t2 = t0 + Duration::from_secs(86);
        burst(t2, 12);
        assert_eq!(phase(t2), Some(Phase::Busy));
        // The first burst leaves the window: two are left, its samples gone.
        let later = t0 + Duration::from_secs(901);
        assert_eq!(phase(later), None);
    }

    /// A burst through a steady throttle counts for three: the ceiling
    /// comes with the first burst under a cap, not minutes later.
    #[test]
    fn a_steady_throttle_burst_counts_for_three() {
        let v = volume(900);
        let t0 = Instant::now();
        for _ in 0..50 {
            v.record_all(Phase::Busy, t0, &[(Op::Commit, 20e-3)]);
        }
        v.burst_recorded(false, t0, crate::probe::settings::RATE_BURSTS);
        let s = v.snapshot(t0, &crate::model::WINDOW_QUANTILES);
        assert_eq!(s.bursts[0], 3);
        assert_eq!(s.rate_phase(Op::Commit), Some(Phase::Busy));
        // Its samples must still be enough: 12 from a short throttled
        // burst are not three bursts' worth.
        let v = volume(900);
        for _ in 0..12 {
            v.record_all(Phase::Busy, t0, &[(Op::Commit, 20e-3)]);
        }
        v.burst_recorded(false, t0, crate::probe::settings::RATE_BURSTS);
        let s = v.snapshot(t0, &crate::model::WINDOW_QUANTILES);
        assert_eq!(s.rate_phase(Op::Commit), None);
    }

    /// Bursts off: the after-idle figure is the rate's basis at once.
    #[test]
    fn without_bursts_rates_use_the_after_idle_figure() {
        let mut v = volume(900);
        v.busy_every = Duration::ZERO;
        let s = v.snapshot(Instant::now(), &crate::model::WINDOW_QUANTILES);
        assert_eq!(s.rate_phase(Op::Commit), Some(Phase::AfterIdle));
    }
}
