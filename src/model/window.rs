//! Sliding time window of latency samples with exact quantiles.
//!
//! Histograms answer "what happened over any range" cheaply but only to a
//! bucket's width; the window keeps every sample of the last few minutes so
//! the exported p50/p99/p99.9 are the measured values themselves.
//!
//! The samples are kept twice: in arrival order, to expire the oldest, and
//! in ascending order (`Sorted`), updated on every push and expiry, so a
//! scrape reads each quantile by its rank instead of sorting the window
//! (at the defaults, 8 windows of up to 900 samples per volume), and the
//! mean from a running sum.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::quantile::{self, Sorted};

/// Samples of one op on one volume.
#[derive(Debug, Clone)]
pub struct Window {
    span: Duration,
    cap: usize,
    /// Origin of the sample times below: the first sample's time.
    base: Option<Instant>,
    /// (time in ns since `base`, seconds), oldest first; times never
    /// decrease, so the samples younger than the span are a suffix.
    samples: VecDeque<(u64, f64)>,
    /// The same values in ascending order.
    sorted: Sorted,
    /// Sum of the values in `samples`.
    sum: Sum,
    /// Removals since `sum` was last recomputed from scratch, which it is
    /// once per window length of them, so rounding errors cannot pile up.
    removed: usize,
}

impl Window {
    /// A window keeping samples younger than `span`, and never more than
    /// `cap` of them (the oldest go first), so memory stays bounded even if a
    /// configuration probes far faster than intended.
    pub fn new(span: Duration, cap: usize) -> Self {
        Self {
            span,
            cap: cap.max(1),
            base: None,
            samples: VecDeque::new(),
            sorted: Sorted::new(),
            sum: Sum::default(),
            removed: 0,
        }
    }

    /// `t` in ns since `base` (0 before it).
    fn offset(&self, t: Instant) -> u64 {
        self.base.map_or(0, |b| {
            u64::try_from(t.saturating_duration_since(b).as_nanos()).unwrap_or(u64::MAX)
        })
    }

    /// True when a sample taken at `at` (ns since `base`) is older than
    /// the span as of `now` (ns since `base`): the rule the window has
    /// always applied, `now - at > span` (saturating).
    fn expired(&self, at: u64, now: u64) -> bool {
        u128::from(now.saturating_sub(at)) > self.span.as_nanos()
    }

    /// Records a sample taken at `at` (seconds of latency). A sample taken
    /// before the newest one held counts as taken with it (the probe of a
    /// window records in order, so this is at most a hand-over race).
    pub fn push(&mut self, at: Instant, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let base = *self.base.get_or_insert(at);
        let t = at.saturating_duration_since(base).as_nanos();
        let t = u64::try_from(t).unwrap_or(u64::MAX);
        let t = self.samples.back().map_or(t, |&(last, _)| t.max(last));
        self.samples.push_back((t, seconds));
        self.sorted.insert(seconds);
        self.sum.add(seconds);
        while self.samples.len() > self.cap {
            self.pop_oldest();
        }
        self.evict(at);
    }

    fn pop_oldest(&mut self) {
        if let Some((_, v)) = self.samples.pop_front() {
            let found = self.sorted.remove(v);
            debug_assert!(found, "window sample {v} missing from the sorted copy");
            self.removed += 1;
            if self.removed >= self.samples.len() {
                self.sum = Sum::default();
                for &(_, v) in &self.samples {
                    self.sum.add(v);
                }
                self.removed = 0;
            } else {
                self.sum.add(-v);
            }
        }
    }

    /// Drops samples older than the span as of `now`.
    pub(crate) fn evict(&mut self, now: Instant) {
        let now = self.offset(now);
        while let Some(&(t, _)) = self.samples.front() {
            if self.expired(t, now) {
                self.pop_oldest();
            } else {
                break;
            }
        }
    }

    /// Number of samples currently held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True when the window holds no samples.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Number of held samples older than the span at `now`: the oldest
    /// ones, not yet evicted. Zero right after `evict(now)`.
    fn expired_len(&self, now: Instant) -> usize {
        let now = self.offset(now);
        self.samples
            .iter()
            .take_while(|&&(t, _)| self.expired(t, now))
            .count()
    }

    /// The values of the samples younger than the span at `now`, skipping
    /// the `expired` oldest.
    fn live(&self, expired: usize) -> impl Iterator<Item = f64> + '_ {
        self.samples.iter().skip(expired).map(|&(_, v)| v)
    }

    /// Exact quantiles of the samples younger than the span at `now`;
    /// `None` when there are none (a stalled probe makes its quantiles
    /// disappear rather than freeze at stale values). A rank lookup when
    /// the window was evicted as of `now` (as `crate::probe::state` does
    /// before reading), else a sort of the live samples.
    pub fn quantiles(&self, now: Instant, qs: &[f64]) -> Option<Vec<f64>> {
        match self.expired_len(now) {
            0 => self.sorted.quantiles(qs),
            k => {
                let live: Vec<f64> = self.live(k).collect();
                // Asked for no quantile (counts only): no need to sort.
                if qs.is_empty() {
                    return (!live.is_empty()).then(Vec::new);
                }
                quantile::quantiles(&live, qs)
            }
        }
    }

    /// Mean of the samples younger than the span at `now`.
    pub fn mean(&self, now: Instant) -> Option<f64> {
        let (n, sum) = match self.expired_len(now) {
            0 => (self.samples.len(), self.sum.value()),
            k => self.live(k).fold((0usize, 0.0), |(n, s), v| (n + 1, s + v)),
        };
        (n > 0).then(|| sum / n as f64)
    }

    /// Number of samples younger than the span at `now`.
    pub fn live_len(&self, now: Instant) -> usize {
        self.samples.len() - self.expired_len(now)
    }
}

/// A running sum with Neumaier's compensation: the low-order bits a large
/// addend rounds away are kept, so the sum of the small samples left after
/// a large one expires is not swamped by that one's rounding error.
#[derive(Debug, Clone, Copy, Default)]
struct Sum {
    sum: f64,
    compensation: f64,
}

impl Sum {
    fn add(&mut self, x: f64) {
        let t = self.sum + x;
        self.compensation += if self.sum.abs() >= x.abs() {
            (self.sum - t) + x
        } else {
            (x - t) + self.sum
        };
        self.sum = t;
    }

    fn value(&self) -> f64 {
        self.sum + self.compensation
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The window as it was before the sorted copy: every read filters the
    /// samples by age and sorts a copy. The reference the window must
    /// match.
    struct Reference {
        span: Duration,
        cap: usize,
        samples: VecDeque<(Instant, f64)>,
    }

    impl Reference {
        fn push(&mut self, at: Instant, seconds: f64) {
            if !seconds.is_finite() || seconds < 0.0 {
                return;
            }
            self.samples.push_back((at, seconds));
            while self.samples.len() > self.cap {
                self.samples.pop_front();
            }
            while let Some(&(t, _)) = self.samples.front() {
                if at.saturating_duration_since(t) > self.span {
                    self.samples.pop_front();
                } else {
                    break;
                }
            }
        }

        fn live(&self, now: Instant) -> Vec<f64> {
            self.samples
                .iter()
                .filter(|(t, _)| now.saturating_duration_since(*t) <= self.span)
                .map(|&(_, v)| v)
                .collect()
        }
    }

    proptest! {
        /// Pushes at non-decreasing times (as one probe thread records),
        /// scrapes at non-decreasing times that may lag the newest sample,
        /// with or without evicting first: the quantiles are exactly those
        /// of sorting the live samples, the count is theirs and the mean
        /// theirs up to rounding.
        #[test]
        fn matches_sorting_the_live_samples(
            span_ms in 1u64..20_000,
            cap in prop_oneof![1usize..40, Just(100_000usize)],
            steps in prop::collection::vec(
                (0u8..4, 0u64..3_000, 0u32..300, any::<bool>()), 1..600),
        ) {
            let t0 = Instant::now();
            let span = Duration::from_millis(span_ms);
            let mut w = Window::new(span, cap);
            let mut r = Reference { span, cap: cap.max(1), samples: VecDeque::new() };
            let mut last_push = t0;
            let mut last_scrape = t0;
            for (kind, dt_ms, v, evict) in steps {
                if kind < 3 {
                    // A push; coarse values so duplicates are common, and
                    // now and then a rejected one.
                    last_push += Duration::from_millis(dt_ms / 4);
                    let v = match v {
                        0 => f64::NAN,
                        1 => -1.0,
                        v => f64::from(v) * 1e-5,
                    };
                    w.push(last_push, v);
                    r.push(last_push, v);
                } else {
                    // A scrape: its clock may lag the newest sample a bit.
                    let now = (last_push + Duration::from_millis(dt_ms * 4))
                        .checked_sub(Duration::from_millis(500))
                        .unwrap_or(t0)
                        .max(last_scrape);
                    last_scrape = now;
                    if evict {
                        w.evict(now);
                    }
                    let live = r.live(now);
                    let qs = crate::model::WINDOW_QUANTILES;
                    prop_assert_eq!(w.quantiles(now, &qs), quantile::quantiles(&live, &qs));
                    prop_assert_eq!(w.quantiles(now, &[]), (!live.is_empty()).then(Vec::new));
                    prop_assert_eq!(w.live_len(now), live.len());
                    let mean = (!live.is_empty())
                        .then(|| live.iter().sum::<f64>() / live.len() as f64);
                    match (w.mean(now), mean) {
                        (Some(a), Some(b)) => prop_assert!((a - b).abs() <= 1e-12 * b.max(1e-9), "{a} vs {b}"),
                        (a, b) => prop_assert_eq!(a, b),
                    }
                }
                prop_assert!(w.len() <= cap.max(1));
                prop_assert_eq!(w.sorted.len(), w.samples.len());
            }
        }
    }

    #[test]
    fn running_sum_is_recomputed_so_rounding_does_not_pile_up() {
        // A huge sample leaving the window must not leave its rounding
        // error in the mean of the small ones after it.
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(3600), 4);
        w.push(t0, 1e6);
        for i in 1..=1000u64 {
            w.push(t0 + Duration::from_millis(i), 1e-6 * i as f64);
            if i >= 4 {
                let now = t0 + Duration::from_secs(1);
                let want = (i - 3..=i).map(|i| 1e-6 * i as f64).sum::<f64>() / 4.0;
                let got = w.mean(now).unwrap_or_default();
                assert!((got - want).abs() <= 1e-18, "after {i}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn a_late_sample_counts_as_taken_with_the_newest() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(10), 100);
        w.push(t0 + Duration::from_secs(5), 0.002);
        w.push(t0, 0.001);
        // Both expire with the newest, 10 s after t0 + 5 s.
        assert_eq!(w.live_len(t0 + Duration::from_secs(15)), 2);
        w.evict(t0 + Duration::from_secs(16));
        assert!(w.is_empty());
    }

    #[test]
    fn samples_expire_after_the_span() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(10), 1000);
        w.push(t0, 0.001);
        w.push(t0 + Duration::from_secs(5), 0.002);
        assert_eq!(
            w.quantiles(t0 + Duration::from_secs(6), &[1.0]),
            Some(vec![0.002])
        );
        assert_eq!(w.live_len(t0 + Duration::from_secs(6)), 2);
        assert_eq!(w.mean(t0 + Duration::from_secs(6)), Some(0.0015));
        // At t0+11 s the first sample is older than 10 s.
        assert_eq!(
            w.quantiles(t0 + Duration::from_secs(11), &[0.0]),
            Some(vec![0.002])
        );
        assert_eq!(w.quantiles(t0 + Duration::from_secs(16), &[0.5]), None);
        w.evict(t0 + Duration::from_secs(16));
        assert!(w.is_empty());
    }

    #[test]
    fn cap_bounds_memory_dropping_oldest() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(3600), 3);
        for (i, v) in [1.0, 2.0, 3.0, 4.0].into_iter().enumerate() {
            w.push(t0 + Duration::from_millis(i as u64), v);
        }
        assert_eq!(w.len(), 3);
        assert_eq!(w.quantiles(t0, &[0.0, 1.0]), Some(vec![2.0, 4.0]));
    }

    #[test]
    fn rejects_nonsense_samples() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(1), 10);
        w.push(t0, f64::NAN);
        w.push(t0, -1.0);
        w.push(t0, f64::INFINITY);
        assert!(w.is_empty());
    }

    #[test]
    fn drift_shows_in_the_window_not_in_the_lifetime() {
        // A published measurement (docs/storage-facts.md): fdatasync mean
        // drifted 10.3 ms → 0.9 ms on one volume.
        // After the slow series leaves the window, p50 reflects only the new one.
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(60), 10_000);
        for i in 0..60 {
            w.push(t0 + Duration::from_secs(i), 0.010_346);
        }
        for i in 60..120 {
            w.push(t0 + Duration::from_secs(i), 0.000_913);
        }
        let now = t0 + Duration::from_secs(120);
        assert_eq!(w.quantiles(now, &[0.5]), Some(vec![0.000_913]));
    }
}
