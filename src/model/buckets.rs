//! Histogram buckets for probe latencies.
//!
//! Exponential, six per decade (factor 10^(1/6) ≈ 1.47), rounded to three
//! significant digits so `le` labels stay readable: 10 µs … 10 s in 37
//! bounds. Any quantile `histogram_quantile` estimates is therefore within
//! one bucket (≤ 47%) of the exact window quantile: fine enough to see an 11×
//! drift or a 0.9 ms → 73 ms cap, both seen in published measurements
//! (docs/storage-facts.md), coarse enough to keep 4 ops × 38 series per
//! volume.

/// Upper bounds in seconds, ascending; `+Inf` is implicit. Computed once:
/// the sync tracer builds its histograms from them every second.
pub(crate) fn probe_buckets() -> &'static [f64] {
    static BOUNDS: std::sync::LazyLock<Vec<f64>> = std::sync::LazyLock::new(bounds);
    &BOUNDS
}

fn bounds() -> Vec<f64> {
    let mut out = Vec::with_capacity(37);
    for decade in -5..=0i32 {
        for step in 0..6 {
            let v = 10f64.powi(decade) * 10f64.powf(f64::from(step) / 6.0);
            out.push(round3(v));
        }
    }
    out.push(10.0);
    out
}

fn round3(v: f64) -> f64 {
    let mag = 10f64.powi(v.log10().floor() as i32 - 2);
    let r = (v / mag).round() * mag;
    // Re-parse through a short decimal so 1.47e-5 encodes as written.
    format!("{r:.3e}").parse().unwrap_or(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_10us_to_10s_with_bounded_ratio() {
        let b = probe_buckets();
        assert_eq!(b.len(), 37);
        assert_eq!(b[0], 1e-5);
        assert_eq!(*b.last().unwrap(), 10.0);
        for w in b.windows(2) {
            let ratio = w[1] / w[0];
            assert!(ratio > 1.4 && ratio < 1.5, "{} -> {}", w[0], w[1]);
        }
        assert!(b.contains(&1.47e-5) && b.contains(&0.001) && b.contains(&0.0681));
    }
}
