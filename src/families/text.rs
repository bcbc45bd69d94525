//! The exposition text of the families written line by line, and the one
//! place that turns a registry into text. Beside prometheus-client's own
//! encoder (the collectors of [`super`]) nothing else writes `/metrics`
//! text: the pg_stat_io counters, the probe histograms and the window
//! summary all go through [`Lines`].
//!
//! Why line by line at all: those families are most of a large scrape's
//! lines, and prometheus-client writes every label of every sample as small
//! writes, scans each value for characters to escape and formats each
//! histogram bound as a float on every line of every scrape (the profiles
//! are in `postgres::views::io` and `exposition::histogram`). Here a row's
//! labels are escaped once for all its samples and the `le` labels once
//! per process.
//!
//! What must not drift from prometheus-client is taken from it rather than
//! written again: the HELP and TYPE lines ([`Lines::new`]: a render of the
//! family without samples, so the help text is escaped, and a counter's
//! `_total` placed, as the crate does it in each format) and the `le`
//! labels ([`le_labels`]). The rest (label escaping, each format's float
//! form, the order of a histogram's lines) is held to the crate's output
//! byte for byte by the tests below, in both formats.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

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

/// Appends a registry's families in one format (without OpenMetrics'
/// `# EOF`: [`finish`] ends the body).
pub(crate) fn registry(out: &mut String, format: Format, r: &Registry) -> fmt::Result {
    match format {
        Format::Prometheus => prometheus_client::encoding::prometheus_text::encode(out, r),
        Format::OpenMetrics => prometheus_client::encoding::text::encode_registry(out, r),
    }
}

/// Ends a body: OpenMetrics requires its `# EOF` line, the Prometheus text
/// format has none.
pub(crate) fn finish(out: &mut String, format: Format) -> fmt::Result {
    match format {
        Format::Prometheus => Ok(()),
        Format::OpenMetrics => prometheus_client::encoding::text::encode_eof(out),
    }
}

/// A family's type, as its TYPE line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `name` is the base: samples and the Prometheus-format family get `_total`.
    Counter,
    Histogram,
    /// prometheus-client has no summary type (and a gauge with a `quantile`
    /// label is rejected by `promtool check metrics`): its gauge header with
    /// the type word changed.
    Summary,
}

/// A family's descriptor alone, as prometheus-client writes it.
#[derive(Debug)]
struct Descriptor {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
}

impl Collector for Descriptor {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        enc.encode_descriptor(self.name, self.help, None, self.kind)
            .map(drop)
    }
}

/// Appends the HELP and TYPE lines of a family with no samples, by
/// prometheus-client.
fn header(out: &mut String, format: Format, kind: Kind, name: &'static str, help: &'static str) {
    let mut r = Registry::default();
    r.register_collector(Box::new(Descriptor {
        name,
        help,
        kind: match kind {
            Kind::Counter => MetricType::Counter,
            Kind::Summary => MetricType::Gauge,
            Kind::Histogram => MetricType::Histogram,
        },
    }));
    // Writing into a String cannot fail.
    let _ = registry(out, format, &r);
    if kind == Kind::Summary && out.ends_with(" gauge\n") {
        out.truncate(out.len() - "gauge\n".len());
        out.push_str("summary\n");
    }
}

/// The `le="..."` label of each bound (+Inf last), as prometheus-client
/// writes it in one format: Go's shortest float in the Prometheus text
/// format, the crate's float form in OpenMetrics. Taken from a render of a
/// one-series histogram, so a caller can format its bounds once.
pub(crate) fn le_labels(format: Format, bounds: &[f64]) -> Vec<String> {
    #[derive(Debug)]
    struct Bounds(Vec<(f64, u64)>);
    impl Collector for Bounds {
        fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
            let no_labels: [(&str, &str); 0] = [];
            let mut m = enc.encode_descriptor("x", "", None, MetricType::Histogram)?;
            m.encode_family(&no_labels)?
                .encode_histogram::<NoLabelSet>(0.0, 0, &self.0, None)
        }
    }
    let mut r = Registry::default();
    r.register_collector(Box::new(Bounds(bounds.iter().map(|b| (*b, 0)).collect())));
    let mut text = String::new();
    let _ = registry(&mut text, format, &r);
    text.lines()
        .filter(|l| l.starts_with("x_bucket{"))
        .filter_map(|l| {
            let i = l.find("le=\"")?;
            let end = i + 4 + l[i + 4..].find('"')?;
            Some(l[i..=end].to_string())
        })
        .collect()
}

/// Appends `v` escaped as prometheus-client escapes a label value
/// (backslash, double quote, newline), which both formats require.
fn push_escaped(out: &mut String, v: &str) {
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

/// Appends label pairs to a label text (what stands between a sample
/// line's braces, `k="v",k2="v2"`), after a comma if it holds labels
/// already, values escaped: a row's labels, rendered once for all its
/// samples.
pub(crate) fn push_labels(out: &mut String, pairs: &[(&str, &str)]) {
    for (k, v) in pairs {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        push_escaped(out, v);
        out.push('"');
    }
}

/// Appends a label text rendered earlier (by [`push_labels`]) to another,
/// after a comma if both hold labels: a row's labels put together from
/// parts rendered once for many rows.
pub(crate) fn push_label_text(out: &mut String, text: &str) {
    if !out.is_empty() && !text.is_empty() {
        out.push(',');
    }
    out.push_str(text);
}

/// [`push_labels`] into a new String.
pub(crate) fn label_text(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    push_labels(&mut out, pairs);
    out
}

/// Appends an f64 sample value as prometheus-client writes a counter's,
/// gauge's or histogram sum's in each format (they differ only for NaN and
/// the infinities).
#[inline(always)]
fn push_float(out: &mut String, buf: &mut dtoa::Buffer, format: Format, v: f64) {
    match format {
        Format::OpenMetrics => out.push_str(buf.format(v)),
        Format::Prometheus if v.is_finite() => out.push_str(buf.format_finite(v)),
        Format::Prometheus if v.is_nan() => out.push_str("NaN"),
        Format::Prometheus if v > 0.0 => out.push_str("+Inf"),
        Format::Prometheus => out.push_str("-Inf"),
    }
}

/// One family written line by line: its HELP and TYPE when made (so a
/// family without rows is still described, and a dashboard can tell "no
/// series now" from "no such metric"), then its samples. Row labels are
/// text from [`push_labels`] or [`label_text`].
pub(crate) struct Lines<'o> {
    out: &'o mut String,
    format: Format,
    name: &'static str,
    floats: dtoa::Buffer,
    ints: itoa::Buffer,
    /// A histogram row's text before and after each bucket's `le`, a
    /// summary row's before each quantile.
    head: String,
    tail: String,
}

impl fmt::Debug for Lines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lines")
            .field("format", &self.format)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<'o> Lines<'o> {
    pub(crate) fn new(
        out: &'o mut String,
        format: Format,
        kind: Kind,
        name: &'static str,
        help: &'static str,
    ) -> Lines<'o> {
        header(out, format, kind, name, help);
        Lines {
            out,
            format,
            name,
            floats: dtoa::Buffer::new(),
            ints: itoa::Buffer::new(),
            head: String::new(),
            tail: String::new(),
        }
    }

    /// `<name><suffix>{<labels>} `, without braces when there are no
    /// labels, as prometheus-client writes such a sample.
    #[inline(always)]
    fn start(&mut self, suffix: &str, labels: &str) {
        let out = &mut *self.out;
        out.push_str(self.name);
        out.push_str(suffix);
        if !labels.is_empty() {
            out.push('{');
            out.push_str(labels);
            out.push('}');
        }
        out.push(' ');
    }

    /// A histogram's or summary's `_sum`.
    #[inline(always)]
    fn sum(&mut self, labels: &str, v: f64) {
        self.start("_sum", labels);
        push_float(self.out, &mut self.floats, self.format, v);
        self.out.push('\n');
    }

    /// A histogram's or summary's `_count`.
    #[inline(always)]
    fn count(&mut self, labels: &str, n: u64) {
        self.start("_count", labels);
        self.out.push_str(self.ints.format(n));
        self.out.push('\n');
    }

    /// A counter sample, `<name>_total{<row>,<own>} <v>`: the row's shared
    /// labels as text, the sample's own as pairs (escaped here).
    #[inline(always)]
    pub(crate) fn counter(&mut self, row: &str, own: &[(&str, &str)], v: f64) {
        let out = &mut *self.out;
        out.push_str(self.name);
        out.push_str("_total");
        let mut open = !row.is_empty();
        if open {
            out.push('{');
            out.push_str(row);
        }
        for (k, lv) in own {
            out.push(if open { ',' } else { '{' });
            open = true;
            out.push_str(k);
            out.push_str("=\"");
            push_escaped(out, lv);
            out.push('"');
        }
        if open {
            out.push('}');
        }
        out.push(' ');
        push_float(out, &mut self.floats, self.format, v);
        out.push('\n');
    }

    /// One histogram: `counts` per bucket (not cumulative) in the order of
    /// `le` (from [`le_labels`], +Inf last), then its sum and count, in the
    /// line and label order prometheus-client uses in each format.
    pub(crate) fn histogram(
        &mut self,
        labels: &str,
        le: &[String],
        counts: impl IntoIterator<Item = u64>,
        sum: f64,
        count: u64,
    ) {
        let om = self.format == Format::OpenMetrics;
        if om {
            self.sum(labels, sum);
            self.count(labels, count);
        }
        // What every bucket line of the row has before and after its `le`,
        // built once for the row's 38 lines: `<name>_bucket{<labels>,` and
        // `} ` in the Prometheus text format, `<name>_bucket{` and
        // `,<labels>} ` in OpenMetrics (which puts `le` first).
        let (head, tail) = (&mut self.head, &mut self.tail);
        head.clear();
        head.push_str(self.name);
        head.push_str("_bucket{");
        tail.clear();
        match (om, labels.is_empty()) {
            (_, true) => {}
            (false, false) => {
                head.push_str(labels);
                head.push(',');
            }
            (true, false) => {
                tail.push(',');
                tail.push_str(labels);
            }
        }
        tail.push_str("} ");
        let mut cumulative = 0u64;
        for (n, le) in counts.into_iter().zip(le) {
            cumulative += n;
            self.out.push_str(head);
            self.out.push_str(le);
            self.out.push_str(tail);
            self.out.push_str(self.ints.format(cumulative));
            self.out.push('\n');
        }
        if !om {
            self.sum(labels, sum);
            self.count(labels, count);
        }
    }

    /// One summary: a sample per (`quantile="..."` label text, value),
    /// then its sum and count. The quantile labels are text from
    /// [`label_text`], rendered once for all rows.
    pub(crate) fn summary<'q>(
        &mut self,
        labels: &str,
        quantiles: impl IntoIterator<Item = (&'q str, f64)>,
        sum: f64,
        count: u64,
    ) {
        // As for a histogram's buckets: `<name>{<labels>,` built once.
        let head = &mut self.head;
        head.clear();
        head.push_str(self.name);
        head.push('{');
        if !labels.is_empty() {
            head.push_str(labels);
            head.push(',');
        }
        for (quantile, v) in quantiles {
            self.out.push_str(head);
            self.out.push_str(quantile);
            self.out.push_str("} ");
            push_float(self.out, &mut self.floats, self.format, v);
            self.out.push('\n');
        }
        self.sum(labels, sum);
        self.count(labels, count);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{counter, gauge, histogram};
    use super::*;

    const FORMATS: [Format; 2] = [Format::Prometheus, Format::OpenMetrics];

    /// A label value and a help text with everything either format escapes.
    const TRICKY: &str = "a\"b\\c\nd";
    const HELP: &str = "help with \\, \" and \n";

    /// What prometheus-client writes for the families `f` encodes.
    fn reference(
        format: Format,
        f: impl Fn(&mut DescriptorEncoder) -> fmt::Result + Send + Sync + 'static,
    ) -> String {
        struct F<T>(T);
        impl<T> fmt::Debug for F<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("F")
            }
        }
        impl<T: Fn(&mut DescriptorEncoder) -> fmt::Result + Send + Sync + 'static> Collector for F<T> {
            fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
                (self.0)(&mut enc)
            }
        }
        let mut r = Registry::default();
        r.register_collector(Box::new(F(f)));
        let mut out = String::new();
        registry(&mut out, format, &r).unwrap();
        out
    }

    /// Values whose text differs between forms: integral, fractional,
    /// large, tiny, negative zero, NaN and both infinities.
    const VALUES: [f64; 9] = [
        3.0,
        0.125,
        1.5e17,
        3.5e-5,
        -0.0,
        0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ];

    /// Counters: rows with and without shared labels, escaped values in
    /// both the row and the sample's own labels, every kind of value, and
    /// an empty family.
    #[test]
    fn counters_are_prometheus_clients_text() {
        type Row = (
            Vec<(&'static str, &'static str)>,
            (&'static str, &'static str),
            f64,
        );
        let mut rows: Vec<Row> = VALUES
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let row = match i % 3 {
                    0 => vec![("cluster", TRICKY), ("context", "normal")],
                    1 => vec![("cluster", "p")],
                    _ => vec![],
                };
                (row, ("op", ["read", "x\"y", "w\\\n"][i % 3]), *v)
            })
            .collect();
        rows.push((vec![("cluster", "p")], ("op", ""), 1.0));
        for format in FORMATS {
            let rs = rows.clone();
            let want = reference(format, move |enc| {
                counter(
                    enc,
                    "x_ops",
                    HELP,
                    rs.iter().map(|(row, own, v)| {
                        let mut l = row.clone();
                        l.push(*own);
                        (l, *v)
                    }),
                )?;
                counter(
                    enc,
                    "x_empty",
                    "no rows",
                    std::iter::empty::<([(&str, &str); 1], f64)>(),
                )?;
                counter(enc, "x_bare", "no labels", [([] as [(&str, &str); 0], 2.0)])
            });
            let mut got = String::new();
            let mut f = Lines::new(&mut got, format, Kind::Counter, "x_ops", HELP);
            for (row, own, v) in &rows {
                f.counter(&label_text(row), &[*own], *v);
            }
            Lines::new(&mut got, format, Kind::Counter, "x_empty", "no rows");
            Lines::new(&mut got, format, Kind::Counter, "x_bare", "no labels").counter(
                "",
                &[],
                2.0,
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

    /// Histograms: escaped labels, a row without labels, bounds whose text
    /// differs between the formats, non-finite sums, an empty family.
    #[test]
    fn histograms_are_prometheus_clients_text() {
        let bounds = [1e-5, 0.000_215, 0.1, 1.0, 2.5, 1e6, 1.5e7, f64::INFINITY];
        let counts = [2u64, 0, 5, 0, 1, 0, 0, 3];
        type Row = (Vec<(&'static str, &'static str)>, f64, u64);
        let rows: Vec<Row> = vec![
            (vec![("volume", TRICKY), ("op", "commit")], 0.125, 11),
            (vec![], 3.5e-5, 11),
            (vec![("volume", "v")], f64::NAN, 11),
            (vec![("volume", "w")], f64::INFINITY, 11),
        ];
        for format in FORMATS {
            let rs = rows.clone();
            let want = reference(format, move |enc| {
                let b: Vec<(f64, u64)> = bounds.iter().copied().zip(counts).collect();
                histogram(
                    enc,
                    "x_seconds",
                    HELP,
                    rs.iter().map(|(l, s, c)| (l.clone(), *s, *c, b.clone())),
                )?;
                histogram(
                    enc,
                    "x_empty_seconds",
                    "",
                    std::iter::empty::<([(&str, &str); 0], f64, u64, Vec<(f64, u64)>)>(),
                )
            });
            let le = le_labels(format, &bounds);
            assert_eq!(le.len(), bounds.len(), "{le:?}");
            let mut got = String::new();
            let mut f = Lines::new(&mut got, format, Kind::Histogram, "x_seconds", HELP);
            for (l, s, c) in &rows {
                f.histogram(&label_text(l), &le, counts, *s, *c);
            }
            Lines::new(&mut got, format, Kind::Histogram, "x_empty_seconds", "");
            assert_eq!(got, want, "{format:?}");
        }
    }

    /// A summary is prometheus-client's gauge text with the type word
    /// changed: the same HELP escaping, and its quantile samples are the
    /// gauge samples of the same labels, every kind of value included. Then
    /// its sum and count.
    #[test]
    fn summaries_are_prometheus_clients_gauge_text() {
        let q = [
            "0.5", "0.9", "0.99", "0.999", "1", "0.1", "0.2", "0.3", "0.4",
        ];
        for format in FORMATS {
            let gauge_text = reference(format, move |enc| {
                gauge(
                    enc,
                    "x_window_seconds",
                    HELP,
                    q.iter()
                        .zip(VALUES)
                        .map(|(q, v)| ([("volume", TRICKY), ("quantile", q)], v)),
                )
            });
            let mut got = String::new();
            let labels = label_text(&[("volume", TRICKY)]);
            let mut f = Lines::new(&mut got, format, Kind::Summary, "x_window_seconds", HELP);
            let q: Vec<String> = q.iter().map(|q| label_text(&[("quantile", q)])).collect();
            f.summary(&labels, q.iter().map(String::as_str).zip(VALUES), 1.5, 4);
            f.summary("", [], 0.0, 0);
            let want = gauge_text.replacen(
                "# TYPE x_window_seconds gauge\n",
                "# TYPE x_window_seconds summary\n",
                1,
            ) + &format!(
                "x_window_seconds_sum{{{labels}}} 1.5\n\
                 x_window_seconds_count{{{labels}}} 4\n\
                 x_window_seconds_sum 0.0\n\
                 x_window_seconds_count 0\n"
            );
            assert_eq!(got, want, "{format:?}");
            assert!(
                got.contains("{volume=\"a\\\"b\\\\c\\nd\",quantile=\"0.5\"} 3.0\n"),
                "{got}"
            );
        }
    }

    #[test]
    fn a_body_ends_as_each_format_requires() {
        let mut r = Registry::default();
        r.register_collector(Box::new(Descriptor {
            name: "x",
            help: "h",
            kind: MetricType::Gauge,
        }));
        for format in FORMATS {
            let mut got = String::new();
            registry(&mut got, format, &r).unwrap();
            finish(&mut got, format).unwrap();
            let mut want = String::new();
            match format {
                Format::Prometheus => {
                    prometheus_client::encoding::prometheus_text::encode(&mut want, &r).unwrap()
                }
                Format::OpenMetrics => {
                    prometheus_client::encoding::text::encode(&mut want, &r).unwrap()
                }
            }
            assert_eq!(got, want, "{format:?}");
        }
    }
}
