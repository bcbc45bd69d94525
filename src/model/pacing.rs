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
pub const MAX_CAP_SHARE: f64 = 0.02;

/// Device writes per commit probe assumed before one is measured: ext4 and
/// XFS write the data block and a journal or log block (two on the build
/// machine, for fio as for the probe).
pub const DEFAULT_WRITES_PER_COMMIT: f64 = 2.0;

/// Commit probes per second at a schedule: one lone probe per `interval`
/// plus `burst` back-to-back probes per `busy_every` (zero: no bursts).
pub fn commits_per_second(interval: Duration, busy_every: Duration, burst: u32) -> f64 {
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
pub fn slowdown(own_writes_per_second: f64, cap: f64) -> f64 {
    let meaningful = own_writes_per_second.is_finite()
        && own_writes_per_second > 0.0
        && cap.is_finite()
        && cap > 0.0;
    if !meaningful {
        return 1.0;
    }
    (own_writes_per_second / (cap * MAX_CAP_SHARE)).max(1.0)
}

/// The period between queue-depth sweeps: `sweep_every`, stretched so
/// that the sweep's writes (`write_fraction` of `sweep_duration`, each
/// write depth using whatever write cap there is in full) take at most
/// [`MAX_CAP_SHARE`] of the time. A sweep without writes is not stretched.
pub fn sweep_period(
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
pub enum BurstRead {
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
pub struct ReadBurstPlan {
    pub warm_up: u32,
    pub span: Duration,
    pub min: u32,
    pub max: u32,
}

impl ReadBurstPlan {
    /// The most reads one burst records.
    pub fn most_recorded(&self) -> u32 {
        self.max.max(self.min)
    }
}

/// One burst's way through a [`ReadBurstPlan`]: the reads done and
/// recorded so far, and when the first recorded one started.
#[derive(Debug, Clone, Copy)]
pub struct ReadBurst {
    plan: ReadBurstPlan,
    done: u32,
    recorded: u32,
    first_recorded_at: Option<Duration>,
}

impl ReadBurst {
    pub fn new(plan: ReadBurstPlan) -> ReadBurst {
        ReadBurst {
            plan,
            done: 0,
            recorded: 0,
            first_recorded_at: None,
        }
    }

    /// What the next read, about to start `elapsed` into the burst, is
    /// for; counted as done (and recorded) unless the burst is over.
    pub fn next(&mut self, elapsed: Duration) -> BurstRead {
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

#[cfg(test)]
mod tests {
    use super::*;

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
