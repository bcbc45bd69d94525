//! The one policy for logging repeated failures, shared by the probe
//! threads, the PostgreSQL collectors and the IO limits collector: the
//! first failure of an incident is logged, repeats are counted (in the
//! collector's error metric) but logged again only every [`LOG_REPEAT`],
//! and the end of the incident is logged once with how long it lasted. A
//! probe failing every second on a full disk is one line, not 3,600 an
//! hour. A leaf module: it knows nothing of what fails.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A failure is logged again at most this often while it lasts.
pub(crate) const LOG_REPEAT: Duration = Duration::from_secs(300);

/// What to log about a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Report {
    /// First failure of this cause: log it.
    New,
    /// Still failing with the same cause after [`LOG_REPEAT`]: log it again
    /// with the number of failures so far.
    Again { failures: u64 },
    /// A repeat: stay quiet.
    Quiet,
}

#[derive(Debug, Clone, Copy)]
struct Open<C> {
    cause: C,
    since: Instant,
    failures: u64,
    logged: Instant,
}

/// The incidents going on, per key (a probe op, a PostgreSQL query, a
/// limits file), so that a failure that repeats every round is logged
/// once, again every [`LOG_REPEAT`] while it lasts, and its end once.
#[derive(Debug)]
pub(crate) struct Incidents<K, C> {
    open: BTreeMap<K, Open<C>>,
}

impl<K, C> Default for Incidents<K, C> {
    fn default() -> Self {
        Incidents {
            open: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone, C: Copy + PartialEq> Incidents<K, C> {
    /// Records a failure of `what` and says whether to log it.
    pub(crate) fn failed(&mut self, what: K, cause: C, now: Instant) -> Report {
        match self.open.get_mut(&what) {
            Some(o) if o.cause == cause => {
                o.failures += 1;
                if now.saturating_duration_since(o.logged) >= LOG_REPEAT {
                    o.logged = now;
                    Report::Again {
                        failures: o.failures,
                    }
                } else {
                    Report::Quiet
                }
            }
            // Another cause of the same outage: news, but the outage
            // (and its count) goes on.
            Some(o) => {
                o.cause = cause;
                o.failures += 1;
                o.logged = now;
                Report::New
            }
            None => {
                self.open.insert(
                    what,
                    Open {
                        cause,
                        since: now,
                        failures: 1,
                        logged: now,
                    },
                );
                Report::New
            }
        }
    }

    /// Records that a failure of `what` with `cause` was already logged
    /// under another name (the lost session whose reconnection now fails
    /// the same way), so its repeats stay quiet.
    pub(crate) fn already_logged(&mut self, what: K, cause: C, now: Instant) {
        self.open.insert(
            what,
            Open {
                cause,
                since: now,
                failures: 0,
                logged: now,
            },
        );
    }

    /// What is failing now.
    pub(crate) fn failing(&self) -> impl Iterator<Item = &K> {
        self.open.keys()
    }

    /// Records a success of `what`. When it was failing: how many times
    /// and for how long, for one line saying it works again.
    pub(crate) fn succeeded(&mut self, what: K, now: Instant) -> Option<(u64, Duration)> {
        self.open
            .remove(&what)
            .map(|o| (o.failures, now.saturating_duration_since(o.since)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_failure_repeats_and_the_end_are_reported_once() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut f: Incidents<&str, u8> = Incidents::default();
        assert_eq!(f.failed("read", 5, t0), Report::New);
        assert_eq!(f.failed("read", 5, t0 + s), Report::Quiet);
        assert_eq!(f.failed("commit", 5, t0 + s), Report::New);
        // Another cause of the same incident is news.
        assert_eq!(f.failed("read", 28, t0 + 2 * s), Report::New);
        assert_eq!(
            f.failed("read", 28, t0 + LOG_REPEAT + 2 * s),
            Report::Again { failures: 4 }
        );
        assert_eq!(f.succeeded("read", t0 + 10 * s), Some((4, 10 * s)));
        assert_eq!(f.succeeded("read", t0 + 11 * s), None);
    }
}
