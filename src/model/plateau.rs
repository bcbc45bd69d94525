//! Finding an IOPS cap from a queue-depth sweep.
//!
//! Little's law: IOPS = queue depth / mean latency. A device with spare
//! parallelism answers deeper queues with more IOPS at similar latency
//! (a published NVMe measurement: 10k → 41k → 135k → 294k IOPS at QD
//! 1/4/16/64). A cap answers them with the same IOPS and proportionally
//! longer latency (a published cgroup-cap measurement: 1,997 IOPS at QD 1
//! and 1,999 at QD 16, latency 0.5 → 8 ms). Both are in
//! docs/storage-facts.md.
//! That flat-IOPS, rising-latency shape is the plateau this module detects.
//! A sweep of fixed-size IOs finds a bandwidth cap the same way: its IOPS
//! plateau times the IO size is the bytes-per-second plateau.

use serde::Serialize;

/// One depth of a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct DepthPoint {
    pub(crate) depth: u32,
    pub(crate) iops: f64,
    /// Mean latency in seconds.
    pub(crate) mean: f64,
    /// p99 latency in seconds.
    pub(crate) p99: f64,
    /// Whether the depth ended early, on its share of the sweep's write
    /// budget rather than on its time. Such a depth ran for milliseconds on
    /// a device that took everything the sweep was willing to write: inside
    /// any token bucket's burst and any throttle's 100 ms slice, so its rate
    /// is a lower bound on the device, never evidence of a cap.
    pub(crate) cut_short: bool,
    /// Share of the host's CPU time that was busy (not idle, not waiting
    /// for IO) while the depth ran; `None` when it could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_busy: Option<f64>,
}

impl DepthPoint {
    /// depth ÷ mean latency: what Little's law predicts the IOPS to be; a
    /// large gap to the measured IOPS means the queue was not kept full.
    pub(crate) fn littles_law_iops(&self) -> f64 {
        if self.mean > 0.0 {
            f64::from(self.depth) / self.mean
        } else {
            0.0
        }
    }
}

/// IOPS growth below this factor from one depth to the next (×4) counts as
/// flat; so does a fall by less than the same factor. A cap holds its rate
/// at any deeper queue, so IOPS that fall by more are contention (CPU, a
/// device's garbage collection), not a cap.
pub(crate) const FLAT_GROWTH: f64 = 1.2;
/// Latency must grow by at least this fraction of the depth ratio for the
/// flat part to be a queue building up in front of a limit.
pub(crate) const LATENCY_SHARE: f64 = 0.6;
/// Flat steps a plateau needs, all the way to the deepest depth. A cap
/// binds at every depth beyond the one that first reaches it, so it stays
/// flat over two ×4 steps (a 16× range of depths); a device running out of
/// parallelism (or a loop device out of CPU) typically flattens for one
/// step only, at the deepest depth, and one step can be noise.
pub(crate) const MIN_FLAT_STEPS: usize = 2;

/// A depth that ran while the host's CPUs were at least this busy says
/// nothing of the device: on a host with no idle CPU the submissions and
/// completions (and a loop device's copies) wait for a CPU, so deeper
/// queues add no IOPS and latency grows with the queue, the shape of a
/// cap. Under the parallel test load a loop device's page-cache reads
/// showed such a flat 8 GB/s across depths, a "cap" no volume has.
pub(crate) const CPU_SATURATED: f64 = 0.9;

/// Whether going from depth point `a` to the deeper `b` adds neither IOPS
/// nor loses them, while latency grows with the queue.
fn flat_step(a: &DepthPoint, b: &DepthPoint) -> bool {
    let depth_ratio = f64::from(b.depth) / f64::from(a.depth);
    let iops_growth = b.iops / a.iops;
    let latency_growth = b.mean / a.mean;
    iops_growth < FLAT_GROWTH
        && iops_growth > 1.0 / FLAT_GROWTH
        && latency_growth >= LATENCY_SHARE * depth_ratio
}

/// The IOPS level of a plateau, if the sweep shows one: the highest IOPS
/// from the first depth where deeper queues stop adding IOPS while latency
/// grows in proportion, provided that holds for at least
/// [`MIN_FLAT_STEPS`] steps and up to the deepest depth, and that every
/// depth of it ran its whole time (none [`DepthPoint::cut_short`]). A
/// device fast enough to spend the write budget in milliseconds at every
/// depth can look flat (a loop device's page-cache copy tops out at one
/// CPU's memcpy rate from depth 1), but a cap is a rate held over time,
/// and those depths held nothing for long enough to show one.
pub(crate) fn detect(points: &[DepthPoint]) -> Option<f64> {
    let mut sorted: Vec<DepthPoint> = points
        .iter()
        .copied()
        .filter(|p| p.iops > 0.0 && p.mean > 0.0)
        .collect();
    sorted.sort_by_key(|p| p.depth);
    let flat_steps = sorted
        .windows(2)
        .rev()
        .take_while(|w| flat_step(&w[0], &w[1]))
        .count();
    if flat_steps < MIN_FLAT_STEPS {
        return None;
    }
    let plateau = &sorted[sorted.len() - 1 - flat_steps..];
    if plateau
        .iter()
        .any(|p| p.cut_short || p.cpu_busy.is_some_and(|b| b >= CPU_SATURATED))
    {
        return None;
    }
    plateau.iter().map(|p| p.iops).reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(depth: u32, iops: f64, mean_us: f64) -> DepthPoint {
        DepthPoint {
            cpu_busy: None,
            depth,
            iops,
            mean: mean_us * 1e-6,
            p99: mean_us * 3e-6,
            cut_short: false,
        }
    }

    fn short(mut pt: DepthPoint) -> DepthPoint {
        pt.cut_short = true;
        pt
    }

    /// Each curve's plateau, or none.
    fn assert_plateaus(cases: Vec<(&str, Vec<DepthPoint>, Option<f64>)>) {
        for (name, pts, want) in cases {
            assert_eq!(detect(&pts), want, "{name}");
        }
    }

    #[test]
    fn a_cap_is_a_plateau_from_the_depth_it_is_reached() {
        assert_plateaus(vec![
            (
                "published cgroup cap: read cap 2000: flat from QD 1",
                vec![
                    p(1, 1997.0, 500.0),
                    p(4, 1998.0, 2000.0),
                    p(16, 1999.0, 8000.0),
                    p(64, 2000.0, 32000.0),
                ],
                Some(2000.0),
            ),
            (
                "cap reached at depth 4 (a cloud volume's 3,000 IOPS at 0.6 ms): plateau from 4",
                vec![
                    p(1, 1600.0, 600.0),
                    p(4, 2990.0, 1300.0),
                    p(16, 3010.0, 5300.0),
                    p(64, 3000.0, 21000.0),
                ],
                Some(3010.0),
            ),
            (
                "three depths, flat from the first (a bandwidth cap)",
                vec![
                    p(1, 40.0, 25_000.0),
                    p(4, 40.5, 99_000.0),
                    p(16, 40.1, 399_000.0),
                ],
                Some(40.5),
            ),
        ]);
    }

    #[test]
    fn growth_saturation_and_collapse_are_no_plateau() {
        let busy = |mut pt: DepthPoint, b: f64| {
            pt.cpu_busy = Some(b);
            pt
        };
        assert_plateaus(vec![
            (
                "a loop device's page-cache reads while the CPUs had no idle time: flat, not a cap",
                vec![
                    busy(p(1, 977_000.0, 1.0), 0.97),
                    busy(p(4, 978_000.0, 4.1), 0.99),
                    busy(p(16, 979_000.0, 16.3), 0.99),
                ],
                None,
            ),
            (
                "the same shape with idle CPUs is a cap",
                vec![
                    busy(p(1, 977_000.0, 1.0), 0.55),
                    busy(p(4, 978_000.0, 4.1), 0.6),
                    busy(p(16, 979_000.0, 16.3), 0.6),
                ],
                Some(979_000.0),
            ),
            (
                "published NVMe: IOPS keeps growing, no plateau",
                vec![
                    p(1, 10_100.0, 98.0),
                    p(4, 41_500.0, 96.0),
                    p(16, 135_000.0, 118.0),
                    p(64, 294_000.0, 218.0),
                ],
                None,
            ),
            (
                "device saturating late, flat for one step only: not claimed",
                vec![
                    p(1, 10_000.0, 100.0),
                    p(4, 38_000.0, 105.0),
                    p(16, 100_000.0, 160.0),
                    p(64, 104_000.0, 615.0),
                ],
                None,
            ),
            (
                "loop device out of CPU on this build machine: throughput collapses at depth 16",
                vec![
                    p(1, 11_999.0, 82.0),
                    p(4, 13_064.0, 305.0),
                    p(16, 6144.0, 2597.0),
                ],
                None,
            ),
            (
                "flat early, growing again at the deepest depth: not a cap",
                vec![
                    p(1, 2000.0, 500.0),
                    p(4, 2100.0, 1900.0),
                    p(16, 2150.0, 7400.0),
                    p(64, 9000.0, 7100.0),
                ],
                None,
            ),
            (
                "noisy but flat IOPS with flat latency is not a cap (queue not filling)",
                vec![p(1, 5000.0, 200.0), p(4, 5100.0, 210.0)],
                None,
            ),
            ("too few points", vec![p(1, 2000.0, 500.0)], None),
        ]);
    }

    #[test]
    fn depths_cut_short_by_the_write_budget() {
        assert_plateaus(vec![
            (
                "unthrottled loop device, 256 KiB writes, every depth ended on its \
                 36.6 MiB write share within ~8 ms: flat in shape, not a cap",
                vec![
                    short(p(1, 19_759.0, 50.0)),
                    short(p(4, 18_232.0, 219.0)),
                    short(p(16, 16_290.0, 982.0)),
                ],
                None,
            ),
            (
                "the same rates with the depths run to their time: a plateau",
                vec![
                    p(1, 19_759.0, 50.0),
                    p(4, 18_232.0, 219.0),
                    p(16, 16_290.0, 982.0),
                ],
                Some(19_759.0),
            ),
            (
                "a depth cut short below the plateau does not matter",
                vec![
                    short(p(1, 9_000.0, 110.0)),
                    p(4, 20_000.0, 200.0),
                    p(16, 20_100.0, 796.0),
                    p(64, 20_050.0, 3_190.0),
                ],
                Some(20_100.0),
            ),
        ]);
    }

    #[test]
    fn littles_law() {
        assert!((p(16, 0.0, 8000.0).littles_law_iops() - 2000.0).abs() < 1e-6);
    }
}
