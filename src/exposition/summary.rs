//! The window quantiles as a Prometheus summary: prometheus-client has no
//! summary type, and a gauge with a `quantile` label is rejected by
//! `promtool check metrics`; precomputed quantiles over a window are
//! exactly what the summary type means. Written by `families::text`, like
//! the other families written line by line.

use std::sync::Arc;

use crate::families::Format;
use crate::families::text::{Kind, Lines, push_labels};
use crate::probe::state::{Snapshot, VolumeState};
use crate::types::{Op, Phase, series};

const QUANTILE_LABELS: [&str; 5] = ["0.5", "0.9", "0.99", "0.999", "1"];

const NAME: &str = "pgstorage_probe_window_seconds";
const HELP: &str = "Exact quantiles of probe latency over the sliding window (config key window, default \
    15m), in seconds; quantile=1 is the maximum. Computed from samples in memory at scrape \
    time; quantiles are absent while the window holds no sample. _sum and _count are \
    cumulative since start, as for any summary. phase=busy: the recorded part of each \
    burst of back-to-back probes (the second half of its commits, or whole throttle cycles \
    where it met a throttle; its reads over an 8 ms span after a warm-up); phase=after_idle: the lone probe of each interval.";

/// Appends `pgstorage_probe_window_seconds` for every volume.
pub(crate) fn encode(
    out: &mut String,
    format: Format,
    volumes: &[(Arc<VolumeState>, Snapshot)],
    ops: &[Op],
) {
    let mut lines = Lines::new(out, format, Kind::Summary, NAME, HELP);
    let mut labels = String::new();
    for (v, s) in volumes {
        for &op in ops {
            for phase in Phase::ALL {
                let i = series(op, phase);
                if s.count[i] == 0 {
                    continue;
                }
                labels.clear();
                push_labels(
                    &mut labels,
                    &[
                        ("volume", v.name.as_str()),
                        ("op", op.as_str()),
                        ("phase", phase.as_str()),
                    ],
                );
                let quantiles = s.quantiles[i]
                    .iter()
                    .flat_map(|qs| QUANTILE_LABELS.into_iter().zip(qs.iter().copied()));
                lines.summary(&labels, quantiles, s.sum[i], s.count[i]);
            }
        }
    }
}
