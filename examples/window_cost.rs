//! CPU per `Window::push` in steady state (each push also expires the
//! oldest sample) and per scrape-time read (`quantiles` + `mean` +
//! `live_len`), for window sizes in use: 900 (15 min at the default 1 s
//! interval), 9,000 (100 ms) and the 100,000 maximum.
//!
//! cargo run --release --example window_cost

use std::time::{Duration, Instant};

use pg_storage_exporter::model::WINDOW_QUANTILES;
use pg_storage_exporter::model::window::Window;

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn main() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // 100 µs .. ~1.1 ms, microsecond resolution like real probes.
        0.0001 + (x % 1_000_000) as f64 * 1e-9
    };
    let t0 = Instant::now();
    for n in [900usize, 9_000, 100_000] {
        // One sample per ms; the span holds exactly n of them.
        let span = Duration::from_millis(n as u64 - 1);
        let mut w = Window::new(span, 100_000);
        let mut i = 0u64;
        for _ in 0..n {
            w.push(t0 + Duration::from_millis(i), next());
            i += 1;
        }
        let pushes = 200_000u64;
        let c0 = thread_cpu();
        for _ in 0..pushes {
            w.push(t0 + Duration::from_millis(i), next());
            i += 1;
        }
        let per_push = (thread_cpu() - c0).as_secs_f64() / pushes as f64;
        assert_eq!(w.len(), n);
        let now = t0 + Duration::from_millis(i - 1);
        let reads = (2_000_000 / n).max(20);
        let c0 = thread_cpu();
        let mut acc = 0.0;
        for _ in 0..reads {
            acc += w.quantiles(now, &WINDOW_QUANTILES).map_or(0.0, |q| q[2]);
            acc += w.mean(now).unwrap_or(0.0);
            acc += w.live_len(now) as f64;
        }
        let per_read = (thread_cpu() - c0).as_secs_f64() / reads as f64;
        println!(
            "window {n:>7} samples: push {:>8.1} ns CPU, read (5 quantiles + mean + count) {:>9.2} µs CPU  [{acc:.1}]",
            per_push * 1e9,
            per_read * 1e6
        );
    }
}
