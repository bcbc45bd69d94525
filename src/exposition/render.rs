//! `pgstorage_scrape_render_duration_seconds`: how long the exporter took
//! to encode a scrape body, from taking the snapshot to the last byte in
//! memory (no network, no gzip). Prometheus's own `scrape_duration_seconds`
//! adds the network, the compression and the scraper's side; this one is the
//! exporter's share alone, which is what grows with the number of volumes,
//! clusters and pg_stat_io rows.

use std::time::Duration;

use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// A render of 2 clusters and 8 volumes takes 0.3-0.9 ms on a small VM
/// (BENCHMARKS.md): buckets every 0.25-0.5 ms up to 2 ms, where such a
/// render and a "p99 under 2 ms" question live (a 0.5-1 ms bucket alone
/// read a 0.64 ms median as 0.75 ms), and a few coarse ones above for a
/// host that is starved of CPU.
pub(crate) const BUCKETS: [f64; 12] = [
    0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.1, 0.25,
];

/// Cheap to clone: all handles share the one histogram.
#[derive(Debug, Clone)]
pub(crate) struct RenderMetrics {
    seconds: Histogram,
}

impl RenderMetrics {
    pub(crate) fn register(registry: &mut Registry) -> RenderMetrics {
        let m = RenderMetrics {
            seconds: Histogram::new(BUCKETS),
        };
        registry.register(
            "pgstorage_scrape_render_duration_seconds",
            "Time to encode one /metrics body in memory (snapshot and text; no network, no \
             gzip), both formats together; concurrent scrapes share one render",
            m.seconds.clone(),
        );
        m
    }

    pub(crate) fn observe(&self, took: Duration) {
        self.seconds.observe(took.as_secs_f64());
    }
}
