//! Constant metric families written through prometheus-client's
//! [`DescriptorEncoder`]: every series the exporter serves goes through
//! this one encoder (and so one escaping, one counter naming, one
//! OpenMetrics/Prometheus text switch). A leaf module: the exposition and
//! the PostgreSQL views both write their families with it.
//!
//! Values are computed from a snapshot at scrape time, so they are
//! "const" metrics in prometheus-client's sense ([`ConstGauge`],
//! [`ConstCounter`]); labels are arrays or slices of `(name, value)` pairs.
//!
//! [`counter_lines`] is the one exception, for the largest families: the
//! same text, written line by line with each row's repeated labels rendered
//! once (see there for why), and held to prometheus-client's output by a
//! test in both formats.

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

pub(crate) use prometheus_client::encoding::DescriptorEncoder as Encoder;

/// A gauge family. `name` is the full series name. With no rows the
/// family is still described (HELP/TYPE), so a dashboard can tell "no
/// series right now" from "this build has no such metric".
pub(crate) fn gauge<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, f64)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A counter family. `base` is the name without `_total`: prometheus-client
/// adds it to samples (and, in the Prometheus text format, to the family).
pub(crate) fn counter<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder<'_>,
    base: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, f64)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(base, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A histogram family from cumulative-by-encoder buckets: each row is
/// (labels, sum, count, [(upper bound, count in that bucket)]), bucket
/// counts not cumulative (the encoder accumulates them).
pub(crate) fn histogram<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, f64, u64, Vec<(f64, u64)>)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, sum, count, buckets) in rows {
        m.encode_family(&labels)?
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                sum, count, &buckets, None,
            )?;
    }
    Ok(())
}

/// Wire format of a scrape, for the registry and the families written line
/// by line alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `application/openmetrics-text; version=1.0.0` (what Prometheus asks for).
    OpenMetrics,
    /// `text/plain; version=0.0.4` (curl, older scrapers).
    Prometheus,
}

impl Format {
    /// Picks the format from an HTTP `Accept` header.
    pub(crate) fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// Appends `v` escaped as prometheus-client escapes a label value
/// (backslash, double quote, newline), which both formats require. The one
/// escaping of the families written by hand (these, the summary and the
/// probe histograms).
pub(crate) fn push_escaped(out: &mut String, v: &str) {
    let mut last = 0;
    for (i, b) in v.bytes().enumerate() {
        let e = match b {
            b'\\' => "\\\\",
            b'"' => "\\\"",
            b'\n' => "\\n",
            _ => continue,
        };
        out.push_str(&v[last..i]);
        out.push_str(e);
        last = i + 1;
    }
    out.push_str(&v[last..]);
}

/// Label pairs as they stand between the braces of a sample line,
/// `k="v",k2="v2"`, values escaped: a row's labels rendered once for all
/// its samples by [`counter_lines`].
pub(crate) fn label_text(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        push_escaped(&mut out, v);
        out.push('"');
    }
    out
}

/// The HELP and TYPE lines prometheus-client writes for a counter family
/// in one format (a render of the family with no sample).
fn counter_header(format: Format, base: &str, help: &str) -> String {
    #[derive(Debug)]
    struct Header(String, String);
    impl prometheus_client::collector::Collector for Header {
        fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
            counter(
                &mut enc,
                &self.0,
                &self.1,
                std::iter::empty::<([(&str, &str); 0], f64)>(),
            )
        }
    }
    let mut r = prometheus_client::registry::Registry::default();
    r.register_collector(Box::new(Header(base.to_string(), help.to_string())));
    render(format, &r)
}

/// A registry in one text format, as a String (no OpenMetrics `# EOF`):
/// the reference the line-by-line writers take their HELP/TYPE lines and
/// tests from.
pub(crate) fn render(format: Format, r: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = match format {
        Format::Prometheus => prometheus_client::encoding::prometheus_text::encode(&mut out, r),
        Format::OpenMetrics => prometheus_client::encoding::text::encode_registry(&mut out, r),
    };
    out
}

/// A counter family written line by line: the same text [`counter`]
/// writes (HELP and TYPE from prometheus-client itself, then
/// `<base>_total{<row labels>,<sample labels>} <value>` per sample), for
/// families of thousands of samples whose rows share most labels.
///
/// Why: prometheus-client writes every label of every sample as five small
/// writes and scans each value for characters to escape. pg_stat_io with
/// every row and op is ~1,700 samples of five labels each at 2 clusters,
/// and profiled at 2 clusters and 8 volumes it was half of a /metrics
/// render's CPU. Here a row's four shared labels are rendered and escaped
/// once ([`label_text`]) and each sample adds only its own label and value.
///
/// `samples` are (row labels from [`label_text`], the sample's own label
/// pairs, value); an empty family still gets its HELP and TYPE.
pub(crate) fn counter_lines<'a, const M: usize>(
    out: &mut String,
    format: Format,
    base: &str,
    help: &str,
    samples: impl IntoIterator<Item = (&'a str, [(&'a str, &'a str); M], f64)>,
) {
    out.push_str(&counter_header(format, base, help));
    let mut floats = dtoa::Buffer::new();
    for (row, own, v) in samples {
        out.push_str(base);
        out.push_str("_total{");
        out.push_str(row);
        for (i, (k, lv)) in own.iter().enumerate() {
            if i > 0 || !row.is_empty() {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            push_escaped(out, lv);
            out.push('"');
        }
        out.push_str("} ");
        // As prometheus-client writes a counter's f64 in each format.
        match format {
            Format::OpenMetrics => out.push_str(floats.format(v)),
            Format::Prometheus if v.is_finite() => out.push_str(floats.format_finite(v)),
            Format::Prometheus if v.is_nan() => out.push_str("NaN"),
            Format::Prometheus if v > 0.0 => out.push_str("+Inf"),
            Format::Prometheus => out.push_str("-Inf"),
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;
    use prometheus_client::registry::Registry;

    #[derive(Debug)]
    struct Two;

    impl Collector for Two {
        fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
            gauge(
                &mut enc,
                "x_ratio",
                "a gauge",
                [([("volume", "a\"b")], 0.5)],
            )?;
            counter(&mut enc, "x_errors", "a counter", [([("op", "read")], 3.0)])?;
            histogram(
                &mut enc,
                "x_seconds",
                "a histogram",
                [(
                    [("op", "read")],
                    0.3,
                    3,
                    vec![(0.1, 1), (1.0, 2), (f64::INFINITY, 0)],
                )],
            )
        }
    }

    #[test]
    fn families_in_both_text_formats() {
        let mut r = Registry::default();
        r.register_collector(Box::new(Two));
        let mut prom = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut prom, &r).unwrap();
        assert!(
            prom.contains("# TYPE x_ratio gauge\nx_ratio{volume=\"a\\\"b\"} 0.5\n"),
            "{prom}"
        );
        assert!(prom.contains("# TYPE x_errors_total counter\n"), "{prom}");
        assert!(prom.contains("x_errors_total{op=\"read\"} 3"), "{prom}");
        assert!(
            prom.contains("x_seconds_bucket{op=\"read\",le=\"1\"} 3"),
            "{prom}"
        );
        assert!(
            prom.contains("x_seconds_bucket{op=\"read\",le=\"+Inf\"} 3"),
            "{prom}"
        );
        let mut om = String::new();
        prometheus_client::encoding::text::encode(&mut om, &r).unwrap();
        assert!(om.contains("# TYPE x_errors counter\n"), "{om}");
        assert!(om.ends_with("# EOF\n"), "{om}");
    }

    /// [`counter_lines`] writes what [`counter`] writes, byte for byte, in
    /// both formats: escaped values, rows with and without shared labels,
    /// integral, fractional, large and non-finite values, an empty family.
    #[test]
    fn counter_lines_is_prometheus_clients_text() {
        type Rows = Vec<(
            Vec<(&'static str, &'static str)>,
            (&'static str, &'static str),
            f64,
        )>;
        let rows: Rows = vec![
            (
                vec![("cluster", "a\"b\\c\nd"), ("context", "normal")],
                ("op", "read"),
                3.0,
            ),
            (
                vec![("cluster", "a\"b\\c\nd"), ("context", "normal")],
                ("op", "x\"y"),
                0.125,
            ),
            (vec![("cluster", "p")], ("op", "write"), 1.5e17),
            (vec![], ("op", "fsync"), 0.0),
            (vec![("cluster", "p")], ("op", "nan"), f64::NAN),
            (vec![("cluster", "p")], ("op", "inf"), f64::INFINITY),
        ];
        #[derive(Debug)]
        struct Ref(Rows);
        impl Collector for Ref {
            fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
                counter(
                    &mut enc,
                    "x_ops",
                    "help with \\ and \n",
                    self.0.iter().map(|(row, own, v)| {
                        let mut l = row.clone();
                        l.push(*own);
                        (l, *v)
                    }),
                )?;
                counter(
                    &mut enc,
                    "x_empty",
                    "no rows",
                    std::iter::empty::<([(&str, &str); 1], f64)>(),
                )
            }
        }
        let mut r = Registry::default();
        r.register_collector(Box::new(Ref(rows.clone())));
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let mut want = String::new();
            match format {
                Format::Prometheus => {
                    prometheus_client::encoding::prometheus_text::encode(&mut want, &r).unwrap()
                }
                Format::OpenMetrics => {
                    prometheus_client::encoding::text::encode_registry(&mut want, &r).unwrap()
                }
            }
            let rendered: Vec<String> = rows.iter().map(|(row, _, _)| label_text(row)).collect();
            let mut got = String::new();
            counter_lines(
                &mut got,
                format,
                "x_ops",
                "help with \\ and \n",
                rows.iter()
                    .zip(&rendered)
                    .map(|((_, own, v), row)| (row.as_str(), [*own], *v)),
            );
            counter_lines(
                &mut got,
                format,
                "x_empty",
                "no rows",
                std::iter::empty::<(&str, [(&str, &str); 1], f64)>(),
            );
            assert_eq!(got, want, "{format:?}");
            assert!(
                got.contains(
                    "x_ops_total{cluster=\"a\\\"b\\\\c\\nd\",context=\"normal\",op=\"read\"} 3"
                ),
                "{got}"
            );
        }
    }
}
