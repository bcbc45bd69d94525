//! WAL statistics: records, full-page images and bytes generated, and the
//! writes and syncs that put WAL on disk, with their time.
//!
//! pg_stat_wal exists from 14 and, up to 17, has everything. 18 removed its
//! wal_write, wal_sync, wal_write_time and wal_sync_time columns: WAL IO is
//! in pg_stat_io (object 'wal') from 18. There the syncs a commit waits for
//! are in context 'normal' ('init' is the creation of new segments), summed
//! over the backend types that write WAL.

use std::fmt;

use crate::families::Encoder;
use crate::postgres::db::{Db, QResult, ms_to_seconds};
use crate::postgres::snapshot::ClusterSnapshot;
use crate::postgres::views::rows::WalStats;

use crate::postgres::snapshot::{cluster_counter, cluster_gauge};

/// Up to 17: the whole row, write and sync figures included.
const SQL_UP_TO_17: &str = "SELECT wal_records::float8, wal_fpi::float8, wal_bytes::float8, \
     wal_buffers_full::float8, wal_write::float8, wal_sync::float8, wal_write_time::float8, \
     wal_sync_time::float8, extract(epoch FROM now() - stats_reset)::float8 FROM pg_stat_wal";

/// 18: what generating WAL left in pg_stat_wal...
const SQL_18: &str = "SELECT wal_records::float8, wal_fpi::float8, wal_bytes::float8, \
     wal_buffers_full::float8, extract(epoch FROM now() - stats_reset)::float8 FROM pg_stat_wal";

/// ... and the writes and syncs, from pg_stat_io.
const SQL_18_IO: &str = "SELECT sum(writes)::float8, sum(fsyncs)::float8, \
     sum(write_time)::float8, sum(fsync_time)::float8 \
     FROM pg_stat_io WHERE object = 'wal' AND context = 'normal'";

/// Where a server version keeps its WAL IO figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// Before 14: no pg_stat_wal.
    None,
    /// 14 to 17: pg_stat_wal alone.
    StatWal,
    /// 18+: pg_stat_wal and pg_stat_io object 'wal'.
    StatWalAndIo,
}

pub(crate) fn source(version: u32) -> Source {
    if version < 14_00_00 {
        Source::None
    } else if version < 18_00_00 {
        Source::StatWal
    } else {
        Source::StatWalAndIo
    }
}

/// WAL statistics; `None` on a server without pg_stat_wal. On 18 its two
/// statements go out together (the second [`Db::behind`] the first).
pub(crate) async fn read(c: Db<'_>, version: u32) -> QResult<Option<WalStats>> {
    let ms = ms_to_seconds;
    match source(version) {
        Source::None => Ok(None),
        Source::StatWal => {
            let r = c.query_one(SQL_UP_TO_17).await?;
            Ok(Some(WalStats {
                records: r.float(0),
                fpi: r.float(1),
                bytes: r.float(2),
                buffers_full: r.float(3),
                writes: r.float(4),
                syncs: r.float(5),
                write_seconds: ms(r.float(6)),
                sync_seconds: ms(r.float(7)),
                seconds_since_reset: r.float(8),
            }))
        }
        Source::StatWalAndIo => {
            let second = c.behind(1);
            let (r, io) = tokio::try_join!(c.query_one(SQL_18), second.query_one(SQL_18_IO))?;
            Ok(Some(WalStats {
                records: r.float(0),
                fpi: r.float(1),
                bytes: r.float(2),
                buffers_full: r.float(3),
                writes: io.float(0),
                syncs: io.float(1),
                write_seconds: ms(io.float(2)),
                sync_seconds: ms(io.float(3)),
                seconds_since_reset: r.float(4),
            }))
        }
    }
}

/// Drops the times unless `timing` (track_wal_io_timing): with it off
/// PostgreSQL reports 0, which would read as infinitely fast syncs.
pub(crate) fn keep_timed(w: Option<WalStats>, timing: bool) -> Option<WalStats> {
    w.map(|w| {
        if timing {
            w
        } else {
            WalStats {
                write_seconds: None,
                sync_seconds: None,
                ..w
            }
        }
    })
}

/// A per-cluster counter read from the WAL statistics.
struct Counter {
    base: &'static str,
    help: &'static str,
    get: fn(&WalStats) -> Option<f64>,
}

const COUNTERS: &[Counter] = &[
    Counter {
        base: "pgstorage_pg_wal_syncs",
        help: "WAL syncs done by PostgreSQL: pg_stat_wal.wal_sync up to 17, pg_stat_io object 'wal' context 'normal' fsyncs from 18",
        get: |w| w.syncs,
    },
    Counter {
        base: "pgstorage_pg_wal_sync_seconds",
        help: "Seconds PostgreSQL spent in WAL syncs; absent while track_wal_io_timing is off",
        get: |w| w.sync_seconds,
    },
    Counter {
        base: "pgstorage_pg_wal_writes",
        help: "WAL write calls done by PostgreSQL (pg_stat_wal up to 17, pg_stat_io object 'wal' from 18)",
        get: |w| w.writes,
    },
    Counter {
        base: "pgstorage_pg_wal_write_seconds",
        help: "Seconds PostgreSQL spent writing WAL; absent while track_wal_io_timing is off",
        get: |w| w.write_seconds,
    },
    Counter {
        base: "pgstorage_pg_wal_records",
        help: "WAL records generated (pg_stat_wal)",
        get: |w| w.records,
    },
    Counter {
        base: "pgstorage_pg_wal_fpi",
        help: "WAL full-page images generated (pg_stat_wal)",
        get: |w| w.fpi,
    },
    Counter {
        base: "pgstorage_pg_wal_bytes",
        help: "Bytes of WAL generated (pg_stat_wal)",
        get: |w| w.bytes,
    },
    Counter {
        base: "pgstorage_pg_wal_buffers_full",
        help: "Times WAL had to be written because wal_buffers were full (pg_stat_wal)",
        get: |w| w.buffers_full,
    },
];

fn wal(c: &ClusterSnapshot) -> Option<&WalStats> {
    c.stats.as_ref()?.wal.as_ref()
}

/// The WAL counters.
pub(crate) fn encode(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    for k in COUNTERS {
        cluster_counter(enc, k.base, k.help, clusters, |c| (k.get)(wal(c)?))?;
    }
    Ok(())
}

/// The mean sync time over the window, which the collector keeps from
/// successive readings of the sync counters.
pub(crate) fn encode_sync_mean(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    cluster_gauge(
        enc,
        "pgstorage_pg_wal_sync_mean_seconds",
        "PostgreSQL's own mean WAL sync time over the window: Δ pgstorage_pg_wal_sync_seconds_total / Δ pgstorage_pg_wal_syncs_total",
        clusters,
        |c| c.wal_sync_mean,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::PgStats;
    use crate::postgres::views::render;

    #[test]
    fn version_gate() {
        assert_eq!(source(130000), Source::None);
        assert_eq!(source(140000), Source::StatWal);
        assert_eq!(source(170004), Source::StatWal);
        assert_eq!(source(180000), Source::StatWalAndIo);
        assert_eq!(source(190000), Source::StatWalAndIo);
        // 18 has no write/sync columns in pg_stat_wal.
        assert!(!SQL_18.contains("wal_sync"));
        assert!(SQL_UP_TO_17.contains("wal_sync_time"));
    }

    #[test]
    fn counters_and_mean() {
        let c = ClusterSnapshot {
            name: "c".into(),
            up: true,
            stats: Some(std::sync::Arc::new(PgStats {
                wal: Some(WalStats {
                    syncs: Some(10.0),
                    records: Some(7.0),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            wal_sync_mean: Some(0.002),
            ..Default::default()
        };
        let both = |e: &mut Encoder<'_>, c: &[ClusterSnapshot]| -> fmt::Result {
            encode(e, c)?;
            encode_sync_mean(e, c)
        };
        let out = render(&[c], both);
        for want in [
            "pgstorage_pg_wal_syncs_total{cluster=\"c\"} 10.0\n",
            "pgstorage_pg_wal_records_total{cluster=\"c\"} 7.0\n",
            "pgstorage_pg_wal_sync_mean_seconds{cluster=\"c\"} 0.002\n",
            "# TYPE pgstorage_pg_wal_sync_seconds_total counter\n",
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
        assert!(
            !out.contains("pgstorage_pg_wal_sync_seconds_total{"),
            "{out}"
        );
    }
}
