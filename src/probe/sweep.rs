//! Queue-depth sweep: 8 KiB `O_DIRECT` random reads of the read probe file
//! at depths 1, 4, 16 and 64 through io_uring, each for a quarter of the
//! sweep's duration. Each depth's IOPS and latency feed the plateau
//! detector in `model::plateau`.
//!
//! The sweep is load by design (up to 64 reads in flight), so it is off by
//! default and budgeted: `sweep_duration` every `sweep_every`.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use io_uring::{IoUring, opcode, types};

use crate::model::plateau::DepthPoint;
use crate::probe::Rng;
use crate::probe::files::AlignedBuf;
use crate::probe::settings::BLOCK_SIZE;

pub const DEPTHS: [u32; 4] = [1, 4, 16, 64];

/// Runs the sweep on `fd` (an `O_DIRECT` file of `size` bytes). Stops early
/// (returning what it has) when `stop` says so.
pub fn run(
    fd: RawFd,
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
    fd: RawFd,
    size: u64,
    depth: u32,
    dur: Duration,
    stop: &dyn Fn() -> bool,
) -> Result<DepthPoint, String> {
    let mut ring = IoUring::new(depth.next_power_of_two().max(2))
        .map_err(|e| format!("io_uring setup: {e}"))?;
    let mut bufs: Vec<AlignedBuf> = (0..depth).map(|_| AlignedBuf::new(BLOCK_SIZE)).collect();
    let mut started = vec![Instant::now(); depth as usize];
    let blocks = (size / BLOCK_SIZE as u64).max(1);
    let mut rng = Rng::seeded();
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).map_err(|e| e.to_string())?;
    let mut in_flight = 0u32;
    let submit = |ring: &mut IoUring,
                  slot: usize,
                  bufs: &mut [AlignedBuf],
                  started: &mut [Instant],
                  rng: &mut Rng|
     -> Result<(), String> {
        let Some(buf) = bufs.get_mut(slot) else {
            return Err("slot out of range".into());
        };
        let e = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), BLOCK_SIZE as u32)
            .offset(rng.below(blocks) * BLOCK_SIZE as u64)
            .build()
            .user_data(slot as u64);
        if let Some(s) = started.get_mut(slot) {
            *s = Instant::now();
        }
        // SAFETY: the buffer belongs to `bufs`, which outlives the ring's
        // use of it: every submitted read is reaped before this function
        // returns (the drain loop below), and on a ring error the buffers
        // are leaked rather than freed.
        unsafe { ring.submission().push(&e) }.map_err(|_| "submission queue full".to_string())
    };
    let mut failed: Option<String> = None;
    for slot in 0..depth as usize {
        // A failed push leaves nothing in flight for that slot; the drain
        // below still waits for the ones that were pushed.
        match submit(&mut ring, slot, &mut bufs, &mut started, &mut rng) {
            Ok(()) => in_flight += 1,
            Err(e) => {
                failed.get_or_insert(e);
                break;
            }
        }
    }
    let t0 = Instant::now();
    let mut done = 0u64;
    while in_flight > 0 {
        if let Err(e) = ring.submit_and_wait(1) {
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // The kernel may still own buffers: leak them with the ring.
            std::mem::forget(bufs);
            std::mem::forget(ring);
            return Err(format!("io_uring_enter: {e}"));
        }
        let now = Instant::now();
        let cqes: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (slot, res) in cqes {
            in_flight -= 1;
            let slot = slot as usize;
            if res < 0 {
                failed.get_or_insert_with(|| {
                    format!("read failed: {}", std::io::Error::from_raw_os_error(-res))
                });
            } else if let Some(s) = started.get(slot) {
                let _ = hist.record((now.duration_since(*s).as_nanos() as u64).max(1));
                done += 1;
            }
            let keep_going = failed.is_none() && t0.elapsed() < dur && !stop();
            if keep_going {
                match submit(&mut ring, slot, &mut bufs, &mut started, &mut rng) {
                    Ok(()) => in_flight += 1,
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
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
