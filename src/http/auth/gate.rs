//! The wait queue in front of bcrypt checks: how many run at once, who
//! waits, in which order, and who is answered at once without a check.
//! The policy is in pure functions ([`can_start`], [`next`], [`admit`],
//! [`Failures`]) with the clock passed in; [`Gate`] holds the state under
//! one mutex and hands out [`Slot`]s. The module doc of `http::auth` says
//! why it is shaped this way.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::events::{Incidents, Report};
use crate::exposition::http_auth::{AuthMetrics, Skipped};

/// bcrypt checks running at once. Each one keeps a core busy for the whole
/// hash (about 250 ms at cost 12): more than two would take every core of a
/// small VM from the probes.
pub(crate) const SLOTS: usize = 2;

/// Checks from addresses with recent failures running at once: one slot is
/// always kept for addresses without failures, so a scraper with the right
/// password waits for at most its own hash, whatever a flood from another
/// address does.
pub(crate) const SUSPECT_SLOTS: usize = SLOTS - 1;

/// Checks waiting for a slot, all addresses together. More than the
/// scrapers an exporter has (two Prometheus servers of an HA pair, a few
/// jobs, all needing a check at once only after a start or a reload
/// emptied the cache), few enough that the last of them, at cost 12, waits
/// about 2 s (8 rounds of 2 checks at 250 ms): inside Prometheus's 10 s
/// scrape timeout even at the highest cost accepted (14, about 1 s a check).
pub(crate) const WAITING: usize = 16;

/// Checks waiting from one client address (an IPv6 /64). A Prometheus
/// server sends one scrape at a time per target and job; four leave room
/// for a few jobs with different users, and stop one address from filling
/// the queue.
pub(crate) const PER_ADDRESS: usize = 4;

/// Client addresses whose failures are remembered. A flood from one
/// address is one entry; when the table is full the address whose last
/// failure is the oldest is forgotten first, so a steady flood keeps its
/// entry unless someone cycles through more addresses than this, faster.
pub(crate) const ADDRESSES: usize = 1024;

/// A failure is forgotten this long after the address's last one: a
/// scraper that was refused during a password change is not held back
/// for long after.
pub(crate) const FORGET: Duration = Duration::from_secs(15 * 60);

/// An overload is over, and its end logged, once no request has been
/// refused for this long.
pub(crate) const QUIET: Duration = Duration::from_secs(60);

const _: () = assert!(SUSPECT_SLOTS >= 1 && SUSPECT_SLOTS < SLOTS);

/// Whom failures and waiting checks are counted against: an IPv4 address,
/// or the /64 of an IPv6 address (one host usually holds a whole /64 and
/// can pick any address in it). An IPv4 address mapped into IPv6 is the
/// IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ClientKey(IpAddr);

impl ClientKey {
    pub(crate) fn of(ip: IpAddr) -> ClientKey {
        match ip {
            IpAddr::V4(a) => ClientKey(IpAddr::V4(a)),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => ClientKey(IpAddr::V4(v4)),
                None => {
                    let s = a.segments();
                    ClientKey(IpAddr::V6(Ipv6Addr::new(
                        s[0], s[1], s[2], s[3], 0, 0, 0, 0,
                    )))
                }
            },
        }
    }

    /// For a request that came without a peer address (not through the
    /// exporter's listeners): all such requests share one key.
    pub(crate) fn unknown() -> ClientKey {
        ClientKey(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}"),
            IpAddr::V6(a) => write!(f, "{a}/64"),
        }
    }
}

/// A waiting check as the policy sees it. `rank` is the number of recent
/// failures of its address, read anew at every decision: an address that
/// fails while its checks wait drops behind at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Queued {
    pub(crate) key: ClientKey,
    pub(crate) rank: u32,
    /// Arrival order.
    pub(crate) seq: u64,
}

/// Whether a check of `rank` may take a slot now.
pub(crate) fn can_start(rank: u32, running: usize, running_suspect: usize) -> bool {
    running < SLOTS && (rank == 0 || running_suspect < SUSPECT_SLOTS)
}

/// The waiting check to start next, if any may start: the one with the
/// fewest recent failures, the earliest among equals. When that one may not
/// start (a suspect while the suspect slots are taken), no other may
/// either: every other ranks as high or higher.
pub(crate) fn next(waiting: &[Queued], running: usize, running_suspect: usize) -> Option<usize> {
    let (i, best) = waiting
        .iter()
        .enumerate()
        .min_by_key(|(_, q)| (q.rank, q.seq))?;
    can_start(best.rank, running, running_suspect).then_some(i)
}

/// What to do with a check that cannot start at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    Wait,
    /// Wait, in place of the waiting check at this index, which is
    /// answered 503: the queue is full and that one ranks below.
    WaitBumping(usize),
    Refuse(Skipped),
}

/// Whether a check from `key` of `rank` may join the queue `waiting`.
pub(crate) fn admit(waiting: &[Queued], key: ClientKey, rank: u32) -> Admit {
    if waiting.iter().filter(|q| q.key == key).count() >= PER_ADDRESS {
        return Admit::Refuse(Skipped::AddressBusy);
    }
    if waiting.len() < WAITING {
        return Admit::Wait;
    }
    // The last one `next` would pick.
    match waiting
        .iter()
        .enumerate()
        .max_by_key(|(_, q)| (q.rank, q.seq))
    {
        Some((i, worst)) if worst.rank > rank => Admit::WaitBumping(i),
        _ => Admit::Refuse(Skipped::QueueFull),
    }
}

#[derive(Debug, Clone, Copy)]
struct Failed {
    count: u32,
    last: Instant,
}

/// Recent failures per client address, at most [`ADDRESSES`] of them.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    map: HashMap<ClientKey, Failed>,
}

impl Failures {
    /// Recent failures of `key`: 0 for an address without any, or whose
    /// last one is older than [`FORGET`].
    pub(crate) fn rank(&self, key: ClientKey, now: Instant) -> u32 {
        match self.map.get(&key) {
            Some(f) if now.saturating_duration_since(f.last) < FORGET => f.count,
            _ => 0,
        }
    }

    pub(crate) fn failed(&mut self, key: ClientKey, now: Instant) {
        if !self.map.contains_key(&key) && self.map.len() >= ADDRESSES {
            self.map
                .retain(|_, f| now.saturating_duration_since(f.last) < FORGET);
            if self.map.len() >= ADDRESSES
                && let Some(oldest) = self.map.iter().min_by_key(|(_, f)| f.last).map(|(k, _)| *k)
            {
                self.map.remove(&oldest);
            }
        }
        let f = self.map.entry(key).or_insert(Failed {
            count: 0,
            last: now,
        });
        if now.saturating_duration_since(f.last) >= FORGET {
            f.count = 0;
        }
        f.count = f.count.saturating_add(1);
        f.last = now;
    }

    /// The right password came from `key`: its failures are forgiven.
    pub(crate) fn succeeded(&mut self, key: ClientKey) {
        self.map.remove(&key);
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

/// Requests refused because the queue was full: one incident from the
/// first refusal until [`QUIET`] passes without one, logged when it starts
/// (then again every `events::LOG_REPEAT` while it lasts) and when it ends.
#[derive(Debug, Default)]
pub(crate) struct Overload {
    incidents: Incidents<(), ()>,
    span: Option<(Instant, Instant)>,
}

/// What to log about an overload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OverloadLog {
    Began { key: ClientKey, why: Skipped },
    Goes { refused: u64 },
    Ended { refused: u64, lasted: Duration },
}

impl Overload {
    pub(crate) fn refused(
        &mut self,
        key: ClientKey,
        why: Skipped,
        now: Instant,
    ) -> Option<OverloadLog> {
        let first = self.span.map_or(now, |(first, _)| first);
        self.span = Some((first, now));
        match self.incidents.failed((), (), now) {
            Report::New => Some(OverloadLog::Began { key, why }),
            Report::Again { failures } => Some(OverloadLog::Goes { refused: failures }),
            Report::Quiet => None,
        }
    }

    /// Called as checks come and go: the end, once [`QUIET`] has passed
    /// since the last refusal.
    pub(crate) fn tick(&mut self, now: Instant) -> Option<OverloadLog> {
        let (first, last) = self.span?;
        if now.saturating_duration_since(last) < QUIET {
            return None;
        }
        self.span = None;
        let (refused, _) = self.incidents.succeeded((), now)?;
        Some(OverloadLog::Ended {
            refused,
            lasted: last.saturating_duration_since(first),
        })
    }
}

fn log(entry: Option<OverloadLog>) {
    match entry {
        None => {}
        Some(OverloadLog::Began { key, why }) => tracing::warn!(
            client = %key,
            reason = why.as_str(),
            "too many password checks waiting: answering 429 or 503 without a check until it \
             eases (pgstorage_http_auth_skipped_total)"
        ),
        Some(OverloadLog::Goes { refused }) => {
            tracing::warn!(refused, "password checks still refused for a full queue")
        }
        Some(OverloadLog::Ended { refused, lasted }) => tracing::info!(
            refused,
            lasted_seconds = lasted.as_secs(),
            "password check queue no longer full"
        ),
    }
}

struct Waiter {
    key: ClientKey,
    seq: u64,
    tx: oneshot::Sender<Result<Slot, Skipped>>,
}

#[derive(Default)]
struct State {
    running: usize,
    running_suspect: usize,
    seq: u64,
    waiting: Vec<Waiter>,
    failures: Failures,
    overload: Overload,
}

impl State {
    fn queued(&self, now: Instant) -> Vec<Queued> {
        self.waiting
            .iter()
            .map(|w| Queued {
                key: w.key,
                rank: self.failures.rank(w.key, now),
                seq: w.seq,
            })
            .collect()
    }
}

/// The one queue of the process: it outlives reloads of the users, so a
/// reload neither doubles the checks running at once nor forgets who
/// failed.
pub(crate) struct Gate {
    state: Mutex<State>,
    metrics: AuthMetrics,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.lock();
        f.debug_struct("Gate")
            .field("running", &s.running)
            .field("waiting", &s.waiting.len())
            .field("addresses", &s.failures.len())
            .finish()
    }
}

/// The right to run one bcrypt check. Dropped (with or without
/// [`Slot::finish`]), it frees the slot for the next waiting check.
pub(crate) struct Slot {
    gate: Option<Arc<Gate>>,
    key: ClientKey,
    suspect: bool,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("key", &self.key)
            .field("suspect", &self.suspect)
            .finish()
    }
}

impl Slot {
    /// The check ran: counts it, remembers a failure of (or forgives) the
    /// address, and frees the slot.
    pub(crate) fn finish(mut self, success: bool) {
        if let Some(gate) = self.gate.take() {
            gate.metrics.checked(success);
            gate.release(self.key, self.suspect, Some(success));
        }
    }

    /// The check did not run because its client had gone.
    pub(crate) fn abandon(mut self) {
        if let Some(gate) = self.gate.take() {
            gate.metrics.skipped(Skipped::ClientGone);
            gate.release(self.key, self.suspect, None);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.release(self.key, self.suspect, None);
        }
    }
}

/// Takes the waiting check out of the queue when its request is dropped
/// (hyper drops it when the client hangs up), so it neither holds a place
/// nor gets a slot it would only give back.
struct Place<'a> {
    gate: &'a Arc<Gate>,
    seq: u64,
    rx: oneshot::Receiver<Result<Slot, Skipped>>,
    answered: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let removed = {
            let mut s = self.gate.lock();
            let at = s.waiting.iter().position(|w| w.seq == self.seq);
            let removed = at.map(|i| s.waiting.remove(i)).is_some();
            self.gate.metrics.in_flight(s.running, s.waiting.len());
            removed
        };
        if removed {
            self.gate.metrics.skipped(Skipped::ClientGone);
        } else if let Ok(Ok(slot)) = self.rx.try_recv() {
            // Granted just before the client went: given back unused.
            slot.abandon();
        }
    }
}

impl Gate {
    pub(crate) fn new(metrics: AuthMetrics) -> Gate {
        metrics.init();
        Gate {
            state: Mutex::new(State::default()),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counts that are still
        // counts; the queue goes on.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a slot for a check from `key`, or refuses at once. The
    /// returned future may be dropped at any point: the place in the queue
    /// goes with it.
    pub(crate) async fn enter(self: &Arc<Self>, key: ClientKey) -> Result<Slot, Skipped> {
        let now = Instant::now();
        let (seq, rx, bumped, refused, ended) = {
            let mut s = self.lock();
            let ended = s.overload.tick(now);
            let rank = s.failures.rank(key, now);
            // Straight to a free slot unless a waiting check ranks as high:
            // the only checks left waiting beside a free slot are suspects
            // kept from the slot for addresses without failures.
            if can_start(rank, s.running, s.running_suspect)
                && s.queued(now).iter().all(|q| q.rank > rank)
            {
                let slot = self.start(&mut s, key, rank > 0);
                self.metrics.in_flight(s.running, s.waiting.len());
                drop(s);
                log(ended);
                return Ok(slot);
            }
            let (mut bumped, mut refused) = (None, None);
            match admit(&s.queued(now), key, rank) {
                Admit::Wait => {}
                Admit::WaitBumping(i) => {
                    let w = s.waiting.remove(i);
                    refused = s.overload.refused(w.key, Skipped::QueueFull, now);
                    bumped = Some(w.tx);
                }
                Admit::Refuse(why) => {
                    let entry = s.overload.refused(key, why, now);
                    drop(s);
                    self.metrics.skipped(why);
                    log(ended);
                    log(entry);
                    return Err(why);
                }
            }
            s.seq += 1;
            let seq = s.seq;
            let (tx, rx) = oneshot::channel();
            s.waiting.push(Waiter { key, seq, tx });
            // A suspect may wait while a slot is free (the one kept for
            // addresses without failures); a check without failures takes
            // it at once.
            self.dispatch(&mut s);
            self.metrics.in_flight(s.running, s.waiting.len());
            (seq, rx, bumped, refused, ended)
        };
        if let Some(tx) = bumped {
            self.metrics.skipped(Skipped::QueueFull);
            let _ = tx.send(Err(Skipped::QueueFull));
        }
        log(ended);
        log(refused);
        let mut place = Place {
            gate: self,
            seq,
            rx,
            answered: false,
        };
        let r = (&mut place.rx).await;
        place.answered = true;
        // The sender is dropped only after an answer is sent.
        r.unwrap_or(Err(Skipped::QueueFull))
    }

    /// Logs the end of an overload that has passed, for a request that
    /// needs no check (a cached password): without it, the end would wait
    /// for the next uncached check.
    pub(crate) fn tick(&self) {
        let ended = self.lock().overload.tick(Instant::now());
        log(ended);
    }

    fn start(self: &Arc<Self>, s: &mut State, key: ClientKey, suspect: bool) -> Slot {
        s.running += 1;
        if suspect {
            s.running_suspect += 1;
        }
        Slot {
            gate: Some(self.clone()),
            key,
            suspect,
        }
    }

    /// Hands free slots to the best waiting checks.
    fn dispatch(self: &Arc<Self>, s: &mut State) {
        let now = Instant::now();
        loop {
            let queued = s.queued(now);
            let Some(i) = next(&queued, s.running, s.running_suspect) else {
                return;
            };
            let w = s.waiting.remove(i);
            let slot = self.start(s, w.key, queued[i].rank > 0);
            if let Err(Ok(mut slot)) = w.tx.send(Ok(slot)) {
                // Cannot happen (a place leaves the queue before its
                // receiver goes), but if it did: undo without the lock
                // that `Slot::drop` would take again.
                slot.gate = None;
                s.running -= 1;
                if slot.suspect {
                    s.running_suspect -= 1;
                }
            }
        }
    }

    fn release(self: &Arc<Self>, key: ClientKey, suspect: bool, success: Option<bool>) {
        let now = Instant::now();
        let ended = {
            let mut s = self.lock();
            s.running = s.running.saturating_sub(1);
            if suspect {
                s.running_suspect = s.running_suspect.saturating_sub(1);
            }
            match success {
                Some(true) => s.failures.succeeded(key),
                Some(false) => s.failures.failed(key, now),
                None => {}
            }
            self.dispatch(&mut s);
            self.metrics.in_flight(s.running, s.waiting.len());
            s.overload.tick(now)
        };
        log(ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(last: u8) -> ClientKey {
        ClientKey::of(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
    }

    fn q(k: u8, rank: u32, seq: u64) -> Queued {
        Queued {
            key: key(k),
            rank,
            seq,
        }
    }

    #[test]
    fn one_slot_is_kept_for_addresses_without_failures() {
        assert!(can_start(0, 0, 0));
        assert!(can_start(5, 0, 0));
        assert!(can_start(0, 1, 1));
        assert!(!can_start(5, 1, 1), "the second slot is not for suspects");
        assert!(!can_start(0, 2, 1));
        assert!(!can_start(0, 2, 0));
    }

    #[test]
    fn fewest_failures_first_then_arrival() {
        // A flood's checks arrived first; a clean one after them.
        let w = [q(2, 40, 1), q(2, 40, 2), q(3, 1, 3), q(1, 0, 4)];
        assert_eq!(next(&w, 0, 0), Some(3));
        assert_eq!(next(&w, 1, 0), Some(3));
        assert_eq!(next(&w, 2, 0), None);
        let w = [q(2, 40, 1), q(3, 1, 3)];
        assert_eq!(next(&w, 0, 0), Some(1));
        // The suspect slot is taken: nobody else may start.
        assert_eq!(next(&w, 1, 1), None);
        let w = [q(1, 0, 7), q(4, 0, 5)];
        assert_eq!(next(&w, 1, 1), Some(1));
        assert_eq!(next(&[], 0, 0), None);
    }

    #[test]
    fn admission_bounds_each_address_and_the_queue() {
        let full_of_one: Vec<Queued> = (0..PER_ADDRESS as u64).map(|s| q(2, 9, s)).collect();
        assert_eq!(
            admit(&full_of_one, key(2), 9),
            Admit::Refuse(Skipped::AddressBusy)
        );
        // Another address is not held back by it.
        assert_eq!(admit(&full_of_one, key(1), 0), Admit::Wait);
        // A clean address's own bound holds too.
        let four_clean: Vec<Queued> = (0..PER_ADDRESS as u64).map(|s| q(1, 0, s)).collect();
        assert_eq!(
            admit(&four_clean, key(1), 0),
            Admit::Refuse(Skipped::AddressBusy)
        );

        // A full queue of suspects from many addresses: a clean arrival
        // takes the place of the last one `next` would pick.
        let mut full: Vec<Queued> = (0..WAITING as u64)
            .map(|s| q(10 + (s % 8) as u8, 3, s))
            .collect();
        full[5].rank = 7;
        assert_eq!(admit(&full, key(1), 0), Admit::WaitBumping(5));
        assert_eq!(admit(&full, key(1), 6), Admit::WaitBumping(5));
        assert_eq!(admit(&full, key(1), 7), Admit::Refuse(Skipped::QueueFull));
        full[5].rank = 3;
        // Among equals the newest goes.
        assert_eq!(admit(&full, key(1), 0), Admit::WaitBumping(WAITING - 1));
        let all_clean: Vec<Queued> = (0..WAITING as u64)
            .map(|s| q(10 + (s % 8) as u8, 0, s))
            .collect();
        assert_eq!(
            admit(&all_clean, key(1), 0),
            Admit::Refuse(Skipped::QueueFull)
        );
    }

    #[test]
    fn failures_are_remembered_forgiven_and_forgotten() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut f = Failures::default();
        assert_eq!(f.rank(key(2), t0), 0);
        f.failed(key(2), t0);
        f.failed(key(2), t0 + s);
        assert_eq!(f.rank(key(2), t0 + s), 2);
        assert_eq!(f.rank(key(1), t0 + s), 0);
        // Forgotten FORGET after the last failure.
        assert_eq!(f.rank(key(2), t0 + s + FORGET - s), 2);
        assert_eq!(f.rank(key(2), t0 + s + FORGET), 0);
        f.failed(key(2), t0 + s + FORGET);
        assert_eq!(f.rank(key(2), t0 + s + FORGET), 1, "counted anew");
        f.succeeded(key(2));
        assert_eq!(f.rank(key(2), t0 + s + FORGET), 0);
    }

    #[test]
    fn the_failure_table_is_bounded_and_keeps_a_steady_flood() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let mut f = Failures::default();
        let flood = key(2);
        for i in 0..(3 * ADDRESSES as u32) {
            let other = ClientKey::of(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)));
            let now = t0 + ms * (2 * i);
            f.failed(other, now);
            f.failed(flood, now + ms);
            assert!(f.len() <= ADDRESSES);
        }
        assert_eq!(
            f.rank(flood, t0 + ms * (6 * ADDRESSES as u32)),
            3 * ADDRESSES as u32
        );
    }

    #[test]
    fn ipv6_is_keyed_by_its_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(ClientKey::of(a), ClientKey::of(b));
        assert_ne!(ClientKey::of(a), ClientKey::of(c));
        assert_eq!(ClientKey::of(a).to_string(), "2001:db8:1:2::/64");
        let mapped: IpAddr = "::ffff:127.0.0.2".parse().unwrap();
        assert_eq!(ClientKey::of(mapped), key(2));
        assert_eq!(key(2).to_string(), "127.0.0.2");
    }

    #[test]
    fn an_overload_is_logged_when_it_begins_and_when_it_ends() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut o = Overload::default();
        assert_eq!(o.tick(t0), None);
        assert_eq!(
            o.refused(key(2), Skipped::AddressBusy, t0),
            Some(OverloadLog::Began {
                key: key(2),
                why: Skipped::AddressBusy
            })
        );
        for i in 1..100 {
            assert_eq!(o.refused(key(2), Skipped::AddressBusy, t0 + s * i), None);
            assert_eq!(o.tick(t0 + s * i), None);
        }
        assert_eq!(o.tick(t0 + s * 99 + QUIET - s), None);
        assert_eq!(
            o.tick(t0 + s * 99 + QUIET),
            Some(OverloadLog::Ended {
                refused: 100,
                lasted: s * 99
            })
        );
        assert_eq!(o.tick(t0 + s * 200), None);
        assert!(matches!(
            o.refused(key(3), Skipped::QueueFull, t0 + s * 300),
            Some(OverloadLog::Began { .. })
        ));
    }

    fn gate() -> Arc<Gate> {
        let mut r = prometheus_client::registry::Registry::default();
        Arc::new(Gate::new(AuthMetrics::register(&mut r)))
    }

    /// Polls a future once: whether it is ready now.
    fn poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[test]
    fn a_dropped_waiter_leaves_the_queue_and_gets_no_slot() {
        let g = gate();
        let flood = key(2);
        // The flood has failed before.
        g.lock().failures.failed(flood, Instant::now());
        let a = poll_once(&mut Box::pin(g.enter(key(3)))).unwrap().unwrap();
        let b = poll_once(&mut Box::pin(g.enter(flood))).unwrap().unwrap();
        assert_eq!(g.lock().running, 2);
        let mut gone = Box::pin(g.enter(key(4)));
        assert!(poll_once(&mut gone).is_none());
        let mut flood_waits = Box::pin(g.enter(flood));
        assert!(poll_once(&mut flood_waits).is_none());
        let mut real = Box::pin(g.enter(key(1)));
        assert!(poll_once(&mut real).is_none());
        assert_eq!(g.lock().waiting.len(), 3);
        // The client of the first waiter hangs up.
        drop(gone);
        assert_eq!(g.lock().waiting.len(), 2);
        // The flood's slot frees: the clean check goes before the flood's
        // earlier one.
        b.finish(false);
        let real_slot = poll_once(&mut real).unwrap().unwrap();
        assert!(poll_once(&mut flood_waits).is_none());
        // Clean slot frees: the flood may use one slot, not two.
        a.finish(true);
        let flood_slot = poll_once(&mut flood_waits).unwrap().unwrap();
        assert_eq!(g.lock().running, 2);
        drop(real_slot);
        drop(flood_slot);
        let s = g.lock();
        assert_eq!((s.running, s.running_suspect, s.waiting.len()), (0, 0, 0));
    }

    #[test]
    fn a_full_queue_refuses_at_once_and_bumps_for_a_clean_address() {
        let g = gate();
        let now = Instant::now();
        for k in 10..30 {
            g.lock().failures.failed(key(k), now);
        }
        let _a = poll_once(&mut Box::pin(g.enter(key(3)))).unwrap().unwrap();
        let _b = poll_once(&mut Box::pin(g.enter(key(4)))).unwrap().unwrap();
        let mut waiting = Vec::new();
        for i in 0..WAITING as u8 {
            let mut f = Box::pin(g.enter(key(10 + i)));
            assert!(poll_once(&mut f).is_none());
            waiting.push(f);
        }
        let mut more = Box::pin(g.enter(key(29)));
        assert_eq!(
            poll_once(&mut more).map(|r| r.err()),
            Some(Some(Skipped::QueueFull))
        );
        // A clean address takes the newest suspect's place.
        let mut clean = Box::pin(g.enter(key(1)));
        assert!(poll_once(&mut clean).is_none());
        let last = waiting.last_mut().unwrap();
        assert_eq!(
            poll_once(last).map(|r| r.err()),
            Some(Some(Skipped::QueueFull))
        );
        assert_eq!(g.lock().waiting.len(), WAITING);
    }
}
