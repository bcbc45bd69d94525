//! Constant metric families written through prometheus-client's
//! [`DescriptorEncoder`]: one escaping, one counter naming, one
//! OpenMetrics/Prometheus text switch for the families of a registry. A
//! leaf module: the exposition and the PostgreSQL views both write their
//! families with it.
//!
//! Values are computed from a snapshot at scrape time, so they are
//! "const" metrics in prometheus-client's sense ([`ConstGauge`],
//! [`ConstCounter`]); labels are arrays or slices of `(name, value)` pairs.
//!
//! The largest families are written line by line instead, by [`text`]:
//! the one other writer of exposition text, which takes its HELP and TYPE
//! lines from prometheus-client and is held to its output by tests.

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

pub(crate) mod text;

pub(crate) use prometheus_client::encoding::DescriptorEncoder as Encoder;
pub(crate) use text::Format;

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
}
