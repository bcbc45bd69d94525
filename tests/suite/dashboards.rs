//! The Grafana dashboards in dashboards/, checked without Grafana: valid
//! JSON in the Grafana 10/11 schema, the data source as a variable, the
//! template variables every dashboard needs, a description on every panel,
//! and PromQL that uses the dashboard variables only as regexes (so "All"
//! and multi-value selections work). tests/suite/e2e_prometheus.rs evaluates every
//! expression against a real Prometheus.

use crate::common;

use std::collections::HashSet;

use common::kit;

#[test]
fn dashboards_are_grafana_10_json_with_a_datasource_variable() {
    let mut uids = HashSet::new();
    for (file, d) in kit::dashboards() {
        let schema = d["schemaVersion"].as_u64().unwrap_or(0);
        assert!(
            (36..=41).contains(&schema),
            "{file}: schemaVersion {schema} is not Grafana 10/11"
        );
        let uid = d["uid"].as_str().unwrap_or("");
        assert!(!uid.is_empty() && uid.len() <= 40, "{file}: uid {uid:?}");
        assert!(uids.insert(uid.to_string()), "{file}: uid {uid} reused");
        assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()), "{file}");

        let vars = d["templating"]["list"].as_array().unwrap();
        let names: Vec<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
        for needed in ["datasource", "job", "instance", "cluster", "volume"] {
            assert!(names.contains(&needed), "{file}: no ${needed} variable");
        }
        for v in vars {
            let name = v["name"].as_str().unwrap();
            if name == "datasource" {
                assert_eq!(v["type"], "datasource", "{file}");
                assert_eq!(v["query"], "prometheus", "{file}");
            } else {
                assert_eq!(v["type"], "query", "{file}: ${name}");
                assert_eq!(v["datasource"]["uid"], "${datasource}", "{file}: ${name}");
                assert_eq!(v["includeAll"], true, "{file}: ${name}");
                assert_eq!(v["allValue"], ".*", "{file}: ${name}");
            }
        }

        let mut ids = HashSet::new();
        for p in kit::panels(&d) {
            let title = p["title"].as_str().unwrap_or("");
            let id = p["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("{file}: {title}: no id"));
            assert!(ids.insert(id), "{file}: panel id {id} reused");
            assert!(
                p["gridPos"]["w"].as_u64().is_some(),
                "{file}: {title}: gridPos"
            );
            if p["type"] == "row" {
                continue;
            }
            assert!(!title.is_empty(), "{file}: panel {id} has no title");
            let desc = p["description"].as_str().unwrap_or("");
            assert!(
                desc.len() >= 80 && desc.contains("How to read it"),
                "{file}: {title}: every panel's description says how to read it: {desc:?}"
            );
            assert_eq!(
                p["datasource"]["uid"], "${datasource}",
                "{file}: {title}: datasource"
            );
            let targets = p["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "{file}: {title}: no targets");
            for t in targets {
                assert_eq!(
                    t["datasource"]["uid"], "${datasource}",
                    "{file}: {title}: target datasource"
                );
                assert!(t["expr"].as_str().is_some_and(|e| !e.is_empty()));
            }
        }
    }
}

#[test]
fn dashboard_variables_are_used_as_regexes() {
    let mut n = 0;
    for (file, d) in kit::dashboards() {
        for q in kit::dashboard_queries(&file, &d) {
            n += 1;
            for var in ["job", "instance", "cluster", "volume"] {
                for form in [format!("${var}"), format!("${{{var}}}")] {
                    let mut from = 0;
                    while let Some(i) = q.raw[from..].find(&form) {
                        let at = from + i;
                        from = at + form.len();
                        assert!(
                            q.raw[..at].ends_with("=~\""),
                            "{file}: {}: {form} must be used as `label=~\"{form}\"`: {}",
                            q.title,
                            q.raw
                        );
                    }
                }
            }
            // Substitution leaves no variable behind.
            let _ = kit::substitute(&q.raw);
        }
    }
    eprintln!("{n} dashboard expressions checked");
    assert!(n > 40, "{n}");
}

#[test]
fn dashboards_cover_what_the_issue_asks_for() {
    let all: Vec<(String, String)> = kit::dashboards()
        .iter()
        .flat_map(|(f, d)| kit::dashboard_queries(f, d).into_iter())
        .map(|q| (q.title, q.raw))
        .collect();
    let has = |needle: &str| all.iter().any(|(_, e)| e.contains(needle));
    for needle in [
        "pgstorage_commit_ceiling_in_force_per_second",
        "pgstorage_pg_commits_total",
        "pgstorage_io_limit_utilization_ratio",
        "pgstorage_io_limit{",
        "pgstorage_volume_info",
        "pgstorage_probe_seconds_bucket",
        "pgstorage_probe_window_seconds",
        "instance_volume_op:pgstorage_probe_seconds:p99_1h:median_7d",
        "pgstorage_pg_io_operations_total",
        "pgstorage_pg_wal_sync_mean_seconds",
        "pgstorage_pg_wait_event_seconds_total",
        "pgstorage_probe_slowdown_ratio",
        "pgstorage_ebs_volume_performance_exceeded_iops_seconds_total",
        "pgstorage_ebs_instance_performance_exceeded_tp_seconds_total",
        "instance_volume:pgstorage_commit_latency_seconds:mean_5m:min_1d",
        "phase=\"busy\"",
        "phase=\"after_idle\"",
    ] {
        assert!(has(needle), "no dashboard expression uses {needle}");
    }
    // The latency dashboard shows both figures: busy, and what a lone probe
    // after a pause costs.
    let after_idle_panel = all.iter().any(|(title, e)| {
        title == "After-idle latency"
            && e.contains("pgstorage_probe_window_seconds")
            && e.contains("phase=\"after_idle\"")
    });
    assert!(
        after_idle_panel,
        "no After-idle latency panel on the window quantiles"
    );
    let heatmaps = kit::dashboards()
        .iter()
        .flat_map(|(_, d)| {
            kit::panels(d)
                .into_iter()
                .filter(|p| p["type"] == "heatmap")
                .map(|p| p["targets"][0]["format"].as_str().unwrap_or("").to_string())
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>();
    assert!(
        heatmaps.len() >= 2 && heatmaps.iter().all(|f| f == "heatmap"),
        "{heatmaps:?}"
    );
}

#[test]
fn the_phase_check_sees_what_it_should() {
    let (m, n) = kit::selectors_without_phase(
        "sum by (le) (rate(pgstorage_probe_seconds_bucket{op=\"sync\"}[5m])) \
         / pgstorage_probe_window_samples \
         + pgstorage_probe_window_seconds{phase=\"busy\", op=\"read\"} \
         + instance_volume_op:pgstorage_probe_seconds:p99_1h{op=\"sync\"} \
         + pgstorage_probe_in_flight_seconds{volume=\"pgstorage_probe_seconds\"}",
    );
    assert_eq!(n, 4, "{m:?}");
    assert_eq!(
        m,
        [
            "pgstorage_probe_seconds_bucket{op=\"sync\"}",
            "pgstorage_probe_window_samples",
            "instance_volume_op:pgstorage_probe_seconds:p99_1h{op=\"sync\"}",
        ]
    );
}

#[test]
fn probe_queries_pick_a_phase() {
    let mut checked = 0;
    let mut missing = Vec::new();
    for (file, d) in kit::dashboards() {
        for q in kit::dashboard_queries(&file, &d) {
            let (m, n) = kit::selectors_without_phase(&q.raw);
            checked += n;
            missing.extend(m.into_iter().map(|s| format!("{file}: {}: {s}", q.title)));
        }
    }
    assert!(
        missing.is_empty(),
        "selectors on the probe families must pick a phase (phase=\"busy\" for what a loaded \
         server sees, phase=\"after_idle\" for a lone probe after a pause):\n{}",
        missing.join("\n")
    );
    eprintln!("{checked} selectors on the probe families pick a phase");
    assert!(checked > 20, "{checked}");
}
