//! The `postgres.syncs` collector's families: `pgstorage_pg_sync_seconds`
//! (a few series per cluster, so through prometheus-client's histogram
//! encoder) and whether tracing is on, per exporter and per cluster.

use crate::ebpf::{KINDS, SyncSnapshot};
use crate::families::{gauge, histogram};
use crate::model::buckets::probe_buckets;

type Enc<'a, 'b> = &'a mut prometheus_client::encoding::DescriptorEncoder<'b>;

pub(crate) const NAME: &str = "pgstorage_pg_sync_seconds";

pub(crate) fn encode(enc: Enc<'_, '_>, s: &SyncSnapshot) -> std::fmt::Result {
    if !s.running && s.off.is_none() {
        // Disabled by flag, or still starting: no series.
        return Ok(());
    }
    gauge(
        enc,
        "pgstorage_pg_sync_tracing",
        "1 (reason=\"ok\") when the postgres.syncs collector traces syncs in the kernel; 0 with \
         why not: not_built (no bpf feature), permission (needs root or CAP_BPF+CAP_PERFMON), \
         pid_namespace (needs the host's), tracefs, btf, load_failed.",
        [(
            [("reason", s.off.map_or("ok", |o| o.as_str()))],
            if s.off.is_none() { 1.0 } else { 0.0 },
        )],
    )?;
    gauge(
        enc,
        "pgstorage_pg_sync_traced",
        "1 (reason=\"ok\") while the cluster's processes are traced; 0 with why not: \
         no_data_directory (not read yet), not_local (the data directory is not on this host), \
         not_running (no postmaster in it), too_many_clusters.",
        s.clusters.iter().map(|(c, t)| {
            (
                [
                    ("cluster", c.as_str()),
                    ("reason", t.traced.err().unwrap_or("ok")),
                ],
                if t.traced.is_ok() { 1.0 } else { 0.0 },
            )
        }),
    )?;
    let bounds = probe_buckets();
    histogram(
        enc,
        NAME,
        "Time the cluster's own processes spent in each sync, timed in the kernel from syscall \
         entry to return. kind=wal: the WAL sync of wal_sync_method (fdatasync/fsync of a file in \
         pg_wal, or the pwrite of an O_DSYNC/O_SYNC WAL file), plus the fsyncs of new or recycled \
         segments; kind=data: fsyncs of relation files (checkpointer, or a backend syncing \
         itself); kind=other: SLRU segments, pg_control, state files, directories.",
        s.clusters.iter().flat_map(|(c, t)| {
            let bounds = &bounds;
            t.kinds.iter().flat_map(move |kinds| {
                kinds.iter().zip(KINDS).map(move |(h, kind)| {
                    let buckets: Vec<(f64, u64)> = bounds
                        .iter()
                        .copied()
                        .chain([f64::INFINITY])
                        .zip(h.buckets.iter().copied())
                        .collect();
                    (
                        [("cluster", c.as_str()), ("kind", kind)],
                        h.sum_ns as f64 / 1e9,
                        h.count,
                        buckets,
                    )
                })
            })
        }),
    )
}
