//! Small domain types shared by config, probes, model and metrics.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a probe measured. Label values of `op` on the probe metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
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
    pub const ALL: [Op; 4] = [Op::Write, Op::Sync, Op::Commit, Op::Read];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Sync => "sync",
            Op::Commit => "commit",
            Op::Read => "read",
        }
    }

    /// Index into per-op arrays.
    pub fn index(self) -> usize {
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
pub enum Phase {
    /// Inside a burst of back-to-back probes, after the warm-up half of the
    /// burst: what an IO costs when the storage path is busy (comparable to
    /// fio or `pg_test_fsync` without think time).
    Busy,
    /// A lone probe, one per interval: what an IO costs after a pause.
    AfterIdle,
}

impl Phase {
    pub const ALL: [Phase; 2] = [Phase::Busy, Phase::AfterIdle];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Busy => "busy",
            Phase::AfterIdle => "after_idle",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Number of (op, phase) series a volume keeps.
pub const SERIES: usize = Op::ALL.len() * Phase::ALL.len();

/// Index of an (op, phase) pair into per-series arrays.
pub fn series(op: Op, phase: Phase) -> usize {
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
    pub fn has_sync_call(self) -> bool {
        matches!(self, SyncMethod::Fdatasync | SyncMethod::Fsync)
    }

    pub fn parse(s: &str) -> Option<Self> {
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

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(EngineChoice::Auto),
            "io_uring" => Some(EngineChoice::IoUring),
            "sync" => Some(EngineChoice::Sync),
            _ => None,
        }
    }
}

/// Engine actually in use (the `engine` label of `pgstorage_volume_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    IoUring,
    Sync,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
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
pub enum ProbeKind {
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
pub enum Resource {
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
    pub fn as_str(self) -> &'static str {
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
    pub fn counts_writes(self) -> bool {
        matches!(self, Resource::WriteIops | Resource::Iops)
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
