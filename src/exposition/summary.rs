//! The window quantiles as a Prometheus summary: prometheus-client has no
//! summary type, and a gauge with a `quantile` label is rejected by
//! `promtool check metrics`; precomputed quantiles over a window are
//! exactly what the summary type means. Written by `families::text`, like
//! the other families written line by line.

use std::sync::Arc;

use crate::families::Format;
use crate::families::text::{Kind, Lines, label_text, push_label_text};
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
    let quantile_labels = QUANTILE_LABELS.map(|q| label_text(&[("quantile", q)]));
    let mut labels = String::new();
    for (v, s) in volumes {
        let vol = label_text(&[("volume", v.name.as_str())]);
        for &op in ops {
            for phase in Phase::ALL {
                let i = series(op, phase);
                if s.count[i] == 0 {
                    continue;
                }
                labels.clone_from(&vol);
                push_label_text(&mut labels, &super::histogram::series_labels()[i]);
                let quantiles = s.quantiles[i].iter().flat_map(|qs| {
                    quantile_labels
                        .iter()
                        .map(String::as_str)
                        .zip(qs.iter().copied())
                });
                lines.summary(&labels, quantiles, s.sum[i], s.count[i]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::settings::{ProbeSettings, VolumeSpec};

    /// Each row is the volume's escaped label, then op and phase, then the
    /// quantile; a series without any sample is left out.
    #[test]
    fn rows_in_both_formats() {
        let spec = VolumeSpec {
            name: "a\"b".into(),
            path: "/srv/a".into(),
            probe_dir: "/srv/a/probe".into(),
            probe: ProbeSettings::default(),
            provisioned: Vec::new(),
            cgroup: None,
        };
        let window = std::time::Duration::from_secs(60);
        let v = Arc::new(VolumeState::new(&spec, window, Default::default()));
        let now = std::time::Instant::now();
        for s in [0.001, 0.002, 0.004] {
            v.record(Op::Commit, Phase::Busy, now, s);
        }
        let snap = v.snapshot(now, &crate::model::WINDOW_QUANTILES);
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let mut out = String::new();
            encode(
                &mut out,
                format,
                &[(v.clone(), snap.clone())],
                &[Op::Commit],
            );
            let labels = r#"volume="a\"b",op="commit",phase="busy""#;
            for want in [
                format!("# TYPE {NAME} summary\n"),
                format!("{NAME}{{{labels},quantile=\"0.5\"}} 0.002\n"),
                format!("{NAME}{{{labels},quantile=\"1\"}} 0.004\n"),
                format!("{NAME}_sum{{{labels}}} 0.007\n"),
                format!("{NAME}_count{{{labels}}} 3\n"),
            ] {
                assert!(
                    out.contains(&want),
                    "{format:?}: {want} missing from\n{out}"
                );
            }
            assert!(!out.contains("phase=\"after_idle\""), "{out}");
            assert_eq!(out.lines().count(), 2 + 5 + 2, "{out}");
        }
    }
}
