//! [`ScrapeSnapshot`]: one scrape's state, taken once, from which every
//! family of the scrape (and the status page) is computed.

use std::sync::Arc;

use crate::audit::{AuditSnapshot, AuditState};
use crate::limits::{LimitsSnapshot, LimitsState};
use crate::postgres::{ClusterSet, ClusterSnapshot};
use crate::probe::set::VolumeSet;
use crate::probe::state::{Snapshot, VolumeState};

/// One scrape's state, taken once.
#[derive(Debug)]
pub(crate) struct ScrapeSnapshot {
    pub(crate) volumes: Vec<(Arc<VolumeState>, Snapshot)>,
    pub(crate) clusters: Vec<ClusterSnapshot>,
    pub(crate) limits: LimitsSnapshot,
    pub(crate) audit: AuditSnapshot,
    pub(crate) syncs: crate::ebpf::SyncSnapshot,
}

impl ScrapeSnapshot {
    pub(crate) fn take(
        volumes: &VolumeSet,
        clusters: &ClusterSet,
        limits: &LimitsState,
        audit: &AuditState,
        syncs: &crate::ebpf::SyncState,
    ) -> ScrapeSnapshot {
        let now = std::time::Instant::now();
        let volumes: Vec<_> = volumes
            .list()
            .into_iter()
            .map(|v| {
                let s = v.snapshot(now, &crate::model::WINDOW_QUANTILES);
                (v, s)
            })
            .collect();
        let clusters = clusters.snapshots();
        let mut limits = limits.snapshot();
        limits.retain_current(
            &volumes
                .iter()
                .map(|(v, _)| v.name.as_str())
                .collect::<Vec<_>>(),
            &clusters.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        );
        let mut audit = audit.snapshot();
        // Like the limits: a volume or cluster removed by a reload loses
        // its findings at once, not at the next audit pass.
        // The report is shared with the audit state: it is copied only when
        // something has to go (right after a reload), not on every scrape.
        if let Some(r) = audit.last.as_mut() {
            let volume_gone = |(n, _): &(String, _)| !volumes.iter().any(|(v, _)| &v.name == n);
            let cluster_gone = |(n, _): &(String, _)| !clusters.iter().any(|c| &c.name == n);
            if r.volumes.iter().any(volume_gone) || r.clusters.iter().any(cluster_gone) {
                let r = Arc::make_mut(r);
                r.volumes.retain(|e| !volume_gone(e));
                r.clusters.retain(|e| !cluster_gone(e));
            }
        }
        // The tracing thread learns of a reload's clusters within a second;
        // a removed cluster leaves the scrape at once, as with the limits.
        let mut syncs = syncs.snapshot();
        syncs
            .clusters
            .retain(|name, _| clusters.iter().any(|c| &c.name == name));
        ScrapeSnapshot {
            volumes,
            clusters,
            limits,
            audit,
            syncs,
        }
    }
}
