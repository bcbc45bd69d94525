//! The storage-configuration audit: what in the kernel, mount and
//! PostgreSQL configuration works against commit latency or durability.
//!
//! Evaluation is a pure function over plain facts (`HostFacts`,
//! `VolumeFacts`, `ClusterFacts`) so every check is tested with a
//! table of facts; `read.rs` gathers the host and volume facts from
//! configurable /proc and /sys roots, and the daemon builds the cluster
//! facts from what its read-only PostgreSQL session already reads.
//!
//! A fact that could not be read is `None` and its checks are skipped,
//! not passed: the caller counts evaluated checks so "no finding" can be
//! told from "not checked".

pub(crate) mod read;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Severity {
    /// Data can be lost or corrupted.
    Critical,
    /// A measurable latency or throughput cost.
    Warning,
    /// Advice.
    Info,
}

impl Severity {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// What a check looks at, which decides the label of its finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Host,
    Volume,
    Cluster,
}

/// One row of the check table: the stable code and what docs/audit.md says.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    pub code: &'static str,
    pub(crate) severity: Severity,
    pub scope: Scope,
}

/// Every check, critical ones first. Codes are stable: alerts, the
/// `audit.ignore` lists and JSON consumers key on them.
///
/// Critical: data can be lost. Warning: a cost measured on this host's
/// storage path (where WAL lives, how checkpoints are triggered, the disk's
/// queue), worth a ticket. Info: advice. Every host-wide kernel setting is
/// advice: the stock value of each on most distributions, whose cost
/// depends on memory pressure and workload the audit does not see, so a
/// fresh host would otherwise open half a dozen tickets that no one acts
/// on. So are PostgreSQL's own defaults that trade one cost for another:
/// `wal_compression` off (CPU against WAL volume) and `huge_pages = try`
/// with none reserved, which every stock install has and which costs
/// memory lookups, not IO.
pub const CHECKS: &[Check] = &[
    // fsync is off
    c("fsync_off", Severity::Critical, Scope::Cluster),
    // full_page_writes is off
    c("full_page_writes_off", Severity::Critical, Scope::Cluster),
    // the volume lives in memory
    c("memory_filesystem", Severity::Critical, Scope::Volume),
    // mounted without write barriers
    c("barriers_off", Severity::Critical, Scope::Volume),
    // write-back cache and syncs faster than stable media
    c("volatile_write_cache", Severity::Critical, Scope::Volume),
    // synchronous_commit off or local
    c("synchronous_commit_off", Severity::Warning, Scope::Cluster),
    // ext4 mounted data=writeback
    c("ext4_data_writeback", Severity::Warning, Scope::Volume),
    // WAL on the data directory's filesystem
    c("wal_shares_data_volume", Severity::Warning, Scope::Cluster),
    // checkpoints forced by WAL volume
    c("checkpoints_requested", Severity::Warning, Scope::Cluster),
    // IO scheduler other than none/mq-deadline on SSD or virtual disk
    c("scheduler_on_ssd", Severity::Warning, Scope::Volume),
    // read_ahead_kb above 1 MiB
    c("read_ahead_large", Severity::Warning, Scope::Volume),
    // wal_compression is off
    c("wal_compression_off", Severity::Info, Scope::Cluster),
    // huge_pages=try with too few huge pages reserved
    c("huge_pages_shortfall", Severity::Info, Scope::Cluster),
    // transparent huge pages always
    c("thp_always", Severity::Info, Scope::Host),
    // vm.dirty_ratio allows > 4 GiB
    c("dirty_ratio_large", Severity::Info, Scope::Host),
    // vm.dirty_background_ratio allows > 1 GiB
    c("dirty_background_ratio_large", Severity::Info, Scope::Host),
    // vm.swappiness above 10
    c("swappiness_high", Severity::Info, Scope::Host),
    // vm.zone_reclaim_mode is not 0
    c("zone_reclaim_on", Severity::Info, Scope::Host),
    // vm.overcommit_memory is not 2
    c("overcommit_not_strict", Severity::Info, Scope::Host),
    // a kernel setting a reboot would undo
    c("sysctl_not_persistent", Severity::Info, Scope::Host),
    // random_page_cost 4 on non-rotational storage
    c("random_page_cost_default", Severity::Info, Scope::Cluster),
    // effective_io_concurrency ≤ 2 on SSD/NVMe
    c(
        "effective_io_concurrency_low",
        Severity::Info,
        Scope::Cluster,
    ),
    // mounted without noatime
    c("atime", Severity::Info, Scope::Volume),
    // a filesystem other than ext4 or XFS
    c("filesystem_choice", Severity::Info, Scope::Volume),
    // settings waiting for a restart
    c("pending_restart", Severity::Info, Scope::Cluster),
];

const fn c(code: &'static str, severity: Severity, scope: Scope) -> Check {
    Check {
        code,
        severity,
        scope,
    }
}

pub(crate) fn check(code: &str) -> Option<&'static Check> {
    CHECKS.iter().find(|c| c.code == code)
}

/// One finding: the evidence read, what it means and the fix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Finding {
    pub(crate) code: &'static str,
    pub(crate) severity: Severity,
    /// The file or setting read and its value: `/sys/block/vda/queue/scheduler = bfq`.
    pub(crate) evidence: String,
    pub(crate) message: String,
    /// The sysctl line, udev rule, mount option or `ALTER SYSTEM` statement.
    pub(crate) fix: String,
}

/// The result of one scope's evaluation.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Outcome {
    pub(crate) findings: Vec<Finding>,
    /// Checks whose facts were available and were evaluated.
    pub(crate) checked: u32,
    /// Checks skipped because a fact they need could not be read.
    pub(crate) skipped: u32,
    /// Codes that fired but are silenced by `audit.ignore`: not findings,
    /// yet the status page says how many there are, so a silenced check
    /// is not mistaken for a passing one. Left out of `check`'s JSON,
    /// which reads no configuration and silences nothing.
    #[serde(skip)]
    pub(crate) ignored: Vec<&'static str>,
}

impl Outcome {
    /// Records one check: `None` facts skip it, `Some(None)` passes it.
    fn note(&mut self, code: &'static str, r: Option<Option<(String, String, String)>>) {
        match r {
            None => self.skipped += 1,
            Some(found) => {
                self.checked += 1;
                if let Some((evidence, message, fix)) = found {
                    let severity = check(code).map_or(Severity::Warning, |c| c.severity);
                    self.findings.push(Finding {
                        code,
                        severity,
                        evidence,
                        message,
                        fix,
                    });
                }
            }
        }
    }

    /// Drops ignored findings (a deliberate choice must not page forever);
    /// the check still counts as evaluated.
    pub(crate) fn ignore(&mut self, codes: &[String]) {
        let ignored = &mut self.ignored;
        self.findings.retain(|f| {
            let keep = !codes.iter().any(|c| c == f.code);
            if !keep {
                ignored.push(f.code);
            }
            keep
        });
    }
}

/// Kernel facts of the host, from /proc and /sys.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HostFacts {
    pub(crate) mem_total_bytes: Option<u64>,
    pub(crate) dirty_ratio: Option<u64>,
    pub(crate) dirty_bytes: Option<u64>,
    pub(crate) dirty_background_ratio: Option<u64>,
    pub(crate) dirty_background_bytes: Option<u64>,
    pub(crate) swappiness: Option<u64>,
    pub(crate) zone_reclaim_mode: Option<u64>,
    pub(crate) overcommit_memory: Option<u64>,
    /// The selected value of /sys/kernel/mm/transparent_hugepage/enabled.
    pub(crate) thp_enabled: Option<String>,
    /// HugePages_Total from /proc/meminfo.
    pub(crate) hugepages_total: Option<u64>,
    /// The `vm.*` assignments the next boot would make, in the order they
    /// are applied (see [`read::boot_sysctls`]); `None` when no boot
    /// configuration was found to judge against.
    pub(crate) boot: Option<Vec<BootAssignment>>,
}

/// One `key = value` line of the boot-time sysctl configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BootAssignment {
    /// Dotted, as `sysctl` prints it: `vm.swappiness`.
    pub(crate) key: String,
    pub(crate) value: String,
    /// The file (or `/proc/cmdline`) that makes it.
    pub(crate) source: String,
}

/// Facts of one volume's filesystem and the disk under it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct VolumeFacts {
    pub(crate) fstype: Option<String>,
    /// For overlay: the filesystem type its upper directory lives on.
    pub(crate) overlay_upper_fstype: Option<String>,
    /// Mount options and superblock options from mountinfo, together.
    pub(crate) mount_options: Option<Vec<String>>,
    /// The whole disk's name (`vda`, `nvme0n1`), when there is one.
    pub(crate) disk: Option<String>,
    /// The selected value of queue/scheduler.
    pub(crate) scheduler: Option<String>,
    pub(crate) rotational: Option<bool>,
    /// queue/write_cache: `write back` or `write through`.
    pub(crate) write_cache: Option<String>,
    pub(crate) read_ahead_kb: Option<u64>,
    /// A virtio/xen/cloud disk, whose real scheduling happens on the host.
    pub(crate) virtual_disk: bool,
    /// The probe saw syncs faster than stable media can make data durable
    /// (`check`'s `sync_too_fast`); `None` before any commit probe.
    pub(crate) sync_too_fast: Option<bool>,
    /// The filesystem's size in bytes (statvfs).
    pub(crate) size_bytes: Option<u64>,
}

/// One pg_settings row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PgSetting {
    pub(crate) name: String,
    pub(crate) setting: String,
    /// In base units (bytes, seconds), when numeric.
    pub(crate) numeric: Option<f64>,
    pub(crate) source: String,
    pub(crate) pending_restart: bool,
}

/// Facts of one PostgreSQL cluster, from read-only SQL and discovery.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ClusterFacts {
    pub(crate) settings: Vec<PgSetting>,
    pub(crate) checkpoints_timed: Option<f64>,
    pub(crate) checkpoints_requested: Option<f64>,
    /// Filesystem ids (`MAJ:MIN` or volume names) of the data directory
    /// and the WAL directory, from discovery.
    pub(crate) data_fs: Option<String>,
    pub(crate) wal_fs: Option<String>,
    /// Whether the data directory's disk is non-rotational.
    pub(crate) data_nonrotational: Option<bool>,
    /// HugePages_Total of the host the cluster runs on.
    pub(crate) hugepages_total: Option<u64>,
    /// WAL generated per second: over the collector's window, and since
    /// pg_stat_wal's statistics reset, where known.
    pub(crate) wal_rates: Vec<WalRate>,
    /// The size of the filesystem holding pg_wal, when it is known here.
    pub(crate) wal_fs_bytes: Option<u64>,
    /// The size of all its databases (pg_database_size).
    pub(crate) database_bytes: Option<f64>,
}

/// WAL generated per second (pg_stat_wal.wal_bytes), over `seconds`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WalRate {
    pub(crate) bytes_per_second: f64,
    /// Full-page images logged per second (pg_stat_wal.wal_fpi).
    pub(crate) fpi_per_second: Option<f64>,
    pub(crate) seconds: f64,
    pub(crate) span: RateSpan,
}

/// Which span a WAL rate covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateSpan {
    /// The last `seconds` the collector watched (its window).
    Window,
    /// Since pg_stat_wal's statistics reset, `seconds` ago: the span the
    /// checkpoint counters usually cover too.
    SinceReset,
}

impl ClusterFacts {
    pub(crate) fn get(&self, name: &str) -> Option<&PgSetting> {
        self.settings.iter().find(|s| s.name == name)
    }
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

fn gib(bytes: f64) -> String {
    format!("{:.1} GiB", bytes / GIB)
}

type Found = Option<Option<(String, String, String)>>;

fn found(evidence: String, message: impl Into<String>, fix: impl Into<String>) -> Found {
    Some(Some((evidence, message.into(), fix.into())))
}

const PASS: Found = Some(None);

/// The fix for a kernel setting: a line in sysctl.d, which `sysctl --system`
/// applies now and systemd-sysctl at every boot. `sysctl -w` alone would be
/// undone by the next reboot (the `sysctl_not_persistent` check).
fn persist(line: &str) -> String {
    format!("{line} in /etc/sysctl.d/90-postgresql.conf, then sysctl --system")
}

fn sysctl(name: &str) -> String {
    format!("/proc/sys/vm/{name}")
}

pub(crate) fn evaluate_host(h: &HostFacts) -> Outcome {
    let mut o = kernel_checks(h);
    o.note("sysctl_not_persistent", not_persistent(h));
    o
}

/// The `vm.*` settings the host checks judge, with the value a kernel
/// boots with when nothing sets them (the same on every kernel since
/// 3.16, when zone_reclaim_mode stopped being switched on for NUMA).
const BOOT_DEFAULTS: &[(&str, u64)] = &[
    ("swappiness", 60),
    ("dirty_ratio", 20),
    ("dirty_bytes", 0),
    ("dirty_background_ratio", 10),
    ("dirty_background_bytes", 0),
    ("zone_reclaim_mode", 0),
    ("overcommit_memory", 0),
];

fn vm_fact<'a>(h: &'a mut HostFacts, name: &str) -> Option<&'a mut Option<u64>> {
    Some(match name {
        "swappiness" => &mut h.swappiness,
        "dirty_ratio" => &mut h.dirty_ratio,
        "dirty_bytes" => &mut h.dirty_bytes,
        "dirty_background_ratio" => &mut h.dirty_background_ratio,
        "dirty_background_bytes" => &mut h.dirty_background_bytes,
        "zone_reclaim_mode" => &mut h.zone_reclaim_mode,
        "overcommit_memory" => &mut h.overcommit_memory,
        _ => return None,
    })
}

/// Settings judged together: writing a `*_bytes` value zeroes its
/// `*_ratio` and the other way round, so a pair is restored as one.
const GROUPS: &[&[&str]] = &[
    &["dirty_ratio", "dirty_bytes"],
    &["dirty_background_ratio", "dirty_background_bytes"],
    &["swappiness"],
    &["zone_reclaim_mode"],
    &["overcommit_memory"],
];

/// The judged `vm.*` values after a reboot and where each comes from:
/// the kernel default, then the assignments in order (a later one wins,
/// and one of a ratio/bytes pair zeroes the other, as the kernel does).
pub(crate) fn boot_values(boot: &[BootAssignment]) -> Vec<(&'static str, u64, String)> {
    let mut v: Vec<(&'static str, u64, String)> = BOOT_DEFAULTS
        .iter()
        .map(|(k, d)| (*k, *d, "kernel default".to_string()))
        .collect();
    for a in boot {
        let Some(name) = a.key.strip_prefix("vm.") else {
            continue;
        };
        // Not a number: the kernel refuses the write and keeps the value.
        let Ok(n) = a.value.parse::<u64>() else {
            continue;
        };
        let group = GROUPS.iter().find(|g| g.contains(&name)).copied();
        for (k, value, source) in v.iter_mut() {
            if *k == name {
                (*value, *source) = (n, a.source.clone());
            } else if group.is_some_and(|g| g.contains(k)) {
                (*value, *source) = (0, format!("{} sets vm.{name}", a.source));
            }
        }
    }
    v
}

/// Host findings a reboot would bring back: for each group of settings
/// whose running value differs from the boot value, the kernel checks run
/// again with the boot values, and a finding absent now but present then
/// makes the group part of this one.
fn not_persistent(h: &HostFacts) -> Found {
    let values = boot_values(h.boot.as_ref()?);
    let now = kernel_checks(h);
    let mut differ = Vec::new();
    let mut lost: Vec<&'static str> = Vec::new();
    for group in GROUPS {
        let mut after = h.clone();
        let mut changed = Vec::new();
        for (name, value, source) in values.iter().filter(|(n, ..)| group.contains(n)) {
            // A setting that cannot be read now cannot be compared.
            if let Some(slot) = vm_fact(&mut after, name)
                && let Some(running) = *slot
                && running != *value
            {
                changed.push((*name, running, *value, source.as_str()));
                *slot = Some(*value);
            }
        }
        if changed.is_empty() {
            continue;
        }
        let new: Vec<&'static str> = kernel_checks(&after)
            .findings
            .iter()
            .map(|f| f.code)
            .filter(|c| !now.findings.iter().any(|f| f.code == *c))
            .collect();
        if !new.is_empty() {
            lost.extend(new);
            differ.extend(changed);
        }
    }
    if lost.is_empty() {
        return PASS;
    }
    found(
        differ
            .iter()
            .map(|(n, running, boot, src)| {
                format!("{} = {running}, boot sets {boot} ({src})", sysctl(n))
            })
            .collect::<Vec<_>>()
            .join("; "),
        format!(
            "Set by hand and not in the boot configuration: after the next reboot the \
             audit would report {}",
            lost.join(", ")
        ),
        format!(
            "add {} to /etc/sysctl.d/90-postgresql.conf",
            differ
                .iter()
                // The zero the kernel put in a pair's other half follows
                // from the line that sets the non-zero one.
                .filter(|(n, running, ..)| {
                    *running != 0 || GROUPS.iter().any(|g| g.len() == 1 && g.contains(n))
                })
                .map(|(n, running, ..)| format!("\"vm.{n} = {running}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

/// Every host check but the reboot one, on the running values.
fn kernel_checks(h: &HostFacts) -> Outcome {
    let mut o = Outcome::default();
    o.note("thp_always", thp_always(h));
    o.note(
        "dirty_ratio_large",
        dirty_ratio_large(
            h.dirty_ratio,
            h.dirty_bytes,
            h.mem_total_bytes,
            "dirty_ratio",
            4.0 * GIB,
        ),
    );
    o.note(
        "dirty_background_ratio_large",
        dirty_ratio_large(
            h.dirty_background_ratio,
            h.dirty_background_bytes,
            h.mem_total_bytes,
            "dirty_background_ratio",
            GIB,
        ),
    );
    o.note("swappiness_high", swappiness_high(h));
    o.note("zone_reclaim_on", zone_reclaim_on(h));
    o.note("overcommit_not_strict", overcommit_not_strict(h));
    o
}

fn thp_always(h: &HostFacts) -> Found {
    h.thp_enabled.as_ref().and_then(|v| {
        if v == "always" {
            found(
                format!("/sys/kernel/mm/transparent_hugepage/enabled = {v}"),
                "Transparent huge pages are always on: compaction and khugepaged stalls add \
                 latency spikes to backends touching memory",
                "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (or \
                 transparent_hugepage=madvise on the kernel command line)",
            )
        } else {
            PASS
        }
    })
}

/// vm.dirty_ratio or vm.dirty_background_ratio (`name`) when it lets more
/// than `limit` bytes of dirty pages build up in `mem` bytes of memory.
fn dirty_ratio_large(
    ratio: Option<u64>,
    bytes: Option<u64>,
    mem: Option<u64>,
    name: &str,
    limit: f64,
) -> Found {
    let (ratio, bytes, mem) = (ratio?, bytes?, mem?);
    // A non-zero *_bytes overrides the ratio: the kernel then ignores it.
    if bytes != 0 {
        return PASS;
    }
    let allowed = mem as f64 * ratio as f64 / 100.0;
    if allowed > limit {
        let bytes_name = name.replace("ratio", "bytes");
        found(
            format!("{} = {ratio} (of {} RAM)", sysctl(name), gib(mem as f64)),
            format!(
                "vm.{name} = {ratio} % lets {} of dirty pages build up before writeback; \
                 a checkpoint or fsync then has to flush all of it at once",
                gib(allowed)
            ),
            persist(&format!("vm.{bytes_name} = {}", limit as u64)),
        )
    } else {
        PASS
    }
}

fn swappiness_high(h: &HostFacts) -> Found {
    h.swappiness.and_then(|v| {
        if v > 10 {
            found(
                format!("{} = {v}", sysctl("swappiness")),
                "The kernel swaps out memory (shared buffers included) instead of dropping \
                 page cache; a backend then waits on swap-in",
                persist("vm.swappiness = 1"),
            )
        } else {
            PASS
        }
    })
}

fn zone_reclaim_on(h: &HostFacts) -> Found {
    h.zone_reclaim_mode.and_then(|v| {
        if v != 0 {
            found(
                format!("{} = {v}", sysctl("zone_reclaim_mode")),
                "On NUMA hosts the kernel reclaims local page cache rather than use another \
                 node's memory: the cache PostgreSQL relies on shrinks",
                persist("vm.zone_reclaim_mode = 0"),
            )
        } else {
            PASS
        }
    })
}

fn overcommit_not_strict(h: &HostFacts) -> Found {
    h.overcommit_memory.and_then(|v| {
        if v != 2 {
            found(
                format!("{} = {v}", sysctl("overcommit_memory")),
                "Memory is overcommitted: under pressure the OOM killer may kill a backend \
                 and PostgreSQL restarts every session in crash recovery",
                format!(
                    "{} (and check CommitLimit in /proc/meminfo with vm.overcommit_ratio)",
                    persist("vm.overcommit_memory = 2")
                ),
            )
        } else {
            PASS
        }
    })
}

/// Filesystems living in memory: sync returns at once and proves nothing.
const MEMORY_FILESYSTEMS: &[&str] = &["tmpfs", "ramfs", "hugetlbfs", "devtmpfs"];

pub(crate) fn evaluate_volume(v: &VolumeFacts) -> Outcome {
    let mut o = Outcome::default();
    volume_durability(v, &mut o);
    volume_performance(v, &mut o);
    o
}

/// What can lose committed data on the volume: a filesystem in memory,
/// barriers off, a volatile write cache that acknowledges syncs, ext4's
/// data=writeback.
fn volume_durability(v: &VolumeFacts, o: &mut Outcome) {
    let opts = v.mount_options.as_deref();
    let has = |o: &str| opts.is_some_and(|opts| opts.iter().any(|x| x == o));
    o.note(
        "memory_filesystem",
        v.fstype.as_ref().and_then(|fs| {
            let upper = v.overlay_upper_fstype.as_deref();
            if MEMORY_FILESYSTEMS.contains(&fs.as_str()) {
                found(
                    format!("mountinfo fstype = {fs}"),
                    "The volume lives in memory: fsync returns at once and everything is lost \
                     at the next reboot",
                    "put the data and WAL on a disk-backed filesystem (ext4 or XFS)",
                )
            } else if fs == "overlay" && upper.is_some_and(|u| MEMORY_FILESYSTEMS.contains(&u)) {
                found(
                    format!(
                        "mountinfo fstype = overlay, upperdir on {}",
                        upper.unwrap_or("")
                    ),
                    "The volume is an overlay whose writable layer lives in memory: writes are \
                     lost at the next restart",
                    "mount a disk-backed volume at the data and WAL directories",
                )
            } else {
                PASS
            }
        }),
    );
    o.note(
        "barriers_off",
        opts.and_then(
            |opts| match opts.iter().find(|o| *o == "nobarrier" || *o == "barrier=0") {
                Some(bad) => found(
                    format!("mountinfo option {bad}"),
                    "Write barriers are off: the disk may reorder or cache a commit's writes, \
                     and a power loss can corrupt the filesystem and lose committed data",
                    format!("remount without {bad} (the default keeps barriers on)"),
                ),
                None => PASS,
            },
        ),
    );
    o.note(
        "volatile_write_cache",
        v.write_cache
            .as_ref()
            .zip(v.sync_too_fast)
            .and_then(|(wc, fast)| {
                if wc == "write back" && fast {
                    found(
                        format!(
                            "/sys/block/{}/queue/write_cache = {wc}, probe sync_too_fast",
                            v.disk.as_deref().unwrap_or("?")
                        ),
                        "The disk has a write-back cache and acknowledges syncs faster than \
                         stable media can: commits may sit in a cache a power loss empties",
                        "enable power-loss protection or disable the volatile cache \
                         (hdparm -W0 / sdparm --clear=WCE), then recheck the probe latency",
                    )
                } else {
                    PASS
                }
            }),
    );
    o.note(
        "ext4_data_writeback",
        v.fstype.as_ref().zip(opts).and_then(|(fs, _)| {
            if fs == "ext4" && has("data=writeback") {
                found(
                    "mountinfo option data=writeback".to_string(),
                    "ext4 data=writeback may write metadata before data: after a crash files \
                     can hold stale blocks",
                    "remount with data=ordered (the default)",
                )
            } else {
                PASS
            }
        }),
    );
}

/// What makes the volume's IO slower than it needs to be: the IO
/// scheduler, read-ahead, access-time updates, the filesystem.
fn volume_performance(v: &VolumeFacts, o: &mut Outcome) {
    let opts = v.mount_options.as_deref();
    let has = |o: &str| opts.is_some_and(|opts| opts.iter().any(|x| x == o));
    o.note(
        "scheduler_on_ssd",
        v.scheduler.as_ref().zip(v.rotational).and_then(|(s, rot)| {
            let fast = !rot || v.virtual_disk;
            if fast && !matches!(s.as_str(), "none" | "mq-deadline" | "noop" | "deadline") {
                let disk = v.disk.as_deref().unwrap_or("?");
                found(
                    format!("/sys/block/{disk}/queue/scheduler = {s}"),
                    format!(
                        "The {s} scheduler adds per-request work and idling on a {} disk \
                         that orders requests itself",
                        if rot { "virtual" } else { "non-rotational" }
                    ),
                    format!(
                        "ACTION==\"add|change\", KERNEL==\"{disk}\", ATTR{{queue/scheduler}}=\"none\" \
                         in /etc/udev/rules.d/60-scheduler.rules"
                    ),
                )
            } else {
                PASS
            }
        }),
    );
    o.note(
        "read_ahead_large",
        v.read_ahead_kb.and_then(|kb| {
            if kb > 1024 {
                let disk = v.disk.as_deref().unwrap_or("?");
                found(
                    format!("/sys/block/{disk}/queue/read_ahead_kb = {kb}"),
                    format!(
                        "Each random 8 KiB read may pull {kb} KiB from the disk, wasting \
                         bandwidth and cache on pages nobody asked for"
                    ),
                    format!(
                        "ACTION==\"add|change\", KERNEL==\"{disk}\", ATTR{{queue/read_ahead_kb}}=\"128\""
                    ),
                )
            } else {
                PASS
            }
        }),
    );
    o.note(
        "atime",
        opts.and_then(|_| {
            if has("noatime") {
                PASS
            } else {
                let mode = if has("relatime") {
                    "relatime"
                } else {
                    "strictatime"
                };
                found(
                    format!("mountinfo option {mode}"),
                    "Reads update access times, which turns some reads into metadata writes",
                    "add noatime to the mount options in /etc/fstab",
                )
            }
        }),
    );
    o.note(
        "filesystem_choice",
        v.fstype.as_ref().and_then(|fs| {
            // Memory and overlay filesystems have their own finding above;
            // an unknown type is not evidence of anything.
            let judged =
                !(MEMORY_FILESYSTEMS.contains(&fs.as_str()) || fs == "overlay" || fs == "unknown");
            if !judged {
                return None;
            }
            if fs == "ext4" || fs == "xfs" {
                PASS
            } else {
                found(
                    format!("mountinfo fstype = {fs}"),
                    format!(
                        "{fs} is not one of the filesystems PostgreSQL's WAL and data are \
                         usually tuned and tested on (ext4, XFS); copy-on-write or network \
                         filesystems add writes or round trips to every sync"
                    ),
                    "put data and WAL on ext4 or XFS, or silence this code if the choice is \
                     deliberate (e.g. ZFS with a matching recordsize)",
                )
            }
        }),
    );
}

pub(crate) fn evaluate_cluster(cf: &ClusterFacts) -> Outcome {
    let mut o = Outcome::default();
    cluster_durability(cf, &mut o);
    cluster_wal(cf, &mut o);
    cluster_tuning(cf, &mut o);
    o.note("pending_restart", pending_restart(cf));
    o
}

/// A setting's value as pg_settings shows it.
fn setting<'a>(cf: &'a ClusterFacts, name: &str) -> Option<&'a str> {
    cf.get(name).map(|s| s.setting.as_str())
}

fn alter(name: &str, value: &str) -> String {
    format!("ALTER SYSTEM SET {name} = '{value}'; SELECT pg_reload_conf();")
}

/// A boolean setting that must be on.
fn off(cf: &ClusterFacts, name: &'static str, msg: &'static str) -> Found {
    let v = setting(cf, name)?;
    if v == "off" {
        found(format!("pg_settings {name} = off"), msg, alter(name, "on"))
    } else {
        PASS
    }
}

/// Settings that trade committed data for speed.
fn cluster_durability(cf: &ClusterFacts, o: &mut Outcome) {
    o.note(
        "fsync_off",
        off(
            cf,
            "fsync",
            "fsync is off: PostgreSQL never forces data to disk, and an OS crash or power loss \
             can corrupt the whole cluster",
        ),
    );
    o.note(
        "full_page_writes_off",
        off(
            cf,
            "full_page_writes",
            "full_page_writes is off: a crash during a page write leaves a torn page that WAL \
             replay cannot repair",
        ),
    );
    o.note(
        "synchronous_commit_off",
        setting(cf, "synchronous_commit").and_then(|v| match v {
            "off" => found(
                "pg_settings synchronous_commit = off".to_string(),
                "Commits are acknowledged before their WAL is flushed: a crash loses up to \
                 3 × wal_writer_delay (600 ms by default) of acknowledged transactions",
                alter("synchronous_commit", "on"),
            ),
            "local" => found(
                "pg_settings synchronous_commit = local".to_string(),
                "Commits wait for the local flush only: a failover to a standby can lose \
                 acknowledged transactions",
                alter("synchronous_commit", "on"),
            ),
            _ => PASS,
        }),
    );
}

/// Where WAL goes and how much of it checkpoints make.
fn cluster_wal(cf: &ClusterFacts, o: &mut Outcome) {
    o.note(
        "wal_shares_data_volume",
        cf.data_fs
            .as_ref()
            .zip(cf.wal_fs.as_ref())
            .and_then(|(d, w)| {
                if d == w {
                    found(
                        format!("data directory and pg_wal on the same filesystem ({d})"),
                        "WAL flushes queue behind checkpoint and backend writes on the same \
                     filesystem, so commit latency follows the data load",
                        "move pg_wal to its own volume (initdb --waldir, or a symlink with the \
                     cluster stopped)",
                    )
                } else {
                    PASS
                }
            }),
    );
    o.note(
        "checkpoints_requested",
        (|| {
            let (t, r) = (cf.checkpoints_timed?, cf.checkpoints_requested?);
            let max_wal = cf.get("max_wal_size")?.numeric?;
            let total = t + r;
            if total > 0.0 && r / total > 0.2 && max_wal < 4.0 * GIB {
                let sized = size_max_wal(&WalSizingInput {
                    current: max_wal,
                    rate: busiest(&cf.wal_rates),
                    checkpoint_timeout: cf
                        .get("checkpoint_timeout")
                        .and_then(|s| s.numeric)
                        .unwrap_or(DEFAULT_CHECKPOINT_TIMEOUT),
                    completion_target: cf
                        .get("checkpoint_completion_target")
                        .and_then(|s| s.numeric)
                        .unwrap_or(DEFAULT_COMPLETION_TARGET),
                    wal_fs_bytes: cf.wal_fs_bytes,
                    // Compressed images are smaller by an amount the
                    // statistics do not tell.
                    image_bytes: (setting(cf, "wal_compression") == Some("off")).then(|| {
                        cf.get("block_size")
                            .and_then(|s| s.numeric)
                            .unwrap_or(DEFAULT_BLOCK_SIZE)
                    }),
                    database_bytes: cf.database_bytes,
                });
                let fix = match sized.bytes {
                    Some(b) => alter("max_wal_size", &pg_size(b)),
                    None => "move pg_wal to a larger filesystem: this one cannot hold a larger \
                             max_wal_size"
                        .to_string(),
                };
                found(
                    format!(
                        "checkpoints requested {r} of {total} ({:.0} %), max_wal_size = {}; {}",
                        100.0 * r / total,
                        human(max_wal),
                        sized.basis
                    ),
                    "Checkpoints are forced by WAL volume rather than by time: each one writes \
                     back and full-page-writes again, multiplying IO",
                    fix,
                )
            } else {
                PASS
            }
        })(),
    );
    o.note(
        "wal_compression_off",
        setting(cf, "wal_compression").and_then(|v| {
            if v == "off" {
                found(
                    "pg_settings wal_compression = off".to_string(),
                    "Full-page images go into WAL uncompressed: more WAL to write and sync \
                     after every checkpoint",
                    alter("wal_compression", "lz4"),
                )
            } else {
                PASS
            }
        }),
    );
}

/// PostgreSQL's defaults, for a server that does not show the setting.
const DEFAULT_CHECKPOINT_TIMEOUT: f64 = 300.0;
const DEFAULT_COMPLETION_TARGET: f64 = 0.9;
const DEFAULT_BLOCK_SIZE: f64 = 8192.0;

/// How much more WAL than the window's mean a checkpoint cycle should have
/// room for: the window (15 minutes by default) is not the day's peak.
const WAL_HEADROOM: f64 = 1.5;

/// The largest `max_wal_size` suggested, whatever the rate: beyond it a
/// checkpoint_timeout's worth of WAL is better met with a shorter
/// checkpoint_timeout or faster WAL storage than with more disk.
const MAX_WAL_CAP: f64 = 64.0 * GIB;

/// The share of the WAL filesystem `max_wal_size` may take: pg_wal grows
/// past it under load (it is a soft limit), and replication slots,
/// wal_keep_size or a failing archive_command keep more on top, so a
/// suggestion never takes more than a quarter of the filesystem.
const WAL_FS_SHARE: f64 = 0.25;

/// What the `checkpoints_requested` fix is sized from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WalSizingInput {
    /// max_wal_size now, in bytes.
    pub(crate) current: f64,
    pub(crate) rate: Option<WalRate>,
    /// checkpoint_timeout in seconds.
    pub(crate) checkpoint_timeout: f64,
    pub(crate) completion_target: f64,
    pub(crate) wal_fs_bytes: Option<u64>,
    /// The size of a full-page image: block_size, when images are stored
    /// whole (wal_compression off); `None` when their size is not known.
    pub(crate) image_bytes: Option<f64>,
    /// The size of all the cluster's databases.
    pub(crate) database_bytes: Option<f64>,
}

/// A suggested max_wal_size and the figures it comes from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WalSizing {
    /// In bytes; `None` when the WAL filesystem leaves no room above the
    /// current value.
    pub(crate) bytes: Option<u64>,
    pub(crate) basis: String,
}

/// The max_wal_size that lets checkpoint_timeout, not WAL volume, start
/// checkpoints at the observed WAL rate. PostgreSQL (11 and later) requests
/// a checkpoint once the WAL since the last one's start exceeds
/// max_wal_size / (1 + checkpoint_completion_target), so a
/// checkpoint_timeout's worth of WAL needs that much times
/// (1 + target), and [`WAL_HEADROOM`] on top.
///
/// A checkpoint_timeout's worth is rate × timeout, except for the
/// full-page images: the first change of each page after a checkpoint logs
/// the whole page, so while checkpoints come every few seconds (the very
/// thing this finding is about) most WAL is images of the same pages over
/// and over, and the rate overstates what longer cycles write. A cycle
/// logs each page at most once, so its images are bounded by the
/// databases' size: the images' share of the rate (wal_fpi × block_size,
/// known while images are stored uncompressed) counts for at most that.
///
/// When that is not above the current value (a quiet window, or requested
/// checkpoints that were CHECKPOINT commands), or no rate was seen yet,
/// twice the current value: the requested checkpoints say more room was
/// needed, not how much. Rounded up to 256 MB steps under 1 GB and whole
/// GB above, never below the current value, at most [`MAX_WAL_CAP`] and
/// [`WAL_FS_SHARE`] of the WAL filesystem.
pub(crate) fn size_max_wal(i: &WalSizingInput) -> WalSizing {
    let factor = 1.0 + i.completion_target.clamp(0.0, 1.0);
    let timeout = i.checkpoint_timeout;
    let mut basis;
    let mut want = match i.rate {
        Some(r) => {
            let over = match r.span {
                RateSpan::Window => format!("over the last {:.0} s", r.seconds),
                RateSpan::SinceReset => {
                    format!("since the statistics reset {:.0} s ago", r.seconds)
                }
            };
            let images = r
                .fpi_per_second
                .zip(i.image_bytes)
                .map(|(n, b)| (n * b).clamp(0.0, r.bytes_per_second));
            let bound = images
                .zip(i.database_bytes)
                .filter(|&(img, db)| img * timeout > db);
            let tail = |cycle: f64| {
                format!(
                    "× (1 + checkpoint_completion_target {}) × {WAL_HEADROOM} headroom = {}",
                    i.completion_target,
                    human(cycle * factor * WAL_HEADROOM)
                )
            };
            let cycle;
            (cycle, basis) = match bound {
                Some((img, db)) => {
                    let rest = r.bytes_per_second - img;
                    let cycle = rest * timeout + db;
                    let b = format!(
                        "WAL {:.2} MiB/s {over}, {:.2} MiB/s of it full-page images; a \
                         checkpoint_timeout of {timeout:.0} s holds {:.2} MiB/s × {timeout:.0} s \
                         + images of at most the {} the databases hold = {} {}",
                        r.bytes_per_second / MIB,
                        img / MIB,
                        rest / MIB,
                        human(db),
                        human(cycle),
                        tail(cycle)
                    );
                    (cycle, b)
                }
                None => {
                    let cycle = r.bytes_per_second * timeout;
                    let b = format!(
                        "WAL {:.2} MiB/s {over} × checkpoint_timeout {timeout:.0} s {}",
                        r.bytes_per_second / MIB,
                        tail(cycle)
                    );
                    (cycle, b)
                }
            };
            let need = cycle * factor * WAL_HEADROOM;
            if need > i.current {
                need
            } else {
                basis.push_str(&format!(
                    ", within max_wal_size: the requested checkpoints came from a busier \
                     time or CHECKPOINT commands; twice the current {}",
                    human(i.current)
                ));
                2.0 * i.current
            }
        }
        None => {
            basis = format!(
                "no WAL rate seen yet: twice the current {}",
                human(i.current)
            );
            2.0 * i.current
        }
    };
    want = round_up(want);
    let (cap, why) = match i.wal_fs_bytes {
        Some(fs) if (fs as f64) * WAL_FS_SHARE < MAX_WAL_CAP => (
            round_down((fs as f64) * WAL_FS_SHARE),
            format!("a quarter of the WAL filesystem's {}", human(fs as f64)),
        ),
        _ => (MAX_WAL_CAP, "the largest the audit suggests".to_string()),
    };
    if want > cap {
        basis.push_str(&format!("; capped at {} ({why})", human(cap)));
        want = cap;
    }
    let bytes = (want > i.current).then_some(want as u64);
    if bytes.is_none() {
        basis.push_str(&format!(
            "; {} is no more than the current value",
            human(want)
        ));
    }
    WalSizing { bytes, basis }
}

/// The higher WAL rate: the window's shows a recent peak the long mean
/// dilutes, the mean since the reset a busy period the window missed.
fn busiest(rates: &[WalRate]) -> Option<WalRate> {
    rates
        .iter()
        .copied()
        .filter(|r| r.bytes_per_second.is_finite() && r.bytes_per_second >= 0.0)
        .reduce(|a, b| {
            if b.bytes_per_second > a.bytes_per_second {
                b
            } else {
                a
            }
        })
}

/// The step a max_wal_size is rounded to: 256 MB under 1 GB, else 1 GB.
fn step(bytes: f64) -> f64 {
    if bytes < GIB { 256.0 * MIB } else { GIB }
}

fn round_up(bytes: f64) -> f64 {
    let s = step(bytes);
    ((bytes / s).ceil() * s).max(256.0 * MIB)
}

fn round_down(bytes: f64) -> f64 {
    let s = step(bytes);
    (bytes / s).floor() * s
}

/// A size as PostgreSQL's settings read it (MB and GB are 1024-based).
fn pg_size(bytes: u64) -> String {
    let (gib, mib) = (GIB as u64, MIB as u64);
    if bytes >= gib && bytes % gib == 0 {
        format!("{}GB", bytes / gib)
    } else {
        format!("{}MB", bytes.div_ceil(mib))
    }
}

/// A size for the evidence: MiB under 1 GiB, else GiB.
fn human(bytes: f64) -> String {
    if bytes < GIB {
        format!("{:.0} MiB", bytes / MIB)
    } else {
        gib(bytes)
    }
}

/// Memory and planner settings that do not fit the host's storage.
fn cluster_tuning(cf: &ClusterFacts, o: &mut Outcome) {
    o.note(
        "huge_pages_shortfall",
        (|| {
            let mode = setting(cf, "huge_pages")?;
            let need: u64 = setting(cf, "shared_memory_size_in_huge_pages")?
                .parse()
                .ok()?;
            let have = cf.hugepages_total?;
            if mode == "try" && have < need {
                found(
                    format!(
                        "pg_settings huge_pages = try, shared_memory_size_in_huge_pages = \
                         {need}; /proc/meminfo HugePages_Total = {have}"
                    ),
                    "huge_pages=try and too few huge pages are reserved: PostgreSQL silently \
                     runs on small pages with larger page tables and TLB misses",
                    format!(
                        "{} (then restart PostgreSQL)",
                        persist(&format!("vm.nr_hugepages = {need}"))
                    ),
                )
            } else {
                PASS
            }
        })(),
    );
    o.note(
        "random_page_cost_default",
        (|| {
            let v = cf.get("random_page_cost")?.numeric?;
            if cf.data_nonrotational? && v >= 4.0 {
                found(
                    format!("pg_settings random_page_cost = {v}"),
                    "random_page_cost is the spinning-disk default on non-rotational storage: \
                     the planner avoids index scans that would be cheap",
                    alter("random_page_cost", "1.1"),
                )
            } else {
                PASS
            }
        })(),
    );
    o.note(
        "effective_io_concurrency_low",
        (|| {
            let v = cf.get("effective_io_concurrency")?.numeric?;
            if cf.data_nonrotational? && v <= 2.0 {
                found(
                    format!("pg_settings effective_io_concurrency = {v}"),
                    "SSDs serve many reads in parallel; prefetching only a couple of pages \
                     leaves that unused",
                    alter("effective_io_concurrency", "200"),
                )
            } else {
                PASS
            }
        })(),
    );
}

/// Settings changed but waiting for a restart.
fn pending_restart(cf: &ClusterFacts) -> Found {
    if cf.settings.is_empty() {
        None
    } else {
        let pending: Vec<&str> = cf
            .settings
            .iter()
            .filter(|s| s.pending_restart)
            .map(|s| s.name.as_str())
            .collect();
        if pending.is_empty() {
            PASS
        } else {
            found(
                format!("pg_settings pending_restart: {}", pending.join(", ")),
                "Changed settings take effect only after a restart; until then the server \
                 runs with the old values",
                "restart PostgreSQL in a maintenance window",
            )
        }
    }
}

/// One audit pass over the host, every volume and every cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Report {
    pub(crate) host: Outcome,
    /// By volume name.
    pub(crate) volumes: Vec<(String, Outcome)>,
    /// By cluster name; a cluster not connected yet is left out.
    pub(crate) clusters: Vec<(String, Outcome)>,
    /// Files that exist but could not be read or parsed this pass.
    pub(crate) read_errors: Vec<String>,
}

impl Report {
    pub(crate) fn checked(&self) -> u64 {
        self.outcomes().map(|o| u64::from(o.checked)).sum()
    }

    pub(crate) fn skipped(&self) -> u64 {
        self.outcomes().map(|o| u64::from(o.skipped)).sum()
    }

    fn outcomes(&self) -> impl Iterator<Item = &Outcome> {
        std::iter::once(&self.host)
            .chain(self.volumes.iter().map(|(_, o)| o))
            .chain(self.clusters.iter().map(|(_, o)| o))
    }
}

/// What the exporter serves: the latest report and lifetime counters.
#[derive(Debug, Clone, Default)]
pub(crate) struct AuditSnapshot {
    /// Behind an `Arc`: every scrape takes a snapshot, and the report (a
    /// few strings per volume and cluster) changes only once per audit
    /// pass, so a snapshot shares it instead of copying it.
    pub(crate) last: Option<std::sync::Arc<Report>>,
    /// Unix time of the latest pass.
    pub(crate) last_run: Option<f64>,
    pub(crate) runs: u64,
    pub(crate) checks_evaluated: u64,
    pub(crate) checks_skipped: u64,
    pub(crate) read_errors: u64,
}

/// Shared between the audit task (writer) and the exposition (reader).
#[derive(Debug, Default)]
pub(crate) struct AuditState(std::sync::Mutex<AuditSnapshot>);

impl AuditState {
    pub(crate) fn record(&self, report: Report, unix_time: f64) {
        // A poisoned lock only means a reader panicked mid-copy; the data
        // is plain counters and a report, still consistent to overwrite.
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.runs += 1;
        s.checks_evaluated += report.checked();
        s.checks_skipped += report.skipped();
        s.read_errors += report.read_errors.len() as u64;
        s.last_run = Some(unix_time);
        s.last = Some(std::sync::Arc::new(report));
    }

    pub(crate) fn snapshot(&self) -> AuditSnapshot {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests;
