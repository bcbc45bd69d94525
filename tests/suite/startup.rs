//! Start-up against hostile input, on the real binary: a telemetry path the
//! router cannot take as a literal route, a stop signal at any moment of
//! the start, and configuration, web configuration and password files that
//! are devices or FIFOs. Each must end in a clear error or a clean exit,
//! with nothing left in the probe directory's place.

use crate::common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A run of the binary that should end by itself: its status (`None` if
/// it was still running at `limit` and had to be killed), its stderr and
/// how long it ran.
struct Ended {
    status: Option<ExitStatus>,
    stderr: String,
    took: Duration,
}

fn run_until(args: &[&str], limit: Duration) -> Ended {
    let t0 = Instant::now();
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = t0.elapsed();
    Ended {
        status,
        stderr: reader.join().unwrap(),
        took,
    }
}

fn probe_dir(volume: &Path) -> PathBuf {
    volume.join("pg-storage-exporter-probe")
}

/// `--web.telemetry-path` values axum would panic on (`/:x`, `/*rest`, the
/// capture syntax of its 0.7) or take as a capture (`/{id}`: metrics on
/// every one-segment path), and an empty segment: exit 2 naming the flag
/// and the value, before any port or file. The exporter used to panic
/// (exit 101) on the first two after creating its probe files, and leave
/// them.
#[test]
fn telemetry_paths_that_are_not_literal_routes_exit_2_before_any_file() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("v");
    std::fs::create_dir(&vol).unwrap();
    let probe_path = format!("v={}", vol.display());
    for path in ["/:x", "/*rest", "/{id}", "/{*rest}", "/a//b", "/a b"] {
        let r = run_until(
            &[
                "--web.listen-address",
                "127.0.0.1:0",
                "--probe.path",
                &probe_path,
                "--web.telemetry-path",
                path,
            ],
            Duration::from_secs(20),
        );
        assert_eq!(
            r.status.and_then(|s| s.code()),
            Some(2),
            "{path}: {:?} after {:?}\n{}",
            r.status,
            r.took,
            r.stderr
        );
        assert!(
            r.stderr
                .contains(&format!("--web.telemetry-path {path:?}: ")),
            "{path}: {}",
            r.stderr
        );
        assert!(!r.stderr.contains("panicked"), "{path}: {}", r.stderr);
        assert!(
            !probe_dir(&vol).exists(),
            "{path}: {:?}",
            dir_entries(&probe_dir(&vol))
        );
        assert!(
            dir_entries(&vol).is_empty(),
            "{path}: {:?}",
            dir_entries(&vol)
        );
    }
}

/// A small xorshift: the delays need to spread, not to be unpredictable;
/// the seed is printed so a failing run can be repeated.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    std::env::var("PGSE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(nanos | 1)
}

/// A directory on tmpfs when there is one: the probe files are created in
/// microseconds there, so more of the 50 ms falls after they exist.
fn fast_tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// SIGTERM (and every fifth time SIGINT or SIGHUP) at a random moment of
/// the first 50 ms, 200 times: whenever it lands, nothing may be left in
/// the volume, neither probe files, nor the lock, nor the probe directory.
/// The signal used to kill the exporter when it came before the handler
/// was installed, which happened after the probe files were created: 44 of
/// 150 starts were killed, 2 of them left the directory and its lock.
/// Now the signals are held from the first line of `main` until the
/// handlers are in place; only a signal that lands before `main` runs
/// (during exec and the loader) still kills it, before it created
/// anything. SIGHUP is a reload, not a stop: the test stops that run with
/// SIGTERM after it.
#[test]
fn a_stop_signal_at_any_moment_of_the_start_leaves_nothing_behind() {
    const STARTS: usize = 200;
    let t0 = Instant::now();
    let seed = seed();
    let mut rng = Rng(seed);
    let dir = fast_tempdir();
    let vol = dir.path().join("v");
    std::fs::create_dir(&vol).unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "shutdown_timeout = \"2s\"\n[[volume]]\nname = \"v\"\npath = \"{}\"\n\
             interval = \"100ms\"\nread_file_size = \"1MiB\"\nfree_space_reserve = \"0\"\n",
            vol.display()
        ),
    )
    .unwrap();
    let (mut leftovers, mut killed, mut clean, mut hups) = (Vec::new(), 0, 0, 0);
    let mut latest_kill = Duration::ZERO;
    for i in 0..STARTS {
        let delay = Duration::from_micros(rng.below(50_000));
        let sig = match rng.below(10) {
            0 => libc::SIGINT,
            1 => libc::SIGHUP,
            _ => libc::SIGTERM,
        };
        let mut child = Command::new(BIN)
            .args([
                "--web.listen-address",
                "127.0.0.1:0",
                "--config.file",
                cfg.to_str().unwrap(),
                "--log.level",
                "error",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        // SAFETY: kill(2) on our own child, which has not been reaped.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        if sig == libc::SIGHUP {
            hups += 1;
            // A reload of the same file; the process must still be there
            // to be stopped (SIGHUP before main kills it, as any program).
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: as above.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "start {i}: still running 30 s after the signal"
            );
            std::thread::sleep(Duration::from_millis(2));
        };
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(0), _) => clean += 1,
            (_, Some(_)) => {
                killed += 1;
                latest_kill = latest_kill.max(delay);
            }
            _ => panic!("start {i}: {status:?} after signal {sig} at {delay:?}"),
        }
        let left = dir_entries(&vol);
        if !left.is_empty() {
            leftovers.push(format!(
                "start {i}: signal {sig} at {delay:?}, {status:?}: {left:?} {:?}",
                dir_entries(&probe_dir(&vol))
            ));
            std::fs::remove_dir_all(probe_dir(&vol)).unwrap();
        }
    }
    let took = t0.elapsed();
    println!(
        "{STARTS} starts (seed {seed}, {hups} with SIGHUP first) in {:.1} s: {clean} clean exits, \
         {killed} killed by the signal before main (sent at most {latest_kill:?} after the \
         spawn), {} with files left",
        took.as_secs_f64(),
        leftovers.len()
    );
    assert!(
        leftovers.is_empty(),
        "{} of {STARTS} starts left files (seed {seed}):\n{}",
        leftovers.len(),
        leftovers.join("\n")
    );
    assert!(clean > STARTS / 2, "{clean} clean exits of {STARTS}");
}

fn mkfifo(p: &Path) {
    let out = Command::new("mkfifo").arg(p).output().unwrap();
    assert!(out.status.success(), "mkfifo: {out:?}");
}

/// How long a refused start may take. The error comes at once (tens of
/// milliseconds); the exporter used to read /dev/zero until memory ran out
/// (1.9–2.6 GB in seconds) and to wait for ever on a FIFO.
const AT_ONCE: Duration = Duration::from_secs(2);

fn assert_refused_at_start(what: &str, r: &Ended, needles: &[&str]) {
    assert_eq!(
        r.status.and_then(|s| s.code()),
        Some(2),
        "{what}: {:?} after {:?} (None: killed at the time limit)\n{}",
        r.status,
        r.took,
        r.stderr
    );
    assert!(r.took < AT_ONCE, "{what}: exit 2 after {:?}", r.took);
    for n in needles {
        assert!(r.stderr.contains(n), "{what}: no {n:?} in:\n{}", r.stderr);
    }
    println!("{what}: exit 2 after {:?}", r.took);
}

/// `password_file`, `--config.file`, `--web.config.file` and a TLS
/// `key_file` pointing at /dev/zero or a FIFO: exit 2 at once, the error
/// naming the key (or flag) and the path and saying what the file is, and
/// no probe file created.
#[test]
fn device_and_fifo_files_are_refused_at_start_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("v");
    std::fs::create_dir(&vol).unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let fifo_s = fifo.to_str().unwrap();
    let cfg = dir.path().join("c.toml");
    let with_password_file = |pf: &str| {
        std::fs::write(
            &cfg,
            format!(
                "[[volume]]\nname = \"v\"\npath = \"{}\"\nread_file_size = \"1MiB\"\n\
                 free_space_reserve = \"0\"\n\
                 [[cluster]]\nname = \"main\"\ndsn = \"host=/nonexistent user=u dbname=d\"\n\
                 password_file = \"{pf}\"\ndiscover_volumes = false\n",
                vol.display()
            ),
        )
        .unwrap();
    };
    let start = |args: &[&str]| {
        let mut all = vec!["--web.listen-address", "127.0.0.1:0"];
        all.extend_from_slice(args);
        run_until(&all, Duration::from_secs(20))
    };
    let cfg_s = cfg.to_str().unwrap();
    let key_line = "c.toml:9: cluster[0].password_file: password file";

    with_password_file("/dev/zero");
    let r = start(&["--config.file", cfg_s]);
    assert_refused_at_start(
        "password_file /dev/zero",
        &r,
        &[
            key_line,
            "/dev/zero: is a character device, not a regular file",
        ],
    );
    with_password_file(fifo_s);
    let r = start(&["--config.file", cfg_s]);
    assert_refused_at_start(
        "password_file FIFO",
        &r,
        &[
            key_line,
            &format!("{fifo_s}: is a FIFO (named pipe), not a regular file"),
        ],
    );

    let r = start(&["--config.file", "/dev/zero"]);
    assert_refused_at_start(
        "--config.file /dev/zero",
        &r,
        &["cannot read config file /dev/zero: is a character device, not a regular file"],
    );
    let r = start(&["--config.file", fifo_s]);
    assert_refused_at_start(
        "--config.file FIFO",
        &r,
        &[&format!(
            "cannot read config file {fifo_s}: is a FIFO (named pipe), not a regular file"
        )],
    );
    let big = dir.path().join("big.toml");
    std::fs::write(&big, "# padding\n".repeat(120_000)).unwrap();
    let r = start(&["--config.file", big.to_str().unwrap()]);
    assert_refused_at_start(
        "--config.file of 1.2 MB",
        &r,
        &["is larger than 1 MiB, the most a configuration file may hold"],
    );

    let r = start(&["--web.config.file", "/dev/zero"]);
    assert_refused_at_start(
        "--web.config.file /dev/zero",
        &r,
        &["--web.config.file /dev/zero: cannot read: is a character device, not a regular file"],
    );
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        "tls_server_config:\n  cert_file: /dev/zero\n  key_file: /dev/zero\n",
    )
    .unwrap();
    let r = start(&["--web.config.file", web.to_str().unwrap()]);
    assert_refused_at_start(
        "TLS cert_file /dev/zero",
        &r,
        &["tls_server_config.cert_file /dev/zero: cannot read: is a character device"],
    );
    assert!(
        !probe_dir(&vol).exists(),
        "{:?}",
        dir_entries(&probe_dir(&vol))
    );
}

/// `check` stopped by SIGTERM, SIGINT or SIGHUP (its terminal closed) at a
/// random moment of its first 300 ms, 12 times each: it removes its probe
/// directory and exits 130 (or, for a signal before `main` runs, dies of
/// it with nothing created). SIGHUP used to kill it on the spot and leave
/// the directory with its lock and WAL file (19 of 20 runs).
#[test]
fn check_interrupted_by_any_stop_signal_removes_its_files() {
    let seed = seed();
    let mut rng = Rng(seed);
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let (mut left, mut interrupted, mut before_main) = (Vec::new(), 0, 0);
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        for i in 0..12 {
            let delay = Duration::from_millis(rng.below(300));
            let mut child = Command::new(BIN)
                .args([
                    "check",
                    dir.path().to_str().unwrap(),
                    "--duration",
                    "2s",
                    "--read-file-size",
                    "1MiB",
                    "--free-space-reserve",
                    "0B",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(delay);
            // SAFETY: kill(2) on our own child, which has not been reaped.
            assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
            let status = child.wait().unwrap();
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(130), _) => interrupted += 1,
                (_, Some(s)) if s == sig => before_main += 1,
                _ => panic!("signal {sig} at {delay:?}: {status:?}"),
            }
            let entries = dir_entries(dir.path());
            if !entries.is_empty() {
                left.push(format!(
                    "signal {sig}, run {i}, at {delay:?}, {status:?}: {entries:?}"
                ));
                std::fs::remove_dir_all(dir.path().join("pg-storage-exporter-check")).unwrap();
            }
        }
    }
    println!(
        "36 interrupted checks (seed {seed}) in {:.1} s: {interrupted} exited 130, \
         {before_main} died of the signal before main, {} left files",
        t0.elapsed().as_secs_f64(),
        left.len()
    );
    assert!(
        left.is_empty(),
        "files left (seed {seed}):\n{}",
        left.join("\n")
    );
}
