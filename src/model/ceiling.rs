//! Commit ceilings: how many commits per second one client can do.
//!
//! A backend that commits waits for its WAL record to be written and synced
//! before it can send the next statement. With one client nothing else shares
//! that sync (no group commit), so one client's commit rate cannot exceed
//! 1 / (WAL write + sync latency). In a published NVMe measurement a 0.89 ms
//! sync gave 904 TPS at one client once the statement's own work was added.
//! The test tables below use the figures of docs/storage-facts.md.

/// Upper bound on one client's commits per second for a given commit latency
/// (WAL write + sync) in seconds. `None` when the latency is not a positive
/// finite number, so a missing measurement never turns into an infinite ceiling.
pub fn commit_ceiling(commit_latency_seconds: f64) -> Option<f64> {
    if commit_latency_seconds.is_finite() && commit_latency_seconds > 0.0 {
        Some(1.0 / commit_latency_seconds)
    } else {
        None
    }
}

/// How far above its measured rate the probe's ceiling is set. The rate
/// is 1 / the mean time per commit of a few bursts, and a burst is one
/// moment: on the build machine one burst's rate under a throttle came
/// within 0.95-1.01 of fio's rate over 10-20 s in the same cgroup, and
/// unthrottled bursts moved more than that from minute to minute. A
/// ceiling is a bound one client stays under; 10 % above the measured rate
/// keeps it there through such a moment and within 1.35 of the rate.
pub const RATE_HEADROOM: f64 = 1.10;

/// The probe's commit ceiling from the mean time per commit of its busy
/// commits: a client committing back to back does 1 / E[T] per second (a
/// median is no rate: under a token bucket most commits pass at device
/// speed and a few wait a whole slice), raised by [`RATE_HEADROOM`].
pub fn rate_ceiling(mean_commit_seconds: f64) -> Option<f64> {
    commit_ceiling(mean_commit_seconds).map(|c| c * RATE_HEADROOM)
}

/// The least time one commit of one client takes by PostgreSQL's own
/// figures: the WAL time per sync (write + sync) plus, when known, the
/// fastest round trip of a trivial query. The round trip is a lower bound
/// of the statement's own work (every transaction sends at least one
/// statement and waits for its answer), so the sum stays below any
/// client's commit time and its inverse an upper bound of the rate. `None`
/// when the WAL time is not a finite number ≥ 0; a round trip that is not
/// is left out rather than trusted.
pub fn commit_floor(wal_seconds: f64, round_trip: Option<f64>) -> Option<f64> {
    if !(wal_seconds.is_finite() && wal_seconds >= 0.0) {
        return None;
    }
    let rt = round_trip
        .filter(|r| r.is_finite() && *r >= 0.0)
        .unwrap_or(0.0);
    Some(wal_seconds + rt)
}

/// PostgreSQL's mean WAL sync time between two readings of its cumulative
/// counters (syncs, seconds spent syncing): Δseconds / Δsyncs. `None` when
/// no sync happened in between, or a counter went backwards (statistics
/// reset or server restart), so no made-up figure reaches a dashboard.
pub fn mean_sync_seconds(earlier: (f64, f64), later: (f64, f64)) -> Option<f64> {
    let syncs = later.0 - earlier.0;
    let secs = later.1 - earlier.1;
    if syncs >= 1.0 && secs >= 0.0 && secs.is_finite() {
        Some(secs / syncs)
    } else {
        None
    }
}

/// The share of wall time spent syncing between two readings of a
/// cumulative sync seconds counter (earlier, later) `elapsed` seconds
/// apart. `None` over less than a second, or when the counter went
/// backwards (statistics reset or server restart).
pub fn sync_time_share(seconds: (f64, f64), elapsed: f64) -> Option<f64> {
    let spent = seconds.1 - seconds.0;
    if elapsed >= 1.0 && spent >= 0.0 && spent.is_finite() {
        Some(spent / elapsed)
    } else {
        None
    }
}

/// The commit ceiling a write-IOPS cap imposes: each commit costs
/// `writes_per_commit` device writes, so at most cap / writes commits per
/// second get through, however fast the device is. On the build machine a 100 IOPS
/// cap and ≈ 2.3 writes per write+fdatasync gave 44 commits/s.
pub fn capped_ceiling(write_iops_cap: f64, writes_per_commit: f64) -> Option<f64> {
    if write_iops_cap > 0.0
        && writes_per_commit > 0.0
        && write_iops_cap.is_finite()
        && writes_per_commit.is_finite()
    {
        Some(write_iops_cap / writes_per_commit)
    } else {
        None
    }
}

/// How much slower PostgreSQL's own syncs were than the probe's: far above
/// 1 means something slows PostgreSQL that the probe does not feel (its
/// cgroup cap, contention with checkpoints, a different device).
pub fn sync_ratio(postgres_mean: f64, probe_mean: f64) -> Option<f64> {
    if postgres_mean.is_finite()
        && probe_mean.is_finite()
        && probe_mean > 0.0
        && postgres_mean >= 0.0
    {
        Some(postgres_mean / probe_mean)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_floor_adds_a_valid_round_trip_only() {
        // The build machine's bench figures: 397 µs of WAL per sync and a
        // 531 µs trivial transaction; a 45 µs round trip brings the
        // ceiling from 1.34x to 1.20x of the measured rate, still above.
        let f = commit_floor(397e-6, Some(45e-6)).unwrap_or(0.0);
        assert!((f - 442e-6).abs() < 1e-12, "{f}");
        let ratio = commit_ceiling(f).unwrap_or(0.0) / (1.0 / 531e-6);
        assert!(ratio > 1.19 && ratio < 1.21, "{ratio}");
        assert_eq!(commit_floor(397e-6, None), Some(397e-6));
        assert_eq!(commit_floor(397e-6, Some(f64::NAN)), Some(397e-6));
        assert_eq!(commit_floor(397e-6, Some(-1e-6)), Some(397e-6));
        assert_eq!(commit_floor(f64::INFINITY, Some(45e-6)), None);
        assert_eq!(commit_floor(-1.0, None), None);
    }

    #[test]
    fn sync_time_share_is_seconds_spent_per_second() {
        assert_eq!(sync_time_share((10.0, 13.0), 6.0), Some(0.5));
        assert_eq!(sync_time_share((10.0, 9.0), 6.0), None);
        assert_eq!(sync_time_share((10.0, 10.2), 0.5), None);
    }

    #[test]
    fn capped_ceilings() {
        assert!((capped_ceiling(100.0, 2.27).unwrap() - 44.05).abs() < 0.01);
        // Published: btrfs needed 7-8 device writes per fdatasync: 100/7.5 ≈ 13.
        assert!((capped_ceiling(100.0, 7.5).unwrap() - 13.3).abs() < 0.1);
        assert_eq!(capped_ceiling(100.0, 0.0), None);
        assert_eq!(capped_ceiling(0.0, 2.0), None);
    }

    #[test]
    fn postgres_mean_sync_table() {
        // Build machine: pg_stat_io WAL fsync mean ≈ 223 µs uncapped, ≈ 23 ms capped.
        let cases = [
            ((1000.0, 0.5), (11000.0, 2.73), Some(0.000_223)),
            ((10.0, 1.0), (54.0, 2.012), Some(0.023)),
            ((5.0, 1.0), (5.0, 1.0), None),
            ((500.0, 9.0), (20.0, 0.1), None),
        ];
        for (a, b, want) in cases {
            let got = mean_sync_seconds(a, b);
            match (got, want) {
                (Some(g), Some(w)) => assert!((g - w).abs() / w < 1e-9, "{a:?} {b:?}: {g}"),
                _ => assert_eq!(got, want, "{a:?} {b:?}"),
            }
        }
        assert_eq!(sync_ratio(0.023, 0.00015).map(|r| r.round()), Some(153.0));
        assert_eq!(sync_ratio(0.001, 0.0), None);
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        ((a - b) / b).abs() <= rel
    }

    #[test]
    fn ceilings_from_facts() {
        // (latency, expected ceiling, source)
        let cases = [
            (
                0.000_889,
                1125.0,
                "published NVMe: fio fdatasync mean, 1 job",
            ),
            (
                0.001_106,
                904.0,
                "published NVMe: pgbench 1 client, 1.106 ms per commit",
            ),
            (
                0.001,
                1000.0,
                "published NVMe: 1 ms sync caps one client at 1,000/s",
            ),
            (
                0.009,
                111.1,
                "published NVMe: 9 ms sync caps one client at 111/s",
            ),
            (
                0.0734,
                13.6,
                "published cgroup cap: write+fdatasync under a 100 IOPS cap",
            ),
            (
                0.0695,
                14.4,
                "published cgroup cap: pgbench 1 client under the cap",
            ),
            (0.000_151, 6622.5, "build machine: sync mean"),
        ];
        for (lat, want, why) in cases {
            let got = commit_ceiling(lat).unwrap();
            assert!(close(got, want, 0.01), "{why}: got {got}, want {want}");
        }
    }

    #[test]
    fn rate_ceiling_is_a_mean_with_headroom() {
        // A v1 throttle at 150 write IOPS: fio's sync p50 171 µs, mean
        // 13.2 ms, 75.6 commits/s. The median would claim 5,848/s.
        let c = rate_ceiling(0.0132).unwrap_or(0.0);
        assert!(c / 75.6 >= 1.0 && c / 75.6 <= 1.35, "{c}");
        assert!(close(c, 83.3, 0.01), "{c}");
        assert_eq!(rate_ceiling(0.0), None);
        assert_eq!(rate_ceiling(f64::NAN), None);
    }

    #[test]
    fn no_ceiling_without_a_measurement() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(commit_ceiling(bad), None, "{bad}");
        }
    }
}
