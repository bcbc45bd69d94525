//! `pgstorage_probe_seconds`, the one histogram family, written with
//! pre-rendered bucket labels.
//!
//! Why not through prometheus-client like every other family: with 8
//! volumes the family is 64 histograms of 38 buckets, 2,432 lines, and the
//! crate formats each bucket's `le` bound as a float (Go's shortest form)
//! on every line of every scrape. Profiled at 2 clusters and 8 volumes,
//! that formatting alone was 17 % of the exporter's CPU during scrapes and
//! the histogram family half of the encode time. The bounds never change,
//! so they are formatted once, BY prometheus-client itself (a one-series
//! render in each text format at first use, from which the `le` labels and
//! the HELP/TYPE lines are taken), and only the counts are written per
//! scrape. The unit test below holds the output to prometheus-client's,
//! line for line, in both formats.

use std::fmt::Write;
use std::sync::{Arc, OnceLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use super::Format;
use super::summary::{escape, push_float};
use crate::model::buckets::probe_buckets;
use crate::probe::state::{Snapshot, VolumeState};
use crate::types::{Op, Phase};

pub(crate) const NAME: &str = "pgstorage_probe_seconds";
pub(crate) const HELP: &str = "Latency of probe operations in seconds, measured by the exporter's own \
    probe threads. op=write: 8 KiB write into the preallocated WAL probe file; op=sync: the \
    fdatasync/fsync after it; op=commit: write+sync, what one commit waits for; op=read: 8 KiB \
    O_DIRECT random read at queue depth 1. phase=busy: the recorded part of a burst of \
    back-to-back probes (every busy_every: the second half of its commits, or whole throttle \
    cycles where it met a throttle; its reads over an 8 ms span after a warm-up), what an IO costs while the storage is busy; \
    phase=after_idle: the lone probe of each interval, what an IO costs after a pause. \
    Always select a phase";

/// What prometheus-client writes for this family in one format, apart
/// from the counts: the HELP/TYPE lines and each bucket's `le="..."`.
#[derive(Debug)]
struct Rendered {
    header: String,
    le: Vec<String>,
}

/// The reference: the family through prometheus-client's own encoder.
#[derive(Debug)]
struct Reference(Vec<ReferenceRow>);

/// (labels, sum, count, per-bucket counts)
type ReferenceRow = (Vec<(String, String)>, f64, u64, Vec<(f64, u64)>);

impl Collector for Reference {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        crate::families::histogram(
            &mut enc,
            NAME,
            HELP,
            self.0
                .iter()
                .map(|(l, s, c, b)| (l.clone(), *s, *c, b.clone())),
        )
    }
}

fn reference(format: Format, rows: Reference) -> String {
    let mut r = Registry::default();
    r.register_collector(Box::new(rows));
    crate::families::render(format, &r)
}

fn rendered(format: Format) -> &'static Rendered {
    static PROM: OnceLock<Rendered> = OnceLock::new();
    static OM: OnceLock<Rendered> = OnceLock::new();
    let cell = match format {
        Format::Prometheus => &PROM,
        Format::OpenMetrics => &OM,
    };
    cell.get_or_init(|| {
        let bounds: Vec<(f64, u64)> = probe_buckets()
            .into_iter()
            .chain([f64::INFINITY])
            .map(|b| (b, 0))
            .collect();
        let text = reference(format, Reference(vec![(Vec::new(), 0.0, 0, bounds)]));
        let header = text
            .lines()
            .filter(|l| l.starts_with('#'))
            .fold(String::new(), |mut h, l| {
                h.push_str(l);
                h.push('\n');
                h
            });
        let le = text
            .lines()
            .filter(|l| l.contains("_bucket{"))
            .filter_map(|l| {
                let i = l.find("le=\"")?;
                let end = i + 4 + l[i + 4..].find('"')?;
                Some(l[i..=end].to_string())
            })
            .collect();
        Rendered { header, le }
    })
}

/// Appends the family for every volume's histograms.
pub(crate) fn encode(
    out: &mut String,
    format: Format,
    volumes: &[(Arc<VolumeState>, Snapshot)],
    ops: &[Op],
) {
    let names: Vec<String> = volumes.iter().map(|(v, _)| escape(&v.name)).collect();
    let rows = volumes.iter().zip(&names).flat_map(|((_, s), vol)| {
        ops.iter().flat_map(move |&op| {
            Phase::ALL.into_iter().filter_map(move |phase| {
                s.histograms[crate::types::series(op, phase)]
                    .clone()
                    .map(|h| {
                        (
                            vol.as_str(),
                            op.as_str(),
                            phase.as_str(),
                            h.sum,
                            h.count,
                            h.buckets,
                        )
                    })
            })
        })
    });
    write_rows(out, format, rows);
}

/// (escaped volume, op, phase, sum, count, per-bucket counts with +Inf last)
type Row<'a> = (
    &'a str,
    &'static str,
    &'static str,
    f64,
    u64,
    Vec<(f64, u64)>,
);

fn write_rows<'a>(out: &mut String, format: Format, rows: impl IntoIterator<Item = Row<'a>>) {
    let r = rendered(format);
    out.push_str(&r.header);
    let mut labels = String::new();
    let mut num = itoa::Buffer::new();
    let mut sum = String::new();
    let mut floats = dtoa::Buffer::new();
    for (vol, op, phase, s, count, buckets) in rows {
        labels.clear();
        let _ = write!(labels, "volume=\"{vol}\",op=\"{op}\",phase=\"{phase}\"");
        sum.clear();
        push_float(&mut sum, &mut floats, s);
        let line = |out: &mut String, what: &str, value: &str| {
            out.push_str(NAME);
            out.push_str(what);
            out.push('{');
            out.push_str(&labels);
            out.push_str("} ");
            out.push_str(value);
            out.push('\n');
        };
        // The two formats order the lines and the `le` label differently,
        // as prometheus-client writes them.
        if format == Format::OpenMetrics {
            line(out, "_sum", &sum);
            line(out, "_count", num.format(count));
        }
        let mut cumulative = 0u64;
        for ((_, n), le) in buckets.iter().zip(&r.le) {
            cumulative += n;
            out.push_str(NAME);
            out.push_str("_bucket{");
            if format == Format::OpenMetrics {
                out.push_str(le);
                out.push(',');
                out.push_str(&labels);
            } else {
                out.push_str(&labels);
                out.push(',');
                out.push_str(le);
            }
            out.push_str("} ");
            out.push_str(num.format(cumulative));
            out.push('\n');
        }
        if format == Format::Prometheus {
            line(out, "_sum", &sum);
            line(out, "_count", num.format(count));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written lines are prometheus-client's, in both formats.
    #[test]
    fn same_text_as_prometheus_client() {
        let bounds = probe_buckets();
        let mut buckets: Vec<(f64, u64)> = bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .map(|b| (b, 0))
            .collect();
        buckets[3].1 = 2;
        buckets[10].1 = 5;
        buckets[37].1 = 1;
        let labels = |vol: &str, op: &str, phase: &str| {
            vec![
                ("volume".to_string(), vol.to_string()),
                ("op".to_string(), op.to_string()),
                ("phase".to_string(), phase.to_string()),
            ]
        };
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let want = reference(
                format,
                Reference(vec![
                    (labels("a\"b", "commit", "busy"), 0.125, 8, buckets.clone()),
                    (
                        labels("c/data", "read", "after_idle"),
                        3.5e-5,
                        8,
                        buckets.clone(),
                    ),
                ]),
            );
            // The same rows through the hand encoder.
            let mut got = String::new();
            write_rows(
                &mut got,
                format,
                [
                    ("a\\\"b", "commit", "busy", 0.125, 8, buckets.clone()),
                    ("c/data", "read", "after_idle", 3.5e-5, 8, buckets.clone()),
                ],
            );
            let r = rendered(format);
            assert_eq!(got, want, "{format:?}");
            assert_eq!(r.le.len(), 38);
        }
    }
}
