//! AWS EBS detailed performance statistics: the one in-guest figure a cloud
//! volume gives about its own cap. On Nitro instances every EBS volume is
//! an NVMe controller whose vendor log page 0xD0 counts, among IOs, bytes
//! and latency bins, the microseconds the volume spent over its provisioned
//! IOPS or throughput and over the instance's EBS limits: the hypervisor
//! delays completions there, and nothing in /sys says so.
//!
//! Each limits pass (at most once per `MIN_PERIOD`) finds EBS controllers
//! in `<sys_root>/class/nvme` (model "Amazon Elastic Block Store", serial
//! `volXXXX` = volume `vol-XXXX`), joins their namespaces to the watched
//! volumes by the whole disk's `MAJ:MIN`, reads each joined controller's
//! page through a [`LogPageSource`] (the ioctl in `sys.rs`, or fixture
//! files in tests) and keeps the totals monotonic across device resets.
//! Failures give `available 0` with one of a few fixed reasons and one log
//! line per incident (`events::Incidents`), nothing else.

pub mod page;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::events::{Incidents, Report};
use crate::limits::inputs::VolumeInput;
use page::{Bin, Page};

/// The page is read at most this often, whatever `limits_interval` says:
/// the counters move in microseconds but a Get Log Page is an admin
/// command on the volume's controller, not free.
pub(crate) const MIN_PERIOD: Duration = Duration::from_secs(1);

/// The model string of EBS controllers (space-padded in sysfs).
pub(crate) const EBS_MODEL: &str = "Amazon Elastic Block Store";

/// The testing-only environment variable naming a directory of fixture
/// pages (`nvme0.bin`, ...; `nvme0.status` with an NVMe status instead)
/// that replace the ioctl. Documented for contributors, not users.
pub(crate) const FIXTURE_ENV: &str = "PGSE_TEST_EBS_LOG_PAGES";

/// How a read failed.
#[derive(Debug)]
pub enum ReadFailure {
    /// Opening the device node or the ioctl failed.
    Os(io::Error),
    /// The controller answered with an NVMe status.
    Status(u32),
}

/// Where log pages come from: the device (`DeviceSource`) or fixture files.
pub trait LogPageSource: Send + Sync + std::fmt::Debug {
    /// The 0xD0 page of controller `ctrl` (`nvme0`).
    fn read(&self, ctrl: &str) -> Result<Vec<u8>, ReadFailure>;
}

/// The real thing: `/dev/<ctrl>`, the controller's character device, opened
/// read-only, and the Get Log Page admin command for namespace 1 (EBS
/// controllers have exactly one).
#[derive(Debug, Default)]
pub struct DeviceSource;

impl LogPageSource for DeviceSource {
    fn read(&self, ctrl: &str) -> Result<Vec<u8>, ReadFailure> {
        use std::os::fd::AsFd;
        let f = std::fs::File::open(Path::new("/dev").join(ctrl)).map_err(ReadFailure::Os)?;
        let mut buf = crate::sys::AlignedBuf::<{ crate::sys::NVME_LOG_PAGE_LEN }>::new();
        match crate::sys::nvme_get_log_page(f.as_fd(), 1, 0xD0, &mut buf) {
            Ok(crate::sys::LogPage::Read) => Ok(buf.as_slice().to_vec()),
            Ok(crate::sys::LogPage::Status(s)) => Err(ReadFailure::Status(s)),
            Err(e) => Err(ReadFailure::Os(e)),
        }
    }
}

/// Fixture pages from a directory, for tests of the daemon on hosts
/// without EBS: `<ctrl>.status` (a number, decimal or 0x hex) stands for
/// an NVMe status, else `<ctrl>.bin` is the page (a missing file is the
/// ENOENT of a missing device node).
#[derive(Debug)]
pub(crate) struct FileSource(pub(crate) PathBuf);

impl LogPageSource for FileSource {
    fn read(&self, ctrl: &str) -> Result<Vec<u8>, ReadFailure> {
        if let Ok(t) = std::fs::read_to_string(self.0.join(format!("{ctrl}.status"))) {
            let t = t.trim();
            let n = match t.strip_prefix("0x") {
                Some(h) => u32::from_str_radix(h, 16).ok(),
                None => t.parse().ok(),
            };
            return Err(ReadFailure::Status(n.unwrap_or(u32::MAX)));
        }
        std::fs::read(self.0.join(format!("{ctrl}.bin"))).map_err(ReadFailure::Os)
    }
}

/// The source the daemon uses: fixture pages when [`FIXTURE_ENV`] is set
/// (tests only), else the device.
pub(crate) fn source() -> std::sync::Arc<dyn LogPageSource> {
    match std::env::var_os(FIXTURE_ENV) {
        Some(d) if !d.is_empty() => std::sync::Arc::new(FileSource(PathBuf::from(d))),
        _ => std::sync::Arc::new(DeviceSource),
    }
}

/// One EBS controller found in sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    /// `nvme0`.
    pub name: String,
    /// `vol-0123456789abcdef0`.
    pub volume_id: String,
    /// (namespace block device, `MAJ:MIN`): `("nvme0n1", "259:0")`.
    pub namespaces: Vec<(String, String)>,
}

/// `vol0123...` (how the controller's serial spells it) → `vol-0123...`;
/// `None` for a serial that is not a volume id.
pub(crate) fn volume_id(serial: &str) -> Option<String> {
    let s = serial.trim();
    let rest = s.strip_prefix("vol")?;
    let rest = rest.strip_prefix('-').unwrap_or(rest);
    (!rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric()))
        .then(|| format!("vol-{rest}"))
}

/// The EBS controllers under `<sys_root>/class/nvme`. No such directory
/// (no NVMe driver loaded) is no controller; unreadable entries of other
/// devices are skipped: they are not ours to report.
pub fn controllers(sys_root: &Path) -> Vec<Controller> {
    let class = sys_root.join("class/nvme");
    let Ok(dir) = std::fs::read_dir(&class) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // Only `nvme<N>`: the name becomes the device node `/dev/<name>`.
        if !name
            .strip_prefix("nvme")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let path = class.join(&name);
        let text = |f: &str| std::fs::read_to_string(path.join(f)).ok();
        if text("model").as_deref().map(str::trim) != Some(EBS_MODEL) {
            continue;
        }
        let Some(volume_id) = text("serial").as_deref().and_then(volume_id) else {
            continue;
        };
        let mut namespaces: Vec<(String, String)> = std::fs::read_dir(&path)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|n| {
                let ns = n.file_name().to_string_lossy().into_owned();
                if !is_namespace(&name, &ns) {
                    return None;
                }
                let dev = std::fs::read_to_string(path.join(&ns).join("dev")).ok()?;
                Some((ns, dev.trim().to_string()))
            })
            .collect();
        namespaces.sort();
        out.push(Controller {
            name,
            volume_id,
            namespaces,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Whether `entry` of controller `ctrl`'s sysfs directory is one of its
/// namespaces: `nvme0n1`, or `nvme0c0n1` under native multipath.
fn is_namespace(ctrl: &str, entry: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = entry.strip_prefix(ctrl) else {
        return false;
    };
    let rest = match rest.strip_prefix('c') {
        Some(r) => match r.split_once('n') {
            Some((c, n)) if digits(c) => n,
            _ => return false,
        },
        None => match rest.strip_prefix('n') {
            Some(n) => n,
            None => return false,
        },
    };
    digits(rest)
}

/// A watched volume on an EBS controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Joined {
    pub(crate) volume: String,
    pub(crate) controller: String,
    pub(crate) ebs_volume_id: String,
    /// The namespace block device (`nvme1n1`).
    pub(crate) device: String,
}

/// Joins volumes to controllers by their whole disk's `MAJ:MIN` (a
/// partition already maps to its parent disk). A volume on device-mapper or
/// md over EBS has a whole disk of its own (`dm-0`) and joins nothing.
pub(crate) fn join(volumes: &[VolumeInput], ctrls: &[Controller]) -> Vec<Joined> {
    let mut out = Vec::new();
    for v in volumes {
        let Ok(disk) = &v.disk else { continue };
        for c in ctrls {
            if let Some((ns, _)) = c.namespaces.iter().find(|(_, mm)| *mm == disk.majmin) {
                out.push(Joined {
                    volume: v.name.clone(),
                    controller: c.name.clone(),
                    ebs_volume_id: c.volume_id.clone(),
                    device: ns.clone(),
                });
            }
        }
    }
    out
}

/// Why the statistics are not available: the `reason` label, a fixed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Reason {
    /// Every EBS controller behind a watched volume was read.
    Ok,
    /// No watched volume is on an EBS controller (other hardware, or a
    /// volume on device-mapper over EBS).
    NoEbsDevice,
    /// EACCES or EPERM: the exporter lacks CAP_SYS_ADMIN or access to the
    /// device node.
    PermissionDenied,
    /// Another OS error: no device node in a container, ENOTTY, EIO.
    DeviceError,
    /// The controller answered with an NVMe status (0x109: no such log page).
    NvmeStatus,
    /// The bytes are not a page this parser knows.
    BadLogPage,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Ok => "ok",
            Reason::NoEbsDevice => "no_ebs_device",
            Reason::PermissionDenied => "permission_denied",
            Reason::DeviceError => "device_error",
            Reason::NvmeStatus => "nvme_status",
            Reason::BadLogPage => "bad_log_page",
        }
    }
}

/// A failed read of one controller: the reason label and what to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub(crate) reason: Reason,
    pub(crate) detail: String,
}

/// Classifies a source's failure or a parse failure.
pub fn classify(r: Result<Vec<u8>, ReadFailure>) -> Result<Page, Failure> {
    let bytes = match r {
        Ok(b) => b,
        Err(ReadFailure::Status(s)) => {
            // The low 11 bits are the status code type and code; above them
            // sit the retry/more/do-not-retry flags.
            let sc = s & 0x7ff;
            let what = if sc == 0x109 {
                " (invalid log page: not an EBS volume, e.g. instance store)"
            } else {
                ""
            };
            return Err(Failure {
                reason: Reason::NvmeStatus,
                detail: format!("NVMe status {sc:#x}{what}"),
            });
        }
        Err(ReadFailure::Os(e)) => {
            let denied = matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM));
            return Err(if denied {
                Failure {
                    reason: Reason::PermissionDenied,
                    detail: format!(
                        "{e}: the Get Log Page ioctl needs CAP_SYS_ADMIN and read access to the device node"
                    ),
                }
            } else {
                Failure {
                    reason: Reason::DeviceError,
                    detail: e.to_string(),
                }
            });
        }
    };
    page::parse(&bytes).map_err(|e| Failure {
        reason: Reason::BadLogPage,
        detail: e.to_string(),
    })
}

/// A counter kept monotonic across resets: the controller's totals start
/// over when the volume is detached and attached again, and u32 bin counts
/// wrap. A raw value below the previous one adds the previous one to a
/// base, as Prometheus' `rate()` would on a reset, so the exported total
/// never goes backwards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Monotonic {
    base: u64,
    last: u64,
}

impl Monotonic {
    pub(crate) fn update(&mut self, raw: u64) -> u64 {
        if raw < self.last {
            self.base = self.base.saturating_add(self.last);
        }
        self.last = raw;
        self.base.saturating_add(raw)
    }
}

/// A latency histogram ready to encode: per-bin (not cumulative) counts by
/// upper bound in seconds, ending with `+Inf` (0: the device's last bin is
/// its own upper bound), the total count, and the sum.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Histogram {
    pub(crate) buckets: Vec<(f64, u64)>,
    pub(crate) count: u64,
    pub(crate) sum_seconds: f64,
}

/// One watched volume's figures, monotonic, in exported units.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VolumeStats {
    pub(crate) volume: String,
    pub(crate) ebs_volume_id: String,
    pub(crate) device: String,
    /// The ten totals of [`page::Counters::totals`], in page order, raw
    /// units (ops, bytes, µs).
    pub(crate) totals: [u64; 10],
    pub(crate) queue_length: u64,
    pub(crate) read_latency: Histogram,
    pub(crate) write_latency: Histogram,
}

/// What the latest pass found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EbsSnapshot {
    pub(crate) reason: Reason,
    pub(crate) volumes: Vec<VolumeStats>,
}

/// Per-controller state kept between reads.
#[derive(Debug, Default)]
struct Track {
    totals: [Monotonic; 10],
    /// Bin bounds of the last page, per histogram; bins that change bounds
    /// start over.
    bounds: [Vec<u64>; 2],
    bins: [Vec<Monotonic>; 2],
}

fn histogram(
    bins: &[Bin],
    bounds: &mut Vec<u64>,
    mono: &mut Vec<Monotonic>,
    sum_us: u64,
) -> Histogram {
    let uppers: Vec<u64> = bins.iter().map(|b| b.upper_us).collect();
    if *bounds != uppers {
        *bounds = uppers;
        *mono = vec![Monotonic::default(); bins.len()];
    }
    let mut buckets: Vec<(f64, u64)> = bins
        .iter()
        .zip(mono.iter_mut())
        .map(|(b, m)| (b.upper_us as f64 / 1e6, m.update(u64::from(b.count))))
        .collect();
    let count = buckets
        .iter()
        .map(|(_, n)| *n)
        .fold(0u64, u64::saturating_add);
    buckets.push((f64::INFINITY, 0));
    Histogram {
        buckets,
        count,
        sum_seconds: sum_us as f64 / 1e6,
    }
}

impl Track {
    /// The page's figures, monotonic, for the volume `j`.
    fn update(&mut self, j: &Joined, p: &Page) -> VolumeStats {
        let raw = p.counters.totals();
        let mut totals = [0u64; 10];
        for ((out, m), r) in totals.iter_mut().zip(&mut self.totals).zip(raw) {
            *out = m.update(r);
        }
        let [rb, wb] = &mut self.bounds;
        let [rm, wm] = &mut self.bins;
        VolumeStats {
            volume: j.volume.clone(),
            ebs_volume_id: j.ebs_volume_id.clone(),
            device: j.device.clone(),
            totals,
            queue_length: p.counters.queue_length,
            read_latency: histogram(&p.read_latency, rb, rm, totals[4]),
            write_latency: histogram(&p.write_latency, wb, wm, totals[5]),
        }
    }
}

/// A log line for the caller to emit (kept apart from `tracing` so tests
/// can count them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Log {
    Warn(String),
    Info(String),
}

/// The EBS reader: state between passes.
#[derive(Debug, Default)]
pub(crate) struct Reader {
    last: Option<(Instant, EbsSnapshot)>,
    /// EBS volume id → monotonic state.
    tracks: BTreeMap<String, Track>,
    incidents: Incidents<String, Reason>,
    said_no_device: bool,
}

impl Reader {
    /// One pass: the snapshot to export and the lines to log. Within
    /// [`MIN_PERIOD`] of the last read it returns the last snapshot.
    pub(crate) fn pass(
        &mut self,
        sys_root: &Path,
        src: &dyn LogPageSource,
        volumes: &[VolumeInput],
        now: Instant,
    ) -> (EbsSnapshot, Vec<Log>) {
        if let Some((at, snap)) = &self.last
            && now.saturating_duration_since(*at) < MIN_PERIOD
        {
            return (snap.clone(), Vec::new());
        }
        let (snap, logs) = self.read(sys_root, src, volumes, now);
        self.last = Some((now, snap.clone()));
        (snap, logs)
    }

    /// Records a failed read of `j`'s controller; the line to log, if the
    /// incident policy says so.
    fn failed(&mut self, j: &Joined, f: &Failure, now: Instant) -> Option<Log> {
        let again = match self.incidents.failed(j.controller.clone(), f.reason, now) {
            Report::New => String::new(),
            Report::Again { failures } => format!(" still, after {failures} reads"),
            Report::Quiet => return None,
        };
        Some(Log::Warn(format!(
            "EBS statistics of /dev/{} ({}, volume {}) unavailable{again} ({}): {}",
            j.controller,
            j.ebs_volume_id,
            j.volume,
            f.reason.as_str(),
            f.detail
        )))
    }

    fn read(
        &mut self,
        sys_root: &Path,
        src: &dyn LogPageSource,
        volumes: &[VolumeInput],
        now: Instant,
    ) -> (EbsSnapshot, Vec<Log>) {
        let mut logs = Vec::new();
        let joined = join(volumes, &controllers(sys_root));
        if joined.is_empty() {
            // Said once per process: on every host without EBS this is
            // the normal state, not an incident to repeat.
            if !self.said_no_device {
                self.said_no_device = true;
                logs.push(Log::Info(format!(
                    "EBS statistics unavailable: no watched volume is on an AWS EBS NVMe controller ({} lists none)",
                    sys_root.join("class/nvme").display()
                )));
            }
            return (
                EbsSnapshot {
                    reason: Reason::NoEbsDevice,
                    volumes: Vec::new(),
                },
                logs,
            );
        }
        let mut reason = Reason::Ok;
        // Each controller once, even when it backs several volumes: one
        // read, one log line, one update of its monotonic state.
        let mut figures: BTreeMap<&str, VolumeStats> = BTreeMap::new();
        for j in &joined {
            if figures.contains_key(j.controller.as_str()) {
                continue;
            }
            let page = match classify(src.read(&j.controller)) {
                Ok(p) => p,
                Err(f) => {
                    logs.extend(self.failed(j, &f, now));
                    // The most telling reason wins: permission over device
                    // errors over odd pages (the order of `Reason`).
                    if reason == Reason::Ok || f.reason < reason {
                        reason = f.reason;
                    }
                    continue;
                }
            };
            if let Some((n, d)) = self.incidents.succeeded(j.controller.clone(), now) {
                logs.push(Log::Info(format!(
                    "EBS statistics of /dev/{} ({}) read again after {n} failed reads over {d:.0?}",
                    j.controller, j.ebs_volume_id
                )));
            }
            let t = self.tracks.entry(j.ebs_volume_id.clone()).or_default();
            figures.insert(&j.controller, t.update(j, &page));
        }
        let out = joined
            .iter()
            .filter_map(|j| {
                let f = figures.get(j.controller.as_str())?;
                Some(VolumeStats {
                    volume: j.volume.clone(),
                    ..f.clone()
                })
            })
            .collect();
        // Volumes detached since: forget their state.
        self.tracks
            .retain(|id, _| joined.iter().any(|j| j.ebs_volume_id == *id));
        (
            EbsSnapshot {
                reason,
                volumes: out,
            },
            logs,
        )
    }
}

#[cfg(test)]
mod tests;
