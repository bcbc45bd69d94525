//! Queue-depth sweep: 8 KiB `O_DIRECT` random reads of the read probe file
//! at depths 1, 4, 16 and 64 through io_uring, each for a quarter of the
//! sweep's duration. Each depth's IOPS and latency feed the plateau
//! detector in `model::plateau`.
//!
//! The sweep is load by design (up to 64 reads in flight), so it is off by
//! default and budgeted: `sweep_duration` every `sweep_every`.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::model::plateau::DepthPoint;
use crate::probe::Rng;
use crate::probe::settings::BLOCK_SIZE;
use crate::sys::UringQueue;

pub const DEPTHS: [u32; 4] = [1, 4, 16, 64];

/// Runs the sweep on `fd` (an `O_DIRECT` file of `size` bytes). Stops early
/// (returning what it has) when `stop` says so.
pub fn run(
    fd: BorrowedFd<'_>,
    size: u64,
    duration: Duration,
    stop: &dyn Fn() -> bool,
) -> Result<Vec<DepthPoint>, String> {
    let per_depth = duration / DEPTHS.len() as u32;
    let mut out = Vec::new();
    for depth in DEPTHS {
        if stop() {
            break;
        }
        out.push(one_depth(fd, size, depth, per_depth, stop)?);
    }
    Ok(out)
}

fn one_depth(
    fd: BorrowedFd<'_>,
    size: u64,
    depth: u32,
    dur: Duration,
    stop: &dyn Fn() -> bool,
) -> Result<DepthPoint, String> {
    // The queue owns one buffer per slot and keeps each until its read's
    // completion is reaped; a sweep that ends with reads in flight (an error
    // of the ring) leaks them rather than free memory the kernel may still
    // write into.
    let mut queue =
        UringQueue::<BLOCK_SIZE>::new(fd, depth).map_err(|e| format!("io_uring setup: {e}"))?;
    let mut started = vec![Instant::now(); depth as usize];
    let blocks = (size / BLOCK_SIZE as u64).max(1);
    let mut rng = Rng::seeded();
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).map_err(|e| e.to_string())?;
    let submit = |queue: &mut UringQueue<BLOCK_SIZE>,
                  slot: usize,
                  started: &mut [Instant],
                  rng: &mut Rng|
     -> Result<(), String> {
        if let Some(s) = started.get_mut(slot) {
            *s = Instant::now();
        }
        queue
            .push_read(slot, rng.below(blocks) * BLOCK_SIZE as u64)
            .map_err(str::to_string)
    };
    let mut failed: Option<String> = None;
    for slot in 0..depth as usize {
        // A failed push leaves nothing in flight for that slot; the drain
        // below still waits for the ones that were pushed.
        if let Err(e) = submit(&mut queue, slot, &mut started, &mut rng) {
            failed.get_or_insert(e);
            break;
        }
    }
    let t0 = Instant::now();
    let mut done = 0u64;
    while queue.in_flight() > 0 {
        // A failed enter poisons the queue: the kernel may still own
        // buffers, and the queue leaks them with the ring.
        let cqes = queue.wait().map_err(|e| format!("io_uring_enter: {e}"))?;
        let now = Instant::now();
        for (slot, res) in cqes {
            if res < 0 {
                failed.get_or_insert_with(|| {
                    format!("read failed: {}", std::io::Error::from_raw_os_error(-res))
                });
            } else if let Some(s) = started.get(slot) {
                let _ = hist.record((now.duration_since(*s).as_nanos() as u64).max(1));
                done += 1;
            }
            let keep_going = failed.is_none() && t0.elapsed() < dur && !stop();
            if keep_going && let Err(e) = submit(&mut queue, slot, &mut started, &mut rng) {
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(f) = failed {
        return Err(f);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    Ok(DepthPoint {
        depth,
        iops: if elapsed > 0.0 {
            done as f64 / elapsed
        } else {
            0.0
        },
        mean: hist.mean() / 1e9,
        p99: hist.value_at_quantile(0.99) as f64 / 1e9,
    })
}
