//! The derived model: pure functions over latency samples.
//!
//! Nothing here does IO or reads a clock. Probes feed samples in, the metrics
//! and `check` layers read results out. Keeping the math pure is what lets the
//! published and measured storage figures (docs/storage-facts.md) be
//! unit-tested as tables.

pub(crate) mod buckets;
pub(crate) mod ceiling;
pub(crate) mod pacing;
pub(crate) mod plateau;
pub(crate) mod quantile;
pub(crate) mod verdict;
pub mod window;

/// Quantiles exported for every window: the median, the usual tail points and
/// the maximum. p99.9 matters because a single slow WAL sync stalls every
/// backend waiting in group commit behind it.
pub const WINDOW_QUANTILES: [f64; 5] = [0.5, 0.9, 0.99, 0.999, 1.0];
