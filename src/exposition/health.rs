//! Collector health in the node_exporter style:
//! `pgstorage_collector_success{collector}` and
//! `pgstorage_collector_duration_seconds{collector}`, for each probe thread
//! (`probe:<volume>`), each PostgreSQL collector (`postgres:<cluster>`) and
//! the IO limits collector (`limits`). A collector that fails says so here
//! instead of its series just thinning out: a wrong `cgroup_root` is a
//! failed limits collector, not a disk without limits.

use crate::families::gauge;

use super::snapshot::ScrapeSnapshot;

type Enc<'a, 'b> = &'a mut prometheus_client::encoding::DescriptorEncoder<'b>;

/// Each collector of the snapshot: (collector, its latest run succeeded,
/// how long that run took if known), as `pgstorage_collector_success` and
/// `pgstorage_collector_duration_seconds` show them.
pub(crate) fn rows(s: &ScrapeSnapshot) -> Vec<(String, bool, Option<f64>)> {
    let mut rows: Vec<(String, bool, Option<f64>)> = Vec::new();
    for (v, snap) in &s.volumes {
        let (ok, seconds) = v.counts.last_run();
        // A probe still in flight past its timeout is a failing collector
        // even before it returns.
        let hung = snap.in_flight.is_some_and(|(_, age)| age > v.timeout);
        rows.push((format!("probe:{}", v.name), ok && !hung, seconds));
    }
    for c in &s.clusters {
        rows.push((format!("postgres:{}", c.name), c.up, c.scrape_seconds));
    }
    // postgres.syncs: off for a reason, or a watched cluster untraced.
    if s.syncs.running || s.syncs.off.is_some() {
        let ok = s.syncs.running && s.syncs.clusters.values().all(|c| c.traced.is_ok());
        rows.push(("postgres.syncs".to_string(), ok, None));
    }
    if let Some(ran) = &s.limits.last_run {
        rows.push((
            "limits".to_string(),
            ran.failed_reads == 0,
            Some(ran.seconds),
        ));
    }
    rows
}

pub(crate) fn encode(enc: Enc<'_, '_>, s: &ScrapeSnapshot) -> std::fmt::Result {
    let rows = rows(s);
    gauge(
        enc,
        "pgstorage_collector_success",
        "1 when the collector's latest run succeeded. probe:<volume>: the volume's latest \
         commit or read probe completed and none is in flight past its timeout; \
         postgres:<cluster>: the latest scrape of the cluster succeeded (as pgstorage_pg_up); \
         limits: every cgroup, /proc and /sys file the latest limits pass needed was read \
         (see pgstorage_limits_read_errors_total); postgres.syncs: the kernel tracing runs and \
         traces every watched cluster (see pgstorage_pg_sync_tracing for why not).",
        rows.iter()
            .map(|(c, ok, _)| ([("collector", c.as_str())], if *ok { 1.0 } else { 0.0 })),
    )?;
    gauge(
        enc,
        "pgstorage_collector_duration_seconds",
        "How long the collector's latest run took: the latest completed probe (commit or \
         read), the latest PostgreSQL scrape, the latest limits pass.",
        rows.iter()
            .filter_map(|(c, _, d)| d.map(|d| ([("collector", c.as_str())], d))),
    )
}
