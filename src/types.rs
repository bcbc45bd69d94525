//! Small domain types shared by config, probes, model and metrics.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a probe measured. Label values of `op` on the probe metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Op {
    /// The 8 KiB WAL-like write alone (lands in the page cache unless the
    /// sync method makes it durable by itself).
    Write,
    /// The sync call after the write (fdatasync or fsync); absent for
    /// `open_datasync` / `open_sync`, whose write is already durable.
    Sync,
    /// Write and sync together: what one commit waits for.
    Commit,
    /// One 8 KiB `O_DIRECT` random read at queue depth 1.
    Read,
}

impl Op {
    pub(crate) const ALL: [Op; 4] = [Op::Write, Op::Sync, Op::Commit, Op::Read];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Sync => "sync",
            Op::Commit => "commit",
            Op::Read => "read",
        }
    }

    /// Index into per-op arrays.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a probe ran: the label `phase` of the probe latency families.
///
/// On virtual machines, and on devices with power states, the first IO
/// after a pause is several times slower than the same IO in a stream:
/// the device and the host's IO path go idle between probes and must wake.
/// A loaded PostgreSQL commits in a stream; a quiet one commits alone. The
/// two are different facts about the same storage, so they are measured and
/// published apart, never mixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Phase {
    /// Inside a burst of back-to-back probes, after the warm-up half of the
    /// burst: what an IO costs when the storage path is busy (comparable to
    /// fio or `pg_test_fsync` without think time).
    Busy,
    /// A lone probe, one per interval: what an IO costs after a pause.
    AfterIdle,
}

impl Phase {
    pub(crate) const ALL: [Phase; 2] = [Phase::Busy, Phase::AfterIdle];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Busy => "busy",
            Phase::AfterIdle => "after_idle",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Number of (op, phase) series a volume keeps.
pub(crate) const SERIES: usize = Op::ALL.len() * Phase::ALL.len();

/// Index of an (op, phase) pair into per-series arrays.
pub(crate) fn series(op: Op, phase: Phase) -> usize {
    op.index() * Phase::ALL.len() + phase.index()
}

/// How the WAL probe makes its write durable: PostgreSQL's `wal_sync_method`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncMethod {
    /// write, then fdatasync(2): PostgreSQL's default on Linux. Skips the
    /// inode flush when only data changed, which is the case for a WAL
    /// segment that was preallocated at its full size.
    #[default]
    Fdatasync,
    /// write, then fsync(2): also flushes inode metadata (mtime), which can
    /// cost an extra journal commit per sync on ext4/XFS.
    Fsync,
    /// The file is opened `O_DSYNC`; each write returns once durable.
    OpenDatasync,
    /// The file is opened `O_SYNC`; each write returns once data and
    /// metadata are durable.
    OpenSync,
}

impl SyncMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncMethod::Fdatasync => "fdatasync",
            SyncMethod::Fsync => "fsync",
            SyncMethod::OpenDatasync => "open_datasync",
            SyncMethod::OpenSync => "open_sync",
        }
    }

    /// True when durability comes from a separate sync call after the write.
    pub(crate) fn has_sync_call(self) -> bool {
        matches!(self, SyncMethod::Fdatasync | SyncMethod::Fsync)
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "fdatasync" => Some(SyncMethod::Fdatasync),
            "fsync" => Some(SyncMethod::Fsync),
            "open_datasync" => Some(SyncMethod::OpenDatasync),
            "open_sync" => Some(SyncMethod::OpenSync),
            _ => None,
        }
    }
}

impl fmt::Display for SyncMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Engine requested in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineChoice {
    /// io_uring when the kernel and the seccomp profile allow it, else syscalls.
    #[default]
    Auto,
    /// io_uring or fail at start.
    IoUring,
    /// Plain pwrite/fdatasync/pread syscalls.
    Sync,
}

impl EngineChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineChoice::Auto => "auto",
            EngineChoice::IoUring => "io_uring",
            EngineChoice::Sync => "sync",
        }
    }
}

/// Engine actually in use (the `engine` label of `pgstorage_volume_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EngineKind {
    IoUring,
    Sync,
}

impl EngineKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EngineKind::IoUring => "io_uring",
            EngineKind::Sync => "sync",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which probes run on a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ProbeKind {
    /// 8 KiB write + sync into a preallocated WAL-like file.
    Commit,
    /// 8 KiB `O_DIRECT` random reads of a preallocated file.
    Read,
}

/// What an IO cap limits: the `resource` label of the IO limit families.
/// cgroups cap reads and writes apart (`io.max` riops/wiops/rbps/wbps, the
/// v1 `blkio.throttle.*_device` files); a cloud volume's provisioned IOPS
/// and throughput often cap both together, hence [`Resource::Iops`] and
/// [`Resource::BytesPerSecond`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Resource {
    ReadIops,
    WriteIops,
    ReadBytesPerSecond,
    WriteBytesPerSecond,
    /// Reads and writes together.
    Iops,
    /// Bytes read and written together.
    BytesPerSecond,
}

impl Resource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Resource::ReadIops => "read_iops",
            Resource::WriteIops => "write_iops",
            Resource::ReadBytesPerSecond => "read_bytes_per_second",
            Resource::WriteBytesPerSecond => "write_bytes_per_second",
            Resource::Iops => "iops",
            Resource::BytesPerSecond => "bytes_per_second",
        }
    }

    /// Caps that count writes, the probes' own among them.
    pub(crate) fn counts_writes(self) -> bool {
        matches!(self, Resource::WriteIops | Resource::Iops)
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the operator can switch on or off with `--collector.NAME` /
/// `--no-collector.NAME`, in the style of node_exporter and
/// postgres_exporter. The defaults keep one PostgreSQL cluster with two
/// probed volumes under 500 series (docs/metrics.md counts them per
/// collector): every figure the shipped dashboards and alerts use is on,
/// detail that multiplies series is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Collector {
    /// The probe threads: without them no volume is probed (configured,
    /// default or discovered) and the exporter only watches PostgreSQL.
    Probes,
    /// `op="write"` and `op="sync"`: a commit probe split into its write
    /// and its sync, in the latency histogram and the window summary.
    /// Off by default: `op="commit"` is the durable step under every
    /// sync method, and the split doubles the probe series of a WAL volume.
    ProbesSplit,
    /// PostgreSQL's statistics views (WAL, checkpoints, commits, IO, wait
    /// events). Off: the connection still serves `pgstorage_pg_up`,
    /// `pgstorage_pg_info`, the settings and volume discovery.
    Postgres,
    /// pg_stat_io (PostgreSQL 16+): IO by backend type, object and context.
    PostgresIo,
    /// pg_stat_io rows whose every counter is zero (backend types that
    /// never ran: walsender on a primary without replicas, slotsync
    /// workers, ...). Off by default: three quarters of the view on a
    /// typical server, and a row appears as soon as one of its counters moves.
    PostgresIoZeroRows,
    /// pg_stat_io's buffer-pool columns: hits, evictions and reuses. Off by
    /// default: they describe shared buffers, not storage, and a third of
    /// the view's series.
    PostgresIoBuffers,
    /// Wait-event sampling (`pgstorage_pg_wait_event_seconds_total`): one
    /// query per `wait_sampling_interval` on a connection of its own.
    PostgresWaits,
    /// PostgreSQL's own WAL and data-file syncs timed in the kernel (eBPF),
    /// as histograms per cluster. On by default; off with a reason where the
    /// exporter cannot load BPF programs.
    PostgresSyncs,
    /// IO limits: cgroup throttles, provisioned figures and their use from
    /// the device counters (a volume's `sweep` is configured per volume and
    /// runs on its probe thread).
    Limits,
    /// AWS EBS statistics from the NVMe log page of the volumes' EBS
    /// controllers, read on the limits schedule (needs CAP_SYS_ADMIN).
    LimitsEbs,
}

/// Name, default and one-line description of each [`Collector`].
pub(crate) const COLLECTORS: [(Collector, &str, bool, &str); 10] = [
    (
        Collector::Probes,
        "probes",
        true,
        "commit and read probes on every configured, default or discovered volume",
    ),
    (
        Collector::ProbesSplit,
        "probes.split",
        false,
        "op=\"write\" and op=\"sync\" series: each commit probe split into its write and its sync",
    ),
    (
        Collector::Postgres,
        "postgres",
        true,
        "PostgreSQL statistics views: WAL, checkpoints, commits (and, below, IO and wait events)",
    ),
    (
        Collector::PostgresIo,
        "postgres.io",
        true,
        "pg_stat_io (PostgreSQL 16+) by backend type, object and context",
    ),
    (
        Collector::PostgresIoZeroRows,
        "postgres.io.zero-rows",
        false,
        "pg_stat_io rows whose every counter is still zero",
    ),
    (
        Collector::PostgresIoBuffers,
        "postgres.io.buffers",
        false,
        "pg_stat_io's buffer-pool counters (op=\"hit\", \"eviction\", \"reuse\")",
    ),
    (
        Collector::PostgresWaits,
        "postgres.waits",
        true,
        "wait-event sampling (pgstorage_pg_wait_event_seconds_total)",
    ),
    (
        Collector::PostgresSyncs,
        "postgres.syncs",
        true,
        "the server's own WAL and data-file syncs timed in the kernel (eBPF; root or CAP_BPF+CAP_PERFMON)",
    ),
    (
        Collector::Limits,
        "limits",
        true,
        "IO limits: cgroup throttles, provisioned figures and their use from device counters",
    ),
    (
        Collector::LimitsEbs,
        "limits.ebs",
        true,
        "AWS EBS statistics (time over the volume's and instance's caps) from the NVMe log page",
    ),
];

/// Which collectors are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Collectors {
    on: [bool; COLLECTORS.len()],
}

impl Default for Collectors {
    fn default() -> Self {
        let mut on = [false; COLLECTORS.len()];
        for (i, (_, _, default, _)) in COLLECTORS.iter().enumerate() {
            on[i] = *default;
        }
        Collectors { on }
    }
}

impl Collectors {
    fn index(c: Collector) -> usize {
        // COLLECTORS lists every variant once, in declaration order (unit
        // test below).
        c as usize
    }

    /// Whether `c` is on. A sub-collector is on only with its parent:
    /// `postgres.io` needs `postgres`, `probes.split` needs `probes`.
    pub(crate) fn on(&self, c: Collector) -> bool {
        let parent = match c {
            Collector::ProbesSplit => Some(Collector::Probes),
            Collector::PostgresIo | Collector::PostgresWaits | Collector::PostgresSyncs => {
                Some(Collector::Postgres)
            }
            Collector::LimitsEbs => Some(Collector::Limits),
            Collector::PostgresIoZeroRows | Collector::PostgresIoBuffers => {
                Some(Collector::PostgresIo)
            }
            _ => None,
        };
        self.on[Self::index(c)] && parent.is_none_or(|p| self.on(p))
    }

    pub(crate) fn set(&mut self, c: Collector, on: bool) {
        self.on[Self::index(c)] = on;
    }

    /// The collectors whose state differs from the default, as
    /// `--collector.NAME` / `--no-collector.NAME`, for the start log line.
    pub(crate) fn changed(&self) -> Vec<String> {
        COLLECTORS
            .iter()
            .enumerate()
            .filter(|(i, (_, _, default, _))| self.on[*i] != *default)
            .map(|(i, (_, name, _, _))| {
                if self.on[i] {
                    format!("--collector.{name}")
                } else {
                    format!("--no-collector.{name}")
                }
            })
            .collect()
    }
}

/// A path for a message, with control characters (a NUL byte, a newline,
/// an escape sequence) escaped as Rust writes them (`\0`, `\n`,
/// `\u{1b}`): `Path::display` would hand them raw to a terminal or a log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shown<'a>(pub(crate) &'a std::path::Path);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        for c in self.0.to_string_lossy().chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_debug())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_paths_escape_control_characters() {
        use std::path::Path;
        for (p, want) in [
            ("/var/lib/pg 16/wal", "/var/lib/pg 16/wal"),
            ("/srv/a\0b", "/srv/a\\0b"),
            ("/srv/a\nb\x1b[31m", "/srv/a\\nb\\u{1b}[31m"),
            ("/srv/é", "/srv/é"),
        ] {
            assert_eq!(Shown(Path::new(p)).to_string(), want);
        }
    }

    #[test]
    fn collector_table_is_in_declaration_order() {
        for (i, (c, _, _, _)) in COLLECTORS.iter().enumerate() {
            assert_eq!(*c as usize, i, "{c:?}");
        }
    }

    #[test]
    fn sub_collectors_follow_their_parent() {
        let mut c = Collectors::default();
        assert!(c.on(Collector::PostgresIo) && !c.on(Collector::ProbesSplit));
        assert!(!c.on(Collector::PostgresIoZeroRows));
        c.set(Collector::Postgres, false);
        assert!(!c.on(Collector::PostgresIo) && !c.on(Collector::PostgresWaits));
        c.set(Collector::ProbesSplit, true);
        assert!(c.on(Collector::ProbesSplit));
        c.set(Collector::Probes, false);
        assert!(!c.on(Collector::ProbesSplit));
        assert_eq!(
            c.changed(),
            [
                "--no-collector.probes",
                "--collector.probes.split",
                "--no-collector.postgres"
            ]
        );
    }
}
