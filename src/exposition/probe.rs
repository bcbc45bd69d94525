//! The probe threads' cumulative counts: errors by cause, cache-served
//! reads (the latency histograms are in [`super::histogram`]). Window-derived families are in
//! [`super::derived`] and [`super::summary`].

use std::sync::Arc;

use crate::families::counter;
use crate::probe::state::{Snapshot, VolumeState};

type Enc<'a, 'b> = &'a mut prometheus_client::encoding::DescriptorEncoder<'b>;

pub(crate) fn encode(
    enc: Enc<'_, '_>,
    volumes: &[(Arc<VolumeState>, Snapshot)],
) -> std::fmt::Result {
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
