//! The daemon's side of the storage-configuration audit: every
//! `audit_interval` (and at once after a start or reload) it gathers the
//! host and volume facts on a blocking thread, builds each cluster's facts
//! from what its collector last read, evaluates and stores the report.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::audit::{self, AuditState, ClusterFacts, PgSetting, RateSpan, Report, VolumeFacts};
use crate::config::AuditSettings;
use crate::model::verdict::SUSPICIOUS_SYNC_SECONDS;
use crate::postgres::snapshot::WalWindowRate;
use crate::postgres::views::rows::{Checkpoints, Setting, WalStats};
use crate::postgres::{ClusterSet, ClusterSnapshot};
use crate::probe::set::VolumeSet;
use crate::types::{Op, Phase, series};

/// What one pass needs; cheap to clone into the blocking thread.
#[derive(Debug, Clone)]
pub(crate) struct AuditInputs {
    pub(crate) settings: AuditSettings,
    pub(crate) proc_root: PathBuf,
    pub(crate) sys_root: PathBuf,
    pub(crate) volumes: Arc<VolumeSet>,
    pub(crate) clusters: Arc<ClusterSet>,
}

/// How soon to look again while a cluster has not been read yet, and once
/// after it has (its discovered volumes arrive just after): otherwise a
/// cluster's findings would wait a whole `audit_interval` after a start.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) async fn run(inputs: AuditInputs, state: Arc<AuditState>) {
    let interval = inputs.settings.interval;
    let mut settle_once_more = true;
    loop {
        let i = inputs.clone();
        // Reading /sys and stat()ing a volume can hang on a dead network
        // filesystem: never on an async worker.
        let mut wait = interval;
        match tokio::task::spawn_blocking(move || {
            let watched = i.clusters.snapshots().len();
            let report = pass(&i);
            let unread = watched.saturating_sub(report.clusters.len());
            (report, unread)
        })
        .await
        {
            Ok((report, unread)) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                if !report.read_errors.is_empty() {
                    tracing::warn!(errors = ?report.read_errors, "audit: some files could not be read");
                }
                state.record(report, now);
                // A cluster that stays down keeps this at SETTLE: a few
                // dozen small file reads every 10 s, nothing on the server.
                if unread > 0 {
                    wait = SETTLE.min(interval);
                    settle_once_more = true;
                } else if settle_once_more {
                    wait = SETTLE.min(interval);
                    settle_once_more = false;
                }
            }
            Err(e) => tracing::error!(error = %e, "audit pass failed"),
        }
        tokio::time::sleep(wait).await;
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
pub(crate) fn pass(i: &AuditInputs) -> Report {
    let (host_facts, mut errors) =
        audit::read::host_at(&i.proc_root, &i.sys_root, &i.settings.host_root);
    let mut host = audit::evaluate_host(&host_facts);
    host.ignore(&i.settings.ignore);
    let snapshots = i.clusters.snapshots();
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
        // The clusters whose data directory, WAL or tablespaces are on it.
        let of: Vec<&str> = snapshots
            .iter()
            .filter(|c| c.volumes.iter().any(|(name, _)| *name == v.name))
            .map(|c| c.name.as_str())
            .collect();
        o.ignore(&i.settings.for_volume(&v.name, &of));
        volumes.push((v.name.clone(), o));
        volume_facts.push((v.name.clone(), facts));
    }
    let mut clusters = Vec::new();
    for c in &snapshots {
        // Not connected yet, or lost: nothing read, nothing checked.
        let Some(facts) = snapshot_facts(c, &volume_facts, host_facts.hugepages_total) else {
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

/// Where a cluster's directories are, as far as this process can tell.
#[derive(Debug, Default)]
struct Placement {
    /// Filesystem ids of the data directory and of pg_wal.
    data_fs: Option<String>,
    wal_fs: Option<String>,
    data_nonrotational: Option<bool>,
    /// The size of the filesystem holding pg_wal.
    wal_fs_bytes: Option<u64>,
}

/// What was read of the cluster's WAL: pg_stat_wal's latest row, the rate
/// over the collector's window, and the databases' size, which bounds the
/// full-page images of a checkpoint cycle.
#[derive(Debug, Clone, Copy)]
struct Wal<'a> {
    stats: Option<&'a WalStats>,
    window: Option<WalWindowRate>,
    database_bytes: Option<f64>,
}

/// The rates the audit sizes max_wal_size from: over the window, and the
/// mean since pg_stat_wal's reset (a minute at least: a reset just now
/// says nothing yet).
fn wal_rates(w: Wal<'_>) -> Vec<audit::WalRate> {
    let window = w.window.map(|r| audit::WalRate {
        bytes_per_second: r.bytes_per_second,
        fpi_per_second: r.fpi_per_second,
        seconds: r.seconds,
        span: RateSpan::Window,
    });
    let since_reset = w.stats.and_then(|s| {
        let (bytes, seconds) = (s.bytes?, s.seconds_since_reset?);
        (seconds >= 60.0 && bytes >= 0.0).then(|| audit::WalRate {
            bytes_per_second: bytes / seconds,
            fpi_per_second: s.fpi.filter(|f| *f >= 0.0).map(|f| f / seconds),
            seconds,
            span: RateSpan::SinceReset,
        })
    });
    window.into_iter().chain(since_reset).collect()
}

/// The cluster's facts from what its session read, wherever it was read
/// (the daemon's collector or `check --pg.dsn`'s one session).
fn cluster_facts(
    settings: &[Setting],
    checkpoints: Option<&Checkpoints>,
    wal: Wal<'_>,
    at: Placement,
    hugepages_total: Option<u64>,
) -> ClusterFacts {
    ClusterFacts {
        settings: settings
            .iter()
            .map(|s| PgSetting {
                name: s.name.clone(),
                setting: s.value.clone(),
                numeric: s.numeric,
                source: s.source.clone(),
                pending_restart: s.pending_restart,
            })
            .collect(),
        checkpoints_timed: checkpoints.and_then(|p| p.timed),
        checkpoints_requested: checkpoints.and_then(|p| p.requested),
        data_fs: at.data_fs,
        wal_fs: at.wal_fs,
        data_nonrotational: at.data_nonrotational,
        hugepages_total,
        wal_rates: wal_rates(wal),
        database_bytes: wal.database_bytes,
        wal_fs_bytes: at.wal_fs_bytes,
    }
}

/// The daemon's cluster facts: the collector's latest read, placed by
/// discovery's volumes; `None` while the collector has read nothing.
fn snapshot_facts(
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
    let wal_fs = role("wal");
    let wal_fs_bytes = wal_fs.as_ref().and_then(|w| {
        let f = &volumes.iter().find(|(n, _)| n == w)?.1;
        f.size_bytes
    });
    let at = Placement {
        wal_fs,
        data_fs,
        data_nonrotational,
        wal_fs_bytes,
    };
    let wal = Wal {
        stats: stats.wal.as_ref(),
        window: c.wal_rate,
        database_bytes: c.database_bytes,
    };
    Some(cluster_facts(
        &stats.settings,
        stats.checkpoints.as_ref(),
        wal,
        at,
        hugepages_total,
    ))
}

/// `check --pg.dsn`: the server's own syncs over `seconds`, traced in the
/// kernel, when its data directory is on this host: (kind, count, mean,
/// p50 and p99 bucket bounds), or why not.
pub(crate) type KindSummary = (&'static str, u64, Option<f64>, Option<f64>, Option<f64>);

pub(crate) fn server_syncs(data_dir: &Path, seconds: u64) -> Result<Vec<KindSummary>, String> {
    let kinds = crate::ebpf::trace_once(data_dir, std::time::Duration::from_secs(seconds))?;
    Ok(kinds
        .iter()
        .zip(crate::ebpf::KINDS)
        .map(|(h, kind)| {
            let mean = (h.count > 0).then(|| h.sum_ns as f64 / 1e9 / h.count as f64);
            (
                kind,
                h.count,
                mean,
                h.quantile_bound(0.5),
                h.quantile_bound(0.99),
            )
        })
        .collect())
}

/// How long `check --pg.dsn` waits for a connection: as long as the
/// collector does, connect_timeout for each host, twice over for
/// prefer-standby, which may try every host twice; `None` for
/// connect_timeout=0, which libpq waits on indefinitely.
fn connect_within(target: &crate::postgres::dsn::Target) -> Option<std::time::Duration> {
    crate::postgres::connect_deadline(&target.config).map(|d| d.saturating_mul(target.passes()))
}

/// `check --pg.dsn DSN`: the cluster's findings from one short read-only
/// session (the same settings and checkpoint queries as the collector),
/// with the data and WAL filesystems looked up locally when the data
/// directory is visible from here.
pub(crate) fn check_cluster(
    dsn: &str,
    host: &audit::HostFacts,
) -> anyhow::Result<(audit::Outcome, Option<PathBuf>)> {
    use anyhow::Context;
    let env = |k: &str| std::env::var(k).ok();
    let target =
        crate::postgres::dsn::target(dsn, &env, None).map_err(|e| anyhow::anyhow!("{e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let (settings, checkpoints, wal_stats, database_bytes) = rt.block_on(async {
        let within = connect_within(&target);
        let connecting = crate::postgres::tls::connect(&target);
        let conn = match within {
            Some(within) => tokio::time::timeout(within, connecting)
                .await
                .map_err(|_| anyhow::anyhow!("{}: no answer within {within:?}", target.display))?,
            None => connecting.await,
        }
        .map_err(|e| anyhow::anyhow!("{}: {e}", target.display))?;
        let statements = crate::postgres::db::Statements::new(&target.display);
        let db = crate::postgres::db::Db::new(
            &conn.client,
            &statements,
            std::time::Duration::from_secs(5),
        );
        // Never write: the session refuses it, as the collector's does.
        db.batch_execute("SET statement_timeout = 5000; SET default_transaction_read_only = on")
            .await
            .map_err(|e| anyhow::anyhow!("setting up the session: {e}"))?;
        let (version, _) = crate::postgres::views::version::read(db)
            .await
            .map_err(|e| anyhow::anyhow!("reading the version: {e}"))?;
        let settings = crate::postgres::views::settings::read(db)
            .await
            .map_err(|e| anyhow::anyhow!("reading pg_settings: {e}"))?;
        let checkpoints = crate::postgres::views::checkpoints::read(db, version)
            .await
            .map_err(|e| anyhow::anyhow!("reading the checkpoint statistics: {e}"))?;
        let wal = crate::postgres::views::wal::read(db, version)
            .await
            .map(|w| crate::postgres::views::wal::keep_timed(w, false))
            .map_err(|e| anyhow::anyhow!("reading the WAL statistics: {e}"))?;
        // Only a bound for the sizing: without it (no privilege to size
        // every database) the fix is sized from the rate alone.
        let size = crate::postgres::views::database::size(db)
            .await
            .ok()
            .flatten();
        Ok::<_, anyhow::Error>((settings, checkpoints, wal, size))
    })?;
    let data = settings
        .iter()
        .find(|s| s.name == "data_directory")
        .map(|s| PathBuf::from(&s.value));
    let roots = crate::probe::fsinfo::Roots::default();
    // Only when the data directory is on this machine (and readable): a
    // remote server's paths say nothing about local filesystems.
    let local = data
        .as_ref()
        .map(|d| crate::probe::fsinfo::lookup(d, &roots))
        .filter(|f| !f.majmin.is_empty());
    let wal = data
        .as_ref()
        .filter(|_| local.is_some())
        .map(|d| crate::probe::fsinfo::lookup(&d.join("pg_wal"), &roots))
        .filter(|f| !f.majmin.is_empty());
    let data_nonrotational = match (&data, &local) {
        (Some(d), Some(f)) => {
            let disk = f.disk.as_ref().map(|d| d.name.clone());
            audit::read::volume(&roots.proc, &roots.sys, d, disk.as_deref(), None)
                .0
                .rotational
                .map(|r| !r)
        }
        _ => None,
    };
    let wal_fs_bytes = wal
        .as_ref()
        .zip(data.as_ref())
        .and_then(|(_, d)| audit::read::fs_size(&d.join("pg_wal")));
    let at = Placement {
        data_fs: local.map(|f| f.majmin),
        wal_fs: wal.map(|f| f.majmin),
        data_nonrotational,
        wal_fs_bytes,
    };
    // One session reads the WAL counters once: the rate is their mean
    // since the statistics reset, the span the checkpoint counters cover.
    let wal = Wal {
        stats: wal_stats.as_ref(),
        window: None,
        database_bytes,
    };
    let facts = cluster_facts(
        &settings,
        checkpoints.as_ref(),
        wal,
        at,
        host.hugepages_total,
    );
    Ok((audit::evaluate_cluster(&facts), data))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::connect_within;
    use crate::postgres::dsn;

    #[test]
    fn check_waits_for_every_host_and_pass_as_the_collector_does() {
        let within = |d: &str| connect_within(&dsn::target(d, &|_| None, None).unwrap());
        // libpq's default of 10 s per host here.
        assert_eq!(within("host=a user=u"), Some(Duration::from_secs(10)));
        assert_eq!(
            within("host=a,b,c user=u connect_timeout=4"),
            Some(Duration::from_secs(12))
        );
        // prefer-standby may go over the hosts twice.
        assert_eq!(
            within("host=a,b,c user=u connect_timeout=4 target_session_attrs=prefer-standby"),
            Some(Duration::from_secs(24))
        );
        assert_eq!(within("host=a user=u connect_timeout=0"), None);
    }
}
