//! The `pgstorage_audit_*` families: one series per finding (absent when
//! a check passes) and counters that tell "no finding" from "not checked".

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;

use crate::audit::{AuditSnapshot, Finding};
use crate::families;

type Row<'a> = (Vec<(&'static str, &'a str)>, f64);

fn row<'a>(f: &'a Finding, scope: Option<(&'static str, &'a str)>) -> Row<'a> {
    let mut l = vec![("code", f.code), ("severity", f.severity.as_str())];
    l.extend(scope);
    (l, 1.0)
}

pub(crate) fn encode(enc: &mut DescriptorEncoder<'_>, s: &AuditSnapshot) -> fmt::Result {
    let mut rows: Vec<Row<'_>> = Vec::new();
    if let Some(r) = &s.last {
        // Host findings carry neither label: they hold for every volume
        // and cluster on the machine.
        rows.extend(r.host.findings.iter().map(|f| row(f, None)));
        for (v, o) in &r.volumes {
            rows.extend(
                o.findings
                    .iter()
                    .map(|f| row(f, Some(("volume", v.as_str())))),
            );
        }
        for (c, o) in &r.clusters {
            rows.extend(
                o.findings
                    .iter()
                    .map(|f| row(f, Some(("cluster", c.as_str())))),
            );
        }
    }
    families::gauge(
        enc,
        "pgstorage_audit_finding",
        "1 for each storage-configuration audit finding (code, severity, volume or cluster; neither for host-wide kernel settings); absent when the check passes. See docs/audit.md",
        rows,
    )?;
    let mut evaluated: Vec<(Vec<(&str, &str)>, f64)> = Vec::new();
    if let Some(r) = &s.last {
        evaluated.push((Vec::new(), f64::from(r.host.checked)));
        for (v, o) in &r.volumes {
            evaluated.push((vec![("volume", v.as_str())], f64::from(o.checked)));
        }
        for (c, o) in &r.clusters {
            evaluated.push((vec![("cluster", c.as_str())], f64::from(o.checked)));
        }
    }
    families::gauge(
        enc,
        "pgstorage_audit_evaluated_checks",
        "Checks the latest audit pass evaluated for the host (no label), a volume or a cluster; a cluster is absent until its collector has read its settings. 0 or absent: not checked, whatever pgstorage_audit_finding shows",
        evaluated,
    )?;
    families::counter(
        enc,
        "pgstorage_audit_checks",
        "Audit checks run, result = evaluated or skipped (a fact they need could not be read)",
        [
            ([("result", "evaluated")], s.checks_evaluated as f64),
            ([("result", "skipped")], s.checks_skipped as f64),
        ],
    )?;
    families::counter(
        enc,
        "pgstorage_audit_errors",
        "Files the audit found but could not read or parse",
        [([] as [(&str, &str); 0], s.read_errors as f64)],
    )?;
    families::counter(
        enc,
        "pgstorage_audit_runs",
        "Audit passes completed",
        [([] as [(&str, &str); 0], s.runs as f64)],
    )?;
    families::gauge(
        enc,
        "pgstorage_audit_last_run_timestamp_seconds",
        "Unix time of the latest audit pass; absent before the first",
        s.last_run.map(|t| ([] as [(&str, &str); 0], t)),
    )
}
