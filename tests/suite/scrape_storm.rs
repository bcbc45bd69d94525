//! A scrape storm in miniature, for CI: 200 concurrent scrapers for a few
//! seconds. Every answer must be complete and fresh, the probes must keep
//! running, and the exporter must not grow threads per connection. The
//! figures (latency under load, probe latency with and without it) come
//! from bench/load, not from here: this machine is too noisy for timing
//! assertions.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;

const SCRAPERS: usize = 200;
const STORM: Duration = Duration::from_secs(5);

#[test]
fn two_hundred_concurrent_scrapers_get_complete_answers_and_probes_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let args = fast_probe_args(&format!("t={}", dir.path().display()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut ex = Exporter::start(&args);
    let m = ex.wait_for("probes", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 3.0
    });
    let commits_before = count(&m, "t", "commit");
    let renders_before = sample(&m, "pgstorage_scrape_render_duration_seconds_count").unwrap();
    let threads_before = threads(ex.child.id());

    let ok = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let addr = ex.addr;
    let start = Instant::now();
    let workers: Vec<_> = (0..SCRAPERS)
        .map(|i| {
            let (ok, bad) = (ok.clone(), bad.clone());
            std::thread::spawn(move || {
                // Half ask for OpenMetrics, as Prometheus does; half for the
                // text format, as curl does: both render slots are busy.
                let accept = (i % 2 == 0).then_some("application/openmetrics-text;version=1.0.0");
                while start.elapsed() < STORM {
                    let (status, _, body) = http_get(addr, "/metrics", accept);
                    let complete = if accept.is_some() {
                        body.ends_with("# EOF\n")
                    } else {
                        body.contains("pgstorage_build_info")
                    };
                    if status == 200 && complete && body.contains("volume=\"t\"") {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let mut threads_max = threads_before;
    while start.elapsed() < STORM {
        threads_max = threads_max.max(threads(ex.child.id()));
        std::thread::sleep(Duration::from_millis(100));
    }
    for w in workers {
        w.join().unwrap();
    }
    let (ok, bad) = (ok.load(Ordering::Relaxed), bad.load(Ordering::Relaxed));
    let m = ex.metrics();
    let commits_after = count(&m, "t", "commit");
    let renders =
        sample(&m, "pgstorage_scrape_render_duration_seconds_count").unwrap() - renders_before;
    let render_seconds = sample(&m, "pgstorage_scrape_render_duration_seconds_sum").unwrap();
    let within_inf = sample(
        &m,
        "pgstorage_scrape_render_duration_seconds_bucket{le=\"+Inf\"}",
    )
    .unwrap();
    eprintln!(
        "{SCRAPERS} scrapers for {STORM:?}: {ok} complete answers, {bad} bad; threads {threads_before} before, \
         at most {threads_max} during; commit probes {commits_before} -> {commits_after}; {renders} renders"
    );
    assert_eq!(bad, 0, "incomplete or failed answers");
    assert!(
        ok >= SCRAPERS as u64,
        "every scraper got at least one answer: {ok}"
    );
    // 100 ms interval: about 50 rounds in 5 s; a starved probe thread would
    // show as far fewer.
    assert!(
        commits_after - commits_before >= 10.0,
        "probes stalled during the storm: {commits_before} -> {commits_after}"
    );
    // Concurrent scrapes share renders: the exporter's own render
    // histogram counts each render once, however many answers it served.
    assert!(
        renders >= 1.0 && renders < ok as f64,
        "{renders} renders for {ok} answers"
    );
    assert_eq!(within_inf, renders_before + renders, "+Inf bucket = count");
    // A render of one volume's series is far below a second on any
    // machine this runs on; a wrong unit (ms, ns) would be off by 1000.
    let mean = render_seconds / (renders_before + renders);
    assert!(mean > 0.0 && mean < 1.0, "mean render {mean} s");
    // Connections are tasks, not threads: the runtime's 2 workers plus at
    // most a few blocking threads for rendering.
    assert!(
        threads_max <= threads_before + 8,
        "threads grew with connections: {threads_before} -> {threads_max}"
    );

    ex.signal(libc::SIGTERM);
    assert!(
        ex.wait_exit(Duration::from_secs(15)).success(),
        "{}",
        ex.log()
    );
    assert!(!dir.path().join("pg-storage-exporter-probe").exists());
}
