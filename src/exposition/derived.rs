//! Families derived from the volumes' windows and shared state, computed
//! from the scrape's one snapshot: window sample counts, in-flight ages,
//! volume info, commit ceilings, sweep results and the PostgreSQL/probe
//! sync ratio.

use std::sync::Arc;

use crate::families::gauge;
use crate::limits::LimitsSnapshot;
use crate::limits::caps::CapBasis;
use crate::model::ceiling::{commit_ceiling, rate_ceiling, sync_ratio};
use crate::model::plateau::DepthPoint;
use crate::postgres::ClusterSnapshot;
use crate::probe::state::{Snapshot, SweepResult, VolumeState};
use crate::types::{Op, Phase, Resource, series};

type Enc<'a, 'b> = &'a mut prometheus_client::encoding::DescriptorEncoder<'b>;

/// One depth of one workload of a volume's latest sweep, as the
/// `pgstorage_sweep_*` families show it.
struct SweepRow<'a> {
    volume: &'a str,
    depth: String,
    /// In the workload's unit: IOs or bytes per second.
    rate: f64,
    point: DepthPoint,
}

/// The `cap` basis of a volume where commits happen (it runs the commit
/// probe or holds a cluster's WAL): the tightest known cap on device
/// writes (cgroup, provisioned or the sweep's plateau) over the device
/// writes per commit, measured or the default (`limits::caps`).
fn cap_basis<'a>(
    limits: &'a LimitsSnapshot,
    v: &VolumeState,
    clusters: &[ClusterSnapshot],
) -> Option<CapBasis<'a>> {
    let commits = v.commit_probe
        || clusters
            .iter()
            .any(|c| c.wal_volume() == Some(v.name.as_str()));
    if !commits {
        return None;
    }
    limits.cap_basis(&v.name)
}

/// The least one client's commit takes by PostgreSQL's own figures, the
/// `postgres` basis: its mean WAL write + sync time per sync over the
/// intervals of the window in which every sync was one small commit's (no
/// group commit, no bulk load), plus the fastest round trip of a trivial
/// query where the exporter measures one (nothing over a network). Absent
/// when no interval of the window qualifies.
fn postgres_commit_seconds(c: &ClusterSnapshot) -> Option<f64> {
    crate::model::ceiling::commit_floor(c.wal_one_commit?, c.round_trip)
}

/// The probe's commit ceiling, basis `probe_mean`: 1 / the window mean of
/// the busy commit probes with headroom ([`rate_ceiling`]), once rates may
/// use the window.
fn probe_ceiling(s: &Snapshot) -> Option<f64> {
    s.rate_mean(Op::Commit).and_then(rate_ceiling)
}

/// The commit ceilings of a volume that the ceiling in force is the lowest
/// of, as (basis, commits per second): probe_mean, then postgres (one per
/// cluster whose WAL is on the volume), then cap; absent bases left out.
pub(crate) fn commit_bases(
    v: &VolumeState,
    s: &Snapshot,
    clusters: &[ClusterSnapshot],
    limits: &LimitsSnapshot,
) -> Vec<(&'static str, f64)> {
    let mut bases = Vec::new();
    if let Some(c) = probe_ceiling(s) {
        bases.push(("probe_mean", c));
    }
    for c in clusters {
        if c.wal_volume() == Some(v.name.as_str())
            && let Some(ceiling) = postgres_commit_seconds(c).and_then(commit_ceiling)
        {
            bases.push(("postgres", ceiling));
        }
    }
    if let Some(c) = cap_basis(limits, v, clusters) {
        bases.push(("cap", c.ceiling));
    }
    bases
}

/// The ceiling in force among [`commit_bases`]: the lowest, with the basis
/// that sets it (the first listed on a tie).
pub(crate) fn ceiling_in_force(bases: &[(&'static str, f64)]) -> Option<(&'static str, f64)> {
    bases
        .iter()
        .copied()
        .reduce(|a, b| if b.1 < a.1 { b } else { a })
}

pub(crate) fn encode(
    enc: Enc<'_, '_>,
    snaps: &[(Arc<VolumeState>, Snapshot)],
    clusters: &[ClusterSnapshot],
    limits: &LimitsSnapshot,
    ops: &[Op],
) -> std::fmt::Result {
    encode_window(enc, snaps, ops)?;
    encode_volume_info(enc, snaps)?;
    encode_ceilings(enc, snaps, clusters, limits)?;
    encode_sweeps(enc, snaps)?;
    encode_sync_ratio(enc, snaps, clusters)
}

/// The probes' sliding windows: sample counts per series, the slowdown in
/// force and the age of the operation in flight.
fn encode_window(
    enc: Enc<'_, '_>,
    snaps: &[(Arc<VolumeState>, Snapshot)],
    ops: &[Op],
) -> std::fmt::Result {
    let mut samples = Vec::new();
    for (v, s) in snaps {
        for &op in ops {
            for phase in Phase::ALL {
                let n = s.samples[series(op, phase)];
                if n > 0 {
                    samples.push((
                        [
                            ("volume", v.name.as_str()),
                            ("op", op.as_str()),
                            ("phase", phase.as_str()),
                        ],
                        n as f64,
                    ));
                }
            }
        }
    }
    gauge(
        enc,
        "pgstorage_probe_window_samples",
        "Number of samples in the sliding window behind pgstorage_probe_window_seconds; a p99.9 \
         from fewer than 1000 samples is close to the maximum.",
        samples,
    )?;

    gauge(
        enc,
        "pgstorage_probe_slowdown_ratio",
        "How much longer than configured the volume's probe interval and busy_every are: 1 as \
         configured; above 1 when a write-IOPS cap that also counts the exporter's own IO \
         (provisioned, or a cgroup the exporter is in) would otherwise see more than 2 % of its \
         writes come from the probes.",
        snaps
            .iter()
            .map(|(v, _)| ([("volume", v.name.as_str())], v.slowdown())),
    )?;

    gauge(
        enc,
        "pgstorage_probe_in_flight_seconds",
        "Age in seconds of the probe operation in flight on the volume, 0 when idle. A value that \
         keeps growing is a hung write or sync: no second probe is started meanwhile.",
        snaps.iter().map(|(v, s)| {
            let age = s.in_flight.map(|(_, d)| d.as_secs_f64()).unwrap_or(0.0);
            ([("volume", v.name.as_str())], age)
        }),
    )
}

/// `pgstorage_volume_info`: what is probed on each volume and how.
fn encode_volume_info(
    enc: Enc<'_, '_>,
    snaps: &[(Arc<VolumeState>, Snapshot)],
) -> std::fmt::Result {
    let paths: Vec<String> = snaps
        .iter()
        .map(|(v, _)| v.path.display().to_string())
        .collect();
    gauge(
        enc,
        "pgstorage_volume_info",
        "Always 1: what is probed and how. device is the kernel block device (or the mount source \
         when there is none); engine is io_uring or sync (fallback), empty until the probe thread \
         has set up; sync_method follows PostgreSQL's wal_sync_method (empty without a commit probe); \
         majmin is the filesystem's device number; disk the whole disk IO limits apply to (unknown \
         for tmpfs, overlay, network filesystems).",
        snaps.iter().zip(&paths).map(|((v, s), path)| {
            (
                [
                    ("volume", v.name.as_str()),
                    ("path", path.as_str()),
                    ("device", s.fs.device.as_str()),
                    ("fstype", s.fs.fstype.as_str()),
                    ("engine", s.engine.map(|e| e.as_str()).unwrap_or("")),
                    (
                        "sync_method",
                        if v.commit_probe {
                            v.sync_method.as_str()
                        } else {
                            ""
                        },
                    ),
                    ("majmin", s.fs.majmin.as_str()),
                    (
                        "disk",
                        s.fs.disk
                            .as_ref()
                            .map(|d| d.name.as_str())
                            .unwrap_or("unknown"),
                    ),
                ],
                1.0,
            )
        }),
    )
}

/// The commit ceilings of every basis, what the cap basis is computed
/// from, and the ceiling in force.
fn encode_ceilings(
    enc: Enc<'_, '_>,
    snaps: &[(Arc<VolumeState>, Snapshot)],
    clusters: &[ClusterSnapshot],
    limits: &LimitsSnapshot,
) -> std::fmt::Result {
    let mut ceilings: Vec<([(&str, &str); 2], f64)> = Vec::new();
    for (v, s) in snaps {
        if let Some(c) = probe_ceiling(s) {
            ceilings.push(([("volume", v.name.as_str()), ("basis", "probe_mean")], c));
        }
    }
    // One sample per volume: two clusters may keep their WAL on one
    // filesystem; the first cluster (in configuration order) speaks for it.
    let mut done: Vec<&str> = Vec::new();
    for c in clusters {
        if let (Some(vol), Some(mean)) = (c.wal_volume(), postgres_commit_seconds(c))
            && !done.contains(&vol)
            && let Some(ceiling) = commit_ceiling(mean)
        {
            done.push(vol);
            ceilings.push(([("volume", vol), ("basis", "postgres")], ceiling));
        }
    }
    // basis=cap: the tightest write-IOPS cap divided by the device writes
    // one commit costs; which cap and which divisor in the info family
    // below, so the basis label stays one of a fixed few.
    let caps: Vec<(&str, CapBasis<'_>)> = snaps
        .iter()
        .filter_map(|(v, _)| cap_basis(limits, v, clusters).map(|c| (v.name.as_str(), c)))
        .collect();
    for (volume, c) in &caps {
        ceilings.push(([("volume", *volume), ("basis", "cap")], c.ceiling));
    }
    gauge(
        enc,
        "pgstorage_commit_ceiling_per_second",
        "Most commits per second one client can do on this volume: 1 / the mean time per commit \
         (WAL write + sync), the rate of a client committing back to back. basis=probe_mean is \
         1.1 / the window mean of the busy commit probes (phase=busy; whole throttle cycles where a \
         burst met a throttle), once the window holds three bursts (or all the window can hold; \
         a burst through a steady throttle counts as three); \
         the after_idle ones when busy_every is 0. \
         basis=postgres uses PostgreSQL's own mean WAL write + sync time per sync over the \
         collection intervals of the window in which each sync was one small commit's (no group \
         commit, no bulk load; absent when none was) plus the fastest round trip of a trivial \
         query (pgstorage_pg_round_trip_seconds, local connections only), on the cluster's WAL \
         volume; basis=cap is the tightest write-IOPS cap known (cgroup, provisioned, or the \
         sweep's detected plateau, with 10 % headroom as a measured rate) divided by the device \
         writes per commit, measured or 2 (pgstorage_commit_ceiling_cap_info says which; \
         docs/ceilings.md). The rest of a statement's work and network round trips come \
         on top; group commit lets many clients together exceed it.",
        ceilings,
    )?;

    gauge(
        enc,
        "pgstorage_commit_ceiling_cap_info",
        "Always 1: what the volume's basis=cap commit ceiling is computed from. source and resource \
         name the binding cap as pgstorage_io_limit does (the lowest write_iops or iops cap; on a tie \
         cgroup, then provisioned, then detected); writes_per_commit=measured when the divisor is \
         pgstorage_probe_device_writes_per_commit, default when it is 2 (ext4 and XFS; no count \
         could be attributed to the probes).",
        caps.iter().map(|(volume, c)| {
            (
                [
                    ("volume", *volume),
                    ("source", c.cap.source),
                    ("resource", c.cap.resource.as_str()),
                    ("writes_per_commit", c.writes_source.as_str()),
                ],
                1.0,
            )
        }),
    )?;

    let mut in_force = Vec::new();
    for (v, s) in snaps {
        if let Some((_, m)) = ceiling_in_force(&commit_bases(v, s, clusters, limits)) {
            in_force.push(([("volume", v.name.as_str())], m));
        }
    }
    gauge(
        enc,
        "pgstorage_commit_ceiling_in_force_per_second",
        "The commit ceiling in force on the volume: the lowest of the bases probe_mean, postgres \
         and cap that are available.",
        in_force,
    )
}

/// One workload's depths in every volume's latest sweep.
fn sweep_rows<'a>(sweeps: &[(&'a str, SweepResult)], resource: Resource) -> Vec<SweepRow<'a>> {
    let mut rows = Vec::new();
    for (volume, s) in sweeps {
        for t in s.tables.iter().filter(|t| t.resource == resource) {
            let w = t.workload();
            for p in &t.points {
                rows.push(SweepRow {
                    volume,
                    depth: p.depth.to_string(),
                    rate: w.rate(p),
                    point: *p,
                });
            }
        }
    }
    rows
}

/// A workload's rate at each depth, labelled by volume and depth.
fn sweep_rates(rows: &[SweepRow<'_>]) -> Vec<([(&'static str, String); 2], f64)> {
    rows.iter()
        .map(|r| {
            (
                [("volume", r.volume.to_string()), ("depth", r.depth.clone())],
                r.rate,
            )
        })
        .collect()
}

/// A workload's mean and p99 latency at each depth.
fn sweep_latencies(rows: &[SweepRow<'_>]) -> Vec<([(&'static str, String); 3], f64)> {
    rows.iter()
        .flat_map(|r| {
            [("mean", r.point.mean), ("p99", r.point.p99)].map(|(stat, v)| {
                (
                    [
                        ("volume", r.volume.to_string()),
                        ("depth", r.depth.clone()),
                        ("stat", stat.to_string()),
                    ],
                    v,
                )
            })
        })
        .collect()
}

/// The `pgstorage_sweep_*` families of each volume's latest queue-depth
/// sweep.
fn encode_sweeps(enc: Enc<'_, '_>, snaps: &[(Arc<VolumeState>, Snapshot)]) -> std::fmt::Result {
    let sweeps: Vec<_> = snaps
        .iter()
        .filter_map(|(v, _)| v.sweep().map(|s| (v.name.as_str(), s)))
        .collect();
    let read_iops = sweep_rows(&sweeps, Resource::ReadIops);
    let write_iops = sweep_rows(&sweeps, Resource::WriteIops);
    gauge(
        enc,
        "pgstorage_sweep_read_iops",
        "IOPS of 8 KiB O_DIRECT random reads at each queue depth in the latest queue-depth sweep \
         (off unless sweep_every is set). IOPS that stop growing with depth while latency grows in \
         proportion is a cap: see pgstorage_io_limit{source=\"detected\"}.",
        sweep_rates(&read_iops),
    )?;
    gauge(
        enc,
        "pgstorage_sweep_read_latency_seconds",
        "Mean (stat=mean) and p99 (stat=p99) latency of the 8 KiB random reads at each queue depth \
         in the latest sweep.",
        sweep_latencies(&read_iops),
    )?;
    gauge(
        enc,
        "pgstorage_sweep_write_iops",
        "IOPS of 8 KiB O_DIRECT random writes into the sweep file at each queue depth in the latest \
         queue-depth sweep.",
        sweep_rates(&write_iops),
    )?;
    gauge(
        enc,
        "pgstorage_sweep_write_latency_seconds",
        "Mean (stat=mean) and p99 (stat=p99) latency of the 8 KiB random writes at each queue depth \
         in the latest sweep.",
        sweep_latencies(&write_iops),
    )?;
    gauge(
        enc,
        "pgstorage_sweep_read_bytes_per_second",
        "Bytes per second of 256 KiB O_DIRECT sequential reads at each queue depth in the latest \
         queue-depth sweep.",
        sweep_rates(&sweep_rows(&sweeps, Resource::ReadBytesPerSecond)),
    )?;
    gauge(
        enc,
        "pgstorage_sweep_write_bytes_per_second",
        "Bytes per second of 256 KiB O_DIRECT sequential writes into the sweep file at each queue \
         depth in the latest queue-depth sweep.",
        sweep_rates(&sweep_rows(&sweeps, Resource::WriteBytesPerSecond)),
    )?;
    gauge(
        enc,
        "pgstorage_sweep_last_timestamp_seconds",
        "Unix time the latest queue-depth sweep of the volume finished.",
        sweeps
            .iter()
            .map(|(vol, s)| ([("volume", *vol)], s.finished_unix)),
    )
}

/// `pgstorage_pg_wal_sync_probe_ratio`: each cluster's WAL syncs against
/// the probe's on its WAL volume.
fn encode_sync_ratio(
    enc: Enc<'_, '_>,
    snaps: &[(Arc<VolumeState>, Snapshot)],
    clusters: &[ClusterSnapshot],
) -> std::fmt::Result {
    let mut ratios = Vec::new();
    for c in clusters {
        let (Some(vol), Some(pg)) = (c.wal_volume(), c.wal_sync_mean) else {
            continue;
        };
        let Some((_, s)) = snaps.iter().find(|(v, _)| v.name == vol) else {
            continue;
        };
        // PostgreSQL's syncs are compared with the probe's in the same
        // condition as the ceilings: busy when bursts run.
        let probe = s.rate_sync_mean();
        if let Some(r) = probe.and_then(|p| sync_ratio(pg, p)) {
            ratios.push(([("cluster", c.name.as_str()), ("volume", vol)], r));
        }
    }
    gauge(
        enc,
        "pgstorage_pg_wal_sync_probe_ratio",
        "PostgreSQL's mean WAL sync time over the window divided by the probe's mean sync (or \
         O_DSYNC write) time on the cluster's WAL volume. Near 1: PostgreSQL's syncs cost what the \
         storage costs. Far above 1: something slows PostgreSQL that the probe does not feel (a \
         cgroup cap on PostgreSQL, contention with checkpoints, a different device).",
        ratios,
    )
}
