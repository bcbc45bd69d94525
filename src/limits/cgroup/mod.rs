//! cgroup IO limits and counters, v1 (`blkio.throttle.*`) and v2 (`io.max`,
//! `io.stat`, `io.pressure`), read from a configurable root so tests can use
//! fixture trees.
//!
//! Limits are hierarchical in both versions: an IO is throttled by every
//! cgroup on the path from its own up to the root, so the limit in effect
//! for a device is the tightest one along that path. Hosts come in three
//! layouts: pure v2 (`<root>/cgroup.controllers`), v1 (`<root>/blkio/`), and
//! hybrid (v1 controllers plus a v2 tree at `<root>/unified` that may lack the
//! io controller); a process's limits are read from the v2 tree when it has
//! the io controller, otherwise from v1 blkio.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Limits for one device; `None` is unlimited (`max`, or absent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub read_iops: Option<u64>,
    pub write_iops: Option<u64>,
    pub read_bps: Option<u64>,
    pub write_bps: Option<u64>,
}

impl Limits {
    /// The tighter of two limits, field by field.
    pub fn tighten(self, o: Limits) -> Limits {
        fn min(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, None) => x,
                (None, y) => y,
            }
        }
        Limits {
            read_iops: min(self.read_iops, o.read_iops),
            write_iops: min(self.write_iops, o.write_iops),
            read_bps: min(self.read_bps, o.read_bps),
            write_bps: min(self.write_bps, o.write_bps),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// (resource label, value) of every limit that is set.
    pub fn resources(&self) -> Vec<(&'static str, u64)> {
        [
            ("read_iops", self.read_iops),
            ("write_iops", self.write_iops),
            ("read_bytes_per_second", self.read_bps),
            ("write_bytes_per_second", self.write_bps),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }
}

/// Cumulative IO done by a cgroup on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub read_ios: u64,
    pub write_ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// `io.max`: `MAJ:MIN rbps=N wbps=N riops=N wiops=N`, `max` = unlimited.
pub fn parse_io_max(text: &str) -> BTreeMap<String, Limits> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(dev) = it.next() else { continue };
        let mut l = Limits::default();
        for kv in it {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let v = if v == "max" { None } else { v.parse().ok() };
            match k {
                "rbps" => l.read_bps = v,
                "wbps" => l.write_bps = v,
                "riops" => l.read_iops = v,
                "wiops" => l.write_iops = v,
                _ => {}
            }
        }
        out.insert(dev.to_string(), l);
    }
    out
}

/// `io.stat`: `MAJ:MIN rbytes=N wbytes=N rios=N wios=N dbytes=N dios=N`.
pub fn parse_io_stat(text: &str) -> BTreeMap<String, Counters> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(dev) = it.next() else { continue };
        let mut c = Counters::default();
        for kv in it {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let v: u64 = v.parse().unwrap_or(0);
            match k {
                "rbytes" => c.read_bytes = v,
                "wbytes" => c.write_bytes = v,
                "rios" => c.read_ios = v,
                "wios" => c.write_ios = v,
                _ => {}
            }
        }
        out.insert(dev.to_string(), c);
    }
    out
}

/// A v1 throttle file: `MAJ:MIN N` per line.
pub fn parse_v1_throttle(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.parse().ok()?))
        })
        .collect()
}

/// `blkio.throttle.io_serviced` / `io_service_bytes`: `MAJ:MIN Read N`,
/// `MAJ:MIN Write N`, ... (and a `Total` line). Returns (read, write).
pub fn parse_v1_serviced(text: &str) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for l in text.lines() {
        let mut it = l.split_whitespace();
        let (Some(dev), Some(op), Some(v)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let Ok(v) = v.parse::<u64>() else { continue };
        let e = out.entry(dev.to_string()).or_default();
        match op {
            "Read" => e.0 = v,
            "Write" => e.1 = v,
            _ => {}
        }
    }
    out
}

/// Total stall time in seconds from `io.pressure` (`some`, `full`).
pub fn parse_pressure(text: &str) -> BTreeMap<&'static str, f64> {
    let mut out = BTreeMap::new();
    for l in text.lines() {
        let kind = if l.starts_with("some") {
            "some"
        } else if l.starts_with("full") {
            "full"
        } else {
            continue;
        };
        if let Some(t) = l
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("total="))
            .and_then(|v| v.parse::<f64>().ok())
        {
            out.insert(kind, t / 1e6);
        }
    }
    out
}

/// A process's cgroup paths from `/proc/<pid>/cgroup`: the v2 path (`0::`)
/// and the v1 blkio path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcCgroups {
    pub v2: Option<String>,
    pub blkio: Option<String>,
}

pub fn parse_proc_cgroup(text: &str) -> ProcCgroups {
    let mut out = ProcCgroups::default();
    for l in text.lines() {
        let mut parts = l.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            out.v2 = Some(path.to_string());
        } else if ctrls.split(',').any(|c| c == "blkio") {
            out.blkio = Some(path.to_string());
        }
    }
    out
}

/// Which reader a cgroup is read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }
}

/// A cgroup directory to read, with the directories above it up to the
/// hierarchy's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub version: Version,
    /// The cgroup as the kernel names it ("/system.slice/postgresql.service").
    pub path: String,
    /// Its directory, then each parent up to and including the root.
    pub dirs: Vec<PathBuf>,
}

/// Finds where a process's IO limits live under `root` (normally
/// /sys/fs/cgroup): the v2 tree if it has the io controller, else v1 blkio.
pub fn locate(root: &Path, cg: &ProcCgroups) -> Option<Located> {
    let v2_root = if root.join("cgroup.controllers").exists() {
        Some(root.to_path_buf())
    } else if root.join("unified/cgroup.controllers").exists() {
        Some(root.join("unified"))
    } else {
        None
    };
    if let (Some(v2r), Some(p)) = (&v2_root, &cg.v2) {
        let has_io = std::fs::read_to_string(v2r.join("cgroup.controllers"))
            .map(|s| s.split_whitespace().any(|c| c == "io"))
            .unwrap_or(false);
        let dirs = chain(v2r, p);
        if has_io && !dirs.is_empty() {
            return Some(Located {
                version: Version::V2,
                path: p.clone(),
                dirs,
            });
        }
    }
    let blkio = root.join("blkio");
    if let Some(p) = &cg.blkio
        && blkio.is_dir()
    {
        let dirs = chain(&blkio, p);
        if !dirs.is_empty() {
            return Some(Located {
                version: Version::V1,
                path: p.clone(),
                dirs,
            });
        }
    }
    None
}

/// `root/a/b` → [root/a/b, root/a, root], skipping intermediate levels that
/// do not exist (a container sees only its own part of the tree). The
/// cgroup itself must exist: reading a parent's counters instead would mix
/// in other processes' IO under the wrong name.
fn chain(root: &Path, path: &str) -> Vec<PathBuf> {
    if !root.join(path.trim_start_matches('/')).is_dir() {
        return Vec::new();
    }
    let mut dirs = Vec::new();
    let mut rel = PathBuf::from(path.trim_start_matches('/'));
    loop {
        let d = root.join(&rel);
        if d.is_dir() {
            dirs.push(d);
        }
        if !rel.pop() {
            break;
        }
    }
    if dirs.last().map(|d| d.as_path()) != Some(root) && root.is_dir() {
        dirs.push(root.to_path_buf());
    }
    dirs
}

/// The tightest limits on `dev` (MAJ:MIN) along the located path.
pub fn effective_limits(loc: &Located, dev: &str) -> Limits {
    let mut l = Limits::default();
    for d in &loc.dirs {
        let here = match loc.version {
            Version::V2 => std::fs::read_to_string(d.join("io.max"))
                .ok()
                .and_then(|t| parse_io_max(&t).get(dev).copied())
                .unwrap_or_default(),
            Version::V1 => {
                let read = |f: &str| {
                    std::fs::read_to_string(d.join(f))
                        .ok()
                        .and_then(|t| parse_v1_throttle(&t).get(dev).copied())
                        // v1 writes 0 to mean "no limit".
                        .filter(|&v| v > 0)
                };
                Limits {
                    read_iops: read("blkio.throttle.read_iops_device"),
                    write_iops: read("blkio.throttle.write_iops_device"),
                    read_bps: read("blkio.throttle.read_bps_device"),
                    write_bps: read("blkio.throttle.write_bps_device"),
                }
            }
        };
        l = l.tighten(here);
    }
    l
}

/// The cgroup's own cumulative IO on `dev`.
pub fn counters(loc: &Located, dev: &str) -> Option<Counters> {
    let d = loc.dirs.first()?;
    match loc.version {
        // No line for the disk: no figure (not a zero rate).
        Version::V2 => std::fs::read_to_string(d.join("io.stat"))
            .ok()
            .and_then(|t| parse_io_stat(&t).get(dev).copied()),
        Version::V1 => {
            let ios = std::fs::read_to_string(d.join("blkio.throttle.io_serviced")).ok()?;
            let bytes = std::fs::read_to_string(d.join("blkio.throttle.io_service_bytes")).ok()?;
            let (ri, wi) = parse_v1_serviced(&ios)
                .get(dev)
                .copied()
                .unwrap_or_default();
            let (rb, wb) = parse_v1_serviced(&bytes)
                .get(dev)
                .copied()
                .unwrap_or_default();
            Some(Counters {
                read_ios: ri,
                write_ios: wi,
                read_bytes: rb,
                write_bytes: wb,
            })
        }
    }
}

/// PSI stall totals of the cgroup (v2 only).
pub fn pressure(loc: &Located) -> BTreeMap<&'static str, f64> {
    match (loc.version, loc.dirs.first()) {
        (Version::V2, Some(d)) => std::fs::read_to_string(d.join("io.pressure"))
            .map(|t| parse_pressure(&t))
            .unwrap_or_default(),
        _ => BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests;
