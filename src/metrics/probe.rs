//! Probe metrics: the histogram and counters probe threads update, and a
//! collector that encodes window quantiles, ceilings, in-flight ages and
//! volume info from the volumes' shared state at scrape time (memory only).

use std::sync::Arc;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::buckets::probe_buckets;
use crate::model::WINDOW_QUANTILES;
use crate::model::ceiling::commit_ceiling;
use crate::probe::state::VolumeState;
use crate::types::Op;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OpLabels {
    pub volume: String,
    pub op: &'static str,
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
}

impl ProbeMetrics {
    pub fn register(registry: &mut Registry, volumes: Vec<Arc<VolumeState>>) -> ProbeMetrics {
        let m = ProbeMetrics {
            seconds: Family::new_with_constructor(new_histogram as fn() -> Histogram),
            errors: Family::default(),
            cache_served: Family::default(),
        };
        registry.register(
            "pgstorage_probe_seconds",
            "Latency of probe operations in seconds, measured by the exporter's own probe threads. \
             op=write: 8 KiB write into the preallocated WAL probe file; op=sync: the fdatasync/fsync \
             after it; op=commit: write+sync, what one commit waits for; op=read: 8 KiB O_DIRECT \
             random read at queue depth 1",
            m.seconds.clone(),
        );
        registry.register(
            "pgstorage_probe_errors",
            "Failed probe operations by cause: errno name, short_io, timeout (in flight longer than \
             the volume's timeout), or for op=setup a probe-file setup failure",
            m.errors.clone(),
        );
        registry.register(
            "pgstorage_probe_cache_served_reads",
            "O_DIRECT probe reads answered faster than the cache_served_threshold (default 5 µs): \
             served by a cache below this OS (hypervisor, controller, disk), not by the media",
            m.cache_served.clone(),
        );
        // Series that should exist from the start, so rate() and alerts see
        // the first increment.
        for v in &volumes {
            let ops: &[Op] = match (v.commit_probe, v.read_probe) {
                (true, true) => &[Op::Commit, Op::Read],
                (true, false) => &[Op::Commit],
                (false, true) => &[Op::Read],
                (false, false) => &[],
            };
            for op in ops {
                m.errors
                    .get_or_create(&ErrorLabels {
                        volume: v.name.clone(),
                        op: op.as_str(),
                        error: "timeout",
                    })
                    .get();
            }
            if v.read_probe {
                m.cache_served
                    .get_or_create(&VolumeLabels {
                        volume: v.name.clone(),
                    })
                    .get();
            }
        }
        registry.register_collector(Box::new(WindowCollector { volumes }));
        m
    }

    pub fn observe(&self, volume: &str, op: Op, seconds: f64) {
        self.seconds
            .get_or_create(&OpLabels {
                volume: volume.to_string(),
                op: op.as_str(),
            })
            .observe(seconds);
    }

    pub fn error(&self, volume: &str, op: &'static str, error: &'static str) {
        self.errors
            .get_or_create(&ErrorLabels {
                volume: volume.to_string(),
                op,
                error,
            })
            .inc();
    }

    pub fn cache_served(&self, volume: &str) {
        self.cache_served
            .get_or_create(&VolumeLabels {
                volume: volume.to_string(),
            })
            .inc();
    }
}

/// Encodes the derived, window-based metrics from the volumes' state.
#[derive(Debug)]
struct WindowCollector {
    volumes: Vec<Arc<VolumeState>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OpRef {
    volume: String,
    op: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VolRef {
    volume: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct InfoLabels {
    volume: String,
    path: String,
    device: String,
    fstype: String,
    engine: &'static str,
    sync_method: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CeilingLabels {
    volume: String,
    basis: &'static str,
}

const QUANTILE_LABELS: [&str; 5] = ["0.5", "0.9", "0.99", "0.999", "1"];

const WINDOW_HELP: &str = "Exact quantiles of probe latency over the sliding window (config key \
    window, default 15m), in seconds; quantile=1 is the maximum. Computed from samples in memory \
    at scrape time; quantiles are absent while the window holds no sample. _sum and _count are \
    cumulative since start, as for any summary.";

/// Appends `pgstorage_probe_window_seconds` as a summary. prometheus-client
/// has no summary type, and a gauge with a `quantile` label is rejected by
/// `promtool check metrics`; precomputed quantiles over a window are exactly
/// what the summary type means, so it is written by hand here.
pub fn encode_window_summary(out: &mut String, volumes: &[Arc<VolumeState>]) {
    use std::fmt::Write;
    let now = Instant::now();
    let _ = writeln!(out, "# HELP pgstorage_probe_window_seconds {WINDOW_HELP}");
    let _ = writeln!(out, "# TYPE pgstorage_probe_window_seconds summary");
    for v in volumes {
        let s = v.snapshot(now, &WINDOW_QUANTILES);
        // Volume names are validated to [A-Za-z0-9_./-]: nothing to escape.
        for op in Op::ALL {
            let i = op.index();
            if s.count[i] == 0 {
                continue;
            }
            if let Some(qs) = &s.quantiles[i] {
                for (label, value) in QUANTILE_LABELS.iter().zip(qs) {
                    let _ = writeln!(
                        out,
                        "pgstorage_probe_window_seconds{{volume=\"{}\",op=\"{}\",quantile=\"{}\"}} {}",
                        v.name, op, label, value
                    );
                }
            }
            let _ = writeln!(
                out,
                "pgstorage_probe_window_seconds_sum{{volume=\"{}\",op=\"{}\"}} {}",
                v.name, op, s.sum[i]
            );
            let _ = writeln!(
                out,
                "pgstorage_probe_window_seconds_count{{volume=\"{}\",op=\"{}\"}} {}",
                v.name, op, s.count[i]
            );
        }
    }
}

impl Collector for WindowCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = Instant::now();
        let snaps: Vec<_> = self
            .volumes
            .iter()
            .map(|v| (v, v.snapshot(now, &WINDOW_QUANTILES)))
            .collect();

        {
            let mut m = encoder.encode_descriptor(
                "pgstorage_probe_window_samples",
                "Number of samples in the sliding window behind pgstorage_probe_window_seconds; a \
                 p99.9 from fewer than 1000 samples is close to the maximum.",
                None,
                MetricType::Gauge,
            )?;
            for (v, s) in &snaps {
                for op in Op::ALL {
                    let n = s.samples[op.index()];
                    if n > 0 {
                        m.encode_family(&OpRef {
                            volume: v.name.clone(),
                            op: op.as_str(),
                        })?
                        .encode_gauge(&(n as i64))?;
                    }
                }
            }
        }
        {
            let mut m = encoder.encode_descriptor(
                "pgstorage_probe_in_flight_seconds",
                "Age in seconds of the probe operation in flight on the volume, 0 when idle. A value \
                 that keeps growing is a hung write or sync: no second probe is started meanwhile.",
                None,
                MetricType::Gauge,
            )?;
            for (v, s) in &snaps {
                let age = s.in_flight.map(|(_, d)| d.as_secs_f64()).unwrap_or(0.0);
                m.encode_family(&VolRef {
                    volume: v.name.clone(),
                })?
                .encode_gauge(&age)?;
            }
        }
        {
            let mut m = encoder.encode_descriptor(
                "pgstorage_volume_info",
                "Always 1: what is probed and how. device is the kernel block device (or the mount \
                 source when there is none); engine is io_uring or sync (fallback), empty until the \
                 probe thread has set up; sync_method follows PostgreSQL's wal_sync_method.",
                None,
                MetricType::Gauge,
            )?;
            for (v, s) in &snaps {
                m.encode_family(&InfoLabels {
                    volume: v.name.clone(),
                    path: v.path.display().to_string(),
                    device: s.fs.device.clone(),
                    fstype: s.fs.fstype.clone(),
                    engine: s.engine.map(|e| e.as_str()).unwrap_or(""),
                    sync_method: if v.commit_probe {
                        v.sync_method.as_str()
                    } else {
                        ""
                    },
                })?
                .encode_gauge(&1i64)?;
            }
        }
        {
            let mut m = encoder.encode_descriptor(
                "pgstorage_commit_ceiling_per_second",
                "Most commits per second one client can do on this volume: 1 / commit probe latency \
                 (WAL write + sync). basis=probe_p50 uses the window median, basis=probe_p99 the \
                 window p99. Statement work and network round trips come on top; group commit lets \
                 many clients together exceed it.",
                None,
                MetricType::Gauge,
            )?;
            for (v, s) in &snaps {
                if let Some(qs) = &s.quantiles[Op::Commit.index()] {
                    for (basis, q) in [("probe_p50", qs.first()), ("probe_p99", qs.get(2))] {
                        if let Some(c) = q.copied().and_then(commit_ceiling) {
                            m.encode_family(&CeilingLabels {
                                volume: v.name.clone(),
                                basis,
                            })?
                            .encode_gauge(&c)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
