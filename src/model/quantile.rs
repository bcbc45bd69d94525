//! Exact quantiles of a sample set.

/// Nearest-rank quantile of an ascending slice: the smallest sample such that
/// at least `q` of all samples are less than or equal to it.
///
/// Nearest-rank always returns a value that was actually measured (no
/// interpolation between two syncs that both happened), and `q = 1` is the
/// maximum. Returns `None` for an empty slice or a `q` outside `[0, 1]`.
pub fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let n = sorted.len();
    // ceil(q * n) as a 1-based rank, clamped so q = 0 gives the minimum.
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted.get(rank - 1).copied()
}

/// Quantiles of an unsorted sample set, one per entry of `qs`.
pub fn quantiles(samples: &[f64], qs: &[f64]) -> Option<Vec<f64>> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    qs.iter().map(|&q| nearest_rank(&sorted, q)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_table() {
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        let cases: &[(&[f64], f64, Option<f64>)] = &[
            (&[], 0.5, None),
            (&[7.0], 0.0, Some(7.0)),
            (&[7.0], 0.5, Some(7.0)),
            (&[7.0], 1.0, Some(7.0)),
            (&[1.0, 2.0], 0.5, Some(1.0)),
            (&[1.0, 2.0], 0.51, Some(2.0)),
            (&hundred, 0.5, Some(50.0)),
            (&hundred, 0.9, Some(90.0)),
            (&hundred, 0.99, Some(99.0)),
            (&hundred, 0.999, Some(100.0)),
            (&hundred, 1.0, Some(100.0)),
            (&hundred, 0.0, Some(1.0)),
            (&hundred, 1.5, None),
            (&hundred, -0.1, None),
        ];
        for (samples, q, want) in cases {
            assert_eq!(
                nearest_rank(samples, *q),
                *want,
                "q={q} n={}",
                samples.len()
            );
        }
    }

    #[test]
    fn quantiles_sort_and_skip_non_finite() {
        let got = quantiles(&[3.0, f64::NAN, 1.0, 2.0], &[0.5, 1.0]);
        assert_eq!(got, Some(vec![2.0, 3.0]));
        assert_eq!(quantiles(&[], &[0.5]), None);
    }

    #[test]
    fn one_slow_sync_in_a_thousand_is_the_p999_not_the_p99() {
        // Published fdatasync figures (docs/storage-facts.md): the tail
        // matters more than the mean. 999 syncs of 0.9 ms and one of 73 ms:
        // p99 stays at 0.9 ms, p99.9 and max see it.
        let mut s = vec![0.0009; 999];
        s.push(0.073);
        let q = quantiles(&s, &[0.99, 0.999, 1.0]).unwrap();
        assert_eq!(q, vec![0.0009, 0.0009, 0.073]);
        s.push(0.073);
        let q = quantiles(&s, &[0.999]).unwrap();
        assert_eq!(q, vec![0.073]);
    }
}
