//! `check`: a one-shot measurement of one directory's volume with a verdict.
//!
//! Unlike the daemon (one probe per interval, cheap enough to run forever),
//! `check` probes back to back at queue depth 1, like fio with one job:
//! first commit probes for half the duration, then read probes. These are
//! the busy figures. The last seconds of the commit half are a few lone
//! commits, each after a pause: what a commit costs on a quiet server (on
//! virtual machines often several times the busy figure). Latencies
//! go into HDR histograms (3 significant digits, bounded memory for any
//! duration).
//!
//! The report leads with the commit ceiling in force (the lowest of
//! 1 / the busy commits' mean and every write-IOPS cap `check` knows:
//! its sweep's plateau, its cgroup's limit) and one verdict whose level is
//! that of its most serious finding: latency warnings, plateaus, the audit.

pub(crate) mod ceiling;
mod progress;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::model::pacing::DEFAULT_WRITES_PER_COMMIT;
use crate::model::plateau::DepthPoint;
use crate::model::verdict::{
    self, Level, Observed, OpStats, Reason, Verdict, Warning, fmt_seconds,
};
use crate::probe::Rng;
use crate::probe::engine::Engine;
use crate::probe::files::{ProbeDir, SetupError, raw};
use crate::probe::fsinfo::{self, Roots};
use crate::probe::placement::{Asker, check_probe_dir};
use crate::probe::settings::{
    BLOCK_SIZE, CHECK_DIR_NAME, PROBE_DIR_NAME, WAL_FILE_SIZE, after_idle_pause,
};
use crate::probe::sweep::Table;
use crate::types::{EngineChoice, EngineKind, Resource, SyncMethod};

use ceiling::{Cap, CapSource, Ceiling};
use progress::Progress;

/// The idle time before each lone commit: the daemon's pause at a 1 s
/// interval ([`after_idle_pause`]). The after-idle cost grows with the
/// pause and levels off within about 50 ms on the build machine, so this
/// means what the daemon's 750 ms pause at its default 3 s interval
/// means, and keeps eight lone commits within two seconds.
pub(crate) fn after_idle_pause_default() -> Duration {
    after_idle_pause(Duration::from_secs(1))
}
/// Lone commits at most; fewer when the commit half is short.
const AFTER_IDLE_COMMITS: u32 = 8;

#[derive(Debug, Clone)]
pub(crate) struct CheckOptions {
    pub(crate) path: PathBuf,
    pub(crate) duration: Duration,
    pub(crate) sync_method: SyncMethod,
    pub(crate) engine: EngineChoice,
    pub(crate) read_file_size: u64,
    pub(crate) free_space_reserve: u64,
    pub(crate) probe_dir: Option<PathBuf>,
    pub(crate) cache_served_threshold: Duration,
    pub(crate) commit: bool,
    pub(crate) read: bool,
    /// Queue-depth sweep duration; `None` = no sweep.
    pub(crate) sweep: Option<Duration>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) path: PathBuf,
    /// The most commits per second one client can do on this volume: the
    /// lowest of [`Report::commit_ceilings`]. `None` with neither a commit
    /// probe nor a known write cap.
    pub(crate) commit_ceiling_in_force_per_second: Option<f64>,
    /// The basis of the ceiling in force: `probe_mean` or `cap`.
    pub(crate) basis: Option<&'static str>,
    /// The ceiling on every basis `check` has.
    pub(crate) commit_ceilings: Vec<Ceiling>,
    /// The one verdict: the most serious of the warnings, the sweep's
    /// plateaus, the cgroup's write cap and the audit's findings.
    pub(crate) verdict: Verdict,
    pub(crate) probe_dir: PathBuf,
    pub(crate) fstype: String,
    pub(crate) device: String,
    pub(crate) majmin: String,
    pub(crate) engine: EngineKind,
    pub(crate) engine_fallback_reason: Option<String>,
    pub(crate) sync_method: SyncMethod,
    pub(crate) duration_seconds: f64,
    pub(crate) write: Option<OpStats>,
    pub(crate) sync: Option<OpStats>,
    pub(crate) commit: Option<OpStats>,
    pub(crate) read: Option<OpStats>,
    /// Lone commits, each after [`after_idle_pause_default`] of idle.
    pub(crate) after_idle_commit: Option<OpStats>,
    /// The pause before each of them, in seconds.
    pub(crate) after_idle_pause_seconds: f64,
    pub(crate) errors: Vec<String>,
    pub(crate) reads_total: u64,
    pub(crate) cache_served_reads: u64,
    /// The write-IOPS limit on this volume's disk in the cgroup `check`
    /// ran in, when it could read one.
    pub(crate) cgroup_write_iops_cap: Option<u64>,
    pub(crate) warnings: Vec<Warning>,
    pub(crate) interrupted: bool,
    /// The sweep's 8 KiB random reads, when asked for (also the first of
    /// `sweep_tables`; kept for readers of the read-only sweep's report).
    pub(crate) sweep: Option<Vec<DepthPoint>>,
    /// Read IOPS plateau found by the sweep.
    pub(crate) sweep_plateau_read_iops: Option<f64>,
    /// Every workload of the sweep (read and write IOPS, read and write
    /// bandwidth), each with its points and plateau.
    pub(crate) sweep_tables: Option<Vec<Table>>,
    /// The storage-configuration audit of this volume and its host.
    pub(crate) audit: AuditReport,
}

/// The audit as `check` prints it: the volume's findings and the host's.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AuditReport {
    pub(crate) path: PathBuf,
    pub(crate) volume: crate::audit::Outcome,
    pub(crate) host: crate::audit::Outcome,
    /// With `--pg.dsn`: the cluster's findings.
    pub(crate) cluster: Option<crate::audit::Outcome>,
    /// With `--pg.dsn`: the server's own syncs over a few seconds, traced
    /// in the kernel, or why they could not be.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) server_syncs: Option<ServerSyncs>,
    /// Files that exist but could not be read or parsed.
    pub(crate) read_errors: Vec<String>,
}

impl AuditReport {
    /// Every finding with its scope (`volume`, `host`, `cluster`), in the
    /// order `check` prints them.
    pub(crate) fn findings(
        &self,
    ) -> impl Iterator<Item = (&'static str, &crate::audit::Finding)> + '_ {
        let cluster = self.cluster.iter().flat_map(|c| &c.findings);
        self.volume
            .findings
            .iter()
            .map(|f| ("volume", f))
            .chain(self.host.findings.iter().map(|f| ("host", f)))
            .chain(cluster.map(|f| ("cluster", f)))
    }
}

/// The server's own syncs during `check --pg.dsn`, by kind.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ServerSyncs {
    pub(crate) seconds: f64,
    /// Why they were not traced (the collector's reasons), if not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) off: Option<String>,
    pub(crate) kinds: Vec<KindSyncs>,
}

/// One kind of sync (`wal`, `data`, `other`): the count, the mean and the
/// bucket bounds (the exporter's histogram layout) of p50 and p99.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct KindSyncs {
    pub(crate) kind: &'static str,
    pub(crate) count: u64,
    pub(crate) mean_seconds: Option<f64>,
    pub(crate) p50_le_seconds: Option<f64>,
    pub(crate) p99_le_seconds: Option<f64>,
}

/// Audits the volume holding `path` and the host, from /proc and /sys.
/// `sync_too_fast` is the probe's evidence, `None` without a probe run.
pub(crate) fn audit(path: &Path, sync_too_fast: Option<bool>) -> AuditReport {
    let roots = Roots::default();
    let fs = fsinfo::lookup(path, &roots);
    let disk = fs.disk.map(|d| d.name);
    let (host_facts, mut errors) = crate::audit::read::host(&roots.proc, &roots.sys);
    let (volume_facts, e) = crate::audit::read::volume(
        &roots.proc,
        &roots.sys,
        path,
        disk.as_deref(),
        sync_too_fast,
    );
    errors.0.extend(e.0);
    AuditReport {
        path: path.to_path_buf(),
        volume: crate::audit::evaluate_volume(&volume_facts),
        host: crate::audit::evaluate_host(&host_facts),
        cluster: None,
        server_syncs: None,
        read_errors: errors.0,
    }
}

/// `check --audit-only`: the audit without any probe, in well under a
/// second.
pub(crate) fn audit_only(path: &Path) -> anyhow::Result<AuditReport> {
    let path = std::fs::canonicalize(path).with_context(|| format!("path {}", path.display()))?;
    Ok(audit(&path, None))
}

/// `check --audit-only`'s text: the verdict of the findings, then the
/// findings.
pub(crate) fn render_audit_only_text(a: &AuditReport) -> String {
    let mut o = String::new();
    write_verdict(&mut o, &audit_verdict(a));
    o.push_str(&render_audit_text(a));
    o
}

/// `check --audit-only`'s JSON: the audit with its verdict.
pub(crate) fn render_audit_only_json(a: &AuditReport) -> anyhow::Result<String> {
    #[derive(Serialize)]
    struct AuditOnly<'a> {
        #[serde(flatten)]
        audit: &'a AuditReport,
        verdict: Verdict,
    }
    serde_json::to_string_pretty(&AuditOnly {
        audit: a,
        verdict: audit_verdict(a),
    })
    .map(|s| s + "\n")
    .context("encoding JSON")
}

pub(crate) fn render_audit_text(a: &AuditReport) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let findings: Vec<_> = a.findings().collect();
    let cluster = |f: fn(&crate::audit::Outcome) -> u32| a.cluster.as_ref().map_or(0, f);
    let checked = a.volume.checked + a.host.checked + cluster(|c| c.checked);
    let skipped = a.volume.skipped + a.host.skipped + cluster(|c| c.skipped);
    if findings.is_empty() {
        let _ = writeln!(
            o,
            "audit: no findings ({checked} checks, {skipped} skipped for lack of facts)"
        );
    } else {
        let _ = writeln!(
            o,
            "audit: {} finding(s) ({checked} checks, {skipped} skipped for lack of facts)",
            findings.len()
        );
    }
    for (scope, f) in findings {
        let _ = writeln!(
            o,
            "  {} [{}] ({scope}) {}",
            f.severity.as_str().to_uppercase(),
            f.code,
            f.message
        );
        let _ = writeln!(o, "      evidence: {}", f.evidence);
        let _ = writeln!(o, "      fix: {}", f.fix);
    }
    for e in &a.read_errors {
        let _ = writeln!(o, "  could not read {e}");
    }
    if let Some(t) = &a.server_syncs {
        match &t.off {
            Some(why) => {
                let _ = writeln!(o, "server's own syncs: not traced ({why})");
            }
            None => {
                let _ = writeln!(
                    o,
                    "server's own syncs over {:.0} s (traced in the kernel):",
                    t.seconds
                );
                for k in &t.kinds {
                    let b = |v: Option<f64>| match v {
                        Some(v) if v.is_finite() => format!("<= {}", fmt_seconds(v)),
                        Some(_) => "> 10 s".to_string(),
                        None => "-".to_string(),
                    };
                    let _ = writeln!(
                        o,
                        "  {:<5} {:>6} syncs  mean {}  p50 {}  p99 {}",
                        k.kind,
                        k.count,
                        k.mean_seconds.map_or("-".to_string(), fmt_seconds),
                        b(k.p50_le_seconds),
                        b(k.p99_le_seconds)
                    );
                }
            }
        }
    }
    o
}

fn new_hist() -> anyhow::Result<Histogram<u64>> {
    // 1 ns .. 1 h, 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).context("creating histogram")
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let ns = (d.as_nanos() as u64).clamp(1, h.high());
    // Saturates rather than fails: the value is within bounds by the clamp.
    let _ = h.record(ns);
}

fn stats(h: &Histogram<u64>) -> Option<OpStats> {
    if h.is_empty() {
        return None;
    }
    let s = |ns: u64| ns as f64 / 1e9;
    Some(OpStats {
        count: h.len(),
        p50: s(h.value_at_quantile(0.5)),
        p90: s(h.value_at_quantile(0.9)),
        p99: s(h.value_at_quantile(0.99)),
        p999: s(h.value_at_quantile(0.999)),
        max: s(h.max()),
        mean: h.mean() / 1e9,
    })
}

pub(crate) fn run(opts: &CheckOptions) -> anyhow::Result<Report> {
    let (path, probe_dir) = paths(opts)?;
    let fs = fsinfo::lookup(&path, &Roots::default());
    let (mut engine, fallback) = Engine::new(opts.engine)?;
    // Ctrl-C or SIGTERM end the run early; the files are still removed.
    crate::sys::catch_interrupts();
    let m = measure_in(opts, &path, &probe_dir, &mut engine)?;

    let observed = Observed {
        fstype: &fs.fstype,
        sync_method: opts.sync_method,
        write: stats(&m.write),
        sync: stats(&m.sync),
        commit: stats(&m.commit),
        read: stats(&m.read),
        reads_total: m.read.len(),
        cache_served_reads: m.cache_served,
    };
    let warnings = verdict::warnings(&observed);
    let fast = warnings.iter().any(|w| w.code == "sync_too_fast");
    // Without a commit probe there is no evidence either way.
    let audit = audit(
        &path,
        (opts.commit && observed.commit.is_some()).then_some(fast),
    );
    let commit = observed.commit;
    let cgroup_cap = cgroup_write_iops(&fs.majmin);
    let caps = write_caps(&m.sweep, cgroup_cap);
    let busy = commit.map(|c| (c.count, c.mean, c.max));
    let commit_ceilings = ceiling::ceilings(busy, &caps, DEFAULT_WRITES_PER_COMMIT);
    let in_force = ceiling::in_force(&commit_ceilings);
    let mut report = Report {
        commit_ceiling_in_force_per_second: in_force.map(|c| c.per_second),
        basis: in_force.map(|c| c.basis),
        verdict: verdict::judge([]),
        path,
        probe_dir,
        fstype: fs.fstype.clone(),
        device: fs.device,
        majmin: fs.majmin,
        engine: engine.kind(),
        engine_fallback_reason: fallback,
        sync_method: opts.sync_method,
        duration_seconds: m.elapsed.as_secs_f64(),
        write: observed.write,
        sync: observed.sync,
        commit,
        read: observed.read,
        after_idle_commit: stats(&m.after_idle_commit),
        after_idle_pause_seconds: after_idle_pause_default().as_secs_f64(),
        errors: m.errors,
        reads_total: observed.reads_total,
        cache_served_reads: m.cache_served,
        cgroup_write_iops_cap: cgroup_cap,
        warnings,
        interrupted: crate::sys::interrupted(),
        sweep_plateau_read_iops: read_iops(&m.sweep).and_then(|t| t.detected),
        sweep: read_iops(&m.sweep).map(|t| t.points.clone()),
        sweep_tables: m.sweep,
        audit,
        commit_ceilings,
    };
    report.judge();
    Ok(report)
}

/// The directory measured (canonical) and the probe directory `check`
/// creates in it or at `--probe-dir`: never the daemon's, one PostgreSQL
/// owns, or one on another filesystem than the volume.
fn paths(opts: &CheckOptions) -> anyhow::Result<(PathBuf, PathBuf)> {
    let path = std::fs::canonicalize(&opts.path)
        .with_context(|| format!("path {}", opts.path.display()))?;
    if !path.is_dir() {
        bail!("path {} is not a directory", path.display());
    }
    let probe_dir = match &opts.probe_dir {
        Some(p) if p.is_absolute() => p.clone(),
        Some(p) => std::env::current_dir()
            .context("current directory")?
            .join(p),
        None => path.join(CHECK_DIR_NAME),
    };
    if probe_dir.ends_with(PROBE_DIR_NAME) {
        bail!(
            "{} is the daemon's probe directory; give check its own --probe-dir",
            probe_dir.display()
        );
    }
    check_probe_dir(&path, &probe_dir, Asker::Check).map_err(|m| anyhow::anyhow!(m))?;
    Ok((path, probe_dir))
}

/// Creates the probe directory, measures, and removes the probe files
/// whether the measurement succeeded or not.
fn measure_in(
    opts: &CheckOptions,
    path: &Path,
    probe_dir: &Path,
    engine: &mut Engine,
) -> anyhow::Result<Measured> {
    let dir = ProbeDir::open(probe_dir)
        .map_err(|e| cannot_create(e, probe_dir.parent().unwrap_or(path)))?;
    let result = {
        // Gone (and its line erased) before anything else is written.
        let progress = Progress::new();
        measure(opts, &dir, engine, &progress)
    };
    let problems = dir.remove_all();
    for p in problems {
        tracing::error!(problem = %p, "could not remove probe file");
    }
    result
}

/// The write-IOPS caps `check` knows: the sweep's write plateau and the
/// cgroup's limit, each a basis of the commit ceiling.
fn write_caps(sweep: &Option<Vec<Table>>, cgroup_cap: Option<u64>) -> Vec<Cap> {
    let sweep_write_iops = sweep
        .iter()
        .flatten()
        .find(|t| t.resource == Resource::WriteIops)
        .and_then(|t| t.detected);
    sweep_write_iops
        .map(|c| Cap {
            write_iops: c,
            source: CapSource::Sweep,
        })
        .into_iter()
        .chain(cgroup_cap.map(|c| Cap {
            write_iops: c as f64,
            source: CapSource::Cgroup,
        }))
        .collect()
}

impl Report {
    /// Sets [`Report::verdict`] from everything the report holds; again
    /// after a cluster's findings are added to [`Report::audit`].
    pub(crate) fn judge(&mut self) {
        self.verdict = judge(self);
    }
}

/// The one verdict of a report: each warning of the probes, each plateau
/// of the sweep and a cgroup's write cap at `warning`, each audit finding
/// at its own severity (advice, `info`, is no reason).
pub(crate) fn judge(r: &Report) -> Verdict {
    let ceiling = r
        .commit_ceiling_in_force_per_second
        .map(|c| format!("; one client's commits: at most {}/s", fmt_rate(c)))
        .unwrap_or_default();
    let probe = r.warnings.iter().map(|w| Reason {
        level: Level::Warning,
        source: "probe",
        code: w.code.to_string(),
        message: w.message.clone(),
    });
    let plateaus = r.sweep_tables.iter().flatten().filter_map(|t| {
        let cap = t.detected?;
        let w = t.workload();
        let (value, unit) = if w.in_bytes() {
            (format!("{:.1}", cap / (1u64 << 20) as f64), "MiB/s")
        } else {
            (fmt_rate(cap), "IOPS")
        };
        let commits = if t.resource == Resource::WriteIops {
            ceiling.as_str()
        } else {
            ""
        };
        Some(Reason {
            level: Level::Warning,
            source: "sweep",
            code: format!("{}_plateau", t.resource.as_str()),
            message: format!(
                "the queue-depth sweep found a plateau at {value} {unit} ({}): deeper queues add \
                 latency, not throughput, so a cap (cgroup, cloud volume) or the device's limit \
                 bounds this volume{commits}",
                w.name()
            ),
        })
    });
    let cgroup = r.cgroup_write_iops_cap.map(|c| Reason {
        level: Level::Warning,
        source: "cgroup",
        code: "cgroup_write_iops_cap".to_string(),
        message: format!("this cgroup caps writes to the volume's disk at {c} IOPS{ceiling}"),
    });
    verdict::judge(
        probe
            .chain(plateaus)
            .chain(cgroup)
            .chain(audit_reasons(&r.audit)),
    )
}

/// The exit status of a run whose verdict reached `--fail-on`: distinct
/// from 1 (an error), 2 (invalid input) and 130 (interrupted).
pub(crate) const EXIT_VERDICT: u8 = 3;

/// Each audit finding as a reason, at its own severity (advice, `info`,
/// sets no level).
fn audit_reasons(a: &AuditReport) -> impl Iterator<Item = Reason> + '_ {
    a.findings().map(|(scope, f)| Reason {
        level: match f.severity {
            crate::audit::Severity::Critical => Level::Critical,
            crate::audit::Severity::Warning => Level::Warning,
            crate::audit::Severity::Info => Level::Ok,
        },
        source: scope,
        code: f.code.to_string(),
        message: f.message.clone(),
    })
}

/// The verdict of `check --audit-only`: the audit's findings alone.
pub(crate) fn audit_verdict(a: &AuditReport) -> Verdict {
    verdict::judge(audit_reasons(a))
}

/// The `write_iops` limit on disk `majmin` that applies to this process:
/// the tightest along its cgroup path, v2 `io.max` or v1 blkio, read with
/// the limits collector's reader. `None` when there is none, or it cannot
/// be read (no cgroup file system, a private mount namespace, a container
/// that sees only part of the tree): then only the sweep can find a cap.
fn cgroup_write_iops(majmin: &str) -> Option<u64> {
    use crate::limits::cgroup;
    if majmin.is_empty() {
        return None;
    }
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = cgroup::parse_proc_cgroup(&text).ok()?;
    let loc = cgroup::locate(Path::new("/sys/fs/cgroup"), &own).ok()??;
    cgroup::effective_limits(&loc, majmin).ok()?.write_iops
}

fn read_iops(tables: &Option<Vec<Table>>) -> Option<&Table> {
    tables
        .as_ref()?
        .iter()
        .find(|t| t.resource == Resource::ReadIops)
}

/// A probe directory that cannot be created for lack of permission (or on
/// a read-only filesystem) says so once, with what to do; other set-up
/// errors are passed on as they are.
fn cannot_create(e: SetupError, path: &Path) -> anyhow::Error {
    let denied = matches!(
        &e,
        SetupError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::PermissionDenied
                || source.raw_os_error() == Some(libc::EROFS)
    );
    if denied {
        anyhow::anyhow!(
            "{e}; run check as a user that may write to {}, or give --probe-dir \
             (a directory on the same volume that this user may write to)",
            path.display()
        )
    } else {
        anyhow::Error::new(e)
    }
}

struct Measured {
    sweep: Option<Vec<Table>>,
    write: Histogram<u64>,
    sync: Histogram<u64>,
    commit: Histogram<u64>,
    read: Histogram<u64>,
    after_idle_commit: Histogram<u64>,
    cache_served: u64,
    errors: Vec<String>,
    elapsed: Duration,
}

fn measure(
    opts: &CheckOptions,
    dir: &ProbeDir,
    engine: &mut Engine,
    progress: &Progress,
) -> anyhow::Result<Measured> {
    let mut m = Measured {
        sweep: None,
        write: new_hist()?,
        sync: new_hist()?,
        commit: new_hist()?,
        read: new_hist()?,
        after_idle_commit: new_hist()?,
        cache_served: 0,
        errors: Vec::new(),
        elapsed: Duration::ZERO,
    };
    let phases = u32::from(opts.commit) + u32::from(opts.read);
    if phases == 0 && opts.sweep.is_none() {
        bail!("nothing to do: both --no-commit and --no-read given");
    }
    let phase = opts.duration / phases.max(1);
    // Planned time of each part, for the progress line's time left.
    let reads_planned = if opts.read { phase } else { Duration::ZERO };
    let sweep_planned = opts.sweep.unwrap_or_default();
    let commits_planned = if opts.commit { phase } else { Duration::ZERO };
    progress.phase(
        "setup",
        Duration::ZERO,
        commits_planned + reads_planned + sweep_planned,
    );
    // Time spent probing only; creating the probe files is not part of it.
    let mut probing = Duration::ZERO;
    let stopped = crate::sys::interrupted;

    if opts.commit {
        probing += commits(
            opts,
            dir,
            engine,
            progress,
            phase,
            reads_planned + sweep_planned,
            &mut m,
        )?;
    }
    let mut read_file: Option<std::fs::File> = None;
    if opts.read && !stopped() {
        progress.phase("setup", Duration::ZERO, reads_planned + sweep_planned);
        let read = match dir.create_read_file(opts.read_file_size, opts.free_space_reserve) {
            Ok(f) => f,
            Err(e @ crate::probe::files::SetupError::DirectIoUnsupported { .. }) => {
                // Still worth reporting the commit figures (and the warning
                // that this filesystem is not a disk).
                m.errors.push(format!("read probe skipped: {e}"));
                m.elapsed = probing;
                return Ok(m);
            }
            Err(e) => return Err(e.into()),
        };
        progress.phase("reads", phase, sweep_planned);
        probing += reads(opts, &read, engine, phase, &mut m)?;
        read_file = Some(read);
    }
    if let Some(d) = opts.sweep
        && !stopped()
    {
        sweep(opts, dir, engine, progress, read_file.take(), d, &mut m)?;
    }
    m.elapsed = probing;
    Ok(m)
}

/// At most ten errors are kept for the report.
fn note_error(e: String, errors: &mut Vec<String>) {
    if errors.len() < 10 {
        errors.push(e);
    }
}

/// The commit half: back-to-back commits for most of `phase`, then lone
/// commits after a pause. `later`: the time planned for the parts after
/// it. Returns the time spent probing.
fn commits(
    opts: &CheckOptions,
    dir: &ProbeDir,
    engine: &mut Engine,
    progress: &Progress,
    phase: Duration,
    later: Duration,
    m: &mut Measured,
) -> anyhow::Result<Duration> {
    let wal = dir.create_wal_file(WAL_FILE_SIZE, opts.sync_method, opts.free_space_reserve)?;
    let blocks = WAL_FILE_SIZE / BLOCK_SIZE as u64;
    // Lone commits take at most half of the commit half.
    let pause = after_idle_pause_default();
    let lone =
        AFTER_IDLE_COMMITS.min((phase / 2).as_millis() as u32 / (pause.as_millis() as u32).max(1));
    let busy_phase = phase.saturating_sub(pause * lone);
    // The next block of the file, written and synced; an error is noted
    // and the block skipped. (Commits are plain syscalls: they cannot
    // poison the engine.)
    let mut block = 0u64;
    let mut commit_next = |errors: &mut Vec<String>| {
        let r = engine.commit(raw(&wal), block * BLOCK_SIZE as u64, opts.sync_method);
        block = (block + 1) % blocks;
        r.map_err(|f| note_error(f.to_string(), errors)).ok()
    };
    let pauses = pause * lone;
    progress.phase("commits", busy_phase, pauses + later);
    let t0 = Instant::now();
    while t0.elapsed() < busy_phase && !crate::sys::interrupted() {
        if let Some(t) = commit_next(&mut m.errors) {
            record(&mut m.write, t.write);
            if let Some(s) = t.sync {
                record(&mut m.sync, s);
            }
            record(&mut m.commit, t.commit);
        }
    }
    progress.phase("pauses", pauses, later);
    for _ in 0..lone {
        if crate::sys::interrupted() {
            break;
        }
        std::thread::sleep(pause);
        if let Some(t) = commit_next(&mut m.errors) {
            record(&mut m.after_idle_commit, t.commit);
        }
    }
    Ok(t0.elapsed())
}

/// Random reads of `read` for `phase`. Returns the time spent probing.
fn reads(
    opts: &CheckOptions,
    read: &std::fs::File,
    engine: &mut Engine,
    phase: Duration,
    m: &mut Measured,
) -> anyhow::Result<Duration> {
    let blocks = opts.read_file_size / BLOCK_SIZE as u64;
    let mut rng = Rng::seeded();
    let t0 = Instant::now();
    while t0.elapsed() < phase && !crate::sys::interrupted() {
        match engine.read(raw(read), rng.below(blocks) * BLOCK_SIZE as u64) {
            Ok(d) => {
                record(&mut m.read, d);
                if d < opts.cache_served_threshold {
                    m.cache_served += 1;
                }
            }
            Err(f) => note_error(f.to_string(), &mut m.errors),
        }
        if engine.is_poisoned() {
            bail!("the IO engine failed; see errors above");
        }
    }
    Ok(t0.elapsed())
}

/// The queue-depth sweep for `d`, on the read probe's file when the read
/// half made one.
fn sweep(
    opts: &CheckOptions,
    dir: &ProbeDir,
    engine: &Engine,
    progress: &Progress,
    read_file: Option<std::fs::File>,
    d: Duration,
    m: &mut Measured,
) -> anyhow::Result<()> {
    if engine.kind() != EngineKind::IoUring {
        m.errors
            .push("sweep skipped: it needs io_uring".to_string());
    } else {
        let read = match read_file {
            Some(f) => f,
            None => dir.create_read_file(opts.read_file_size, opts.free_space_reserve)?,
        };
        progress.phase("sweep", d, Duration::ZERO);
        let tables = crate::probe::sweep::run_in(
            dir,
            &read,
            opts.read_file_size,
            opts.free_space_reserve,
            d,
            &crate::sys::interrupted,
            |e| m.errors.push(format!("sweep writes skipped: {e}")),
        );
        m.sweep = Some(tables.map_err(|e| anyhow::anyhow!("queue-depth sweep: {e}"))?);
    }
    Ok(())
}

/// One workload of the sweep: its depths, rate, latency and plateau.
fn write_sweep_table(o: &mut String, t: &Table) {
    use std::fmt::Write;
    let w = t.workload();
    let mib = |b: f64| format!("{:.1}", b / (1u64 << 20) as f64);
    let unit = if w.in_bytes() { "MiB/s" } else { "IOPS" };
    let what = w.name();
    let fmt = |v: f64| {
        if w.in_bytes() { mib(v) } else { fmt_rate(v) }
    };
    let _ = writeln!(o);
    let _ = writeln!(o, "  queue-depth sweep, {}:", w.describe());
    let _ = writeln!(
        o,
        "  {:>6}{:>11}{:>11}{:>11}{:>16}",
        "depth",
        unit,
        "mean",
        "p99",
        if w.in_bytes() {
            "depth×size/lat"
        } else {
            "depth/latency"
        }
    );
    for p in &t.points {
        let depth = if p.cut_short {
            format!("{}*", p.depth)
        } else {
            p.depth.to_string()
        };
        let _ = writeln!(
            o,
            "  {:>6}{:>11}{:>11}{:>11}{:>16}",
            depth,
            fmt(w.rate(p)),
            fmt_seconds(p.mean),
            fmt_seconds(p.p99),
            fmt(w.in_unit(p.littles_law_iops()))
        );
    }
    if t.points.iter().any(|p| p.cut_short) {
        let _ = writeln!(
            o,
            "  * ended early, on its share of the sweep's write budget: a rate held for \
             milliseconds, so no cap is read from it"
        );
    }
    match t.detected {
        Some(cap) => {
            let _ = writeln!(
                o,
                "  plateau at {} {unit} ({what}): deeper queues add latency, not throughput. A cap \
                 (cgroup, cloud volume) or the device's limit",
                fmt(cap)
            );
        }
        None => {
            let _ = writeln!(
                o,
                "  no {what} cap within these depths: it grows with depth, or not steadily"
            );
        }
    }
}

fn fmt_rate(r: f64) -> String {
    let n = r.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(crate) fn render_text(r: &Report) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "pg-storage-exporter check {}", r.path.display());
    write_lead(&mut o, r);
    let _ = writeln!(o);
    write_setup(&mut o, r);
    let _ = writeln!(o);
    write_latencies(&mut o, r);
    let _ = writeln!(o);
    write_ceilings(&mut o, r);
    if r.reads_total > 0 {
        let _ = writeln!(
            o,
            "  reads served by a cache below the OS: {} of {}",
            r.cache_served_reads, r.reads_total
        );
    }
    for e in &r.errors {
        let _ = writeln!(o, "  error: {e}");
    }
    for t in r.sweep_tables.iter().flatten() {
        write_sweep_table(&mut o, t);
    }
    let _ = writeln!(o);
    if r.interrupted {
        let _ = writeln!(
            o,
            "  interrupted: figures cover only the time before the signal"
        );
    }
    o.push_str(&render_audit_text(&r.audit));
    o
}

/// Where and how the probes ran: filesystem, engine, sync method, time.
fn write_setup(o: &mut String, r: &Report) {
    use std::fmt::Write;
    let _ = writeln!(
        o,
        "  filesystem   {} on {} ({})",
        r.fstype,
        r.device,
        if r.majmin.is_empty() { "?" } else { &r.majmin }
    );
    let _ = write!(o, "  engine       {}", r.engine);
    if let Some(reason) = &r.engine_fallback_reason {
        let _ = write!(o, " (io_uring unavailable: {reason})");
    }
    let _ = writeln!(o);
    let how = if r.sync_method.has_sync_call() {
        format!(
            "8 KiB write, then {} (PostgreSQL wal_sync_method = {})",
            r.sync_method, r.sync_method
        )
    } else {
        format!(
            "8 KiB write to a file opened {} (wal_sync_method = {})",
            if r.sync_method == SyncMethod::OpenDatasync {
                "O_DSYNC"
            } else {
                "O_SYNC"
            },
            r.sync_method
        )
    };
    let _ = writeln!(o, "  sync method  {how}");
    let _ = writeln!(
        o,
        "  ran          {:.1} s, queue depth 1",
        r.duration_seconds
    );
}

/// One line of latency figures per probed operation.
fn write_latencies(o: &mut String, r: &Report) {
    use std::fmt::Write;
    let _ = writeln!(
        o,
        "  {:<7}{:>9}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "op", "count", "p50", "p90", "p99", "p99.9", "max", "mean"
    );
    for (name, s) in [
        ("write", r.write),
        ("sync", r.sync),
        ("commit", r.commit),
        ("read", r.read),
    ] {
        if let Some(s) = s {
            let _ = writeln!(
                o,
                "  {:<7}{:>9}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
                name,
                s.count,
                fmt_seconds(s.p50),
                fmt_seconds(s.p90),
                fmt_seconds(s.p99),
                fmt_seconds(s.p999),
                fmt_seconds(s.max),
                fmt_seconds(s.mean)
            );
        }
    }
}

/// The commit ceiling on each basis, then what the commit latencies (back
/// to back and after a pause) say about it.
fn write_ceilings(o: &mut String, r: &Report) {
    use std::fmt::Write;
    if r.commit_ceilings.is_empty() {
        let _ = writeln!(o, "  commit ceiling: not measured");
    } else {
        let _ = writeln!(
            o,
            "  commit ceiling, one client, on each basis (the lowest is in force):"
        );
        for c in &r.commit_ceilings {
            let _ = writeln!(
                o,
                "    {:<11}{:>9} commits/s   {}",
                c.basis,
                fmt_rate(c.per_second),
                c.describe()
            );
        }
        let _ = writeln!(
            o,
            "    (statement work and network round trips come on top; group commit lets many\n     clients together go higher)"
        );
    }
    if let Some(c) = r.commit {
        let _ = writeln!(
            o,
            "  commit latency, back to back: p50 {}, p99 {}, mean {}; latencies, not rates: under a\n    throttle most commits pass at device speed and a few wait a whole slice, and only\n    the mean carries the rate",
            fmt_seconds(c.p50),
            fmt_seconds(c.p99),
            fmt_seconds(c.mean)
        );
    }
    if let Some(a) = r.after_idle_commit {
        let _ = writeln!(
            o,
            "  after a pause: a lone commit after {} idle waits {} (p50 of {}; max {}); the table\n    above is back to back, what commits cost while the storage is busy",
            fmt_seconds(r.after_idle_pause_seconds),
            fmt_seconds(a.p50),
            a.count,
            fmt_seconds(a.max)
        );
    }
}

/// The report's first lines: the ceiling in force in plain words, then the
/// verdict with every reason for it, before any detail.
fn write_lead(o: &mut String, r: &Report) {
    use std::fmt::Write;
    let in_force = r
        .basis
        .and_then(|b| r.commit_ceilings.iter().find(|c| c.basis == b));
    match (r.commit_ceiling_in_force_per_second, in_force) {
        (Some(rate), Some(c)) => {
            let _ = writeln!(
                o,
                "One client can commit at most {} times per second on this volume\n  (basis: {}, {})",
                fmt_rate(rate),
                c.basis,
                c.describe()
            );
        }
        _ => {
            let _ = writeln!(
                o,
                "No commit ceiling: no commit probe ran and no write-IOPS cap is known"
            );
        }
    }
    write_verdict(o, &r.verdict);
}

/// "verdict: LEVEL (n reasons)" and one line per reason; "OK, no warnings"
/// only when there is no reason at all.
fn write_verdict(o: &mut String, v: &Verdict) {
    use std::fmt::Write;
    match v.reasons.len() {
        0 => {
            let _ = writeln!(o, "verdict: OK, no warnings");
        }
        n => {
            let _ = writeln!(
                o,
                "verdict: {} ({n} reason{})",
                v.level.as_str().to_uppercase(),
                if n == 1 { "" } else { "s" }
            );
        }
    }
    for reason in &v.reasons {
        let _ = writeln!(
            o,
            "  {} [{}] ({}) {}",
            reason.level.as_str().to_uppercase(),
            reason.code,
            reason.source,
            reason.message
        );
    }
}

pub(crate) fn render_json(r: &Report) -> anyhow::Result<String> {
    serde_json::to_string_pretty(r)
        .map(|s| s + "\n")
        .context("encoding JSON")
}
