//! pg_stat_io: IO operations, their time and bytes by backend type, object
//! and context.
//!
//! pg_stat_io exists from 16. In 16 and 17 bytes are operations × op_bytes
//! (BLCKSZ for every row that has bytes); 18 dropped op_bytes for
//! read_bytes, write_bytes and extend_bytes, because WAL rows (new in 18,
//! object 'wal') move variable amounts.

use crate::families::Format;
use crate::families::text::{Kind, Lines, label_text};
use crate::postgres::db::{Db, QResult, ms_to_seconds};
use crate::postgres::snapshot::ClusterSnapshot;
use crate::postgres::views::rows::{IoOp, IoRow};

fn op(op: &'static str, count: Option<f64>, seconds: Option<f64>, bytes: Option<f64>) -> IoOp {
    IoOp {
        op,
        count,
        seconds,
        bytes,
    }
}

/// The columns every version reads; then the read, write and extend bytes
/// (columns 16, 17 and 18).
macro_rules! io_sql {
    ($bytes:literal) => {
        concat!(
            "SELECT backend_type, object, context, \
             reads::float8, read_time::float8, writes::float8, write_time::float8, \
             writebacks::float8, writeback_time::float8, extends::float8, extend_time::float8, \
             hits::float8, evictions::float8, reuses::float8, fsyncs::float8, fsync_time::float8, ",
            $bytes,
            " FROM pg_stat_io"
        )
    };
}

/// The query for a server version; `None` before 16, which has no
/// pg_stat_io. A constant per version: the connection prepares it once.
pub(crate) fn sql(version: u32) -> Option<&'static str> {
    if version < 16_00_00 {
        None
    } else if version >= 18_00_00 {
        Some(io_sql!(
            "read_bytes::float8, write_bytes::float8, extend_bytes::float8"
        ))
    } else {
        Some(io_sql!(
            "(reads * op_bytes)::float8, (writes * op_bytes)::float8, (extends * op_bytes)::float8"
        ))
    }
}

/// The rows of pg_stat_io; `None` on a server without it.
pub(crate) async fn read(c: Db<'_>, version: u32) -> QResult<Option<Vec<IoRow>>> {
    let Some(sql) = sql(version) else {
        return Ok(None);
    };
    let rows = c.query(sql).await?;
    let ms = ms_to_seconds;
    Ok(Some(
        rows.iter()
            .filter_map(|r| {
                let f = |i| r.float(i);
                Some(IoRow {
                    backend_type: r.text(0)?.to_string(),
                    object: r.text(1)?.to_string(),
                    context: r.text(2)?.to_string(),
                    ops: vec![
                        op("read", f(3), ms(f(4)), f(16)),
                        op("write", f(5), ms(f(6)), f(17)),
                        op("writeback", f(7), ms(f(8)), None),
                        op("extend", f(9), ms(f(10)), f(18)),
                        op("hit", f(11), None, None),
                        op("eviction", f(12), None, None),
                        op("reuse", f(13), None, None),
                        op("fsync", f(14), ms(f(15)), None),
                    ],
                })
            })
            .collect(),
    ))
}

/// pg_stat_io's shared-buffer columns: a hit never reaches the storage, an
/// eviction or a reuse is the buffer pool making room (its write, if any,
/// is already counted under `write`).
pub(crate) const BUFFER_OPS: [&str; 3] = ["hit", "eviction", "reuse"];

/// Removes the [`BUFFER_OPS`] from every row (`--collector.postgres.io.buffers`
/// off). Done before [`drop_zero_rows`], so a row whose only activity is
/// buffer hits counts as all zero.
pub(crate) fn drop_buffer_ops(rows: &mut [IoRow]) {
    for r in rows {
        r.ops.retain(|o| !BUFFER_OPS.contains(&o.op));
    }
}

/// Drops the rows whose every counter (operations, time, bytes) is zero:
/// pg_stat_io has a row for every backend type, object and context
/// PostgreSQL could count, and on a typical primary most of them belong to
/// processes that never ran (walsender without replicas, slotsync and
/// walsummarizer workers, the startup process after a clean start). About
/// three in four rows are such on a server under pgbench. A row reappears
/// with its first non-zero counter; counters only grow (until
/// pg_stat_reset_shared), so a row, once shown, stays.
pub(crate) fn drop_zero_rows(mut rows: Vec<IoRow>) -> Vec<IoRow> {
    rows.retain(|r| {
        r.ops.iter().any(|o| {
            [o.count, o.seconds, o.bytes]
                .into_iter()
                .any(|v| v.is_some_and(|v| v != 0.0))
        })
    });
    rows
}

/// With timing off PostgreSQL reports 0 ms, not NULL: drop those times so
/// they are absent rather than a false zero. WAL rows follow
/// track_wal_io_timing, all others track_io_timing.
pub(crate) fn strip_untimed(mut rows: Vec<IoRow>, io_timing: bool, wal_timing: bool) -> Vec<IoRow> {
    for r in &mut rows {
        let timed = if r.object == "wal" {
            wal_timing
        } else {
            io_timing
        };
        if !timed {
            for op in &mut r.ops {
                op.seconds = None;
            }
        }
    }
    rows
}

/// Appends the three pg_stat_io families of all clusters (nothing with no
/// cluster configured, like every `pgstorage_pg_*` family). Written line by
/// line (`families::text`), not through the scrape's encoder: with every
/// row and op these are most of a large scrape's series, and each row's
/// four labels are rendered once for its up to 24 samples.
pub(crate) fn encode_lines(out: &mut String, format: Format, clusters: &[ClusterSnapshot]) {
    if clusters.is_empty() {
        return;
    }
    type Get = fn(&IoOp) -> Option<f64>;
    let families: [(&'static str, Get, &'static str); 3] = [
        (
            "pgstorage_pg_io_operations",
            |o| o.count,
            "IO operations by backend type, object and context from pg_stat_io (16+); op = read, write, writeback, extend, fsync (and hit, eviction, reuse with --collector.postgres.io.buffers); rows whose every counter is zero are left out unless --collector.postgres.io.zero-rows",
        ),
        (
            "pgstorage_pg_io_seconds",
            |o| o.seconds,
            "Seconds spent in IO operations from pg_stat_io (16+); absent while track_io_timing (track_wal_io_timing for object=wal) is off",
        ),
        (
            "pgstorage_pg_io_bytes",
            |o| o.bytes,
            "Bytes moved by IO operations from pg_stat_io: *_bytes columns from 18, operations × op_bytes in 16 and 17",
        ),
    ];
    let rows: Vec<(String, &IoRow)> = clusters
        .iter()
        .flat_map(|c| {
            let rows = c.stats.iter().flat_map(|s| s.io.iter().flatten());
            rows.map(|r| {
                let labels = label_text(&[
                    ("cluster", c.name.as_str()),
                    ("backend_type", r.backend_type.as_str()),
                    ("object", r.object.as_str()),
                    ("context", r.context.as_str()),
                ]);
                (labels, r)
            })
        })
        .collect();
    for (base, get, help) in families {
        let mut lines = Lines::new(out, format, Kind::Counter, base, help);
        for (labels, r) in &rows {
            for o in &r.ops {
                if let Some(v) = get(o) {
                    lines.counter(labels, &[("op", o.op)], v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::PgStats;

    #[test]
    fn version_gate() {
        assert_eq!(sql(150007), None);
        let v16 = sql(160000).unwrap_or_default();
        assert!(
            v16.contains("op_bytes") && !v16.contains("read_bytes"),
            "{v16}"
        );
        let v17 = sql(170004).unwrap_or_default();
        assert!(v17.contains("op_bytes"), "{v17}");
        let v18 = sql(180000).unwrap_or_default();
        assert!(
            v18.contains("read_bytes") && !v18.contains("op_bytes"),
            "{v18}"
        );
    }

    fn row(object: &str, seconds: Option<f64>) -> IoRow {
        IoRow {
            backend_type: "client backend".into(),
            object: object.into(),
            context: "normal".into(),
            ops: vec![
                op("read", Some(2.0), seconds, Some(16384.0)),
                op("hit", Some(9.0), None, None),
            ],
        }
    }

    #[test]
    fn untimed_rows_lose_their_times() {
        let rows = vec![row("relation", Some(0.0)), row("wal", Some(0.5))];
        let got = strip_untimed(rows.clone(), false, true);
        assert_eq!(got[0].ops[0].seconds, None);
        assert_eq!(got[1].ops[0].seconds, Some(0.5));
        let got = strip_untimed(rows, true, false);
        assert_eq!(got[0].ops[0].seconds, Some(0.0));
        assert_eq!(got[1].ops[0].seconds, None);
    }

    #[test]
    fn one_series_per_op_that_has_the_figure() {
        let c = ClusterSnapshot {
            name: "c".into(),
            up: true,
            stats: Some(std::sync::Arc::new(PgStats {
                io: Some(vec![row("relation", None)]),
                ..Default::default()
            })),
            ..Default::default()
        };
        let mut out = String::new();
        encode_lines(&mut out, Format::Prometheus, &[c]);
        let labels =
            "cluster=\"c\",backend_type=\"client backend\",object=\"relation\",context=\"normal\"";
        for want in [
            format!("pgstorage_pg_io_operations_total{{{labels},op=\"read\"}} 2.0\n"),
            format!("pgstorage_pg_io_operations_total{{{labels},op=\"hit\"}} 9.0\n"),
            format!("pgstorage_pg_io_bytes_total{{{labels},op=\"read\"}} 16384.0\n"),
            "# TYPE pgstorage_pg_io_seconds_total counter\n".to_string(),
        ] {
            assert!(out.contains(&want), "{want} missing from:\n{out}");
        }
        assert!(!out.contains("pgstorage_pg_io_seconds_total{"), "{out}");
        assert!(!out.contains("op=\"hit\"}} 0"), "{out}");
    }

    #[test]
    fn all_zero_rows_are_dropped_and_a_single_count_keeps_a_row() {
        let zero = |backend: &str, hits: Option<f64>| IoRow {
            backend_type: backend.into(),
            object: "relation".into(),
            context: "normal".into(),
            // NULL columns (ops PostgreSQL never counts in a context) and
            // zeros alike count as nothing.
            ops: vec![
                op("read", Some(0.0), Some(0.0), Some(0.0)),
                op("writeback", None, None, None),
                op("hit", hits, None, None),
            ],
        };
        let rows = vec![
            zero("walsender", Some(0.0)),
            zero("client backend", Some(1.0)),
            zero("slotsync worker", None),
            row("wal", Some(0.5)),
        ];
        let kept: Vec<_> = drop_zero_rows(rows)
            .into_iter()
            .map(|r| (r.backend_type, r.object))
            .collect();
        assert_eq!(
            kept,
            [
                ("client backend".to_string(), "relation".to_string()),
                ("client backend".to_string(), "wal".to_string())
            ]
        );
    }

    #[test]
    fn buffer_ops_go_first_so_a_hits_only_row_is_zero() {
        let mut rows = vec![IoRow {
            backend_type: "client backend".into(),
            object: "relation".into(),
            context: "bulkread".into(),
            ops: vec![
                op("read", Some(0.0), None, Some(0.0)),
                op("hit", Some(40.0), None, None),
                op("eviction", Some(3.0), None, None),
            ],
        }];
        drop_buffer_ops(&mut rows);
        assert_eq!(rows[0].ops.len(), 1);
        assert!(drop_zero_rows(rows).is_empty());
    }
}
