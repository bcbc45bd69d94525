//! The Prometheus rules of deploy/prometheus/: `promtool check rules` on the
//! rule files, `promtool test rules` on the unit tests in
//! deploy/prometheus/tests/ (every alert fires on some synthetic series and
//! stays silent on others), and the conventions the operator relies on:
//! every alert has a summary, a description and a runbook_url whose section
//! exists in docs/runbook.md.
//!
//! Needs `promtool` (Debian package `prometheus`; ./scripts/test installs
//! it). A missing promtool fails the test with that message.

use crate::common;

use common::kit::{self, RULE_FILES, output_text, repo, run_tool};

const PROMTOOL_HINT: &str = "promtool not found: install the Debian package `prometheus` \
                             (apt-get install prometheus; ./scripts/test does it)";

fn rule_test_files() -> Vec<String> {
    let dir = repo("deploy/prometheus/tests");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .map(|p| {
            p.strip_prefix(repo("."))
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no rule tests in {}", dir.display());
    files
}

#[test]
fn promtool_check_rules_accepts_the_rule_files() {
    let mut args = vec!["check", "rules"];
    args.extend_from_slice(RULE_FILES);
    let out = run_tool("promtool", &args, PROMTOOL_HINT);
    let text = output_text(&out);
    eprintln!("promtool {}:\n{text}", args.join(" "));
    assert!(out.status.success(), "promtool check rules failed:\n{text}");
    for f in RULE_FILES {
        assert!(text.contains(&format!("Checking {f}")), "{text}");
    }
    assert_eq!(
        text.matches("SUCCESS").count(),
        RULE_FILES.len(),
        "every file checked: {text}"
    );
}

#[test]
fn promtool_test_rules_passes() {
    let files = rule_test_files();
    let mut args = vec!["test", "rules"];
    args.extend(files.iter().map(String::as_str));
    let out = run_tool("promtool", &args, PROMTOOL_HINT);
    let text = output_text(&out);
    eprintln!("promtool {}:\n{text}", args.join(" "));
    assert!(out.status.success(), "promtool test rules failed:\n{text}");
    assert!(!text.contains("FAILED"), "{text}");
    assert_eq!(
        text.matches("SUCCESS").count(),
        files.len(),
        "every test file passed: {text}"
    );
}

/// An alerting rule as written in alerts.rules.yml (the file keeps one key
/// per line, so a line-based reading is enough).
#[derive(Debug, Default)]
struct Alert {
    name: String,
    summary: bool,
    description: bool,
    runbook_url: Option<String>,
    severity: Option<String>,
}

fn alerts() -> Vec<Alert> {
    let text = std::fs::read_to_string(repo("deploy/prometheus/alerts.rules.yml")).unwrap();
    let mut out: Vec<Alert> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("- alert:") {
            out.push(Alert {
                name: name.trim().to_string(),
                ..Alert::default()
            });
            continue;
        }
        let Some(a) = out.last_mut() else { continue };
        if let Some(v) = t.strip_prefix("summary:") {
            a.summary = !v.trim().trim_matches('"').is_empty();
        } else if let Some(v) = t.strip_prefix("description:") {
            // A folded block (>-) continues on the next lines.
            a.description = !v.trim().is_empty();
        } else if let Some(v) = t.strip_prefix("runbook_url:") {
            a.runbook_url = Some(v.trim().trim_matches('"').to_string());
        } else if let Some(v) = t.strip_prefix("severity:") {
            a.severity = Some(v.trim().to_string());
        }
    }
    out
}

/// GitHub's anchor for a Markdown heading: lower case, spaces to dashes,
/// punctuation other than `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_has_summary_description_and_a_runbook_section() {
    let alerts = alerts();
    let names: Vec<&str> = alerts.iter().map(|a| a.name.as_str()).collect();
    eprintln!("{} alerts: {}", alerts.len(), names.join(", "));
    for expected in [
        "PgStorageWalSyncLatencyDrift",
        "PgStorageProbeStalled",
        "PgStorageProbeFailing",
        "PgStorageWalSyncSaturated",
        "PgStorageWalSyncSaturatedEstimated",
        "PgStorageIOCapSaturated",
        "PgStorageCommitsThrottledByCap",
        "PgStorageSyncSuspiciouslyFast",
        "PgStoragePostgresUnreachable",
        "PgStorageExporterDown",
    ] {
        assert!(names.contains(&expected), "{expected} missing: {names:?}");
    }
    let runbook = std::fs::read_to_string(repo("docs/runbook.md")).unwrap();
    let anchors: Vec<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(anchor)
        .collect();
    for a in &alerts {
        assert!(a.summary, "{}: no summary", a.name);
        assert!(a.description, "{}: no description", a.name);
        assert!(
            matches!(a.severity.as_deref(), Some("warning" | "critical")),
            "{}: severity {:?}",
            a.name,
            a.severity
        );
        let url = a
            .runbook_url
            .as_deref()
            .unwrap_or_else(|| panic!("{}: no runbook_url", a.name));
        let (file, frag) = url
            .split_once('#')
            .unwrap_or_else(|| panic!("{}: runbook_url {url} has no #anchor", a.name));
        assert_eq!(file, "docs/runbook.md", "{}: {url}", a.name);
        assert_eq!(
            frag,
            a.name.to_lowercase(),
            "{}: the anchor is the alert's name",
            a.name
        );
        assert!(
            anchors.iter().any(|x| x == frag),
            "{}: docs/runbook.md has no section #{frag} (sections: {anchors:?})",
            a.name
        );
    }
}

#[test]
fn every_alert_is_tested_firing_and_silent() {
    let mut firing: Vec<String> = Vec::new();
    let mut silent: Vec<String> = Vec::new();
    for f in rule_test_files() {
        let text = std::fs::read_to_string(repo(&f)).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, l) in lines.iter().enumerate() {
            let Some(name) = l.strip_prefix("alertname:") else {
                continue;
            };
            let next = lines[i + 1..]
                .iter()
                .find(|l| l.starts_with("exp_alerts:"))
                .unwrap_or_else(|| panic!("{f}: {name} without exp_alerts"));
            let name = name.trim().to_string();
            if next.trim_end() == "exp_alerts: []" {
                silent.push(name);
            } else {
                firing.push(name);
            }
        }
    }
    for a in alerts() {
        assert!(
            firing.contains(&a.name),
            "{}: no test where it fires",
            a.name
        );
        assert!(
            silent.contains(&a.name),
            "{}: no test where it stays silent",
            a.name
        );
    }
    eprintln!(
        "alert test cases: {} firing, {} silent",
        firing.len(),
        silent.len()
    );
}

/// Every rule that reads the probe families (or what is recorded from them)
/// picks a phase: busy for rates, quantiles, the baseline and the alerts,
/// after_idle only in the after_idle_* recordings. The rule files keep one
/// key per line; comments and the `record:` names are left out.
#[test]
fn rules_on_the_probe_families_pick_a_phase() {
    let (m, n) = kit::selectors_without_phase(
        "rate(pgstorage_probe_seconds_bucket{op=\"sync\"}[5m]) \
         + instance_volume_op:pgstorage_probe_seconds:p99_1h{phase=\"busy\"}",
    );
    assert_eq!((m.len(), n), (1, 2), "the check itself: {m:?}");

    let mut checked = 0;
    let mut missing = Vec::new();
    for f in RULE_FILES {
        let text = std::fs::read_to_string(repo(f)).unwrap();
        for (i, line) in text.lines().enumerate() {
            let t = line.trim_start();
            if t.starts_with('#') || t.starts_with("- record:") {
                continue;
            }
            let (m, n) = kit::selectors_without_phase(line);
            checked += n;
            missing.extend(m.into_iter().map(|s| format!("{f}:{}: {s}", i + 1)));
        }
    }
    assert!(
        missing.is_empty(),
        "selectors on the probe families must pick a phase:\n{}",
        missing.join("\n")
    );
    eprintln!("{checked} selectors on the probe families pick a phase");
    assert!(checked >= 15, "{checked}");
}
