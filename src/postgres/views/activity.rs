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
use std::time::Duration;

use crate::families::{self, Encoder};
use crate::postgres::db::{Db, QResult, Row};
use crate::postgres::snapshot::ClusterSnapshot;
use crate::postgres::views::rows::Planned;

/// One sample of pg_stat_activity.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WaitSample {
    /// Backends waiting right now, by (wait_event_type, wait_event).
    pub(crate) waiting: Vec<(String, String, i64)>,
    /// Backends whose wait state this role may not see.
    pub(crate) hidden: u64,
}

impl WaitSample {
    /// Whether a backend waits on anything but work to do: every type but
    /// `Activity`, where background processes (checkpointer, WAL writer,
    /// autovacuum launcher, ...) idle in their main loops all the time.
    /// Such a sample keeps sampling at the base interval (`Schedule`).
    pub(crate) fn busy(&self) -> bool {
        self.waiting
            .iter()
            .any(|(t, _, n)| *n > 0 && t != "Activity")
    }
}

/// Samples in a row that saw nothing busy before the interval doubles.
pub(crate) const QUIET_SAMPLES: u32 = 3;

/// The mean interval grows to at most `wait_sampling_interval` × 2^this.
pub(crate) const MAX_DOUBLINGS: u32 = 5;

/// No gap is longer than this many mean intervals: a wait that lasts that
/// long is always seen.
const MAX_GAP_INTERVALS: u32 = 2;

/// When pg_stat_activity is sampled. Each sample is a query the watched
/// server executes; on a server where nothing waits but its background
/// processes idling, a sample every second measures nothing and costs
/// the server the most. So after [`QUIET_SAMPLES`] samples in a row that
/// saw no busy wait ([`WaitSample::busy`]) the mean interval doubles with
/// each further quiet sample, up to 2^[`MAX_DOUBLINGS`] × the base
/// interval, and the first busy sample brings it back to the base.
///
/// The samples alone miss load that comes and goes: bursts of 3 s every
/// 15 s left gaps of 8 s and more between them, and a run of 16 such
/// bursts counted 0.20× the IO waits a sampler every 0.1 s saw (another
/// run 0.61×). So while the collector's rounds see the cluster write WAL
/// (each `scrape_interval`), sampling is held at the base interval
/// ([`Schedule::hold`]): a cluster that writes is one whose waits matter,
/// and the exporter never writes WAL itself, so an idle cluster still
/// backs off.
///
/// Backed off, the gaps are random: each base interval is sampled with a
/// chance of base / mean interval, and a sample weighs the base interval
/// divided by that chance (`Planned::weight`). A sample that finds a wait
/// just begun thus stands for what a sample each base interval would have
/// counted on average, whenever the wait began. Fixed gaps could not: a
/// sample after a long gap that finds a burst of IO begun somewhere in it
/// would charge the whole gap to it, and the sample that ends that burst
/// would already come one base interval later, so every burst would be
/// counted half a long gap too long. Random gaps make the totals of rare
/// events noisier, not wrong; at the base interval the gaps are fixed, as
/// before.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    base: Duration,
    doublings: u32,
    quiet: u32,
    /// The cluster wrote WAL in the collector's last round: no backing off.
    held: bool,
}

impl Schedule {
    pub(crate) fn new(base: Duration) -> Schedule {
        Schedule {
            base,
            doublings: 0,
            quiet: 0,
            held: false,
        }
    }

    /// Takes in whether the cluster wrote WAL over the collector's last
    /// round; true holds the base interval until a round in which it did
    /// not. Returns whether the interval came back to the base from a
    /// longer one, so that the sample planned for later can come sooner.
    pub(crate) fn hold(&mut self, wrote: bool) -> bool {
        self.held = wrote;
        if !wrote {
            return false;
        }
        let was_backed_off = self.doublings > 0;
        self.doublings = 0;
        self.quiet = 0;
        was_backed_off
    }

    /// The mean interval now.
    pub(crate) fn interval(&self) -> Duration {
        self.base * (1 << self.doublings)
    }

    /// Takes in a sample's verdict.
    pub(crate) fn observe(&mut self, busy: bool) {
        if busy || self.held {
            self.quiet = 0;
            self.doublings = 0;
        } else {
            self.quiet = self.quiet.saturating_add(1);
            if self.quiet >= QUIET_SAMPLES {
                self.doublings = (self.doublings + 1).min(MAX_DOUBLINGS);
            }
        }
    }

    /// The next sample, from `u` drawn uniformly in [0, 1): in how many
    /// base intervals (geometric, at most [`MAX_GAP_INTERVALS`] mean
    /// intervals) and what it weighs.
    pub(crate) fn next(&self, u: f64) -> Planned {
        let every = 1u32 << self.doublings;
        if every == 1 {
            return Planned::every(self.base);
        }
        let cap = every * MAX_GAP_INTERVALS;
        let p = 1.0 / f64::from(every);
        // The number of base intervals up to and including the first one
        // sampled, each with chance p.
        let draw = ((1.0 - u).max(f64::MIN_POSITIVE).ln() / (1.0 - p).ln()).floor() + 1.0;
        let slots = if draw >= f64::from(cap) {
            cap
        } else {
            draw.max(1.0) as u32
        };
        Planned {
            gap: self.base * slots,
            // The last interval a gap may reach is sampled for sure: it
            // weighs itself alone.
            weight: if slots == cap {
                self.base
            } else {
                self.base * every
            },
        }
    }
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
    let rows = c.query(SQL).await?;
    let mut sample = WaitSample::default();
    for r in &rows {
        let n = r.need(2, Row::int)?;
        match (r.text(0), r.text(1)) {
            (Some(t), Some(e)) => sample.waiting.push((t.to_string(), e.to_string(), n)),
            _ => sample.hidden += n.max(0) as u64,
        }
    }
    Ok(sample)
}

/// Whether this role sees every backend (see `SQL_SEES_ALL`).
pub(crate) async fn sees_all_backends(c: Db<'_>) -> QResult<bool> {
    c.query_one(SQL_SEES_ALL).await?.need(0, Row::bool)
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
        "pgstorage_pg_wait_sampling_interval_seconds",
        "Mean time between samples of pg_stat_activity now: wait_sampling_interval while a backend waits on anything but work to do (every wait_event_type but Activity), doubling after 3 samples in a row without such a wait up to 8 times that (random gaps around that mean, at most twice it)",
        clusters,
        |c| Some(c.waits.interval.filter(|_| c.up)?.as_secs_f64()),
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
        w.add(t0, Planned::every(i), &[row("IO", "WalSync", 3)]);
        w.add(
            t0 + i,
            Planned::every(i),
            &[row("IO", "WalSync", 1), row("IO", "DataFileRead", 2)],
        );
        // 10 s gap: charged as 2 s only.
        w.add(t0 + i * 11, Planned::every(i), &[row("IO", "WalSync", 1)]);
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
            Planned::every(Duration::from_secs(1)),
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
        w.add(t0, Planned::every(Duration::from_secs(1)), &rows);
        w.add(
            t0,
            Planned::every(Duration::from_secs(1)),
            &[row("Weird", "Thing", 1)],
        );
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
        let waits = std::sync::Arc::make_mut(&mut c.waits);
        waits.add(
            Instant::now(),
            Planned::every(Duration::from_secs(1)),
            &[row("IO", "WalSync", 2)],
        );
        waits.interval = Some(Duration::from_secs(4));
        let out = crate::postgres::views::render(std::slice::from_ref(&c), encode);
        for want in [
            "pgstorage_pg_wait_event_seconds_total{cluster=\"c\",wait_event_type=\"IO\",wait_event=\"WalSync\"} 2.0\n",
            "pgstorage_pg_backends_waiting{cluster=\"c\",wait_event_type=\"IO\"} 2.0\n",
            "pgstorage_pg_wait_sampling_interval_seconds{cluster=\"c\"} 4.0\n",
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
        c.up = false;
        std::sync::Arc::make_mut(&mut c.waits).pause();
        let out = crate::postgres::views::render(&[c], encode);
        assert!(out.contains("wait_event=\"WalSync\"} 2.0\n"), "{out}");
        assert!(!out.contains("pgstorage_pg_backends_waiting{"), "{out}");
        assert!(
            !out.contains("pgstorage_pg_wait_sampling_interval_seconds{"),
            "{out}"
        );
    }

    fn sample(waiting: &[(&str, &str, i64)]) -> WaitSample {
        WaitSample {
            waiting: waiting.iter().map(|(t, e, n)| row(t, e, *n)).collect(),
            hidden: 0,
        }
    }

    #[test]
    fn only_background_processes_idling_is_quiet() {
        let idle = [
            ("Activity", "CheckpointerMain", 1),
            ("Activity", "WalWriterMain", 1),
        ];
        assert!(!sample(&idle).busy());
        assert!(!sample(&[]).busy());
        assert!(sample(&[("Activity", "WalWriterMain", 1), ("IO", "WalSync", 1)]).busy());
        for t in [
            "Client",
            "Lock",
            "LWLock",
            "Timeout",
            "IPC",
            "Extension",
            "Other",
        ] {
            assert!(sample(&[(t, "x", 1)]).busy(), "{t}");
        }
    }

    #[test]
    fn the_interval_doubles_when_quiet_and_drops_back_at_the_first_wait() {
        let base = Duration::from_secs(1);
        let mut s = Schedule::new(base);
        let mut seen = vec![];
        for _ in 0..10 {
            s.observe(false);
            seen.push(s.interval().as_secs());
        }
        assert_eq!(seen, [1, 1, 2, 4, 8, 16, 32, 32, 32, 32]);
        s.observe(true);
        assert_eq!(s.interval(), base);
        assert_eq!(
            s.next(0.999),
            Planned::every(base),
            "fixed gaps at the base"
        );
        // Quiet again: the count starts over.
        s.observe(false);
        s.observe(false);
        assert_eq!(s.interval(), base);
    }

    #[test]
    fn a_cluster_writing_wal_holds_the_base_interval() {
        let base = Duration::from_secs(1);
        let mut s = Schedule::new(base);
        for _ in 0..6 {
            s.observe(false);
        }
        assert_eq!(s.interval(), base * 16);
        // A round saw WAL written: back to the base at once, and held
        // there however quiet the samples between bursts are.
        assert!(s.hold(true), "the planned sample comes sooner");
        for _ in 0..10 {
            s.observe(false);
            assert_eq!(s.interval(), base);
            assert_eq!(s.next(0.999), Planned::every(base));
        }
        assert!(!s.hold(true), "already at the base");
        // A round without writes lets it back off again.
        assert!(!s.hold(false));
        let mut seen = vec![];
        for _ in 0..5 {
            s.observe(false);
            seen.push(s.interval().as_secs());
        }
        assert_eq!(seen, [1, 1, 2, 4, 8]);
    }

    #[test]
    fn backed_off_gaps_are_geometric_and_capped() {
        let base = Duration::from_secs(1);
        let mut s = Schedule::new(base);
        for _ in 0..QUIET_SAMPLES + MAX_DOUBLINGS {
            s.observe(false);
        }
        assert_eq!(s.interval(), base * 32);
        // u = 0: the very next base interval, weighing 32 of them.
        assert_eq!(
            s.next(0.0),
            Planned {
                gap: base,
                weight: base * 32
            }
        );
        // P(gap > k) = (31/32)^k: the median gap is 22 intervals.
        assert_eq!(s.next(0.5).gap, base * 22);
        // The cap (64 intervals) is sampled for sure and weighs itself.
        assert_eq!(
            s.next(0.999_999),
            Planned {
                gap: base * 64,
                weight: base
            }
        );
        // Over many draws the mean gap is 27.8 intervals (32 but for the
        // cap: 32 × (1 - (31/32)^64)), and a sample
        // weighs, on average, the gap it ends: each base interval counts
        // once in expectation.
        let n = 100_000u32;
        let (mut gaps, mut weights) = (0.0, 0.0);
        for i in 0..n {
            let p = s.next((f64::from(i) + 0.5) / f64::from(n));
            gaps += p.gap.as_secs_f64();
            weights += p.weight.as_secs_f64();
        }
        let (gap, weight) = (gaps / f64::from(n), weights / f64::from(n));
        assert!((27.6..28.0).contains(&gap), "{gap}");
        assert!((weight / gap - 1.0).abs() < 0.01, "{weight} against {gap}");
    }

    #[test]
    fn a_late_sample_stands_for_up_to_twice_its_weight() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = WaitTotals::default();
        let planned = Planned {
            gap: s(2),
            weight: s(8),
        };
        w.add(t0, planned, &[row("IO", "DataFileRead", 1)]);
        assert_eq!(
            w.seconds[&("IO".into(), "DataFileRead".into())],
            8.0,
            "first"
        );
        w.add(t0 + s(2), planned, &[row("IO", "DataFileRead", 1)]);
        assert_eq!(
            w.seconds[&("IO".into(), "DataFileRead".into())],
            16.0,
            "on time"
        );
        w.add(t0 + s(5), planned, &[row("IO", "DataFileRead", 1)]);
        assert_eq!(
            w.seconds[&("IO".into(), "DataFileRead".into())],
            28.0,
            "1.5 times late"
        );
        w.add(t0 + s(60), planned, &[row("IO", "DataFileRead", 1)]);
        assert_eq!(
            w.seconds[&("IO".into(), "DataFileRead".into())],
            44.0,
            "capped"
        );
    }
}
