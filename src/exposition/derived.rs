//! Metrics derived from the volumes' sliding windows and shared state:
//! window quantiles (a summary), window sample counts, in-flight ages,
//! volume info and commit ceilings.
//!
//! They are encoded by hand from ONE snapshot per volume per scrape, so the
//! quantiles, the sample count and the ceilings of a scrape always agree.
//! (prometheus-client has no summary type, and a gauge with a `quantile`
//! label is rejected by `promtool check metrics`; precomputed quantiles over
//! a window are exactly what the summary type means.) The syntax used here
//! is the common subset of the Prometheus text format and OpenMetrics.

use std::fmt::Write;

use crate::limits::LimitsSnapshot;
use crate::model::ceiling::{commit_ceiling, sync_ratio};
use crate::postgres::ClusterSnapshot;
use crate::probe::state::{Snapshot, VolumeState};
use crate::types::{Op, Phase, series};

const QUANTILE_LABELS: [&str; 5] = ["0.5", "0.9", "0.99", "0.999", "1"];

use super::text::{escape, gauge_header, summary_header};

fn cap_ceiling(limits: &LimitsSnapshot, volume: &str) -> Option<f64> {
    let cap = limits.write_iops_limit(volume)?;
    let wpp = limits.writes_per_probe.get(volume).copied()?;
    crate::model::ceiling::capped_ceiling(cap, wpp)
}

/// Appends the derived metric families for `snaps` to `out`.
pub fn encode(
    out: &mut String,
    snaps: &[(&VolumeState, Snapshot)],
    clusters: &[ClusterSnapshot],
    limits: &LimitsSnapshot,
) {
    summary_header(
        out,
        "pgstorage_probe_window_seconds",
        "Exact quantiles of probe latency over the sliding window (config key window, default \
         15m), in seconds; quantile=1 is the maximum. Computed from samples in memory at scrape \
         time; quantiles are absent while the window holds no sample. _sum and _count are \
         cumulative since start, as for any summary. phase=busy: the second half of each burst \
         of back-to-back probes; phase=after_idle: the lone probe of each interval.",
    );
    for (v, s) in snaps {
        let vol = escape(&v.name);
        for op in Op::ALL {
            for phase in Phase::ALL {
                let i = series(op, phase);
                if s.count[i] == 0 {
                    continue;
                }
                if let Some(qs) = &s.quantiles[i] {
                    for (label, value) in QUANTILE_LABELS.iter().zip(qs) {
                        let _ = writeln!(
                            out,
                            "pgstorage_probe_window_seconds{{volume=\"{vol}\",op=\"{op}\",phase=\"{phase}\",quantile=\"{label}\"}} {value}"
                        );
                    }
                }
                let _ = writeln!(
                    out,
                    "pgstorage_probe_window_seconds_sum{{volume=\"{vol}\",op=\"{op}\",phase=\"{phase}\"}} {}",
                    s.sum[i]
                );
                let _ = writeln!(
                    out,
                    "pgstorage_probe_window_seconds_count{{volume=\"{vol}\",op=\"{op}\",phase=\"{phase}\"}} {}",
                    s.count[i]
                );
            }
        }
    }

    gauge_header(
        out,
        "pgstorage_probe_window_samples",
        "Number of samples in the sliding window behind pgstorage_probe_window_seconds; a p99.9 \
         from fewer than 1000 samples is close to the maximum.",
    );
    for (v, s) in snaps {
        let vol = escape(&v.name);
        for op in Op::ALL {
            for phase in Phase::ALL {
                let n = s.samples[series(op, phase)];
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "pgstorage_probe_window_samples{{volume=\"{vol}\",op=\"{op}\",phase=\"{phase}\"}} {n}"
                    );
                }
            }
        }
    }

    gauge_header(
        out,
        "pgstorage_probe_slowdown_ratio",
        "How much longer than configured the volume's probe interval and busy_every are: 1 as \
         configured; above 1 when a write-IOPS cap that also counts the exporter's own IO \
         (provisioned, or a cgroup the exporter is in) would otherwise see more than 2 % of its \
         writes come from the probes.",
    );
    for (v, _) in snaps {
        let _ = writeln!(
            out,
            "pgstorage_probe_slowdown_ratio{{volume=\"{}\"}} {}",
            escape(&v.name),
            v.slowdown()
        );
    }

    gauge_header(
        out,
        "pgstorage_probe_in_flight_seconds",
        "Age in seconds of the probe operation in flight on the volume, 0 when idle. A value that \
         keeps growing is a hung write or sync: no second probe is started meanwhile.",
    );
    for (v, s) in snaps {
        let age = s.in_flight.map(|(_, d)| d.as_secs_f64()).unwrap_or(0.0);
        let _ = writeln!(
            out,
            "pgstorage_probe_in_flight_seconds{{volume=\"{}\"}} {age}",
            escape(&v.name)
        );
    }

    gauge_header(
        out,
        "pgstorage_volume_info",
        "Always 1: what is probed and how. device is the kernel block device (or the mount source \
         when there is none); engine is io_uring or sync (fallback), empty until the probe thread \
         has set up; sync_method follows PostgreSQL's wal_sync_method (empty without a commit probe); \
         majmin is the filesystem's device number; disk the whole disk IO limits apply to (unknown \
         for tmpfs, overlay, network filesystems).",
    );
    for (v, s) in snaps {
        let _ = writeln!(
            out,
            "pgstorage_volume_info{{volume=\"{}\",path=\"{}\",device=\"{}\",fstype=\"{}\",engine=\"{}\",sync_method=\"{}\",majmin=\"{}\",disk=\"{}\"}} 1",
            escape(&v.name),
            escape(&v.path.display().to_string()),
            escape(&s.fs.device),
            escape(&s.fs.fstype),
            s.engine.map(|e| e.as_str()).unwrap_or(""),
            if v.commit_probe {
                v.sync_method.as_str()
            } else {
                ""
            },
            escape(&s.fs.majmin),
            escape(
                s.fs.disk
                    .as_ref()
                    .map(|d| d.name.as_str())
                    .unwrap_or("unknown")
            ),
        );
    }

    gauge_header(
        out,
        "pgstorage_commit_ceiling_per_second",
        "Most commits per second one client can do on this volume: 1 / commit probe latency (WAL \
         write + sync). basis=probe_p50 uses the window median, basis=probe_p99 the window p99, \
         of the busy commit probes (phase=busy; the after_idle ones while no burst has run or \
         busy_every is 0). \
         basis=postgres uses PostgreSQL's own mean WAL sync time over the window, on the \
         cluster's WAL volume; basis=cap is a write-IOPS cap divided by the measured device writes \
         per commit probe (docs/ceilings.md). Statement work and network round trips come on top; group commit \
         lets many clients together exceed it.",
    );
    for (v, s) in snaps {
        if let Some(qs) = s.quantiles(Op::Commit, s.rate_phase(Op::Commit)) {
            for (basis, q) in [("probe_p50", qs.first()), ("probe_p99", qs.get(2))] {
                if let Some(c) = q.copied().and_then(commit_ceiling) {
                    let _ = writeln!(
                        out,
                        "pgstorage_commit_ceiling_per_second{{volume=\"{}\",basis=\"{basis}\"}} {c}",
                        escape(&v.name)
                    );
                }
            }
        }
    }
    // One sample per volume: two clusters may keep their WAL on one
    // filesystem; the first cluster (in configuration order) speaks for it.
    let mut done: Vec<&str> = Vec::new();
    for c in clusters {
        if let (Some(vol), Some(mean)) = (c.wal_volume(), c.wal_sync_mean)
            && !done.contains(&vol)
            && let Some(ceiling) = commit_ceiling(mean)
        {
            done.push(vol);
            let _ = writeln!(
                out,
                "pgstorage_commit_ceiling_per_second{{volume=\"{}\",basis=\"postgres\"}} {ceiling}",
                escape(vol)
            );
        }
    }

    // basis=cap: the write-IOPS cap divided by the device writes one commit
    // probe costs (measured, see collectors::limits).
    for (v, _) in snaps {
        if let Some(c) = cap_ceiling(limits, &v.name) {
            let _ = writeln!(
                out,
                "pgstorage_commit_ceiling_per_second{{volume=\"{}\",basis=\"cap\"}} {c}",
                escape(&v.name)
            );
        }
    }

    gauge_header(
        out,
        "pgstorage_commit_ceiling_in_force_per_second",
        "The commit ceiling in force on the volume: the lowest of the bases probe_p50, postgres and \
         cap that are available. probe_p99 is left out: it bounds the slow tail, not the rate one \
         client sustains.",
    );
    for (v, s) in snaps {
        let mut bases: Vec<f64> = Vec::new();
        if let Some(p50) = s
            .quantiles(Op::Commit, s.rate_phase(Op::Commit))
            .and_then(|q| q.first())
        {
            bases.extend(commit_ceiling(*p50));
        }
        for c in clusters {
            if c.wal_volume() == Some(v.name.as_str()) {
                bases.extend(c.wal_sync_mean.and_then(commit_ceiling));
            }
        }
        bases.extend(cap_ceiling(limits, &v.name));
        if let Some(m) = bases.into_iter().reduce(f64::min) {
            let _ = writeln!(
                out,
                "pgstorage_commit_ceiling_in_force_per_second{{volume=\"{}\"}} {m}",
                escape(&v.name)
            );
        }
    }

    gauge_header(
        out,
        "pgstorage_sweep_read_iops",
        "IOPS of 8 KiB O_DIRECT random reads at each queue depth in the latest queue-depth sweep \
         (off unless sweep_every is set). IOPS that stop growing with depth while latency grows in \
         proportion is a cap: see pgstorage_io_limit{source=\"detected\"}.",
    );
    let sweeps: Vec<_> = snaps
        .iter()
        .filter_map(|(v, _)| v.sweep().map(|s| (v.name.clone(), s)))
        .collect();
    for (vol, s) in &sweeps {
        for p in &s.points {
            let _ = writeln!(
                out,
                "pgstorage_sweep_read_iops{{volume=\"{}\",depth=\"{}\"}} {}",
                escape(vol),
                p.depth,
                p.iops
            );
        }
    }
    gauge_header(
        out,
        "pgstorage_sweep_read_latency_seconds",
        "Mean (stat=mean) and p99 (stat=p99) latency at each queue depth in the latest sweep.",
    );
    for (vol, s) in &sweeps {
        for p in &s.points {
            for (stat, v) in [("mean", p.mean), ("p99", p.p99)] {
                let _ = writeln!(
                    out,
                    "pgstorage_sweep_read_latency_seconds{{volume=\"{}\",depth=\"{}\",stat=\"{stat}\"}} {v}",
                    escape(vol),
                    p.depth
                );
            }
        }
    }
    gauge_header(
        out,
        "pgstorage_sweep_last_timestamp_seconds",
        "Unix time the latest queue-depth sweep of the volume finished.",
    );
    for (vol, s) in &sweeps {
        let _ = writeln!(
            out,
            "pgstorage_sweep_last_timestamp_seconds{{volume=\"{}\"}} {}",
            escape(vol),
            s.finished_unix
        );
    }

    gauge_header(
        out,
        "pgstorage_pg_wal_sync_probe_ratio",
        "PostgreSQL's mean WAL sync time over the window divided by the probe's mean sync (or \
         O_DSYNC write) time on the cluster's WAL volume. Near 1: PostgreSQL's syncs cost what the \
         storage costs. Far above 1: something slows PostgreSQL that the probe does not feel (a \
         cgroup cap on PostgreSQL, contention with checkpoints, a different device).",
    );
    for c in clusters {
        let (Some(vol), Some(pg)) = (c.wal_volume(), c.wal_sync_mean) else {
            continue;
        };
        let Some((_, s)) = snaps.iter().find(|(v, _)| v.name == vol) else {
            continue;
        };
        // PostgreSQL's syncs are compared with the probe's in the same
        // condition as the ceilings: busy when bursts run.
        let phase = s.rate_phase(Op::Commit);
        let probe = s.mean(Op::Sync, phase).or(s.mean(Op::Commit, phase));
        if let Some(r) = probe.and_then(|p| sync_ratio(pg, p)) {
            let _ = writeln!(
                out,
                "pgstorage_pg_wal_sync_probe_ratio{{cluster=\"{}\",volume=\"{}\"}} {r}",
                escape(&c.name),
                escape(vol)
            );
        }
    }
}
