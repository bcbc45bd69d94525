//! The daemon's side of the storage-configuration audit: every
//! `audit_interval` (and at once after a start or reload) it gathers the
//! host and volume facts on a blocking thread, builds each cluster's facts
//! from what its collector last read, evaluates and stores the report.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::audit::{self, AuditState, ClusterFacts, PgSetting, Report, VolumeFacts};
use crate::config::AuditSettings;
use crate::model::verdict::SUSPICIOUS_SYNC_SECONDS;
use crate::postgres::{ClusterSet, ClusterSnapshot};
use crate::probe::set::VolumeSet;
use crate::types::{Op, Phase, series};

/// What one pass needs; cheap to clone into the blocking thread.
#[derive(Debug, Clone)]
pub struct AuditInputs {
    pub settings: AuditSettings,
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
    pub volumes: Arc<VolumeSet>,
    pub clusters: Arc<ClusterSet>,
}

pub async fn run(inputs: AuditInputs, state: Arc<AuditState>) {
    let mut tick = tokio::time::interval(inputs.settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let i = inputs.clone();
        // Reading /sys and stat()ing a volume can hang on a dead network
        // filesystem: never on an async worker.
        match tokio::task::spawn_blocking(move || pass(&i)).await {
            Ok(report) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                if !report.read_errors.is_empty() {
                    tracing::warn!(errors = ?report.read_errors, "audit: some files could not be read");
                }
                state.record(report, now);
            }
            Err(e) => tracing::error!(error = %e, "audit pass failed"),
        }
    }
}

/// The probe's evidence of a sync faster than stable media: the median of
/// the durable step (the sync call, or the commit for O_DSYNC methods).
fn sync_too_fast(v: &crate::probe::state::VolumeState) -> Option<bool> {
    let snap = v.snapshot(Instant::now(), &[0.5]);
    let p50 = |op| {
        snap.quantiles[series(op, Phase::AfterIdle)]
            .as_ref()
            .and_then(|q| q.first().copied())
    };
    let durable = if v.sync_method.has_sync_call() {
        p50(Op::Sync).or_else(|| p50(Op::Commit))
    } else {
        p50(Op::Commit)
    };
    durable.map(|s| s < SUSPICIOUS_SYNC_SECONDS)
}

/// One pass: blocking reads, then pure evaluation.
pub fn pass(i: &AuditInputs) -> Report {
    let (host_facts, mut errors) = audit::read::host(&i.proc_root, &i.sys_root);
    let mut host = audit::evaluate_host(&host_facts);
    host.ignore(&i.settings.ignore);
    let mut volume_facts: Vec<(String, VolumeFacts)> = Vec::new();
    let mut volumes = Vec::new();
    for v in i.volumes.list() {
        let disk = v.snapshot(Instant::now(), &[]).fs.disk.map(|d| d.name);
        let (facts, e) = audit::read::volume(
            &i.proc_root,
            &i.sys_root,
            &v.path,
            disk.as_deref(),
            sync_too_fast(&v),
        );
        errors.0.extend(e.0);
        let mut o = audit::evaluate_volume(&facts);
        o.ignore(&i.settings.for_volume(&v.name));
        volumes.push((v.name.clone(), o));
        volume_facts.push((v.name.clone(), facts));
    }
    let mut clusters = Vec::new();
    for c in i.clusters.snapshots() {
        // Not connected yet, or lost: nothing read, nothing checked.
        let Some(facts) = cluster_facts(&c, &volume_facts, host_facts.hugepages_total) else {
            continue;
        };
        let mut o = audit::evaluate_cluster(&facts);
        o.ignore(&i.settings.for_cluster(&c.name));
        clusters.push((c.name.clone(), o));
    }
    Report {
        host,
        volumes,
        clusters,
        read_errors: errors.0,
    }
}

pub fn cluster_facts(
    c: &ClusterSnapshot,
    volumes: &[(String, VolumeFacts)],
    hugepages_total: Option<u64>,
) -> Option<ClusterFacts> {
    let stats = c.stats.as_ref()?;
    let role = |r: &str| {
        c.volumes
            .iter()
            .find(|(_, role)| role == r)
            .map(|(v, _)| v.clone())
    };
    // Discovery gives each filesystem one volume, so the same volume for
    // both roles means the same filesystem.
    let data_fs = role("data");
    let data_nonrotational = data_fs.as_ref().and_then(|d| {
        let f = &volumes.iter().find(|(n, _)| n == d)?.1;
        f.rotational.map(|r| !r)
    });
    Some(ClusterFacts {
        settings: stats
            .settings
            .iter()
            .map(|s| PgSetting {
                name: s.name.clone(),
                setting: s.value.clone(),
                numeric: s.numeric,
                source: s.source.clone(),
                pending_restart: s.pending_restart,
            })
            .collect(),
        checkpoints_timed: stats.checkpoints.as_ref().and_then(|p| p.timed),
        checkpoints_requested: stats.checkpoints.as_ref().and_then(|p| p.requested),
        wal_fs: role("wal"),
        data_fs,
        data_nonrotational,
        hugepages_total,
    })
}
