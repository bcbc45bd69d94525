//! pg_stat_database: transactions committed and rolled back, summed over
//! all databases: commits are what the WAL syncs serve, whichever database
//! they were in. xact_commit and xact_rollback are the same in every
//! supported version.
//!
//! With them, the next transaction id (`pg_current_snapshot()`'s xmax,
//! from 13): how many transactions wrote. Only those flush a commit
//! record; xact_commit also counts every read-only transaction (the
//! exporter's own queries among them). The `postgres` commit ceiling basis
//! compares it with the WAL syncs to tell one commit per sync from group
//! commit. None on a standby, where no transaction commits.

use std::fmt;

use crate::families::Encoder;
use crate::postgres::db::{Db, QResult};
use crate::postgres::snapshot::ClusterSnapshot;
use crate::postgres::views::rows::Transactions;

use crate::postgres::snapshot::cluster_counter;

const SQL: &str = "SELECT sum(xact_commit)::float8, sum(xact_rollback)::float8, \
     CASE WHEN pg_is_in_recovery() THEN NULL \
     ELSE pg_snapshot_xmax(pg_current_snapshot())::text::float8 END \
     FROM pg_stat_database";

/// The size of every database the role may connect to: what bounds the
/// full-page images a checkpoint cycle writes (one per page at most). A
/// pg_monitor role may size them all (pg_read_all_stats).
const SIZE_SQL: &str = "SELECT sum(pg_database_size(oid))::float8 FROM pg_database \
     WHERE has_database_privilege(oid, 'CONNECT')";

pub(crate) async fn size(c: Db<'_>) -> QResult<Option<f64>> {
    let r = c.query_one(SIZE_SQL).await?;
    Ok(r.float(0))
}

pub(crate) async fn read(c: Db<'_>) -> QResult<Transactions> {
    let r = c.query_one(SQL).await?;
    Ok(Transactions {
        commits: r.float(0),
        rollbacks: r.float(1),
        next_xid: r.float(2),
    })
}

fn transactions(c: &ClusterSnapshot) -> Option<&Transactions> {
    c.stats.as_ref()?.transactions.as_ref()
}

pub(crate) fn encode(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    cluster_counter(
        enc,
        "pgstorage_pg_commits",
        "Transactions committed in all databases (pg_stat_database.xact_commit)",
        clusters,
        |c| transactions(c)?.commits,
    )?;
    cluster_counter(
        enc,
        "pgstorage_pg_rollbacks",
        "Transactions rolled back in all databases (pg_stat_database.xact_rollback)",
        clusters,
        |c| transactions(c)?.rollbacks,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::PgStats;
    use crate::postgres::views::render;

    #[test]
    fn commits_and_rollbacks_per_cluster() {
        let up = ClusterSnapshot {
            name: "a".into(),
            up: true,
            stats: Some(std::sync::Arc::new(PgStats {
                transactions: Some(Transactions {
                    commits: Some(5.0),
                    rollbacks: None,
                    next_xid: Some(900.0),
                }),
                ..Default::default()
            })),
            ..Default::default()
        };
        let down = ClusterSnapshot {
            name: "b".into(),
            ..Default::default()
        };
        let out = render(&[up, down], encode);
        assert!(
            out.contains("pgstorage_pg_commits_total{cluster=\"a\"} 5.0\n"),
            "{out}"
        );
        assert!(
            out.contains("# TYPE pgstorage_pg_rollbacks_total counter\n"),
            "{out}"
        );
        assert!(!out.contains("pgstorage_pg_rollbacks_total{"), "{out}");
        assert!(!out.contains("cluster=\"b\""), "{out}");
    }
}
