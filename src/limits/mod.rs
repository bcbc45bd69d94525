//! IO limits: for every volume, the caps that bind the processes using it
//! and how close they run to them.
//!
//! - `source="cgroup"`: the tightest cgroup limit on the volume's whole disk
//!   along the cgroup path of PostgreSQL's postmaster (pid from
//!   `postmaster.pid` of the cluster whose directory the volume holds), or of
//!   the exporter itself for volumes of no cluster. Utilization is that
//!   cgroup's own IO rate on the disk over the collector interval.
//! - `source="provisioned"`: limits from the config (a cloud volume's IOPS
//!   and throughput); utilization from the disk's /proc/diskstats counters.
//! - `source="detected"`: the plateaus of the volume's latest queue-depth
//!   sweep (read and write IOPS and bandwidth); utilization as for
//!   provisioned limits.
//!
//! The capped commit ceiling is the tightest of these caps on device
//! writes (`caps` says which take part and why) over how many device
//! writes one commit probe costs. That is measured where it can be
//! attributed (else taken as two, what ext4 and XFS write): the exporter's own
//! cgroup counts the IOs its threads issue on each disk (io.stat in v2,
//! blkio.throttle.io_serviced in v1), so Δ(write IOs) / Δ(commit probes)
//! over an interval is the cost of one probe as the throttle sees it. It is
//! only attributable when the exporter has a cgroup of its own (a systemd
//! service, a container) and is the only process in it; in the root cgroup,
//! or one shared with other processes, their IO is mixed in and no figure
//! is published.

pub(crate) mod caps;
pub mod cgroup;
pub mod diskstats;
pub mod ebs;
pub(crate) mod error;
pub(crate) mod inputs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::model::pacing;
use crate::types::Resource;
use cgroup::{Counters, Located, ProcCgroups};
use error::{ErrorLog, Kind, PassErrors, ReadError, read_optional};
pub(crate) use inputs::{ClusterInput, DiskInput, Inputs, VolumeInput};

/// Where and how often IO limits are read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LimitsSettings {
    pub(crate) interval: std::time::Duration,
    /// Where the cgroup hierarchies are mounted.
    pub(crate) cgroup_root: PathBuf,
    pub(crate) proc_root: PathBuf,
    pub(crate) sys_root: PathBuf,
}

/// One limit on one volume.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LimitRow {
    pub(crate) volume: String,
    pub(crate) source: &'static str,
    pub(crate) resource: Resource,
    pub(crate) value: f64,
    pub(crate) utilization: Option<f64>,
}

/// Whose cgroup a volume's limits were read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupRow {
    pub(crate) volume: String,
    /// `postgres:<cluster>` or `exporter`.
    pub(crate) scope: String,
    pub(crate) version: &'static str,
    pub(crate) cgroup: String,
    pub(crate) disk: String,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct LimitsSnapshot {
    pub(crate) rows: Vec<LimitRow>,
    pub(crate) cgroups: Vec<CgroupRow>,
    /// (scope, cgroup, kind, seconds) PSI stall totals.
    pub(crate) pressure: Vec<(String, String, &'static str, f64)>,
    /// Device writes per commit probe, per volume (as the throttle counts).
    pub(crate) writes_per_probe: BTreeMap<String, f64>,
    /// Why volumes have no disk, for the log.
    pub(crate) no_disk: BTreeMap<String, String>,
    /// Seconds between the two passes every `utilization` is a rate over
    /// (the latest and the one before); `None` after the first pass.
    pub(crate) utilization_seconds: Option<f64>,
    /// The latest pass: how long it took and how many reads failed.
    pub(crate) last_run: Option<LimitsRun>,
    /// Failed reads since start by (file kind, cause): a file that cannot
    /// be read is an error, never "no limit".
    pub(crate) read_errors: BTreeMap<(&'static str, &'static str), u64>,
    /// AWS EBS statistics; `None` with `--no-collector.limits.ebs`.
    pub(crate) ebs: Option<ebs::EbsSnapshot>,
}

/// How the latest limits pass went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LimitsRun {
    pub(crate) seconds: f64,
    pub(crate) failed_reads: u32,
}

impl LimitsSnapshot {
    /// Drops what belongs to volumes or clusters no longer watched (a
    /// reload removed them since the last limits pass), so their series
    /// vanish at once instead of at the next pass.
    pub(crate) fn retain_current(&mut self, volumes: &[&str], clusters: &[&str]) {
        self.rows.retain(|r| volumes.contains(&r.volume.as_str()));
        self.cgroups
            .retain(|r| volumes.contains(&r.volume.as_str()));
        self.writes_per_probe
            .retain(|v, _| volumes.contains(&v.as_str()));
        self.no_disk.retain(|v, _| volumes.contains(&v.as_str()));
        if let Some(e) = &mut self.ebs {
            e.volumes.retain(|s| volumes.contains(&s.volume.as_str()));
        }
        self.pressure
            .retain(|(scope, ..)| match scope.strip_prefix("postgres:") {
                Some(c) => clusters.contains(&c),
                None => true,
            });
    }

    /// The volume's `cap` commit ceiling: the tightest of its caps on
    /// device writes (cgroup, provisioned, detected; [`caps`]) over its
    /// measured device writes per commit probe, or the default where none
    /// is measured.
    pub(crate) fn cap_basis(&self, volume: &str) -> Option<caps::CapBasis<'_>> {
        caps::cap_basis(
            self.rows
                .iter()
                .filter(|r| r.volume == volume)
                .map(|r| caps::WriteCap {
                    source: r.source,
                    resource: r.resource,
                    value: r.value,
                }),
            self.writes_per_probe.get(volume).copied(),
        )
    }
}

#[derive(Debug, Default)]
pub(crate) struct LimitsState {
    snap: Mutex<LimitsSnapshot>,
    /// Asks for a pass before the next tick.
    wake: tokio::sync::Notify,
}

impl LimitsState {
    /// Runs a pass now rather than at the next tick: a volume a reload
    /// started (or whose provisioned limits it changed) would otherwise
    /// show no limits, or the old ones, for up to a whole limits interval.
    /// Rates stay right, as each pass divides by the time since the last.
    pub(crate) fn pass_now(&self) {
        self.wake.notify_one();
    }

    pub(crate) fn snapshot(&self) -> LimitsSnapshot {
        self.snap.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Previous readings, for rates.
#[derive(Debug, Default)]
struct Prev {
    at: Option<Instant>,
    /// (volume, scope) → cgroup counters on the volume's disk.
    cgroup: BTreeMap<(String, String), Counters>,
    /// disk name → diskstats.
    disks: BTreeMap<String, diskstats::DiskStats>,
    /// volume → (exporter's write IOs on the disk, commit probes so far).
    own: BTreeMap<String, (u64, u64)>,
    /// Smoothed writes per probe, kept between intervals without probes.
    wpp: BTreeMap<String, f64>,
    /// Failed reads since start, by (kind, cause).
    read_errors: BTreeMap<(&'static str, &'static str), u64>,
    /// Which reads are failing, so each is logged once, not every pass.
    log: ErrorLog,
    /// The EBS statistics reader's state.
    ebs: ebs::Reader,
}

/// A process's cgroups from `/proc/<pid>/cgroup`; `Ok(None)` when the
/// process is gone (ENOENT, or ESRCH while it exits): a postmaster.pid
/// left by a crashed server names a pid that no longer runs, and the
/// volume falls back to the exporter's cgroup, as while PostgreSQL is down.
fn read_proc_cgroup(proc_root: &Path, pid: &str) -> Result<Option<ProcCgroups>, ReadError> {
    let path = proc_root.join(pid).join("cgroup");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e)
            if pid != "self"
                && (e.kind() == std::io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ESRCH)) =>
        {
            return Ok(None);
        }
        // /proc/self/cgroup always exists: missing, proc_root is wrong.
        Err(e) => return Err(ReadError::io(Kind::ProcCgroup, &path, e)),
    };
    cgroup::parse_proc_cgroup(&text)
        .map(Some)
        .map_err(|what| ReadError::parse(Kind::ProcCgroup, &path, what))
}

/// The postmaster's pid: the first line of `postmaster.pid`. `Ok(None)`
/// when there is none: PostgreSQL removes the file on a clean shutdown, a
/// cluster on another host has no data directory here, and the file is
/// empty for the instant between its creation and its first write.
fn postmaster_pid(data_dir: &Path) -> Result<Option<u32>, ReadError> {
    let path = data_dir.join("postmaster.pid");
    let Some(t) = read_optional(Kind::PostmasterPid, &path)? else {
        return Ok(None);
    };
    let Some(first) = t.lines().next().map(str::trim) else {
        return Ok(None);
    };
    first.parse::<u32>().map(Some).map_err(|_| {
        ReadError::parse(
            Kind::PostmasterPid,
            &path,
            format!("first line {first:?} is not a pid"),
        )
    })
}

/// Runs the limits collector until the process ends. `ebs`: where AWS
/// EBS statistics pages come from, `None` when that collector is off.
pub(crate) async fn run(
    cfg: LimitsSettings,
    inputs: Arc<dyn Inputs>,
    state: Arc<LimitsState>,
    ebs: Option<Arc<dyn ebs::LogPageSource>>,
) {
    // The first pass at once, the later ones on boundaries of the interval
    // since the UNIX epoch, where the PostgreSQL collector's rounds end
    // their waits too: tasks due at about the same moment wake the process
    // once (`model::pacing::until_boundary`).
    let tick = tokio::time::sleep_until(tokio::time::Instant::now());
    tokio::pin!(tick);
    let prev = Arc::new(Mutex::new(Prev::default()));
    loop {
        tokio::select! {
            () = &mut tick => {}
            () = state.wake.notified() => {}
        }
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let wait = crate::model::pacing::until_boundary(unix, cfg.interval, cfg.interval / 2);
        tick.as_mut().reset(tokio::time::Instant::now() + wait);
        let (cfg2, inputs2, prev2, ebs2) = (cfg.clone(), inputs.clone(), prev.clone(), ebs.clone());
        let snap = tokio::task::spawn_blocking(move || {
            let mut p = match prev2.lock() {
                Ok(p) => p,
                Err(_) => return LimitsSnapshot::default(),
            };
            pass(
                &cfg2,
                inputs2.as_ref(),
                ebs2.as_deref(),
                &mut p,
                Instant::now(),
            )
        })
        .await
        .unwrap_or_default();
        if let Ok(mut s) = state.snap.lock() {
            *s = snap;
        }
    }
}

/// The EBS statistics of one pass, its log lines emitted.
fn ebs_pass(
    cfg: &LimitsSettings,
    src: &dyn ebs::LogPageSource,
    vols: &[VolumeInput],
    prev: &mut Prev,
) -> ebs::EbsSnapshot {
    let (snap, logs) = prev.ebs.pass(&cfg.sys_root, src, vols, Instant::now());
    for l in logs {
        match l {
            ebs::Log::Warn(m) => tracing::warn!("{m}"),
            ebs::Log::Info(m) => tracing::info!("{m}"),
        }
    }
    snap
}

/// One limits pass: collect, then count and log what could not be read;
/// the EBS statistics (`ebs`: their source, `None` when that collector is
/// off) from the same list of volumes, taken once per pass (it snapshots
/// every volume's state).
fn pass(
    cfg: &LimitsSettings,
    inputs: &dyn Inputs,
    ebs: Option<&dyn ebs::LogPageSource>,
    prev: &mut Prev,
    t0: Instant,
) -> LimitsSnapshot {
    let mut errors = PassErrors::default();
    let vols = inputs.volumes();
    let mut snap = collect(cfg, inputs, &vols, prev, &mut errors);
    snap.ebs = ebs.map(|src| ebs_pass(cfg, src, &vols, prev));
    for k in errors.labels() {
        *prev.read_errors.entry(k).or_default() += 1;
    }
    prev.log.update(&errors, Instant::now());
    snap.read_errors = prev.read_errors.clone();
    snap.last_run = Some(LimitsRun {
        seconds: t0.elapsed().as_secs_f64(),
        failed_reads: u32::try_from(errors.len()).unwrap_or(u32::MAX),
    });
    snap
}

fn collect(
    cfg: &LimitsSettings,
    inputs: &dyn Inputs,
    vols: &[VolumeInput],
    prev: &mut Prev,
    errors: &mut PassErrors,
) -> LimitsSnapshot {
    let now = Instant::now();
    let dt = prev
        .at
        .map(|t| now.duration_since(t).as_secs_f64())
        .filter(|d| *d > 0.0);
    let clusters = inputs.clusters();
    let cgroups = PassCgroups::read(cfg, &clusters, errors);
    // A failed read leaves no baseline: the next good reading starts over
    // rather than spanning the gap with a rate.
    let disk_stats = errors
        .note(diskstats::read(&cfg.proc_root))
        .unwrap_or_default();
    let mut pass = VolumePass {
        dt,
        ..VolumePass::default()
    };
    for v in vols {
        let disk = match &v.disk {
            Ok(d) => d,
            Err(reason) => {
                pass.without_disk(v, reason.as_ref());
                continue;
            }
        };
        let cluster = clusters
            .iter()
            .find(|c| c.volumes.iter().any(|(vol, _)| *vol == v.name));
        pass.cgroup_limits(v, disk, cluster, &cgroups, prev, errors);
        pass.disk_limits(v, disk, &disk_stats, prev);
        pass.writes_per_probe(v, disk, vols, &cgroups, prev, errors);
        pass.own_cap_share(v, disk, &cgroups, prev, errors);
    }
    set_slowdowns(inputs, vols, &pass.own_share);
    // Keep the own-counter baseline only when probes advanced enough, so
    // slow probe rates still accumulate three probes.
    for (k, v) in pass.next_own {
        let keep_old = prev.own.get(&k).is_some_and(|&(_, pp)| v.1 < pp + 3);
        if !keep_old {
            prev.own.insert(k, v);
        }
    }
    prev.cgroup = pass.next_cgroup;
    prev.disks = disk_stats;
    prev.at = Some(now);
    pass.out.utilization_seconds = dt;
    pass.out
}

/// The cgroups a pass reads limits from, found once per pass.
struct PassCgroups {
    /// The hierarchies under cgroup_root. `None`: cgroup reading is off (an
    /// empty directory) or failed (counted).
    layout: Option<cgroup::Layout>,
    /// The exporter's own cgroup.
    own: Option<Located>,
    /// Whether the exporter is the only process in `own`.
    own_alone: bool,
    /// cluster name → located postmaster cgroup.
    pg: BTreeMap<String, Located>,
}

impl PassCgroups {
    fn read(cfg: &LimitsSettings, clusters: &[ClusterInput], errors: &mut PassErrors) -> Self {
        let layout = errors.note(cgroup::detect(&cfg.cgroup_root)).flatten();
        let mut cgroups = PassCgroups {
            layout,
            own: None,
            own_alone: false,
            pg: BTreeMap::new(),
        };
        let own = errors
            .note(read_proc_cgroup(&cfg.proc_root, "self"))
            .flatten()
            .and_then(|c| cgroups.locate(&c));
        cgroups.own_alone = own
            .as_ref()
            .is_some_and(|o| cgroup::alone(o, std::process::id()));
        cgroups.own = own;
        for c in clusters {
            let Some(dd) = &c.data_directory else {
                continue;
            };
            let Some(pid) = errors.note(postmaster_pid(dd)).flatten() else {
                continue;
            };
            if let Some(loc) = errors
                .note(read_proc_cgroup(&cfg.proc_root, &pid.to_string()))
                .flatten()
                .and_then(|cg| cgroups.locate(&cg))
            {
                cgroups.pg.insert(c.name.clone(), loc);
            }
        }
        cgroups
    }

    fn locate(&self, cg: &ProcCgroups) -> Option<Located> {
        self.layout.as_ref().and_then(|l| l.locate(cg))
    }
}

/// What a pass gathers volume by volume: the snapshot it publishes, and
/// the baselines the next pass computes rates from.
#[derive(Default)]
struct VolumePass {
    /// Seconds since the previous pass; `None` on the first.
    dt: Option<f64>,
    out: LimitsSnapshot,
    /// (volume, scope) → cgroup counters on the volume's disk.
    next_cgroup: BTreeMap<(String, String), Counters>,
    /// volume → (exporter's write IOs on the disk, commit probes so far).
    next_own: BTreeMap<String, (u64, u64)>,
    /// The cgroups whose PSI totals are already in `out`.
    seen_pressure: Vec<String>,
    /// disk → (tightest write-IOPS cap that counts the exporter's own IO,
    /// the exporter's planned device writes per second on the disk).
    own_share: BTreeMap<String, (Option<f64>, f64)>,
}

impl VolumePass {
    /// A volume whose disk is unknown: why, and its provisioned limits.
    fn without_disk(&mut self, v: &VolumeInput, reason: Option<&String>) {
        if let Some(r) = reason {
            self.out.no_disk.insert(v.name.clone(), r.clone());
        }
        // Provisioned limits are still facts about the volume, without a
        // disk to measure their utilization on.
        for (resource, value) in &v.provisioned {
            self.out.rows.push(LimitRow {
                volume: v.name.clone(),
                source: "provisioned",
                resource: *resource,
                value: *value as f64,
                utilization: None,
            });
        }
    }

    /// The limits of the cgroup that binds the volume's users (a configured
    /// one, else the postmaster's of the cluster on it, else the
    /// exporter's), with their utilization and the cgroup's PSI totals.
    fn cgroup_limits(
        &mut self,
        v: &VolumeInput,
        disk: &DiskInput,
        cluster: Option<&ClusterInput>,
        cgroups: &PassCgroups,
        prev: &Prev,
        errors: &mut PassErrors,
    ) {
        let configured = v.cgroup.as_ref().and_then(|p| {
            cgroups.locate(&ProcCgroups {
                v2: Some(p.clone()),
                blkio: Some(p.clone()),
            })
        });
        let (scope, loc) = match (
            &configured,
            cluster.and_then(|c| cgroups.pg.get(&c.name).map(|l| (c, l))),
        ) {
            (Some(l), _) => ("configured".to_string(), Some(l)),
            (None, Some((c, l))) => (format!("postgres:{}", c.name), Some(l)),
            (None, None) => ("exporter".to_string(), cgroups.own.as_ref()),
        };
        let Some(loc) = loc else {
            return;
        };
        self.out.cgroups.push(CgroupRow {
            volume: v.name.clone(),
            scope: scope.clone(),
            version: loc.version.as_str(),
            cgroup: loc.path.clone(),
            disk: disk.name.clone(),
        });
        // Unreadable limits: no rows (unknown), the failure is counted.
        let limits = errors
            .note(cgroup::effective_limits(loc, &disk.majmin))
            .unwrap_or_default();
        let counters = errors.note(cgroup::counters(loc, &disk.majmin)).flatten();
        let key = (v.name.clone(), scope.clone());
        let delta = match (self.dt, counters, prev.cgroup.get(&key)) {
            (Some(dt), Some(c), Some(p)) => Some((c, *p, dt)),
            _ => None,
        };
        for (resource, value) in limits.resources() {
            self.out.rows.push(LimitRow {
                volume: v.name.clone(),
                source: "cgroup",
                resource,
                value: value as f64,
                utilization: delta
                    .map(|(c, p, dt)| cgroup_delta(resource, &c, &p) as f64 / dt / value as f64),
            });
        }
        if let Some(c) = counters {
            self.next_cgroup.insert(key, c);
        }
        if !self.seen_pressure.contains(&loc.path) {
            for (kind, secs) in errors.note(cgroup::pressure(loc)).unwrap_or_default() {
                self.out
                    .pressure
                    .push((scope.clone(), loc.path.clone(), kind, secs));
            }
            self.seen_pressure.push(loc.path.clone());
        }
    }

    /// Provisioned limits and the sweep's plateaus: utilization from the
    /// whole disk's counters, every process's IO included.
    fn disk_limits(
        &mut self,
        v: &VolumeInput,
        disk: &DiskInput,
        disk_stats: &BTreeMap<String, diskstats::DiskStats>,
        prev: &Prev,
    ) {
        let dt = self.dt;
        let ds_now = disk_stats.get(&disk.name).copied();
        let ds_prev = prev.disks.get(&disk.name).copied();
        let disk_utilization = |resource: Resource, value: f64| match (dt, ds_now, ds_prev) {
            (Some(dt), Some(a), Some(b)) => Some(disk_rate(resource, &a.delta(&b)) / dt / value),
            _ => None,
        };
        for (resource, value) in &v.provisioned {
            self.out.rows.push(LimitRow {
                volume: v.name.clone(),
                source: "provisioned",
                resource: *resource,
                value: *value as f64,
                utilization: disk_utilization(*resource, *value as f64),
            });
        }
        // Plateaus found by the queue-depth sweep.
        for (resource, value) in &v.detected {
            self.out.rows.push(LimitRow {
                volume: v.name.clone(),
                source: "detected",
                resource: *resource,
                value: *value,
                utilization: disk_utilization(*resource, *value),
            });
        }
    }

    /// Writes per commit probe, from the exporter's own cgroup, when the
    /// exporter is alone in it: in a cgroup shared with other processes
    /// (a login session, a CI runner, a container with a shell) their
    /// writes would be charged to the probes, and a throttled disk's
    /// capped ceiling would come out a hundred times too low.
    fn writes_per_probe(
        &mut self,
        v: &VolumeInput,
        disk: &DiskInput,
        vols: &[VolumeInput],
        cgroups: &PassCgroups,
        prev: &mut Prev,
        errors: &mut PassErrors,
    ) {
        if v.commit_probe
            && let Some(o) = cgroups
                .own
                .as_ref()
                .filter(|o| o.path != "/" && cgroups.own_alone)
            && let Some(c) = errors.note(cgroup::counters(o, &disk.majmin)).flatten()
        {
            // The exporter's writes on a disk come from every commit-probing
            // volume on it: divide by all their probes, not this volume's.
            let probes: u64 = vols
                .iter()
                .filter(|o| {
                    o.commit_probe && o.disk.as_ref().is_ok_and(|d| d.majmin == disk.majmin)
                })
                .map(|o| o.commit_probes)
                .sum();
            if let Some(&(pw, pp)) = prev.own.get(&v.name)
                && probes >= pp + 3
            {
                let w = c.write_ios.saturating_sub(pw) as f64 / (probes - pp) as f64;
                if w > 0.0 {
                    prev.wpp.insert(v.name.clone(), w);
                }
            }
            // Only once probing has begun: the probe files are written
            // before the first probe, and those writes are not a probe's.
            if probes > 0 {
                self.next_own.insert(v.name.clone(), (c.write_ios, probes));
            }
        }
        if let Some(w) = prev.wpp.get(&v.name) {
            self.out.writes_per_probe.insert(v.name.clone(), *w);
        }
    }

    /// Adds the volume to its disk's [`Self::own_share`]: caps that count
    /// the probes' own writes, and the writes its probes plan. Those caps
    /// are the exporter's own cgroup path (whatever ancestor sets it), the
    /// provisioned figures and the sweep's write-IOPS plateau (found with
    /// the exporter's own writes, so whatever enforces it counts them). A
    /// cap on PostgreSQL's cgroup alone does not see the probes.
    fn own_cap_share(
        &mut self,
        v: &VolumeInput,
        disk: &DiskInput,
        cgroups: &PassCgroups,
        prev: &Prev,
        errors: &mut PassErrors,
    ) {
        let provisioned = v
            .provisioned
            .iter()
            .filter(|(r, _)| r.counts_writes())
            .map(|(_, n)| *n as f64);
        let detected = v
            .detected
            .iter()
            .filter(|(r, n)| r.counts_writes() && *n > 0.0)
            .map(|(_, n)| *n);
        let planned = if v.commit_probe {
            let wpc = prev
                .wpp
                .get(&v.name)
                .copied()
                .unwrap_or(pacing::DEFAULT_WRITES_PER_COMMIT);
            wpc * pacing::commits_per_second(v.interval, v.busy_every, v.burst_commits)
        } else {
            0.0
        };
        // The exporter's cgroup limits on a disk are the same for every
        // volume on it: read them once per disk and pass.
        let e = self
            .own_share
            .entry(disk.majmin.clone())
            .or_insert_with(|| {
                let own_cap = cgroups.own.as_ref().and_then(|o| {
                    errors
                        .note(cgroup::effective_limits(o, &disk.majmin))
                        .and_then(|l| l.write_iops)
                        .map(|n| n as f64)
                });
                (own_cap, 0.0)
            });
        e.0 = provisioned
            .chain(detected)
            .chain(v.throttled_write_iops)
            .chain(e.0)
            .reduce(f64::min);
        e.1 += planned;
    }
}

/// What the cgroup counters `c` counted toward `resource` since `p`.
fn cgroup_delta(resource: Resource, c: &Counters, p: &Counters) -> u64 {
    match resource {
        Resource::ReadIops => c.read_ios.saturating_sub(p.read_ios),
        Resource::WriteIops => c.write_ios.saturating_sub(p.write_ios),
        Resource::ReadBytesPerSecond => c.read_bytes.saturating_sub(p.read_bytes),
        Resource::WriteBytesPerSecond => c.write_bytes.saturating_sub(p.write_bytes),
        // cgroups cap reads and writes apart; these never come from
        // Limits::resources.
        Resource::Iops => (c.read_ios + c.write_ios).saturating_sub(p.read_ios + p.write_ios),
        Resource::BytesPerSecond => {
            (c.read_bytes + c.write_bytes).saturating_sub(p.read_bytes + p.write_bytes)
        }
    }
}

/// Stretches each volume's probe schedule so that the probes' own writes
/// stay under 2 % of the tightest write-IOPS cap on its disk that counts
/// them ([`pacing::slowdown`]), and logs each change.
fn set_slowdowns(
    inputs: &dyn Inputs,
    vols: &[VolumeInput],
    own_share: &BTreeMap<String, (Option<f64>, f64)>,
) {
    for v in vols {
        let Ok(disk) = &v.disk else { continue };
        let Some(&(cap, planned)) = own_share.get(&disk.majmin) else {
            continue;
        };
        let factor = cap.map_or(1.0, |c| pacing::slowdown(planned, c));
        let before = inputs.set_slowdown(&v.name, factor);
        if (before - factor).abs() > 0.01 * before {
            tracing::info!(
                volume = %v.name,
                slowdown = format!("{factor:.2}"),
                write_iops_cap = ?cap,
                planned_writes_per_second = format!("{planned:.2}"),
                "probe schedule {}: the probes' own writes stay under 2 % of a write-IOPS cap that counts them",
                if factor > 1.0 { "stretched" } else { "back to as configured" },
            );
        }
    }
}

/// What `d` (a whole disk's counter deltas) counts toward `resource`.
fn disk_rate(resource: Resource, d: &diskstats::DiskStats) -> f64 {
    (match resource {
        Resource::Iops => d.reads + d.writes,
        Resource::ReadIops => d.reads,
        Resource::WriteIops => d.writes,
        Resource::BytesPerSecond => d.read_bytes + d.write_bytes,
        Resource::ReadBytesPerSecond => d.read_bytes,
        Resource::WriteBytesPerSecond => d.write_bytes,
    }) as f64
}

#[cfg(test)]
mod tests;
