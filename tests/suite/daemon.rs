//! The real binary on real temp directories, scraped over real HTTP.

use crate::common;

use std::time::Duration;

use common::*;

const PROBE_METRICS: &[&str] = &[
    "pgstorage_probe_seconds_bucket",
    "pgstorage_probe_seconds_sum",
    "pgstorage_probe_seconds_count",
    "pgstorage_probe_window_seconds",
    "pgstorage_probe_window_seconds_count",
    "pgstorage_probe_errors_total",
    "pgstorage_probe_in_flight_seconds",
    "pgstorage_probe_cache_served_reads_total",
    "pgstorage_volume_info",
    "pgstorage_commit_ceiling_per_second",
    "pgstorage_build_info",
];

fn start_fast(dir: &std::path::Path, extra: &[&str]) -> Exporter {
    let np = format!("t={}", dir.display());
    let mut args: Vec<String> = fast_probe_args(&np);
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Exporter::start(&refs)
}

#[test]
fn scrape_shows_every_probe_metric_and_counts_grow() {
    let dir = tempfile::tempdir().unwrap();
    // Every op: the default leaves out write and sync (tests/suite/collectors.rs).
    let ex = start_fast(dir.path(), &["--collector.probes.split"]);
    let first = ex.wait_for(
        "3 commit and read probes and a burst",
        Duration::from_secs(30),
        |m| {
            count(m, "t", "commit") >= 3.0
                && count(m, "t", "read") >= 3.0
                && sample(
                    m,
                    "pgstorage_probe_window_samples{volume=\"t\",op=\"read\",phase=\"busy\"}",
                )
                .is_some()
        },
    );
    std::thread::sleep(Duration::from_millis(1500));
    let second = ex.metrics();
    for op in ["write", "sync", "commit", "read"] {
        assert!(
            count(&second, "t", op) > count(&first, "t", op),
            "{op} count did not grow: {} -> {}",
            count(&first, "t", op),
            count(&second, "t", op)
        );
    }
    // All but the ceilings: they wait for three bursts (the next test).
    for name in PROBE_METRICS
        .iter()
        .filter(|n| **n != "pgstorage_commit_ceiling_per_second")
    {
        assert!(
            second.lines().any(|l| l.starts_with(name)),
            "{name} missing from scrape:\n{second}"
        );
    }
    // Both figures, every op, every quantile: a plausible latency.
    for phase in ["busy", "after_idle"] {
        let qs = samples_with(
            &second,
            "pgstorage_probe_window_seconds",
            &["volume=\"t\"", &format!("phase=\"{phase}\""), "quantile="],
        );
        assert_eq!(qs.len(), 4 * 5, "{phase}: 4 ops x 5 quantiles: {qs:?}");
        for (series, v) in &qs {
            assert!(*v > 0.0 && *v < 10.0, "{series} = {v}");
        }
    }
    // One burst so far (the next is busy_every = 30 s away): the recorded
    // half of its 24 commits on a quiet host; on a host so busy that the
    // burst's commits stall now and then like a throttle's cycles, the
    // burst runs on and records those cycles, at most its 256 commits
    // (model::pacing::steady_commits). Each recorded commit has its sync.
    // And the reads of its 8 ms span (at least 16, at most 512).
    let busy = |op: &str| {
        sample(
            &second,
            &format!("pgstorage_probe_window_samples{{volume=\"t\",op=\"{op}\",phase=\"busy\"}}"),
        )
    };
    let commits = busy("commit").unwrap();
    assert!(
        commits == 12.0 || (commits > 12.0 && commits <= 256.0),
        "{commits} busy commits\n{second}"
    );
    assert_eq!(busy("sync"), Some(commits));
    let reads = busy("read").unwrap();
    assert!((16.0..=512.0).contains(&reads), "{reads} busy reads");
    // A span, not a count: between the floor and the ceiling the recorded
    // reads all started within 8 ms of the first, one after another, so
    // together they took at most the span plus the last one.
    let read_sum = sample(
        &second,
        "pgstorage_probe_seconds_sum{volume=\"t\",op=\"read\",phase=\"busy\"}",
    )
    .unwrap();
    let read_max = sample(
        &second,
        "pgstorage_probe_window_seconds{volume=\"t\",op=\"read\",phase=\"busy\",quantile=\"1\"}",
    )
    .unwrap();
    assert!(read_sum > 0.0 && read_max > 0.0, "{read_sum} {read_max}");
    if reads > 16.0 && reads < 512.0 {
        assert!(
            read_sum < 0.008 + read_max,
            "{reads} busy reads took {read_sum} s in all, the slowest {read_max} s"
        );
    }
    // The lone probes: one per 100 ms interval since start.
    let lone = sample(
        &second,
        "pgstorage_probe_window_samples{volume=\"t\",op=\"commit\",phase=\"after_idle\"}",
    )
    .unwrap();
    assert!((3.0..1000.0).contains(&lone), "{lone}");
    assert_eq!(
        sample(&second, "pgstorage_probe_slowdown_ratio{volume=\"t\"}"),
        Some(1.0)
    );
    // One burst is one moment of the host: no ceiling rests on it, and
    // none on the after-idle figure meanwhile.
    let ceilings = samples_with(
        &second,
        "pgstorage_commit_ceiling_per_second",
        &["volume=\"t\""],
    );
    assert!(ceilings.is_empty(), "{ceilings:?}");
    let info = samples_with(&second, "pgstorage_volume_info", &["volume=\"t\""]);
    assert_eq!(info.len(), 1);
    assert!(
        info[0].0.contains("sync_method=\"fdatasync\""),
        "{}",
        info[0].0
    );
    assert!(
        info[0].0.contains("engine=\"io_uring\"") || info[0].0.contains("engine=\"sync\""),
        "{}",
        info[0].0
    );
    assert!(info[0].0.contains(&format!(
        "path=\"{}\"",
        dir.path().canonicalize().unwrap().display()
    )));
    let in_flight = sample(&second, "pgstorage_probe_in_flight_seconds{volume=\"t\"}").unwrap();
    assert!((0.0..10.0).contains(&in_flight), "{in_flight}");
}

#[test]
fn probe_ceilings_appear_with_the_third_burst() {
    let dir = tempfile::tempdir().unwrap();
    let ex = start_fast(dir.path(), &["--probe.busy-every", "5s"]);
    let busy = |m: &str| {
        sample(
            m,
            "pgstorage_probe_window_samples{volume=\"t\",op=\"commit\",phase=\"busy\"}",
        )
        .unwrap_or(0.0)
    };
    let ceiling = |m: &str, basis: &str| {
        sample(
            m,
            &format!("pgstorage_commit_ceiling_per_second{{volume=\"t\",basis=\"{basis}\"}}"),
        )
    };
    let seen_without = std::cell::Cell::new(false);
    // Three bursts 5 s apart on a quiet host; a burst that ran on through
    // stalls of a busy host puts the next off by as many times its usual
    // length (up to about 10), so allow two such.
    let m = ex.wait_for("the probe_mean ceiling", Duration::from_secs(150), |m| {
        let c = ceiling(m, "probe_mean");
        if c.is_none() && busy(m) > 0.0 {
            seen_without.set(true);
        }
        c.is_some()
    });
    // The default 15 min window holds three bursts of at least 12
    // recorded commits: one burst that recorded 36 is not enough.
    assert!(busy(&m) >= 36.0, "{} busy commits:\n{m}", busy(&m));
    assert!(
        seen_without.get(),
        "a burst was in the window before the ceiling"
    );
    // 1.1 / the mean of the window's busy commits: between 1.1 / the
    // slowest and 1.1 / the median at most as far as the mean lies below
    // the median (never below the fastest, which is not exported).
    let slowest = sample(
        &m,
        "pgstorage_probe_window_seconds{volume=\"t\",op=\"commit\",phase=\"busy\",quantile=\"1\"}",
    )
    .unwrap();
    let ceil = ceiling(&m, "probe_mean").unwrap();
    assert!(
        ceil * slowest >= 1.1 - 1e-6,
        "ceiling is 1.1 / a mean no slower than the slowest: {ceil} * {slowest}"
    );
    let ceilings = samples_with(&m, "pgstorage_commit_ceiling_per_second", &["volume=\"t\""]);
    assert_eq!(ceilings.len(), 1, "{ceilings:?}");
    for (series, v) in &ceilings {
        assert!(*v > 0.1 && *v < 1e7, "{series} = {v}");
    }
}

/// (thread name, nice value) of every thread of `pid`, from
/// /proc/<pid>/task/<tid>/stat (field 19, after the parenthesised name).
fn thread_nice(pid: u32) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let stat = std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap();
        let (open, close) = (stat.find('(').unwrap(), stat.rfind(')').unwrap());
        let name = stat[open + 1..close].to_string();
        // After ") ": state is field 3, so nice (field 19) is the 17th.
        let nice = stat[close + 2..]
            .split(' ')
            .nth(16)
            .unwrap()
            .parse()
            .unwrap();
        out.push((name, nice));
    }
    out
}

/// The probe threads keep the process's own priority while the async
/// workers run at nice 10: a probe times the wake-up after its IO, which
/// must not wait behind scrape encoding. A thread inherits its creator's
/// nice value, and the probe threads are created on the runtime's
/// blocking threads: those must not be niced either.
#[test]
fn probe_threads_keep_the_process_priority_and_workers_are_niced() {
    let dir = tempfile::tempdir().unwrap();
    let ex = start_fast(dir.path(), &[]);
    ex.wait_for("3 commit probes", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 3.0
    });
    // A few scrapes, so both workers have run and parked.
    for _ in 0..5 {
        ex.metrics();
    }
    let threads = thread_nice(ex.child.id());
    eprintln!("{threads:?}");
    let main = threads
        .iter()
        .find(|(n, _)| n == "pg-storage-expo")
        .map(|t| t.1)
        .unwrap();
    let probes: Vec<_> = threads
        .iter()
        .filter(|(n, _)| n.starts_with("probe-"))
        .collect();
    assert_eq!(probes.len(), 1, "{threads:?}");
    assert!(probes.iter().all(|(_, nice)| *nice == main), "{threads:?}");
    let workers: Vec<_> = threads.iter().filter(|(n, _)| n == "pgse-async").collect();
    assert!(!workers.is_empty(), "{threads:?}");
    assert!(
        workers.iter().any(|(_, nice)| *nice == main + 10),
        "{threads:?}"
    );
}

#[test]
fn forced_fallback_engine_works() {
    let dir = tempfile::tempdir().unwrap();
    let ex = start_fast(dir.path(), &["--probe.engine", "sync"]);
    let m = ex.wait_for("commit and read probes", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 3.0 && count(m, "t", "read") >= 3.0
    });
    let info = samples_with(&m, "pgstorage_volume_info", &["volume=\"t\""]);
    assert!(info[0].0.contains("engine=\"sync\""), "{}", info[0].0);
    let p50 = sample(
        &m,
        "pgstorage_probe_window_seconds{volume=\"t\",op=\"commit\",phase=\"after_idle\",quantile=\"0.5\"}",
    )
    .unwrap();
    assert!(p50 > 0.0 && p50 < 10.0, "{p50}");
}

#[test]
fn auto_engine_falls_back_when_io_uring_is_unavailable_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let np = format!("t={}", dir.path().display());
    let args = fast_probe_args(&np);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let ex = Exporter::start_env(&refs, &[("PG_STORAGE_EXPORTER_DISABLE_IO_URING", "1")]);
    let m = ex.wait_for("commit probes", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 2.0
    });
    assert!(m.contains("engine=\"sync\""));
    ex.wait_log("io_uring unavailable", Duration::from_secs(10));
}

#[test]
fn probe_files_exist_while_running_and_are_gone_after_sigterm_and_sigint() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let dir = tempfile::tempdir().unwrap();
        let probe_dir = dir.path().join("pg-storage-exporter-probe");
        let mut ex = start_fast(dir.path(), &[]);
        ex.wait_for("a commit probe", Duration::from_secs(30), |m| {
            count(m, "t", "commit") >= 1.0
        });
        assert_eq!(
            dir_entries(&probe_dir),
            vec!["lock", "read.probe", "wal.probe"]
        );
        let wal = std::fs::metadata(probe_dir.join("wal.probe")).unwrap();
        assert_eq!(
            wal.len(),
            16 << 20,
            "WAL probe file preallocated to one segment"
        );
        assert_eq!(
            std::fs::metadata(probe_dir.join("read.probe"))
                .unwrap()
                .len(),
            4 << 20
        );
        ex.signal(sig);
        let status = ex.wait_exit(Duration::from_secs(15));
        assert!(
            status.success(),
            "signal {sig}: exit {status:?}; log:\n{}",
            ex.log()
        );
        assert!(
            !probe_dir.exists(),
            "probe dir left behind: {:?}",
            dir_entries(&probe_dir)
        );
        assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
        ex.wait_log("removed probe files", Duration::from_secs(10));
    }
}

#[test]
fn stale_probe_files_of_a_crashed_run_are_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let probe_dir = dir.path().join("pg-storage-exporter-probe");
    // A real crash: SIGKILL leaves the files, the directory and the lock
    // that records them.
    let mut crashed = start_fast(dir.path(), &[]);
    crashed.wait_for("a commit probe", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 1.0
    });
    crashed.signal(libc::SIGKILL);
    crashed.wait_exit(Duration::from_secs(15));
    assert_eq!(
        dir_entries(&probe_dir),
        vec!["lock", "read.probe", "wal.probe"]
    );
    let mut ex = start_fast(dir.path(), &[]);
    ex.wait_for("a commit probe", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 1.0
    });
    ex.wait_log("removed stale probe file", Duration::from_secs(10));
    assert_eq!(
        std::fs::metadata(probe_dir.join("wal.probe"))
            .unwrap()
            .len(),
        16 << 20
    );
    // The directory the crashed run created is this run's to remove.
    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(Duration::from_secs(15)).success());
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
}

#[test]
fn second_exporter_on_the_same_probe_dir_is_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let a = start_fast(dir.path(), &[]);
    a.wait_for("a commit probe", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 1.0
    });
    let b = start_fast(dir.path(), &[]);
    let m = b.wait_for("setup error", Duration::from_secs(30), |m| {
        m.contains("pgstorage_probe_errors_total{volume=\"t\",op=\"setup\",error=\"in_use\"} 1")
    });
    assert_eq!(count(&m, "t", "commit"), 0.0);
    b.wait_log(
        "in use by another pg-storage-exporter",
        Duration::from_secs(10),
    );
    // The first keeps probing.
    let before = count(&a.metrics(), "t", "commit");
    std::thread::sleep(Duration::from_millis(500));
    assert!(count(&a.metrics(), "t", "commit") > before);
}

#[test]
fn promtool_accepts_a_real_scrape_plain_and_gzipped() {
    let dir = tempfile::tempdir().unwrap();
    let ex = start_fast(dir.path(), &[]);
    let body = ex.wait_for("probes of every op", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 2.0 && count(m, "t", "read") >= 2.0
    });
    promtool_check_metrics(&body);

    // Prometheus always sends this header: the answer is gzip, and what it
    // decompresses to passes promtool as well.
    let (status, headers, gz) =
        http_get_bytes(ex.addr, "/metrics", &[("Accept-Encoding", "gzip, deflate")]);
    assert_eq!(status, 200);
    assert_eq!(
        header(&headers, "content-encoding"),
        Some("gzip"),
        "{headers:?}"
    );
    assert!(
        header(&headers, "content-type")
            .is_some_and(|c| c.starts_with("text/plain; version=0.0.4")),
        "{headers:?}"
    );
    let mut plain = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut plain).unwrap();
    eprintln!(
        "/metrics: {} bytes gzipped, {} bytes decompressed ({:.1}x)",
        gz.len(),
        plain.len(),
        plain.len() as f64 / gz.len() as f64
    );
    assert!(plain.contains("pgstorage_build_info"), "{plain}");
    assert!(
        gz.len() * 3 < plain.len(),
        "{} vs {}",
        gz.len(),
        plain.len()
    );
    promtool_check_metrics(&plain);

    // Without the header, or with only identity, the body is plain.
    for asked in [None, Some("identity")] {
        let hs: Vec<(&str, &str)> = asked.map(|a| ("Accept-Encoding", a)).into_iter().collect();
        let (status, headers, body) = http_get_bytes(ex.addr, "/metrics", &hs);
        assert_eq!(status, 200);
        assert_eq!(
            header(&headers, "content-encoding"),
            None,
            "{asked:?}: {headers:?}"
        );
        assert!(
            String::from_utf8(body)
                .unwrap()
                .contains("pgstorage_build_info")
        );
    }
}

/// Socket activation as systemd does it, by systemd's own tool:
/// `systemd-socket-activate` binds the port, waits for the first
/// connection, then execs the exporter with the socket as fd 3.
#[test]
fn systemd_socket_activation_serves_the_passed_socket() {
    let tool = "systemd-socket-activate";
    let found = std::process::Command::new(tool).arg("--version").output();
    assert!(
        found.is_ok(),
        "{tool} not found: install the Debian package `systemd` (./scripts/test does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut cmd = std::process::Command::new(tool);
    cmd.args(["-l", &addr.to_string(), BIN, "--web.systemd-socket"])
        .args(fast_probe_args(&format!("t={}", dir.path().display())));
    // The first connection is what makes the tool start the exporter.
    let knock = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if std::net::TcpStream::connect(addr).is_ok() {
                return http_get(addr, "/healthz", None);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{tool} never listened"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let ex = Exporter::spawn(cmd);
    assert_eq!(ex.addr, addr, "{}", ex.log());
    let (status, _, body) = knock.join().unwrap();
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    ex.wait_for("a commit probe", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 1.0
    });
    let log = ex.log();
    let line = log.lines().find(|l| l.contains("address=")).unwrap();
    assert!(line.contains("systemd_socket=true"), "{line}");
}

#[test]
fn systemd_socket_without_a_socket_is_refused() {
    let out = std::process::Command::new(BIN)
        .arg("--web.systemd-socket")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no socket activation file descriptors found"),
        "{err}"
    );
}

#[test]
fn listens_on_every_listen_address() {
    let dir = tempfile::tempdir().unwrap();
    let np = format!("t={}", dir.path().display());
    let mut args: Vec<String> = vec![
        "--web.listen-address".into(),
        "127.0.0.1:0".into(),
        "--web.listen-address".into(),
        "127.0.0.2:0".into(),
    ];
    args.extend(fast_probe_args(&np));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let ex = Exporter::start_raw(&refs, &[]);
    let log = ex.wait_log("address=127.0.0.2:", Duration::from_secs(10));
    let addrs: Vec<std::net::SocketAddr> = log
        .lines()
        .filter(|l| l.contains("msg=listening"))
        .filter_map(|l| l.split("address=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(addrs.len(), 2, "{log}");
    for a in addrs {
        let (status, _, body) = http_get(a, "/metrics", None);
        assert_eq!(status, 200, "{a}");
        assert!(body.contains("pgstorage_build_info"), "{a}");
    }
}

#[test]
fn openmetrics_when_asked_and_landing_and_health() {
    let dir = tempfile::tempdir().unwrap();
    let ex = start_fast(dir.path(), &[]);
    ex.wait_for("a commit probe", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 1.0
    });
    let (status, ctype, body) = http_get(
        ex.addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    );
    assert_eq!(status, 200);
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    assert!(
        body.ends_with("# EOF\n"),
        "{}",
        &body[body.len().saturating_sub(200)..]
    );
    assert_eq!(body.matches("# EOF").count(), 1);
    assert!(body.contains("# TYPE pgstorage_probe_window_seconds summary"));
    let (status, ctype, _) = ex.get("/metrics");
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    let (status, _, body) = ex.get("/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, ctype, body) = ex.get("/");
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/html"));
    assert!(
        body.contains("href=\"/metrics\"") && body.contains("<td>t</td>"),
        "{body}"
    );
    let (status, _, _) = ex.get("/nope");
    assert_eq!(status, 404);
}

#[test]
fn custom_telemetry_path() {
    let dir = tempfile::tempdir().unwrap();
    let ex = start_fast(dir.path(), &["--web.telemetry-path", "/probe-metrics"]);
    let (status, _, body) = ex.get("/probe-metrics");
    assert_eq!(status, 200);
    assert!(body.contains("pgstorage_build_info"));
    assert_eq!(ex.get("/metrics").0, 404);
}

#[test]
fn misspelt_config_key_exits_before_binding_with_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[volume]]\nname = \"wal\"\npath = \"{}\"\nsync_metod = \"fsync\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    // A port we hold ourselves: if the exporter got as far as binding, it
    // would fail differently ("cannot listen").
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["--config.file", cfg.to_str().unwrap()])
        .args([
            "--web.listen-address",
            &held.local_addr().unwrap().to_string(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{}:4:1: volume[0].sync_metod: unknown field `sync_metod`",
            cfg.display()
        )),
        "{err}"
    );
    assert!(!err.contains("cannot listen"), "{err}");
    assert_eq!(dir_entries(dir.path()), vec!["c.toml"], "nothing created");
}

/// A NUL byte in a configured path (TOML's `\u0000`, YAML's `\0` in the
/// web configuration) is refused at start with the key named, the byte
/// shown escaped, never written raw to the terminal or the log.
#[test]
fn a_nul_byte_in_a_path_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let web = "tls_server_config:\n  cert_file: \"/etc/c\\0rt.pem\"\n  key_file: k.pem\n";
    for (line, web, key) in [
        (
            format!("path = \"{d}\"\nprobe_dir = \"{d}/pr\\u0000be\"\n"),
            None,
            "volume[0].probe_dir",
        ),
        (
            format!("path = \"{d}/v\\u0000l\"\n"),
            None,
            "volume[0].path",
        ),
        (
            format!("path = \"{d}\"\n"),
            Some(web),
            "tls_server_config.cert_file",
        ),
    ] {
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, format!("[[volume]]\nname = \"t\"\n{line}")).unwrap();
        let mut cmd = std::process::Command::new(BIN);
        cmd.args(["--config.file", cfg.to_str().unwrap()])
            .args(["--web.listen-address", "127.0.0.1:0"]);
        let mut want_files = vec!["c.toml"];
        if let Some(web) = web {
            let w = dir.path().join("web.yml");
            std::fs::write(&w, web).unwrap();
            cmd.args(["--web.config.file", w.to_str().unwrap()]);
            want_files.push("web.yml");
        }
        let mut child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = Vec::new();
        std::io::Read::read_to_end(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        let text = String::from_utf8_lossy(&err);
        assert!(!err.contains(&0), "{key}: a raw NUL byte in: {text:?}");
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{key}: {text}");
        assert!(text.contains(&format!("{key}: ")), "{text}");
        assert!(text.contains("NUL"), "{text}");
        assert!(text.contains("\\0"), "the byte shown escaped: {text}");
        assert_eq!(dir_entries(dir.path()), want_files, "nothing created");
    }
}

#[test]
fn bad_flags_are_refused() {
    for (args, want) in [
        (
            vec!["--probe.path", "/does/not/exist"],
            "/does/not/exist: No such file or directory",
        ),
        (vec!["--probe.interval", "1"], "a unit is required"),
        (
            vec!["--web.listen-address", "nonsense"],
            "--web.listen-address \"nonsense\"",
        ),
        (
            vec!["--web.listen-address", "9847"],
            "--web.listen-address \"9847\": a bare port; write \":9847\"",
        ),
        (vec!["--probe.engine", "uring"], "invalid value 'uring'"),
    ] {
        let out = std::process::Command::new(BIN)
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn required_io_uring_on_a_host_without_it_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .args(["--probe.path", &format!("t={}", dir.path().display())])
        .args([
            "--probe.engine",
            "io_uring",
            "--web.listen-address",
            "127.0.0.1:0",
        ])
        .env("PG_STORAGE_EXPORTER_DISABLE_IO_URING", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("volume \"t\" sets engine = \"io_uring\": io_uring is not available"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "printed once: {err}");
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
}

#[test]
fn data_source_name_adds_a_cluster_and_an_unreachable_one_is_pg_up_0() {
    let dir = tempfile::tempdir().unwrap();
    let np = format!("t={}", dir.path().display());
    let mut args = fast_probe_args(&np);
    args.extend(["--pg.scrape-interval".to_string(), "200ms".to_string()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    // Port 1 on loopback: nothing listens there.
    let ex = Exporter::start_env(
        &refs,
        &[(
            "DATA_SOURCE_NAME",
            "host=127.0.0.1 port=1 user=x password=Secret-Never-Logged sslmode=disable",
        )],
    );
    let m = ex.wait_for(
        "pg_up 0 and a connect error",
        Duration::from_secs(20),
        |m| {
            m.contains("pgstorage_pg_up{cluster=\"pg1\"} 0")
                && sample(
                    m,
                    "pgstorage_pg_scrape_errors_total{cluster=\"pg1\",query=\"connect\",cause=\"connection\"}",
                )
                .unwrap_or(0.0)
                    >= 1.0
        },
    );
    assert_eq!(sample(&m, "pgstorage_pg_up{cluster=\"pg1\"}"), Some(0.0));
    // Probing goes on regardless.
    ex.wait_for("probes", Duration::from_secs(10), |m| {
        count(m, "t", "commit") >= 1.0
    });
    let log = ex.log();
    assert!(
        log.contains("target=\"host=127.0.0.1 port=1 user=x dbname=x sslmode=disable\""),
        "{log}"
    );
    assert!(!log.contains("Secret-Never-Logged"), "{log}");
}

#[test]
fn bad_dsn_is_a_config_error_naming_the_option() {
    let out = std::process::Command::new(BIN)
        .args([
            "--pg.dsn",
            "main=host=/run/postgresql colour=blue",
            "--web.listen-address",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    // The unknown word is located, not quoted: it may be the rest of a
    // password cut at a space.
    assert!(
        err.contains(
            "flag --pg.dsn: main: invalid connection string: unknown connection option at \
             character 22, after the value of \"host\""
        ),
        "{err}"
    );
    assert!(!err.contains("colour"), "{err}");
}

#[test]
fn version_flag() {
    let out = std::process::Command::new(BIN)
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("pg-storage-exporter {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_shows_every_default() {
    use pg_storage_exporter::probe::settings::ProbeSettings;
    use pg_storage_exporter::units::{fmt_bytes, fmt_duration};
    let help = |args: &[&str]| {
        let out = std::process::Command::new(BIN).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let main = help(&["--help"]);
    let d = ProbeSettings::default();
    for want in [
        format!(
            "(default: {}, or [defaults].interval",
            fmt_duration(d.interval)
        ),
        format!(
            "(default: {}, or [defaults].busy_every",
            fmt_duration(d.busy_every)
        ),
        format!(
            "(default: {}, or [defaults].read_file_size",
            fmt_bytes(d.read_file_size)
        ),
        format!(
            "(default: {}, or [defaults].free_space_reserve",
            fmt_bytes(d.free_space_reserve)
        ),
        format!(
            "(default: {}, or [defaults].sync_method",
            d.sync_method.as_str()
        ),
        format!("(default: {}, or [defaults].engine", d.engine.as_str()),
        format!(
            "[default: {}]",
            fmt_duration(pg_storage_exporter::config::DEFAULT_SCRAPE_INTERVAL)
        ),
        "[default: :9847]".to_string(),
        "[default: /metrics]".to_string(),
        "[default: info]".to_string(),
        "[default: logfmt]".to_string(),
        "Turns the default /var/tmp volume off".to_string(),
    ] {
        assert!(main.contains(&want), "{want} missing from:\n{main}");
    }
    let check = help(&["check", "--help"]);
    let sweep = format!(
        "({}s when given without a value",
        d.sweep_duration.as_secs()
    );
    for want in [
        "[default: 10s]",
        "[default: text]",
        "[default: fdatasync]",
        "[default: auto]",
        "[default: 64MiB]",
        "[default: 1GiB]",
        "[default: 5us]",
        "(default PATH/pg-storage-exporter-check)",
        &sweep,
    ] {
        assert!(check.contains(want), "{want} missing from:\n{check}");
    }
}

#[test]
fn a_volume_on_tmpfs_is_warned_about_once_at_start_and_once_per_reload() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let ex = start_fast(dir.path(), &[]);
    ex.wait_for("probes", Duration::from_secs(10), |m| {
        count(m, "t", "commit") >= 2.0
    });
    let warned = |log: &str| {
        log.lines()
            .filter(|l| l.contains("code=memory_filesystem"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let lines = warned(&ex.log());
    assert_eq!(lines.len(), 1, "{}", ex.log());
    assert!(lines[0].contains("level=WARN"), "{}", lines[0]);
    assert!(lines[0].contains("volume=t"), "{}", lines[0]);
    assert!(
        lines[0].contains("tmpfs keeps files in memory: sync returns immediately"),
        "{}",
        lines[0]
    );
    // A reload says it again, once.
    ex.signal(libc::SIGHUP);
    ex.wait_log("configuration reloaded", Duration::from_secs(10));
    let log = ex.log();
    assert_eq!(warned(&log).len(), 2, "{log}");
}

#[test]
fn a_pg_dsn_cluster_without_discovery_or_volume_is_warned_about_once() {
    // Port 1 on loopback: nothing listens there; the warning needs no server.
    let ex = Exporter::start(&[
        "--pg.dsn",
        "c=host=127.0.0.1 port=1 user=x sslmode=disable",
        "--no-pg.discover-volumes",
    ]);
    ex.wait_log("cannot connect to PostgreSQL", Duration::from_secs(10));
    let log = ex.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("code=no_probed_volume"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].contains("level=WARN"), "{}", lines[0]);
    assert!(lines[0].contains("cluster=c"), "{}", lines[0]);
    assert!(
        lines[0].contains("volume discovery is off for this cluster and no volume is configured"),
        "{}",
        lines[0]
    );
}
