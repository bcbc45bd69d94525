//! Checkpoints and the background writer.
//!
//! Up to 16 pg_stat_bgwriter has both, plus buffers_backend and
//! buffers_backend_fsync (writes and fsyncs backends had to do
//! themselves). 17 moved the checkpoint columns to the new
//! pg_stat_checkpointer (renamed: checkpoints_timed → num_timed,
//! buffers_checkpoint → buffers_written, ...) and removed the backend
//! columns, which pg_stat_io (16+) covers.

use std::fmt;

use crate::families::{self, Encoder};
use crate::postgres::db::{Db, QResult, ms_to_seconds};
use crate::postgres::snapshot::ClusterSnapshot;
use crate::postgres::views::rows::Checkpoints;

use crate::postgres::snapshot::cluster_counter;

/// 14 to 16: everything in pg_stat_bgwriter.
const SQL_BGWRITER: &str = "SELECT checkpoints_timed::float8, checkpoints_req::float8, \
     checkpoint_write_time::float8, checkpoint_sync_time::float8, buffers_checkpoint::float8, \
     buffers_clean::float8, maxwritten_clean::float8, buffers_alloc::float8, \
     buffers_backend::float8, buffers_backend_fsync::float8 FROM pg_stat_bgwriter";

/// 17+: the checkpointer's own view...
const SQL_CHECKPOINTER: &str = "SELECT num_timed::float8, num_requested::float8, \
     write_time::float8, sync_time::float8, buffers_written::float8 FROM pg_stat_checkpointer";

/// ... and what is left in pg_stat_bgwriter.
const SQL_BGWRITER_17: &str = "SELECT buffers_clean::float8, maxwritten_clean::float8, \
     buffers_alloc::float8 FROM pg_stat_bgwriter";

/// Where a server version keeps its checkpoint statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// Before 14: not read (see `version::OLDEST`).
    None,
    /// 14 to 16.
    Bgwriter,
    /// 17+.
    Checkpointer,
}

pub(crate) fn source(version: u32) -> Source {
    if version < super::version::OLDEST {
        Source::None
    } else if version < 17_00_00 {
        Source::Bgwriter
    } else {
        Source::Checkpointer
    }
}

/// Checkpoint and background writer statistics; `None` on a server older
/// than 14. On 17+ its two statements go out together.
pub(crate) async fn read(c: Db<'_>, version: u32) -> QResult<Option<Checkpoints>> {
    let ms = ms_to_seconds;
    match source(version) {
        Source::None => Ok(None),
        Source::Bgwriter => {
            let r = c.query_one(SQL_BGWRITER).await?;
            Ok(Some(Checkpoints {
                timed: r.float(0),
                requested: r.float(1),
                write_seconds: ms(r.float(2)),
                sync_seconds: ms(r.float(3)),
                buffers_written: r.float(4),
                bgwriter_buffers_clean: r.float(5),
                bgwriter_maxwritten_clean: r.float(6),
                buffers_alloc: r.float(7),
                backend_buffers_written: r.float(8),
                backend_fsyncs: r.float(9),
            }))
        }
        Source::Checkpointer => {
            let second = c.behind(1);
            let (cp, bg) = tokio::try_join!(
                c.query_one(SQL_CHECKPOINTER),
                second.query_one(SQL_BGWRITER_17)
            )?;
            Ok(Some(Checkpoints {
                timed: cp.float(0),
                requested: cp.float(1),
                write_seconds: ms(cp.float(2)),
                sync_seconds: ms(cp.float(3)),
                buffers_written: cp.float(4),
                bgwriter_buffers_clean: bg.float(0),
                bgwriter_maxwritten_clean: bg.float(1),
                buffers_alloc: bg.float(2),
                backend_buffers_written: None,
                backend_fsyncs: None,
            }))
        }
    }
}

/// A per-cluster counter read from the checkpoint statistics.
struct Counter {
    base: &'static str,
    help: &'static str,
    get: fn(&Checkpoints) -> Option<f64>,
}

const COUNTERS: &[Counter] = &[
    Counter {
        base: "pgstorage_pg_checkpoint_write_seconds",
        help: "Seconds checkpoints spent writing buffers (pg_stat_bgwriter up to 16, pg_stat_checkpointer from 17)",
        get: |c| c.write_seconds,
    },
    Counter {
        base: "pgstorage_pg_checkpoint_sync_seconds",
        help: "Seconds checkpoints spent syncing files",
        get: |c| c.sync_seconds,
    },
    Counter {
        base: "pgstorage_pg_checkpoint_buffers_written",
        help: "Buffers written by checkpoints",
        get: |c| c.buffers_written,
    },
    Counter {
        base: "pgstorage_pg_bgwriter_buffers_clean",
        help: "Buffers written by the background writer",
        get: |c| c.bgwriter_buffers_clean,
    },
    Counter {
        base: "pgstorage_pg_bgwriter_maxwritten_clean",
        help: "Times the background writer stopped a round for writing too many buffers",
        get: |c| c.bgwriter_maxwritten_clean,
    },
    Counter {
        base: "pgstorage_pg_buffers_alloc",
        help: "Buffers allocated (pg_stat_bgwriter)",
        get: |c| c.buffers_alloc,
    },
    Counter {
        base: "pgstorage_pg_backend_buffers_written",
        help: "Buffers backends had to write themselves (pg_stat_bgwriter.buffers_backend, up to 16; see pg_stat_io from 16)",
        get: |c| c.backend_buffers_written,
    },
    Counter {
        base: "pgstorage_pg_backend_fsyncs",
        help: "Fsyncs backends had to do themselves (pg_stat_bgwriter.buffers_backend_fsync, up to 16)",
        get: |c| c.backend_fsyncs,
    },
];

fn checkpoints(c: &ClusterSnapshot) -> Option<&Checkpoints> {
    c.stats.as_ref()?.checkpoints.as_ref()
}

pub(crate) fn encode(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    for k in COUNTERS {
        cluster_counter(enc, k.base, k.help, clusters, |c| (k.get)(checkpoints(c)?))?;
    }
    families::counter(
        enc,
        "pgstorage_pg_checkpoints",
        "Checkpoints started, kind = timed or requested",
        clusters.iter().flat_map(|c| {
            let cp = checkpoints(c);
            [
                ("timed", cp.and_then(|p| p.timed)),
                ("requested", cp.and_then(|p| p.requested)),
            ]
            .into_iter()
            .filter_map(|(kind, v)| Some(([("cluster", c.name.as_str()), ("kind", kind)], v?)))
        }),
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
        assert_eq!(source(140000), Source::Bgwriter);
        assert_eq!(source(160004), Source::Bgwriter);
        assert_eq!(source(170000), Source::Checkpointer);
        assert_eq!(source(180000), Source::Checkpointer);
        // 17 removed the backend columns and the checkpoint ones from
        // pg_stat_bgwriter.
        assert!(!SQL_BGWRITER_17.contains("backend"));
        assert!(!SQL_BGWRITER_17.contains("checkpoint"));
    }

    #[test]
    fn kinds_and_counters_without_the_removed_columns() {
        let c = ClusterSnapshot {
            name: "c".into(),
            up: true,
            stats: Some(std::sync::Arc::new(PgStats {
                checkpoints: Some(Checkpoints {
                    timed: Some(3.0),
                    requested: Some(1.0),
                    buffers_alloc: Some(100.0),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            ..Default::default()
        };
        let out = render(&[c], encode);
        for want in [
            "pgstorage_pg_checkpoints_total{cluster=\"c\",kind=\"timed\"} 3.0\n",
            "pgstorage_pg_checkpoints_total{cluster=\"c\",kind=\"requested\"} 1.0\n",
            "pgstorage_pg_buffers_alloc_total{cluster=\"c\"} 100.0\n",
            "# TYPE pgstorage_pg_backend_fsyncs_total counter\n",
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
        assert!(!out.contains("pgstorage_pg_backend_fsyncs_total{"), "{out}");
    }
}
