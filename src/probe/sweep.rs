//! Queue-depth sweep: `O_DIRECT` IO at rising queue depth through io_uring,
//! in four workloads, one per capped resource:
//!
//! - read IOPS: 8 KiB random reads of the read probe file, depths 1, 4, 16, 64;
//! - write IOPS: 8 KiB random writes into the sweep file, same depths;
//! - read bandwidth: 256 KiB sequential reads of the read probe file,
//!   depths 1, 4, 16;
//! - write bandwidth: 256 KiB sequential writes into the sweep file, same
//!   depths.
//!
//! Each depth's rate and latency feed the plateau detector in
//! `model::plateau`. A bandwidth workload measures IOs of one fixed size, so
//! its IOPS plateau times the block size is its bytes-per-second plateau.
//!
//! The sweep is load by design (up to 64 IOs in flight), so it is off by
//! default and budgeted: `sweep_duration` every `sweep_every`, split evenly
//! over every depth of every workload, and at most [`MAX_WRITE_BYTES`]
//! written by its IO (plus the [`SWEEP_FILE_SIZE`] file written at set-up).
//! The writes go to a file of its own (`files::SWEEP_FILE`), never to a
//! PostgreSQL file or to the probe files.

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::model::plateau::{DepthPoint, detect};
use crate::probe::Rng;
use crate::probe::files::{ProbeDir, SetupError, raw};
use crate::probe::settings::BLOCK_SIZE;
use crate::sys::UringQueue;
use crate::types::Resource;

/// Depths of the IOPS workloads.
pub(crate) const DEPTHS: [u32; 4] = [1, 4, 16, 64];
/// Depths of the bandwidth workloads. Large IOs saturate a device at a
/// lower depth than 8 KiB ones, and 16 × 256 KiB (4 MiB in flight) is
/// already 0.4 s of queue at a 10 MiB/s cap: the last IOs of a depth take
/// that long to drain after its time is up, which a depth of 64 would
/// make 1.6 s.
pub(crate) const BANDWIDTH_DEPTHS: [u32; 3] = [1, 4, 16];
/// Size of a bandwidth workload's IOs: large enough that a throughput cap,
/// not an IOPS cap, binds (a gp3 volume's 125 MiB/s is 500 of them per
/// second, well under its 3,000 IOPS), small enough to keep the drain short.
pub(crate) const BANDWIDTH_BLOCK: usize = 256 << 10;
/// Size of the sweep file the write workloads write into.
pub(crate) const SWEEP_FILE_SIZE: u64 = 32 << 20;
/// Bytes the write workloads may write in one sweep, split evenly over
/// their depths; a depth stops early once it has written its share. On a
/// fast device this ends the write depths well before their time is up.
pub(crate) const MAX_WRITE_BYTES: u64 = 256 << 20;

/// Whether the IO of a workload goes to random blocks or in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Pattern {
    Random,
    Sequential,
}

/// One kind of IO the sweep runs at rising depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Workload {
    /// The cap it finds.
    pub(crate) resource: Resource,
    /// Bytes per IO.
    pub(crate) block: usize,
    pub(crate) pattern: Pattern,
    pub(crate) depths: &'static [u32],
}

/// The four workloads, in the order they run: reads first, so that a sweep
/// whose sweep file cannot be created still finds the read caps.
pub(crate) const WORKLOADS: [Workload; 4] = [
    Workload {
        resource: Resource::ReadIops,
        block: BLOCK_SIZE,
        pattern: Pattern::Random,
        depths: &DEPTHS,
    },
    Workload {
        resource: Resource::ReadBytesPerSecond,
        block: BANDWIDTH_BLOCK,
        pattern: Pattern::Sequential,
        depths: &BANDWIDTH_DEPTHS,
    },
    Workload {
        resource: Resource::WriteIops,
        block: BLOCK_SIZE,
        pattern: Pattern::Random,
        depths: &DEPTHS,
    },
    Workload {
        resource: Resource::WriteBytesPerSecond,
        block: BANDWIDTH_BLOCK,
        pattern: Pattern::Sequential,
        depths: &BANDWIDTH_DEPTHS,
    },
];

impl Workload {
    pub(crate) fn writes(&self) -> bool {
        matches!(
            self.resource,
            Resource::WriteIops | Resource::WriteBytesPerSecond
        )
    }

    /// Whether the cap it finds is in bytes per second (else IOs per second).
    pub(crate) fn in_bytes(&self) -> bool {
        matches!(
            self.resource,
            Resource::ReadBytesPerSecond | Resource::WriteBytesPerSecond | Resource::BytesPerSecond
        )
    }

    /// IOs per second in the unit of the workload's resource: the IOs are
    /// all `block` bytes, so bytes per second are IOPS × block.
    pub(crate) fn in_unit(&self, iops: f64) -> f64 {
        if self.in_bytes() {
            iops * self.block as f64
        } else {
            iops
        }
    }

    /// A depth point's rate in the unit of the workload's resource.
    pub(crate) fn rate(&self, p: &DepthPoint) -> f64 {
        self.in_unit(p.iops)
    }

    /// The plateau of `points`, in the unit of the workload's resource.
    pub(crate) fn limit(&self, points: &[DepthPoint]) -> Option<f64> {
        detect(points).map(|iops| self.in_unit(iops))
    }

    /// What it finds, for reports: "write bandwidth".
    pub(crate) fn name(&self) -> &'static str {
        match self.resource {
            Resource::ReadIops => "read IOPS",
            Resource::WriteIops => "write IOPS",
            Resource::ReadBytesPerSecond => "read bandwidth",
            Resource::WriteBytesPerSecond => "write bandwidth",
            Resource::Iops => "IOPS",
            Resource::BytesPerSecond => "bandwidth",
        }
    }

    /// What it does, for reports: "8 KiB O_DIRECT random reads".
    pub(crate) fn describe(&self) -> String {
        let size = if self.block % (1 << 20) == 0 {
            format!("{} MiB", self.block >> 20)
        } else {
            format!("{} KiB", self.block >> 10)
        };
        let pattern = match self.pattern {
            Pattern::Random => "random",
            Pattern::Sequential => "sequential",
        };
        let op = if self.writes() { "writes" } else { "reads" };
        format!("{size} O_DIRECT {pattern} {op}")
    }
}

/// The workloads a sweep runs: all four with a sweep file, the reads only
/// without one.
pub(crate) fn planned(with_writes: bool) -> Vec<Workload> {
    WORKLOADS
        .into_iter()
        .filter(|w| with_writes || !w.writes())
        .collect()
}

/// Time of each depth: `duration` split evenly over every depth of every
/// workload that runs. The last IOs of a depth still drain after it.
pub(crate) fn depth_time(duration: Duration, workloads: &[Workload]) -> Duration {
    duration / steps(workloads, |_| true).max(1) as u32
}

/// Share of a sweep's time that goes to its write workloads.
pub(crate) fn write_fraction(workloads: &[Workload]) -> f64 {
    let all = steps(workloads, |_| true);
    if all == 0 {
        0.0
    } else {
        steps(workloads, Workload::writes) as f64 / all as f64
    }
}

/// Bytes each write depth may write: [`MAX_WRITE_BYTES`] split evenly over
/// the depths of the write workloads.
pub(crate) fn write_share(workloads: &[Workload]) -> u64 {
    MAX_WRITE_BYTES / steps(workloads, Workload::writes).max(1) as u64
}

/// Depths (steps of equal time) of the workloads `which` picks.
fn steps(workloads: &[Workload], which: impl Fn(&Workload) -> bool) -> usize {
    workloads
        .iter()
        .filter(|w| which(w))
        .map(|w| w.depths.len())
        .sum()
}

/// The offset of the next IO: a random block, or the block after the
/// previous one (`*next`), wrapping at the end of a file of `blocks` blocks.
fn offset(pattern: Pattern, block: usize, blocks: u64, next: &mut u64, rng: &mut Rng) -> u64 {
    let b = match pattern {
        Pattern::Random => rng.below(blocks),
        Pattern::Sequential => {
            let b = *next % blocks.max(1);
            *next = b + 1;
            b
        }
    };
    b * block as u64
}

/// One workload's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Table {
    #[serde(serialize_with = "resource_label")]
    pub(crate) resource: Resource,
    pub(crate) block_bytes: u64,
    pub(crate) pattern: Pattern,
    pub(crate) points: Vec<DepthPoint>,
    /// The plateau, in the resource's unit (IOs or bytes per second).
    pub(crate) detected: Option<f64>,
}

fn resource_label<S: serde::Serializer>(r: &Resource, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(r.as_str())
}

impl Table {
    /// The workload it measured (its depths are in the points).
    pub(crate) fn workload(&self) -> Workload {
        Workload {
            resource: self.resource,
            block: self.block_bytes as usize,
            pattern: self.pattern,
            depths: &[],
        }
    }
}

/// A file the sweep does IO on: an `O_DIRECT` descriptor and its size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) fd: BorrowedFd<'a>,
    pub(crate) size: u64,
}

/// Runs the sweep: the read workloads on `read` (the read probe file), the
/// write workloads on `sweep` (the sweep file, opened for writing) when
/// given. Stops early (returning what it has) when `stop` says so.
pub(crate) fn run(
    read: Target<'_>,
    sweep: Option<Target<'_>>,
    duration: Duration,
    stop: &dyn Fn() -> bool,
) -> Result<Vec<Table>, String> {
    let workloads = planned(sweep.is_some());
    let per_depth = depth_time(duration, &workloads);
    let share = write_share(&workloads);
    let mut out = Vec::new();
    for w in workloads {
        let (target, budget) = match (w.writes(), sweep) {
            (false, _) => (read, None),
            (true, Some(s)) => (s, Some(share)),
            (true, None) => continue,
        };
        let mut points = Vec::new();
        for &depth in w.depths {
            if stop() {
                break;
            }
            let step = Step {
                w,
                target,
                depth,
                dur: per_depth,
                budget,
            };
            let p = if w.block == BANDWIDTH_BLOCK {
                one_depth::<BANDWIDTH_BLOCK>(&step, stop)
            } else {
                one_depth::<BLOCK_SIZE>(&step, stop)
            }
            .map_err(|e| format!("{}, depth {depth}: {e}", w.describe()))?;
            points.push(p);
        }
        if points.is_empty() {
            break;
        }
        out.push(Table {
            resource: w.resource,
            block_bytes: w.block as u64,
            pattern: w.pattern,
            detected: w.limit(&points),
            points,
        });
    }
    Ok(out)
}

/// Runs the sweep in probe directory `dir`: the read workloads on `read`
/// (the read probe file, `read_size` bytes), the write workloads on a sweep
/// file created for this sweep and removed after it, so its 32 MiB are held
/// for the sweep's seconds, not for the life of the volume. When the file
/// cannot be made (no room above `reserve`, no `O_DIRECT`) `no_file` is told
/// why and the reads run alone: the read caps are still worth finding.
pub(crate) fn run_in(
    dir: &ProbeDir,
    read: &File,
    read_size: u64,
    reserve: u64,
    duration: Duration,
    stop: &dyn Fn() -> bool,
    no_file: impl FnOnce(SetupError),
) -> Result<Vec<Table>, String> {
    let mut sweep_file = dir
        .create_sweep_file(SWEEP_FILE_SIZE, reserve)
        .map_err(no_file)
        .ok();
    let result = run(
        Target {
            fd: raw(read),
            size: read_size,
        },
        sweep_file.as_ref().map(|f| Target {
            fd: raw(f),
            size: SWEEP_FILE_SIZE,
        }),
        duration,
        stop,
    );
    // Only a file this sweep made is removed: one it could not make
    // because something else has the name stays.
    if sweep_file.take().is_some() {
        dir.remove_sweep_file();
    }
    result
}

struct Step<'a> {
    w: Workload,
    target: Target<'a>,
    depth: u32,
    dur: Duration,
    /// Bytes this depth may write.
    budget: Option<u64>,
}

fn one_depth<const N: usize>(s: &Step<'_>, stop: &dyn Fn() -> bool) -> Result<DepthPoint, String> {
    let depth = s.depth;
    // The queue owns one buffer per slot and keeps each until its IO's
    // completion is reaped; a sweep that ends with IO in flight (an error
    // of the ring) leaks them rather than free memory the kernel may still
    // use.
    let mut queue =
        UringQueue::<N>::new(s.target.fd, depth).map_err(|e| format!("io_uring setup: {e}"))?;
    let mut rng = Rng::seeded();
    if s.w.writes() {
        // Random bytes, not zeros: a filesystem or volume that compresses
        // or deduplicates would turn zeros into no device IO at all.
        queue.fill(|b| rng.fill(b)).map_err(str::to_string)?;
    }
    let mut started = vec![Instant::now(); depth as usize];
    let blocks = (s.target.size / N as u64).max(1);
    // Sequential IO starts at a random block, so that successive depths do
    // not re-read what the previous one left in a device cache.
    let next = rng.below(blocks);
    let mut feed = Feed {
        s,
        rng,
        blocks,
        next,
        pushed_bytes: 0,
        cut_short: false,
    };
    let write = s.w.writes();
    let mut failed: Option<String> = None;
    for slot in 0..depth as usize {
        // A failed push leaves nothing in flight for that slot; the drain
        // below still waits for the ones that were pushed.
        match feed.submit(&mut queue, slot, &mut started) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                failed.get_or_insert(e);
                break;
            }
        }
    }
    let t0 = Instant::now();
    let cpu0 = cpu_times();
    let warm = t0 + s.dur.mul_f64(WARM_UP_SHARE);
    let mut all = Counted::new()?;
    let mut steady = Counted::new()?;
    while queue.in_flight() > 0 {
        // A failed enter poisons the queue: the kernel may still own
        // buffers, and the queue leaks them with the ring.
        let cqes = queue.wait().map_err(|e| format!("io_uring_enter: {e}"))?;
        let now = Instant::now();
        for (slot, res) in cqes {
            if res < 0 {
                failed.get_or_insert_with(|| {
                    let what = if write { "write" } else { "read" };
                    format!("{what} failed: {}", std::io::Error::from_raw_os_error(-res))
                });
            } else if let Some(t) = started.get(slot) {
                let ns = (now.duration_since(*t).as_nanos() as u64).max(1);
                all.record(ns);
                if now >= warm {
                    steady.record(ns);
                }
            }
            let keep_going = failed.is_none() && t0.elapsed() < s.dur && !stop();
            if keep_going && let Err(e) = feed.submit(&mut queue, slot, &mut started) {
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(f) = failed {
        return Err(f);
    }
    let mut p = point(depth, t0, warm, &all, &steady, feed.cut_short);
    p.cpu_busy = cpu0.zip(cpu_times()).and_then(|(a, b)| busy_share(a, b));
    Ok(p)
}

/// The host's (busy, all) CPU time in ticks from /proc/stat; `None` when
/// it cannot be read (the depth is then judged without it).
fn cpu_times() -> Option<(u64, u64)> {
    use procfs::CurrentSI;
    let t = procfs::KernelStats::current().ok()?.total;
    let idle = t.idle + t.iowait.unwrap_or(0);
    let busy = t.user
        + t.nice
        + t.system
        + t.irq.unwrap_or(0)
        + t.softirq.unwrap_or(0)
        + t.steal.unwrap_or(0);
    Some((busy, busy + idle))
}

/// Busy share of the CPU time between two [`cpu_times`] readings; `None`
/// when no tick passed (too short a depth to tell).
fn busy_share(a: (u64, u64), b: (u64, u64)) -> Option<f64> {
    let all = b.1.checked_sub(a.1).filter(|d| *d > 0)?;
    let busy = b.0.saturating_sub(a.0);
    Some(busy as f64 / all as f64)
}

/// What a depth pushes next: its pattern's offsets, within its budget.
struct Feed<'s, 'a> {
    s: &'s Step<'a>,
    rng: Rng,
    blocks: u64,
    next: u64,
    pushed_bytes: u64,
    /// Set when the budget, not the clock, ends the depth: submit is only
    /// asked for more while the depth's time runs.
    cut_short: bool,
}

impl Feed<'_, '_> {
    /// Pushes the next IO into `slot`; false when the budget is spent.
    fn submit<const N: usize>(
        &mut self,
        queue: &mut UringQueue<N>,
        slot: usize,
        started: &mut [Instant],
    ) -> Result<bool, String> {
        if self
            .s
            .budget
            .is_some_and(|b| self.pushed_bytes.saturating_add(N as u64) > b)
        {
            self.cut_short = true;
            return Ok(false);
        }
        if let Some(t) = started.get_mut(slot) {
            *t = Instant::now();
        }
        let at = offset(
            self.s.w.pattern,
            N,
            self.blocks,
            &mut self.next,
            &mut self.rng,
        );
        if self.s.w.writes() {
            queue.push_write(slot, at)
        } else {
            queue.push_read(slot, at)
        }
        .map_err(str::to_string)?;
        self.pushed_bytes += N as u64;
        Ok(true)
    }
}

/// A depth's figures: from the completions after the warm-up when they
/// are enough (`use_steady`), from all of them otherwise.
fn point(
    depth: u32,
    t0: Instant,
    warm: Instant,
    all: &Counted,
    steady: &Counted,
    cut_short: bool,
) -> DepthPoint {
    let end = Instant::now();
    let steady_secs = end.saturating_duration_since(warm).as_secs_f64();
    let (c, secs) = if use_steady(steady.done, steady_secs, depth) {
        (steady, steady_secs)
    } else {
        (all, end.duration_since(t0).as_secs_f64())
    };
    DepthPoint {
        cpu_busy: None,
        depth,
        iops: if secs > 0.0 {
            c.done as f64 / secs
        } else {
            0.0
        },
        mean: c.hist.mean() / 1e9,
        p99: c.hist.value_at_quantile(0.99) as f64 / 1e9,
        cut_short,
    }
}

/// Share of a depth's time before its rate and latency count. A token
/// bucket (a v1 blkio throttle's 100 ms slice, a cloud volume's burst
/// balance) lets the first IOs after an idle spell through at once: on a
/// 10 MiB/s throttle, 0.57 s depths measured 11.7 MiB/s with the burst
/// counted. The queue is also still filling then.
pub(crate) const WARM_UP_SHARE: f64 = 0.25;

/// Completions and their latencies.
struct Counted {
    done: u64,
    hist: Histogram<u64>,
}

impl Counted {
    fn new() -> Result<Counted, String> {
        Ok(Counted {
            done: 0,
            hist: Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
                .map_err(|e| e.to_string())?,
        })
    }

    fn record(&mut self, ns: u64) {
        let _ = self.hist.record(ns);
        self.done += 1;
    }
}

/// Whether a depth's figures come from after its warm-up: only when that
/// part lasted and saw at least a queue's worth of completions. A depth cut
/// short (the write budget used up on a fast device, a stop) is measured
/// whole rather than from a handful of IOs.
fn use_steady(done: u64, secs: f64, depth: u32) -> bool {
    secs > 0.0 && done >= u64::from(depth).max(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_time_and_write_budget() {
        let all = planned(true);
        assert_eq!(all.len(), 4);
        let reads = planned(false);
        assert_eq!(
            reads.iter().map(|w| w.resource).collect::<Vec<_>>(),
            vec![Resource::ReadIops, Resource::ReadBytesPerSecond]
        );
        // 4 + 3 + 4 + 3 depths.
        assert_eq!(
            depth_time(Duration::from_secs(14), &all),
            Duration::from_secs(1)
        );
        assert_eq!(
            depth_time(Duration::from_secs(7), &reads),
            Duration::from_secs(1)
        );
        // 7 write depths share the budget; the reads write nothing.
        assert_eq!(write_share(&all), MAX_WRITE_BYTES / 7);
        assert!(write_share(&all) * 7 <= MAX_WRITE_BYTES);
        assert_eq!(
            depth_time(Duration::from_secs(1), &[]),
            Duration::from_secs(1)
        );
        assert_eq!(write_fraction(&all), 0.5);
        assert_eq!(write_fraction(&reads), 0.0);
        assert_eq!(write_fraction(&[]), 0.0);
    }

    #[test]
    fn sequential_offsets_wrap_and_random_ones_stay_inside() {
        let mut rng = Rng::seeded();
        let mut next = 2;
        let got: Vec<u64> = (0..4)
            .map(|_| offset(Pattern::Sequential, 4096, 3, &mut next, &mut rng))
            .collect();
        assert_eq!(got, vec![8192, 0, 4096, 8192]);
        for _ in 0..1000 {
            let o = offset(Pattern::Random, 8192, 5, &mut next, &mut rng);
            assert!(o % 8192 == 0 && o < 5 * 8192, "{o}");
        }
    }

    #[test]
    fn steady_part_is_used_only_when_it_saw_a_queue_of_completions() {
        assert!(use_steady(64, 0.4, 64));
        assert!(!use_steady(63, 0.4, 64));
        assert!(use_steady(4, 0.4, 1), "at depth 1, four IOs at least");
        assert!(!use_steady(3, 0.4, 1));
        assert!(!use_steady(100, 0.0, 4), "ended before the warm-up did");
    }

    #[test]
    fn bandwidth_limits_are_in_bytes() {
        let p = |depth, iops, mean| DepthPoint {
            cpu_busy: None,
            depth,
            iops,
            mean,
            p99: mean,
            cut_short: false,
        };
        // 40 IOs of 256 KiB per second at every depth: a 10 MiB/s cap.
        let pts = [p(1, 40.0, 0.025), p(4, 40.0, 0.1), p(16, 40.0, 0.4)];
        let bw = WORKLOADS[3];
        assert_eq!(bw.resource, Resource::WriteBytesPerSecond);
        assert_eq!(bw.limit(&pts), Some(10.0 * (1 << 20) as f64));
        assert_eq!(bw.rate(&pts[0]), 10.0 * (1 << 20) as f64);
        let iops = WORKLOADS[2];
        assert_eq!(iops.resource, Resource::WriteIops);
        assert_eq!(iops.limit(&pts), Some(40.0));
        assert_eq!(iops.describe(), "8 KiB O_DIRECT random writes");
        assert_eq!(bw.describe(), "256 KiB O_DIRECT sequential writes");
        assert_eq!(bw.name(), "write bandwidth");
    }
}
