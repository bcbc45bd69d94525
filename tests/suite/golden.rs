//! The metric contract: a full scrape of a fixed-configuration run (one
//! configured volume with provisioned limits and a fixture cgroup v2 tree,
//! one PostgreSQL 18 cluster whose data directory is discovered) compared
//! against a golden list of series names and label sets
//! (tests/golden/series.txt). A rename, a dropped label or a new family
//! fails here until the golden file is updated on purpose:
//! `PGSE_UPDATE_GOLDEN=1 cargo test --test suite golden::`.
//!
//! Values are not compared; label values that depend on the machine or on
//! timing (device names, versions, wait events seen, paths) are replaced by
//! `*`, and the resulting set is deduplicated.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::pg::{PgKind, PgServer};
use common::*;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/series.txt");
/// The same run scraped as OpenMetrics (what Prometheus asks for): counter
/// families are named without `_total` there, and the text ends in `# EOF`.
const GOLDEN_OM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/golden/series.openmetrics.txt"
);

/// Labels whose values depend on the machine, the build or what happened
/// to be sampled, not on the configuration.
const VOLATILE: &[&str] = &[
    "device",
    "disk",
    "majmin",
    "fstype",
    "mountpoint",
    "path",
    "version",
    "revision",
    "rustc",
    "wait_event",
    "wait_event_type",
    "server_version",
    "major",
    "kernel",
    "data_directory",
    "goversion",
    "reason",
    "error",
    "backend_type",
    "object",
    "context",
    // The bound address: the port is picked by the kernel.
    "listener",
];

/// `name{k="v",...} value` → `name{k="v",...}` with volatile values as `*`.
fn normalize(line: &str) -> Option<String> {
    // Metric types are part of the contract (a counter turned gauge breaks
    // every rate() over it); help texts are not.
    if line.starts_with("# TYPE ") {
        return Some(line.to_string());
    }
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let series = match line.rfind(' ') {
        Some(i) => &line[..i],
        None => line,
    };
    let Some(open) = series.find('{') else {
        return Some(series.to_string());
    };
    let name = &series[..open];
    let body = series[open + 1..].trim_end_matches('}');
    let mut labels = Vec::new();
    let mut rest = body;
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq].trim_start_matches(',').to_string();
        let after = &rest[eq + 2..];
        // Label values are escaped Prometheus strings: find the closing
        // quote that is not preceded by a backslash.
        let mut end = 0;
        let bytes = after.as_bytes();
        while end < bytes.len() {
            if bytes[end] == b'\\' {
                end += 2;
                continue;
            }
            if bytes[end] == b'"' {
                break;
            }
            end += 1;
        }
        let value = &after[..end.min(after.len())];
        let shown = if VOLATILE.contains(&key.as_str()) {
            "*"
        } else {
            value
        };
        labels.push(format!("{key}=\"{shown}\""));
        rest = &after[(end + 1).min(after.len())..];
    }
    Some(format!("{name}{{{}}}", labels.join(",")))
}

/// Series that exist or not depending on what the device did: a read-IOPS
/// plateau is only reported when this run's sweep happened to show one.
/// Likewise the audit's findings, which are about the machine's own
/// kernel settings and mounts (the family's TYPE line is still compared),
/// and whether the first audit pass saw the cluster and its discovered
/// volumes depends on timing.
fn depends_on_the_device(series: &str) -> bool {
    series.contains("source=\"detected\"")
        || series.starts_with("pgstorage_audit_finding{")
        || series.starts_with("pgstorage_audit_evaluated_checks{")
        || after_a_wal_sync(series)
        || (!cfg!(feature = "bpf") && traced_syncs(series))
}

/// The series of the postgres.syncs collector that exist only where it
/// traces a cluster (the golden file is written by a build with the `bpf`
/// feature, as root; a build without it serves the families' TYPE lines
/// and why the collector is off, not these).
fn traced_syncs(series: &str) -> bool {
    series.starts_with("pgstorage_pg_sync_seconds")
        || series.starts_with("pgstorage_pg_sync_traced{")
}

/// Series that exist only while the collector's window holds a WAL sync
/// of PostgreSQL's: the cluster is idle here, but the bgwriter logs a
/// running-transactions record up to 15 s after the role was created and
/// the walwriter syncs it, before the exporter's first reading or after it
/// (the mean, the ceiling on PostgreSQL's basis and the ratio to the
/// probe; the last two also need the cluster's WAL on a volume of the
/// exporter's). Present in one run, absent in the next; when present they
/// are checked by `wal_sync_series_are_golden_when_present`.
fn after_a_wal_sync(series: &str) -> bool {
    series.starts_with("pgstorage_pg_wal_sync_mean_seconds{")
        || series.starts_with("pgstorage_pg_wal_sync_probe_ratio{")
        || (series.starts_with("pgstorage_commit_ceiling_per_second{")
            && series.contains("basis=\"postgres\""))
}

/// The series of [`after_a_wal_sync`] a scrape holds must be of families
/// whose type is in the golden file, and with the labels of their
/// siblings there: the cluster, the volume, the basis.
fn wal_sync_series_are_golden_when_present(golden: &str, scrape: &str) {
    let want = std::fs::read_to_string(golden).unwrap();
    for s in scrape.lines().filter_map(normalize) {
        if !after_a_wal_sync(&s) {
            continue;
        }
        let family = &s[..s.find('{').unwrap()];
        assert!(
            want.lines().any(|l| l
                .strip_prefix("# TYPE ")
                .is_some_and(|t| t.split_whitespace().next() == Some(family))),
            "{s}: its family has no type in {golden}"
        );
        let labels = &s[family.len()..];
        assert!(
            [
                "{cluster=\"c\"}",
                "{cluster=\"c\",volume=\"t\"}",
                "{volume=\"t\",basis=\"postgres\"}",
            ]
            .contains(&labels),
            "{s}: not the labels of its family's other series in {golden}"
        );
        eprintln!("after a WAL sync of PostgreSQL's: {s}");
    }
}

fn series_set(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter_map(normalize)
        .filter(|s| !depends_on_the_device(s))
        .collect()
}

#[test]
fn full_scrape_matches_the_golden_series_list() {
    let Some(pg) = PgServer::start(PgKind::V18, None) else {
        return;
    };
    pg.create_role("mon", "Mon-Pa55word-golden", true);
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    let disk = disk_of(&vol);
    let cg = dir.path().join("cgroup");
    std::fs::create_dir_all(cg.join("system.slice/postgresql.service")).unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "cpu io memory").unwrap();
    std::fs::write(
        cg.join("system.slice/postgresql.service/io.max"),
        format!("{disk} rbps=max wbps=104857600 riops=3000 wiops=500\n"),
    )
    .unwrap();
    std::fs::write(
        cg.join("system.slice/postgresql.service/io.stat"),
        format!("{disk} rbytes=0 wbytes=0 rios=0 wios=0\n"),
    )
    .unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "window = \"1m\"\nlimits_interval = \"500ms\"\ncgroup_root = \"{cg}\"\n\
             [defaults]\ninterval = \"100ms\"\nbusy_every = \"5s\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\nsweep_every = \"1m\"\nsweep_duration = \"1s\"\n\
             [[volume]]\nname = \"t\"\npath = \"{vol}\"\ncgroup = \"/system.slice/postgresql.service\"\n\
             provisioned_read_iops = 3000\nprovisioned_write_iops = 3000\nprovisioned_write_throughput = \"125MiB\"\n\
             [[cluster]]\nname = \"c\"\ndsn = \"{dsn}\"\nscrape_interval = \"500ms\"\nwait_sampling_interval = \"200ms\"\n",
            cg = cg.display(),
            vol = vol.display(),
            dsn = pg.dsn("mon", "Mon-Pa55word-golden"),
        ),
    )
    .unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    // Everything that appears once the run has settled: the cluster's
    // snapshot, a discovered volume's busy window, the limits snapshot, the
    // probe ceilings (after three bursts).
    let scrape = ex.wait_for(
        "a settled scrape: cluster up, volume bursting, limits read",
        Duration::from_secs(60),
        |m| {
            sample(m, "pgstorage_pg_up{cluster=\"c\"}") == Some(1.0)
                && sample(
                    m,
                    "pgstorage_commit_ceiling_per_second{volume=\"t\",basis=\"probe_mean\"}",
                )
                .is_some()
                && m.lines().any(|l| {
                    l.starts_with("pgstorage_probe_window_samples{")
                        && l.contains("volume=\"t\"")
                        && l.contains("op=\"read\"")
                        && l.contains("phase=\"busy\"")
                })
                && m.contains("pgstorage_io_limit{")
                && m.contains("pgstorage_sweep_read_iops{")
                && (!cfg!(feature = "bpf")
                    || sample(m, "pgstorage_pg_sync_traced{cluster=\"c\",reason=\"ok\"}")
                        == Some(1.0))
        },
    );
    let (status, _, om) = http_get(
        ex.addr,
        "/metrics",
        Some("application/openmetrics-text; version=1.0.0"),
    );
    assert_eq!(status, 200);
    assert!(om.ends_with("# EOF\n"), "OpenMetrics ends in # EOF");
    let got = series_set(&scrape);
    compare(GOLDEN, &got);
    compare(GOLDEN_OM, &series_set(&om));
    wal_sync_series_are_golden_when_present(GOLDEN, &scrape);
    wal_sync_series_are_golden_when_present(GOLDEN_OM, &om);
    assert!(got.len() > 300, "{} series", got.len());
}

/// Compares against a golden file, or rewrites it when asked to.
fn compare(golden: &str, got: &BTreeSet<String>) {
    if std::env::var_os("PGSE_UPDATE_GOLDEN").is_some() {
        let mut text = String::new();
        for s in got {
            text.push_str(s);
            text.push('\n');
        }
        std::fs::write(golden, text).unwrap();
        return;
    }
    let want: BTreeSet<String> = std::fs::read_to_string(golden)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty() && !depends_on_the_device(l))
        .map(str::to_string)
        .collect();
    let missing: Vec<_> = want.difference(got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "scrape differs from {golden}\nmissing ({}):\n{}\nextra ({}):\n{}",
        missing.len(),
        missing
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        extra.len(),
        extra
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
    );
}
