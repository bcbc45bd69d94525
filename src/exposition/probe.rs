//! Probe metrics the probe threads update directly: the latency histogram,
//! error and cache-served counters. Window-derived metrics are in
//! [`super::derived`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use super::buckets::probe_buckets;
use crate::probe::state::VolumeState;
use crate::types::{Op, Phase};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OpLabels {
    pub volume: String,
    pub op: &'static str,
    pub phase: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ErrorLabels {
    pub volume: String,
    pub op: &'static str,
    pub error: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct VolumeLabels {
    pub volume: String,
}

fn new_histogram() -> Histogram {
    Histogram::new(probe_buckets())
}

/// Counters and histograms fed by the probe threads. Cheap to clone: all
/// handles share the same series.
#[derive(Debug, Clone)]
pub struct ProbeMetrics {
    seconds: Family<OpLabels, Histogram, fn() -> Histogram>,
    errors: Family<ErrorLabels, Counter>,
    cache_served: Family<VolumeLabels, Counter>,
    /// Error series ever created, so a removed volume's can be found:
    /// a Family cannot be listed.
    error_keys: Arc<Mutex<HashSet<ErrorLabels>>>,
}

impl ProbeMetrics {
    pub fn register(registry: &mut Registry) -> ProbeMetrics {
        let m = ProbeMetrics {
            seconds: Family::new_with_constructor(new_histogram as fn() -> Histogram),
            errors: Family::default(),
            cache_served: Family::default(),
            error_keys: Arc::default(),
        };
        registry.register(
            "pgstorage_probe_seconds",
            "Latency of probe operations in seconds, measured by the exporter's own probe threads. \
             op=write: 8 KiB write into the preallocated WAL probe file; op=sync: the fdatasync/fsync \
             after it; op=commit: write+sync, what one commit waits for; op=read: 8 KiB O_DIRECT \
             random read at queue depth 1. phase=busy: the second half of a burst of back-to-back \
             probes (every busy_every), what an IO costs while the storage is busy; \
             phase=after_idle: the lone probe of each interval, what an IO costs after a pause. \
             Always select a phase",
            m.seconds.clone(),
        );
        registry.register(
            "pgstorage_probe_errors",
            "Failed probe operations by cause: errno name, short_io, timeout (in flight longer than \
             the volume's timeout), removed or replaced (the probe's file deleted or replaced \
             under its name); op=setup: a probe-file setup failure; op=sweep: a failed \
             queue-depth sweep",
            m.errors.clone(),
        );
        registry.register(
            "pgstorage_probe_cache_served_reads",
            "O_DIRECT probe reads answered faster than the cache_served_threshold (default 5 µs): \
             served by a cache below this OS (hypervisor, controller, disk), not by the media",
            m.cache_served.clone(),
        );
        m
    }

    /// Creates a new volume's series that should exist from the start, so
    /// rate() and alerts see the first increment.
    pub fn init_volume(&self, v: &VolumeState) {
        let ops: &[Op] = match (v.commit_probe, v.read_probe) {
            (true, true) => &[Op::Commit, Op::Read],
            (true, false) => &[Op::Commit],
            (false, true) => &[Op::Read],
            (false, false) => &[],
        };
        for op in ops {
            let key = ErrorLabels {
                volume: v.name.clone(),
                op: op.as_str(),
                error: "timeout",
            };
            self.errors.get_or_create(&key).get();
            self.remember(key);
        }
        if v.read_probe {
            self.cache_served
                .get_or_create(&VolumeLabels {
                    volume: v.name.clone(),
                })
                .get();
        }
    }

    pub fn observe(&self, volume: &str, op: Op, phase: Phase, seconds: f64) {
        self.seconds
            .get_or_create(&OpLabels {
                volume: volume.to_string(),
                op: op.as_str(),
                phase: phase.as_str(),
            })
            .observe(seconds);
    }

    pub fn error(&self, volume: &str, op: &'static str, error: &'static str) {
        let key = ErrorLabels {
            volume: volume.to_string(),
            op,
            error,
        };
        self.errors.get_or_create(&key).inc();
        self.remember(key);
    }

    fn remember(&self, key: ErrorLabels) {
        if let Ok(mut k) = self.error_keys.lock() {
            k.insert(key);
        }
    }

    /// Drops every series of a volume that a reload removed, so it goes
    /// stale in Prometheus instead of freezing at its last value.
    pub fn remove_volume(&self, volume: &str) {
        for op in Op::ALL {
            for phase in Phase::ALL {
                self.seconds.remove(&OpLabels {
                    volume: volume.to_string(),
                    op: op.as_str(),
                    phase: phase.as_str(),
                });
            }
        }
        if let Ok(mut keys) = self.error_keys.lock() {
            keys.retain(|k| {
                if k.volume == volume {
                    self.errors.remove(k);
                    false
                } else {
                    true
                }
            });
        }
        self.cache_served.remove(&VolumeLabels {
            volume: volume.to_string(),
        });
    }

    pub fn cache_served(&self, volume: &str) {
        self.cache_served
            .get_or_create(&VolumeLabels {
                volume: volume.to_string(),
            })
            .inc();
    }
}
