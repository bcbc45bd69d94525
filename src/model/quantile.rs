//! Exact quantiles of a sample set.

/// The 1-based nearest-rank position of quantile `q` among `n` samples:
/// `ceil(q * n)`, clamped so `q = 0` gives the minimum. `None` when there
/// are no samples or `q` is outside `[0, 1]`.
pub(crate) fn rank(n: usize, q: f64) -> Option<usize> {
    if n == 0 || !(0.0..=1.0).contains(&q) {
        return None;
    }
    Some(((q * n as f64).ceil() as usize).clamp(1, n))
}

/// Nearest-rank quantile of an ascending slice: the smallest sample such that
/// at least `q` of all samples are less than or equal to it.
///
/// Nearest-rank always returns a value that was actually measured (no
/// interpolation between two syncs that both happened), and `q = 1` is the
/// maximum. Returns `None` for an empty slice or a `q` outside `[0, 1]`.
pub(crate) fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    let rank = rank(sorted.len(), q)?;
    sorted.get(rank - 1).copied()
}

/// Quantiles of an unsorted sample set, one per entry of `qs`.
pub(crate) fn quantiles(samples: &[f64], qs: &[f64]) -> Option<Vec<f64>> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    qs.iter().map(|&q| nearest_rank(&sorted, q)).collect()
}

/// Samples a block of [`Sorted`] holds before it is split in two.
const BLOCK_MAX: usize = 512;
/// A block shorter than this after a removal is merged into a neighbour.
const BLOCK_MIN: usize = BLOCK_MAX / 8;

/// A multiset of samples kept in ascending order ([`f64::total_cmp`], the
/// order [`quantiles`] sorts in), so a quantile is a rank lookup instead of
/// a sort.
///
/// The samples are kept in consecutive sorted blocks of at most
/// [`BLOCK_MAX`] values, so an insert or a removal moves at most a block's
/// worth of memory (a few KiB) whatever the number of samples, and finding
/// the k-th smallest walks the block lengths (about `len / 300` of them).
#[derive(Debug, Clone, Default)]
pub(crate) struct Sorted {
    /// Non-empty, each ascending, every value of a block ≤ every value of
    /// the next.
    blocks: Vec<Vec<f64>>,
    len: usize,
}

impl Sorted {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// True when no sample is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Index of the first block whose last value is not below `v`
    /// (`blocks.len()` when every value is below it).
    fn block_of(&self, v: f64) -> usize {
        self.blocks
            .partition_point(|b| b.last().is_some_and(|l| l.total_cmp(&v).is_lt()))
    }

    /// Adds a sample.
    pub(crate) fn insert(&mut self, v: f64) {
        let i = self.block_of(v).min(self.blocks.len().saturating_sub(1));
        let Some(b) = self.blocks.get_mut(i) else {
            let mut b = Vec::with_capacity(BLOCK_MAX);
            b.push(v);
            self.blocks.push(b);
            self.len = 1;
            return;
        };
        let at = b.partition_point(|x| x.total_cmp(&v).is_le());
        b.insert(at, v);
        self.len += 1;
        if b.len() > BLOCK_MAX {
            let tail = b.split_off(b.len() / 2);
            self.blocks.insert(i + 1, tail);
        }
    }

    /// Removes one sample equal to `v` (in [`f64::total_cmp`]'s sense);
    /// false when there is none.
    pub(crate) fn remove(&mut self, v: f64) -> bool {
        let i = self.block_of(v);
        let Some(b) = self.blocks.get_mut(i) else {
            return false;
        };
        let at = b.partition_point(|x| x.total_cmp(&v).is_lt());
        if !b.get(at).is_some_and(|x| x.total_cmp(&v).is_eq()) {
            return false;
        }
        b.remove(at);
        self.len -= 1;
        if b.is_empty() {
            self.blocks.remove(i);
        } else if b.len() < BLOCK_MIN && self.blocks.len() > 1 {
            // Merge with a neighbour so the blocks stay few, then split
            // again if that made one too long.
            let j = if i + 1 < self.blocks.len() { i } else { i - 1 };
            let next = self.blocks.remove(j + 1);
            let merged = &mut self.blocks[j];
            merged.extend_from_slice(&next);
            if merged.len() > BLOCK_MAX {
                let tail = merged.split_off(merged.len() / 2);
                self.blocks.insert(j + 1, tail);
            }
        }
        true
    }

    /// The `k`-th smallest sample, from 0.
    pub(crate) fn nth(&self, mut k: usize) -> Option<f64> {
        for b in &self.blocks {
            match b.get(k) {
                Some(v) => return Some(*v),
                None => k -= b.len(),
            }
        }
        None
    }

    /// Nearest-rank quantile ([`nearest_rank`]) of the samples held.
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        self.nth(rank(self.len, q)? - 1)
    }

    /// Quantiles of the samples held, one per entry of `qs`: the same as
    /// [`quantiles`] over them.
    pub(crate) fn quantiles(&self, qs: &[f64]) -> Option<Vec<f64>> {
        if self.is_empty() {
            return None;
        }
        qs.iter().map(|&q| self.quantile(q)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Sorted {
        /// Number of samples held (the window's tests compare it too).
        pub(crate) fn len(&self) -> usize {
            self.len
        }

        /// The samples in ascending order.
        fn iter(&self) -> impl Iterator<Item = f64> + '_ {
            self.blocks.iter().flatten().copied()
        }
    }
    use proptest::prelude::*;

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
    fn rank_is_the_nearest_rank_rule() {
        assert_eq!(rank(0, 0.5), None);
        assert_eq!(rank(10, 1.01), None);
        assert_eq!(rank(10, -0.01), None);
        assert_eq!(rank(10, 0.0), Some(1));
        assert_eq!(rank(10, 0.5), Some(5));
        assert_eq!(rank(10, 0.51), Some(6));
        assert_eq!(rank(10, 1.0), Some(10));
        assert_eq!(rank(1000, 0.999), Some(999));
    }

    #[test]
    fn sorted_splits_and_merges_blocks() {
        let mut s = Sorted::new();
        let n = 5 * BLOCK_MAX + 7;
        // Descending inserts all land in the first block.
        for i in (0..n).rev() {
            s.insert(i as f64);
        }
        assert_eq!(s.len(), n);
        assert!(s.blocks.len() > 5);
        assert!(
            s.blocks
                .iter()
                .all(|b| !b.is_empty() && b.len() <= BLOCK_MAX)
        );
        assert!(s.iter().map(|v| v as usize).eq(0..n));
        assert_eq!(s.nth(n - 1), Some((n - 1) as f64));
        assert_eq!(s.nth(n), None);
        assert_eq!(s.quantile(0.5), Some((n.div_ceil(2) - 1) as f64));
        assert!(!s.remove(0.5));
        assert!(!s.remove(n as f64));
        // Removing every other value merges the thinned blocks.
        for i in (0..n).step_by(2) {
            assert!(s.remove(i as f64));
        }
        assert!(s.iter().map(|v| v as usize).eq((1..n).step_by(2)));
        assert!(
            s.blocks
                .iter()
                .all(|b| !b.is_empty() && b.len() <= BLOCK_MAX)
        );
        for i in (1..n).step_by(2) {
            assert!(s.remove(i as f64));
        }
        assert!(s.is_empty());
        assert!(s.blocks.is_empty());
        assert_eq!(s.quantiles(&[0.5]), None);
    }

    #[test]
    fn sorted_orders_signed_zeros_like_the_sort() {
        let mut s = Sorted::new();
        for v in [0.0, -0.0, 0.0] {
            s.insert(v);
        }
        assert_eq!(
            s.iter().map(f64::to_bits).collect::<Vec<_>>(),
            [(-0.0f64).to_bits(), 0.0f64.to_bits(), 0.0f64.to_bits()]
        );
        assert!(s.remove(-0.0));
        assert!(!s.remove(-0.0));
        assert_eq!(s.len(), 2);
    }

    proptest! {
        /// Any mix of inserts and removals leaves the same multiset, and the
        /// same quantiles, as sorting the samples afresh.
        #[test]
        fn sorted_matches_sorting(
            ops in prop::collection::vec((0u8..3, 0u32..400, 0usize..10_000), 0..3000),
            qs in prop::collection::vec(0.0f64..=1.0, 0..6),
        ) {
            let mut s = Sorted::new();
            let mut reference: Vec<f64> = Vec::new();
            for (kind, v, pick) in ops {
                if kind < 2 || reference.is_empty() {
                    // Few distinct values, so duplicates are common.
                    let v = f64::from(v) * 1e-5;
                    s.insert(v);
                    reference.push(v);
                } else {
                    let v = reference.swap_remove(pick % reference.len());
                    prop_assert!(s.remove(v));
                }
                prop_assert_eq!(s.len(), reference.len());
            }
            let mut sorted = reference.clone();
            sorted.sort_by(f64::total_cmp);
            prop_assert!(s.iter().eq(sorted.iter().copied()));
            let mut all = qs.clone();
            all.extend(crate::model::WINDOW_QUANTILES);
            prop_assert_eq!(s.quantiles(&all), quantiles(&reference, &all));
            for (k, v) in sorted.iter().enumerate() {
                prop_assert_eq!(s.nth(k), Some(*v));
            }
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
