//! Prometheus exposition: what `/metrics` serves. Nothing here does IO on a
//! probed disk or waits on PostgreSQL; a scrape encodes what is in memory.
//!
//! The long-lived registry holds the exporter's own counters (config
//! reloads), the build info and the process collector; each scrape adds
//! one [`Scrape`] collector over ONE [`ScrapeSnapshot`] of the volumes,
//! clusters and limits, so the quantiles, sample counts, ceilings and
//! PostgreSQL figures of a scrape always agree. Three kinds of family are
//! written line by line, after the registry, from the same snapshot: the
//! window summary ([`summary`]), the probe histograms ([`histogram`]) and
//! the three pg_stat_io families. All text, the registry's included, goes
//! through `families::text`, the one writer that takes HELP/TYPE lines
//! from prometheus-client and is held to its output by unit tests.

pub(crate) mod audit;
pub(crate) mod config;
pub(crate) mod connections;
pub(crate) mod derived;
pub(crate) mod ebs;
pub(crate) mod health;
pub(crate) mod histogram;
pub(crate) mod http_auth;
pub(crate) mod limits;
pub(crate) mod probe;
pub(crate) mod process;
pub(crate) mod render;
pub(crate) mod snapshot;
pub(crate) mod summary;
pub(crate) mod syncs;

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

pub(crate) use crate::families::Format;
use crate::families::text;
use crate::limits::LimitsState;
use crate::postgres::ClusterSet;
use crate::probe::set::VolumeSet;
use crate::types::{Collectors, Op};
pub(crate) use snapshot::ScrapeSnapshot;

/// Everything the exporter exposes. The daemon owns the volume set, the
/// cluster set and the limits state; this only reads them.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    volumes: Arc<VolumeSet>,
    clusters: Arc<ClusterSet>,
    limits: Arc<LimitsState>,
    audit: Arc<crate::audit::AuditState>,
    syncs: Arc<crate::ebpf::SyncState>,
    config: config::ConfigMetrics,
    connections: connections::ConnectionMetrics,
    render: render::RenderMetrics,
    /// Which probe ops are exposed: `probes.split` adds write and sync.
    ops: &'static [Op],
    /// The previous body's length: the next one is about as long, and
    /// growing a 500 KB String from a small start copies it several times.
    last_len: std::sync::atomic::AtomicUsize,
}

impl Metrics {
    pub(crate) fn new(
        volumes: Arc<VolumeSet>,
        clusters: Arc<ClusterSet>,
        limits: Arc<LimitsState>,
        collectors: Collectors,
    ) -> Metrics {
        let mut registry = Registry::default();
        let config = config::ConfigMetrics::register(&mut registry);
        let connections = connections::ConnectionMetrics::register(&mut registry);
        let render = render::RenderMetrics::register(&mut registry);
        registry.register_collector(Box::new(BuildInfo));
        registry.register_collector(Box::new(process::ProcessCollector::new()));
        Metrics {
            registry,
            volumes,
            clusters,
            limits,
            audit: Default::default(),
            syncs: Default::default(),
            config,
            connections,
            render,
            ops: exposed_ops(collectors),
            last_len: std::sync::atomic::AtomicUsize::new(64 * 1024),
        }
    }

    /// The audit's results, which the daemon's audit task writes.
    pub(crate) fn audit(&self) -> Arc<crate::audit::AuditState> {
        self.audit.clone()
    }

    /// What the `postgres.syncs` collector has, which its thread writes.
    pub(crate) fn syncs(&self) -> Arc<crate::ebpf::SyncState> {
        self.syncs.clone()
    }

    pub(crate) fn config(&self) -> config::ConfigMetrics {
        self.config.clone()
    }

    /// Registers the password-check families, which `http::auth` updates.
    /// Called only with a web configuration file: an exporter that can
    /// have no basic auth serves none of them.
    pub(crate) fn register_auth(&mut self) -> http_auth::AuthMetrics {
        http_auth::AuthMetrics::register(&mut self.registry)
    }

    /// The HTTP listeners' connection series, which the HTTP server writes.
    pub(crate) fn connections(&self) -> connections::ConnectionMetrics {
        self.connections.clone()
    }

    /// Takes the one snapshot a scrape encodes.
    pub(crate) fn snapshot(&self) -> ScrapeSnapshot {
        ScrapeSnapshot::take(
            &self.volumes,
            &self.clusters,
            &self.limits,
            &self.audit,
            &self.syncs,
        )
    }

    /// Encodes the current state into `out`, which is cleared first. A
    /// caller that hands back the previous body's buffer (see
    /// `http::Renders`) spares each render the allocation of a ~200 KB
    /// buffer and the free of the previous one: that free ran glibc's
    /// `malloc_consolidate`, about 2% of a scrape's CPU.
    pub(crate) fn encode_into(
        &self,
        out: &mut String,
        format: Format,
    ) -> Result<(), std::fmt::Error> {
        let began = std::time::Instant::now();
        out.clear();
        let snap = Arc::new(self.snapshot());
        let mut scrape = Registry::default();
        scrape.register_collector(Box::new(Scrape(snap.clone(), self.ops)));
        let last = self.last_len.load(std::sync::atomic::Ordering::Relaxed);
        out.reserve(last + last / 8);
        text::registry(out, format, &self.registry)?;
        text::registry(out, format, &scrape)?;
        crate::postgres::views::io::encode_lines(out, format, &snap.clusters);
        histogram::encode(out, format, &snap.volumes, self.ops);
        summary::encode(out, format, &snap.volumes, self.ops);
        text::finish(out, format)?;
        self.last_len
            .store(out.len(), std::sync::atomic::Ordering::Relaxed);
        // Observed after the body is complete, so it shows in the next
        // scrape: a render cannot time itself into its own body.
        self.render.observe(began.elapsed());
        Ok(())
    }
}

/// The per-scrape collector: every family computed from the snapshot.
#[derive(Debug)]
struct Scrape(Arc<ScrapeSnapshot>, &'static [Op]);

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        probe::encode(&mut enc, &s.volumes)?;
        derived::encode(&mut enc, &s.volumes, &s.clusters, &s.limits, self.1)?;
        crate::postgres::views::encode(&mut enc, &s.clusters)?;
        limits::encode(&mut enc, &s.limits)?;
        audit::encode(&mut enc, &s.audit)?;
        syncs::encode(&mut enc, &s.syncs)?;
        health::encode(&mut enc, s)
    }
}

/// The probe ops with latency series. `commit` (the durable step under
/// every sync method) and `read` always; `write` and `sync`, the two halves
/// of a commit, with `--collector.probes.split`: on a WAL volume they would
/// otherwise triple the commit probe's series.
pub(crate) fn exposed_ops(collectors: Collectors) -> &'static [Op] {
    if collectors.on(crate::types::Collector::ProbesSplit) {
        &Op::ALL
    } else {
        &[Op::Commit, Op::Read]
    }
}

/// `pgstorage_build_info`: constant 1 with the version, for dashboards
/// that show which build produced a series.
#[derive(Debug)]
struct BuildInfo;

impl Collector for BuildInfo {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        crate::families::gauge(
            &mut enc,
            "pgstorage_build_info",
            "Always 1; labels identify the exporter build.",
            [(
                [
                    ("version", env!("CARGO_PKG_VERSION")),
                    ("target_arch", std::env::consts::ARCH),
                ],
                1.0,
            )],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::views::rows::{IoOp, IoRow};
    use crate::postgres::{ClusterSnapshot, PgStats};
    use crate::probe::settings::{ProbeSettings, VolumeSpec};
    use crate::probe::state::VolumeState;
    use crate::types::Phase;

    /// 8 volumes, every op recorded 900 times in each phase.
    fn full_volumes() -> Vec<(Arc<VolumeState>, crate::probe::state::Snapshot)> {
        let now = std::time::Instant::now();
        (0..8)
            .map(|i| {
                let spec = VolumeSpec {
                    name: format!("pg{i}/data"),
                    path: format!("/srv/pg{i}").into(),
                    probe_dir: format!("/srv/pg{i}/probe").into(),
                    probe: ProbeSettings::default(),
                    provisioned: Vec::new(),
                    cgroup: None,
                };
                let window = std::time::Duration::from_secs(900);
                let v = Arc::new(VolumeState::new(&spec, window, Default::default()));
                for k in 0..900 {
                    for op in Op::ALL {
                        for phase in Phase::ALL {
                            v.record(op, phase, now, 1e-4 * f64::from(1 + k % 97));
                        }
                    }
                }
                let s = v.snapshot(now, &crate::model::WINDOW_QUANTILES);
                (v, s)
            })
            .collect()
    }

    /// 2 clusters of 48 pg_stat_io rows with every op.
    fn io_clusters() -> Vec<ClusterSnapshot> {
        let ops = [
            "read",
            "write",
            "writeback",
            "extend",
            "hit",
            "eviction",
            "reuse",
            "fsync",
        ];
        let mut rows = Vec::new();
        for backend_type in ["client backend", "autovacuum worker", "background writer"]
            .into_iter()
            .chain(["checkpointer", "walwriter", "background worker"])
        {
            for object in ["relation", "temp relation"] {
                for context in ["normal", "vacuum", "bulkread", "bulkwrite"] {
                    rows.push(IoRow {
                        backend_type: backend_type.into(),
                        object: object.into(),
                        context: context.into(),
                        ops: ops
                            .iter()
                            .map(|&op| IoOp {
                                op,
                                count: Some(12345.0),
                                seconds: Some(1.25),
                                bytes: Some(8192.0 * 12345.0),
                            })
                            .collect(),
                    });
                }
            }
        }
        ["pga", "pgb"]
            .into_iter()
            .map(|name| ClusterSnapshot {
                name: name.into(),
                up: true,
                stats: Some(Arc::new(PgStats {
                    io: Some(rows.clone()),
                    ..Default::default()
                })),
                ..Default::default()
            })
            .collect()
    }

    /// How long the families written line by line take on a large host: 8
    /// volumes with every op split and full windows, 2 clusters of 48
    /// pg_stat_io rows. A measurement to compare builds with, not a check:
    /// `cargo test --release --lib -- --ignored --nocapture line_by_line_render_time`.
    #[test]
    #[ignore]
    fn line_by_line_render_time() {
        let (volumes, clusters) = (full_volumes(), io_clusters());
        // Called through opaque pointers, out of line as `encode_into` calls
        // them: inlined into this loop, how they are optimised would change
        // from one build to the next and with it the figure.
        type Volumes<'a> = &'a [(Arc<VolumeState>, crate::probe::state::Snapshot)];
        let io: fn(&mut String, Format, &[ClusterSnapshot]) =
            crate::postgres::views::io::encode_lines;
        let hist: fn(&mut String, Format, Volumes, &[Op]) = histogram::encode;
        let summ: fn(&mut String, Format, Volumes, &[Op]) = summary::encode;
        let (io, hist, summ) = std::hint::black_box((io, hist, summ));
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let mut out = String::new();
            let mut took = Vec::new();
            for _ in 0..2000 {
                out.clear();
                let began = std::time::Instant::now();
                io(&mut out, format, &clusters);
                hist(&mut out, format, &volumes, &Op::ALL);
                summ(&mut out, format, &volumes, &Op::ALL);
                took.push(began.elapsed());
            }
            took.sort();
            let lines = out.lines().count();
            eprintln!(
                "{format:?}: {lines} lines, {} bytes; p10 {:?}, median {:?}, p90 {:?}",
                out.len(),
                took[200],
                took[1000],
                took[1800]
            );
        }
    }
}
