//! The status page `/`: how fast the databases on this host can commit and
//! read right now, and what caps them. Server-rendered HTML, one table per
//! section, from ONE [`ScrapeSnapshot`] like a scrape of `/metrics`, so the
//! page and the metrics taken at the same moment agree (the ceiling in
//! force is computed by the same function).
//!
//! Every value that comes from configuration, the OS or PostgreSQL (volume
//! names, paths, devices, error texts) goes through [`esc`].

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

use crate::exposition::ScrapeSnapshot;
use crate::exposition::derived::{ceiling_in_force, commit_bases};
use crate::limits::LimitsSnapshot;
use crate::model::ceiling::sync_ratio;
use crate::model::verdict::{Observed, OpStats, fmt_seconds, warnings};
use crate::postgres::ClusterSnapshot;
use crate::probe::counts::SetupNote;
use crate::probe::state::{Snapshot, VolumeState};
use crate::types::{Op, Phase, series};

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

/// HTML-escapes text for element content and quoted attributes.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;max-width:72em}\
table{border-collapse:collapse;margin:.4em 0 1em}\
td,th{padding:.2em .7em;text-align:left;border-bottom:1px solid #ddd;vertical-align:top}\
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.bad{color:#a00;font-weight:bold}.ok{color:#070}h2{margin-top:1.6em;border-top:2px solid #888;padding-top:.4em}\
h3{margin:.8em 0 .2em;font-size:1em}ul.findings li{margin:.2em 0}";

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
         <p>How fast PostgreSQL can commit and read on each volume right now, and what caps it. \
         Figures are over the sliding window; <a href=\"{path}\">{path}</a> has them as metrics, \
         <a href=\"/healthz\">/healthz</a> answers liveness.</p>\
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
        o.push_str(
            "<h2 id=\"summary\">Volumes</h2><table class=\"summary\"><tr><th>volume</th>\
             <th>commit ceiling in force</th><th>set by</th><th>commit p50 busy</th>\
             <th>commit p50 after idle</th><th>read p50 busy</th><th>read p50 after idle</th>\
             <th>findings</th></tr>",
        );
        for (v, s) in &snap.volumes {
            let findings = volume(&mut sections, v, s, snap);
            let (ceiling, basis) =
                match ceiling_in_force(&commit_bases(v, s, &snap.clusters, &snap.limits)) {
                    Some((b, c)) => (format!("{} commits/s", num(c)), b),
                    None => ("-".to_string(), "-"),
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
                match findings {
                    0 => "<span class=\"ok\">none</span>".to_string(),
                    n => format!("<a class=\"bad\" href=\"#volume-{}\">{n}</a>", esc(&v.name)),
                },
            );
        }
        o.push_str("</table>");
        o.push_str(&sections);
    }
    clusters(&mut o, &snap.clusters, now_unix);
    syncs(&mut o, &snap.syncs);
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

fn percent(r: f64) -> String {
    format!("{:.0} %", r * 100.0)
}

/// "3 min ago" style age of a unix time.
fn ago(then: f64, now: f64) -> String {
    let d = (now - then).max(0.0);
    if d < 120.0 {
        format!("{d:.0} s ago")
    } else if d < 7200.0 {
        format!("{:.0} min ago", d / 60.0)
    } else {
        format!("{:.1} h ago", d / 3600.0)
    }
}

fn cap_value(resource: &str, value: f64) -> String {
    if resource.contains("bytes") {
        format!("{:.1} MB/s", value / 1e6)
    } else {
        format!("{value:.0} IOPS")
    }
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

/// One volume's section; returns how many findings it has.
fn volume(o: &mut String, v: &VolumeState, s: &Snapshot, snap: &ScrapeSnapshot) -> usize {
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
    findings_list(o, &findings);
    findings.len()
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
    o.push_str(
        "<h3>Latency</h3><table class=\"latency\"><tr><th>op</th>\
         <th>busy p50</th><th>busy p99</th><th>after idle p50</th><th>after idle p99</th>\
         <th>samples (busy / after idle)</th></tr>",
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
            && let Some(need) = s.rate_min_samples[0]
        {
            let _ = write!(
                o,
                "<p>The probe's ceilings wait for {need} busy commits in the window \
                 ({} so far): one burst is one moment of the host, and they are read from \
                 several.</p>",
                s.samples[series(Op::Commit, Phase::Busy)]
            );
        }
        let rows = bases.clone();
        if !rows.is_empty() {
            o.push_str(
                "<table class=\"ceiling\"><tr><th>basis</th><th>commits/s</th>\
                 <th>what it is</th><th>in force</th></tr>",
            );
            for (basis, c) in &rows {
                let on = in_force.is_some_and(|(b, x)| b == *basis && x == *c);
                let _ = write!(
                    o,
                    "<tr><td>{basis}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
                    num(*c),
                    basis_words(basis),
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
    o.push_str("<h3>Probe errors</h3>");
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
        findings.push("No probe has completed within the window yet.".to_string());
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
                "PostgreSQL {}'s WAL syncs take {} on average, {r:.1}× the probe's {}: something \
                 slows PostgreSQL that the probe does not feel (a cap on its cgroup, checkpoints, \
                 another device).",
                esc(&c.name),
                fmt_seconds(pg),
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
fn findings_list(o: &mut String, findings: &[String]) {
    o.push_str("<h3>Findings</h3>");
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
    o.push_str(
        "<table class=\"caps\"><tr><th>source</th><th>resource</th><th>cap</th>\
         <th>utilization</th></tr>",
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
                "The {} {} cap of {} is {} used: IO beyond it waits.",
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

fn clusters(o: &mut String, clusters: &[ClusterSnapshot], now: f64) {
    o.push_str("<h2 id=\"clusters\">PostgreSQL clusters</h2>");
    if clusters.is_empty() {
        o.push_str("<p>No PostgreSQL cluster is watched.</p>");
        return;
    }
    o.push_str(
        "<table class=\"clusters\"><tr><th>cluster</th><th>pg_up</th><th>version</th>\
         <th>track_io_timing</th><th>track_wal_io_timing</th><th>WAL volume</th>\
         <th>WAL sync mean</th><th>WAL sync time share</th><th>last error</th></tr>",
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
             <td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{last}</td></tr>",
            esc(setting(c, "track_io_timing")),
            esc(setting(c, "track_wal_io_timing")),
            c.wal_volume().map(esc).unwrap_or_else(|| "-".into()),
            opt_seconds(c.wal_sync_mean),
            c.wal_sync_share.map(percent).unwrap_or_else(|| "-".into()),
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
                "{name} spends {} of its time in WAL syncs: commits queue behind the storage.",
                percent(share)
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

/// The server's own syncs, traced in the kernel, over the last minute.
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
    o.push_str(
        "<h3 id=\"syncs\">Server's own syncs, last minute (traced in the kernel)</h3>\
         <table class=\"syncs\"><tr><th>cluster</th><th>traced</th><th>WAL syncs</th>\
         <th>WAL p50</th><th>WAL p99</th><th>data syncs</th><th>data p99</th></tr>",
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
            "<h3>Limits collector read errors</h3><table class=\"limits-errors\">\
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
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn in_force_is_the_lowest_basis() {
        let b = [("probe_mean", 2150.0), ("postgres", 900.0), ("cap", 75.0)];
        assert_eq!(ceiling_in_force(&b), Some(("cap", 75.0)));
        assert_eq!(ceiling_in_force(&[]), None);
    }

    /// The case the page is for: a fast commit probe (465 µs) on a disk
    /// whose cgroup caps writes at 200 IOPS, each commit costing 8/3 device
    /// writes: the cap sets the ceiling (75/s), and the page says so. The
    /// volume is on tmpfs and its setup error carries markup.
    #[test]
    fn a_cap_sets_the_ceiling_and_every_value_is_escaped() {
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
        v.burst_recorded(false, now);
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
        let snap = ScrapeSnapshot {
            syncs: Default::default(),
            volumes: vec![(v, s)],
            clusters: Vec::new(),
            limits,
            audit: Default::default(),
        };
        let html = render(&snap, "/metrics", 0.0);
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
