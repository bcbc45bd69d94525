//! `--collector.NAME` / `--no-collector.NAME` against the real exporter:
//! probes (and their split into write and sync), limits, and, against a
//! real PostgreSQL 18, the statistics views, pg_stat_io's zero rows and
//! buffer-pool columns, and wait-event sampling. Each switch is checked
//! from both sides: what it removes is gone, and what it keeps is there.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::pg::PgKind;
use common::stack::Stack;
use common::*;

fn has_series(m: &str, prefix: &str) -> bool {
    m.lines().any(|l| l.starts_with(prefix))
}

/// The probe series of `op` in any probe latency family.
fn has_op(m: &str, op: &str) -> bool {
    let needle = format!("op=\"{op}\"");
    m.lines().any(|l| {
        (l.starts_with("pgstorage_probe_seconds") || l.starts_with("pgstorage_probe_window_"))
            && l.contains(&needle)
    })
}

fn probes_with(extra: &[&str]) -> (tempfile::TempDir, Exporter, String) {
    let dir = tempfile::Builder::new()
        .prefix("pgse-collectors-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mut args = fast_probe_args(&format!("v={}", dir.path().display()));
    args.extend(["--probe.busy-every".to_string(), "5s".to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let ex = Exporter::start(&refs);
    // A busy burst and a few lone rounds of both probes.
    let m = ex.wait_for("busy commits and reads", Duration::from_secs(30), |m| {
        sample(
            m,
            "pgstorage_probe_seconds_count{volume=\"v\",op=\"commit\",phase=\"busy\"}",
        )
        .is_some_and(|n| n > 0.0)
            && sample(
                m,
                "pgstorage_probe_seconds_count{volume=\"v\",op=\"read\",phase=\"busy\"}",
            )
            .is_some_and(|n| n > 0.0)
    });
    (dir, ex, m)
}

#[test]
fn commit_split_is_opt_in() {
    let (_d, ex, m) = probes_with(&[]);
    assert!(has_op(&m, "commit") && has_op(&m, "read"), "{m}");
    // One scrape, one snapshot: the histogram and the window summary count
    // the same samples, also while probes run every 100 ms.
    for _ in 0..20 {
        let m = ex.metrics();
        for op in ["commit", "read"] {
            for phase in ["busy", "after_idle"] {
                let labels = format!("{{volume=\"v\",op=\"{op}\",phase=\"{phase}\"}}");
                assert_eq!(
                    sample(&m, &format!("pgstorage_probe_seconds_count{labels}")),
                    sample(&m, &format!("pgstorage_probe_window_seconds_count{labels}")),
                    "{op} {phase}"
                );
            }
        }
    }
    assert!(!has_op(&m, "write") && !has_op(&m, "sync"), "{m}");
    promtool_check_metrics(&m);

    let (_d, ex, m) = probes_with(&["--collector.probes.split"]);
    for op in ["write", "sync", "commit", "read"] {
        assert!(has_op(&m, op), "op {op} missing:\n{m}");
    }
    // Same families, same labels: only the op set grows. The split's
    // halves add up to the commit they came from, within the clock's
    // resolution per probe.
    let get = |op: &str, what: &str| {
        sample(
            &m,
            &format!("pgstorage_probe_seconds_{what}{{volume=\"v\",op=\"{op}\",phase=\"busy\"}}"),
        )
        .unwrap()
    };
    assert_eq!(get("write", "count"), get("commit", "count"));
    assert_eq!(get("sync", "count"), get("commit", "count"));
    let parts = get("write", "sum") + get("sync", "sum");
    let commit = get("commit", "sum");
    assert!(
        parts <= commit * 1.01 + 1e-4 && parts >= commit * 0.9,
        "write + sync {parts} vs commit {commit}"
    );
    let log = ex.log();
    assert!(
        log.contains("collectors differ from the defaults")
            && log.contains("--collector.probes.split"),
        "{log}"
    );
}

#[test]
fn probes_and_limits_can_be_turned_off() {
    let dir = tempfile::Builder::new()
        .prefix("pgse-collectors-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mut args = fast_probe_args(&format!("v={}", dir.path().display()));
    args.extend([
        "--no-collector.probes".to_string(),
        "--no-collector.limits".to_string(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let ex = Exporter::start(&refs);
    std::thread::sleep(Duration::from_millis(1500));
    let m = ex.metrics();
    for gone in [
        "pgstorage_volume_info",
        "pgstorage_probe_seconds",
        "pgstorage_io_limit_cgroup_info",
        "pgstorage_collector_success{collector=\"limits\"}",
        "pgstorage_collector_success{collector=\"probe:v\"}",
        // limits.ebs goes with its parent.
        "pgstorage_ebs_available",
    ] {
        assert!(!has_series(&m, gone), "{gone} still served:\n{m}");
    }
    assert!(has_series(&m, "pgstorage_build_info"), "{m}");
    // Nothing was written on the volume: no probe directory.
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
    // --no-collector.probes is a deliberate choice, not a mistake to warn about.
    assert!(!ex.log().contains("level=WARN"), "{}", ex.log());

    // The default volume is not probed either.
    let ex = Exporter::start(&["--no-collector.probes"]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!has_series(&ex.metrics(), "pgstorage_volume_info"));
}

/// pg_stat_io rows by (backend_type, object, context): each row's values.
fn io_rows(m: &str) -> BTreeMap<String, Vec<(String, f64)>> {
    let mut rows: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    for l in m.lines().filter(|l| l.starts_with("pgstorage_pg_io_")) {
        if l.starts_with("pgstorage_pg_io_timing_enabled") {
            continue;
        }
        let (series, value) = l.rsplit_once(' ').unwrap();
        let labels = &series[series.find('{').unwrap() + 1..series.len() - 1];
        let key: Vec<&str> = labels
            .split("\",")
            .filter(|kv| {
                kv.starts_with("backend_type=")
                    || kv.starts_with("object=")
                    || kv.starts_with("context=")
            })
            .collect();
        let op = labels
            .split("\",")
            .find_map(|kv| kv.strip_prefix("op=\""))
            .unwrap()
            .trim_end_matches('"')
            .to_string();
        rows.entry(key.join(","))
            .or_default()
            .push((op, value.parse().unwrap()));
    }
    rows
}

#[test]
fn postgres_collectors_on_postgresql_18() {
    let stack = |args: &'static [&'static str]| {
        Stack::builder()
            .pg_version(PgKind::V18)
            .password("Mon-Pa55word-4-tests")
            .role("mon", true)
            .cluster(
                "c",
                "mon",
                "scrape_interval = \"500ms\"\nwait_sampling_interval = \"200ms\"\ndiscover_volumes = false",
            )
            .args(args)
            .ready_pg_up("c")
            .start()
    };
    // Defaults: pg_stat_io without all-zero rows and without the
    // buffer-pool columns; wait events sampled.
    let Some(s) = stack(&[]) else {
        return;
    };
    s.pg.pgbench_inserts(2, 3);
    let m = s.ex.wait_for(
        "pg_stat_io and a wait event",
        Duration::from_secs(30),
        |m| {
            has_series(m, "pgstorage_pg_io_operations_total{")
                && has_series(m, "pgstorage_pg_wait_event_seconds_total{")
        },
    );
    let rows = io_rows(&m);
    assert!(!rows.is_empty(), "{m}");
    for (row, ops) in &rows {
        assert!(
            ops.iter().any(|(_, v)| *v != 0.0),
            "all-zero row {row}: {ops:?}"
        );
        assert!(
            ops.iter()
                .all(|(op, _)| !["hit", "eviction", "reuse"].contains(&op.as_str())),
            "buffer-pool op in {row}: {ops:?}"
        );
    }
    let default_rows = rows.len();
    // What the exporter dropped is really there in PostgreSQL: more rows in
    // the view than in /metrics.
    let in_view: usize =
        s.pg.psql("SELECT count(*) FROM pg_stat_io")
            .parse()
            .unwrap();
    assert!(
        in_view > default_rows,
        "{in_view} rows in pg_stat_io, {default_rows} served"
    );
    drop(s);

    // Everything: every row of the view, hits included.
    let s = stack(&[
        "--collector.postgres.io.zero-rows",
        "--collector.postgres.io.buffers",
    ])
    .unwrap();
    let m = s.ex.wait_for("pg_stat_io", Duration::from_secs(30), |m| {
        has_series(m, "pgstorage_pg_io_operations_total{")
    });
    let rows = io_rows(&m);
    let in_view: usize =
        s.pg.psql("SELECT count(*) FROM pg_stat_io")
            .parse()
            .unwrap();
    assert_eq!(rows.len(), in_view, "every row of pg_stat_io");
    assert!(rows.values().any(|ops| ops.iter().all(|(_, v)| *v == 0.0)));
    assert!(m.contains("op=\"hit\""), "{m}");
    println!(
        "pg_stat_io on PostgreSQL 18: {default_rows} rows served by default, {in_view} with \
         --collector.postgres.io.zero-rows"
    );
    drop(s);

    // No pg_stat_io, no wait sampling; the rest of the statistics stay.
    let s = stack(&[
        "--no-collector.postgres.io",
        "--no-collector.postgres.waits",
    ])
    .unwrap();
    s.pg.pgbench_inserts(2, 2);
    std::thread::sleep(Duration::from_millis(1500));
    let m = s.ex.metrics();
    assert!(!has_series(&m, "pgstorage_pg_io_operations_total{"), "{m}");
    assert!(
        !has_series(&m, "pgstorage_pg_wait_event_seconds_total{"),
        "{m}"
    );
    assert!(has_series(&m, "pgstorage_pg_wal_syncs_total{"), "{m}");
    drop(s);

    // The statistics views off: the connection still answers pg_up, the
    // version and the settings.
    let s = stack(&["--no-collector.postgres"]).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let m = s.ex.metrics();
    assert_eq!(sample(&m, "pgstorage_pg_up{cluster=\"c\"}"), Some(1.0));
    assert!(has_series(&m, "pgstorage_pg_info{"), "{m}");
    assert!(has_series(&m, "pgstorage_pg_setting{"), "{m}");
    for gone in [
        "pgstorage_pg_wal_syncs_total{",
        "pgstorage_pg_commits_total{",
        "pgstorage_pg_io_operations_total{",
        "pgstorage_pg_wait_event_seconds_total{",
    ] {
        assert!(!has_series(&m, gone), "{gone} still served:\n{m}");
    }
}
