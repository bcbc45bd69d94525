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
pub(crate) fn commit_ceiling(commit_latency_seconds: f64) -> Option<f64> {
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
pub(crate) const RATE_HEADROOM: f64 = 1.10;

/// The probe's commit ceiling from the mean time per commit of its busy
/// commits: a client committing back to back does 1 / E[T] per second (a
/// median is no rate: under a token bucket most commits pass at device
/// speed and a few wait a whole slice), raised by [`RATE_HEADROOM`].
pub(crate) fn rate_ceiling(mean_commit_seconds: f64) -> Option<f64> {
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
pub(crate) fn commit_floor(wal_seconds: f64, round_trip: Option<f64>) -> Option<f64> {
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
pub(crate) fn mean_sync_seconds(earlier: (f64, f64), later: (f64, f64)) -> Option<f64> {
    let syncs = later.0 - earlier.0;
    let secs = later.1 - earlier.1;
    if syncs >= 1.0 && secs >= 0.0 && secs.is_finite() {
        Some(secs / syncs)
    } else {
        None
    }
}

/// What PostgreSQL's WAL counters grew by over one collection interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct WalInterval {
    /// WAL syncs (pg_stat_wal up to 17, pg_stat_io object `wal` from 18).
    pub(crate) syncs: f64,
    /// Seconds spent in those syncs plus the WAL writes before them.
    pub(crate) seconds: f64,
    /// Bytes of WAL generated (pg_stat_wal.wal_bytes).
    pub(crate) bytes: f64,
    /// Transactions committed (pg_stat_database.xact_commit summed):
    /// counted in the same flush of a backend's statistics as its syncs,
    /// so the two agree over any interval, but read-only transactions
    /// (which never sync) count too, all but the exporter's own.
    pub(crate) commits: f64,
    /// Transaction ids assigned: the transactions that wrote, each of
    /// which flushes its commit record; read-only ones get none. Read at
    /// the moment of the scrape, while the syncs reach the statistics up
    /// to a second late, so over a short interval the two disagree.
    pub(crate) xids: f64,
}

/// The shortest interval judged on its own; shorter collection intervals
/// are joined until they last this long. The transaction ids are read at
/// the scrape, while a backend's syncs and commits reach the statistics
/// when it next reports them, at most once a second: over 0.5 s intervals
/// one client's ids per sync ranged from 0.29 to 0.86, and the intervals
/// that passed were the slow ones (fewer syncs per report), so the basis
/// read 0.92× the client's rate. Over 5 s the second of skew is a fifth.
pub(crate) const ONE_COMMIT_MIN_SPAN_SECONDS: f64 = 5.0;

/// The fewest syncs an interval needs to count: enough that one slow or
/// fast flush does not make its mean. A client under a 100 write-IOPS cap
/// commits about 50 times a second, 500 times in a default 10 s interval.
pub(crate) const ONE_COMMIT_MIN_SYNCS: f64 = 20.0;

/// Commits per sync that still read as one commit per flush. Measured on
/// PostgreSQL 18 (ext4 loop device, 2 s intervals): one client 1.00 by
/// pg_stat_database, 0.94–1.06 by transaction ids (single-row INSERTs and
/// pgbench's TPC-B-like transactions alike); 4 clients 1.3–1.5
/// (TPC-B-like) and 2.0–2.5 (single-row INSERTs): group commit.
pub(crate) const ONE_COMMIT_PER_SYNC: (f64, f64) = (0.9, 1.1);

/// The fewest transaction ids per sync: at least half the syncs served a
/// transaction that wrote. A bulk load's WAL reaches pg_stat_wal only when
/// its statement ends, while the WAL writer's syncs of it are counted as
/// they happen, so a 0.5 s interval inside a long COPY read 30 syncs,
/// no WAL bytes and, from the exporter's own read-only queries, as many
/// commits: only the ids tell. Half, not 0.9, because the ids are read at
/// the scrape and the syncs reach the statistics up to a second later:
/// over an interval of [`ONE_COMMIT_MIN_SPAN_SECONDS`] a second of skew is
/// a fifth of it.
pub(crate) const ONE_COMMIT_MIN_IDS_PER_SYNC: f64 = 0.5;

/// The most WAL per sync of one small commit: one WAL page, the size of the
/// probe's write. Measured: a single-row INSERT 170 bytes, pgbench's
/// TPC-B-like transaction 400; `pgbench -i -s 10` 2.25 MB per sync.
pub(crate) const ONE_COMMIT_MAX_BYTES_PER_SYNC: f64 = 8192.0;

/// Whether an interval's syncs were each one small commit's flush:
/// - enough syncs to mean something;
/// - little WAL per sync: not a bulk load's large flushes;
/// - a commit for nearly every sync (pg_stat_database), and a writing
///   transaction (an id) for at least half of them: no flushes that
///   served no commit, as the WAL writer's of a bulk load;
/// - no more than about one commit per sync by pg_stat_database: more is
///   group commit, one flush for several clients' commits. Its commits
///   reach the statistics with the syncs, and read-only transactions only
///   add to them, so this errs toward leaving an interval out. Not by the
///   ids: at the end of a load they lag the syncs, and the 10 s interval
///   holding the end of 4 clients' TPC-B-like load read 1.21 commits but
///   1.04 ids per sync. So read-only traffic beside one writing
///   client leaves the basis out once it exceeds a tenth of the writes;
///   the exporter's own is taken off before (`one_commit_totals`).
pub(crate) fn one_commit_per_sync(d: &WalInterval) -> bool {
    let valid = [d.syncs, d.seconds, d.bytes, d.commits, d.xids]
        .iter()
        .all(|v| v.is_finite() && *v >= 0.0);
    if !valid || d.syncs < ONE_COMMIT_MIN_SYNCS {
        return false;
    }
    let (least, most) = ONE_COMMIT_PER_SYNC;
    let commits = d.commits / d.syncs;
    let xids = d.xids / d.syncs;
    d.bytes / d.syncs <= ONE_COMMIT_MAX_BYTES_PER_SYNC
        && commits >= least
        && xids >= ONE_COMMIT_MIN_IDS_PER_SYNC
        && commits <= most
}

/// One client's WAL time per commit by PostgreSQL's own figures: the mean
/// WAL write + sync time per sync over the intervals in which each sync
/// was one small commit's ([`one_commit_per_sync`]), Σ seconds / Σ syncs:
/// the mean wait of the window's one-client commits, so 1 / (it + the
/// rest of a transaction) is their rate. Intervals of group commit or
/// bulk loads never count, whatever their time. Not the fastest
/// interval's: that is looser by the spread between intervals, which on a
/// busy virtual machine went from 1.9 to 3.3 ms within 20 s for one client.
/// `None` when no interval qualifies.
pub(crate) fn one_client_wal_seconds<'a>(
    intervals: impl IntoIterator<Item = &'a WalInterval>,
) -> Option<f64> {
    let (seconds, syncs) = intervals
        .into_iter()
        .filter(|d| one_commit_per_sync(d))
        .fold((0.0, 0.0), |(s, n), d| (s + d.seconds, n + d.syncs));
    (syncs > 0.0).then(|| seconds / syncs)
}

/// The share of wall time spent syncing between two readings of a
/// cumulative sync seconds counter (earlier, later) `elapsed` seconds
/// apart. `None` over less than a second, or when the counter went
/// backwards (statistics reset or server restart).
pub(crate) fn sync_time_share(seconds: (f64, f64), elapsed: f64) -> Option<f64> {
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
pub(crate) fn capped_ceiling(write_iops_cap: f64, writes_per_commit: f64) -> Option<f64> {
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
pub(crate) fn sync_ratio(postgres_mean: f64, probe_mean: f64) -> Option<f64> {
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

    /// (syncs, seconds, bytes, commits and xids) of one interval.
    fn iv(syncs: f64, seconds: f64, bytes: f64, xids: f64) -> WalInterval {
        WalInterval {
            syncs,
            seconds,
            bytes,
            commits: xids,
            xids,
        }
    }

    /// Each interval's verdict: one commit per sync or not.
    fn assert_one_commit(cases: &[(WalInterval, bool, &str)]) {
        for (d, want, why) in cases {
            assert_eq!(one_commit_per_sync(d), *want, "{why}: {d:?}");
        }
    }

    #[test]
    fn one_commit_intervals_of_measured_loads() {
        // Per-interval figures measured on PostgreSQL 18 (ext4 loop
        // device), per sync: bytes, xids, WAL write + sync µs.
        assert_one_commit(&[
            // One client, single-row INSERTs: 170 B, 1.00, 118 µs.
            (
                iv(12_000.0, 12_000.0 * 118e-6, 12_000.0 * 170.0, 12_050.0),
                true,
                "1 client INSERT",
            ),
            // One client, TPC-B-like: 400 B, 0.99.
            (
                iv(4_034.0, 4_034.0 * 250e-6, 4_034.0 * 400.0, 3_995.0),
                true,
                "1 client TPC-B",
            ),
            // pgbench -i -s 10: 57 syncs of 2.25 MB, 3.5 ms each.
            (
                iv(57.0, 57.0 * 4.8e-3, 57.0 * 2.25e6, 147.0),
                false,
                "bulk load",
            ),
            // A bulk load's flushes alone: syncs that serve no commit.
            (
                iv(400.0, 400.0 * 2e-3, 400.0 * 6000.0, 3.0),
                false,
                "syncs without commits",
            ),
            // 4 clients TPC-B-like: 1.4 xids per sync, 590 B.
            (
                iv(3_327.0, 3_327.0 * 469e-6, 3_327.0 * 590.0, 4_574.0),
                false,
                "4 clients TPC-B",
            ),
            // 4 clients single-row INSERTs: 2.2 per sync.
            (
                iv(4_718.0, 4_718.0 * 387e-6, 4_718.0 * 379.0, 10_487.0),
                false,
                "4 clients INSERT",
            ),
            // Too few syncs to mean anything.
            (iv(5.0, 5.0 * 100e-6, 5.0 * 170.0, 5.0), false, "5 syncs"),
        ]);
    }

    #[test]
    fn one_commit_intervals_beside_read_only_commits_and_late_counters() {
        assert_one_commit(&[
            // Read-only transactions beside one writing client: more
            // commits than syncs; one id per sync, but the ids do not
            // tell group commit at the end of a load (next case).
            (
                WalInterval {
                    commits: 2.0 * 12_000.0,
                    ..iv(12_000.0, 12_000.0 * 118e-6, 12_000.0 * 170.0, 12_050.0)
                },
                false,
                "1 client INSERT beside read-only ones",
            ),
            // The end of 4 clients' TPC-B-like load in a 10 s interval:
            // 1.21 commits, 1.04 ids per sync.
            (
                WalInterval {
                    commits: 1.21 * 11_708.0,
                    ..iv(
                        11_708.0,
                        11_708.0 * 224e-6,
                        11_708.0 * 489.0,
                        1.04 * 11_708.0,
                    )
                },
                false,
                "end of 4 clients",
            ),
            // One client over a 1 s interval: the ids, read at the scrape,
            // ran ahead of the syncs, which reach the statistics later;
            // pg_stat_database's commits come in the same flush.
            (
                WalInterval {
                    xids: 1.5 * 3_000.0,
                    ..iv(3_000.0, 3_000.0 * 118e-6, 3_000.0 * 170.0, 3_000.0)
                },
                true,
                "1 client, ids ahead",
            ),
            (
                WalInterval {
                    xids: 0.55 * 3_000.0,
                    ..iv(3_000.0, 3_000.0 * 118e-6, 3_000.0 * 170.0, 3_000.0)
                },
                true,
                "1 client, ids behind",
            ),
            // A bulk load beside read-only transactions: commits enough,
            // but not small flushes.
            (
                WalInterval {
                    commits: 500.0,
                    ..iv(400.0, 400.0 * 2e-3, 400.0 * 6000.0 * 100.0, 3.0)
                },
                false,
                "bulk load beside read-only ones",
            ),
            // Inside a long COPY (500 ms interval): the WAL writer's syncs,
            // the load's bytes not reported yet, the exporter's read-only
            // commits, no transaction id.
            (
                WalInterval {
                    commits: 24.0,
                    ..iv(22.0, 22.0 * 2.1e-3, 0.0, 0.0)
                },
                false,
                "inside a COPY",
            ),
        ]);
    }

    #[test]
    fn no_one_commit_interval_from_broken_counters() {
        assert_one_commit(&[
            // A counter reset makes a negative delta.
            (iv(-100.0, 0.01, 100.0, -100.0), false, "reset"),
            (iv(100.0, f64::NAN, 100.0, 100.0), false, "NaN"),
        ]);
    }

    #[test]
    fn one_client_wal_time_ignores_group_commit_and_bulk_loads() {
        // The sequence idle, pgbench -i, 4 clients, 1 client: the slow
        // intervals before never make the figure; the one-client
        // intervals' syncs do, 24,808 of them in 2.857 s.
        let window = [
            iv(0.0, 0.0, 0.0, 0.0),
            iv(57.0, 57.0 * 4.8e-3, 57.0 * 2.25e6, 147.0),
            iv(2_130.0, 2_130.0 * 815e-6, 2_130.0 * 731.0, 2_790.0),
            iv(10_647.0, 10_647.0 * 131e-6, 10_647.0 * 170.0, 10_452.0),
            iv(14_161.0, 14_161.0 * 103e-6, 14_161.0 * 170.0, 14_214.0),
        ];
        let got = one_client_wal_seconds(&window).unwrap_or(0.0);
        let want = (10_647.0 * 131e-6 + 14_161.0 * 103e-6) / 24_808.0;
        assert!((got - want).abs() < 1e-12, "{got} {want}");
        // Without the one-client intervals: nothing, not the loads' figure.
        assert_eq!(one_client_wal_seconds(&window[..3]), None);
        assert_eq!(one_client_wal_seconds(&[]), None);
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
