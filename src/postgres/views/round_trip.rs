//! The round trip of a trivial query: the least time any client's
//! transaction spends outside the storage.
//!
//! A commit is at least one round trip: the client sends its statement and
//! waits for the answer, and the server parses, plans and runs it before
//! the WAL write and sync that the `postgres` ceiling basis counts. So the
//! fastest round trip of `SELECT 1` (parse, plan, run, answer: less than
//! any INSERT's) added to PostgreSQL's own WAL time per sync is still an
//! upper bound of one client's commit rate, and a closer one: on the build
//! machine the statement's own work was a quarter of a trivial transaction
//! (docs/ceilings.md).
//!
//! Measured only when the exporter reaches the server over a Unix-domain
//! socket or a loopback address, where no client can be closer; over a
//! network the exporter's round trip says nothing about a client beside the
//! server, and is left out of the ceiling rather than lower it below what
//! such a client reaches.

use std::fmt;
use std::time::Instant;

use crate::postgres::db::{Db, QResult};
use crate::postgres::snapshot::ClusterSnapshot;

use crate::families::Encoder;
use crate::postgres::snapshot::cluster_gauge;

/// Round trips per scrape. One, right after the round's statistics
/// queries: it finds the connection, the backend and the CPU awake, as a
/// client that keeps committing does, and the gauge is the fastest over
/// the window (90 rounds at the defaults). Each one wakes the exporter and
/// the backend once more: five back to back were half of the backend's
/// wakeups at the defaults.
pub(crate) const TRIES: usize = 1;

/// Whether the session reaches the server over a Unix-domain socket
/// (`inet_client_addr()` is NULL) or a loopback address.
pub(crate) async fn local(c: Db<'_>) -> QResult<bool> {
    let row = c
        .query_one(
            "SELECT coalesce(inet_client_addr() <<= '127.0.0.0/8'::inet \
             OR inet_client_addr() = '::1'::inet, true)",
        )
        .await?;
    Ok(row.bool(0).unwrap_or(false))
}

/// The fastest of [`TRIES`] round trips of `SELECT 1`, in seconds.
pub(crate) async fn read(c: Db<'_>) -> QResult<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..TRIES {
        let t = Instant::now();
        c.simple_query("SELECT 1").await?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// `pgstorage_pg_round_trip_seconds`.
pub(crate) fn encode(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    cluster_gauge(
        enc,
        "pgstorage_pg_round_trip_seconds",
        "Fastest round trip of a trivial query (SELECT 1) from the exporter to the server over the window, measured over a Unix-domain socket or loopback only: the least time a transaction spends outside the storage; added to the WAL time in the commit ceiling's postgres basis",
        clusters,
        |c| c.round_trip,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::views::render;

    #[test]
    fn one_gauge_per_cluster_that_has_it() {
        let a = ClusterSnapshot {
            name: "a".into(),
            up: true,
            round_trip: Some(4.5e-5),
            ..Default::default()
        };
        let b = ClusterSnapshot {
            name: "b".into(),
            up: true,
            ..Default::default()
        };
        let out = render(&[a, b], encode);
        assert!(
            out.contains("pgstorage_pg_round_trip_seconds{cluster=\"a\"} 0.000045\n"),
            "{out}"
        );
        assert!(!out.contains("cluster=\"b\""), "{out}");
    }
}
