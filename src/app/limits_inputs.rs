//! The daemon's side of the IO limits collector: its volumes and clusters
//! as the plain data [`crate::limits::Inputs`] asks for, and the probe
//! schedule stretch it sets.

use std::sync::Arc;
use std::time::Instant;

use crate::limits::{ClusterInput, DiskInput, Inputs, VolumeInput};
use crate::postgres::ClusterSet;
use crate::probe::set::VolumeSet;
use crate::probe::settings::BURST_COMMITS;

#[derive(Debug)]
pub(crate) struct LimitsInputs {
    pub(crate) volumes: Arc<VolumeSet>,
    pub(crate) clusters: Arc<ClusterSet>,
}

impl Inputs for LimitsInputs {
    fn volumes(&self) -> Vec<VolumeInput> {
        // One snapshot per volume per pass: the commit probe counts the
        // collector sums per disk come from the same instant.
        let now = Instant::now();
        self.volumes
            .list()
            .into_iter()
            .map(|v| {
                let snap = v.snapshot(now, &[]);
                let limits = v.limits();
                let disk = match snap.fs.disk {
                    Some(d) => Ok(DiskInput {
                        name: d.name,
                        majmin: d.majmin,
                    }),
                    None => Err(snap.fs.disk_reason),
                };
                VolumeInput {
                    name: v.name.clone(),
                    disk,
                    provisioned: limits.provisioned,
                    cgroup: limits.cgroup,
                    commit_probe: v.commit_probe,
                    interval: v.interval,
                    busy_every: v.busy_every,
                    burst_commits: BURST_COMMITS,
                    commit_probes: snap.commit_probes,
                    detected: v
                        .sweep()
                        .map(|s| {
                            s.tables
                                .iter()
                                .filter_map(|t| t.detected.map(|d| (t.resource, d)))
                                .collect()
                        })
                        .unwrap_or_default(),
                    throttled_write_iops: v
                        .throttled_commit_rate()
                        .map(|r| r * crate::model::pacing::DEFAULT_WRITES_PER_COMMIT),
                }
            })
            .collect()
    }

    fn clusters(&self) -> Vec<ClusterInput> {
        self.clusters
            .snapshots()
            .into_iter()
            .map(|c| ClusterInput {
                data_directory: c
                    .setting("data_directory")
                    .map(|s| std::path::PathBuf::from(&s.value)),
                name: c.name,
                volumes: c.volumes,
            })
            .collect()
    }

    fn set_slowdown(&self, volume: &str, factor: f64) -> f64 {
        self.volumes
            .list()
            .into_iter()
            .find(|v| v.name == volume)
            .map_or(factor, |v| v.set_slowdown(factor))
    }
}
