//! What the limits collector needs from the rest of the daemon, as plain
//! data behind a small trait: the daemon (src/app) implements it over its
//! volumes and clusters, tests over fixtures. The collector does not know
//! how probes run or how PostgreSQL is scraped.

use std::path::PathBuf;
use std::time::Duration;

use crate::types::Resource;

/// A whole block device (IO limits apply to whole disks, not partitions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiskInput {
    /// Kernel name, as /proc/diskstats names it: `vda`, `nvme0n1`, `dm-2`.
    pub(crate) name: String,
    /// `MAJ:MIN`, as the cgroup files name it.
    pub(crate) majmin: String,
}

/// One watched volume.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VolumeInput {
    pub(crate) name: String,
    /// The volume's whole disk, or why it is unknown.
    pub(crate) disk: Result<DiskInput, Option<String>>,
    /// Provisioned limits from the config.
    pub(crate) provisioned: Vec<(Resource, u64)>,
    /// A configured cgroup path whose limits apply to the volume.
    pub(crate) cgroup: Option<String>,
    /// Whether the volume runs the commit probe, and on what schedule: a
    /// lone probe every `interval`, a burst of `burst_commits` every
    /// `busy_every` (zero: none).
    pub(crate) commit_probe: bool,
    pub(crate) interval: Duration,
    pub(crate) busy_every: Duration,
    pub(crate) burst_commits: u32,
    /// Commit probes done since start.
    pub(crate) commit_probes: u64,
    /// The plateaus of the latest queue-depth sweep, one per resource that
    /// showed one (`read_iops`, `write_iops`, `read_bytes_per_second`,
    /// `write_bytes_per_second`).
    pub(crate) detected: Vec<(Resource, f64)>,
    /// The device writes per second a write throttle let the commit
    /// probe's latest burst make, when the burst met one: whole throttle
    /// cycles' commits per second times the writes one costs. It counts
    /// the exporter's own writes, so the probes keep under 2 % of it too.
    pub(crate) throttled_write_iops: Option<f64>,
}

/// One watched PostgreSQL cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClusterInput {
    pub(crate) name: String,
    /// As the server reports it; `None` until the collector has read it.
    pub(crate) data_directory: Option<PathBuf>,
    /// (volume, role) of the volumes holding its directories.
    pub(crate) volumes: Vec<(String, String)>,
}

/// The daemon's side of the limits collector.
pub(crate) trait Inputs: Send + Sync {
    fn volumes(&self) -> Vec<VolumeInput>;
    fn clusters(&self) -> Vec<ClusterInput>;
    /// Stretches a volume's probe schedule by `factor` (1 = as configured)
    /// and returns the factor in force before; `factor` itself when the
    /// volume is gone.
    fn set_slowdown(&self, volume: &str, factor: f64) -> f64;
}
