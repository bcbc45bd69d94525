//! What the kernel side is told of a cluster, read from /proc and the
//! cluster's directories: the postmaster and the processes it has already
//! forked (the kernel follows later forks itself) and the directories that
//! tell WAL from data. Also the host checks the collector needs.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why the collector is off. Each is one value of the `reason` label.
/// `NotBuilt` is made only without the `bpf` feature, `Load` only with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Off {
    /// Built without the `bpf` cargo feature.
    #[cfg_attr(feature = "bpf", allow(dead_code))]
    NotBuilt,
    /// Neither root nor CAP_BPF + CAP_PERFMON (nor CAP_SYS_ADMIN).
    Permission,
    /// Not in the host's PID namespace: the kernel names processes by
    /// their host pids, which a namespaced exporter cannot see.
    PidNamespace,
    /// No tracefs at /sys/kernel/tracing or /sys/kernel/debug/tracing:
    /// the syscall tracepoints' ids are read there.
    Tracefs,
    /// No kernel BTF at /sys/kernel/btf/vmlinux (kernel ≥ 5.8 with
    /// CONFIG_DEBUG_INFO_BTF): the field offsets are relocated with it.
    Btf,
    /// The kernel refused a map or a program, or an attach failed.
    #[cfg_attr(not(feature = "bpf"), allow(dead_code))]
    Load,
}

impl Off {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Off::NotBuilt => "not_built",
            Off::Permission => "permission",
            Off::PidNamespace => "pid_namespace",
            Off::Tracefs => "tracefs",
            Off::Btf => "btf",
            Off::Load => "load_failed",
        }
    }
}

/// The checks whose failure has a clearer reason than the kernel's EPERM
/// or a missing file deep in the loader.
pub(crate) fn preflight() -> Result<(), (Off, String)> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let caps = effective_caps(&status);
    if !can_trace(caps) {
        return Err((
            Off::Permission,
            format!("needs root, or CAP_BPF and CAP_PERFMON (effective capabilities {caps:#x})"),
        ));
    }
    if !in_host_pid_namespace() {
        return Err((
            Off::PidNamespace,
            "not in the host's PID namespace (Kubernetes: hostPID: true; Docker: --pid=host)"
                .to_string(),
        ));
    }
    if !tracefs_present() {
        return Err((
            Off::Tracefs,
            "no tracefs at /sys/kernel/tracing or /sys/kernel/debug/tracing \
             (mount -t tracefs tracefs /sys/kernel/tracing)"
                .to_string(),
        ));
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err((
            Off::Btf,
            "no /sys/kernel/btf/vmlinux (a kernel >= 5.8 with CONFIG_DEBUG_INFO_BTF)".to_string(),
        ));
    }
    Ok(())
}

/// CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
/// The initial PID namespace's inode number (PROC_PID_INIT_INO).
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// The effective capability mask from `/proc/self/status` text.
pub(crate) fn effective_caps(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

/// Loading tracing programs needs CAP_BPF and CAP_PERFMON (kernel ≥ 5.8),
/// or CAP_SYS_ADMIN, which covers both.
pub(crate) fn can_trace(caps: u64) -> bool {
    let has = |c: u32| caps & (1u64 << c) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// The kernel program sees host pids; the pids this process reads from
/// /proc are those of its own namespace, the same only in the host's.
pub(crate) fn in_host_pid_namespace() -> bool {
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() == INIT_PID_NS_INO)
}

pub(crate) fn tracefs_present() -> bool {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|d| Path::new(d).join("events/syscalls").is_dir())
}

/// A device number as the kernel's `s_dev` holds it (MAJOR << 20 | MINOR),
/// from a `st_dev`.
pub(crate) fn kernel_dev(st_dev: u64) -> u64 {
    (u64::from(rustix::fs::major(st_dev)) << 20) | u64::from(rustix::fs::minor(st_dev))
}

/// (kernel device, inode) of a path, following symlinks (pg_wal may be
/// one, as `initdb --waldir` makes it).
pub(crate) fn dir_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (kernel_dev(m.dev()), m.ino()))
}

/// The directories of a cluster that decide a sync's kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dirs {
    pub(crate) wal: (u64, u64),
    pub(crate) data_dev: u64,
    pub(crate) global: u64,
    pub(crate) control: u64,
    /// `base` and each tablespace's version directory (`PG_<major>_<cat>`):
    /// the grandparents of relation files.
    pub(crate) db_parents: BTreeSet<(u64, u64)>,
}

/// Reads the directories of the cluster at `data`. `None` when the data
/// directory is not on this host (or not readable).
pub(crate) fn dirs(data: &Path) -> Option<Dirs> {
    let (data_dev, _) = dir_id(data)?;
    let wal = dir_id(&data.join("pg_wal"))?;
    let (_, global) = dir_id(&data.join("global"))?;
    let (_, control) = dir_id(&data.join("global/pg_control"))?;
    let mut db_parents = BTreeSet::new();
    db_parents.insert(dir_id(&data.join("base"))?);
    // Each tablespace is a symlink to its location, which holds one
    // version directory per major version that used it.
    if let Ok(rd) = std::fs::read_dir(data.join("pg_tblspc")) {
        for ts in rd.flatten() {
            if let Ok(vd) = std::fs::read_dir(ts.path()) {
                for v in vd.flatten() {
                    if v.file_name().to_string_lossy().starts_with("PG_")
                        && let Some(id) = dir_id(&v.path())
                    {
                        db_parents.insert(id);
                    }
                }
            }
        }
    }
    Some(Dirs {
        wal,
        data_dev,
        global,
        control,
        db_parents,
    })
}

/// What identifies one writing of a file: (device, inode, size, mtime
/// in nanoseconds). PostgreSQL writes `postmaster.pid` anew at each start
/// (and adds its status lines while starting), so an unchanged stamp is an
/// unchanged postmaster.
pub(crate) type Stamp = (u64, u64, u64, i128);

pub(crate) fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.size(),
        i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    ))
}

/// Whether process `pid` still runs in the directory `dir` ((kernel device,
/// inode), from [`dir_id`]): the check of [`postmaster`] alone, for a pid
/// read before.
pub(crate) fn runs_in(pid: u32, dir: (u64, u64)) -> bool {
    dir_id(&PathBuf::from(format!("/proc/{pid}/cwd"))) == Some(dir)
}

/// A traced cluster's state: (name, traced or why not, per kind the
/// histogram's words once it was traced).
pub(crate) type Reading = (String, Result<(), &'static str>, Option<[Vec<u64>; 3]>);

/// Why a cluster's processes cannot be found (a bounded label).
pub(crate) type Untraced = &'static str;

/// The postmaster of the cluster at `data`: the first line of
/// `postmaster.pid`, if that process runs in this directory (its working
/// directory is the data directory): a stale file after a crash, or a
/// cluster whose DSN points at another host while a directory of the same
/// path exists here, names no process of this cluster.
pub(crate) fn postmaster(data: &Path) -> Result<u32, Untraced> {
    let text = match std::fs::read_to_string(data.join("postmaster.pid")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(if data.is_dir() {
                "not_running"
            } else {
                "not_local"
            });
        }
        Err(_) => return Err("not_local"),
    };
    let pid: u32 = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or("not_running")?;
    let cwd = dir_id(&PathBuf::from(format!("/proc/{pid}/cwd")));
    match (cwd, dir_id(data)) {
        (Some(a), Some(b)) if a == b => Ok(pid),
        _ => Err("not_running"),
    }
}

/// `pid` and every process descending from it, from `/proc/*/stat`.
pub(crate) fn descendants(pid: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(pp) = std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|s| parent_pid(&s))
            {
                children.entry(pp).or_default().push(p);
            }
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        if let Some(c) = children.get(&out[i]) {
            out.extend(c);
        }
        i += 1;
    }
    out
}

/// The ppid field of a `/proc/<pid>/stat` line: after the command name,
/// which is in parentheses and may itself hold spaces and parentheses.
fn parent_pid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_and_stat_lines() {
        let root = "Name:\tx\nCapEff:\t000001ffffffffff\n";
        assert!(can_trace(effective_caps(root)));
        // Docker's default set: no CAP_SYS_ADMIN, CAP_BPF or CAP_PERFMON.
        assert!(!can_trace(effective_caps("CapEff:\t00000000a80425fb\n")));
        assert!(can_trace((1 << 38) | (1 << 39)));
        assert!(!can_trace(1 << 39));
        assert_eq!(parent_pid("42 (postgres: a) b) S 7 42 42 0 -1"), Some(7));
        assert_eq!(kernel_dev(rustix::fs::makedev(253, 1)), (253 << 20) | 1);
    }
}
