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
    // One render per answer at most (plus the render of the scrape read
    // before the storm, counted once it completed): the runtime's one
    // worker renders the bodies in turn, and the exporter's own render
    // histogram counts each render once.
    assert!(
        renders >= 1.0 && renders <= ok as f64 + 1.0,
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

/// What anyone who can reach the port can do: hold 2,000 idle connections
/// and 500 that sent half a request head, opening again whatever the
/// exporter closes, while its open-file limit is 1,024 (the default under
/// systemd and most shells). Once with the hard limit at 1,024 too, so
/// raising the soft limit cannot hide anything; once with a higher hard
/// limit, which the exporter raises its soft limit to.
const IDLE_HOLDERS: usize = 2_000;
const PARTIAL_HOLDERS: usize = 500;
const HALF_HEAD: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\n";
const HOLD_FOR: Duration = Duration::from_secs(15);
/// A fresh scrape must be answered within this, however many are held.
const SCRAPE_BUDGET: Duration = Duration::from_secs(1);
/// The default `--web.max-connections`.
const MAX_CONNECTIONS: usize = 256;

#[test]
fn held_connections_starve_neither_scrapes_nor_descriptors() {
    let own = common::flood::raise_own_nofile();
    assert!(
        own >= 8_192,
        "the test holds {} connections: its own open-file limit is {own}; raise the hard limit",
        IDLE_HOLDERS + PARTIAL_HOLDERS
    );
    for (soft, hard) in [(1_024, 1_024), (1_024, 4_096)] {
        hold_against_exporter_under(soft, hard);
    }
}

fn hold_against_exporter_under(soft: u64, hard: u64) {
    use common::flood::{FdWatch, Holders, cpu_seconds, nofile_of, open_fds, under_prlimit};
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = under_prlimit(soft, hard);
    cmd.args(["--web.listen-address", "127.0.0.1:0"])
        // The descriptors counted are the HTTP layer's, not the sync
        // tracing's programs and maps, which its thread opens after start.
        .arg("--no-collector.postgres.syncs")
        .args(fast_probe_args(&format!("t={}", dir.path().display())));
    let mut ex = Exporter::spawn(cmd);
    let pid = ex.child.id();
    let m = ex.wait_for("probes", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 3.0
    });
    let (ex_soft, ex_hard) = nofile_of(pid);
    assert_eq!(
        (ex_soft.as_str(), ex_hard.parse::<u64>().unwrap()),
        (hard.to_string().as_str(), hard),
        "the exporter raises its soft open-file limit to the hard one"
    );
    let probe_dir = dir.path().join("pg-storage-exporter-probe");
    let files = dir_entries(&probe_dir);
    assert!(files.contains(&"wal.probe".to_string()), "{files:?}");
    let commits_before = count(&m, "t", "commit");
    let healthy_before: Vec<_> = samples_with(&m, "pgstorage_collector_success", &[]);
    let fds_before = open_fds(pid);

    let holders = Holders::start(ex.addr, IDLE_HOLDERS, PARTIAL_HOLDERS, HALF_HEAD);
    let fds = FdWatch::start(pid);
    let cpu_before = cpu_seconds(pid);
    let start = Instant::now();
    let mut answered = Vec::new();
    let mut failed = Vec::new();
    while start.elapsed() < HOLD_FOR {
        std::thread::sleep(Duration::from_millis(500));
        match timed_scrape(ex.addr) {
            Ok(took) => answered.push(took),
            Err(e) => failed.push(format!("at {:.1?}: {e}", start.elapsed())),
        }
    }
    let held = holders.held();
    let connects = holders.connects();
    let cpu = (cpu_seconds(pid) - cpu_before) / start.elapsed().as_secs_f64();
    // The series below come from one more scrape, still under the hold.
    let m = match timed_metrics(ex.addr) {
        Ok(m) => m,
        Err(e) => {
            failed.push(format!("after the hold: {e}"));
            String::new()
        }
    };
    let fds_max = fds.max();
    drop(fds);
    let slowest = answered.iter().max().copied().unwrap_or_default();
    let listener = format!("listener=\"{}\"", ex.addr);
    let open = samples_with(&m, "pgstorage_http_connections", &[&listener]);
    let evicted = samples_with(
        &m,
        "pgstorage_http_connections_closed_total",
        &[&listener, "reason=\"evicted\""],
    );
    eprintln!(
        "RLIMIT_NOFILE {soft}:{hard} (the exporter runs with {ex_soft}:{ex_hard}): \
         {} scrapes answered within {SCRAPE_BUDGET:?} (slowest {slowest:.1?}), {} not; \
         holders: {held} connections open at the end, {connects} opened in all; \
         exporter descriptors {fds_before} before, at most {fds_max} during, CPU {:.0} %; \
         open {open:?}, evicted {evicted:?}",
        answered.len(),
        failed.len(),
        cpu * 100.0,
    );
    assert!(
        failed.is_empty(),
        "scrapes not answered within {SCRAPE_BUDGET:?} while connections were held \
         (RLIMIT_NOFILE {soft}:{hard}): {failed:#?}\nlog tail:\n{}",
        log_tail(&ex.log(), 8)
    );
    assert!(
        answered.len() >= 10,
        "{} scrapes in {HOLD_FOR:?}",
        answered.len()
    );
    // The cap, plus at most 16 connections being closed, plus what the
    // exporter held before (probe files, runtime, listener), plus a few
    // files the collectors open and close.
    assert!(
        fds_max <= fds_before + MAX_CONNECTIONS + 32,
        "descriptors {fds_before} before, {fds_max} during the hold"
    );
    assert!(
        open.len() == 1 && open[0].1 <= (MAX_CONNECTIONS + 16) as f64,
        "{open:?}"
    );
    assert!(evicted.len() == 1 && evicted[0].1 > 0.0, "{evicted:?}");
    let log = ex.log();
    for bad in ["Too many open files", "EMFILE", "ENFILE"] {
        assert!(
            !log.contains(bad),
            "{bad} in the log:\n{}",
            log_tail(&log, 20)
        );
        assert!(!m.contains(bad), "{bad} in the metrics");
    }
    assert_eq!(
        log.matches("connection limit reached").count(),
        1,
        "one line when the cap is first reached:\n{}",
        log_tail(&log, 20)
    );
    // The rest of the exporter did not notice: probe files in place,
    // probes counting (100 ms interval: about 150 in 15 s), every
    // collector as healthy as before.
    assert_eq!(dir_entries(&probe_dir), files);
    let commits_after = count(&m, "t", "commit");
    assert!(
        commits_after - commits_before >= 20.0,
        "probes stalled during the hold: {commits_before} -> {commits_after}"
    );
    assert_eq!(
        samples_with(&m, "pgstorage_collector_success", &[]),
        healthy_before
    );

    // SIGTERM with the connections still held: they do not hold up the
    // shutdown, and the probe files go.
    ex.signal(libc::SIGTERM);
    let status = ex.wait_exit(Duration::from_secs(15));
    holders.stop();
    assert!(status.success(), "{status:?}\n{}", log_tail(&ex.log(), 20));
    assert!(!probe_dir.exists());
}

/// GET /metrics on a fresh connection, all of it (connect, request, the
/// whole answer) within [`SCRAPE_BUDGET`]: how long it took.
fn timed_scrape(addr: std::net::SocketAddr) -> Result<Duration, String> {
    let t0 = Instant::now();
    let body = timed_metrics(addr)?;
    let took = t0.elapsed();
    if took > SCRAPE_BUDGET {
        return Err(format!("answered after {took:.2?}"));
    }
    if !body.contains("pgstorage_build_info") {
        return Err(format!("incomplete answer ({} bytes)", body.len()));
    }
    Ok(took)
}

/// The body of GET /metrics on a fresh connection, given up on after
/// [`SCRAPE_BUDGET`] at each step.
fn timed_metrics(addr: std::net::SocketAddr) -> Result<String, String> {
    use std::io::{Read, Write};
    let t0 = Instant::now();
    let mut s = std::net::TcpStream::connect_timeout(&addr, SCRAPE_BUDGET)
        .map_err(|e| format!("connect: {e} after {:.2?}", t0.elapsed()))?;
    s.set_read_timeout(Some(SCRAPE_BUDGET)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: t\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("read: {e} after {:.2?}, {} bytes", t0.elapsed(), raw.len()))?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no answer after {:.2?}: {raw:?}", t0.elapsed()))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!("answer {head:?}"));
    }
    Ok(body.to_string())
}

fn log_tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Descriptors exhausted by something other than HTTP (here: the soft
/// open-file limit lowered under the running exporter, below the
/// descriptors it holds): accept(2) fails with EMFILE. The listener counts each
/// failure, logs one line for the incident instead of one per attempt,
/// retries after short pauses without spinning, and serves the scrape that
/// waited in the kernel's queue once a descriptor is free again.
#[test]
fn accept_survives_running_out_of_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let args = fast_probe_args(&format!("t={}", dir.path().display()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut ex = Exporter::start(&args);
    let pid = ex.child.id();
    ex.wait_for("probes", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 3.0
    });
    let (soft, _) = common::flood::nofile_of(pid);
    let set_soft = |limit: &str| {
        sh(
            "prlimit",
            &["--pid", &pid.to_string(), &format!("--nofile={limit}:")],
        )
    };
    // Below every descriptor the exporter holds beyond stdin, stdout and
    // stderr: each new one fails, whatever closes meanwhile.
    set_soft("3");
    // Waits in the kernel's accept queue: the exporter cannot take it.
    let addr = ex.addr;
    let waiting = std::thread::spawn(move || {
        let t0 = Instant::now();
        let got = http_get(addr, "/metrics", None);
        (got, t0.elapsed())
    });
    let failed_line = "accepting connections failed";
    ex.wait_log(failed_line, Duration::from_secs(10));
    let cpu_before = common::flood::cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(3));
    let cpu = common::flood::cpu_seconds(pid) - cpu_before;
    let log = ex.log();
    assert_eq!(log.matches(failed_line).count(), 1, "{log}");
    assert!(!waiting.is_finished(), "served without a descriptor?");
    set_soft(&soft);
    let ((status, _, body), waited) = waiting.join().unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("pgstorage_build_info"));
    let log = ex.wait_log("accepting connections again", Duration::from_secs(10));
    let m = ex.metrics();
    let errors = samples_with(
        &m,
        "pgstorage_http_accept_errors_total",
        &[&format!("listener=\"{addr}\""), "error=\"EMFILE\""],
    );
    eprintln!(
        "EMFILE at accept for {waited:.1?}: {errors:?}, CPU {cpu:.2} s in 3 s; log:\n{}",
        log.lines()
            .filter(|l| l.contains("accepting connections"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Pauses of 5 ms doubling to 250 ms: about 4 attempts a second, not
    // thousands; and no busy loop.
    assert!(
        errors.len() == 1 && errors[0].1 >= 3.0 && errors[0].1 <= 100.0,
        "{errors:?}"
    );
    assert!(cpu < 1.0, "{cpu} s of CPU in 3 s of EMFILE");
    assert_eq!(log.matches(failed_line).count(), 1, "{log}");
    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(Duration::from_secs(15)).success());
}
