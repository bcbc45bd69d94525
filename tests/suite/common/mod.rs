//! Helpers for integration tests: run the real binary, read its log for the
//! bound address, scrape it over real HTTP; and in submodules throwaway
//! PostgreSQL servers ([`pg`]), such a server with the exporter watching it
//! ([`stack`]), loop devices and blkio cgroups ([`loopdev`]), the operator
//! kit's files ([`kit`]), connections held open against the HTTP port
//! ([`flood`]).
//!
//! The suite's modules `use crate::common` and take what they need.

pub mod flood;
pub mod kit;
pub mod loopdev;
pub mod pg;
pub mod stack;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_pg-storage-exporter");

pub struct Exporter {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<String>>,
}

/// The exporter's binary (`BIN`, arguments to follow) in a mount namespace
/// of its own where an empty tmpfs covers /sys/fs/cgroup: a cgroup's
/// limits still apply to its IO but it cannot read them, as a cloud
/// volume's cap applies to a guest that has no file to read it from. The
/// private namespace keeps the tmpfs from showing on the host; `exec`
/// twice, so the child's pid is the exporter itself. Needs root and
/// `unshare` (util-linux).
pub fn hidden_cgroups_command() -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t tmpfs none /sys/fs/cgroup && exec \"$0\" \"$@\"",
        BIN,
    ]);
    cmd
}

impl Exporter {
    /// Starts the exporter on a free loopback port with extra args and waits
    /// until it logs where it listens.
    pub fn start(args: &[&str]) -> Exporter {
        Self::start_env(args, &[])
    }

    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Exporter {
        let mut all = vec!["--web.listen-address", "127.0.0.1:0"];
        all.extend_from_slice(args);
        Self::start_raw(&all, env)
    }

    /// Starts the exporter with exactly these args.
    pub fn start_raw(args: &[&str], env: &[(&str, &str)]) -> Exporter {
        Self::start_with(args, env, None)
    }

    /// Starts the exporter inside a cgroup (the `cgroup.procs` file given),
    /// joined before exec so even its first IO is in it.
    pub fn start_with(
        args: &[&str],
        env: &[(&str, &str)],
        cgroup_procs: Option<&Path>,
    ) -> Exporter {
        let mut cmd = Command::new(BIN);
        if let Some(procs) = cgroup_procs {
            join_cgroup_before_exec(&mut cmd, procs);
        }
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self::spawn(cmd)
    }

    /// Starts the exporter with exactly these args inside the cgroup (the
    /// `cgroup.procs` file given, joined before exec) and in a mount
    /// namespace of its own where an empty tmpfs covers /sys/fs/cgroup: the
    /// group's limits apply to its IO but it cannot read them, as a cloud
    /// volume's cap applies to a guest that has no file to read it from.
    /// Needs root and `unshare` (util-linux). The private namespace keeps
    /// the tmpfs from showing on the host.
    pub fn start_hidden_in(args: &[&str], cgroup_procs: &Path) -> Exporter {
        let mut cmd = hidden_cgroups_command();
        cmd.args(args);
        join_cgroup_before_exec(&mut cmd, cgroup_procs);
        Self::spawn(cmd)
    }

    /// Starts a prepared command (BIN with args, uid, ...), reading its log.
    pub fn spawn(mut cmd: Command) -> Exporter {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn exporter");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("address=").nth(1) {
                        let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                        let _ = tx.send(addr);
                    }
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let addr = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(a) => a.parse().expect("address"),
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "exporter did not log its address; log:\n{}",
                    log.lock().unwrap()
                );
            }
        };
        Exporter { child, addr, log }
    }

    pub fn get(&self, path: &str) -> (u16, String, String) {
        http_get(self.addr, path, None)
    }

    pub fn metrics(&self) -> String {
        let (status, _, body) = self.get("/metrics");
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Scrapes until `pred` holds or the deadline passes.
    pub fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let m = self.metrics();
            if pred(&m) {
                return m;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}; last scrape:\n{m}\nlog:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the log contains `needle`: a metric can be scraped a
    /// moment before the log line written after it reaches our reader.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            if Instant::now() > deadline {
                panic!("log never contained {needle:?}:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        let r = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(r, 0);
    }

    /// Waits for exit; panics after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "exporter did not exit within {timeout:?}; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A file the exporter did not create (a victim a followed symlink would
/// lead to, or a file planted at a name the exporter uses), with everything
/// a write, truncation, chmod, rename or removal would change.
pub struct Victim {
    pub path: PathBuf,
    content: Vec<u8>,
    mtime: std::time::SystemTime,
    ctime: (i64, i64),
    ino: u64,
}

impl Victim {
    /// A victim outside the probe directory with recognisable content.
    pub fn precious(path: PathBuf) -> Victim {
        Victim::new(path, b"precious: not a probe file\n".repeat(400))
    }

    /// `len` random bytes (from the kernel's generator), so that nothing
    /// can pass for the exporter's own content by chance.
    pub fn random(path: PathBuf, len: usize) -> Victim {
        let mut content = vec![0u8; len];
        std::fs::File::open("/dev/urandom")
            .unwrap()
            .read_exact(&mut content)
            .unwrap();
        Victim::new(path, content)
    }

    pub fn new(path: PathBuf, content: Vec<u8>) -> Victim {
        use std::os::unix::fs::MetadataExt;
        std::fs::write(&path, &content).unwrap();
        // An old mtime, so a write could not go unseen within the clock's
        // resolution.
        let old = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let m = std::fs::symlink_metadata(&path).unwrap();
        Victim {
            mtime: m.modified().unwrap(),
            ctime: (m.ctime(), m.ctime_nsec()),
            ino: m.ino(),
            path,
            content,
        }
    }

    pub fn assert_untouched(&self, when: &str) {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(&self.path)
            .unwrap_or_else(|e| panic!("{when}: {} is gone: {e}", self.path.display()));
        let name = self.path.display();
        assert!(m.file_type().is_file(), "{when}: {name} still a file");
        assert_eq!(m.ino(), self.ino, "{when}: {name} is the same inode");
        assert_eq!(m.modified().unwrap(), self.mtime, "{when}: {name} mtime");
        assert_eq!(
            (m.ctime(), m.ctime_nsec()),
            self.ctime,
            "{when}: {name} ctime"
        );
        assert!(
            std::fs::read(&self.path).unwrap() == self.content,
            "{when}: {name} content"
        );
    }
}

/// Minimal HTTP/1.0 GET: (status, content-type, body).
pub fn http_get(addr: SocketAddr, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: test\r\n{accept}\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("http response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    (status, ctype, body.to_string())
}

/// HTTP/1.0 GET with extra request headers, the body left as bytes:
/// (status, response headers with lower-case names, body).
pub fn http_get_bytes(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("GET {path} HTTP/1.0\r\nHost: test\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("http response");
    let head = String::from_utf8_lossy(&raw[..end]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect();
    (status, headers, raw[end + 4..].to_vec())
}

/// The value of a response header from [`http_get_bytes`].
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Runs `promtool check metrics` on a body; panics on any complaint.
pub fn promtool_check_metrics(body: &str) {
    let out = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(body.as_bytes())?;
            c.wait_with_output()
        })
        .expect(
            "promtool not found: install the Debian package `prometheus` (./scripts/test does)",
        );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool: {text}\n{body}");
    assert!(text.trim().is_empty(), "promtool warnings: {text}");
}

/// Value of the first sample whose name-and-labels prefix matches, e.g.
/// `pgstorage_probe_seconds_count{volume="t",op="commit"}`.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Samples of one metric name whose labels contain every `k="v"` in `labels`.
pub fn samples_with(metrics: &str, name: &str, labels: &[&str]) -> Vec<(String, f64)> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let n = series.split('{').next()?;
            if n != name || !labels.iter().all(|lab| series.contains(lab)) {
                return None;
            }
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Probes of `op` recorded on `volume`, both phases (busy and after_idle).
pub fn count(metrics: &str, volume: &str, op: &str) -> f64 {
    ["busy", "after_idle"]
        .iter()
        .filter_map(|phase| {
            sample(
                metrics,
                &format!(
                    "pgstorage_probe_seconds_count{{volume=\"{volume}\",op=\"{op}\",phase=\"{phase}\"}}"
                ),
            )
        })
        .sum()
}

/// MAJ:MIN of the filesystem under `p` (`0:N` for tmpfs and others
/// without a device).
pub fn majmin_of(p: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(p).unwrap().dev();
    format!("{}:{}", libc::major(dev), libc::minor(dev))
}

/// MAJ:MIN of the filesystem under `p`, and the sysfs directory of its
/// whole disk, the way the exporter resolves it (a partition maps to its
/// parent disk).
pub fn fs_and_disk_dir(p: &Path) -> (String, PathBuf) {
    let mm = majmin_of(p);
    let dir = std::fs::canonicalize(format!("/sys/dev/block/{mm}")).unwrap();
    let disk = if dir.join("partition").exists() {
        dir.parent().unwrap().to_path_buf()
    } else {
        dir
    };
    (mm, disk)
}

/// MAJ:MIN of the whole disk under `p` (see [`fs_and_disk_dir`]).
pub fn disk_of(p: &Path) -> String {
    let (_, disk) = fs_and_disk_dir(p);
    std::fs::read_to_string(disk.join("dev"))
        .unwrap()
        .trim()
        .to_string()
}

pub fn dir_entries(p: &Path) -> Vec<String> {
    match std::fs::read_dir(p) {
        Ok(rd) => {
            let mut v: Vec<String> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        }
        Err(_) => Vec::new(),
    }
}

/// Probe args for a fast, small volume in `dir`.
pub fn fast_probe_args(name_path: &str) -> Vec<String> {
    vec![
        "--probe.path".into(),
        name_path.into(),
        "--probe.interval".into(),
        "100ms".into(),
        "--probe.read-file-size".into(),
        "4MiB".into(),
        "--probe.free-space-reserve".into(),
        "0".into(),
    ]
}

/// Threads of process `pid` (`Threads:` of /proc/PID/status).
pub fn threads(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Runs a command that must succeed (mount, umount, chmod, ...).
pub fn sh(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes the child write itself into the cgroup `procs` file (a v1 or v2
/// `cgroup.procs`) between fork and exec, so that even its first IO is
/// accounted and throttled there.
pub fn join_cgroup_before_exec(cmd: &mut Command, procs: &Path) {
    use std::os::unix::process::CommandExt;
    let path = std::ffi::CString::new(procs.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: between fork and exec only async-signal-safe calls are made
    // (open, write, close), on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // "0" is the writing process itself.
            let r = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Parts of the suite that a machine may be unable to run, and that the
/// test command can be told to leave out (`scripts/test --skip-root-tests`
/// and so on, which set `PGSE_SKIP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Root and the kernel's facilities: loop devices, mounts, cgroup v1
    /// blkio throttles, runuser, a tmpfs at /dev/shm.
    Root,
    /// PostgreSQL 14 to 18 servers (scripts/test installs them).
    Postgres,
    /// Other programs scripts/test installs: Chromium, the Kubernetes
    /// validators, fio.
    Tools,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Part::Root => "root",
            Part::Postgres => "postgres",
            Part::Tools => "tools",
        }
    }
}

/// A test that cannot run here: a failure that says why, unless the part
/// is named in `PGSE_SKIP` (comma-separated part names). Then the test is
/// skipped: it says so on stderr and appends a line to the file
/// `PGSE_SKIPPED_LOG` names, which the test command sums up at the end, so
/// that a skip is never counted as a pass unnoticed.
/// [`cannot_run`] for the test running on this thread: libtest names each
/// test's thread after the test, for helpers deep in the harness that are
/// not told which test called them.
pub fn cannot_run_current(part: Part, why: &str) {
    let name = std::thread::current().name().map(str::to_string);
    cannot_run(part, name.as_deref().unwrap_or("a test"), why);
}

pub fn cannot_run(part: Part, test: &str, why: &str) {
    let allowed = std::env::var("PGSE_SKIP").is_ok_and(|v| {
        v.split(',')
            .any(|p| p.trim().eq_ignore_ascii_case(part.name()))
    });
    assert!(
        allowed,
        "{test} cannot run here: {why} (scripts/test installs what the suite needs; \
         PGSE_SKIP={} leaves these tests out, and the test command then lists them as skipped)",
        part.name()
    );
    eprintln!("SKIPPED {test} ({}): {why}", part.name());
    if let Some(log) = std::env::var_os("PGSE_SKIPPED_LOG") {
        // One short line in append mode: concurrent test processes do not
        // interleave within it.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(f, "{}\t{test}\t{why}", part.name());
        }
    }
}
