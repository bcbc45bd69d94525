//! The status page `/`: how fast the databases on this host can commit and
//! read right now, and what caps them. Server-rendered HTML, one table per
//! section, from ONE [`ScrapeSnapshot`] like a scrape of `/metrics`, so the
//! page and the metrics taken at the same moment agree (the ceiling in
//! force is computed by the same function).
//!
//! Every value that comes from configuration, the OS or PostgreSQL (volume
//! names, paths, devices, error texts, the audit's evidence) goes through
//! [`esc`].
//!
//! Every figure says what it is over, beside it: the sliding window (and
//! how long it is), the latest limits or audit pass, the last minute, or
//! the time since start. The same name can mean another span elsewhere
//! (the shipped alerts take 5-minute rates), and a reader comparing the
//! two must see which.

mod audit;
mod text;

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

use crate::audit::AuditSnapshot;
use crate::exposition::ScrapeSnapshot;
use crate::exposition::derived::{ceiling_in_force, commit_bases};
use crate::limits::LimitsSnapshot;
use crate::limits::caps::WritesPerCommit;
use crate::model::ceiling::sync_ratio;
use crate::model::verdict::{Observed, OpStats, fmt_seconds, warnings};
use crate::postgres::ClusterSnapshot;
use crate::probe::counts::SetupNote;
use crate::probe::state::{Snapshot, VolumeState};
use crate::types::{Op, Phase, series};

use self::audit::{Audited, Of, audited};
use self::text::{ago, esc, span};
use super::state::AppState;

/// PostgreSQL's WAL syncs this many times slower than the probe's is worth
/// a sentence: something slows PostgreSQL that the probe does not feel.
const SLOW_PG_SYNC_RATIO: f64 = 2.0;
/// A cap used this much is worth a sentence: IO beyond it waits.
const BUSY_CAP: f64 = 0.9;

/// `GET /`. Rendering walks every volume and cluster: off the async
/// workers, as `/metrics` encoding is.
pub(crate) async fn page(State(s): State<Arc<AppState>>) -> Response {
    let metrics = s.metrics.clone();
    let path = s.telemetry_path.clone();
    let rendered = tokio::task::spawn_blocking(move || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        render(&metrics.snapshot(), &path, now)
    })
    .await;
    match rendered {
        Ok(body) => Html(body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "rendering the status page failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "rendering the status page failed\n",
            )
                .into_response()
        }
    }
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;max-width:72em}\
table{border-collapse:collapse;margin:.4em 0 1em}\
td,th{padding:.2em .7em;text-align:left;border-bottom:1px solid #ddd;vertical-align:top}\
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.bad{color:#a00;font-weight:bold}.ok{color:#070}h2{margin-top:1.6em;border-top:2px solid #888;padding-top:.4em}\
h3{margin:.8em 0 .2em;font-size:1em}ul.findings li{margin:.2em 0}\
.warn{color:#a50;font-weight:bold}.not-checked{color:#666;font-style:italic}\
table.audit{width:100%}td.evidence,td.fix{font-family:monospace;font-size:.9em}.span{color:#555;font-weight:normal}";

/// The whole page for one snapshot; `now_unix` dates the page and the ages
/// of errors.
pub(crate) fn render(snap: &ScrapeSnapshot, telemetry_path: &str, now_unix: f64) -> String {
    let mut o = String::with_capacity(16 * 1024);
    let path = esc(telemetry_path);
    let _ = write!(
        o,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>pg-storage-exporter status</title>\
         <style>{STYLE}</style></head><body>\
         <h1>pg-storage-exporter {version}</h1>\
         <p>How fast PostgreSQL can commit and read on each volume right now, what caps it, and \
         what the <a href=\"#audit\">storage-configuration audit</a> found. \
         Each figure says what it is over: the sliding window and its length, the latest limits \
         or audit pass, or the time since start; <a href=\"{path}\">{path}</a> has them as \
         metrics, <a href=\"/healthz\">/healthz</a> answers liveness.</p>\
         <p>Busy: the recorded part of each burst of back-to-back probes (the second half of its \
         commits, or whole throttle cycles where it met a throttle; its reads over an 8 ms span \
         after a warm-up), what an IO costs while \
         the storage is busy. After idle: the lone probe of each interval, what an IO costs \
         after a pause.</p>",
        version = env!("CARGO_PKG_VERSION"),
    );

    if snap.volumes.is_empty() {
        o.push_str("<h2 id=\"summary\">Volumes</h2><p>No volume is probed.</p>");
    } else {
        let mut sections = String::with_capacity(8 * 1024);
        let w = windows(snap.volumes.iter().map(|(v, _)| v.window));
        let _ = write!(
            o,
            "<h2 id=\"summary\">Volumes</h2><table class=\"summary\"><tr><th>volume</th>\
             <th>commit ceiling in force</th><th>set by</th><th>commit p50 busy{w}</th>\
             <th>commit p50 after idle{w}</th><th>read p50 busy{w}</th>\
             <th>read p50 after idle{w}</th><th>findings <span class=\"span\">(probe, \
             <a href=\"#audit\">audit</a>)</span></th></tr>",
        );
        for (v, s) in &snap.volumes {
            let audit = audited(&snap.audit, Of::Volume, &v.name);
            let findings = volume(&mut sections, v, s, snap, audit);
            let (ceiling, basis) =
                match ceiling_in_force(&commit_bases(v, s, &snap.clusters, &snap.limits)) {
                    Some((b, c)) => (
                        format!("{} commits/s", num(c)),
                        format!("{b} <span class=\"span\">{}</span>", basis_over(b, v, snap)),
                    ),
                    None => ("-".to_string(), "-".to_string()),
                };
            let p50 =
                |op, phase| opt_seconds(s.quantiles(op, phase).and_then(|q| q.first()).copied());
            let _ = write!(
                o,
                "<tr><td>{}</td><td class=\"n\">{ceiling}</td><td>{basis}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td>{}</td></tr>",
                esc(&v.name),
                p50(Op::Commit, Phase::Busy),
                p50(Op::Commit, Phase::AfterIdle),
                p50(Op::Read, Phase::Busy),
                p50(Op::Read, Phase::AfterIdle),
                audit::findings_cell(Of::Volume, &v.name, findings, audit),
            );
        }
        o.push_str("</table>");
        o.push_str(&sections);
    }
    clusters(&mut o, &snap.clusters, &snap.audit, now_unix);
    syncs(&mut o, &snap.syncs);
    let volumes: Vec<&str> = snap.volumes.iter().map(|(v, _)| v.name.as_str()).collect();
    let clusters: Vec<&str> = snap.clusters.iter().map(|c| c.name.as_str()).collect();
    audit::section(&mut o, &snap.audit, &volumes, &clusters, now_unix);
    health(&mut o, snap);
    o.push_str("</body></html>\n");
    o
}

fn opt_seconds(x: Option<f64>) -> String {
    x.map(fmt_seconds).unwrap_or_else(|| "-".to_string())
}

/// A rate with 3 significant digits (at least the units).
fn num(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// ", last 15 min" for a column header when every row has that window,
/// else ", each row's window" (each figure is then over its own).
fn windows(mut all: impl Iterator<Item = std::time::Duration>) -> String {
    let Some(first) = all.next() else {
        return String::new();
    };
    if all.all(|w| w == first) {
        format!(
            " <span class=\"span\">last {}</span>",
            span(first.as_secs_f64())
        )
    } else {
        " <span class=\"span\">over each row's window</span>".to_string()
    }
}

fn percent(r: f64) -> String {
    format!("{:.0} %", r * 100.0)
}

fn cap_value(resource: &str, value: f64) -> String {
    if resource.contains("bytes") {
        format!("{:.1} MB/s", value / 1e6)
    } else {
        format!("{value:.0} IOPS")
    }
}

/// What a basis of the commit ceiling is computed over (`probe_mean`,
/// `cap`): the probe's window, or the cap as the latest limits pass read it.
fn basis_span(basis: &str, v: &VolumeState, s: &Snapshot, limits: &LimitsSnapshot) -> String {
    match basis {
        "probe_mean" => {
            let phase = match s.rate_phase(Op::Commit) {
                Some(Phase::AfterIdle) => "after-idle probes (bursts are off)",
                _ => "busy bursts",
            };
            format!(
                "the last {} (the window), {phase}",
                span(v.window.as_secs_f64())
            )
        }
        "cap" => {
            let writes = match limits.cap_basis(&v.name).map(|b| b.writes_source) {
                Some(WritesPerCommit::Measured) => {
                    "device writes per commit counted between limits passes"
                }
                _ => "the default device writes per commit (none attributable here)",
            };
            format!("the cap as the latest limits pass read it; {writes}")
        }
        _ => String::new(),
    }
}

/// What the basis in force is over, in short, for the summary row.
fn basis_over(basis: &str, v: &VolumeState, snap: &ScrapeSnapshot) -> String {
    let window = match basis {
        "probe_mean" => Some(v.window),
        "postgres" => snap
            .clusters
            .iter()
            .find(|c| c.wal_volume() == Some(v.name.as_str()))
            .map(|c| c.window),
        _ => None,
    };
    match window {
        Some(w) => format!("last {}", span(w.as_secs_f64())),
        None => "latest limits pass".to_string(),
    }
}

/// What a cluster's `postgres` basis is over: its window.
fn basis_span_postgres(c: &ClusterSnapshot) -> String {
    format!(
        "the last {} (the window) of cluster {}",
        span(c.window.as_secs_f64()),
        esc(&c.name)
    )
}

/// What a basis of the commit ceiling is, in words.
fn basis_words(basis: &str) -> &'static str {
    match basis {
        "probe_mean" => {
            "1 / the mean busy commit probe (WAL write + sync; whole throttle cycles where a \
             burst met a throttle)"
        }
        "postgres" => {
            "1 / (PostgreSQL's own mean WAL write + sync time per sync, over the intervals of \
             one commit per sync, + the fastest SELECT 1 round trip)"
        }
        "cap" => "a write-IOPS cap / the device writes one commit costs",
        _ => "",
    }
}

fn op_stats(s: &Snapshot, op: Op, phase: Phase) -> Option<OpStats> {
    let q = s.quantiles(op, phase)?;
    let at = |i: usize| q.get(i).copied().unwrap_or(f64::NAN);
    Some(OpStats {
        count: s.samples[series(op, phase)] as u64,
        p50: at(0),
        p90: at(1),
        p99: at(2),
        p999: at(3),
        max: at(4),
        mean: s.mean(op, phase).unwrap_or(f64::NAN),
    })
}

/// One volume's section; returns how many findings the page itself has
/// for it (from the probe, its window and the IO caps); the audit's are
/// listed after them and counted by the audit.
fn volume(
    o: &mut String,
    v: &VolumeState,
    s: &Snapshot,
    snap: &ScrapeSnapshot,
    audit: Audited<'_>,
) -> usize {
    let name = esc(&v.name);
    let _ = write!(o, "<h2 id=\"volume-{name}\">Volume {name}</h2>");
    let setup_note = v.counts.last_setup_error();
    probe_table(o, v, s, setup_note.as_ref());
    latency_table(o, v, s);
    let mut findings: Vec<String> = Vec::new();
    commit_ceiling(o, v, s, snap, &mut findings);
    caps(o, &v.name, &snap.limits, &mut findings);
    probe_errors(o, v, setup_note.as_ref(), &mut findings);
    probe_findings(v, s, &snap.clusters, &mut findings);
    let own = findings.len();
    findings.extend(audit::notes(Of::Volume, &v.name, audit));
    findings_list(o, v.window, &findings);
    own
}

/// What is probed on the volume and how.
fn probe_table(o: &mut String, v: &VolumeState, s: &Snapshot, setup_note: Option<&SetupNote>) {
    let probes = match (v.commit_probe, v.read_probe) {
        (true, true) => "commit, read",
        (true, false) => "commit",
        (false, true) => "read",
        _ => "none",
    };
    let disk = match (&s.fs.disk, &s.fs.disk_reason) {
        (Some(d), _) => format!("{} ({})", esc(&d.name), esc(&d.majmin)),
        (None, Some(r)) => format!("unknown: {}", esc(r)),
        (None, None) => "unknown".to_string(),
    };
    let in_flight = match s.in_flight {
        Some((op, age)) => format!("{op} for {}", fmt_seconds(age.as_secs_f64())),
        None => "none".to_string(),
    };
    let _ = write!(
        o,
        "<h3>Probe</h3><table class=\"probe\">\
         <tr><th>path</th><td>{path}</td></tr>\
         <tr><th>probe directory</th><td>{dir}</td></tr>\
         <tr><th>device</th><td>{dev} ({fstype})</td></tr>\
         <tr><th>whole disk</th><td>{disk}</td></tr>\
         <tr><th>engine</th><td>{engine}</td></tr>\
         <tr><th>sync method</th><td>{sync}</td></tr>\
         <tr><th>probes</th><td>{probes}</td></tr>\
         <tr><th>in flight</th><td>{in_flight}</td></tr></table>",
        path = esc(&v.path.display().to_string()),
        dir = esc(&v.probe_dir_path.display().to_string()),
        dev = esc(&s.fs.device),
        fstype = esc(&s.fs.fstype),
        engine = match (s.engine, setup_note) {
            (None, _) => "not set up".to_string(),
            (Some(e), Some(n)) if n.cause != "no_direct_io" => {
                format!("{} (probe files not set up)", e.as_str())
            }
            (Some(e), _) => e.as_str().to_string(),
        },
        sync = if v.commit_probe {
            v.sync_method.as_str()
        } else {
            "-"
        },
    );
}

/// The probes' latency: busy and after idle.
fn latency_table(o: &mut String, v: &VolumeState, s: &Snapshot) {
    let _ = write!(
        o,
        "<h3>Latency, last {} (the window)</h3><table class=\"latency\"><tr><th>op</th>\
         <th>busy p50</th><th>busy p99</th><th>after idle p50</th><th>after idle p99</th>\
         <th>samples (busy / after idle)</th></tr>",
        span(v.window.as_secs_f64())
    );
    let mut ops = Vec::new();
    if v.commit_probe {
        ops.push(Op::Commit);
        if v.sync_method.has_sync_call() {
            ops.push(Op::Sync);
        }
    }
    if v.read_probe {
        ops.push(Op::Read);
    }
    for op in ops {
        let q = |phase: Phase, i: usize| {
            opt_seconds(s.quantiles(op, phase).and_then(|q| q.get(i)).copied())
        };
        let _ = write!(
            o,
            "<tr><td>{op}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{} / {}</td></tr>",
            q(Phase::Busy, 0),
            q(Phase::Busy, 2),
            q(Phase::AfterIdle, 0),
            q(Phase::AfterIdle, 2),
            s.samples[series(op, Phase::Busy)],
            s.samples[series(op, Phase::AfterIdle)],
        );
    }
    o.push_str("</table>");
}

/// The commit ceilings of every basis and the one in force, with a finding
/// when a write-IOPS cap holds commits below what the storage answers.
fn commit_ceiling(
    o: &mut String,
    v: &VolumeState,
    s: &Snapshot,
    snap: &ScrapeSnapshot,
    findings: &mut Vec<String>,
) {
    let bases = commit_bases(v, s, &snap.clusters, &snap.limits);
    let in_force = ceiling_in_force(&bases);
    if v.commit_probe || !bases.is_empty() {
        o.push_str("<h3>Commit ceiling</h3>");
        match in_force {
            Some((basis, c)) => {
                let _ = write!(
                    o,
                    "<p class=\"in-force\">Ceiling in force: <b>{} commits/s</b> for one client, \
                     set by <b>{basis}</b>.</p>",
                    num(c)
                );
            }
            None => o.push_str(
                "<p class=\"in-force\">Ceiling in force: unknown (no commit probe, \
                 PostgreSQL sync time or write-IOPS cap yet).</p>",
            ),
        }
        if v.commit_probe
            && s.rate_phase(Op::Commit).is_none()
            && let (Some(need), Some(bursts)) = (s.rate_min_samples[0], s.rate_min_bursts[0])
        {
            let _ = write!(
                o,
                "<p>The probe's ceilings wait for {bursts} bursts and {need} busy commits in the \
                 window, the last {} ({} bursts, {} commits so far): one burst is one moment of \
                 the host, and they are read from several.</p>",
                span(v.window.as_secs_f64()),
                s.bursts[0],
                s.samples[series(Op::Commit, Phase::Busy)]
            );
        }
        if !bases.is_empty() {
            o.push_str(
                "<table class=\"ceiling\"><tr><th>basis</th><th>commits/s</th>\
                 <th>what it is</th><th>over</th><th>in force</th></tr>",
            );
            // commit_bases lists one postgres basis per cluster whose WAL
            // is on the volume, in the order of the clusters.
            let mut wal_clusters = snap
                .clusters
                .iter()
                .filter(|c| c.wal_volume() == Some(v.name.as_str()));
            for (basis, c) in &bases {
                let on = in_force.is_some_and(|(b, x)| b == *basis && x == *c);
                let over = match *basis {
                    "postgres" => wal_clusters.next().map(basis_span_postgres),
                    b => Some(basis_span(b, v, s, &snap.limits)),
                };
                let _ = write!(
                    o,
                    "<tr><td>{basis}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td>\
                     <td>{}</td></tr>",
                    num(*c),
                    basis_words(basis),
                    over.unwrap_or_default(),
                    if on { "<b>yes</b>" } else { "" }
                );
            }
            o.push_str("</table>");
        }
        if let Some(("cap", c)) = in_force
            && let Some((_, p50)) = bases.iter().find(|(b, _)| *b == "probe_mean")
        {
            findings.push(format!(
                "A write-IOPS cap holds commits to {} per second, although the storage answers \
                 a commit fast enough for {}.",
                num(c),
                num(*p50)
            ));
        }
    }
}

/// The probe errors since start and the latest setup error.
fn probe_errors(
    o: &mut String,
    v: &VolumeState,
    setup_note: Option<&SetupNote>,
    findings: &mut Vec<String>,
) {
    let errors: Vec<_> = v
        .counts
        .errors()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    o.push_str("<h3>Probe errors since start</h3>");
    if errors.is_empty() {
        o.push_str("<p>No probe errors since start.</p>");
    } else {
        o.push_str("<table class=\"errors\"><tr><th>op</th><th>cause</th><th>count</th></tr>");
        for ((op, cause), n) in &errors {
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{n}</td></tr>",
                esc(op),
                esc(cause)
            );
        }
        o.push_str("</table>");
    }
    if let Some(note) = setup_note {
        let _ = write!(
            o,
            "<p class=\"bad setup-error\">Setup error ({}): {}</p>",
            esc(note.cause),
            esc(&note.message)
        );
        findings.push(if note.cause == "no_direct_io" {
            "The read probe is off: this filesystem does not take O_DIRECT reads.".to_string()
        } else {
            format!(
                "The probe directory cannot be set up ({}); the figures above are missing or old.",
                esc(note.cause)
            )
        });
    }
}

/// Findings from the window: a hung probe, no samples yet, PostgreSQL's
/// syncs slower than the probe's, and the verdict's warnings.
fn probe_findings(
    v: &VolumeState,
    s: &Snapshot,
    clusters: &[ClusterSnapshot],
    findings: &mut Vec<String>,
) {
    if let Some((op, age)) = s.in_flight
        && age > v.timeout
    {
        findings.push(format!(
            "A {op} probe has been waiting for {}, past its {} timeout: the storage is not \
             answering.",
            fmt_seconds(age.as_secs_f64()),
            fmt_seconds(v.timeout.as_secs_f64())
        ));
    }
    let any_samples = s.samples.iter().any(|n| *n > 0);
    if !any_samples && (v.commit_probe || v.read_probe) {
        findings.push(format!(
            "No probe has completed within the window (the last {}) yet.",
            span(v.window.as_secs_f64())
        ));
    }
    for c in clusters {
        if c.wal_volume() != Some(v.name.as_str()) {
            continue;
        }
        let probe = s.rate_sync_mean();
        if let (Some(pg), Some(p)) = (c.wal_sync_mean, probe)
            && let Some(r) = sync_ratio(pg, p)
            && r > SLOW_PG_SYNC_RATIO
        {
            findings.push(format!(
                "PostgreSQL {}'s WAL syncs take {} on average over the last {}, {r:.1}× the \
                 probe's {}: something slows PostgreSQL that the probe does not feel (a cap on \
                 its cgroup, checkpoints, another device).",
                esc(&c.name),
                fmt_seconds(pg),
                span(c.window.as_secs_f64()),
                fmt_seconds(p)
            ));
        }
    }
    let phase = |op| s.report_phase(op);
    let reads_total: u64 = Phase::ALL
        .iter()
        .map(|p| s.count[series(Op::Read, *p)])
        .sum();
    let observed = Observed {
        fstype: &s.fs.fstype,
        sync_method: v.sync_method,
        write: op_stats(s, Op::Write, phase(Op::Commit)),
        sync: op_stats(s, Op::Sync, phase(Op::Commit)),
        commit: op_stats(s, Op::Commit, phase(Op::Commit)),
        read: op_stats(s, Op::Read, phase(Op::Read)),
        reads_total,
        cache_served_reads: v.counts.cache_served_reads().unwrap_or(0),
    };
    findings.extend(warnings(&observed).into_iter().map(|w| {
        let mut m = esc(&w.message);
        if !m.ends_with('.') {
            m.push('.');
        }
        m
    }));
}

/// The findings gathered above, or that there are none.
fn findings_list(o: &mut String, window: std::time::Duration, findings: &[String]) {
    let _ = write!(
        o,
        "<h3>Findings <span class=\"span\">(window figures over the last {})</span></h3>",
        span(window.as_secs_f64())
    );
    if findings.is_empty() {
        o.push_str("<p>Nothing to report.</p>");
    } else {
        o.push_str("<ul class=\"findings\">");
        for f in findings {
            // Findings are built from escaped parts.
            let _ = write!(o, "<li>{f}</li>");
        }
        o.push_str("</ul>");
    }
}

fn caps(o: &mut String, volume: &str, limits: &LimitsSnapshot, findings: &mut Vec<String>) {
    let rows: Vec<_> = limits.rows.iter().filter(|r| r.volume == volume).collect();
    o.push_str("<h3>IO caps</h3>");
    if rows.is_empty() {
        let why = limits
            .no_disk
            .get(volume)
            .map(|r| format!(" (the whole disk is unknown: {})", esc(r)))
            .unwrap_or_default();
        let _ = write!(o, "<p>No IO cap found on this volume's disk{why}.</p>");
        return;
    }
    // Utilization is the IO rate between the latest two limits passes
    // over the cap: name that span, which a reload can shorten.
    let over = match limits.utilization_seconds {
        Some(dt) => format!("over the last {}", span(dt)),
        None => "needs two limits passes".to_string(),
    };
    let _ = write!(
        o,
        "<table class=\"caps\"><tr><th>source</th><th>resource</th><th>cap</th>\
         <th>utilization <span class=\"span\">{over}</span></th></tr>",
    );
    for r in rows {
        let resource = r.resource.as_str();
        let util = r.utilization.map(percent).unwrap_or_else(|| "-".into());
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{util}</td></tr>",
            esc(r.source),
            esc(resource),
            cap_value(resource, r.value)
        );
        if let Some(u) = r.utilization
            && u >= BUSY_CAP
        {
            findings.push(format!(
                "The {} {} cap of {} is {} used {over}: IO beyond it waits.",
                esc(r.source),
                esc(resource),
                cap_value(resource, r.value),
                percent(u)
            ));
        }
    }
    o.push_str("</table>");
    for c in limits.cgroups.iter().filter(|c| c.volume == volume) {
        let _ = write!(
            o,
            "<p>cgroup limits read from {} ({} cgroup {}, disk {}).</p>",
            esc(&c.scope),
            esc(c.version),
            esc(&c.cgroup),
            esc(&c.disk)
        );
    }
}

fn setting<'a>(c: &'a ClusterSnapshot, name: &str) -> &'a str {
    c.setting(name).map(|s| s.value.as_str()).unwrap_or("-")
}

/// The window of the shipped `PgStorageWalSyncSaturated` alert's rate
/// (deploy/prometheus/alerts.rules.yml), named beside the page's figure of
/// the same thing so the two are not compared as if over one span.
const ALERT_WAL_SHARE_WINDOW: &str = "5 min";

fn clusters(o: &mut String, clusters: &[ClusterSnapshot], audit: &AuditSnapshot, now: f64) {
    o.push_str("<h2 id=\"clusters\">PostgreSQL clusters</h2>");
    if clusters.is_empty() {
        o.push_str("<p>No PostgreSQL cluster is watched.</p>");
        return;
    }
    let w = windows(clusters.iter().map(|c| c.window));
    let _ = write!(
        o,
        "<table class=\"clusters\"><tr><th>cluster</th><th>pg_up</th><th>version</th>\
         <th>track_io_timing</th><th>track_wal_io_timing</th><th>WAL volume</th>\
         <th>WAL sync mean{w}</th><th>WAL sync time share{w} <span class=\"span\">(the \
         PgStorageWalSyncSaturated alert: {ALERT_WAL_SHARE_WINDOW})</span></th>\
         <th>last error</th><th><a href=\"#audit\">audit</a></th></tr>",
    );
    let mut findings = Vec::new();
    for c in clusters {
        let name = esc(&c.name);
        let up = if c.up {
            "<span class=\"ok\">up</span>"
        } else {
            "<span class=\"bad\">down</span>"
        };
        let version = c
            .version
            .as_ref()
            .map(|(_, v)| esc(v))
            .unwrap_or_else(|| "-".into());
        let last = match c.last_error {
            Some((what, cause, at)) => {
                format!("{} failed: {} ({})", esc(what), esc(cause), ago(at, now))
            }
            None => "none".into(),
        };
        let _ = write!(
            o,
            "<tr><td>{name}</td><td>{up}</td><td>{version}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{last}</td>\
             <td>{}</td></tr>",
            esc(setting(c, "track_io_timing")),
            esc(setting(c, "track_wal_io_timing")),
            c.wal_volume().map(esc).unwrap_or_else(|| "-".into()),
            opt_seconds(c.wal_sync_mean),
            c.wal_sync_share.map(percent).unwrap_or_else(|| "-".into()),
            audit::findings_cell(
                Of::Cluster,
                &c.name,
                0,
                audited(audit, Of::Cluster, &c.name)
            ),
        );
        if !c.up {
            findings.push(format!(
                "{name} is down: its figures are missing until a scrape succeeds."
            ));
        } else if setting(c, "track_wal_io_timing") == "off" {
            findings.push(format!(
                "{name}: track_wal_io_timing is off, so PostgreSQL's WAL sync time is not \
                 measured and its commit ceiling (basis postgres) is missing."
            ));
        }
        if c.up && c.wal_volume().is_none() {
            findings.push(format!(
                "{name}: no probed volume holds its WAL, so its WAL sync time is not compared \
                 with a probe."
            ));
        }
        if let Some(share) = c.wal_sync_share
            && share >= 0.5
        {
            findings.push(format!(
                "{name} spent {} of the last {} in WAL syncs: commits queue behind the storage.",
                percent(share),
                span(c.window.as_secs_f64())
            ));
        }
    }
    o.push_str("</table>");
    if !findings.is_empty() {
        o.push_str("<ul class=\"findings\">");
        for f in &findings {
            let _ = write!(o, "<li>{f}</li>");
        }
        o.push_str("</ul>");
    }
}

/// The server's own syncs, traced in the kernel, over the last
/// [`crate::ebpf::RECENT`].
fn syncs(o: &mut String, s: &crate::ebpf::SyncSnapshot) {
    if let Some(off) = s.off {
        let _ = write!(
            o,
            "<p id=\"syncs\">Kernel tracing of PostgreSQL's own syncs is off: {} \
             (pgstorage_pg_sync_tracing).</p>",
            esc(off.as_str())
        );
        return;
    }
    if !s.running || s.clusters.is_empty() {
        return;
    }
    let _ = write!(
        o,
        "<h3 id=\"syncs\">Server's own syncs, last {} (traced in the kernel)</h3>\
         <table class=\"syncs\"><tr><th>cluster</th><th>traced</th><th>WAL syncs</th>\
         <th>WAL p50</th><th>WAL p99</th><th>data syncs</th><th>data p99</th></tr>",
        span(crate::ebpf::RECENT.as_secs_f64())
    );
    for (name, c) in &s.clusters {
        let traced = match c.traced {
            Ok(()) => "<span class=\"ok\">yes</span>".to_string(),
            Err(why) => format!("<span class=\"bad\">no: {}</span>", esc(why)),
        };
        let (wal, data) = match &c.recent {
            Some([w, d, _]) => (Some(w), Some(d)),
            _ => (None, None),
        };
        let count = |h: Option<&crate::ebpf::Histogram>| {
            h.map(|h| h.count.to_string()).unwrap_or_else(|| "-".into())
        };
        let q = |h: Option<&crate::ebpf::Histogram>, q| match h.and_then(|h| h.quantile_bound(q)) {
            Some(b) if b.is_finite() => format!("&le; {}", fmt_seconds(b)),
            Some(_) => "&gt; 10 s".to_string(),
            None => "-".to_string(),
        };
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{traced}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(name),
            count(wal),
            q(wal, 0.5),
            q(wal, 0.99),
            count(data),
            q(data, 0.99),
        );
    }
    o.push_str("</table>");
}

fn health(o: &mut String, snap: &ScrapeSnapshot) {
    o.push_str(
        "<h2 id=\"collectors\">Collectors</h2><table class=\"collectors\">\
         <tr><th>collector</th><th>latest run</th><th>took</th></tr>",
    );
    for (c, ok, secs) in crate::exposition::health::rows(snap) {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
            esc(&c),
            if ok {
                "<span class=\"ok\">ok</span>"
            } else {
                "<span class=\"bad\">failed</span>"
            },
            opt_seconds(secs)
        );
    }
    o.push_str("</table>");
    let errors: Vec<_> = snap
        .limits
        .read_errors
        .iter()
        .filter(|(_, n)| **n > 0)
        .collect();
    if errors.is_empty() {
        o.push_str("<p>The limits collector has read every file it needed.</p>");
    } else {
        o.push_str(
            "<h3>Limits collector read errors since start</h3><table class=\"limits-errors\">\
             <tr><th>kind</th><th>cause</th><th>count</th></tr>",
        );
        for ((kind, cause), n) in errors {
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{n}</td></tr>",
                esc(kind),
                esc(cause)
            );
        }
        o.push_str("</table>");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_force_is_the_lowest_basis() {
        let b = [("probe_mean", 2150.0), ("postgres", 900.0), ("cap", 75.0)];
        assert_eq!(ceiling_in_force(&b), Some(("cap", 75.0)));
        assert_eq!(ceiling_in_force(&[]), None);
    }

    /// The case the page is for: a fast commit probe (465 µs) on a disk
    /// whose cgroup caps writes at 200 IOPS, each commit costing 8/3 device
    /// writes: the cap sets the ceiling (75/s). The volume `wal` is on
    /// tmpfs, its window is a minute, and its setup error carries markup.
    fn capped_tmpfs_wal() -> ScrapeSnapshot {
        use crate::limits::{CgroupRow, LimitRow};
        use crate::probe::fsinfo::FsInfo;
        use crate::probe::settings::{ProbeSettings, VolumeSpec};
        use crate::types::Resource;

        let spec = VolumeSpec {
            name: "wal".into(),
            path: "/srv/<b>wal</b>".into(),
            probe_dir: "/srv/<b>wal</b>/pg-storage-exporter-probe".into(),
            probe: ProbeSettings::default(),
            provisioned: Vec::new(),
            cgroup: None,
        };
        let fs = FsInfo {
            fstype: "tmpfs".into(),
            device: "tmpfs".into(),
            ..Default::default()
        };
        let v = Arc::new(VolumeState::new(
            &spec,
            std::time::Duration::from_secs(60),
            fs,
        ));
        let now = std::time::Instant::now();
        for _ in 0..20 {
            v.record(Op::Commit, Phase::Busy, now, 465e-6);
            v.record(Op::Sync, Phase::Busy, now, 400e-6);
            v.record(Op::Commit, Phase::AfterIdle, now, 2e-3);
        }
        v.burst_recorded(false, now, 1);
        v.counts.setup_error(
            "EACCES",
            "probe directory /srv/<script>x</script>: denied".into(),
        );
        let s = v.snapshot(now, &crate::model::WINDOW_QUANTILES);
        let limits = LimitsSnapshot {
            rows: vec![LimitRow {
                volume: "wal".into(),
                source: "cgroup",
                resource: Resource::WriteIops,
                value: 200.0,
                utilization: Some(0.97),
            }],
            cgroups: vec![CgroupRow {
                volume: "wal".into(),
                scope: "postgres:main".into(),
                version: "v2",
                cgroup: "/system.slice/<pg>.service".into(),
                disk: "vda".into(),
            }],
            writes_per_probe: [("wal".to_string(), 8.0 / 3.0)].into_iter().collect(),
            ..Default::default()
        };
        ScrapeSnapshot {
            syncs: Default::default(),
            volumes: vec![(v, s)],
            clusters: Vec::new(),
            limits,
            audit: Default::default(),
        }
    }

    /// The cap sets the ceiling and the page says so.
    #[test]
    fn a_cap_sets_the_ceiling_and_every_value_is_escaped() {
        let html = render(&capped_tmpfs_wal(), "/metrics", 0.0);
        assert!(
            html.contains(
                "Ceiling in force: <b>75.0 commits/s</b> for one client, set by <b>cap</b>."
            ),
            "{html}"
        );
        assert!(
            html.contains("<td>probe_mean</td><td class=\"n\">2366</td>"),
            "{html}"
        );
        assert!(
            html.contains("<td>cap</td><td class=\"n\">75.0</td>"),
            "{html}"
        );
        assert!(
            html.contains("A write-IOPS cap holds commits to 75.0 per second"),
            "{html}"
        );
        assert!(
            html.contains("write_iops cap of 200 IOPS is 97 % used"),
            "{html}"
        );
        assert!(html.contains("tmpfs keeps files in memory"), "{html}");
        assert!(html.contains("465 µs"), "{html}");
        assert!(html.contains("/srv/&lt;b&gt;wal&lt;/b&gt;"), "{html}");
        assert!(html.contains("&lt;script&gt;x&lt;/script&gt;"), "{html}");
        assert!(html.contains("/system.slice/&lt;pg&gt;.service"), "{html}");
        assert!(
            !html.contains("<script>") && !html.contains("<b>wal"),
            "{html}"
        );
    }

    /// The audit found the volume in memory (critical) and one host-wide
    /// setting: the summary row counts both apart, never "none", and the
    /// audit section lists them with their evidence escaped. Every
    /// windowed figure names its span.
    #[test]
    fn audit_findings_reach_the_volume_row_and_every_figure_states_its_window() {
        use crate::audit::{Finding, Outcome, Report, Severity};
        let finding = |code, severity, evidence: &str| Finding {
            code,
            severity,
            evidence: evidence.into(),
            message: "what it means".into(),
            fix: "sysctl -w x=1 <now>".into(),
        };
        let mut snap = capped_tmpfs_wal();
        snap.limits.utilization_seconds = Some(10.0);
        snap.clusters = vec![ClusterSnapshot {
            name: "main".into(),
            up: true,
            window: std::time::Duration::from_secs(15 * 60),
            wal_sync_share: Some(0.6),
            ..Default::default()
        }];
        snap.audit = AuditSnapshot {
            last: Some(Arc::new(Report {
                host: Outcome {
                    findings: vec![finding(
                        "swappiness_high",
                        Severity::Warning,
                        "/proc/sys/vm/swappiness = 60",
                    )],
                    checked: 7,
                    ..Default::default()
                },
                volumes: vec![(
                    "wal".into(),
                    Outcome {
                        findings: vec![finding(
                            "memory_filesystem",
                            Severity::Critical,
                            "mountinfo fstype = </td><script>x</script>",
                        )],
                        checked: 3,
                        ..Default::default()
                    },
                )],
                clusters: Vec::new(),
                read_errors: Vec::new(),
            })),
            last_run: Some(0.0),
            runs: 1,
            ..Default::default()
        };
        let html = render(&snap, "/metrics", 30.0);
        let row = html
            .split_once("<table class=\"summary\">")
            .and_then(|(_, r)| r.split_once("</table>"))
            .unwrap()
            .0;
        assert!(!row.contains(">none<"), "{row}");
        assert!(
            row.contains(
                "<a class=\"bad\" href=\"#audit-volume-wal\" title=\"memory_filesystem\">1 audit</a>, \
                 <a class=\"warn\" href=\"#audit-host\">1 host-wide</a>"
            ),
            "{row}"
        );
        // The windows: the volume's minute, the cluster's 15 minutes beside
        // the alert's 5, the limits pass's 10 s.
        for want in [
            "<th>commit p50 busy <span class=\"span\">last 1 min</span></th>",
            "<h3>Latency, last 1 min (the window)</h3>",
            "the last 1 min (the window), busy bursts",
            "the cap as the latest limits pass read it; device writes per commit counted",
            "<th>utilization <span class=\"span\">over the last 10 s</span></th>",
            "write_iops cap of 200 IOPS is 97 % used over the last 10 s",
            "<th>WAL sync time share <span class=\"span\">last 15 min</span> \
             <span class=\"span\">(the PgStorageWalSyncSaturated alert: 5 min)</span></th>",
            "main spent 60 % of the last 15 min in WAL syncs",
            "<h3>Probe errors since start</h3>",
            "<td>cap <span class=\"span\">latest limits pass</span></td>",
            "<h3>Findings <span class=\"span\">(window figures over the last 1 min)</span></h3>",
            "As of the latest pass 30 s ago: 2 findings (1 critical, 1 warning, 0 info)",
            // The cluster is watched but its settings were not read.
            "<a class=\"not-checked\" href=\"#audit-cluster-main\">audit: not checked yet</a>",
        ] {
            assert!(html.contains(want), "{want:?} missing:\n{html}");
        }
        // The audit's lines in the volume's own findings list.
        assert!(
            html.contains(
                "Audit, <span class=\"bad\">critical</span> <code>memory_filesystem</code>"
            ),
            "{html}"
        );
        assert!(
            html.contains("mountinfo fstype = &lt;/td&gt;&lt;script&gt;x&lt;/script&gt;")
                && html.contains("sysctl -w x=1 &lt;now&gt;")
                && !html.contains("<script>"),
            "{html}"
        );
    }

    #[test]
    fn a_header_names_the_window_all_rows_share() {
        let d = std::time::Duration::from_secs;
        assert!(windows([d(60), d(60)].into_iter()).contains("last 1 min"));
        assert!(windows([d(60), d(120)].into_iter()).contains("each row's window"));
        assert_eq!(windows(std::iter::empty()), "");
    }

    #[test]
    fn empty_snapshot_renders_every_section() {
        let snap = ScrapeSnapshot {
            syncs: Default::default(),
            volumes: Vec::new(),
            clusters: vec![ClusterSnapshot {
                name: "<c>".into(),
                last_error: Some(("connect", "auth", 100.0)),
                ..Default::default()
            }],
            limits: LimitsSnapshot::default(),
            audit: Default::default(),
        };
        let html = render(&snap, "/metrics", 160.0);
        assert!(html.contains("No volume is probed"), "{html}");
        assert!(html.contains("<td>&lt;c&gt;</td>"), "{html}");
        assert!(html.contains("connect failed: auth (60 s ago)"), "{html}");
        assert!(!html.contains("<c>"), "{html}");
        assert!(html.contains("Collectors"), "{html}");
    }

    #[test]
    fn the_servers_own_syncs_of_the_last_minute_or_why_not() {
        let mut wal = crate::ebpf::Histogram::default();
        // 98 WAL syncs up to 1 ms (bucket 12), two up to 68.1 ms (23).
        wal.buckets[12] = 98;
        wal.buckets[23] = 2;
        wal.count = 100;
        let kinds = [
            wal,
            crate::ebpf::Histogram::default(),
            crate::ebpf::Histogram::default(),
        ];
        let mut syncs = crate::ebpf::SyncSnapshot {
            running: true,
            ..Default::default()
        };
        syncs.clusters.insert(
            "<c>".into(),
            crate::ebpf::ClusterSyncs {
                traced: Ok(()),
                kinds: Some(kinds.clone()),
                recent: Some(kinds),
            },
        );
        syncs.clusters.insert(
            "far".into(),
            crate::ebpf::ClusterSyncs {
                traced: Err("not_local"),
                kinds: None,
                recent: None,
            },
        );
        let snap = |syncs| ScrapeSnapshot {
            syncs,
            volumes: Vec::new(),
            clusters: Vec::new(),
            limits: LimitsSnapshot::default(),
            audit: Default::default(),
        };
        let html = render(&snap(syncs), "/metrics", 0.0);
        assert!(
            html.contains(
                "<tr><td>&lt;c&gt;</td><td><span class=\"ok\">yes</span></td>\
                 <td class=\"n\">100</td><td class=\"n\">&le; 1.00 ms</td>\
                 <td class=\"n\">&le; 68.1 ms</td><td class=\"n\">0</td><td class=\"n\">-</td></tr>"
            ),
            "{html}"
        );
        assert!(html.contains("no: not_local"), "{html}");
        let off = crate::ebpf::SyncSnapshot {
            off: Some(crate::ebpf::Off::Permission),
            ..Default::default()
        };
        let html = render(&snap(off), "/metrics", 0.0);
        assert!(
            html.contains("Kernel tracing of PostgreSQL's own syncs is off: permission"),
            "{html}"
        );
    }
}
