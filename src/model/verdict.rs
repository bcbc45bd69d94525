//! Plain-language warnings for `check`, computed from a run's statistics.
//!
//! Each rule encodes a published or measured storage fact (see
//! docs/storage-facts.md); the thresholds are the ones a DBA can defend in a
//! review, not tuned to this machine.

use serde::Serialize;

use crate::types::{Op, SyncMethod};

/// A durable 8 KiB write needs at least one round trip to stable media; on
/// flash with power-loss protection that is ~20–100 µs, on anything networked
/// far more. Faster than this usually means a volatile write-back cache
/// acknowledged before the data was durable.
pub(crate) const SUSPICIOUS_SYNC_SECONDS: f64 = 50e-6;

/// p99.9 above this multiple of p50 is a heavy tail: some commits wait an
/// order of magnitude longer than typical ones.
pub(crate) const HEAVY_TAIL_RATIO: f64 = 10.0;

/// Filesystems living in memory: sync returns at once and proves nothing.
const MEMORY_FILESYSTEMS: &[&str] = &["tmpfs", "ramfs", "hugetlbfs", "devtmpfs"];

/// Latency summary of one op, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct OpStats {
    pub(crate) count: u64,
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) max: f64,
    pub(crate) mean: f64,
}

/// What a check run measured, as the rules need it.
#[derive(Debug, Clone)]
pub(crate) struct Observed<'a> {
    pub(crate) fstype: &'a str,
    pub(crate) sync_method: SyncMethod,
    pub(crate) write: Option<OpStats>,
    pub(crate) sync: Option<OpStats>,
    pub(crate) commit: Option<OpStats>,
    pub(crate) read: Option<OpStats>,
    pub(crate) reads_total: u64,
    pub(crate) cache_served_reads: u64,
}

/// One finding, with a stable code for JSON consumers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Warning {
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

/// What the filesystem type alone says about the figures measured on it:
/// memory, a container's overlay, FUSE. Shared by `check` and the daemon's
/// start-up warnings.
pub(crate) fn filesystem_warning(fstype: &str) -> Option<Warning> {
    if MEMORY_FILESYSTEMS.contains(&fstype) {
        Some(Warning {
            code: "memory_filesystem",
            message: format!(
                "{fstype} keeps files in memory: sync returns immediately and nothing is durable; \
                 these figures say nothing about a disk"
            ),
        })
    } else if fstype == "overlay" {
        Some(Warning {
            code: "overlay_filesystem",
            message: "overlay (a container's writable layer): syncs reach whatever filesystem \
                      backs the upper layer; put PostgreSQL data and this probe on a mounted volume"
                .to_string(),
        })
    } else if fstype.starts_with("fuse") {
        Some(Warning {
            code: "fuse_filesystem",
            message: format!(
                "{fstype}: what a sync guarantees depends on the FUSE daemon, not the kernel"
            ),
        })
    } else {
        None
    }
}

/// What a running volume's configuration alone says, before any figure:
/// its filesystem (as for `check`), and a volume that runs neither probe.
pub(crate) fn volume_warnings(fstype: &str, commit_probe: bool, read_probe: bool) -> Vec<Warning> {
    let mut out: Vec<Warning> = filesystem_warning(fstype).into_iter().collect();
    if !commit_probe && !read_probe {
        out.push(Warning {
            code: "no_probe",
            message: "neither the commit nor the read probe runs on this volume: it reports \
                      no latency"
                .to_string(),
        });
    }
    out
}

/// What a cluster's settings say about the figures the exporter can give:
/// `(code, message)` for `track_wal_io_timing` and `track_io_timing` off.
/// `settings` holds (name, value) pairs as pg_settings gives them; a
/// setting not read (no permission, older server) says nothing.
pub(crate) fn settings_warnings<'a>(
    settings: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
) -> Vec<Warning> {
    let off = |name: &str| {
        settings
            .clone()
            .into_iter()
            .any(|(n, v)| n == name && v == "off")
    };
    let mut out = Vec::new();
    if off("track_wal_io_timing") {
        out.push(Warning {
            code: "track_wal_io_timing_off",
            message: "track_wal_io_timing is off: WAL write and sync seconds are absent, so the \
                      WAL sync figures and the WAL sync saturation alert cannot work; turn it on \
                      (ALTER SYSTEM SET track_wal_io_timing = on; SELECT pg_reload_conf())"
                .to_string(),
        });
    }
    if off("track_io_timing") {
        out.push(Warning {
            code: "track_io_timing_off",
            message: "track_io_timing is off: read and write seconds of pg_stat_io are absent, so \
                      PostgreSQL's own IO latency cannot be set beside the probes; turn it on \
                      (ALTER SYSTEM SET track_io_timing = on; SELECT pg_reload_conf())"
                .to_string(),
        });
    }
    out
}

/// All findings for a run, most serious first.
pub(crate) fn warnings(o: &Observed<'_>) -> Vec<Warning> {
    let mut out = Vec::new();

    if let Some(w) = filesystem_warning(o.fstype) {
        out.push(w);
        if MEMORY_FILESYSTEMS.contains(&o.fstype) {
            // Nothing else said about latency or caches would be about storage.
            return out;
        }
    }

    // The durable step is the sync call, or the O_DSYNC write itself.
    let (durable_op, durable) = if o.sync_method.has_sync_call() {
        (Op::Sync, o.sync)
    } else {
        (Op::Commit, o.commit)
    };
    if let Some(s) = durable
        && s.count > 0
        && s.p50 < SUSPICIOUS_SYNC_SECONDS
        && !MEMORY_FILESYSTEMS.contains(&o.fstype)
    {
        out.push(Warning {
            code: "sync_too_fast",
            message: format!(
                "{} p50 is {}, under {}: faster than stable media can make 8 KiB durable. \
                 A volatile write-back cache (RAID controller or hypervisor without power-loss \
                 protection) may be acknowledging before the data is safe",
                durable_op,
                fmt_seconds(s.p50),
                fmt_seconds(SUSPICIOUS_SYNC_SECONDS)
            ),
        });
    }

    if o.cache_served_reads > 0 && o.reads_total > 0 {
        let pct = 100.0 * o.cache_served_reads as f64 / o.reads_total as f64;
        out.push(Warning {
            code: "cache_served_reads",
            message: format!(
                "{} of {} O_DIRECT reads ({pct:.1}%) returned faster than any device answers: \
                 a cache below this OS (hypervisor, controller, or the disk's own) served them. \
                 Cold page reads of a large database will be slower than these figures",
                o.cache_served_reads, o.reads_total
            ),
        });
    }

    for (op, stats) in [
        (Op::Sync, o.sync),
        (Op::Commit, o.commit),
        (Op::Read, o.read),
    ] {
        if let Some(s) = stats
            && s.count >= 1000
            && s.p50 > 0.0
            && s.p999 > HEAVY_TAIL_RATIO * s.p50
        {
            let consequence = if op == Op::Read {
                "a query reading pages one by one stalls on each such read"
            } else {
                "every backend waiting in group commit behind that sync waits with it"
            };
            out.push(Warning {
                code: "heavy_tail",
                message: format!(
                    "{op} has a heavy tail: p99.9 {} is {:.0}× the p50 {}; one in a thousand \
                     operations waits that long, and {consequence}",
                    fmt_seconds(s.p999),
                    s.p999 / s.p50,
                    fmt_seconds(s.p50)
                ),
            });
        }
    }
    out
}

/// How serious a run's findings are, least serious first: the order is
/// the one `--fail-on` compares with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Level {
    Ok,
    Warning,
    Critical,
}

impl Level {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warning => "warning",
            Level::Critical => "critical",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One finding that sets a verdict's level: where it came from (`probe`,
/// `sweep`, or the audit's scope `volume`, `host`, `cluster`), its stable
/// code and what it says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Reason {
    pub(crate) level: Level,
    pub(crate) source: &'static str,
    pub(crate) code: String,
    pub(crate) message: String,
}

/// A run's one verdict: the level of its most serious finding (`ok` when
/// there is none) and every finding at `warning` or above, most serious
/// first. Advice (an audit's `info`) is no reason: it never raises a level,
/// so an `ok` verdict lists nothing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Verdict {
    pub(crate) level: Level,
    pub(crate) reasons: Vec<Reason>,
}

/// The verdict of `findings`: those at `ok` are dropped, the rest sorted by
/// level, most serious first (in their order otherwise), and the level is
/// the highest of them.
pub(crate) fn judge(findings: impl IntoIterator<Item = Reason>) -> Verdict {
    let mut reasons: Vec<Reason> = findings
        .into_iter()
        .filter(|r| r.level > Level::Ok)
        .collect();
    // Stable: findings of one level keep the order they were given in.
    reasons.sort_by_key(|r| std::cmp::Reverse(r.level));
    let level = reasons.first().map_or(Level::Ok, |r| r.level);
    Verdict { level, reasons }
}

/// Seconds in the unit a human reads fastest: ns, µs, ms or s, 3 significant digits.
pub(crate) fn fmt_seconds(s: f64) -> String {
    if !s.is_finite() {
        return "-".to_string();
    }
    let (v, unit) = if s < 1e-6 {
        (s * 1e9, "ns")
    } else if s < 1e-3 {
        (s * 1e6, "µs")
    } else if s < 1.0 {
        (s * 1e3, "ms")
    } else {
        (s, "s")
    };
    if v >= 100.0 {
        format!("{v:.0} {unit}")
    } else if v >= 10.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.2} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(p50: f64, p999: f64, count: u64) -> OpStats {
        OpStats {
            count,
            p50,
            p90: p50,
            p99: p50,
            p999,
            max: p999,
            mean: p50,
        }
    }

    fn base<'a>() -> Observed<'a> {
        Observed {
            fstype: "ext4",
            sync_method: SyncMethod::Fdatasync,
            write: Some(stats(20e-6, 40e-6, 5000)),
            sync: Some(stats(150e-6, 400e-6, 5000)),
            commit: Some(stats(170e-6, 450e-6, 5000)),
            read: Some(stats(80e-6, 200e-6, 5000)),
            reads_total: 5000,
            cache_served_reads: 0,
        }
    }

    fn codes(o: &Observed<'_>) -> Vec<&'static str> {
        warnings(o).into_iter().map(|w| w.code).collect()
    }

    #[test]
    fn volume_and_settings_warnings_table() {
        let codes = |w: Vec<Warning>| w.into_iter().map(|w| w.code).collect::<Vec<_>>();
        for (fstype, commit, read, want) in [
            ("ext4", true, true, vec![]),
            ("tmpfs", true, true, vec!["memory_filesystem"]),
            ("overlay", true, false, vec!["overlay_filesystem"]),
            ("fuse.sshfs", false, true, vec!["fuse_filesystem"]),
            ("xfs", false, false, vec!["no_probe"]),
            ("ramfs", false, false, vec!["memory_filesystem", "no_probe"]),
        ] {
            assert_eq!(
                codes(volume_warnings(fstype, commit, read)),
                want,
                "{fstype} {commit} {read}"
            );
        }
        for (settings, want) in [
            (
                vec![("track_io_timing", "on"), ("track_wal_io_timing", "on")],
                vec![],
            ),
            (
                vec![("track_io_timing", "on"), ("track_wal_io_timing", "off")],
                vec!["track_wal_io_timing_off"],
            ),
            (
                vec![("track_io_timing", "off"), ("track_wal_io_timing", "off")],
                vec!["track_wal_io_timing_off", "track_io_timing_off"],
            ),
            // Not read (no permission): nothing said.
            (vec![("shared_buffers", "16384")], vec![]),
        ] {
            assert_eq!(
                codes(settings_warnings(settings.iter().copied())),
                want,
                "{settings:?}"
            );
        }
    }

    #[test]
    fn healthy_nvme_has_no_warnings() {
        assert!(codes(&base()).is_empty());
    }

    #[test]
    fn rules_table() {
        let mut fast_sync = base();
        fast_sync.sync = Some(stats(30e-6, 60e-6, 5000));

        let mut fast_odsync = base();
        fast_odsync.sync_method = SyncMethod::OpenDatasync;
        fast_odsync.sync = None;
        fast_odsync.commit = Some(stats(40e-6, 60e-6, 5000));

        let mut tmpfs = base();
        tmpfs.fstype = "tmpfs";
        tmpfs.sync = Some(stats(1e-6, 2e-3, 5000));
        tmpfs.cache_served_reads = 100;

        let mut overlay = base();
        overlay.fstype = "overlay";

        let mut cached = base();
        cached.cache_served_reads = 12;

        let mut tail = base();
        // Published NVMe figures: p99.9 306 µs vs ~98 µs is 3×, fine; 11× drift is not.
        tail.sync = Some(stats(900e-6, 10.3e-3, 5000));

        let mut tail_few = base();
        tail_few.sync = Some(stats(900e-6, 10.3e-3, 50));

        let cases: Vec<(&str, Observed<'_>, Vec<&str>)> = vec![
            ("fast sync", fast_sync, vec!["sync_too_fast"]),
            ("fast O_DSYNC write", fast_odsync, vec!["sync_too_fast"]),
            (
                "tmpfs: memory only, no second warning",
                tmpfs,
                vec!["memory_filesystem"],
            ),
            ("overlay", overlay, vec!["overlay_filesystem"]),
            ("cache-served reads", cached, vec!["cache_served_reads"]),
            ("heavy tail", tail, vec!["heavy_tail"]),
            ("too few samples to judge p99.9", tail_few, vec![]),
        ];
        for (name, o, want) in cases {
            assert_eq!(codes(&o), want, "{name}");
        }
    }

    #[test]
    fn verdict_is_the_most_serious_finding() {
        let r = |level, code: &str| Reason {
            level,
            source: "host",
            code: code.to_string(),
            message: String::new(),
        };
        let codes = |v: &Verdict| v.reasons.iter().map(|r| r.code.clone()).collect::<Vec<_>>();
        // (findings, level, reasons in order)
        let cases: Vec<(Vec<Reason>, Level, Vec<&str>)> = vec![
            (vec![], Level::Ok, vec![]),
            // Advice alone: ok, and nothing listed under it.
            (vec![r(Level::Ok, "atime")], Level::Ok, vec![]),
            // A stock host: a swept plateau and host settings.
            (
                vec![
                    r(Level::Ok, "atime"),
                    r(Level::Warning, "write_iops_plateau"),
                    r(Level::Warning, "dirty_ratio_large"),
                ],
                Level::Warning,
                vec!["write_iops_plateau", "dirty_ratio_large"],
            ),
            // A cluster with fsync = off: critical, and first.
            (
                vec![
                    r(Level::Warning, "heavy_tail"),
                    r(Level::Critical, "fsync_off"),
                    r(Level::Warning, "swappiness_high"),
                ],
                Level::Critical,
                vec!["fsync_off", "heavy_tail", "swappiness_high"],
            ),
        ];
        for (findings, level, want) in cases {
            let v = judge(findings);
            assert_eq!(v.level, level, "{v:?}");
            assert_eq!(codes(&v), want);
        }
        assert!(Level::Ok < Level::Warning && Level::Warning < Level::Critical);
        assert_eq!(
            serde_json::to_string(&Level::Critical).unwrap_or_default(),
            "\"critical\""
        );
    }

    #[test]
    fn formats_seconds() {
        assert_eq!(fmt_seconds(668e-9), "668 ns");
        assert_eq!(fmt_seconds(79e-6), "79.0 µs");
        assert_eq!(fmt_seconds(1.106e-3), "1.11 ms");
        assert_eq!(fmt_seconds(73.4e-3), "73.4 ms");
        assert_eq!(fmt_seconds(12.0), "12.0 s");
    }
}
