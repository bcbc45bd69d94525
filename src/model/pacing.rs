//! How hard the probes may write: the exporter's own device writes against
//! a write-IOPS cap that also counts them.
//!
//! A cap that counts the exporter's IO (a cloud volume's provisioned IOPS,
//! or a cgroup the exporter itself is in) is shared with PostgreSQL: every
//! write a probe makes is one PostgreSQL cannot. The probes keep their share
//! of such a cap under [`MAX_CAP_SHARE`] by stretching their schedule, and
//! never below one lone probe per stretched interval.

use std::time::Duration;

/// Largest share of a write-IOPS cap the probes may take.
pub(crate) const MAX_CAP_SHARE: f64 = 0.02;

/// Device writes per commit probe assumed before one is measured: ext4 and
/// XFS write the data block and a journal or log block (two on the build
/// machine, for fio as for the probe).
pub(crate) const DEFAULT_WRITES_PER_COMMIT: f64 = 2.0;

/// Commit probes per second at a schedule: one lone probe per `interval`
/// plus `burst` back-to-back probes per `busy_every` (zero: no bursts).
pub(crate) fn commits_per_second(interval: Duration, busy_every: Duration, burst: u32) -> f64 {
    let lone = if interval.is_zero() {
        0.0
    } else {
        1.0 / interval.as_secs_f64()
    };
    let bursts = if busy_every.is_zero() {
        0.0
    } else {
        f64::from(burst) / busy_every.as_secs_f64()
    };
    lone + bursts
}

/// The factor to stretch a schedule by so that `own_writes_per_second`
/// becomes at most `MAX_CAP_SHARE` of `cap` write IOPS; 1 when it already
/// is, or when the inputs say nothing (no cap, no writes).
pub(crate) fn slowdown(own_writes_per_second: f64, cap: f64) -> f64 {
    let meaningful = own_writes_per_second.is_finite()
        && own_writes_per_second > 0.0
        && cap.is_finite()
        && cap > 0.0;
    if !meaningful {
        return 1.0;
    }
    (own_writes_per_second / (cap * MAX_CAP_SHARE)).max(1.0)
}

/// The exporter's own periodic tasks (PostgreSQL rounds and wait samples,
/// the limits pass, the probe watchdog) end their waits on whole multiples
/// of their period since the UNIX epoch, so tasks due at about the same
/// moment wake the process once, not once each: on a 2-vCPU virtual
/// machine each wakeup of an idle thread cost tens of µs of CPU (more on
/// an idle host), often more than the work it woke for. `now` is the time
/// since the epoch; the result is how long from `now` to the first
/// multiple of `grain` at least `min` after it. A zero grain waits `min`.
pub(crate) fn until_boundary(now: Duration, grain: Duration, min: Duration) -> Duration {
    let earliest = now + min;
    let g = grain.as_nanos();
    if g == 0 {
        return min;
    }
    let up = earliest.as_nanos().div_ceil(g) * g;
    Duration::from_nanos(u64::try_from(up).unwrap_or(u64::MAX)).saturating_sub(now)
}

/// The period between queue-depth sweeps: `sweep_every`, stretched so
/// that the sweep's writes (`write_fraction` of `sweep_duration`, each
/// write depth using whatever write cap there is in full) take at most
/// [`MAX_CAP_SHARE`] of the time. A sweep without writes is not stretched.
pub(crate) fn sweep_period(
    sweep_every: Duration,
    sweep_duration: Duration,
    write_fraction: f64,
) -> Duration {
    if !(write_fraction.is_finite() && write_fraction > 0.0) {
        return sweep_every;
    }
    sweep_every.max(sweep_duration.mul_f64(write_fraction / MAX_CAP_SHARE))
}

/// What a burst's next read is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BurstRead {
    /// Done but not recorded: the path is still waking up.
    WarmUp,
    /// Recorded as the busy figure.
    Record,
    /// The burst is over.
    Done,
}

/// How a burst's reads are recorded: `warm_up` reads first, not
/// recorded; then every read that starts within `span` of the first
/// recorded one, at least `min` and at most `max` of them.
///
/// A span rather than a count, so that the busy figure weighs a fast
/// moment by the reads it allows, as a stream does. fio's back-to-back
/// p50 is the median of every read in a stream, and a stream holds more
/// reads from its fast stretches than its slow ones. A fixed count from
/// each of a window's few bursts weighs each moment alike instead. On the
/// build machine a back-to-back stream's latency swung between about 65
/// and 118 µs from one quarter second to the next. Over the same stream,
/// two bursts of 32 reads put the median 1.05-1.15 above the stream's;
/// two 8 ms spans put it at 0.97-0.99 of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadBurstPlan {
    pub(crate) warm_up: u32,
    pub(crate) span: Duration,
    pub(crate) min: u32,
    pub(crate) max: u32,
}

impl ReadBurstPlan {
    /// The most reads one burst records.
    pub(crate) fn most_recorded(&self) -> u32 {
        self.max.max(self.min)
    }
}

/// One burst's way through a [`ReadBurstPlan`]: the reads done and
/// recorded so far, and when the first recorded one started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadBurst {
    plan: ReadBurstPlan,
    done: u32,
    recorded: u32,
    first_recorded_at: Option<Duration>,
}

impl ReadBurst {
    pub(crate) fn new(plan: ReadBurstPlan) -> ReadBurst {
        ReadBurst {
            plan,
            done: 0,
            recorded: 0,
            first_recorded_at: None,
        }
    }

    /// What the next read, about to start `elapsed` into the burst, is
    /// for; counted as done (and recorded) unless the burst is over.
    pub(crate) fn next(&mut self, elapsed: Duration) -> BurstRead {
        let plan = &self.plan;
        let recording_for = self
            .first_recorded_at
            .map_or(Duration::ZERO, |t| elapsed.saturating_sub(t));
        let step = if self.done < plan.warm_up {
            BurstRead::WarmUp
        } else if self.recorded < plan.min
            || (self.recorded < plan.max && (self.recorded == 0 || recording_for < plan.span))
        {
            BurstRead::Record
        } else {
            BurstRead::Done
        };
        match step {
            BurstRead::WarmUp => self.done += 1,
            BurstRead::Record => {
                self.first_recorded_at.get_or_insert(elapsed);
                self.done += 1;
                self.recorded += 1;
            }
            BurstRead::Done => {}
        }
        step
    }
}

/// How a burst of back-to-back commits runs and which of its commits are
/// the busy figure.
///
/// A write-IOPS throttle the exporter cannot see (a cloud volume's, or a
/// cgroup whose files are hidden from it) lets a burst start at device
/// speed and then holds commits back: under a v1 blkio throttle at 400
/// write IOPS on the quiet build machine, 20 commits of about 0.1 ms, then
/// one of about 98 ms, and so on (200 commits/s, as fio measured in the
/// same group); on a loaded host the same throttle also spread waits of a
/// timer tick (4 ms) between them. The median of such a burst stays near
/// device speed; only the mean over whole cycles (fast commits plus the
/// waits that end them) is the rate one client gets. So a burst that meets
/// a wait goes on for [`CommitBurstPlan::span`] after it (many cycles,
/// whatever their shape), and records the commits after its first wait up
/// to and including its last one ([`whole_cycles`]). A burst without
/// whole cycles records its last `least` / 2 commits (the second half of
/// one without waits), as the device path has warmed up by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CommitBurstPlan {
    /// Commits every burst does; the first half warms the path up.
    pub(crate) least: u32,
    /// How long a burst that met a wait goes on after it.
    pub(crate) span: Duration,
    /// At most this many commits in one burst.
    pub(crate) most: u32,
}

/// A commit at least this many times the burst's fastest one, and at least
/// [`WAIT_FLOOR`], waited for a throttle (or for a busy host: either way a
/// client committing then would have waited too). Throttle waits on the
/// build machine were 4-105 ms against 0.08-0.3 ms commits.
pub(crate) const WAIT_FACTOR: f64 = 8.0;
/// See [`WAIT_FACTOR`]: below a millisecond a slow commit is the device
/// path's own jitter, not a throttle's slice.
pub(crate) const WAIT_FLOOR: Duration = Duration::from_millis(1);

/// Whether a commit of `seconds` waited for a throttle, given the fastest
/// commit of its burst so far.
pub(crate) fn is_wait(seconds: f64, fastest: f64) -> bool {
    seconds >= WAIT_FLOOR.as_secs_f64() && seconds >= WAIT_FACTOR * fastest
}

/// One burst's way through a [`CommitBurstPlan`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct CommitBurst {
    plan: CommitBurstPlan,
    done: u32,
    /// When the first wait ended, into the burst.
    first_wait_at: Option<Duration>,
    fastest: f64,
}

impl CommitBurst {
    pub(crate) fn new(plan: CommitBurstPlan) -> CommitBurst {
        CommitBurst {
            plan,
            done: 0,
            first_wait_at: None,
            fastest: f64::INFINITY,
        }
    }

    /// Counts one commit of `seconds` that finished `elapsed` into the
    /// burst.
    pub(crate) fn done(&mut self, seconds: f64, elapsed: Duration) {
        // The first commit of a burst comes after a pause and may be slow
        // for reasons of its own: it is never a wait.
        if self.done > 0 && is_wait(seconds, self.fastest) {
            self.first_wait_at.get_or_insert(elapsed);
        }
        self.done += 1;
        self.fastest = self.fastest.min(seconds);
    }

    /// Commits done so far.
    pub(crate) fn count(&self) -> u32 {
        self.done
    }

    /// Whether another commit follows, `elapsed` into the burst: always
    /// up to `least`; past it only in a burst that met a wait, until
    /// `span` after that wait, within `most` commits.
    pub(crate) fn more(&self, elapsed: Duration) -> bool {
        let p = &self.plan;
        if self.done >= p.most {
            return false;
        }
        if self.done < p.least {
            return true;
        }
        self.first_wait_at
            .is_some_and(|at| elapsed.saturating_sub(at) < p.span)
    }
}

/// A wait at least this share of a burst's longest commit ends a
/// throttle's cycle. A v1 blkio throttle holds the commit that exceeds a
/// slice's allowance until the next slice (45-110 ms on the build machine)
/// and, on a loaded host, others for a timer tick (4 ms) within the slice.
/// A cycle runs from one slice wait to the next; cutting at a tick instead
/// would count the slice's waits but not all of its fast commits, and read
/// the rate 5 % low at 100 write IOPS.
pub(crate) const CYCLE_WAIT_SHARE: f64 = 0.5;

/// The busy figure of a burst of `n` commits that met no throttle cycles:
/// its last `least` / 2 commits, the ones before having warmed the device
/// path up (the second half of a burst of `least`). A burst that ran on
/// past `least` after a single slow commit (a busy host, not a throttle)
/// records no more than one of `least` does, so it weighs its moment no
/// more than any other burst and the rates still wait for several.
pub(crate) fn warmed_tail(n: usize, least: u32) -> std::ops::Range<usize> {
    let keep = (least as usize / 2).min(n - n / 2);
    n - keep..n
}

/// Where a finished burst's throttle cycles end: the indexes of its
/// commits that waited ([`is_wait`]) at least [`CYCLE_WAIT_SHARE`] of its
/// longest commit. The first commit is never a wait (it follows a pause).
fn cycle_ends(latencies: &[f64]) -> Vec<usize> {
    let longest = latencies.iter().skip(1).copied().fold(0.0, f64::max);
    let mut fastest = f64::INFINITY;
    let mut ends = Vec::new();
    for (i, &s) in latencies.iter().enumerate() {
        if i > 0 && is_wait(s, fastest) && s >= CYCLE_WAIT_SHARE * longest {
            ends.push(i);
        }
        fastest = fastest.min(s);
    }
    ends
}

/// The whole throttle cycles of a finished burst (latencies in order):
/// from just after the first wait that ends a cycle ([`CYCLE_WAIT_SHARE`])
/// up to and including the last one, whose mean is the throttled rate;
/// `None` when it has fewer than two such waits, and the burst's busy
/// figure is its [`warmed_tail`].
pub(crate) fn whole_cycles(latencies: &[f64]) -> Option<std::ops::Range<usize>> {
    match cycle_ends(latencies)[..] {
        [first, .., last] => Some(first + 1..last + 1),
        _ => None,
    }
}

/// Whole cycles each half of a burst's cycles needs before the burst can
/// be a steady throttle ([`steady_throttle`]).
pub(crate) const STEADY_HALF_CYCLES: usize = 3;
/// How far apart (the faster half's rate over the slower's) the two
/// halves of a steady throttle's cycles may be.
pub(crate) const STEADY_SPREAD: f64 = 1.15;

/// Whether a finished burst ran through a steady throttle: at least
/// 2 × [`STEADY_HALF_CYCLES`] whole cycles, and the first half of them
/// and the second giving the same rate within [`STEADY_SPREAD`]. Such a
/// burst's rate is the throttle's, set outside the host and repeated
/// cycle after cycle, so it stands for several moments of the host, not
/// one: under a v1 blkio throttle of 100 write IOPS three bursts minutes
/// apart each read 20.0-20.1 ms per commit. A busy host's stalls also end
/// cycles, but few and uneven ones, and fail this.
pub(crate) fn steady_throttle(latencies: &[f64]) -> bool {
    let ends = cycle_ends(latencies);
    let cycles = ends.len().saturating_sub(1);
    if cycles < 2 * STEADY_HALF_CYCLES {
        return false;
    }
    let mid = ends[cycles / 2];
    let rate = |r: std::ops::Range<usize>| {
        let n = r.len() as f64;
        let total: f64 = latencies[r].iter().sum();
        n / total
    };
    let (a, b) = (rate(ends[0] + 1..mid + 1), rate(mid + 1..ends[cycles] + 1));
    a.is_finite() && b.is_finite() && a.max(b) <= STEADY_SPREAD * a.min(b)
}

#[cfg(test)]
mod tests {

    #[test]
    fn waits_end_on_shared_boundaries() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // 10 s tasks that last ran at 1234.3 s and 1237.9 s both end at 1240 s.
        assert_eq!(until_boundary(ms(1_234_300), s(10), s(5)), ms(5_700));
        assert_eq!(until_boundary(ms(1_237_900), s(10), ms(100)), ms(2_100));
        // At least `min` ahead: from 1236 s with 5 s to go, 1250 s.
        assert_eq!(until_boundary(s(1236), s(10), s(5)), s(14));
        // On a boundary already: no wait.
        assert_eq!(
            until_boundary(s(1240), s(1), Duration::ZERO),
            Duration::ZERO
        );
        assert_eq!(until_boundary(ms(1500), Duration::ZERO, ms(200)), ms(200));
    }
    use super::*;

    /// The commits of a finished burst that are its busy figure, as the
    /// probe runner picks them: whole throttle cycles, else the warmed tail.
    fn steady_commits(latencies: &[f64], least: u32) -> std::ops::Range<usize> {
        whole_cycles(latencies).unwrap_or_else(|| warmed_tail(latencies.len(), least))
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn default_schedule_rate() {
        // One lone commit per second and 24 per 40 s: 1.6 commits/s; at the
        // 2.27 device writes per commit measured on ext4 (journal included)
        // 3.6 device writes/s, under the budget of 4.
        let c = commits_per_second(S, 40 * S, 24);
        assert!((c - 1.6).abs() < 1e-9, "{c}");
        assert!(c * 2.27 <= 4.0);
        // A burst every 30 s would have been 1.8 commits/s: 4.09 writes/s.
        assert!(commits_per_second(S, 30 * S, 24) * 2.27 > 4.0);
        assert_eq!(commits_per_second(S, Duration::ZERO, 24), 1.0);
        assert_eq!(commits_per_second(Duration::ZERO, Duration::ZERO, 24), 0.0);
    }

    #[test]
    fn slowdown_table() {
        // (own writes/s, cap, factor)
        let cases = [
            (3.6, 100.0, 1.8),  // 3.6 % of 100 IOPS: stretch to 2 %
            (3.6, 400.0, 1.0),  // 0.9 %: as configured
            (3.6, 3000.0, 1.0), // gp3 baseline
            (3.6, 180.0, 1.0),  // exactly 2 %
            (7.2, 100.0, 3.6),  // two volumes on one capped disk
            (0.0, 100.0, 1.0),  // no commit probe
            (3.6, 0.0, 1.0),    // a zero cap is no figure
            (f64::NAN, 100.0, 1.0),
            (3.6, f64::INFINITY, 1.0),
        ];
        for (own, cap, want) in cases {
            let got = slowdown(own, cap);
            assert!(
                (got - want).abs() < 1e-9,
                "slowdown({own}, {cap}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn sweep_period_table() {
        // (sweep_every, sweep_duration, write fraction, period)
        let cases = [
            (3600, 8, 0.5, 3600), // the usual hour: 4 s of writes is 0.1 %
            (60, 8, 0.5, 200),    // 4 s of writes every minute would be 6.7 %
            (60, 8, 0.0, 60),     // reads only: as configured
            (600, 30, 0.5, 750),  // 15 s of writes: every 12.5 min
            (600, 28, 0.5, 700),  // the default 28 s sweep: 14 s of writes
            (60, 8, f64::NAN, 60),
        ];
        for (every, dur, frac, want) in cases {
            let got = sweep_period(every * S, dur * S, frac);
            assert_eq!(got, want * S, "sweep_period({every}, {dur}, {frac})");
        }
    }

    #[test]
    fn stretched_share_is_at_most_the_limit() {
        for cap in [10.0, 50.0, 100.0, 250.0, 1000.0] {
            let own = commits_per_second(S, 40 * S, 24) * DEFAULT_WRITES_PER_COMMIT;
            let f = slowdown(own, cap);
            let stretched = commits_per_second(S.mul_f64(f), (40 * S).mul_f64(f), 24)
                * DEFAULT_WRITES_PER_COMMIT;
            assert!(
                stretched / cap <= MAX_CAP_SHARE + 1e-9,
                "cap {cap}: {stretched}"
            );
        }
    }

    const CPLAN: CommitBurstPlan = CommitBurstPlan {
        least: 24,
        span: Duration::from_secs(1),
        most: 256,
    };

    /// Runs a commit burst whose i-th commit takes `lat(i)` ms: the
    /// latencies of the commits done, in seconds.
    fn commit_burst_of(plan: &CommitBurstPlan, lat: impl Fn(u32) -> f64) -> Vec<f64> {
        let mut b = CommitBurst::new(*plan);
        let mut out = Vec::new();
        let mut elapsed = 0.0;
        while b.more(Duration::from_secs_f64(elapsed / 1e3)) {
            let l = lat(b.count());
            elapsed += l;
            out.push(l / 1e3);
            b.done(l / 1e3, Duration::from_secs_f64(elapsed / 1e3));
        }
        out
    }

    fn mean(s: &[f64]) -> f64 {
        s.iter().sum::<f64>() / s.len() as f64
    }

    /// A v1 blkio throttle as measured on the quiet build machine: `per`
    /// commits of 0.1 ms each slice of 100 ms, the last of them waiting
    /// out the slice.
    fn throttled(per: u32) -> impl Fn(u32) -> f64 {
        move |i| {
            if i % per == per - 1 {
                100.0 - 0.1 * f64::from(per - 1)
            } else {
                0.1
            }
        }
    }

    #[test]
    fn unthrottled_burst_records_its_second_half() {
        let lat = commit_burst_of(&CPLAN, |i| if i == 0 { 0.7 } else { 0.25 });
        assert_eq!(lat.len(), 24);
        assert_eq!(steady_commits(&lat, CPLAN.least), 12..24);
        // One slow commit (2 ms) is a wait: the burst goes on up to its
        // limit, then records its last 12 as a burst without whole cycles
        // does, not 128 from one moment.
        let lat = commit_burst_of(&CPLAN, |i| if i == 7 { 2.0 } else { 0.25 });
        assert_eq!(lat.len(), 256);
        assert_eq!(steady_commits(&lat, CPLAN.least), 244..256);
        assert_eq!(warmed_tail(10, 24), 5..10);
    }

    #[test]
    fn throttled_bursts_record_whole_cycles() {
        // (commits per 100 ms slice, write IOPS cap at 2 device writes per
        // commit, commits done: the first slice, then a second of slices)
        for (per, cap, n) in [(5, 100.0, 55), (10, 200.0, 110), (20, 400.0, 220)] {
            let lat = commit_burst_of(&CPLAN, throttled(per));
            let r = steady_commits(&lat, CPLAN.least);
            let rate = 1.0 / mean(&lat[r.clone()]);
            assert!(
                (rate - cap / 2.0).abs() / (cap / 2.0) < 1e-6,
                "{per} per slice: {rate}/s from {r:?} of {}",
                lat.len()
            );
            assert_eq!(lat.len(), n, "{per}");
        }
        // A throttle that lets more than a burst's least commits through
        // at once goes unseen: 50 commits a slice (1,000 write IOPS).
        let lat = commit_burst_of(&CPLAN, throttled(50));
        assert_eq!((lat.len(), steady_commits(&lat, CPLAN.least)), (24, 12..24));
        // The measured 400-IOPS burst, its first commit after a pause.
        let measured = [
            0.87, 0.18, 0.11, 0.10, 0.08, 0.09, 0.08, 0.09, 0.09, 0.08, 0.08, 0.08, 0.08, 0.08,
            0.08, 0.08, 0.08, 0.08, 0.08, 101.60, 0.23, 0.11, 0.11, 0.17, 0.10, 0.10, 0.10, 0.10,
            0.10, 0.19, 0.10, 0.13, 0.10, 0.10, 0.13, 0.11, 0.10, 0.10, 0.10, 97.70, 0.30, 0.28,
            0.23, 0.13, 0.11, 0.11, 0.18, 0.17, 0.10, 0.11, 0.11, 0.11, 0.14, 0.11, 0.10, 0.11,
            0.15, 0.11, 0.11, 97.36,
        ]
        .map(|ms| ms / 1e3);
        let r = steady_commits(&measured, CPLAN.least);
        assert_eq!(r, 20..60);
        let rate = 1.0 / mean(&measured[r]);
        assert!((rate - 200.0).abs() < 3.0, "{rate}");
        // Its median says 9,000 commits/s.
        assert!(1.0 / 0.11e-3 > 40.0 * rate);
    }

    /// A burst measured at 100 write IOPS on a loaded host, in seconds:
    /// timer-tick waits (2-12 ms) inside slices, slice waits (72-109 ms)
    /// between them.
    fn loaded_100_iops() -> [f64; 51] {
        [
            271, 119, 70, 1970, 3990, 108527, 189, 109, 75, 303, 90456, 5933, 579, 1186, 8719,
            91799, 8215, 3953, 11836, 3746, 82656, 2712, 2998, 11755, 16241, 52206, 19684, 3769,
            4094, 357, 69136, 866, 89, 1561, 11737, 90011, 13961, 7973, 10378, 5701, 56082, 3842,
            4465, 3434, 7982, 83039, 251, 437, 4591, 19574, 76083,
        ]
        .map(|us: u32| f64::from(us) / 1e6)
    }

    #[test]
    fn tick_waits_inside_a_cycle_are_not_its_end() {
        // Measured at 100 write IOPS on a loaded host: timer-tick waits
        // (2-12 ms) inside slices, slice waits (72-109 ms) between them.
        let measured = loaded_100_iops();
        let r = steady_commits(&measured, CPLAN.least);
        // Nine slices of 100 ms, five commits each: fio did 50.0/s in
        // the same group.
        assert_eq!(r, 6..51);
        let rate = 1.0 / mean(&measured[r]);
        assert!((rate - 50.3).abs() < 0.1, "{rate}");
        // From the first tick wait on: 46.7/s.
        assert!((1.0 / mean(&measured[4..]) - 46.7).abs() < 0.1);
    }

    #[test]
    fn smooth_token_bucket_waits_every_commit() {
        // A bucket of 16 commits, then one commit per 10 ms: every commit
        // after the bucket is a wait; a second of them is recorded.
        let lat = commit_burst_of(&CPLAN, |i| if i < 16 { 0.1 } else { 10.0 });
        assert_eq!(lat.len(), 117);
        let r = steady_commits(&lat, CPLAN.least);
        assert_eq!(r, 17..117);
        assert!((mean(&lat[r]) - 0.010).abs() < 1e-9);
    }

    #[test]
    fn long_cycles_hold_one_whole_cycle() {
        // A 1.5 s accounting period letting 20 commits through: the burst
        // ends at its second wait, one whole cycle.
        let lat = commit_burst_of(&CPLAN, |i| if i % 20 == 19 { 1498.1 } else { 0.1 });
        let r = steady_commits(&lat, CPLAN.least);
        assert_eq!((lat.len(), r.clone()), (40, 20..40));
        assert!((1.0 / mean(&lat[r]) - 20.0 / 1.5).abs() < 0.01);
    }

    #[test]
    fn steady_throttles_and_busy_hosts() {
        // Slices of a v1 blkio throttle, a smooth token bucket: steady.
        for per in [5, 10, 20] {
            assert!(
                steady_throttle(&commit_burst_of(&CPLAN, throttled(per))),
                "{per}"
            );
        }
        let bucket = commit_burst_of(&CPLAN, |i| if i < 16 { 0.1 } else { 10.0 });
        assert!(steady_throttle(&bucket));
        // Measured at 100 write IOPS on a loaded host, tick waits within
        // slices: eight whole cycles, halves at 50.7 and 49.7 commits/s.
        let measured = loaded_100_iops();
        assert!(steady_throttle(&measured));
        // Not steady: no waits; one long cycle; two stalls of a busy host;
        // cycles that halve their rate midway (the throttle changed, or it
        // was stalls).
        assert!(!steady_throttle(&[0.25e-3; 24]));
        let long = commit_burst_of(&CPLAN, |i| if i % 20 == 19 { 1498.1 } else { 0.1 });
        assert!(!steady_throttle(&long));
        let stalls = commit_burst_of(&CPLAN, |i| if i == 7 || i == 30 { 40.0 } else { 0.25 });
        assert!(!steady_throttle(&stalls));
        let slowing = commit_burst_of(&CPLAN, |i| match i {
            i if i < 60 && i % 6 == 5 => 50.0,
            i if i >= 60 && i % 6 == 5 => 100.0,
            _ => 0.2,
        });
        assert!(!steady_throttle(&slowing), "{:?}", cycle_ends(&slowing));
    }

    const PLAN: ReadBurstPlan = ReadBurstPlan {
        warm_up: 32,
        span: Duration::from_millis(8),
        min: 16,
        max: 512,
    };

    /// Runs a burst of reads that each take `lat` (µs) to its end: (reads
    /// done, reads recorded).
    fn burst_of(plan: &ReadBurstPlan, lat: impl Fn(u32) -> u64) -> (u32, u32) {
        let mut b = ReadBurst::new(*plan);
        let mut now = 0;
        while b.next(Duration::from_micros(now)) != BurstRead::Done {
            now += lat(b.done - 1);
        }
        (b.done, b.recorded)
    }

    #[test]
    fn read_bursts_record_a_span_not_a_count() {
        // 8 ms of 80 µs reads after the warm-up: 100 recorded.
        assert_eq!(burst_of(&PLAN, |_| 80), (132, 100));
        // Twice as slow, half the reads: the span weighs a fast moment by
        // the reads it allows.
        assert_eq!(burst_of(&PLAN, |_| 160), (82, 50));
        // A read that straddles the span's end still counts: 8 ms of 3 ms
        // reads (0, 3, 6 ms) would be 3, but the floor is 16.
        assert_eq!(burst_of(&PLAN, |_| 3000), (48, 16));
        // A 2 µs device (a cache) stops at the ceiling.
        assert_eq!(burst_of(&PLAN, |_| 2), (544, 512));
        assert_eq!(PLAN.most_recorded(), 512);
        // Slow warm-up reads do not shorten the span: it starts with the
        // first recorded read.
        assert_eq!(
            burst_of(&PLAN, |i| if i < 32 { 5000 } else { 80 }),
            (132, 100)
        );
    }

    #[test]
    fn read_burst_without_warm_up_or_floor() {
        let plan = ReadBurstPlan {
            warm_up: 0,
            span: Duration::ZERO,
            min: 0,
            max: 4,
        };
        // A zero span still records the first read, once.
        assert_eq!(burst_of(&plan, |_| 80), (1, 1));
        let none = ReadBurstPlan { max: 0, ..plan };
        assert_eq!(burst_of(&none, |_| 80), (0, 0));
    }
}
