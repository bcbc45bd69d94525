//! pg_tablespace: where the cluster's tablespaces live, for volume
//! discovery, and which probed volume holds which of the cluster's
//! directories (`pgstorage_cluster_volume_info`).
//!
//! pg_tablespace_location() gives '' for pg_default and pg_global (they
//! are inside the data directory) and the symlink target for the others,
//! the same in every supported version.

use std::fmt;

use crate::families::{self, Encoder};
use crate::postgres::db::{Db, QResult};
use crate::postgres::snapshot::ClusterSnapshot;

const SQL: &str = "SELECT spcname::text, pg_tablespace_location(oid) FROM pg_tablespace \
     WHERE pg_tablespace_location(oid) <> '' ORDER BY 1";

/// (name, location) of each tablespace outside the data directory.
pub(crate) async fn read(c: Db<'_>) -> QResult<Vec<(String, String)>> {
    let rows = c.query(SQL).await?;
    Ok(rows
        .iter()
        .filter_map(|r| Some((r.text(0)?.to_string(), r.text(1)?.to_string())))
        .collect())
}

/// Kept while the cluster is down: the directories did not move.
pub(crate) fn encode(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    families::gauge(
        enc,
        "pgstorage_cluster_volume_info",
        "Always 1: which probed volume holds which of the cluster's directories; role = data, wal or tablespace:<name>",
        clusters.iter().flat_map(|c| {
            c.volumes.iter().map(|(v, role)| {
                (
                    [
                        ("cluster", c.name.as_str()),
                        ("volume", v.as_str()),
                        ("role", role.as_str()),
                    ],
                    1.0,
                )
            })
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::views::render;

    #[test]
    fn volume_roles_also_while_down() {
        let c = ClusterSnapshot {
            name: "c".into(),
            volumes: vec![
                ("c/data".into(), "data".into()),
                ("c/tblspc/ts".into(), "tablespace:ts".into()),
            ],
            ..Default::default()
        };
        let out = render(&[c], encode);
        for want in [
            "pgstorage_cluster_volume_info{cluster=\"c\",volume=\"c/data\",role=\"data\"} 1.0\n",
            "pgstorage_cluster_volume_info{cluster=\"c\",volume=\"c/tblspc/ts\",role=\"tablespace:ts\"} 1.0\n",
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
    }
}
