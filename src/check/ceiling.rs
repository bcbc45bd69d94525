//! `check`'s commit ceiling: the most commits per second one client can do
//! on the volume, on each basis `check` has, and the lowest of them, the one
//! in force. The same bases as the daemon's
//! `pgstorage_commit_ceiling_per_second`:
//!
//! - `probe_mean`: 1 / the mean time of `check`'s back-to-back commits. A
//!   client that commits back to back does 1 / E[T] commits per second; the
//!   median is no rate. Under a token bucket most commits pass at device
//!   speed and a few wait a whole slice: at a 150 write-IOPS v1 blkio cap one
//!   fio client did 75.6 commits/s with a sync p50 of 171 µs and a mean of
//!   13.2 ms, so 1 / p50 read 78× the real rate and 1 / mean read it.
//! - `cap`: a write-IOPS cap ÷ the device writes one commit costs.

use serde::Serialize;

use crate::model::ceiling::capped_ceiling;

/// Where a write-IOPS cap came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CapSource {
    /// The plateau the queue-depth sweep found for 8 KiB random writes.
    Sweep,
    /// A `write_iops` limit on the volume's disk in the cgroup `check` runs
    /// in (the tightest along its path).
    Cgroup,
}

impl CapSource {
    fn describe(self) -> &'static str {
        match self {
            CapSource::Sweep => "the write-IOPS plateau the queue-depth sweep found",
            CapSource::Cgroup => "the cgroup's write_iops limit on this disk",
        }
    }
}

/// A write-IOPS cap `check` knows of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Cap {
    pub(crate) write_iops: f64,
    pub(crate) source: CapSource,
}

/// One basis's ceiling, with what it was computed from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Ceiling {
    /// `probe_mean` or `cap`.
    pub(crate) basis: &'static str,
    pub(crate) per_second: f64,
    /// probe_mean: the busy commits it was computed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) commits: Option<u64>,
    /// probe_mean: their mean time, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) mean_seconds: Option<f64>,
    /// cap: the write-IOPS cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) write_iops_cap: Option<f64>,
    /// cap: where the cap came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cap_source: Option<CapSource>,
    /// cap: device writes per commit it was divided by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) writes_per_commit: Option<f64>,
}

impl Ceiling {
    /// What it was computed from, in words, for the text report.
    pub(crate) fn describe(&self) -> String {
        match (self.write_iops_cap, self.cap_source, self.writes_per_commit) {
            (Some(cap), Some(src), Some(w)) => format!(
                "{}, {cap:.0} IOPS ÷ {w} device writes per commit",
                src.describe()
            ),
            _ => format!(
                "1 / the mean of {} back-to-back commits, the longest left out",
                self.commits.unwrap_or(0)
            ),
        }
    }
}

/// Commits per second of a back-to-back stream of `count` commits with mean
/// time `mean` and longest `max` (seconds): 1 / the mean with the longest
/// commit left out, (count − 1) / (count × mean − max). A throttle passes IO
/// in cycles (a v1 blkio throttle in 100 ms slices): most commits pass at
/// device speed and one in a few dozen waits out the rest of the cycle. A
/// stream of a few seconds starts and ends at arbitrary points of a cycle,
/// so it can hold one wait more than the IO it counts paid for (starting
/// just after an allowance was spent, ending just before the next); on the
/// build machine at 240 write IOPS the plain mean of 5 s streams read
/// 0.98–1.00× fio's one-client rate over 10 s. Leaving out the one longest
/// commit takes out at most that one wait, so the figure stays at or above
/// the rate the throttle sustains; without a throttle the longest commit is
/// one of thousands and changes the figure by a fraction of a percent. With
/// one commit, 1 / its time. `None` without a positive finite time.
pub(crate) fn probe_mean_rate(count: u64, mean: f64, max: f64) -> Option<f64> {
    if count == 0 || !(mean.is_finite() && mean > 0.0) {
        return None;
    }
    let total = mean * count as f64;
    let rest = total - max;
    if count >= 2 && max.is_finite() && max >= 0.0 && rest > 0.0 {
        Some((count - 1) as f64 / rest)
    } else {
        Some(1.0 / mean)
    }
}

/// The ceilings `check` can give: `probe_mean` from the busy commits
/// (`count`, `mean`, `max` in seconds) when there were any, and one `cap`
/// ceiling per known cap (`writes_per_commit` device writes each).
pub(crate) fn ceilings(
    busy: Option<(u64, f64, f64)>,
    caps: &[Cap],
    writes_per_commit: f64,
) -> Vec<Ceiling> {
    let none = Ceiling {
        basis: "",
        per_second: 0.0,
        commits: None,
        mean_seconds: None,
        write_iops_cap: None,
        cap_source: None,
        writes_per_commit: None,
    };
    let probe = busy.and_then(|(count, mean, max)| {
        probe_mean_rate(count, mean, max).map(|r| Ceiling {
            basis: "probe_mean",
            per_second: r,
            commits: Some(count),
            mean_seconds: Some(mean),
            ..none.clone()
        })
    });
    let capped = caps.iter().filter_map(|c| {
        capped_ceiling(c.write_iops, writes_per_commit).map(|r| Ceiling {
            basis: "cap",
            // The sweep's plateau is measured: the daemon's headroom for a
            // detected cap (limits::caps::headroom).
            per_second: match c.source {
                CapSource::Sweep => r * crate::limits::caps::headroom("detected"),
                CapSource::Cgroup => r,
            },
            write_iops_cap: Some(c.write_iops),
            cap_source: Some(c.source),
            writes_per_commit: Some(writes_per_commit),
            ..none.clone()
        })
    });
    probe.into_iter().chain(capped).collect()
}

/// The ceiling in force: the lowest, as in the daemon; the first of equal
/// ones.
pub(crate) fn in_force(ceilings: &[Ceiling]) -> Option<&Ceiling> {
    ceilings
        .iter()
        .filter(|c| c.per_second.is_finite() && c.per_second > 0.0)
        .reduce(|a, b| if b.per_second < a.per_second { b } else { a })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::pacing::DEFAULT_WRITES_PER_COMMIT;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn probe_mean_rate_table() {
        // (count, mean, max, want, what)
        let cases = [
            // Build machine, a write + fdatasync stream at 240 write IOPS for
            // 4 s: 483 commits, mean 8.28 ms, longest 135 ms; fio 120.7/s.
            // Plain 1 / mean: 120.8/s; the longest left out: 124.7/s.
            (
                483,
                4.0 / 483.0,
                0.135,
                482.0 / (4.0 - 0.135),
                "240 write IOPS",
            ),
            // Uncapped loop device: 11,879 commits at 104 µs, longest 2 ms:
            // the longest moves the figure by 0.16 %.
            (
                11_879,
                104e-6,
                2e-3,
                11_878.0 / (11_879.0 * 104e-6 - 2e-3),
                "uncapped",
            ),
            (1, 5e-3, 5e-3, 200.0, "one commit: 1 / its time"),
            // The longest is the whole time (a clock quirk): plain mean.
            (2, 1e-3, 2e-3, 1000.0, "nothing left after the longest"),
        ];
        for (count, mean, max, want, what) in cases {
            let got = probe_mean_rate(count, mean, max);
            assert!(
                got.is_some_and(|g| close(g, want)),
                "{what}: got {got:?}, want {want}"
            );
        }
        let r = probe_mean_rate(483, 4.0 / 483.0, 0.135).unwrap_or(0.0);
        assert!(r / 120.7 > 1.0 && r / 120.7 < 1.05, "{r}");
        assert_eq!(probe_mean_rate(0, 1e-3, 1e-3), None);
        assert_eq!(probe_mean_rate(10, 0.0, 0.0), None);
        assert_eq!(probe_mean_rate(10, f64::NAN, 1e-3), None);
    }

    #[test]
    fn in_force_is_the_lowest_basis() {
        let w = DEFAULT_WRITES_PER_COMMIT;
        let sweep = Cap {
            write_iops: 245.0,
            source: CapSource::Sweep,
        };
        let cgroup = Cap {
            write_iops: 240.0,
            source: CapSource::Cgroup,
        };
        // (busy, caps, basis in force, its rate)
        let cases = [
            // Uncapped NVMe-like: the probe alone.
            (
                Some((10_000, 100e-6, 100e-6)),
                vec![],
                "probe_mean",
                10_000.0,
            ),
            // A hidden cap found by the sweep: 245 / 2 with the headroom
            // of a measured rate (134.75), above the probe's 1 / mean
            // with a whole wait in it (129.6): the probe binds.
            (
                Some((150, 1.25 / 150.0, 0.1)),
                vec![sweep],
                "probe_mean",
                149.0 / 1.15,
            ),
            // The cgroup's cap is tighter than the sweep's plateau.
            (
                Some((150, 1.25 / 150.0, 0.1)),
                vec![sweep, cgroup],
                "cap",
                120.0,
            ),
            // No commit probe (--no-commit): the cap alone.
            (None, vec![sweep], "cap", 134.75),
            // A cap far above what the device does: the probe binds.
            (
                Some((5_000, 1e-3, 2e-3)),
                vec![Cap {
                    write_iops: 16_000.0,
                    source: CapSource::Cgroup,
                }],
                "probe_mean",
                4_999.0 / (5.0 - 2e-3),
            ),
        ];
        for (busy, caps, basis, rate) in cases {
            let all = ceilings(busy, &caps, w);
            let f = in_force(&all);
            assert_eq!(f.map(|c| c.basis), Some(basis), "{all:?}");
            assert!(f.is_some_and(|c| close(c.per_second, rate)), "{all:?}");
        }
        assert!(in_force(&ceilings(None, &[], w)).is_none());
        // A cap of zero is no ceiling (capped_ceiling refuses it).
        let zero = Cap {
            write_iops: 0.0,
            source: CapSource::Sweep,
        };
        assert!(ceilings(None, &[zero], w).is_empty());
    }

    #[test]
    fn describes_its_inputs() {
        let c = ceilings(
            Some((150, 0.008, 0.1)),
            &[Cap {
                write_iops: 245.0,
                source: CapSource::Sweep,
            }],
            2.0,
        );
        assert_eq!(
            c[0].describe(),
            "1 / the mean of 150 back-to-back commits, the longest left out"
        );
        assert_eq!(
            c[1].describe(),
            "the write-IOPS plateau the queue-depth sweep found, 245 IOPS ÷ 2 device writes per commit"
        );
    }
}
