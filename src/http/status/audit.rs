//! The status page's audit section, and what a volume's or cluster's row
//! says of the audit. Both read the latest pass's report, the one
//! `/metrics` encodes as `pgstorage_audit_finding`, so a volume's audit
//! count here is the number of its `pgstorage_audit_finding{volume}`
//! series, and the host-wide ones (no `volume` or `cluster` label) are
//! counted apart, as they are there.
//!
//! The audit tells "no finding" from "not checked" (a check whose facts
//! could not be read is skipped and counted), and the page keeps them
//! apart too: "none" is written only where checks were evaluated.
//! Findings silenced by `audit.ignore` are not findings; the page says how
//! many there are and which, so a silenced check is not read as passing.

use std::fmt::Write as _;

use crate::audit::{AuditSnapshot, CHECKS, Finding, Outcome, Severity};

use super::text::{ago, esc};

/// What the latest audit pass says about one volume or cluster.
#[derive(Debug, Clone, Copy)]
pub(super) enum Audited<'a> {
    /// No pass has completed since start.
    NotRun,
    /// The latest pass left it out: a volume added since (by a reload or
    /// discovery), a cluster whose settings were not read yet.
    NotYet,
    /// Its own outcome, and the host's, which holds for it too.
    Done { own: &'a Outcome, host: &'a Outcome },
}

/// Which part of the report a row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Of {
    Volume,
    Cluster,
}

impl Of {
    fn word(self) -> &'static str {
        match self {
            Of::Volume => "volume",
            Of::Cluster => "cluster",
        }
    }
}

pub(super) fn audited<'a>(a: &'a AuditSnapshot, of: Of, name: &str) -> Audited<'a> {
    let Some(r) = &a.last else {
        return Audited::NotRun;
    };
    let list = match of {
        Of::Volume => &r.volumes,
        Of::Cluster => &r.clusters,
    };
    match list.iter().find(|(n, _)| n == name) {
        Some((_, own)) => Audited::Done { own, host: &r.host },
        None => Audited::NotYet,
    }
}

/// The findings of an outcome, critical first, then in the order of
/// [`CHECKS`] (which groups related checks).
fn ranked(o: &Outcome) -> Vec<&Finding> {
    let rank = |f: &Finding| CHECKS.iter().position(|c| c.code == f.code);
    let mut v: Vec<&Finding> = o.findings.iter().collect();
    v.sort_by_key(|f| (f.severity, rank(f)));
    v
}

fn class(s: Severity) -> &'static str {
    match s {
        Severity::Critical => "bad",
        Severity::Warning => "warn",
        Severity::Info => "info",
    }
}

fn anchor(of: Of, name: &str) -> String {
    format!("audit-{}-{}", of.word(), esc(name))
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The "findings" cell of a row: `probe` findings the page found itself
/// (linked to `#{of}-{name}`), the audit's own findings of the volume or
/// cluster, and the host-wide audit findings, each counted apart and
/// linked to where they are listed. "none" only when the audit evaluated
/// checks on it and nothing is found anywhere.
pub(super) fn findings_cell(of: Of, name: &str, probe: usize, audit: Audited<'_>) -> String {
    let here = anchor(of, name);
    let mut parts = Vec::new();
    if probe > 0 {
        parts.push(format!(
            "<a class=\"bad\" href=\"#{}-{}\">{probe} probe</a>",
            of.word(),
            esc(name)
        ));
    }
    let mut ignored = 0;
    match audit {
        Audited::NotRun => {
            parts.push("<a class=\"not-checked\" href=\"#audit\">audit not run yet</a>".into());
        }
        Audited::NotYet => parts.push(format!(
            "<a class=\"not-checked\" href=\"#{here}\">audit: not checked yet</a>"
        )),
        Audited::Done { own, host } => {
            let found = ranked(own);
            if let Some(worst) = found.first() {
                let codes: Vec<&str> = found.iter().map(|f| f.code).collect();
                parts.push(format!(
                    "<a class=\"{}\" href=\"#{here}\" title=\"{}\">{} audit</a>",
                    class(worst.severity),
                    esc(&codes.join(", ")),
                    found.len()
                ));
            } else if own.checked == 0 {
                parts.push(format!(
                    "<a class=\"not-checked\" href=\"#{here}\">audit: not checked</a>"
                ));
            }
            if let Some(worst) = ranked(host).first() {
                parts.push(format!(
                    "<a class=\"{}\" href=\"#audit-host\">{} host-wide</a>",
                    class(worst.severity),
                    host.findings.len()
                ));
            }
            ignored = own.ignored.len();
        }
    }
    let mut cell = if parts.is_empty() {
        "<span class=\"ok\">none</span>".to_string()
    } else {
        parts.join(", ")
    };
    if ignored > 0 {
        let _ = write!(cell, " (<a href=\"#{here}\">{ignored} ignored</a>)");
    }
    cell
}

/// The audit's lines in a volume's or cluster's findings list: its own
/// findings in one sentence each, the host-wide ones as a count, or why
/// nothing is known. The evidence and the fix are in the audit section.
pub(super) fn notes(of: Of, name: &str, audit: Audited<'_>) -> Vec<String> {
    let here = anchor(of, name);
    let mut out = Vec::new();
    match audit {
        Audited::NotRun => out.push(
            "The storage-configuration audit has not run yet: its findings are not known."
                .to_string(),
        ),
        Audited::NotYet => out.push(format!(
            "The storage-configuration audit has not checked this {} yet.",
            of.word()
        )),
        Audited::Done { own, host } => {
            for f in ranked(own) {
                let mut m = esc(&f.message);
                if !m.ends_with('.') {
                    m.push('.');
                }
                out.push(format!(
                    "Audit, <span class=\"{}\">{}</span> <code>{}</code>: {m} \
                     <a href=\"#{here}\">Evidence and fix</a>.",
                    class(f.severity),
                    f.severity.as_str(),
                    f.code
                ));
            }
            if own.findings.is_empty() && own.checked == 0 {
                out.push(format!(
                    "The storage-configuration audit could not evaluate any check on this {} \
                     (<a href=\"#{here}\">why</a>).",
                    of.word()
                ));
            }
            if !host.findings.is_empty() {
                let codes: Vec<&str> = ranked(host).iter().map(|f| f.code).collect();
                out.push(format!(
                    "{} of the host's kernel settings hold for this {} too: \
                     <a href=\"#audit-host\">{}</a>.",
                    plural(host.findings.len(), "audit finding", "audit findings"),
                    of.word(),
                    codes.join(", ")
                ));
            }
        }
    }
    out
}

/// The audit section: the latest pass, when it ran and what it counted,
/// then every finding grouped by host, volume and cluster, critical first.
/// `volumes` and `clusters` are the ones watched now, so one the pass left
/// out is named as not checked yet rather than missing.
pub(super) fn section(
    o: &mut String,
    a: &AuditSnapshot,
    volumes: &[&str],
    clusters: &[&str],
    now_unix: f64,
) {
    o.push_str("<h2 id=\"audit\">Storage-configuration audit</h2>");
    let Some(r) = &a.last else {
        o.push_str(
            "<p class=\"not-checked\">The audit has not run yet: nothing is checked, so no \
             finding is known. It runs at start, every audit_interval and after each reload.</p>",
        );
        return;
    };
    let outcomes = || {
        std::iter::once(&r.host)
            .chain(r.volumes.iter().map(|(_, o)| o))
            .chain(r.clusters.iter().map(|(_, o)| o))
    };
    let by = |s: Severity| {
        outcomes()
            .flat_map(|o| &o.findings)
            .filter(|f| f.severity == s)
            .count()
    };
    let total: usize = outcomes().map(|o| o.findings.len()).sum();
    let ignored: usize = outcomes().map(|o| o.ignored.len()).sum();
    let when = a
        .last_run
        .map(|t| format!(" {}", ago(t, now_unix)))
        .unwrap_or_default();
    let _ = write!(
        o,
        "<p class=\"audit-run\">As of the latest pass{when}: {} ({} critical, {} warning, {} info); \
         {} evaluated, {} skipped (a fact they need could not be read); {} silenced by \
         audit.ignore. The audit runs at start, every audit_interval and after each reload; \
         each code is explained in docs/audit.md.</p>",
        plural(total, "finding", "findings"),
        by(Severity::Critical),
        by(Severity::Warning),
        by(Severity::Info),
        plural(r.checked() as usize, "check", "checks"),
        r.skipped(),
        ignored,
    );
    if !r.read_errors.is_empty() {
        let files: Vec<String> = r.read_errors.iter().map(|e| esc(e)).collect();
        let _ = write!(
            o,
            "<p class=\"bad audit-errors\">Found but not read or parsed in this pass: {}.</p>",
            files.join("; ")
        );
    }
    group(
        o,
        "audit-host",
        "Host (kernel settings: they hold for every volume and cluster)",
        Some(&r.host),
        "",
    );
    for v in volumes {
        let own = r.volumes.iter().find(|(n, _)| n == v).map(|(_, o)| o);
        group(
            o,
            &anchor(Of::Volume, v),
            &format!("Volume {}", esc(v)),
            own,
            "the volume was added after the latest pass",
        );
    }
    for c in clusters {
        let own = r.clusters.iter().find(|(n, _)| n == c).map(|(_, o)| o);
        group(
            o,
            &anchor(Of::Cluster, c),
            &format!("Cluster {}", esc(c)),
            own,
            "its collector has not read its settings (not connected yet, or down)",
        );
    }
}

/// One group of the section: its findings as a table, or "no finding" with
/// the checks evaluated, or why it is not checked; then what is silenced.
fn group(o: &mut String, id: &str, title: &str, outcome: Option<&Outcome>, not_yet: &str) {
    let _ = write!(o, "<h3 id=\"{id}\">{title}</h3>");
    let Some(oc) = outcome else {
        let _ = write!(
            o,
            "<p class=\"not-checked\">Not checked yet: {not_yet}.</p>"
        );
        return;
    };
    let counted = if oc.skipped > 0 {
        format!(
            "{} evaluated, {} skipped (a fact they need could not be read)",
            plural(oc.checked as usize, "check", "checks"),
            oc.skipped
        )
    } else {
        format!(
            "{} evaluated",
            plural(oc.checked as usize, "check", "checks")
        )
    };
    if !oc.findings.is_empty() {
        o.push_str(
            "<table class=\"audit\"><tr><th>severity</th><th>code</th><th>evidence</th>\
             <th>what it means</th><th>fix</th></tr>",
        );
        for f in ranked(oc) {
            let _ = write!(
                o,
                "<tr><td class=\"{}\">{}</td><td><code>{}</code></td>\
                 <td class=\"evidence\">{}</td><td>{}</td><td class=\"fix\">{}</td></tr>",
                class(f.severity),
                f.severity.as_str(),
                f.code,
                esc(&f.evidence),
                esc(&f.message),
                esc(&f.fix),
            );
        }
        let _ = write!(o, "</table><p>{counted}.</p>");
    } else if oc.checked == 0 {
        let _ = write!(
            o,
            "<p class=\"not-checked\">Not checked: none of its {} could be evaluated (a fact \
             they need could not be read).</p>",
            plural(oc.skipped as usize, "check", "checks")
        );
    } else {
        let _ = write!(o, "<p><span class=\"ok\">No finding</span>: {counted}.</p>");
    }
    if !oc.ignored.is_empty() {
        let _ = write!(
            o,
            "<p class=\"ignored\">Silenced by audit.ignore, not counted as findings: {} ({}).</p>",
            oc.ignored.len(),
            oc.ignored.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Report;
    use std::sync::Arc;

    fn finding(code: &'static str, evidence: &str) -> Finding {
        Finding {
            code,
            severity: crate::audit::check(code).unwrap().severity,
            evidence: evidence.into(),
            message: format!("{code} <means> something"),
            fix: format!("fix {code} & reload"),
        }
    }

    fn outcome(findings: Vec<Finding>, checked: u32, skipped: u32) -> Outcome {
        Outcome {
            findings,
            checked,
            skipped,
            ignored: Vec::new(),
        }
    }

    /// A host with two kernel findings (advice), a volume `mem` on tmpfs with atime
    /// silenced, a volume `disk` with nothing found, a volume `blind`
    /// whose facts could not be read, and a cluster with one info.
    fn snapshot() -> AuditSnapshot {
        let mut mem = outcome(
            vec![
                finding("atime", "mountinfo option relatime"),
                finding("memory_filesystem", "mountinfo fstype = tmpfs"),
            ],
            3,
            5,
        );
        mem.ignore(&["atime".to_string()]);
        mem.findings.push(finding("filesystem_choice", "<b>x</b>"));
        let report = Report {
            host: outcome(
                vec![
                    finding("swappiness_high", "/proc/sys/vm/swappiness = 60"),
                    finding("thp_always", "/sys/kernel/mm/transparent_hugepage/enabled"),
                ],
                7,
                1,
            ),
            volumes: vec![
                ("mem".into(), mem),
                ("disk".into(), outcome(Vec::new(), 9, 0)),
                ("blind".into(), outcome(Vec::new(), 0, 9)),
            ],
            clusters: vec![(
                "c".into(),
                outcome(
                    vec![finding("pending_restart", "pg_settings pending_restart: x")],
                    12,
                    0,
                ),
            )],
            read_errors: vec!["/proc/<meminfo>: EIO".into()],
        };
        AuditSnapshot {
            last: Some(Arc::new(report)),
            last_run: Some(100.0),
            runs: 1,
            ..Default::default()
        }
    }

    #[test]
    fn a_volume_cell_counts_its_audit_findings_and_the_host_wide_apart() {
        let a = snapshot();
        let cell =
            |name, probe| findings_cell(Of::Volume, name, probe, audited(&a, Of::Volume, name));
        assert_eq!(
            cell("mem", 2),
            "<a class=\"bad\" href=\"#volume-mem\">2 probe</a>, \
             <a class=\"bad\" href=\"#audit-volume-mem\" title=\"memory_filesystem, filesystem_choice\">2 audit</a>, \
             <a class=\"info\" href=\"#audit-host\">2 host-wide</a> \
             (<a href=\"#audit-volume-mem\">1 ignored</a>)"
        );
        // Nothing on the volume, but the host's findings hold for it.
        assert_eq!(
            cell("disk", 0),
            "<a class=\"info\" href=\"#audit-host\">2 host-wide</a>"
        );
        assert_eq!(
            cell("blind", 0),
            "<a class=\"not-checked\" href=\"#audit-volume-blind\">audit: not checked</a>, \
             <a class=\"info\" href=\"#audit-host\">2 host-wide</a>"
        );
        assert_eq!(
            cell("new", 0),
            "<a class=\"not-checked\" href=\"#audit-volume-new\">audit: not checked yet</a>"
        );
        let none = AuditSnapshot::default();
        assert_eq!(
            findings_cell(Of::Volume, "mem", 0, audited(&none, Of::Volume, "mem")),
            "<a class=\"not-checked\" href=\"#audit\">audit not run yet</a>"
        );
    }

    #[test]
    fn none_only_where_checks_ran_and_nothing_is_found() {
        let mut a = snapshot();
        let r = Arc::make_mut(a.last.as_mut().unwrap());
        r.host.findings.clear();
        let cell = |name| findings_cell(Of::Volume, name, 0, audited(&a, Of::Volume, name));
        assert_eq!(cell("disk"), "<span class=\"ok\">none</span>");
        assert!(cell("blind").contains("audit: not checked"));
        let mut a2 = a.clone();
        let r = Arc::make_mut(a2.last.as_mut().unwrap());
        r.volumes[1].1.ignored.push("atime");
        assert_eq!(
            findings_cell(Of::Volume, "disk", 0, audited(&a2, Of::Volume, "disk")),
            "<span class=\"ok\">none</span> (<a href=\"#audit-volume-disk\">1 ignored</a>)"
        );
    }

    #[test]
    fn the_section_groups_by_scope_critical_first_and_escapes_evidence() {
        let a = snapshot();
        let mut o = String::new();
        section(
            &mut o,
            &a,
            &["mem", "disk", "blind", "new"],
            &["c", "down"],
            160.0,
        );
        let at = |s: &str| o.find(s).unwrap_or_else(|| panic!("{s:?} missing: {o}"));
        // Groups in order: host, each volume, each cluster.
        let order = [
            "id=\"audit-host\"",
            "id=\"audit-volume-mem\"",
            "id=\"audit-volume-disk\"",
            "id=\"audit-volume-blind\"",
            "id=\"audit-volume-new\"",
            "id=\"audit-cluster-c\"",
            "id=\"audit-cluster-down\"",
        ];
        assert!(order.windows(2).all(|w| at(w[0]) < at(w[1])), "{o}");
        // Critical before info within a group, each with evidence, meaning
        // and fix, all escaped.
        assert!(at("<code>memory_filesystem</code>") < at("<code>filesystem_choice</code>"));
        assert!(o.contains(
            "<tr><td class=\"bad\">critical</td><td><code>memory_filesystem</code></td>\
             <td class=\"evidence\">mountinfo fstype = tmpfs</td>\
             <td>memory_filesystem &lt;means&gt; something</td>\
             <td class=\"fix\">fix memory_filesystem &amp; reload</td></tr>"
        ));
        assert!(
            o.contains("&lt;b&gt;x&lt;/b&gt;") && !o.contains("<b>x"),
            "{o}"
        );
        assert!(o.contains("/proc/&lt;meminfo&gt;: EIO"), "{o}");
        // The counts, when, and what is silenced.
        assert!(
            o.contains(
                "As of the latest pass 60 s ago: 5 findings (1 critical, 0 warning, 4 info); \
                 31 checks evaluated, 15 skipped"
            ),
            "{o}"
        );
        assert!(o.contains("1 silenced by audit.ignore"), "{o}");
        assert!(
            o.contains("Silenced by audit.ignore, not counted as findings: 1 (atime)."),
            "{o}"
        );
        // No finding, not checked, and not checked yet are three things.
        assert!(
            o.contains("<p><span class=\"ok\">No finding</span>: 9 checks evaluated.</p>"),
            "{o}"
        );
        assert!(
            o.contains("Not checked: none of its 9 checks could be evaluated"),
            "{o}"
        );
        assert!(
            o.contains("Not checked yet: the volume was added after the latest pass."),
            "{o}"
        );
        assert!(
            o.contains("Not checked yet: its collector has not read its settings"),
            "{o}"
        );
    }

    #[test]
    fn before_the_first_pass_the_section_says_so() {
        let mut o = String::new();
        section(&mut o, &AuditSnapshot::default(), &["mem"], &[], 0.0);
        assert!(o.contains("The audit has not run yet"), "{o}");
        assert!(!o.contains("No finding") && !o.contains("none"), "{o}");
        assert_eq!(
            notes(Of::Volume, "mem", Audited::NotRun),
            ["The storage-configuration audit has not run yet: its findings are not known."]
        );
    }

    #[test]
    fn a_volumes_notes_name_its_findings_and_count_the_host_wide() {
        let a = snapshot();
        let n = notes(Of::Volume, "mem", audited(&a, Of::Volume, "mem"));
        assert_eq!(n.len(), 3, "{n:?}");
        assert!(n[0].contains(
            "<code>memory_filesystem</code>: memory_filesystem &lt;means&gt; something."
        ));
        assert!(n[1].contains("<code>filesystem_choice</code>"));
        assert_eq!(
            n[2],
            "2 audit findings of the host's kernel settings hold for this volume too: \
             <a href=\"#audit-host\">thp_always, swappiness_high</a>."
        );
    }
}
