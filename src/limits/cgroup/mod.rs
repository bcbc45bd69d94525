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
use std::io;
use std::path::{Path, PathBuf};

use procfs::FromBufRead;

use super::error::{Cause, Kind, ReadError, read_optional};
use crate::types::Resource;

/// Limits for one device; `None` is unlimited (`max`, or absent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub(crate) read_iops: Option<u64>,
    pub(crate) write_iops: Option<u64>,
    pub(crate) read_bps: Option<u64>,
    pub(crate) write_bps: Option<u64>,
}

impl Limits {
    /// The tighter of two limits, field by field.
    pub(crate) fn tighten(self, o: Limits) -> Limits {
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

    /// (resource, value) of every limit that is set.
    pub(crate) fn resources(&self) -> Vec<(Resource, u64)> {
        [
            (Resource::ReadIops, self.read_iops),
            (Resource::WriteIops, self.write_iops),
            (Resource::ReadBytesPerSecond, self.read_bps),
            (Resource::WriteBytesPerSecond, self.write_bps),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }
}

/// Cumulative IO done by a cgroup on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub(crate) read_ios: u64,
    pub(crate) write_ios: u64,
    pub(crate) read_bytes: u64,
    pub(crate) write_bytes: u64,
}

/// `MAJ:MIN`, as cgroup files name a device.
fn is_majmin(s: &str) -> bool {
    s.split_once(':')
        .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok())
}

fn device<'a>(
    line: &str,
    it: &mut impl Iterator<Item = &'a str>,
) -> Result<Option<&'a str>, String> {
    match it.next() {
        None => Ok(None),
        Some(d) if is_majmin(d) => Ok(Some(d)),
        Some(d) => Err(format!("{d:?} is not a MAJ:MIN device in {line:?}")),
    }
}

/// `io.max`: `MAJ:MIN rbps=N wbps=N riops=N wiops=N`, `max` = unlimited.
/// Keys the kernel may add later are skipped; a known key with a value
/// that is neither `max` nor a number is an error, not "no limit".
pub fn parse_io_max(text: &str) -> Result<BTreeMap<String, Limits>, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(dev) = device(line, &mut it)? else {
            continue;
        };
        let mut l = Limits::default();
        for kv in it {
            let Some((k, v)) = kv.split_once('=') else {
                return Err(format!("{kv:?} is not key=value in {line:?}"));
            };
            let slot = match k {
                "rbps" => &mut l.read_bps,
                "wbps" => &mut l.write_bps,
                "riops" => &mut l.read_iops,
                "wiops" => &mut l.write_iops,
                _ => continue,
            };
            *slot = match v {
                "max" => None,
                n => Some(
                    n.parse()
                        .map_err(|_| format!("{k}={v:?} is neither max nor a number"))?,
                ),
            };
        }
        out.insert(dev.to_string(), l);
    }
    Ok(out)
}

/// `io.stat`: `MAJ:MIN rbytes=N wbytes=N rios=N wios=N dbytes=N dios=N`,
/// plus fields other controllers add (io.cost's `cost.vrate=100.00`,
/// io.latency's), which are skipped.
pub fn parse_io_stat(text: &str) -> Result<BTreeMap<String, Counters>, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(dev) = device(line, &mut it)? else {
            continue;
        };
        let mut c = Counters::default();
        for kv in it {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let slot = match k {
                "rbytes" => &mut c.read_bytes,
                "wbytes" => &mut c.write_bytes,
                "rios" => &mut c.read_ios,
                "wios" => &mut c.write_ios,
                _ => continue,
            };
            *slot = v
                .parse()
                .map_err(|_| format!("{k}={v:?} is not a number in {line:?}"))?;
        }
        out.insert(dev.to_string(), c);
    }
    Ok(out)
}

/// A v1 throttle file: `MAJ:MIN N` per line.
pub fn parse_v1_throttle(text: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(dev) = device(line, &mut it)? else {
            continue;
        };
        let v = it
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no number after the device in {line:?}"))?;
        out.insert(dev.to_string(), v);
    }
    Ok(out)
}

/// `blkio.throttle.io_serviced` / `io_service_bytes`: `MAJ:MIN Read N`,
/// `MAJ:MIN Write N`, ... (and a `Total N` line). Returns (read, write).
pub fn parse_v1_serviced(text: &str) -> Result<BTreeMap<String, (u64, u64)>, String> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [] | ["Total", _] => {}
            [dev, op, v] if is_majmin(dev) => {
                let v: u64 = v
                    .parse()
                    .map_err(|_| format!("{v:?} is not a number in {line:?}"))?;
                let e = out.entry(dev.to_string()).or_default();
                match *op {
                    "Read" => e.0 = v,
                    "Write" => e.1 = v,
                    _ => {}
                }
            }
            _ => return Err(format!("unexpected line {line:?}")),
        }
    }
    Ok(out)
}

/// Total stall time in seconds from `io.pressure` (`some`, `full`).
pub fn parse_pressure(text: &str) -> Result<BTreeMap<&'static str, f64>, String> {
    let mut out = BTreeMap::new();
    for l in text.lines() {
        let kind = if l.starts_with("some ") {
            "some"
        } else if l.starts_with("full ") {
            "full"
        } else {
            continue;
        };
        let t = l
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("total="))
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("no numeric total= in {l:?}"))?;
        out.insert(kind, t / 1e6);
    }
    Ok(out)
}

/// A process's cgroup paths from `/proc/<pid>/cgroup`: the v2 path (`0::`)
/// and the v1 blkio path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcCgroups {
    pub(crate) v2: Option<String>,
    pub(crate) blkio: Option<String>,
}

/// Parsed with procfs's `ProcessCGroups`, which reads the same
/// `hierarchy:controllers:path` lines from any text, so fixture trees work.
pub fn parse_proc_cgroup(text: &str) -> Result<ProcCgroups, String> {
    let groups =
        procfs::ProcessCGroups::from_buf_read(text.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = ProcCgroups::default();
    for g in groups {
        if g.hierarchy == 0 && g.controllers.is_empty() {
            out.v2 = Some(g.pathname);
        } else if g.controllers.iter().any(|c| c == "blkio") {
            out.blkio = Some(g.pathname);
        }
    }
    Ok(out)
}

/// Which reader a cgroup is read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

impl Version {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }
}

/// A cgroup directory to read, with the directories above it up to the
/// hierarchy's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Located {
    pub(crate) version: Version,
    /// The cgroup as the kernel names it ("/system.slice/postgresql.service").
    pub(crate) path: String,
    /// Its directory, then each parent up to and including the root.
    pub(crate) dirs: Vec<PathBuf>,
}

/// The hierarchies found under `cgroup_root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The v2 tree's root, when its root cgroup offers the io controller.
    pub(crate) v2_io: Option<PathBuf>,
    /// The v1 blkio hierarchy.
    pub(crate) blkio: Option<PathBuf>,
}

/// Which hierarchies `root` (normally /sys/fs/cgroup) holds. `Ok(None)` for
/// an empty directory: that is how cgroup reading is turned off. A root
/// that is missing, or holds files but no hierarchy, is an error: the
/// limits are unknown, not absent.
pub(crate) fn detect(root: &Path) -> Result<Option<Layout>, ReadError> {
    let meta = std::fs::metadata(root).map_err(|e| ReadError::io(Kind::CgroupLimits, root, e))?;
    if !meta.is_dir() {
        return Err(ReadError::io(
            Kind::CgroupLimits,
            root,
            io::Error::from_raw_os_error(libc::ENOTDIR),
        ));
    }
    // v2 at the root (pure v2), or under unified/ (systemd's hybrid mode).
    // A missing cgroup.controllers is simply not that layout.
    let mut v2 = None;
    for r in [root.to_path_buf(), root.join("unified")] {
        if let Some(c) = read_optional(Kind::CgroupLimits, &r.join("cgroup.controllers"))? {
            v2 = Some((r, c.split_whitespace().any(|c| c == "io")));
            break;
        }
    }
    let blkio = root.join("blkio");
    let blkio = blkio.is_dir().then_some(blkio);
    if v2.is_none() && blkio.is_none() {
        let mut entries =
            std::fs::read_dir(root).map_err(|e| ReadError::io(Kind::CgroupLimits, root, e))?;
        if entries.next().is_none() {
            return Ok(None);
        }
        return Err(ReadError {
            kind: Kind::CgroupLimits,
            path: root.to_path_buf(),
            cause: Cause::NotCgroup,
        });
    }
    // A v2 tree without io (hybrid hosts leave io to v1 blkio) and no blkio
    // either: this host cannot have cgroup IO limits, which is a fact.
    Ok(Some(Layout {
        v2_io: v2.and_then(|(r, io)| io.then_some(r)),
        blkio,
    }))
}

impl Layout {
    /// Where a process's IO limits live: the v2 tree if it has the io
    /// controller, else v1 blkio. `None` when the process's cgroup is not
    /// in the tree (see [`chain`]).
    pub(crate) fn locate(&self, cg: &ProcCgroups) -> Option<Located> {
        if let (Some(v2r), Some(p)) = (&self.v2_io, &cg.v2) {
            let dirs = chain(v2r, p);
            if !dirs.is_empty() {
                return Some(Located {
                    version: Version::V2,
                    path: p.clone(),
                    dirs,
                });
            }
        }
        if let (Some(blkio), Some(p)) = (&self.blkio, &cg.blkio) {
            let dirs = chain(blkio, p);
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
}

/// [`detect`] then [`Layout::locate`].
pub(crate) fn locate(root: &Path, cg: &ProcCgroups) -> Result<Option<Located>, ReadError> {
    Ok(detect(root)?.and_then(|l| l.locate(cg)))
}

/// `root/a/b` → [root/a/b, root/a, root], skipping intermediate levels that
/// do not exist (a container sees only its own part of the tree). The
/// cgroup itself must exist: reading a parent's counters instead would mix
/// in other processes' IO under the wrong name. It may legitimately be
/// missing: the process moved and its old cgroup was removed between the
/// read of /proc/<pid>/cgroup and this look, or a cgroup namespace names
/// paths relative to a root this mount does not show.
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

/// Reads and parses a cgroup file that may be absent (`Ok(None)`).
fn read_parsed<T>(
    kind: Kind,
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, ReadError> {
    match read_optional(kind, path)? {
        None => Ok(None),
        Some(t) => parse(&t)
            .map(Some)
            .map_err(|what| ReadError::parse(kind, path, what)),
    }
}

/// The tightest limits on `dev` (MAJ:MIN) along the located path. One
/// level that cannot be read makes the whole answer unknown: a looser limit
/// from another level would pass for the one in force.
pub(crate) fn effective_limits(loc: &Located, dev: &str) -> Result<Limits, ReadError> {
    let mut l = Limits::default();
    for d in &loc.dirs {
        let here = match loc.version {
            // The root cgroup has no io.max, nor has a cgroup whose parent
            // does not enable io in cgroup.subtree_control: no limit there.
            Version::V2 => read_parsed(Kind::CgroupLimits, &d.join("io.max"), parse_io_max)?
                .and_then(|m| m.get(dev).copied())
                .unwrap_or_default(),
            Version::V1 => {
                // The throttle files exist only in kernels built with
                // CONFIG_BLK_DEV_THROTTLING: without them nothing throttles.
                let read = |f: &str| -> Result<Option<u64>, ReadError> {
                    Ok(
                        read_parsed(Kind::CgroupLimits, &d.join(f), parse_v1_throttle)?
                            .and_then(|m| m.get(dev).copied())
                            // v1 writes 0 to mean "no limit".
                            .filter(|&v| v > 0),
                    )
                };
                Limits {
                    read_iops: read("blkio.throttle.read_iops_device")?,
                    write_iops: read("blkio.throttle.write_iops_device")?,
                    read_bps: read("blkio.throttle.read_bps_device")?,
                    write_bps: read("blkio.throttle.write_bps_device")?,
                }
            }
        };
        l = l.tighten(here);
    }
    Ok(l)
}

/// The cgroup's own cumulative IO on `dev`; `Ok(None)` when there is no
/// figure (not a zero rate).
pub(crate) fn counters(loc: &Located, dev: &str) -> Result<Option<Counters>, ReadError> {
    let Some(d) = loc.dirs.first() else {
        return Ok(None);
    };
    match loc.version {
        // io.stat exists only where the io controller is enabled for the
        // cgroup; a disk the cgroup has not touched has no line.
        Version::V2 => Ok(
            read_parsed(Kind::CgroupCounters, &d.join("io.stat"), parse_io_stat)?
                .and_then(|m| m.get(dev).copied()),
        ),
        // Like the limit files, these need CONFIG_BLK_DEV_THROTTLING.
        Version::V1 => {
            let ios = read_parsed(
                Kind::CgroupCounters,
                &d.join("blkio.throttle.io_serviced"),
                parse_v1_serviced,
            )?;
            let bytes = read_parsed(
                Kind::CgroupCounters,
                &d.join("blkio.throttle.io_service_bytes"),
                parse_v1_serviced,
            )?;
            let (Some(ios), Some(bytes)) = (ios, bytes) else {
                return Ok(None);
            };
            let (ri, wi) = ios.get(dev).copied().unwrap_or_default();
            let (rb, wb) = bytes.get(dev).copied().unwrap_or_default();
            Ok(Some(Counters {
                read_ios: ri,
                write_ios: wi,
                read_bytes: rb,
                write_bytes: wb,
            }))
        }
    }
}

/// Whether `pid` is the only process the cgroup's IO counters count: the
/// only one in its `cgroup.procs`, and in v2, whose io.stat also counts the
/// cgroup's descendants, none below it either. Anything unreadable counts
/// as not alone: then the counters cannot be attributed to the exporter.
pub(crate) fn alone(loc: &Located, pid: u32) -> bool {
    fn only(dir: &Path, pid: u32, recurse: bool) -> bool {
        let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
            return false;
        };
        if procs.split_whitespace().any(|p| p != pid.to_string()) {
            return false;
        }
        if !recurse {
            return true;
        }
        let Ok(children) = std::fs::read_dir(dir) else {
            return false;
        };
        children
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .all(|e| only(&e.path(), pid, true))
    }
    loc.dirs
        .first()
        .is_some_and(|d| only(d, pid, loc.version == Version::V2))
}

/// PSI stall totals of the cgroup (v2 only).
pub(crate) fn pressure(loc: &Located) -> Result<BTreeMap<&'static str, f64>, ReadError> {
    let (Version::V2, Some(d)) = (loc.version, loc.dirs.first()) else {
        return Ok(BTreeMap::new());
    };
    let path = d.join("io.pressure");
    match read_parsed(Kind::CgroupPressure, &path, parse_pressure) {
        // A kernel without PSI (CONFIG_PSI=n, or psi=0 on the command line)
        // has no io.pressure, or refuses reading it with EOPNOTSUPP.
        Err(e) if e.errno() == Some(libc::EOPNOTSUPP) => Ok(BTreeMap::new()),
        r => Ok(r?.unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests;
