//! Connections held open against the exporter's HTTP port, as anyone who
//! can reach it could hold them: idle ones that never send a byte, and ones
//! that send part of a request head (or of a TLS handshake) and nothing
//! more. Whatever the exporter closes is opened again within a few tens of
//! milliseconds. Plus what a test needs around them: the exporter started
//! under an open-file limit, its descriptors counted, the test's own limit
//! raised.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::BIN;

/// Connections each holder thread keeps.
const PER_THREAD: usize = 250;

pub struct Holders {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    connects: Arc<AtomicU64>,
    held: Arc<Vec<AtomicUsize>>,
}

impl Holders {
    /// Holds `idle` connections that send nothing and `partial` that send
    /// `head` and nothing more, to `addr`.
    pub fn start(addr: SocketAddr, idle: usize, partial: usize, head: &'static [u8]) -> Holders {
        let mut groups = Vec::new();
        for (total, head) in [(idle, None), (partial, Some(head))] {
            let mut left = total;
            while left > 0 {
                let n = left.min(PER_THREAD);
                groups.push((n, head));
                left -= n;
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let connects = Arc::new(AtomicU64::new(0));
        let held: Arc<Vec<AtomicUsize>> =
            Arc::new(groups.iter().map(|_| AtomicUsize::new(0)).collect());
        let threads = groups
            .into_iter()
            .enumerate()
            .map(|(i, (n, head))| {
                let (stop, connects, held) = (stop.clone(), connects.clone(), held.clone());
                std::thread::spawn(move || hold(addr, n, head, &stop, &connects, &held[i]))
            })
            .collect();
        Holders {
            stop,
            threads,
            connects,
            held,
        }
    }

    /// Connections opened so far, reopened ones included.
    pub fn connects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    /// Connections open at each thread's last pass.
    pub fn held(&self) -> usize {
        self.held.iter().map(|h| h.load(Ordering::Relaxed)).sum()
    }

    /// Stops and closes everything; returns the connections opened.
    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        self.connects.load(Ordering::Relaxed)
    }
}

fn hold(
    addr: SocketAddr,
    n: usize,
    head: Option<&[u8]>,
    stop: &AtomicBool,
    connects: &AtomicU64,
    held: &AtomicUsize,
) {
    // Below the exporter's runtime (nice 10): an attacker elsewhere spends
    // its own CPU on its loop, not the exporter host's. On Linux the nice
    // value is per thread.
    let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19);
    let mut socks: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    while !stop.load(Ordering::Relaxed) {
        let mut open = 0;
        for slot in socks.iter_mut() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if slot.as_ref().is_some_and(closed) {
                *slot = None;
            }
            if slot.is_none() {
                *slot = open_one(addr, head);
                if slot.is_some() {
                    connects.fetch_add(1, Ordering::Relaxed);
                }
            }
            if slot.is_some() {
                open += 1;
            }
        }
        held.store(open, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn open_one(addr: SocketAddr, head: Option<&[u8]>) -> Option<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_nonblocking(true).ok()?;
    if let Some(h) = head {
        // A few dozen bytes into an empty send buffer: never short.
        (&s).write_all(h).ok()?;
    }
    Some(s)
}

/// Whether the server closed (or reset) the connection; drains whatever it
/// sent.
fn closed(s: &TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match (&*s).read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// Raises this process's soft open-file limit to its hard limit (the
/// holders need one descriptor each); returns the soft limit now.
pub fn raise_own_nofile() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let l = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: l.maximum,
            maximum: l.maximum,
        },
    );
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The exporter's binary under `prlimit --nofile=SOFT:HARD` (prlimit sets
/// the limits and execs it: the child's pid is the exporter's); its own
/// arguments to follow.
pub fn under_prlimit(soft: u64, hard: u64) -> Command {
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--nofile={soft}:{hard}"))
        .arg("--")
        .arg(BIN);
    cmd
}

/// Open descriptors of process `pid` (entries of /proc/PID/fd).
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// CPU time of process `pid` so far, user and system (/proc/PID/stat).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command name, which may contain spaces, in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of stat(5), 12 and 13 here.
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // USER_HZ is 100 on every Linux architecture this runs on.
    ticks / 100.0
}

/// The soft and hard open-file limits of process `pid`, from
/// /proc/PID/limits.
pub fn nofile_of(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let mut v = line["Max open files".len()..].split_whitespace();
    (v.next().unwrap().to_string(), v.next().unwrap().to_string())
}

/// Samples `open_fds(pid)` every 20 ms until dropped; the largest count.
pub struct FdWatch {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl FdWatch {
    pub fn start(pid: u32) -> FdWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, max) = (stop.clone(), max.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    max.fetch_max(open_fds(pid), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        FdWatch {
            stop,
            max,
            thread: Some(thread),
        }
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }
}

impl Drop for FdWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
