//! PostgreSQL metrics, encoded from the collectors' latest snapshots. Series
//! of a cluster whose last scrape failed are absent (not stale values), but
//! `pgstorage_pg_up` and the exporter's own counters stay.

use super::Format;
use super::text::{counter_header, gauge_header, labels, sample};
use crate::postgres::ClusterSnapshot;

/// A per-cluster counter read from PostgreSQL.
struct Counter {
    base: &'static str,
    help: &'static str,
    get: fn(&ClusterSnapshot) -> Option<f64>,
}

fn wal(s: &ClusterSnapshot) -> Option<&crate::postgres::queries::WalStats> {
    s.stats.as_ref()?.wal.as_ref()
}

fn cp(s: &ClusterSnapshot) -> Option<&crate::postgres::queries::Checkpoints> {
    s.stats.as_ref()?.checkpoints.as_ref()
}

const COUNTERS: &[Counter] = &[
    Counter {
        base: "pgstorage_pg_wal_syncs",
        help: "WAL syncs done by PostgreSQL: pg_stat_wal.wal_sync up to 17, pg_stat_io object 'wal' context 'normal' fsyncs from 18",
        get: |s| wal(s)?.syncs,
    },
    Counter {
        base: "pgstorage_pg_wal_sync_seconds",
        help: "Seconds PostgreSQL spent in WAL syncs; absent while track_wal_io_timing is off",
        get: |s| wal(s)?.sync_seconds,
    },
    Counter {
        base: "pgstorage_pg_wal_writes",
        help: "WAL write calls done by PostgreSQL (pg_stat_wal up to 17, pg_stat_io object 'wal' from 18)",
        get: |s| wal(s)?.writes,
    },
    Counter {
        base: "pgstorage_pg_wal_write_seconds",
        help: "Seconds PostgreSQL spent writing WAL; absent while track_wal_io_timing is off",
        get: |s| wal(s)?.write_seconds,
    },
    Counter {
        base: "pgstorage_pg_wal_records",
        help: "WAL records generated (pg_stat_wal)",
        get: |s| wal(s)?.records,
    },
    Counter {
        base: "pgstorage_pg_wal_fpi",
        help: "WAL full-page images generated (pg_stat_wal)",
        get: |s| wal(s)?.fpi,
    },
    Counter {
        base: "pgstorage_pg_wal_bytes",
        help: "Bytes of WAL generated (pg_stat_wal)",
        get: |s| wal(s)?.bytes,
    },
    Counter {
        base: "pgstorage_pg_wal_buffers_full",
        help: "Times WAL had to be written because wal_buffers were full (pg_stat_wal)",
        get: |s| wal(s)?.buffers_full,
    },
    Counter {
        base: "pgstorage_pg_commits",
        help: "Transactions committed in all databases (pg_stat_database.xact_commit)",
        get: |s| s.stats.as_ref()?.commits,
    },
    Counter {
        base: "pgstorage_pg_rollbacks",
        help: "Transactions rolled back in all databases (pg_stat_database.xact_rollback)",
        get: |s| s.stats.as_ref()?.rollbacks,
    },
    Counter {
        base: "pgstorage_pg_checkpoint_write_seconds",
        help: "Seconds checkpoints spent writing buffers (pg_stat_bgwriter up to 16, pg_stat_checkpointer from 17)",
        get: |s| cp(s)?.write_seconds,
    },
    Counter {
        base: "pgstorage_pg_checkpoint_sync_seconds",
        help: "Seconds checkpoints spent syncing files",
        get: |s| cp(s)?.sync_seconds,
    },
    Counter {
        base: "pgstorage_pg_checkpoint_buffers_written",
        help: "Buffers written by checkpoints",
        get: |s| cp(s)?.buffers_written,
    },
    Counter {
        base: "pgstorage_pg_bgwriter_buffers_clean",
        help: "Buffers written by the background writer",
        get: |s| cp(s)?.bgwriter_buffers_clean,
    },
    Counter {
        base: "pgstorage_pg_bgwriter_maxwritten_clean",
        help: "Times the background writer stopped a round for writing too many buffers",
        get: |s| cp(s)?.bgwriter_maxwritten_clean,
    },
    Counter {
        base: "pgstorage_pg_buffers_alloc",
        help: "Buffers allocated (pg_stat_bgwriter)",
        get: |s| cp(s)?.buffers_alloc,
    },
    Counter {
        base: "pgstorage_pg_backend_buffers_written",
        help: "Buffers backends had to write themselves (pg_stat_bgwriter.buffers_backend, up to 16; see pg_stat_io from 16)",
        get: |s| cp(s)?.backend_buffers_written,
    },
    Counter {
        base: "pgstorage_pg_backend_fsyncs",
        help: "Fsyncs backends had to do themselves (pg_stat_bgwriter.buffers_backend_fsync, up to 16)",
        get: |s| cp(s)?.backend_fsyncs,
    },
];

pub fn encode(out: &mut String, format: Format, clusters: &[ClusterSnapshot]) {
    if clusters.is_empty() {
        return;
    }
    gauge_header(
        out,
        "pgstorage_pg_up",
        "1 when the last scrape of the cluster's statistics succeeded, 0 while it is unreachable",
    );
    for c in clusters {
        sample(
            out,
            "pgstorage_pg_up",
            &labels(&[("cluster", &c.name)]),
            if c.up { 1.0 } else { 0.0 },
        );
    }
    gauge_header(
        out,
        "pgstorage_pg_scrape_duration_seconds",
        "Time the last scrape of the cluster's statistics took (done by the collector, not at /metrics time)",
    );
    for c in clusters {
        if let Some(d) = c.scrape_seconds {
            sample(
                out,
                "pgstorage_pg_scrape_duration_seconds",
                &labels(&[("cluster", &c.name)]),
                d,
            );
        }
    }
    counter_header(
        out,
        format,
        "pgstorage_pg_scrape_errors",
        "Failed connections and queries by what failed (query: connect, settings, io, wal, database, checkpoints, waits, tablespaces) and why (cause: timeout, client_timeout, permission, undefined, auth, tls, connection, other)",
    );
    for c in clusters {
        for ((what, cause), n) in &c.errors {
            sample(
                out,
                "pgstorage_pg_scrape_errors_total",
                &labels(&[("cluster", &c.name), ("query", what), ("cause", cause)]),
                *n as f64,
            );
        }
    }
    gauge_header(
        out,
        "pgstorage_pg_info",
        "Always 1: the server version of the cluster",
    );
    for c in clusters {
        if let Some((num, text)) = &c.version {
            sample(
                out,
                "pgstorage_pg_info",
                &labels(&[
                    ("cluster", &c.name),
                    ("version", text),
                    ("server_version_num", &num.to_string()),
                ]),
                1.0,
            );
        }
    }
    gauge_header(
        out,
        "pgstorage_pg_setting",
        "IO-relevant settings with a numeric value, in base units (bytes, seconds; booleans 1/0)",
    );
    for c in clusters {
        for s in c.stats.iter().flat_map(|s| &s.settings) {
            if let Some(v) = s.numeric
                && crate::postgres::queries::exported_setting(&s.name)
            {
                sample(
                    out,
                    "pgstorage_pg_setting",
                    &labels(&[("cluster", &c.name), ("name", &s.name)]),
                    v,
                );
            }
        }
    }
    gauge_header(
        out,
        "pgstorage_pg_setting_info",
        "Always 1: IO-relevant settings as PostgreSQL shows them (wal_sync_method, synchronous_commit, io_method, ...)",
    );
    for c in clusters {
        for s in c.stats.iter().flat_map(|s| &s.settings) {
            if crate::postgres::queries::exported_setting(&s.name) {
                sample(
                    out,
                    "pgstorage_pg_setting_info",
                    &labels(&[("cluster", &c.name), ("name", &s.name), ("value", &s.value)]),
                    1.0,
                );
            }
        }
    }
    gauge_header(
        out,
        "pgstorage_pg_io_timing_enabled",
        "1 when PostgreSQL times IO (setting=track_io_timing) or WAL IO (setting=track_wal_io_timing); while 0 the matching *_seconds_total series are absent",
    );
    for c in clusters {
        for name in ["track_io_timing", "track_wal_io_timing"] {
            if let Some(s) = c.setting(name) {
                sample(
                    out,
                    "pgstorage_pg_io_timing_enabled",
                    &labels(&[("cluster", &c.name), ("setting", name)]),
                    if s.value == "on" { 1.0 } else { 0.0 },
                );
            }
        }
    }

    // pg_stat_io (16+).
    for (base, idx, help) in [
        (
            "pgstorage_pg_io_operations",
            1usize,
            "IO operations by backend type, object and context from pg_stat_io (16+); op = read, write, writeback, extend, hit, eviction, reuse, fsync",
        ),
        (
            "pgstorage_pg_io_seconds",
            2,
            "Seconds spent in IO operations from pg_stat_io (16+); absent while track_io_timing (track_wal_io_timing for object=wal) is off",
        ),
        (
            "pgstorage_pg_io_bytes",
            3,
            "Bytes moved by IO operations from pg_stat_io: *_bytes columns from 18, operations × op_bytes in 16 and 17",
        ),
    ] {
        counter_header(out, format, base, help);
        let name = format!("{base}_total");
        for c in clusters {
            for r in c.stats.iter().flat_map(|s| s.io.iter().flatten()) {
                for op in &r.ops {
                    let v = match idx {
                        1 => op.count,
                        2 => op.seconds,
                        _ => op.bytes,
                    };
                    if let Some(v) = v {
                        sample(
                            out,
                            &name,
                            &labels(&[
                                ("cluster", &c.name),
                                ("backend_type", &r.backend_type),
                                ("object", &r.object),
                                ("context", &r.context),
                                ("op", op.op),
                            ]),
                            v,
                        );
                    }
                }
            }
        }
    }

    for k in COUNTERS {
        counter_header(out, format, k.base, k.help);
        let name = format!("{}_total", k.base);
        for c in clusters {
            if let Some(v) = (k.get)(c) {
                sample(out, &name, &labels(&[("cluster", &c.name)]), v);
            }
        }
    }
    counter_header(
        out,
        format,
        "pgstorage_pg_checkpoints",
        "Checkpoints started, kind = timed or requested",
    );
    for c in clusters {
        if let Some(cp) = cp(c) {
            for (kind, v) in [("timed", cp.timed), ("requested", cp.requested)] {
                if let Some(v) = v {
                    sample(
                        out,
                        "pgstorage_pg_checkpoints_total",
                        &labels(&[("cluster", &c.name), ("kind", kind)]),
                        v,
                    );
                }
            }
        }
    }
    gauge_header(
        out,
        "pgstorage_pg_wal_sync_mean_seconds",
        "PostgreSQL's own mean WAL sync time over the window: Δ pgstorage_pg_wal_sync_seconds_total / Δ pgstorage_pg_wal_syncs_total",
    );
    for c in clusters {
        if let Some(m) = c.wal_sync_mean {
            sample(
                out,
                "pgstorage_pg_wal_sync_mean_seconds",
                &labels(&[("cluster", &c.name)]),
                m,
            );
        }
    }

    counter_header(
        out,
        format,
        "pgstorage_pg_wait_event_seconds",
        "Backend-seconds spent waiting, by wait event, estimated by sampling pg_stat_activity (idle client connections excluded); names as the server reports them (17 renamed e.g. WALSync to WalSync)",
    );
    for c in clusters {
        for ((t, e), v) in &c.waits.seconds {
            sample(
                out,
                "pgstorage_pg_wait_event_seconds_total",
                &labels(&[
                    ("cluster", &c.name),
                    ("wait_event_type", t),
                    ("wait_event", e),
                ]),
                *v,
            );
        }
    }
    gauge_header(
        out,
        "pgstorage_pg_backends_waiting",
        "Backends waiting in the latest sample, by wait event type",
    );
    for c in clusters {
        if c.up {
            for (t, n) in &c.waits.now {
                sample(
                    out,
                    "pgstorage_pg_backends_waiting",
                    &labels(&[("cluster", &c.name), ("wait_event_type", t)]),
                    *n as f64,
                );
            }
        }
    }
    gauge_header(
        out,
        "pgstorage_pg_wait_hidden_backends",
        "Backends (other roles' sessions, background processes) whose wait events the exporter's role could not see in the latest sample: it lacks pg_read_all_stats (pg_monitor); 0 when it sees everything",
    );
    for c in clusters {
        if c.up
            && let Some(n) = c.waits.hidden
        {
            sample(
                out,
                "pgstorage_pg_wait_hidden_backends",
                &labels(&[("cluster", &c.name)]),
                n as f64,
            );
        }
    }
    gauge_header(
        out,
        "pgstorage_cluster_volume_info",
        "Always 1: which probed volume holds which of the cluster's directories; role = data, wal or tablespace:<name>",
    );
    for c in clusters {
        for (v, role) in &c.volumes {
            sample(
                out,
                "pgstorage_cluster_volume_info",
                &labels(&[("cluster", &c.name), ("volume", v), ("role", role)]),
                1.0,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_their_cause_and_hidden_backends_show_while_up() {
        let mut c = ClusterSnapshot {
            name: "c".into(),
            up: true,
            ..Default::default()
        };
        c.errors.insert(("database", "timeout"), 3);
        c.errors.insert(("connect", "client_timeout"), 1);
        c.waits.hidden = Some(4);
        let mut out = String::new();
        encode(&mut out, Format::Prometheus, std::slice::from_ref(&c));
        for want in [
            "pgstorage_pg_scrape_errors_total{cluster=\"c\",query=\"database\",cause=\"timeout\"} 3\n",
            "pgstorage_pg_scrape_errors_total{cluster=\"c\",query=\"connect\",cause=\"client_timeout\"} 1\n",
            "pgstorage_pg_wait_hidden_backends{cluster=\"c\"} 4\n",
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
        // Down: no stale hidden count, the error counters stay.
        c.up = false;
        let mut out = String::new();
        encode(&mut out, Format::Prometheus, &[c]);
        assert!(!out.contains("pgstorage_pg_wait_hidden_backends{"), "{out}");
        assert!(out.contains("query=\"database\",cause=\"timeout\"} 3"));
    }
}
