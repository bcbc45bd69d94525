//! pg_stat_activity: wait events from sampling. Each sample counts every
//! waiting backend for the time since the previous sample, so over time
//! the totals approach backend-seconds spent in each wait event.
//!
//! Names are PostgreSQL's own and differ across versions: 17 renamed many
//! IO and IPC events to CamelCase (IO `WALSync` → `WalSync`, `WALWrite` →
//! `WalWrite`, `WALInitSync` → `WalInitSync`, ...) but no LWLock: the lock
//! `LWLock:WALWrite` keeps its name, so `WALWrite` on 17+ is the lock, not
//! the IO event (tests/suite/postgres.rs checks both on real servers). 17+ lets
//! extensions define their own `Extension` events. Labels are exported as the server
//! reports them; dashboards should match both spellings
//! (`wait_event=~"WALSync|WalSync"`). The label set is bounded: unknown
//! types become `Other`, and past [`MAX_EVENTS`](super::rows::MAX_EVENTS) distinct events the rest
//! are counted as `other`. The query itself is the same from 14 to 18.

use std::fmt;

use crate::families::{self, Encoder};
use crate::postgres::db::{Db, QResult};
use crate::postgres::snapshot::ClusterSnapshot;

/// One sample of pg_stat_activity.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WaitSample {
    /// Backends waiting right now, by (wait_event_type, wait_event).
    pub(crate) waiting: Vec<(String, String, i64)>,
    /// Backends whose wait state this role may not see.
    pub(crate) hidden: u64,
}

/// Backends waiting right now, by (wait_event_type, wait_event), and the
/// backends this role cannot see. Idle client connections (waiting for the
/// next query in Client:ClientRead) are left out: they are not waiting on
/// the server.
///
/// Without pg_read_all_stats (which pg_monitor includes) a role sees only
/// its own sessions: for every other backend, background processes
/// included, pg_stat_activity shows the pid, the user and
/// `<insufficient privilege>` as the query, and NULL in backend_type,
/// state, wait_event_type and wait_event (checked on 14 to 18). Those rows
/// are counted as hidden rather than dropped by `wait_event IS NOT NULL`, so
/// that "nobody waits" and "cannot see who waits" differ. backend_type is
/// never NULL for a backend the role may see, so it is the marker; in the
/// result a hidden row is the group whose type and event are both NULL.
const SQL: &str = "SELECT CASE WHEN backend_type IS NOT NULL THEN wait_event_type END, \
     CASE WHEN backend_type IS NOT NULL THEN wait_event END, count(*) \
     FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND (backend_type IS NULL \
     OR (wait_event IS NOT NULL AND NOT (backend_type = 'client backend' AND state = 'idle'))) \
     GROUP BY 1, 2";

/// Whether this role sees every backend in pg_stat_activity: PostgreSQL
/// shows another role's backend in full only to members of that role and
/// of pg_read_all_stats (`has_privs_of_role`, which is what
/// `pg_has_role(..., 'USAGE')` checks; a superuser passes).
const SQL_SEES_ALL: &str = "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')";

/// Takes one sample (the query and its hidden rows: `SQL`).
pub(crate) async fn sample(c: Db<'_>) -> QResult<WaitSample> {
    let rows = c.query(SQL, &[]).await?;
    let mut sample = WaitSample::default();
    for r in &rows {
        let ty: Option<String> = r.try_get(0)?;
        let event: Option<String> = r.try_get(1)?;
        let n: i64 = r.try_get(2)?;
        match (ty, event) {
            (Some(t), Some(e)) => sample.waiting.push((t, e, n)),
            _ => sample.hidden += n.max(0) as u64,
        }
    }
    Ok(sample)
}

/// Whether this role sees every backend (see `SQL_SEES_ALL`).
pub(crate) async fn sees_all_backends(c: Db<'_>) -> QResult<bool> {
    let row = c.query_one(SQL_SEES_ALL, &[]).await?;
    Ok(row.try_get(0)?)
}

pub(crate) fn encode(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    // Counters: kept across an outage, so they never go backwards.
    families::counter(
        enc,
        "pgstorage_pg_wait_event_seconds",
        "Backend-seconds spent waiting, by wait event, estimated by sampling pg_stat_activity (idle client connections excluded); names as the server reports them (17 renamed e.g. WALSync to WalSync)",
        clusters.iter().flat_map(|c| {
            c.waits.seconds.iter().map(|((t, e), v)| {
                (
                    [
                        ("cluster", c.name.as_str()),
                        ("wait_event_type", t.as_str()),
                        ("wait_event", e.as_str()),
                    ],
                    *v,
                )
            })
        }),
    )?;
    // The latest sample says nothing about a cluster that is down.
    families::gauge(
        enc,
        "pgstorage_pg_backends_waiting",
        "Backends waiting in the latest sample, by wait event type",
        clusters.iter().filter(|c| c.up).flat_map(|c| {
            c.waits.now.iter().map(|(t, n)| {
                (
                    [
                        ("cluster", c.name.as_str()),
                        ("wait_event_type", t.as_str()),
                    ],
                    *n as f64,
                )
            })
        }),
    )?;
    crate::postgres::snapshot::cluster_gauge(
        enc,
        "pgstorage_pg_wait_hidden_backends",
        "Backends (other roles' sessions, background processes) whose wait events the exporter's role could not see in the latest sample: it lacks pg_read_all_stats (pg_monitor); 0 when it sees everything",
        clusters,
        |c| Some(c.waits.hidden.filter(|_| c.up)? as f64),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::views::rows::{MAX_EVENTS, WaitTotals};
    use std::time::{Duration, Instant};

    fn row(t: &str, e: &str, n: i64) -> (String, String, i64) {
        (t.into(), e.into(), n)
    }

    #[test]
    fn accumulates_backend_seconds_with_capped_gaps() {
        let t0 = Instant::now();
        let i = Duration::from_secs(1);
        let mut w = WaitTotals::default();
        w.add(t0, i, &[row("IO", "WalSync", 3)]);
        w.add(
            t0 + i,
            i,
            &[row("IO", "WalSync", 1), row("IO", "DataFileRead", 2)],
        );
        // 10 s gap: charged as 2 s only.
        w.add(t0 + i * 11, i, &[row("IO", "WalSync", 1)]);
        assert_eq!(w.seconds[&("IO".into(), "WalSync".into())], 3.0 + 1.0 + 2.0);
        assert_eq!(w.seconds[&("IO".into(), "DataFileRead".into())], 2.0);
        assert_eq!(w.now["IO"], 1);
    }

    #[test]
    fn the_lwlock_and_the_io_event_named_wal_write_stay_apart() {
        // 17+: IO:WalWrite is the write, LWLock:WALWrite the queue behind
        // it; up to 16 the write is IO:WALWrite. No name is rewritten.
        let mut w = WaitTotals::default();
        w.add(
            Instant::now(),
            Duration::from_secs(1),
            &[
                row("IO", "WalWrite", 1),
                row("LWLock", "WALWrite", 2),
                row("IO", "WALWrite", 3),
            ],
        );
        assert_eq!(w.seconds[&("IO".into(), "WalWrite".into())], 1.0);
        assert_eq!(w.seconds[&("LWLock".into(), "WALWrite".into())], 2.0);
        assert_eq!(w.seconds[&("IO".into(), "WALWrite".into())], 3.0);
        assert_eq!((w.now["IO"], w.now["LWLock"]), (4, 2));
    }

    #[test]
    fn label_set_is_bounded() {
        let t0 = Instant::now();
        let mut w = WaitTotals::default();
        let rows: Vec<_> = (0..MAX_EVENTS + 50)
            .map(|i| row("Extension", &format!("e{i}"), 1))
            .collect();
        w.add(t0, Duration::from_secs(1), &rows);
        w.add(t0, Duration::from_secs(1), &[row("Weird", "Thing", 1)]);
        assert!(w.seconds.len() <= MAX_EVENTS + 2, "{}", w.seconds.len());
        assert!(
            w.seconds
                .contains_key(&("Extension".into(), "other".into()))
        );
        assert!(w.seconds.contains_key(&("Other".into(), "other".into())));
    }

    #[test]
    fn totals_outlive_an_outage_the_latest_sample_does_not() {
        let mut c = ClusterSnapshot {
            name: "c".into(),
            up: true,
            ..Default::default()
        };
        std::sync::Arc::make_mut(&mut c.waits).add(
            Instant::now(),
            Duration::from_secs(1),
            &[row("IO", "WalSync", 2)],
        );
        let out = crate::postgres::views::render(std::slice::from_ref(&c), encode);
        for want in [
            "pgstorage_pg_wait_event_seconds_total{cluster=\"c\",wait_event_type=\"IO\",wait_event=\"WalSync\"} 2.0\n",
            "pgstorage_pg_backends_waiting{cluster=\"c\",wait_event_type=\"IO\"} 2.0\n",
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
        c.up = false;
        std::sync::Arc::make_mut(&mut c.waits).pause();
        let out = crate::postgres::views::render(&[c], encode);
        assert!(out.contains("wait_event=\"WalSync\"} 2.0\n"), "{out}");
        assert!(!out.contains("pgstorage_pg_backends_waiting{"), "{out}");
    }
}
