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

use crate::model::ceiling::commit_ceiling;
use crate::probe::state::{Snapshot, VolumeState};
use crate::types::Op;

const QUANTILE_LABELS: [&str; 5] = ["0.5", "0.9", "0.99", "0.999", "1"];

/// Escapes a label value (backslash, double quote, newline).
pub fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Appends the derived metric families for `snaps` to `out`.
pub fn encode(out: &mut String, snaps: &[(&VolumeState, Snapshot)]) {
    header(
        out,
        "pgstorage_probe_window_seconds",
        "summary",
        "Exact quantiles of probe latency over the sliding window (config key window, default \
         15m), in seconds; quantile=1 is the maximum. Computed from samples in memory at scrape \
         time; quantiles are absent while the window holds no sample. _sum and _count are \
         cumulative since start, as for any summary.",
    );
    for (v, s) in snaps {
        let vol = escape(&v.name);
        for op in Op::ALL {
            let i = op.index();
            if s.count[i] == 0 {
                continue;
            }
            if let Some(qs) = &s.quantiles[i] {
                for (label, value) in QUANTILE_LABELS.iter().zip(qs) {
                    let _ = writeln!(
                        out,
                        "pgstorage_probe_window_seconds{{volume=\"{vol}\",op=\"{op}\",quantile=\"{label}\"}} {value}"
                    );
                }
            }
            let _ = writeln!(
                out,
                "pgstorage_probe_window_seconds_sum{{volume=\"{vol}\",op=\"{op}\"}} {}",
                s.sum[i]
            );
            let _ = writeln!(
                out,
                "pgstorage_probe_window_seconds_count{{volume=\"{vol}\",op=\"{op}\"}} {}",
                s.count[i]
            );
        }
    }

    header(
        out,
        "pgstorage_probe_window_samples",
        "gauge",
        "Number of samples in the sliding window behind pgstorage_probe_window_seconds; a p99.9 \
         from fewer than 1000 samples is close to the maximum.",
    );
    for (v, s) in snaps {
        let vol = escape(&v.name);
        for op in Op::ALL {
            let n = s.samples[op.index()];
            if n > 0 {
                let _ = writeln!(
                    out,
                    "pgstorage_probe_window_samples{{volume=\"{vol}\",op=\"{op}\"}} {n}"
                );
            }
        }
    }

    header(
        out,
        "pgstorage_probe_in_flight_seconds",
        "gauge",
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

    header(
        out,
        "pgstorage_volume_info",
        "gauge",
        "Always 1: what is probed and how. device is the kernel block device (or the mount source \
         when there is none); engine is io_uring or sync (fallback), empty until the probe thread \
         has set up; sync_method follows PostgreSQL's wal_sync_method (empty without a commit probe).",
    );
    for (v, s) in snaps {
        let _ = writeln!(
            out,
            "pgstorage_volume_info{{volume=\"{}\",path=\"{}\",device=\"{}\",fstype=\"{}\",engine=\"{}\",sync_method=\"{}\"}} 1",
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
        );
    }

    header(
        out,
        "pgstorage_commit_ceiling_per_second",
        "gauge",
        "Most commits per second one client can do on this volume: 1 / commit probe latency (WAL \
         write + sync). basis=probe_p50 uses the window median, basis=probe_p99 the window p99. \
         Statement work and network round trips come on top; group commit lets many clients \
         together exceed it.",
    );
    for (v, s) in snaps {
        if let Some(qs) = &s.quantiles[Op::Commit.index()] {
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
