//! Prometheus metrics: each component registers what it owns
//! (`register(&mut Registry) -> Self`), and scrapes only encode what is
//! already in memory. Nothing here does IO or waits on a disk.

pub mod buckets;
pub mod config;
pub mod derived;
pub mod limits;
pub mod postgres;
pub mod probe;
pub mod text;

use std::sync::Arc;

use prometheus_client::registry::Registry;

use crate::collectors::limits::LimitsState;
use crate::collectors::postgres::ClusterSet;
use crate::probe::set::VolumeSet;

pub const PREFIX: &str = "pgstorage";

/// Wire format of a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/openmetrics-text; version=1.0.0` (what Prometheus asks for).
    OpenMetrics,
    /// `text/plain; version=0.0.4` (curl, older scrapers).
    Prometheus,
}

impl Format {
    /// Picks the format from an HTTP `Accept` header.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// Everything the exporter exposes.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    volumes: Arc<VolumeSet>,
    clusters: Arc<ClusterSet>,
    limits: Arc<LimitsState>,
    config: config::ConfigMetrics,
    /// Length of the latest body, so the next one is allocated at its size
    /// once instead of grown (and copied) several times.
    last_len: std::sync::atomic::AtomicUsize,
}

impl Metrics {
    /// Builds the registry and the volume set whose probes feed it.
    pub fn new(
        window: std::time::Duration,
        roots: crate::probe::fsinfo::Roots,
    ) -> (Metrics, Arc<VolumeSet>) {
        let mut registry = Registry::default();
        let probe = probe::ProbeMetrics::register(&mut registry);
        let config = config::ConfigMetrics::register(&mut registry);
        registry.register_collector(Box::new(BuildInfo));
        let volumes = VolumeSet::new(window, probe, roots);
        (
            Metrics {
                registry,
                volumes: volumes.clone(),
                clusters: Arc::new(ClusterSet::default()),
                limits: Arc::new(LimitsState::default()),
                config,
                last_len: Default::default(),
            },
            volumes,
        )
    }

    pub fn clusters(&self) -> Arc<ClusterSet> {
        self.clusters.clone()
    }

    pub fn limits(&self) -> Arc<LimitsState> {
        self.limits.clone()
    }

    pub fn config(&self) -> config::ConfigMetrics {
        self.config.clone()
    }

    /// Encodes the current state. One snapshot per volume is taken, so all
    /// derived series of a scrape agree with each other.
    pub fn encode(&self, format: Format) -> Result<String, std::fmt::Error> {
        let now = std::time::Instant::now();
        let volumes = self.volumes.list();
        let snaps: Vec<_> = volumes
            .iter()
            .map(|v| (v.as_ref(), v.snapshot(now, &crate::model::WINDOW_QUANTILES)))
            .collect();
        let clusters = self.clusters.snapshots();
        let mut limits = self.limits.snapshot();
        limits.retain_current(
            &volumes.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
            &clusters.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        );
        let last = self.last_len.load(std::sync::atomic::Ordering::Relaxed);
        let mut out = String::with_capacity((last + last / 8).max(64 * 1024));
        match format {
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode_registry(&mut out, &self.registry)?;
                derived::encode(&mut out, &snaps, &clusters, &limits);
                postgres::encode(&mut out, format, &clusters);
                limits::encode(&mut out, format, &limits);
                prometheus_client::encoding::text::encode_eof(&mut out)?;
            }
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?;
                derived::encode(&mut out, &snaps, &clusters, &limits);
                postgres::encode(&mut out, format, &clusters);
                limits::encode(&mut out, format, &limits);
            }
        }
        self.last_len
            .store(out.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }
}

/// `pgstorage_build_info`: constant 1 with the version, for dashboards
/// that show which build produced a series.
#[derive(Debug)]
struct BuildInfo;

#[derive(Debug, Clone, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    target_arch: &'static str,
}

impl prometheus_client::collector::Collector for BuildInfo {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let mut m = encoder.encode_descriptor(
            "pgstorage_build_info",
            "Always 1; labels identify the exporter build.",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        let labels = BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
            target_arch: std::env::consts::ARCH,
        };
        m.encode_family(&labels)?.encode_gauge(&1i64)?;
        Ok(())
    }
}
