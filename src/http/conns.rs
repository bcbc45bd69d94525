//! The connections of one listener: how many may be open, which one gives
//! way to a newcomer, and when each one's time is up. No IO here: the
//! accept loop and the connection tasks of `serve.rs` report what happens
//! and act on the answers, so the rules are unit-tested with plain numbers.
//!
//! Anyone who can reach the port can open connections, and every open
//! connection holds a file descriptor. The rules:
//!
//! | state of a connection | deadline | may give way to a newcomer |
//! |---|---|---|
//! | new: TLS handshake and first request head | accept + header timeout | yes |
//! | waiting between requests (keep-alive) | end of the last response + idle timeout | yes |
//! | a request head arriving after such a wait | its first byte + header timeout | yes |
//! | a request in progress (handler to last byte of the body) | none | no |
//!
//! At the cap, a newcomer is admitted and the connection that has waited
//! longest for its current request is closed instead: every connection an
//! attacker holds without a request in progress is older than a scrape
//! that just connected, so holding thousands of them cannot keep that
//! scrape out, and closing idle ones costs a real scraper at most a new
//! TCP connection. Only when every connection has a request in progress is
//! the newcomer refused.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

/// No time: the value of `head_since` while no request head is arriving.
const NONE: u64 = u64::MAX;

/// The per-connection deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// From accept to the first request's complete head (the TLS handshake
    /// included), and from the first byte of each later request to its
    /// complete head.
    pub(crate) header: Duration,
    /// Between the end of a response and the first byte of the next
    /// request on the same connection.
    pub(crate) idle: Duration,
}

/// Why the exporter closed a connection before the client did: the
/// `reason` label of `pgstorage_http_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Closed {
    /// Closed at the cap to make room for a newcomer.
    Evicted = 1,
    /// The newcomer itself, closed at once: at the cap, every connection
    /// had a request in progress.
    Refused = 2,
    /// The request head (or the TLS handshake) was not complete in time.
    HeaderTimeout = 3,
    /// No new request in time after the last response.
    IdleTimeout = 4,
}

impl Closed {
    pub(crate) const ALL: [Closed; 4] = [
        Closed::Evicted,
        Closed::Refused,
        Closed::HeaderTimeout,
        Closed::IdleTimeout,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Closed::Evicted => "evicted",
            Closed::Refused => "refused",
            Closed::HeaderTimeout => "header_timeout",
            Closed::IdleTimeout => "idle_timeout",
        }
    }

    fn from_code(code: u8) -> Option<Closed> {
        Closed::ALL.into_iter().find(|c| *c as u8 == code)
    }
}

/// One connection's state, shared by its task, the wrappers that watch
/// its bytes and requests, and the table. Times are milliseconds on the
/// table's clock.
#[derive(Debug)]
pub(crate) struct Conn {
    /// Accept order: the table's key.
    id: u64,
    accepted: u64,
    /// When the connection began waiting for its current request: the
    /// accept, or the end of the previous response. The eviction order.
    waiting_since: AtomicU64,
    /// When the current request head began: the accept for the first one,
    /// the first byte for a later one; [`NONE`] while waiting idle.
    head_since: AtomicU64,
    /// Requests in progress: from the handler's call to the drop of the
    /// response body.
    busy: AtomicU32,
    /// 0, or the [`Closed`] reason the table gave when it told the
    /// connection's task to close it.
    closing: AtomicU8,
    /// Wakes the connection's task when `closing` is set.
    pub(crate) wake: Notify,
    /// The table's [`Table::changed`].
    changed: Arc<Notify>,
}

impl Conn {
    /// Bytes of a request have arrived. Only news after an idle wait: the
    /// first byte starts the header time (a new connection's runs from the
    /// accept).
    pub(crate) fn bytes_arrived(&self, now: u64) {
        if self.busy.load(Ordering::Acquire) == 0
            && self
                .head_since
                .compare_exchange(NONE, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.changed.notify_one();
        }
    }

    /// A request's handler was called.
    pub(crate) fn request_started(&self) {
        self.busy.fetch_add(1, Ordering::AcqRel);
    }

    /// A response's body was sent or dropped: the connection waits for
    /// its next request from `now`.
    pub(crate) fn request_done(&self, now: u64) {
        if self.busy.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.head_since.store(NONE, Ordering::Release);
            self.waiting_since.store(now, Ordering::Release);
            self.changed.notify_one();
        }
    }

    pub(crate) fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire) > 0
    }

    /// Why the table told the task to close the connection, once it has.
    pub(crate) fn closing(&self) -> Option<Closed> {
        Closed::from_code(self.closing.load(Ordering::Acquire))
    }

    /// Tells the task to close the connection, unless it was told already.
    fn close(&self, reason: Closed) -> bool {
        let told = self
            .closing
            .compare_exchange(0, reason as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if told {
            // Stores a permit if the task is not waiting right now.
            self.wake.notify_one();
        }
        told
    }

    fn waiting_since(&self) -> u64 {
        self.waiting_since.load(Ordering::Acquire)
    }

    /// When the connection's time is up and why; `None` while a request
    /// is in progress.
    fn deadline(&self, t: Timeouts) -> Option<(u64, Closed)> {
        if self.busy() {
            return None;
        }
        let head = self.head_since.load(Ordering::Acquire);
        if head != NONE {
            return Some((head.saturating_add(millis(t.header)), Closed::HeaderTimeout));
        }
        Some((
            self.waiting_since().saturating_add(millis(t.idle)),
            Closed::IdleTimeout,
        ))
    }
}

/// What the accept loop does with a newcomer.
#[derive(Debug)]
pub(crate) enum Admission {
    /// Serve it; `evicted` says whether another connection was closed to
    /// make room.
    Admitted { conn: Arc<Conn>, evicted: bool },
    /// Close it at once: at the cap, every connection is busy.
    Refused,
}

/// The open connections of one listener.
#[derive(Debug)]
pub(crate) struct Table {
    max: usize,
    timeouts: Timeouts,
    inner: Mutex<Inner>,
    /// Signalled when the last connection is gone, for the shutdown.
    emptied: Notify,
    /// Signalled when a connection is gone, for [`Table::room`].
    removed: Notify,
    /// Signalled when a connection gets a deadline (admitted, a request
    /// head begun after an idle wait, a response done), for the sweeper,
    /// which otherwise sleeps until the earliest deadline it knows.
    pub(crate) changed: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    /// In accept order.
    open: BTreeMap<u64, Arc<Conn>>,
    /// Of `open`: told to close, their tasks not yet ended. They still hold
    /// their descriptor but no longer count against the cap, so a newcomer
    /// need not wait for a task to run.
    closing: usize,
}

impl Table {
    pub(crate) fn new(max: usize, timeouts: Timeouts) -> Table {
        Table {
            max: max.max(1),
            timeouts,
            inner: Mutex::default(),
            emptied: Notify::new(),
            removed: Notify::new(),
            changed: Arc::new(Notify::new()),
        }
    }

    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Connections open (those told to close whose task has not ended
    /// included: each still holds its descriptor).
    pub(crate) fn open(&self) -> usize {
        self.lock().open.len()
    }

    /// Connections with a request in progress.
    #[cfg(test)]
    pub(crate) fn busy(&self) -> usize {
        self.lock().open.values().filter(|c| c.busy()).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The lock guards plain bookkeeping that no panic leaves half
        // done: a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection accepted at `now`.
    pub(crate) fn admit(&self, now: u64) -> Admission {
        let mut inner = self.lock();
        let mut evicted = false;
        if inner.open.len() - inner.closing >= self.max {
            match Self::idle_longest(&inner.open) {
                Some(victim) => {
                    if victim.close(Closed::Evicted) {
                        inner.closing += 1;
                    }
                    evicted = true;
                }
                None => return Admission::Refused,
            }
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let conn = Arc::new(Conn {
            id,
            accepted: now,
            waiting_since: AtomicU64::new(now),
            head_since: AtomicU64::new(now),
            busy: AtomicU32::new(0),
            closing: AtomicU8::new(0),
            wake: Notify::new(),
            changed: self.changed.clone(),
        });
        inner.open.insert(id, conn.clone());
        self.changed.notify_one();
        Admission::Admitted { conn, evicted }
    }

    /// The connection without a request in progress that has waited
    /// longest for one. In accept order, so the walk stops at the first
    /// connection accepted after the best wait so far began (it, and every
    /// later one, has waited less): under a flood of connections that
    /// never send a request that is the first idle one, not a walk over
    /// all of them for every newcomer.
    fn idle_longest(open: &BTreeMap<u64, Arc<Conn>>) -> Option<Arc<Conn>> {
        let mut best: Option<&Arc<Conn>> = None;
        for c in open.values() {
            if best.is_some_and(|b| c.accepted >= b.waiting_since()) {
                break;
            }
            if c.busy() || c.closing().is_some() {
                continue;
            }
            if best.is_none_or(|b| c.waiting_since() < b.waiting_since()) {
                best = Some(c);
            }
        }
        best.cloned()
    }

    /// Tells every connection whose deadline has passed at `now` to close;
    /// returns the earliest deadline still ahead, if any.
    pub(crate) fn sweep(&self, now: u64) -> Option<u64> {
        let mut inner = self.lock();
        let mut told = 0;
        let mut next: Option<u64> = None;
        for c in inner.open.values() {
            if c.closing().is_some() {
                continue;
            }
            let Some((at, reason)) = c.deadline(self.timeouts) else {
                continue;
            };
            if at > now {
                next = Some(next.map_or(at, |n| n.min(at)));
            } else if c.close(reason) {
                told += 1;
            }
        }
        inner.closing += told;
        next
    }

    /// The connection's task has ended and its descriptor is closed.
    pub(crate) fn remove(&self, conn: &Conn) {
        let mut inner = self.lock();
        if inner.open.remove(&conn.id).is_some() && conn.closing().is_some() {
            inner.closing -= 1;
        }
        if inner.open.is_empty() {
            self.emptied.notify_waiters();
        }
        self.removed.notify_one();
    }

    /// Waits until fewer than the cap plus [`CLOSING_MAX`] connections
    /// hold a descriptor. A connection told to close is closed by its own
    /// task, which a busy runtime may run only later: without this wait, a
    /// flood of newcomers, each evicting one, would run ahead of the
    /// closes and take the descriptors the cap is meant to save.
    pub(crate) async fn room(&self) {
        loop {
            let removed = self.removed.notified();
            if self.open() < self.max + CLOSING_MAX {
                return;
            }
            removed.await;
        }
    }

    /// Waits until every connection has ended.
    pub(crate) async fn emptied(&self) {
        loop {
            let wait = self.emptied.notified();
            if self.open() == 0 {
                return;
            }
            wait.await;
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The connections each listener may hold with `nofile` descriptors in
/// all: `wanted`, or less where `listeners` times `wanted` (plus
/// [`CLOSING_MAX`] each) would leave the rest of the exporter (probe
/// files, PostgreSQL sessions, /proc and cgroup reads, the runtime's own)
/// fewer than [`FD_RESERVE`], or half the limit when that is smaller. At
/// least 1.
pub(crate) fn fit(wanted: usize, listeners: usize, nofile: u64) -> usize {
    let reserve = FD_RESERVE.min(nofile / 2);
    let budget = usize::try_from(nofile - reserve).unwrap_or(usize::MAX);
    let per_listener = (budget / listeners.max(1)).saturating_sub(CLOSING_MAX);
    wanted.min(per_listener).max(1)
}

/// Connections told to close but not yet closed that a listener lets pile
/// up before it waits for their closes; its descriptors stay within the
/// cap plus this many.
pub(crate) const CLOSING_MAX: usize = 16;

/// Descriptors kept for everything but HTTP connections. A volume holds
/// about five (its directory, lock, WAL and read files, an io_uring), a
/// cluster one or two sockets; 256 leaves room for dozens of each.
pub(crate) const FD_RESERVE: u64 = 256;

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        header: Duration::from_secs(10),
        idle: Duration::from_secs(120),
    };

    fn admitted(a: Admission) -> (Arc<Conn>, bool) {
        match a {
            Admission::Admitted { conn, evicted } => (conn, evicted),
            Admission::Refused => panic!("refused"),
        }
    }

    fn evicted(c: &Conn) -> bool {
        c.closing() == Some(Closed::Evicted)
    }

    #[test]
    fn deadlines_follow_the_request_cycle() {
        let table = Table::new(4, T);
        let (c, _) = admitted(table.admit(1_000));
        // New: the header timeout from the accept, TLS handshake included.
        assert_eq!(c.deadline(T), Some((11_000, Closed::HeaderTimeout)));
        // Bytes of the first request do not extend it (a slow trickle
        // cannot hold the connection).
        c.bytes_arrived(5_000);
        assert_eq!(c.deadline(T), Some((11_000, Closed::HeaderTimeout)));
        c.request_started();
        assert_eq!(c.deadline(T), None);
        c.request_done(6_000);
        // Keep-alive: the idle timeout from the end of the response.
        assert_eq!(c.deadline(T), Some((126_000, Closed::IdleTimeout)));
        // The next request's first byte starts its header time, once.
        c.bytes_arrived(100_000);
        c.bytes_arrived(105_000);
        assert_eq!(c.deadline(T), Some((110_000, Closed::HeaderTimeout)));
        c.request_started();
        // Bytes read while a request is in progress (a pipelined one) are
        // not a new wait.
        c.bytes_arrived(111_000);
        assert_eq!(c.deadline(T), None);
        c.request_done(112_000);
        assert_eq!(c.deadline(T), Some((232_000, Closed::IdleTimeout)));
    }

    #[test]
    fn a_sweep_closes_what_is_past_its_deadline_once() {
        let table = Table::new(2, T);
        let (new, _) = admitted(table.admit(0));
        let (kept, _) = admitted(table.admit(0));
        kept.request_started();
        kept.request_done(5_000);
        // The next deadline is the newcomer's header time.
        assert_eq!(table.sweep(9_999), Some(10_000));
        assert_eq!((new.closing(), kept.closing()), (None, None));
        // Then kept's idle time, the newcomer told to close.
        assert_eq!(table.sweep(10_000), Some(125_000));
        assert_eq!(new.closing(), Some(Closed::HeaderTimeout));
        // Told to close, it no longer counts against the cap of 2.
        let (third, evicted) = admitted(table.admit(10_000));
        assert!(!evicted);
        table.sweep(125_000);
        assert_eq!(kept.closing(), Some(Closed::IdleTimeout));
        // Once told, a later sweep or eviction does not tell it again.
        assert_eq!(third.closing(), Some(Closed::HeaderTimeout));
        // Nothing left to wait for: the sweeper sleeps until a change.
        assert_eq!(table.sweep(200_000), None);
        assert_eq!(table.lock().closing, 3);
        for c in [&new, &kept, &third] {
            table.remove(c);
        }
        assert_eq!((table.open(), table.lock().closing), (0, 0));
    }

    #[test]
    fn at_the_cap_the_longest_waiting_idle_connection_gives_way() {
        let table = Table::new(3, T);
        let (a, _) = admitted(table.admit(1_000));
        let (b, _) = admitted(table.admit(2_000));
        let (c, _) = admitted(table.admit(3_000));
        // a has a request in progress, so b has waited longest of the idle.
        a.request_started();
        let (d, evicted) = admitted(table.admit(4_000));
        assert!(evicted);
        assert!(super::tests::evicted(&b));
        assert!([&a, &c, &d].iter().all(|x| x.closing().is_none()));
        // b still holds its descriptor until its task ends, but no longer
        // counts against the cap: the next newcomer evicts c, not a.
        assert_eq!(table.open(), 4);
        let (e, evicted) = admitted(table.admit(5_000));
        assert!(evicted && super::tests::evicted(&c));
        table.remove(&b);
        table.remove(&c);
        assert_eq!(table.open(), 3);
        // A connection back from a response waits from the response's end:
        // younger than d, though accepted before it.
        a.request_done(6_000);
        let (_, evicted) = admitted(table.admit(7_000));
        assert!(evicted && super::tests::evicted(&d));
        assert!(a.closing().is_none() && e.closing().is_none());
    }

    #[test]
    fn the_walk_in_accept_order_finds_the_longest_wait() {
        // k was accepted first but answered a request since; x, accepted
        // later, has waited longer: x gives way.
        let table = Table::new(2, T);
        let (k, _) = admitted(table.admit(1_000));
        let (x, _) = admitted(table.admit(3_000));
        k.request_started();
        k.request_done(6_000);
        let (_, evicted) = admitted(table.admit(7_000));
        assert!(evicted && super::tests::evicted(&x) && k.closing().is_none());
    }

    #[test]
    fn at_the_cap_with_every_connection_busy_the_newcomer_is_refused() {
        let table = Table::new(2, T);
        let (a, _) = admitted(table.admit(1_000));
        let (b, _) = admitted(table.admit(1_000));
        a.request_started();
        b.request_started();
        assert!(matches!(table.admit(2_000), Admission::Refused));
        assert_eq!(table.open(), 2);
        b.request_done(3_000);
        let (_, evicted) = admitted(table.admit(4_000));
        assert!(evicted && super::tests::evicted(&b));
    }

    #[test]
    fn the_cap_fits_the_descriptor_limit() {
        // (wanted, listeners, RLIMIT_NOFILE) -> per listener
        let rows: &[(usize, usize, u64, usize)] = &[
            (256, 1, 1_024, 256),
            (256, 2, 1_024, 256),
            (256, 3, 1_024, 240),
            (256, 4, 1_024, 176),
            (5_000, 1, 1_024, 752),
            (5_000, 1, 524_288, 5_000),
            // A tiny limit: half of it for HTTP.
            (256, 1, 256, 112),
            (256, 1, 0, 1),
        ];
        for &(wanted, listeners, nofile, want) in rows {
            assert_eq!(
                fit(wanted, listeners, nofile),
                want,
                "{wanted} x {listeners} in {nofile}"
            );
        }
    }
}
