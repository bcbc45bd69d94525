//! The window quantiles as a Prometheus summary, the one family written by
//! hand: prometheus-client has no summary type, and a gauge with a
//! `quantile` label is rejected by `promtool check metrics`; precomputed
//! quantiles over a window are exactly what the summary type means. The
//! lines use the syntax common to the Prometheus text format and
//! OpenMetrics, and label values are escaped as both require.

use std::fmt::Write;
use std::sync::Arc;

use crate::probe::state::{Snapshot, VolumeState};
use crate::types::{Op, Phase, series};

const QUANTILE_LABELS: [&str; 5] = ["0.5", "0.9", "0.99", "0.999", "1"];

/// Escapes a label value (backslash, double quote, newline).
pub(crate) fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    crate::families::push_escaped(&mut out, v);
    out
}

/// A sample value as prometheus-client writes one (dtoa, shortest form).
pub(super) fn push_float(out: &mut String, buf: &mut dtoa::Buffer, v: f64) {
    if v.is_finite() {
        out.push_str(buf.format_finite(v));
    } else {
        // Latencies are finite; keep the line valid anyway.
        out.push_str("NaN");
    }
}

fn summary_header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} summary");
}

/// Appends `pgstorage_probe_window_seconds` for every volume.
pub(crate) fn encode(out: &mut String, volumes: &[(Arc<VolumeState>, Snapshot)], ops: &[Op]) {
    summary_header(
        out,
        "pgstorage_probe_window_seconds",
        "Exact quantiles of probe latency over the sliding window (config key window, default \
         15m), in seconds; quantile=1 is the maximum. Computed from samples in memory at scrape \
         time; quantiles are absent while the window holds no sample. _sum and _count are \
         cumulative since start, as for any summary. phase=busy: the recorded part of each \
         burst of back-to-back probes (the second half of its commits, or whole throttle cycles \
         where it met a throttle; its reads over an 8 ms span after a warm-up); phase=after_idle: the lone probe of each interval.",
    );
    // Written with push_str and dtoa rather than format!: 8 volumes make
    // 448 lines of floats, and core::fmt's float path was a tenth of the
    // exporter's CPU during scrapes.
    const NAME: &str = "pgstorage_probe_window_seconds";
    let mut floats = dtoa::Buffer::new();
    let mut ints = itoa::Buffer::new();
    let mut labels = String::new();
    for (v, s) in volumes {
        let vol = escape(&v.name);
        for &op in ops {
            for phase in Phase::ALL {
                let i = series(op, phase);
                if s.count[i] == 0 {
                    continue;
                }
                labels.clear();
                labels.push_str("volume=\"");
                labels.push_str(&vol);
                labels.push_str("\",op=\"");
                labels.push_str(op.as_str());
                labels.push_str("\",phase=\"");
                labels.push_str(phase.as_str());
                labels.push('"');
                if let Some(qs) = &s.quantiles[i] {
                    for (label, value) in QUANTILE_LABELS.iter().zip(qs) {
                        out.push_str(NAME);
                        out.push('{');
                        out.push_str(&labels);
                        out.push_str(",quantile=\"");
                        out.push_str(label);
                        out.push_str("\"} ");
                        push_float(out, &mut floats, *value);
                        out.push('\n');
                    }
                }
                out.push_str(NAME);
                out.push_str("_sum{");
                out.push_str(&labels);
                out.push_str("} ");
                push_float(out, &mut floats, s.sum[i]);
                out.push('\n');
                out.push_str(NAME);
                out.push_str("_count{");
                out.push_str(&labels);
                out.push_str("} ");
                out.push_str(ints.format(s.count[i]));
                out.push('\n');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_label_values() {
        assert_eq!(escape(r#"/srv/a"b\c"#), r#"/srv/a\"b\\c"#);
        assert_eq!(escape("x\ny"), "x\\ny");
    }
}
