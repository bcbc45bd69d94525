//! End to end with a real Prometheus: the exporter probes a temp volume and
//! watches a real PostgreSQL (tests/suite/common/pg.rs) as a pg_monitor-only role,
//! with volume discovery on so the cluster's WAL volume is known; a real
//! Prometheus (the Debian package's `prometheus` binary) on loopback scrapes
//! it every second with the rule files of deploy/prometheus loaded; a short
//! pgbench load runs. Then every PromQL expression of the dashboards and of
//! the rules goes through Prometheus' HTTP API with no error, the core
//! panels return data, and every metric and label name they use exists in
//! docs/metrics.md or in the real scrape. That test runs on every supported
//! PostgreSQL version, 14 to 18 (before 16 there is no pg_stat_io, so its
//! panel is the one core panel left empty there), with one line per version.
//!
//! A second test (root and cgroup v1 blkio, like tests/suite/limits.rs) puts the
//! WAL on a loop device capped at 100 write IOPS and evaluates the
//! PgStorageWalSyncSaturated alert's expression under a writing and a
//! read-only pgbench load, and watches PgStorageCommitsThrottledByCap go from
//! silent (cap far above the load) to firing (writes at the cap) and back
//! to silent (read-only load on the cap).
//!
//! Fails when PostgreSQL is not installed, unless PostgreSQL tests are left
//! out. A missing `prometheus` binary
//! fails with the package to install. Prometheus is stopped, and its temp
//! dir removed, when the test ends, also when it fails.

use crate::common;

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::pg::{self, PgKind, PgServer};
use common::stack::{Stack, StackBuilder};
use common::{http_get, kit, loopdev};

const MON_PASSWORD: &str = "Mon-Pa55word-4-e2e";
const JOB: &str = "pg-storage-exporter";

/// A Prometheus server on a free loopback port with a temp config and
/// storage dir. Dropping it stops the server (SIGTERM, then SIGKILL after
/// 10 s) and removes the dir.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Prometheus {
        let files: Vec<PathBuf> = kit::RULE_FILES.iter().map(|f| kit::repo(f)).collect();
        Prometheus::start_with_rules(target, &files)
    }

    fn start_with_rules(target: SocketAddr, rule_files: &[PathBuf]) -> Prometheus {
        let mut dir = tempfile::Builder::new()
            .prefix("pgse-prometheus-")
            .tempdir()
            .unwrap();
        let rules: Vec<String> = rule_files
            .iter()
            .map(|f| format!("  - {}\n", f.display()))
            .collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n{}\
             scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      - targets: ['{target}']\n",
            rules.concat()
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        for attempt in 1..=5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
            let child = Command::new("prometheus")
                .arg(format!(
                    "--config.file={}",
                    dir.path().join("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--storage.tsdb.retention.time=1h")
                .arg("--log.level=info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot run `prometheus` ({e}): install the Debian package `prometheus` \
                         (apt-get install prometheus; ./scripts/test does it)"
                    )
                });
            let mut p = Prometheus { child, addr, dir };
            if p.wait_ready(Duration::from_secs(30)) {
                return p;
            }
            let log = p.log();
            if !log.contains("address already in use") || attempt == 5 {
                panic!("Prometheus did not become ready on {addr}; log:\n{log}");
            }
            // Port taken in the meantime: stop this one, try another port.
            p.stop();
            dir = std::mem::replace(&mut p.dir, tempfile::tempdir().unwrap());
        }
        unreachable!()
    }

    fn wait_ready(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
                && http_get(self.addr, "/-/ready", None).0 == 200
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// GET an API path; the parsed JSON body.
    fn api(&self, path: &str) -> serde_json::Value {
        let (status, _, body) = http_get(self.addr, path, None);
        let v: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{path}: HTTP {status}, not JSON ({e}): {body}"));
        v
    }

    /// Instant query: Ok(result array) or Err(Prometheus' error).
    fn query(&self, expr: &str) -> Result<Vec<serde_json::Value>, String> {
        let v = self.api(&format!("/api/v1/query?query={}", kit::urlencode(expr)));
        if v["status"] != "success" {
            return Err(format!(
                "{}: {}",
                v["errorType"].as_str().unwrap_or("?"),
                v["error"].as_str().unwrap_or("?")
            ));
        }
        match &v["data"]["result"] {
            serde_json::Value::Array(a) => Ok(a.clone()),
            // A scalar or string result: one value.
            other => Ok(vec![other.clone()]),
        }
    }

    fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

/// PostgreSQL (18 unless the test picks another) and the exporter watching
/// it as a pg_monitor-only role:
/// one probed temp volume with a provisioned IOPS limit (so the IO cap
/// series exist), fast intervals, and the cluster with volume discovery on.
/// The volume is on the same filesystem as the cluster's data directory and
/// WAL (all in temp dirs), so discovery reports it as holding the cluster's
/// `data` and `wal` roles.
fn stack() -> StackBuilder<'static> {
    Stack::builder()
        .password(MON_PASSWORD)
        .role("mon", true)
        .config_head(
            "window = \"1m\"\n\
             limits_interval = \"1s\"\n\
             [defaults]\n\
             interval = \"200ms\"\n\
             read_file_size = \"4MiB\"\n\
             free_space_reserve = \"0\"\n",
        )
        .volume("provisioned_iops = 100000")
        .cluster(
            "c",
            "mon",
            "scrape_interval = \"1s\"\n\
             wait_sampling_interval = \"100ms\"\n\
             discover_volumes = true\n",
        )
}

/// The core panel that reads pg_stat_io, which exists from PostgreSQL 16.
const PG_STAT_IO_PANEL: &str = "pg_stat_io operations by backend type and context";

/// Panels whose every target must return data once the exporter has
/// probed, PostgreSQL has committed and Prometheus has scraped a few times
/// ([`PG_STAT_IO_PANEL`] only from PostgreSQL 16).
const CORE_PANELS: &[(&str, &str)] = &[
    (
        "pg-storage-exporter-overview.json",
        "One client's commit ceiling vs all commits",
    ),
    ("pg-storage-exporter-overview.json", "WAL sync time share"),
    ("pg-storage-exporter-overview.json", "IO cap utilization"),
    (
        "pg-storage-exporter-latency.json",
        "Sync latency quantiles (window)",
    ),
    (
        "pg-storage-exporter-latency.json",
        "Read latency quantiles (window)",
    ),
    (
        "pg-storage-exporter-latency.json",
        "Commit latency quantiles (window)",
    ),
    ("pg-storage-exporter-postgresql.json", "PostgreSQL up"),
    (
        "pg-storage-exporter-postgresql.json",
        "WAL syncs per second",
    ),
    (
        "pg-storage-exporter-postgresql.json",
        "Wait events (stacked)",
    ),
    ("pg-storage-exporter-postgresql.json", PG_STAT_IO_PANEL),
    (
        "pg-storage-exporter-postgresql.json",
        "WAL sync mean: PostgreSQL vs probe",
    ),
];

/// Waits until Prometheus has scraped the exporter successfully `n` times
/// within the last minute.
fn wait_for_scrapes(prom: &Prometheus, n: u32, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let expr =
        format!("count_over_time(up{{job=\"{JOB}\"}}[1m]) >= {n} and up{{job=\"{JOB}\"}} == 1");
    loop {
        if prom.query(&expr).is_ok_and(|r| !r.is_empty()) {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "Prometheus did not scrape the exporter {n} times; targets: {}\nlog:\n{}",
                prom.api("/api/v1/targets"),
                prom.log()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Recorded series that must exist after a few evaluations.
const CORE_RECORDINGS: &[&str] = &[
    "instance_volume_op:pgstorage_probe_seconds:p99_5m{op=\"commit\"}",
    "instance_volume_op:pgstorage_probe_seconds:p50_5m{op=\"read\"}",
    "instance_volume_op:pgstorage_probe_seconds:p99_1h{op=\"commit\"}",
];

/// Metric names in the scrape (`# TYPE` lines and samples), with the
/// suffixes of histograms, summaries and counters; and label names.
fn scrape_names(scrape: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut metrics = BTreeSet::new();
    let mut labels = BTreeSet::new();
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (name, kind) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
            metrics.insert(name.to_string());
            let suffixes: &[&str] = match kind {
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["_sum", "_count"],
                "counter" => &["_total"],
                _ => &[],
            };
            for s in suffixes {
                metrics.insert(format!("{name}{s}"));
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let series = line.rsplit_once(' ').map_or(line, |(s, _)| s);
            let (name, rest) = series.split_once('{').unwrap_or((series, ""));
            metrics.insert(name.to_string());
            for pair in rest.trim_end_matches('}').split("\",") {
                if let Some((k, _)) = pair.split_once('=') {
                    labels.insert(k.trim().to_string());
                }
            }
        }
    }
    (metrics, labels)
}

#[test]
fn prometheus_evaluates_every_dashboard_and_rule_expression_14() {
    prometheus_evaluates_every_dashboard_and_rule_expression(PgKind::V14);
}

#[test]
fn prometheus_evaluates_every_dashboard_and_rule_expression_15() {
    prometheus_evaluates_every_dashboard_and_rule_expression(PgKind::V15);
}

#[test]
fn prometheus_evaluates_every_dashboard_and_rule_expression_16() {
    prometheus_evaluates_every_dashboard_and_rule_expression(PgKind::V16);
}

#[test]
fn prometheus_evaluates_every_dashboard_and_rule_expression_17() {
    prometheus_evaluates_every_dashboard_and_rule_expression(PgKind::V17);
}

#[test]
fn prometheus_evaluates_every_dashboard_and_rule_expression_18() {
    prometheus_evaluates_every_dashboard_and_rule_expression(PgKind::V18);
}

fn prometheus_evaluates_every_dashboard_and_rule_expression(kind: PgKind) {
    let Some(mut stack) = stack().pg_version(kind).start() else {
        return;
    };
    let (pg, ex, work) = (&stack.pg, &mut stack.ex, &stack.work);
    let prom = Prometheus::start(ex.addr);
    eprintln!(
        "PostgreSQL {} on port {}, exporter on {}, Prometheus on {}",
        pg.major(),
        pg.port(),
        ex.addr,
        prom.addr
    );

    // Discovery has mapped the cluster's WAL to a probed volume, and the
    // probes have samples of every op.
    let scrape = ex.wait_for("discovery and probes", Duration::from_secs(60), |m| {
        m.contains("pgstorage_cluster_volume_info{cluster=\"c\",volume=\"t\",role=\"wal\"} 1")
            && common::count(m, "t", "commit") >= 3.0
            && common::count(m, "t", "read") >= 3.0
            && m.contains("pgstorage_pg_up{cluster=\"c\"} 1")
    });
    assert!(
        scrape
            .contains("pgstorage_cluster_volume_info{cluster=\"c\",volume=\"t\",role=\"data\"} 1"),
        "{scrape}"
    );

    // Prometheus' first scrape comes a few seconds after its start (target
    // discovery is batched): wait for two before the load, so that the load
    // is in its data.
    wait_for_scrapes(&prom, 2, Duration::from_secs(60));
    // Idle until now, the wait sampling has backed off to 32 × 100 ms on
    // average, two samples at most 6.4 s apart, and single-row INSERTs on
    // this server rarely wait: a few backed-off samples may see none of it.
    // A session sleeping beside the load (Timeout:PgSleep) is seen by the
    // first sample, which brings the sampling back to 100 ms for the rest.
    let out = std::thread::scope(|s| {
        s.spawn(|| pg.psql("SELECT pg_sleep(10)"));
        pg.pgbench_inserts(2, 8)
    });
    let tps = out
        .lines()
        .find(|l| l.starts_with("tps"))
        .unwrap_or("tps ?")
        .to_string();
    eprintln!("pgbench: {tps}");

    // Wait until Prometheus has what the core panels need: two scrapes
    // after the load for rate(), a few rule evaluations.
    let dashboards = kit::dashboards();
    let queries: Vec<kit::DashQuery> = dashboards
        .iter()
        .flat_map(|(f, d)| kit::dashboard_queries(f, d))
        .collect();
    let core: Vec<&kit::DashQuery> = queries
        .iter()
        .filter(|q| {
            CORE_PANELS
                .iter()
                .any(|(f, t)| q.dashboard == *f && q.title == *t)
        })
        // The timing-off estimate of the WAL sync time share is empty
        // here by design: the harness runs with track_wal_io_timing on.
        .filter(|q| !(q.title == "WAL sync time share" && q.ref_id == "B"))
        // No pg_stat_io before 16.
        .filter(|q| pg.major() >= 16 || q.title != PG_STAT_IO_PANEL)
        .collect();
    for (f, t) in CORE_PANELS {
        if pg.major() < 16 && *t == PG_STAT_IO_PANEL {
            continue;
        }
        assert!(
            core.iter().any(|q| q.dashboard == *f && q.title == *t),
            "core panel {t:?} not found in {f}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut empty: Vec<String>;
    loop {
        empty = Vec::new();
        for q in &core {
            match prom.query(&kit::substitute(&q.raw)) {
                Ok(r) if !r.is_empty() => {}
                Ok(_) => empty.push(format!("{} / {} / {}", q.dashboard, q.title, q.ref_id)),
                Err(e) => panic!("{} / {}: {e}\n{}", q.dashboard, q.title, q.raw),
            }
        }
        for r in CORE_RECORDINGS {
            if prom.query(r).map(|v| v.is_empty()).unwrap_or(true) {
                empty.push((*r).to_string());
            }
        }
        if empty.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        empty.is_empty(),
        "core panels without data: {empty:#?}\nexporter scrape:\n{}\nPrometheus log:\n{}",
        ex.metrics(),
        prom.log()
    );

    // The scrape target is up, PostgreSQL is up, PostgreSQL synced WAL.
    let up = prom.query(&format!("up{{job=\"{JOB}\"}}")).unwrap();
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
    let pg_up = prom.query("pgstorage_pg_up{cluster=\"c\"}").unwrap();
    assert_eq!(pg_up[0]["value"][1], "1", "{pg_up:?}");
    let value = |expr: &str| -> f64 {
        let r = prom.query(expr).unwrap();
        assert!(!r.is_empty(), "{expr}: no data");
        r[0]["value"][1].as_str().unwrap().parse().unwrap()
    };
    let commits = value("sum(increase(pgstorage_pg_commits_total{cluster=\"c\"}[2m]))");
    let syncs = value("sum(increase(pgstorage_pg_wal_syncs_total{cluster=\"c\"}[2m]))");
    eprintln!("Prometheus saw {commits:.0} commits and {syncs:.0} WAL syncs in the last 2 minutes");
    assert!(commits > 1000.0, "pgbench's commits: {commits}");
    assert!(syncs > 100.0, "pgbench's WAL syncs: {syncs}");

    // Every dashboard expression (panels and variables), substituted.
    let mut errors = Vec::new();
    let mut with_data = 0;
    let mut no_data = Vec::new();
    for q in &queries {
        let expr = kit::substitute(&q.raw);
        match prom.query(&expr) {
            Ok(r) if r.is_empty() => {
                no_data.push(format!("{} / {} {}", q.dashboard, q.title, q.ref_id))
            }
            Ok(_) => with_data += 1,
            Err(e) => errors.push(format!(
                "{} / {} {}: {e}\n  {expr}",
                q.dashboard, q.title, q.ref_id
            )),
        }
    }

    // Every rule, as Prometheus loaded it.
    let rules = prom.api("/api/v1/rules");
    assert_eq!(rules["status"], "success", "{rules}");
    let mut rule_exprs = Vec::new();
    for g in rules["data"]["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            let name = r["name"].as_str().unwrap().to_string();
            let health = r["health"].as_str().unwrap_or("");
            assert_ne!(
                health, "err",
                "rule {name} failed to evaluate: {}",
                r["lastError"]
            );
            rule_exprs.push((name, r["query"].as_str().unwrap().to_string()));
        }
    }
    let in_files: usize = kit::RULE_FILES
        .iter()
        .map(|f| {
            std::fs::read_to_string(kit::repo(f))
                .unwrap()
                .lines()
                .filter(|l| {
                    let t = l.trim_start();
                    t.starts_with("- record:") || t.starts_with("- alert:")
                })
                .count()
        })
        .sum();
    assert_eq!(rule_exprs.len(), in_files, "Prometheus loaded every rule");
    let mut rules_with_data = 0;
    for (name, expr) in &rule_exprs {
        match prom.query(expr) {
            Ok(r) if r.is_empty() => no_data.push(format!("rule {name}")),
            Ok(_) => rules_with_data += 1,
            Err(e) => errors.push(format!("rule {name}: {e}\n  {expr}")),
        }
    }
    assert!(
        errors.is_empty(),
        "{} expressions failed:\n{}",
        errors.len(),
        errors.join("\n")
    );
    eprintln!(
        "evaluated {} dashboard expressions ({} with data) and {} rule expressions ({} with data, \
         the others are alert conditions that do not hold or recordings not evaluated yet): 0 errors",
        queries.len(),
        with_data,
        rule_exprs.len(),
        rules_with_data
    );
    eprintln!("without data here: {no_data:#?}");
    pg::report(&format!(
        "postgres {}: prometheus ok, {} dashboard expressions ({with_data} with data) and {} rule \
         expressions ({rules_with_data} with data), 0 errors, {} core panels with data",
        pg.version(),
        queries.len(),
        rule_exprs.len(),
        core.len()
    ));

    // Metric and label names: only those of docs/metrics.md or of the
    // real scrape (recorded series aside).
    let (scraped_metrics, scraped_labels) = scrape_names(&ex.metrics());
    let documented = kit::documented_metrics();
    let mut known_labels: BTreeSet<String> = scraped_labels;
    known_labels.extend(kit::documented_labels());
    for l in ["job", "instance", "le", "quantile", "__name__"] {
        known_labels.insert(l.to_string());
    }
    let is_known_metric = |m: &str| {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| m.strip_suffix(s))
            .unwrap_or(m);
        scraped_metrics.contains(m) || documented.iter().any(|d| d == m || d == base)
    };
    let mut all_exprs: Vec<String> = queries.iter().map(|q| q.raw.clone()).collect();
    all_exprs.extend(rule_exprs.iter().map(|(_, e)| e.clone()));
    let mut unknown = BTreeSet::new();
    for e in &all_exprs {
        for m in kit::metric_names(e) {
            if !is_known_metric(&m) {
                unknown.insert(format!("metric {m}"));
            }
        }
        for l in kit::label_names(e) {
            if !known_labels.contains(&l) {
                unknown.insert(format!("label {l} (in {e})"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "names neither in docs/metrics.md nor in the scrape: {unknown:#?}"
    );

    // Clean shutdown of the exporter (probe files removed); Prometheus and
    // PostgreSQL stop when dropped.
    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(Duration::from_secs(15)).success());
    assert!(
        !work.path().join("vol/pg-storage-exporter-probe").exists(),
        "probe dir removed at shutdown"
    );
    drop(prom);
    drop(stack);
}

/// The `expr:` of alert `name` in deploy/prometheus/alerts.rules.yml, as
/// written (the file keeps each expression in a `>-` block after `expr:`,
/// ended by `for:`).
fn alert_expr(name: &str) -> String {
    let text = std::fs::read_to_string(kit::repo("deploy/prometheus/alerts.rules.yml")).unwrap();
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim() != format!("- alert: {name}"))
        .skip(1);
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("alert {name} not found"));
    assert_eq!(first.trim(), "expr: >-", "{name}: expression block");
    lines
        .take_while(|l| !l.trim_start().starts_with("for:"))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The postmaster and every process it started.
fn postgres_pids(data_dir: &std::path::Path) -> Vec<String> {
    let pm = std::fs::read_to_string(data_dir.join("postmaster.pid")).unwrap();
    let pm = pm.lines().next().unwrap().trim().to_string();
    let mut pids = vec![pm.clone()];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(stat) = std::fs::read_to_string(e.path().join("stat"))
            && let Some(rest) = stat.rsplit_once(") ")
            && rest.1.split_whitespace().nth(1) == Some(pm.as_str())
        {
            pids.push(e.file_name().to_string_lossy().to_string());
        }
    }
    pids
}

/// pgbench over the unix socket as the superuser, started in the
/// background; `args` go before the database name. Its `-T` is only an
/// upper bound, for a slow machine: the test stops it ([`pgbench_stop`])
/// once the checks of its load are done.
fn pgbench(pg: &PgServer, args: &[&str]) -> Child {
    pg.command("pgbench")
        .arg("-h")
        .arg(pg.socket_dir())
        .arg("-p")
        .arg(pg.port().to_string())
        .args(["-U", common::pg::SUPERUSER])
        .args(args)
        .arg("postgres")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run pgbench")
}

/// Fails, with pgbench's output and the server log, when the pgbench a
/// check is about has ended already (an error, or its `-T` run out): the
/// check would be about an idle server.
fn assert_pgbench_running(child: &mut Child, pg: &PgServer, what: &str) {
    use std::io::Read;
    if let Some(status) = child.try_wait().unwrap() {
        let mut out = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut out);
        }
        panic!(
            "{what}: pgbench ended ({status}) before its checks were done: {out}\nserver log:\n{}",
            pg.log()
        );
    }
}

/// Stops a pgbench started with a -T longer than needed (SIGINT) and
/// reports how it ended: stopped, or its tps line if it ran its course.
fn pgbench_stop(mut child: Child) -> String {
    if child.try_wait().unwrap().is_none() {
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: kill(2) on our own child, which has not been reaped.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    match text.lines().find(|l| l.starts_with("tps")) {
        Some(l) if out.status.success() => l.to_string(),
        _ => format!("stopped once checked ({})", out.status),
    }
}

/// The range that takes the place of the shipped rules' 5 m in the WAL
/// sync saturation test. Prometheus scrapes every second there, so a range
/// holds 20 samples of each series, and each phase of load fills it in 20 s
/// instead of 5 minutes.
const RANGE: Duration = Duration::from_secs(20);

/// [`RANGE`] in PromQL: `[20s]`.
fn range() -> String {
    format!("[{}s]", RANGE.as_secs())
}

/// When [`RANGE`] windows hold nothing but what was scraped after `start`:
/// one range later, plus a scrape and a rule evaluation (1 s each).
fn filled(start: Instant) -> Instant {
    start + RANGE + Duration::from_secs(2)
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

/// The WAL sync saturation alerts and PgStorageCommitsThrottledByCap
/// against real load. The saturation alerts are evaluated through
/// Prometheus' query API rather than by waiting out their `for:` (10 min):
/// the alert expression as written in alerts.rules.yml, with its 5 m rate
/// windows shortened to [`RANGE`] (20 s) so that 20 s of load decide it.
/// PostgreSQL 18 has its WAL on a loop device whose writes are capped at
/// 100 IOPS (v1 blkio throttle; the exporter is in the same group, as every
/// process is under a device's cap). TPC-B `pgbench -c 4` on that device
/// must make PgStorageWalSyncSaturated's condition hold, and with
/// track_wal_io_timing then turned off (a reload, same load),
/// PgStorageWalSyncSaturatedEstimated's (WAL syncs/s over 20 s x the busy
/// sync probe's mean since the capped writing load began); `pgbench -S -c 4`
/// (read-only: thousands of commits per second, next to no WAL sync) on
/// the same device, timing on again, must leave PgStorageWalSyncSaturated
/// silent at every check. The single-session ratio the old alert used (all
/// commits / the commit ceiling in force) and the estimate with timing on
/// are printed next to the exact share.
///
/// PgStorageCommitsThrottledByCap goes through Prometheus' own rule
/// evaluation, in a copy of the rule files whose 5 m ranges are 20 s and
/// whose `for:` for it is 10 s: it must stay silent (not even pending)
/// under TPC-B with the cap set far above the load (100,000 write IOPS, the
/// run that also gives the commit latency baseline), fire, naming the
/// cgroup write_iops cap on the WAL volume, under TPC-B on the 100 IOPS
/// cap, and be silent again under the read-only load on that cap.
///
/// Each phase is checked once its windows hold nothing but its own load.
/// The capped writing load comes right after the uncapped one, and the
/// read-only load last: the estimate needs a busy burst under the cap and
/// the writing load, and the first burst under the cap was scheduled at
/// the uncapped pace, `busy_every` (5 s here) after the one before, or up
/// to 10.7 times that after a burst that met waits and ran its 256 commits
/// (under pgbench -i or TPC-B). It runs within a minute of the cap coming
/// down, most often within the 25 s that the phase's other checks take
/// anyway. The schedule under the cap puts 45 s or more between bursts
/// (see the estimate below): had the read-only load come first on the cap,
/// the writing load could have waited that long for one.
#[test]
fn wal_sync_saturation_alert_silent_under_read_only_load_and_firing_on_a_capped_wal_device() {
    if !loopdev::can_run("the WAL sync saturation e2e test", true) {
        return;
    }
    let mut fx = loopdev::LoopVolume::new(512 << 20, true);
    let waldir = fx.mnt.join("pg_wal");
    // No cap yet: pgbench -i runs uncapped.
    let group = fx.group("pgse-walsat", &[]);
    let Some(stack) = Stack::builder()
        .waldir(&waldir)
        .password(MON_PASSWORD)
        .role("mon", true)
        .setup(|pg| {
            for (i, pid) in postgres_pids(pg.data_dir()).into_iter().enumerate() {
                match std::fs::write(group.join("cgroup.procs"), &pid) {
                    Ok(()) => {}
                    Err(e) if i > 0 && e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) => panic!("moving pid {pid}: {e}"),
                }
            }
        })
        .config_head(
            "window = \"1m\"\nlimits_interval = \"1s\"\n\
             [defaults]\ninterval = \"500ms\"\nbusy_every = \"5s\"\n\
             read_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n",
        )
        .cluster(
            "c",
            "mon",
            "scrape_interval = \"1s\"\ndiscover_volumes = true\n",
        )
        .start()
    else {
        return;
    };
    let (pg, ex) = (&stack.pg, &stack.ex);
    std::fs::write(group.join("cgroup.procs"), ex.child.id().to_string()).unwrap();
    let rules_dir = tempfile::tempdir().unwrap();
    let rules = rules_with_short_for(
        rules_dir.path(),
        "PgStorageCommitsThrottledByCap",
        "10s",
        Some(&format!("{}s", RANGE.as_secs())),
    );
    let prom = Prometheus::start_with_rules(ex.addr, &rules);
    let t0 = Instant::now();
    ex.wait_for("the cluster's WAL volume", Duration::from_secs(60), |m| {
        m.contains("pgstorage_cluster_volume_info{cluster=\"c\",volume=\"c/wal\",role=\"wal\"} 1")
            && m.contains("pgstorage_pg_wal_sync_seconds_total{cluster=\"c\"}")
    });
    let init = pg
        .command("pgbench")
        .arg("-h")
        .arg(pg.socket_dir())
        .arg("-p")
        .arg(pg.port().to_string())
        .args([
            "-U",
            common::pg::SUPERUSER,
            "-i",
            "-q",
            "-s",
            "4",
            "postgres",
        ])
        .output()
        .unwrap();
    assert!(init.status.success(), "pgbench -i: {init:?}");
    // A cap far above what the device does: the cap's series exist, at a
    // low utilization.
    fx.throttle(&group, "write_iops_device", 100_000);
    wait_for_scrapes(&prom, 2, Duration::from_secs(60));

    let range = range();
    let exact = alert_expr("PgStorageWalSyncSaturated").replace("[5m]", &range);
    // The estimate's WAL syncs over [`RANGE`] too (its first range), the
    // probe's busy mean over `probe_range`: under the cap the exporter
    // stretches its schedule to keep its own IO under 2 % of it (slowdown
    // 6.8 here at first, 13 once a burst has measured the throttled rate;
    // a burst that meets the throttle also puts the next one off by its
    // length: 45 s or more between bursts), and a 20 s window can hold no
    // busy sample; a longer one would reach back into the uncapped run,
    // when the probe's syncs were fast. The check below takes the range
    // since the cap came down, once a busy burst has run in it.
    let estimated_over = |probe_range: &str| -> String {
        alert_expr("PgStorageWalSyncSaturatedEstimated")
            .replacen("[5m]", &range, 1)
            .replace("[5m]", probe_range)
    };
    // For the figures printed while timing is on.
    let estimated = estimated_over("[1m]");
    // The figures without the threshold; the estimate also where timing is
    // on (the alert leaves such clusters to the exact one).
    let exact_value = exact.rsplit_once('>').unwrap().0.to_string();
    let unless = "unless on (job, instance, cluster) pgstorage_pg_wal_sync_seconds_total";
    assert!(estimated.contains(unless), "{estimated}");
    let estimate_value = estimated.rsplit_once('>').unwrap().0.replace(unless, "");
    let one = |expr: &str| -> Option<f64> {
        let r = prom.query(expr).unwrap_or_else(|e| panic!("{e}\n{expr}"));
        r.first()
            .map(|v| v["value"][1].as_str().unwrap().parse().unwrap())
    };
    let report = |what: &str| -> (Option<f64>, bool) {
        let share = one(&exact_value);
        let firing = one(&exact).is_some();
        let commits = one(&format!(
            "sum(rate(pgstorage_pg_commits_total{{cluster=\"c\"}}{range}))"
        ));
        let syncs = one(&format!(
            "sum(rate(pgstorage_pg_wal_syncs_total{{cluster=\"c\"}}{range}))"
        ));
        let mean = one(&format!(
            "sum(rate(pgstorage_pg_wal_sync_seconds_total{{cluster=\"c\"}}{range})) \
             / sum(rate(pgstorage_pg_wal_syncs_total{{cluster=\"c\"}}{range}))"
        ));
        let old_ratio = one(&format!(
            "sum by (job, instance, cluster) (rate(pgstorage_pg_commits_total{{cluster=\"c\"}}{range})) \
             / on (job, instance, cluster) group_left (volume) \
             (pgstorage_cluster_volume_info{{role=\"wal\"}} \
               * on (job, instance, volume) group_left pgstorage_commit_ceiling_in_force_per_second)"
        ));
        let estimate = one(&estimate_value);
        eprintln!(
            "{what} (t={:.0}s): WAL sync time share {share:?} -> PgStorageWalSyncSaturated {}; \
             {commits:?} commits/s, {syncs:?} WAL syncs/s, PostgreSQL mean sync {mean:?} s; \
             timing-off estimate {estimate:?}; old ratio commits/ceiling in force {old_ratio:?}",
            t0.elapsed().as_secs_f64(),
            if firing { "FIRING" } else { "silent" },
        );
        (share, firing)
    };
    // PgStorageCommitsThrottledByCap: its two figures on the WAL volume
    // (the rules' `mean_5m` is over [`RANGE`] in this copy) and its state.
    let throttled_report = |what: &str| -> Option<String> {
        let util = one(&format!(
            "avg_over_time(pgstorage_io_limit_utilization_ratio\
             {{volume=\"c/wal\",source=\"cgroup\",resource=\"write_iops\"}}{range})"
        ));
        let now = one("instance_volume:pgstorage_commit_latency_seconds:mean_5m\
             {volume=\"c/wal\",basis=\"postgres\"}");
        let best = one(
            "instance_volume:pgstorage_commit_latency_seconds:mean_5m:min_1d\
             {volume=\"c/wal\",basis=\"postgres\"}",
        );
        let commits = one(&format!(
            "sum(rate(pgstorage_pg_commits_total{{cluster=\"c\"}}{range}))"
        ));
        let alerts = prom
            .query("ALERTS{alertname=\"PgStorageCommitsThrottledByCap\"}")
            .unwrap();
        let state = alerts.first().map(|a| {
            let m = &a["metric"];
            assert_eq!(
                (&m["volume"], &m["source"], &m["resource"]),
                (
                    &serde_json::json!("c/wal"),
                    &serde_json::json!("cgroup"),
                    &serde_json::json!("write_iops")
                ),
                "{alerts:?}"
            );
            m["alertstate"].as_str().unwrap().to_string()
        });
        eprintln!(
            "{what} (t={:.0}s): {commits:?} commits/s; write_iops cap utilization {util:?}; \
             PostgreSQL mean WAL sync now {now:?} s, best {best:?} s -> \
             PgStorageCommitsThrottledByCap {}",
            t0.elapsed().as_secs_f64(),
            state.as_deref().unwrap_or("silent"),
        );
        state
    };

    // TPC-B with the cap far above the load: the commit latency baseline,
    // and the alert silent.
    let mut child = pgbench(pg, &["-n", "-c", "4", "-j", "2", "-T", "90"]);
    let start = Instant::now();
    sleep_until(filled(start));
    for _ in 0..3 {
        assert_pgbench_running(&mut child, pg, "pgbench -c 4, cap 100,000 write IOPS");
        let state = throttled_report("pgbench -c 4, cap 100,000 write IOPS");
        assert_eq!(
            state, None,
            "PgStorageCommitsThrottledByCap with no cap reached"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    eprintln!(
        "pgbench -c 4 (cap 100,000 write IOPS): {}",
        pgbench_stop(child)
    );
    // The exporter's utilization is the writes counted over one limits
    // pass divided by the cap in force at the pass's end: the uncapped
    // run's last writes, counted after the cap came down, would read as a
    // moment far above the new cap, and hold PgStorageCommitsThrottledByCap's
    // 20 s mean above 0.5 by themselves. So the cap comes down once a pass
    // has counted the idle device.
    let util = "pgstorage_io_limit_utilization_ratio\
                {volume=\"c/wal\",source=\"cgroup\",resource=\"write_iops\"}";
    ex.wait_for(
        "a limits pass after the uncapped load",
        Duration::from_secs(20),
        |m| common::sample(m, util).is_some_and(|u| u < 0.002),
    );

    // Writing clients on the capped device: PgStorageCommitsThrottledByCap
    // goes pending once the 20 s means hold the capped load, and fires 10 s
    // later; the saturation figures are checked while pgbench runs, when
    // the 20 s window holds only this load, and the load runs on for the
    // timing-off part below.
    fx.throttle(&group, "write_iops_device", 100);
    let capped = Instant::now();
    let mut child = pgbench(pg, &["-n", "-c", "4", "-j", "2", "-T", "150"]);
    let start = Instant::now();
    let mut states: Vec<String> = Vec::new();
    while start.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_secs(2));
        let state = throttled_report("pgbench -c 4, cap 100 write IOPS");
        if let Some(s) = state
            && states.last() != Some(&s)
        {
            states.push(s);
        }
        if states.last().is_some_and(|s| s == "firing") {
            break;
        }
    }
    assert_eq!(
        states,
        ["pending", "firing"],
        "PgStorageCommitsThrottledByCap on the capped WAL device: pending, then firing"
    );
    // Both figures in the annotations, as Alertmanager would get them.
    let alerts = prom.api("/api/v1/alerts");
    let fired = alerts["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["labels"]["alertname"] == "PgStorageCommitsThrottledByCap")
        .unwrap_or_else(|| panic!("{alerts}"));
    let (summary, description) = (
        fired["annotations"]["summary"].as_str().unwrap(),
        fired["annotations"]["description"].as_str().unwrap(),
    );
    eprintln!("PgStorageCommitsThrottledByCap: {summary}\n  {description}");
    assert!(
        summary.contains("cgroup write_iops cap on c/wal")
            && description.contains("% used")
            && description.contains("PostgreSQL's mean WAL sync is")
            && description.contains("at its best over the last day"),
        "{fired}"
    );
    sleep_until(filled(start));
    assert_pgbench_running(&mut child, pg, "pgbench -c 4, cap 100 write IOPS");
    let (share, firing) = report("pgbench -c 4, WAL capped at 100 write IOPS");

    // The same load with track_wal_io_timing turned off (a reload): the
    // sync seconds go away, and the estimate takes over.
    pg.psql("ALTER SYSTEM SET track_wal_io_timing = off");
    pg.psql("SELECT pg_reload_conf()");
    ex.wait_for("WAL timing off", Duration::from_secs(20), |m| {
        !m.contains("pgstorage_pg_wal_sync_seconds_total{cluster=\"c\"}")
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    while one("pgstorage_pg_wal_sync_seconds_total{cluster=\"c\"}").is_some() {
        assert!(
            Instant::now() < deadline,
            "sync seconds still in Prometheus"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The probe's busy mean under the cap alone: from when it came down
    // (whole seconds, rounded towards now) to now, once that range holds a
    // busy burst. Every sample in the range was scraped after the cap came
    // down, so a burst that ended before is not in its increase; one that
    // straddles the change meets the throttle and records only what follows
    // its first wait. The deadline stays well within pgbench's -T, so the
    // 20 s WAL sync rate still holds the load.
    let capped_range = || format!("[{}s]", capped.elapsed().as_secs());
    let deadline = start + Duration::from_secs(120);
    let mut probe_range = capped_range();
    while one(&format!(
        "sum(increase(pgstorage_probe_seconds_count\
         {{volume=\"c/wal\",op=\"commit\",phase=\"busy\"}}{probe_range})) > 0"
    ))
    .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "no busy commit probe on c/wal in the {probe_range} of capped writing load"
        );
        std::thread::sleep(Duration::from_secs(1));
        probe_range = capped_range();
    }
    let estimated = estimated_over(&probe_range);
    let exact_off = one(&exact).is_some();
    let estimate_off = one(estimated.rsplit_once('>').unwrap().0);
    let estimated_firing = one(&estimated).is_some();
    eprintln!(
        "pgbench -c 4, WAL capped, track_wal_io_timing off (t={:.0}s): \
         PgStorageWalSyncSaturated {}; estimate {estimate_off:?} -> PgStorageWalSyncSaturatedEstimated {}",
        t0.elapsed().as_secs_f64(),
        // Its range still holds the last timed samples: it holds on for
        // one window (5 m in the rule), shorter than the 10 m `for:` the
        // estimate has to wait out.
        if exact_off {
            "still FIRING (last timed samples in its window)"
        } else {
            "silent"
        },
        if estimated_firing { "FIRING" } else { "silent" },
    );
    assert_pgbench_running(&mut child, pg, "pgbench -c 4, cap 100 write IOPS");
    eprintln!(
        "pgbench -c 4 (WAL capped at 100 write IOPS), probe's busy mean over {probe_range}: {}",
        pgbench_stop(child)
    );
    assert!(
        firing,
        "PgStorageWalSyncSaturated's condition does not hold on a capped WAL device: \
         share {share:?}\n{exact}"
    );
    assert!(
        estimated_firing,
        "PgStorageWalSyncSaturatedEstimated's condition does not hold with timing off: \
         estimate {estimate_off:?}\n{estimated}"
    );

    // Read-only on the same capped device, with track_wal_io_timing on
    // again (the exact share needs it): checked every 2 s for half a range
    // once the windows hold nothing but this load, neither the writing
    // load before it nor the alert that load fired.
    pg.psql("ALTER SYSTEM RESET track_wal_io_timing");
    pg.psql("SELECT pg_reload_conf()");
    ex.wait_for("WAL timing on again", Duration::from_secs(20), |m| {
        m.contains("pgstorage_pg_wal_sync_seconds_total{cluster=\"c\"}")
    });
    let mut child = pgbench(pg, &["-n", "-S", "-c", "4", "-j", "2", "-T", "90"]);
    let from = filled(Instant::now());
    let (step, until) = (Duration::from_secs(2), from + RANGE / 2);
    let mut next = from;
    let mut checks = 0;
    while next <= until {
        sleep_until(next);
        assert_pgbench_running(&mut child, pg, "pgbench -S -c 4, cap 100 write IOPS");
        let (share, firing) = report("pgbench -S -c 4");
        assert!(share.is_some(), "no WAL sync time share under pgbench -S");
        assert!(!firing, "PgStorageWalSyncSaturated under a read-only load");
        let state = throttled_report("pgbench -S -c 4, cap 100 write IOPS");
        assert_eq!(
            state, None,
            "PgStorageCommitsThrottledByCap under a read-only load"
        );
        checks += 1;
        // A check that overran its slot gives the slot up, as a slow
        // machine would: the count below tells.
        next += step;
        while next < Instant::now() {
            next += step;
        }
    }
    eprintln!("pgbench -S -c 4: {}", pgbench_stop(child));
    assert!(checks >= 5, "{checks}");
    drop(prom);
    drop(stack);
}

/// The shipped rule files with `alert`'s `for:` shortened to `hold`, in
/// `dir`: the expression, labels and annotations are the shipped ones, only
/// the wait before firing fits a test. With `window`, every `[5m]` range of
/// every rule (recordings included) becomes that range too, so that a
/// minute of load decides what five do in the shipped rules.
fn rules_with_short_for(
    dir: &std::path::Path,
    alert: &str,
    hold: &str,
    window: Option<&str>,
) -> Vec<PathBuf> {
    kit::RULE_FILES
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(kit::repo(f)).unwrap();
            let mut out = String::new();
            let mut inside = false;
            for line in text.lines() {
                let t = line.trim_start();
                if t.starts_with("- alert:") {
                    inside = t == format!("- alert: {alert}");
                }
                if inside && t.starts_with("for:") {
                    let indent = &line[..line.len() - t.len()];
                    out.push_str(&format!("{indent}for: {hold}\n"));
                    inside = false;
                    continue;
                }
                match window {
                    Some(w) => out.push_str(&line.replace("[5m]", &format!("[{w}]"))),
                    None => out.push_str(line),
                }
                out.push('\n');
            }
            let path = dir.join(std::path::Path::new(f).file_name().unwrap());
            std::fs::write(&path, out).unwrap();
            path
        })
        .collect()
}

/// The storage audit's critical alert in a real Prometheus with the real
/// rule files: a volume on tmpfs gives a `memory_filesystem` finding, and
/// PgStorageAuditCritical goes pending on it, then fires (its `for:`
/// shortened from 5 minutes to 10 s in a copy of the rules; the 5 minutes
/// themselves are covered by `promtool test rules` on synthetic series).
/// One alert for the instance, its `codes` annotation naming the finding
/// and the volume: the template's query runs in a real Prometheus too.
#[test]
fn audit_critical_alert_fires_on_a_tmpfs_volume() {
    let on_tmpfs = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.contains(" /dev/shm ") && l.contains(" - tmpfs "));
    if !on_tmpfs {
        common::cannot_run(
            common::Part::Root,
            "audit_critical_alert_fires_on_a_tmpfs_volume",
            "/dev/shm is not a tmpfs here",
        );
        return;
    }
    let vol = tempfile::tempdir_in("/dev/shm").unwrap();
    let work = tempfile::tempdir().unwrap();
    let cfg = work.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[volume]]\nname = \"scratch\"\npath = \"{}\"\ninterval = \"200ms\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n",
            vol.path().display()
        ),
    )
    .unwrap();
    let ex = common::Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    ex.wait_for("an audit pass", Duration::from_secs(30), |m| {
        m.contains("pgstorage_audit_finding{code=\"memory_filesystem\"")
    });
    let rules = rules_with_short_for(work.path(), "PgStorageAuditCritical", "10s", None);
    let prom = Prometheus::start_with_rules(ex.addr, &rules);
    let alerts = r#"ALERTS{alertname="PgStorageAuditCritical"}"#;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen = Vec::new();
    loop {
        let got = prom.query(alerts).unwrap();
        assert!(got.len() <= 1, "one alert per instance: {got:?}");
        if let Some(a) = got.first() {
            assert_eq!(a["metric"]["severity"], "critical", "{a}");
            assert!(a["metric"].get("code").is_none(), "{a}");
            let state = a["metric"]["alertstate"].as_str().unwrap().to_string();
            if seen.last() != Some(&state) {
                eprintln!("{a}");
                seen.push(state.clone());
            }
            if state == "firing" {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "PgStorageAuditCritical not firing within 90 s (states seen: {seen:?}); {}",
            prom.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(seen, ["pending", "firing"], "pending first, then firing");
    // The expression alone counts the instance's critical findings.
    let rows = prom.query(&alert_expr("PgStorageAuditCritical")).unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["value"][1], "1", "{rows:?}");
    let firing = prom.api("/api/v1/alerts");
    let audit: Vec<&serde_json::Value> = firing["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["labels"]["alertname"] == "PgStorageAuditCritical")
        .collect();
    assert_eq!(audit.len(), 1, "{firing}");
    assert_eq!(
        audit[0]["annotations"]["codes"], "memory_filesystem (volume scratch)",
        "{firing}"
    );
    assert_eq!(
        audit[0]["annotations"]["summary"],
        format!("Storage audit on {}: 1 critical finding(s)", ex.addr),
        "{firing}"
    );
}

/// The shipped rule files with their hour and week ranges shortened for a
/// test (`[1h]` → `[20s]`, `[7d]` → `[10m]`, the 5-minute baseline groups
/// evaluated every second) and `alert`'s `for:` shortened to `hold`.
fn rules_with_short_history(dir: &std::path::Path, alert: &str, hold: &str) -> Vec<PathBuf> {
    let shortened = rules_with_short_for(dir, alert, hold, None);
    for path in &shortened {
        let text = std::fs::read_to_string(path).unwrap();
        let text = text
            .replace("[1h]", "[20s]")
            .replace("[7d]", "[10m]")
            .replace("interval: 5m", "interval: 1s");
        std::fs::write(path, text).unwrap();
    }
    shortened
}

/// Per-bucket counts of `pgstorage_pg_sync_seconds{cluster, kind}` in a
/// scrape: (upper bound, cumulative count), ascending.
fn sync_buckets(m: &str, cluster: &str, kind: &str) -> Vec<(f64, f64)> {
    let prefix =
        format!("pgstorage_pg_sync_seconds_bucket{{cluster=\"{cluster}\",kind=\"{kind}\",le=\"");
    m.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, value) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, value.trim().parse().ok()?))
        })
        .collect()
}

/// The bucket bound of the nearest-rank `q` quantile of the syncs between
/// two scrapes.
fn quantile_between(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> (f64, f64) {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .zip(before)
        .map(|((le, a), (_, b))| (*le, a - b))
        .collect();
    let total = delta.last().map_or(0.0, |(_, n)| *n);
    let rank = (q * total).ceil().max(1.0);
    let bound = delta
        .iter()
        .find(|(_, n)| *n >= rank)
        .map_or(f64::INFINITY, |(le, _)| *le);
    (bound, total)
}

/// PostgreSQL 18 with its WAL on a loop device: the server's own WAL syncs,
/// traced in the kernel, under pgbench uncapped (the baseline), then with
/// the device capped at 100 write IOPS: the traced WAL p99 is 5 ms or more,
/// and PgStoragePostgresWalSyncLatencyDrift, in a real Prometheus with the
/// shipped rules (hour and week ranges shortened to 20 s and 10 min, `for:`
/// to 10 s), goes pending, then fires for the cluster.
#[test]
fn postgres_wal_sync_drift_alert_fires_on_the_servers_own_p99_on_a_capped_wal_device() {
    if !cfg!(feature = "bpf") {
        common::cannot_run_current(
            common::Part::Root,
            "the test binary was built without the bpf feature",
        );
        return;
    }
    if !loopdev::can_run("the server's own WAL sync drift e2e test", true) {
        return;
    }
    if !std::path::Path::new("/sys/kernel/tracing/events/syscalls").is_dir() {
        let _ = Command::new("mount")
            .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
            .status();
    }
    let mut fx = loopdev::LoopVolume::new(512 << 20, true);
    let waldir = fx.mnt.join("pg_wal");
    let group = fx.group("pgse-syncdrift", &[]);
    let Some(stack) = Stack::builder()
        .waldir(&waldir)
        .password(MON_PASSWORD)
        .role("mon", true)
        .setup(|pg| {
            for (i, pid) in postgres_pids(pg.data_dir()).into_iter().enumerate() {
                match std::fs::write(group.join("cgroup.procs"), &pid) {
                    Ok(()) => {}
                    Err(e) if i > 0 && e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) => panic!("moving pid {pid}: {e}"),
                }
            }
            pg.psql("CREATE TABLE ins(id bigserial PRIMARY KEY, v int)");
        })
        .cluster(
            "c",
            "mon",
            "scrape_interval = \"1s\"\ndiscover_volumes = false\n",
        )
        .ready("cluster c traced", Duration::from_secs(30), |m| {
            common::sample(m, "pgstorage_pg_sync_traced{cluster=\"c\",reason=\"ok\"}") == Some(1.0)
        })
        .start()
    else {
        return;
    };
    let (pg, ex) = (&stack.pg, &stack.ex);
    let alert = "PgStoragePostgresWalSyncLatencyDrift";
    let rules_dir = tempfile::tempdir().unwrap();
    let rules = rules_with_short_history(rules_dir.path(), alert, "10s");
    let prom = Prometheus::start_with_rules(ex.addr, &rules);
    let state = || -> Option<String> {
        let alerts = prom
            .query(&format!("ALERTS{{alertname=\"{alert}\"}}"))
            .unwrap();
        alerts.first().map(|a| {
            assert_eq!(a["metric"]["cluster"], "c", "{alerts:?}");
            a["metric"]["alertstate"].as_str().unwrap().to_string()
        })
    };
    let p99 = || -> Option<f64> {
        prom.query(
            "instance_cluster_kind:pgstorage_pg_sync_seconds:p99_1h{cluster=\"c\",kind=\"wal\"}",
        )
        .unwrap()
        .first()
        .and_then(|v| v["value"][1].as_str().unwrap().parse().ok())
    };
    let baseline = || -> Option<f64> {
        prom.query(
            "instance_cluster_kind:pgstorage_pg_sync_seconds:p99_1h:median_7d{cluster=\"c\",kind=\"wal\"}",
        )
        .unwrap()
        .first()
        .and_then(|v| v["value"][1].as_str().unwrap().parse().ok())
    };
    // Uncapped: the baseline.
    let m0 = ex.metrics();
    let mut child = pgbench_inserts_bg(pg, 40);
    std::thread::sleep(Duration::from_secs(35));
    assert_pgbench_running(&mut child, pg, "pgbench inserts, uncapped");
    let m1 = ex.metrics();
    let (uncapped_p99, uncapped_n) = quantile_between(
        &sync_buckets(&m0, "c", "wal"),
        &sync_buckets(&m1, "c", "wal"),
        0.99,
    );
    eprintln!(
        "uncapped: {uncapped_n} WAL syncs, p99 <= {:.2} ms; recorded p99 {:?}, baseline {:?}; \
         alert {:?}; {}",
        uncapped_p99 * 1e3,
        p99(),
        baseline(),
        state(),
        pgbench_stop(child)
    );
    assert_eq!(state(), None, "{alert} with no cap");

    // Capped at 100 write IOPS.
    fx.throttle(&group, "write_iops_device", 100);
    let m2 = ex.metrics();
    let mut child = pgbench_inserts_bg(pg, 120);
    let start = Instant::now();
    let mut states: Vec<String> = Vec::new();
    while start.elapsed() < Duration::from_secs(100) {
        std::thread::sleep(Duration::from_secs(2));
        assert_pgbench_running(&mut child, pg, "pgbench inserts, 100 write IOPS");
        if let Some(s) = state()
            && states.last() != Some(&s)
        {
            eprintln!(
                "capped (t={:.0}s): {alert} {s}; recorded p99 {:?}, baseline {:?}",
                start.elapsed().as_secs_f64(),
                p99(),
                baseline()
            );
            states.push(s);
        }
        if states.last().is_some_and(|s| s == "firing") {
            break;
        }
    }
    let m3 = ex.metrics();
    let (capped_p99, capped_n) = quantile_between(
        &sync_buckets(&m2, "c", "wal"),
        &sync_buckets(&m3, "c", "wal"),
        0.99,
    );
    common::pg::report(&format!(
        "WAL on a loop device: uncapped p99 <= {:.2} ms ({uncapped_n} syncs); capped at 100 \
         write IOPS p99 <= {:.2} ms ({capped_n} syncs); {alert}: {}; {}",
        uncapped_p99 * 1e3,
        capped_p99 * 1e3,
        states.join(" -> "),
        pgbench_stop(child)
    ));
    assert!(capped_p99 >= 0.005, "capped WAL p99 {capped_p99}");
    assert_eq!(
        states,
        ["pending", "firing"],
        "{alert} on the capped WAL device"
    );
    drop(prom);
    drop(stack);
}

/// pgbench's one-row INSERT script over the unix socket, 4 clients, in
/// the background for at most `seconds`.
fn pgbench_inserts_bg(pg: &PgServer, seconds: u32) -> Child {
    let script = std::env::temp_dir().join(format!("pgse-ins-{}.sql", std::process::id()));
    std::fs::write(&script, "INSERT INTO ins(v) VALUES (1);\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    pgbench(
        pg,
        &[
            "-n",
            "-c",
            "4",
            "-j",
            "4",
            "-T",
            &seconds.to_string(),
            "-f",
            script.to_str().unwrap(),
        ],
    )
}
