//! The server version, read once per connection: every other view picks
//! its SQL from it.

use std::fmt;

use crate::families::{self, Encoder};
use crate::postgres::db::{Db, QResult, Row};
use crate::postgres::snapshot::ClusterSnapshot;

/// The oldest version read: pg_stat_wal (WAL records, writes, syncs and
/// their timing) exists from 14. Older servers get a connection and
/// settings, and their WAL and checkpoint statistics are not read.
pub(crate) const OLDEST: u32 = 14_00_00;

/// The newest version whose views are known. A newer server is read with
/// the queries of this one: a view or column it no longer has fails that
/// one query with SQLSTATE 42P01 or 42703, counted as `undefined` while the
/// other views are still read.
pub(crate) const NEWEST: u32 = 18_00_00;

/// The version in the form the gates compare (`server_version_num`,
/// e.g. 170004) and as the server spells it (e.g. "17.4 (Debian ...)").
const SQL: &str =
    "SELECT current_setting('server_version_num')::int4, current_setting('server_version')";

pub(crate) async fn read(c: Db<'_>) -> QResult<(u32, String)> {
    let row = c.query_one(SQL).await?;
    let num = row.need(0, Row::int)?;
    let text = row.need(1, Row::text)?.to_string();
    Ok((u32::try_from(num.max(0)).unwrap_or(u32::MAX), text))
}

/// Whether a server has newer views than the queries know: the next major
/// version starts at `NEWEST` + 10000.
pub(crate) fn newer_than_known(version: u32) -> bool {
    version >= NEWEST + 1_00_00
}

pub(crate) fn encode(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    families::gauge(
        enc,
        "pgstorage_pg_info",
        "Always 1: the server version of the cluster",
        clusters.iter().filter_map(|c| {
            let (num, text) = c.version.as_ref()?;
            Some((
                [
                    ("cluster", c.name.clone()),
                    ("version", text.clone()),
                    ("server_version_num", num.to_string()),
                ],
                1.0,
            ))
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::views::render;

    #[test]
    fn gates() {
        assert!(!newer_than_known(180006));
        assert!(newer_than_known(190000));
    }

    #[test]
    fn info_once_the_version_is_known() {
        let mut c = ClusterSnapshot {
            name: "c".into(),
            ..Default::default()
        };
        let out = render(std::slice::from_ref(&c), encode);
        assert!(!out.contains("pgstorage_pg_info{"), "{out}");
        c.version = Some((170004, "17.4".into()));
        let out = render(&[c], encode);
        assert!(
            out.contains(
                "pgstorage_pg_info{cluster=\"c\",version=\"17.4\",server_version_num=\"170004\"} 1.0\n"
            ),
            "{out}"
        );
    }
}
