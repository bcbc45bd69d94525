//! One module per PostgreSQL view the collector reads: its SQL, which
//! server versions have which columns, the function that runs it through
//! [`Db`](super::db::Db), the encoder of its metric families and its tests;
//! the row types are in [`rows`], which the snapshot holds. [`encode`] writes every `pgstorage_pg_*` family (and
//! `pgstorage_cluster_volume_info`) from the cluster snapshots, except the
//! three pg_stat_io families, which the exposition appends with
//! [`io::encode_lines`] (the largest families, written line by line).
//!
//! PostgreSQL moved its IO statistics between views across versions:
//!
//! | what                  | 14, 15                 | 16                     | 17                         | 18+                              |
//! |-----------------------|------------------------|------------------------|----------------------------|----------------------------------|
//! | IO by backend/context | none                   | pg_stat_io (op_bytes)  | pg_stat_io (op_bytes)      | pg_stat_io (*_bytes, object wal) |
//! | WAL syncs and time    | pg_stat_wal            | pg_stat_wal            | pg_stat_wal                | pg_stat_io object='wal'          |
//! | checkpoints           | pg_stat_bgwriter       | pg_stat_bgwriter       | pg_stat_checkpointer       | pg_stat_checkpointer             |
//!
//! Series of a cluster whose last scrape failed are absent (its statistics
//! are cleared, not kept stale), but `pgstorage_pg_up` and the exporter's
//! own counters stay. Every family is described (HELP/TYPE) as soon as one
//! cluster is configured, also with no series, so a dashboard can tell "no
//! series right now" from "not a metric of this build"; with no cluster
//! configured none is written.

pub(crate) mod activity;
pub(crate) mod checkpoints;
pub(crate) mod database;
pub(crate) mod io;
pub(crate) mod round_trip;
pub(crate) mod rows;
pub(crate) mod settings;
pub(crate) mod tablespaces;
pub(crate) mod version;
pub(crate) mod wal;

use std::fmt;

use crate::families::{self, Encoder};

use super::snapshot::{ClusterSnapshot, cluster_gauge};

/// Writes the PostgreSQL families of all clusters.
pub(crate) fn encode(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    if clusters.is_empty() {
        return Ok(());
    }
    encode_collector(enc, clusters)?;
    version::encode(enc, clusters)?;
    settings::encode(enc, clusters)?;
    wal::encode(enc, clusters)?;
    database::encode(enc, clusters)?;
    checkpoints::encode(enc, clusters)?;
    wal::encode_sync_mean(enc, clusters)?;
    round_trip::encode(enc, clusters)?;
    activity::encode(enc, clusters)?;
    tablespaces::encode(enc, clusters)
}

/// The collector's own view of each cluster: reachable, how long the last
/// scrape took, what failed.
fn encode_collector(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    cluster_gauge(
        enc,
        "pgstorage_pg_up",
        "1 when the last scrape of the cluster's statistics succeeded, 0 while it is unreachable",
        clusters,
        |c| Some(if c.up { 1.0 } else { 0.0 }),
    )?;
    cluster_gauge(
        enc,
        "pgstorage_pg_scrape_duration_seconds",
        "Time the last scrape of the cluster's statistics took (done by the collector, not at /metrics time)",
        clusters,
        |c| c.scrape_seconds,
    )?;
    families::counter(
        enc,
        "pgstorage_pg_scrape_errors",
        "Failed connections and queries by what failed (query: connect, settings, io, wal, database, checkpoints, round_trip, waits, tablespaces) and why (cause: timeout, client_timeout, permission, undefined, auth, tls, connection, other)",
        clusters.iter().flat_map(|c| {
            c.errors.iter().map(|((what, cause), n)| {
                (
                    [
                        ("cluster", c.name.as_str()),
                        ("query", what),
                        ("cause", cause),
                    ],
                    *n as f64,
                )
            })
        }),
    )
}

/// Renders an encoder in the Prometheus text format, for the views' tests.
#[cfg(test)]
pub(crate) fn render(
    clusters: &[ClusterSnapshot],
    f: fn(&mut Encoder<'_>, &[ClusterSnapshot]) -> fmt::Result,
) -> String {
    #[derive(Debug)]
    struct One(
        Vec<ClusterSnapshot>,
        fn(&mut Encoder<'_>, &[ClusterSnapshot]) -> fmt::Result,
    );
    impl prometheus_client::collector::Collector for One {
        fn encode(&self, mut enc: Encoder<'_>) -> fmt::Result {
            (self.1)(&mut enc, &self.0)
        }
    }
    let mut r = prometheus_client::registry::Registry::default();
    r.register_collector(Box::new(One(clusters.to_vec(), f)));
    let mut out = String::new();
    match prometheus_client::encoding::prometheus_text::encode(&mut out, &r) {
        Ok(()) => out,
        Err(e) => format!("encoding failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str, up: bool) -> ClusterSnapshot {
        ClusterSnapshot {
            name: name.into(),
            up,
            ..Default::default()
        }
    }

    #[test]
    fn nothing_without_clusters() {
        assert_eq!(render(&[], encode), "");
        let mut io = String::new();
        io::encode_lines(&mut io, families::Format::Prometheus, &[]);
        assert_eq!(io, "");
    }

    #[test]
    fn every_family_is_described_even_without_series() {
        // A cluster never reached: up is 0, every other family is bare.
        let mut out = render(&[cluster("c", false)], encode);
        io::encode_lines(
            &mut out,
            families::Format::Prometheus,
            &[cluster("c", false)],
        );
        assert!(
            out.contains("pgstorage_pg_up{cluster=\"c\"} 0.0\n"),
            "{out}"
        );
        for family in [
            "pgstorage_pg_scrape_errors_total counter",
            "pgstorage_pg_info gauge",
            "pgstorage_pg_setting gauge",
            "pgstorage_pg_io_operations_total counter",
            "pgstorage_pg_wal_syncs_total counter",
            "pgstorage_pg_commits_total counter",
            "pgstorage_pg_checkpoints_total counter",
            "pgstorage_pg_backend_fsyncs_total counter",
            "pgstorage_pg_wal_sync_mean_seconds gauge",
            "pgstorage_pg_wait_hidden_backends gauge",
            "pgstorage_cluster_volume_info gauge",
        ] {
            assert!(
                out.contains(&format!("# TYPE {family}\n")),
                "{family}:\n{out}"
            );
        }
        let samples = out.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(samples, 1, "{out}");
    }

    #[test]
    fn errors_carry_their_cause_and_hidden_backends_show_while_up() {
        let mut c = cluster("c", true);
        c.errors.insert(("database", "timeout"), 3);
        c.errors.insert(("connect", "client_timeout"), 1);
        std::sync::Arc::make_mut(&mut c.waits).hidden = Some(4);
        let out = render(std::slice::from_ref(&c), encode);
        for want in [
            "pgstorage_pg_scrape_errors_total{cluster=\"c\",query=\"database\",cause=\"timeout\"} 3.0\n",
            "pgstorage_pg_scrape_errors_total{cluster=\"c\",query=\"connect\",cause=\"client_timeout\"} 1.0\n",
            "pgstorage_pg_wait_hidden_backends{cluster=\"c\"} 4.0\n",
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
        // Down: no stale hidden count, the error counters stay.
        c.up = false;
        let out = render(&[c], encode);
        assert!(!out.contains("pgstorage_pg_wait_hidden_backends{"), "{out}");
        assert!(out.contains("query=\"database\",cause=\"timeout\"} 3.0"));
    }
}

#[cfg(test)]
mod protocols;
