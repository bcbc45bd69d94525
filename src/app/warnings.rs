//! One `warn` line per condition `check` would flag, at start and after a
//! reload: a volume on a memory, overlay or FUSE filesystem, a volume that
//! runs neither probe, a cluster whose volumes are not probed at all. The
//! cluster settings (`track_wal_io_timing`, `track_io_timing`) are known
//! only once connected: the collector logs them after its first scrape
//! ([`crate::postgres::warn_settings`]), and a reload logs them again here.

use crate::config::Config;
use crate::postgres::ClusterSet;
use crate::probe::set::VolumeSet;
use crate::probe::state::VolumeState;

/// The warnings of one running volume.
pub(crate) fn volume(v: &VolumeState) {
    let fstype = v.fstype();
    for w in crate::model::verdict::volume_warnings(&fstype, v.commit_probe, v.read_probe) {
        tracing::warn!(
            volume = %v.name,
            path = %v.path.display(),
            fstype = %fstype,
            code = w.code,
            "{}",
            w.message
        );
    }
}

/// Clusters that get no probed volume because discovery is off and no
/// volume is configured.
pub(crate) fn undiscovered_clusters(cfg: &Config) {
    // --no-collector.probes says "probe nothing" on purpose: the start
    // line lists it, no warning.
    if !cfg.volumes.is_empty() || !cfg.collectors.on(crate::types::Collector::Probes) {
        return;
    }
    for c in cfg
        .clusters
        .iter()
        .filter(|c| !c.collector.discover_volumes)
    {
        tracing::warn!(
            cluster = %c.collector.name,
            code = "no_probed_volume",
            "volume discovery is off for this cluster and no volume is configured: nothing is \
             probed, so its storage latency and commit ceiling are absent; drop \
             --no-pg.discover-volumes (discover_volumes = false), or add --probe.path or a \
             [[volume]]"
        );
    }
}

/// Everything that applies now: every running volume, the clusters without
/// one, and the settings of the connected clusters (`settings_of`: the
/// clusters whose collector runs on and will not log them itself).
pub(crate) fn all(
    cfg: &Config,
    volumes: &VolumeSet,
    clusters: &ClusterSet,
    settings_of: &[String],
) {
    for v in volumes.list() {
        volume(&v);
    }
    undiscovered_clusters(cfg);
    for snap in clusters.snapshots() {
        if let (true, Some(stats)) = (settings_of.contains(&snap.name), &snap.stats) {
            crate::postgres::warn_settings(&snap.name, &stats.settings);
        }
    }
}
