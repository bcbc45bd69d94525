//! The probe threads' cumulative counts: latency histograms, errors by
//! cause, cache-served reads. Window-derived families are in
//! [`super::derived`] and [`super::summary`].

use std::sync::Arc;

use crate::families::{counter, histogram};
use crate::probe::state::{Snapshot, VolumeState};
use crate::types::{Op, Phase};

type Enc<'a, 'b> = &'a mut prometheus_client::encoding::DescriptorEncoder<'b>;

pub fn encode(enc: Enc<'_, '_>, volumes: &[(Arc<VolumeState>, Snapshot)]) -> std::fmt::Result {
    let mut rows = Vec::new();
    for (v, _) in volumes {
        for op in Op::ALL {
            for phase in Phase::ALL {
                if let Some(h) = v.counts.histogram(op, phase) {
                    rows.push((
                        [
                            ("volume", v.name.as_str()),
                            ("op", op.as_str()),
                            ("phase", phase.as_str()),
                        ],
                        h.sum,
                        h.count,
                        h.buckets,
                    ));
                }
            }
        }
    }
    histogram(
        enc,
        "pgstorage_probe_seconds",
        "Latency of probe operations in seconds, measured by the exporter's own probe threads. \
             op=write: 8 KiB write into the preallocated WAL probe file; op=sync: the fdatasync/fsync \
             after it; op=commit: write+sync, what one commit waits for; op=read: 8 KiB O_DIRECT \
             random read at queue depth 1. phase=busy: the second half of a burst of back-to-back \
             probes (every busy_every), what an IO costs while the storage is busy; \
             phase=after_idle: the lone probe of each interval, what an IO costs after a pause. \
             Always select a phase",
        rows,
    )?;
    let errors: Vec<_> = volumes
        .iter()
        .flat_map(|(v, _)| {
            v.counts.errors().into_iter().map(move |((op, error), n)| {
                (
                    [("volume", v.name.as_str()), ("op", op), ("error", error)],
                    n as f64,
                )
            })
        })
        .collect();
    counter(
        enc,
        "pgstorage_probe_errors",
        "Failed probe operations by cause: errno name, short_io, timeout (in flight longer than \
             the volume's timeout), removed or replaced (the probe's file deleted or replaced \
             under its name); op=setup: a probe-file setup failure; op=sweep: a failed \
             queue-depth sweep",
        errors,
    )?;
    counter(
        enc,
        "pgstorage_probe_cache_served_reads",
        "O_DIRECT probe reads answered faster than the cache_served_threshold (default 5 µs): \
             served by a cache below this OS (hypervisor, controller, disk), not by the media",
        volumes.iter().filter_map(|(v, _)| {
            v.counts
                .cache_served_reads()
                .map(|n| ([("volume", v.name.as_str())], n as f64))
        }),
    )
}
