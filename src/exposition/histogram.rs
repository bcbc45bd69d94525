//! `pgstorage_probe_seconds`, the one histogram family, written line by
//! line through `families::text` with its `le` labels formatted once.
//!
//! Why not through prometheus-client like every other family: with 8
//! volumes the family is 64 histograms of 38 buckets, 2,432 lines, and the
//! crate formats each bucket's `le` bound as a float (Go's shortest form)
//! on every line of every scrape. Profiled at 2 clusters and 8 volumes,
//! that formatting alone was 17 % of the exporter's CPU during scrapes and
//! the histogram family half of the encode time. The bounds never change,
//! so they are formatted once, BY prometheus-client itself
//! (`text::le_labels`), and only the counts are written per scrape. The
//! unit test below holds the output to prometheus-client's, line for line,
//! in both formats.

use std::sync::{Arc, OnceLock};

use crate::families::Format;
use crate::families::text::{self, Kind, Lines};
use crate::model::buckets::probe_buckets;
use crate::probe::counts::HistogramSnapshot;
use crate::probe::state::{Snapshot, VolumeState};
use crate::types::{Op, Phase, SERIES, series};

pub(crate) const NAME: &str = "pgstorage_probe_seconds";
pub(crate) const HELP: &str = "Latency of probe operations in seconds, measured by the exporter's own \
    probe threads. op=write: 8 KiB write into the preallocated WAL probe file; op=sync: the \
    fdatasync/fsync after it; op=commit: write+sync, what one commit waits for; op=read: 8 KiB \
    O_DIRECT random read at queue depth 1. phase=busy: the recorded part of a burst of \
    back-to-back probes (every busy_every: the second half of its commits, or whole throttle \
    cycles where it met a throttle; its reads over an 8 ms span after a warm-up), what an IO costs while the storage is busy; \
    phase=after_idle: the lone probe of each interval, what an IO costs after a pause. \
    Always select a phase";

/// Each bucket's `le="..."` (+Inf last) in one format, formatted at first
/// use.
fn le(format: Format) -> &'static [String] {
    static PROM: OnceLock<Vec<String>> = OnceLock::new();
    static OM: OnceLock<Vec<String>> = OnceLock::new();
    let cell = match format {
        Format::Prometheus => &PROM,
        Format::OpenMetrics => &OM,
    };
    cell.get_or_init(|| {
        let mut bounds = probe_buckets().to_vec();
        bounds.push(f64::INFINITY);
        text::le_labels(format, &bounds)
    })
}

/// The `op="...",phase="..."` labels of each series, indexed by
/// [`series`], rendered once: with the volume's label they are a row's.
pub(super) fn series_labels() -> &'static [String; SERIES] {
    static LABELS: OnceLock<[String; SERIES]> = OnceLock::new();
    LABELS.get_or_init(|| {
        let mut labels = std::array::from_fn(|_| String::new());
        for op in Op::ALL {
            for phase in Phase::ALL {
                labels[series(op, phase)] =
                    text::label_text(&[("op", op.as_str()), ("phase", phase.as_str())]);
            }
        }
        labels
    })
}

/// Appends the family for every volume's histograms.
pub(crate) fn encode(
    out: &mut String,
    format: Format,
    volumes: &[(Arc<VolumeState>, Snapshot)],
    ops: &[Op],
) {
    let rows = volumes.iter().flat_map(|(v, s)| {
        ops.iter().flat_map(move |&op| {
            Phase::ALL.into_iter().filter_map(move |phase| {
                let h = s.histograms[series(op, phase)].as_ref()?;
                Some((v.name.as_str(), op, phase, h))
            })
        })
    });
    write_rows(out, format, rows);
}

/// (volume, op, phase, histogram)
type Row<'a> = (&'a str, Op, Phase, &'a HistogramSnapshot);

fn write_rows<'a>(out: &mut String, format: Format, rows: impl IntoIterator<Item = Row<'a>>) {
    let le = le(format);
    let mut lines = Lines::new(out, format, Kind::Histogram, NAME, HELP);
    // The volume's label escaped once for its rows.
    let (mut vol, mut vol_text) = (None, String::new());
    let mut labels = String::new();
    for (name, op, phase, h) in rows {
        if vol != Some(name) {
            vol = Some(name);
            vol_text = text::label_text(&[("volume", name)]);
        }
        labels.clone_from(&vol_text);
        text::push_label_text(&mut labels, &series_labels()[series(op, phase)]);
        let counts = h.buckets.iter().map(|(_, n)| *n);
        lines.histogram(&labels, le, counts, h.sum, h.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;
    use prometheus_client::encoding::DescriptorEncoder;
    use prometheus_client::registry::Registry;

    /// The family as prometheus-client's own encoder writes it.
    #[derive(Debug)]
    struct Reference(Vec<(Vec<(&'static str, &'static str)>, HistogramSnapshot)>);

    impl Collector for Reference {
        fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
            crate::families::histogram(
                &mut enc,
                NAME,
                HELP,
                self.0
                    .iter()
                    .map(|(l, h)| (l.clone(), h.sum, h.count, h.buckets.clone())),
            )
        }
    }

    /// The lines written with the pre-formatted `le` labels are
    /// prometheus-client's, in both formats.
    #[test]
    fn same_text_as_prometheus_client() {
        let mut buckets: Vec<(f64, u64)> = probe_buckets()
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .map(|b| (b, 0))
            .collect();
        buckets[3].1 = 2;
        buckets[10].1 = 5;
        buckets[37].1 = 1;
        let h = |sum| HistogramSnapshot {
            sum,
            count: 8,
            buckets: buckets.clone(),
        };
        let (a, b) = (h(0.125), h(3.5e-5));
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let mut r = Registry::default();
            r.register_collector(Box::new(Reference(vec![
                (
                    vec![("volume", "a\"b"), ("op", "commit"), ("phase", "busy")],
                    a.clone(),
                ),
                (
                    vec![
                        ("volume", "c/data"),
                        ("op", "read"),
                        ("phase", "after_idle"),
                    ],
                    b.clone(),
                ),
            ])));
            let mut want = String::new();
            text::registry(&mut want, format, &r).unwrap();
            let mut got = String::new();
            write_rows(
                &mut got,
                format,
                [
                    ("a\"b", Op::Commit, Phase::Busy, &a),
                    ("c/data", Op::Read, Phase::AfterIdle, &b),
                ],
            );
            assert_eq!(got, want, "{format:?}");
            assert_eq!(le(format).len(), 38);
        }
    }
}
