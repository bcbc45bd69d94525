//! Sliding time window of latency samples with exact quantiles.
//!
//! Histograms answer "what happened over any range" cheaply but only to a
//! bucket's width; the window keeps every sample of the last few minutes so
//! the exported p50/p99/p99.9 are the measured values themselves. At the
//! default rate (one probe per second) a 15 minute window holds 900 samples
//! per op, so sorting a copy at scrape time costs microseconds.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::quantile;

/// Samples of one op on one volume, newest last.
#[derive(Debug, Clone)]
pub struct Window {
    span: Duration,
    cap: usize,
    samples: VecDeque<(Instant, f64)>,
}

impl Window {
    /// A window keeping samples younger than `span`, and never more than
    /// `cap` of them (the oldest go first), so memory stays bounded even if a
    /// configuration probes far faster than intended.
    pub fn new(span: Duration, cap: usize) -> Self {
        Self {
            span,
            cap: cap.max(1),
            samples: VecDeque::new(),
        }
    }

    /// Records a sample taken at `at` (seconds of latency).
    pub fn push(&mut self, at: Instant, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        self.samples.push_back((at, seconds));
        while self.samples.len() > self.cap {
            self.samples.pop_front();
        }
        self.evict(at);
    }

    /// Drops samples older than the span as of `now`.
    pub fn evict(&mut self, now: Instant) {
        while let Some(&(t, _)) = self.samples.front() {
            if now.saturating_duration_since(t) > self.span {
                self.samples.pop_front();
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

    /// Exact quantiles of the samples younger than the span at `now`;
    /// `None` when there are none (a stalled probe makes its quantiles
    /// disappear rather than freeze at stale values).
    pub fn quantiles(&self, now: Instant, qs: &[f64]) -> Option<Vec<f64>> {
        // Asked for no quantile (counts only): no need to copy and sort.
        if qs.is_empty() {
            return (self.live_len(now) > 0).then(Vec::new);
        }
        let live: Vec<f64> = self
            .samples
            .iter()
            .filter(|(t, _)| now.saturating_duration_since(*t) <= self.span)
            .map(|&(_, v)| v)
            .collect();
        quantile::quantiles(&live, qs)
    }

    /// Mean of the samples younger than the span at `now`.
    pub fn mean(&self, now: Instant) -> Option<f64> {
        let (n, sum) = self
            .samples
            .iter()
            .filter(|(t, _)| now.saturating_duration_since(*t) <= self.span)
            .fold((0usize, 0.0), |(n, s), &(_, v)| (n + 1, s + v));
        (n > 0).then(|| sum / n as f64)
    }

    /// Number of samples younger than the span at `now`.
    pub fn live_len(&self, now: Instant) -> usize {
        self.samples
            .iter()
            .filter(|(t, _)| now.saturating_duration_since(*t) <= self.span)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
