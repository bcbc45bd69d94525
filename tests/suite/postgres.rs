//! The exporter against real PostgreSQL servers started by the test harness
//! (tests/suite/common/pg.rs): on every supported version (14 to 18) counters
//! against PostgreSQL's own, the version table of src/postgres/views (which
//! view each figure comes from, which families exist) and restarts; on one
//! version each, bad passwords, multi-host DSNs, volume discovery, TLS.
//!
//! The per-version tests print one line each past the output capture
//! (`postgres 14.23: collector ok, ...`), so the CI log shows every version.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::loopdev;
use common::pg::{self, PgKind, PgServer};
use common::stack::{Stack, StackBuilder};
use common::*;

const MON_PASSWORD: &str = "Mon-Pa55word-4-tests";

/// PostgreSQL `kind` with the exporter watching it as a pg_monitor-only role
/// `mon` (cluster `c`, no volume discovery), with fast intervals, plus a
/// small probed volume `t` so probe activity can be checked while
/// PostgreSQL is down; ready once `c` is up.
fn watched(kind: PgKind) -> StackBuilder<'static> {
    Stack::builder()
        .pg_version(kind)
        .password(MON_PASSWORD)
        .role("mon", true)
        .volume("interval = \"100ms\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"")
        .cluster(
            "c",
            "mon",
            "scrape_interval = \"500ms\"\nwait_sampling_interval = \"200ms\"\ndiscover_volumes = false",
        )
        .ready_pg_up("c")
}

fn value(m: &str, series: &str) -> Option<f64> {
    sample(m, series)
}

fn pg_up(m: &str) -> Option<f64> {
    value(m, "pgstorage_pg_up{cluster=\"c\"}")
}

fn own_wal_syncs(pg: &PgServer) -> f64 {
    let sql = if pg.major() >= 18 {
        "SELECT sum(fsyncs) FROM pg_stat_io WHERE object = 'wal' AND context = 'normal'"
    } else {
        "SELECT wal_sync FROM pg_stat_wal"
    };
    pg.psql(sql).parse().unwrap()
}

fn own_commits(pg: &PgServer) -> f64 {
    pg.psql("SELECT sum(xact_commit) FROM pg_stat_database")
        .parse()
        .unwrap()
}

fn within(a: f64, b: f64, rel: f64) -> bool {
    b > 0.0 && ((a - b) / b).abs() <= rel
}

/// The families of one cluster, every sample line of `cluster="c"`.
fn series_of_c(m: &str) -> Vec<&str> {
    m.lines()
        .filter(|l| !l.starts_with('#') && l.contains("cluster=\"c\""))
        .collect()
}

fn has(m: &str, name: &str, labels: &[&str]) -> bool {
    let mut all = vec!["cluster=\"c\""];
    all.extend_from_slice(labels);
    !samples_with(m, name, &all).is_empty()
}

/// The version table of src/postgres/views (mod.rs, and docs/metrics.md
/// "Where each figure comes from") checked against a real server, on a
/// scrape taken after pgbench and a CHECKPOINT: no query failed, and each
/// family exists exactly on the versions that have its view or column.
/// Returns the parts of the per-version line.
fn check_version_table(pg: &PgServer, m: &str) -> Vec<String> {
    let major = pg.major();
    let v = format!("PostgreSQL {}", pg.version());
    // Every query of this version's table ran: no error of any kind.
    let errors: Vec<(String, f64)> = samples_with(m, "pgstorage_pg_scrape_errors_total", &[])
        .into_iter()
        .filter(|(_, n)| *n > 0.0)
        .collect();
    assert!(errors.is_empty(), "{v}: scrape errors {errors:?}");
    assert_eq!(
        sample(m, "pgstorage_pg_wait_hidden_backends{cluster=\"c\"}"),
        Some(0.0),
        "{v}: a pg_monitor role sees every backend"
    );

    // pg_info: the version as the server spells it.
    let info = samples_with(m, "pgstorage_pg_info", &["cluster=\"c\""]);
    assert_eq!(info.len(), 1, "{v}: {info:?}");
    let (version, num) = (
        pg.psql("SHOW server_version"),
        pg.psql("SHOW server_version_num"),
    );
    assert!(
        info[0].0.contains(&format!("version=\"{version}\""))
            && info[0].0.contains(&format!("server_version_num=\"{num}\"")),
        "{v}: {info:?}"
    );

    // WAL: pg_stat_wal up to 17, writes and syncs from pg_stat_io from 18;
    // every figure there on every version (timing is on).
    for f in [
        "pgstorage_pg_wal_syncs_total",
        "pgstorage_pg_wal_sync_seconds_total",
        "pgstorage_pg_wal_writes_total",
        "pgstorage_pg_wal_write_seconds_total",
        "pgstorage_pg_wal_records_total",
        "pgstorage_pg_wal_fpi_total",
        "pgstorage_pg_wal_bytes_total",
        "pgstorage_pg_wal_buffers_full_total",
        "pgstorage_pg_commits_total",
        "pgstorage_pg_rollbacks_total",
        "pgstorage_pg_checkpoint_write_seconds_total",
        "pgstorage_pg_checkpoint_sync_seconds_total",
        "pgstorage_pg_checkpoint_buffers_written_total",
        "pgstorage_pg_bgwriter_buffers_clean_total",
        "pgstorage_pg_bgwriter_maxwritten_clean_total",
        "pgstorage_pg_buffers_alloc_total",
    ] {
        assert!(has(m, f, &[]), "{v}: {f} missing");
    }
    let writes = sample(m, "pgstorage_pg_wal_writes_total{cluster=\"c\"}").unwrap();
    assert!(writes > 0.0, "{v}: WAL writes {writes}");
    let wal_source = if major >= 18 {
        "pg_stat_io object=wal"
    } else {
        "pg_stat_wal"
    };

    // Checkpoints: pg_stat_bgwriter up to 16, pg_stat_checkpointer from 17;
    // the backends' own writes and fsyncs only up to 16.
    let requested = sample(
        m,
        "pgstorage_pg_checkpoints_total{cluster=\"c\",kind=\"requested\"}",
    )
    .unwrap_or(0.0);
    assert!(requested >= 1.0, "{v}: the CHECKPOINT is counted");
    assert!(
        has(m, "pgstorage_pg_checkpoints_total", &["kind=\"timed\""]),
        "{v}"
    );
    for f in [
        "pgstorage_pg_backend_buffers_written_total",
        "pgstorage_pg_backend_fsyncs_total",
    ] {
        assert_eq!(has(m, f, &[]), major <= 16, "{v}: {f}");
    }
    let checkpoint_source = if major >= 17 {
        "pg_stat_checkpointer"
    } else {
        "pg_stat_bgwriter"
    };

    // pg_stat_io from 16; its WAL rows and *_bytes columns from 18, bytes
    // as operations × op_bytes (BLCKSZ) in 16 and 17.
    let io = samples_with(m, "pgstorage_pg_io_operations_total", &["cluster=\"c\""]);
    let io_bytes = samples_with(m, "pgstorage_pg_io_bytes_total", &["cluster=\"c\""]);
    let io_seconds = samples_with(m, "pgstorage_pg_io_seconds_total", &["cluster=\"c\""]);
    let io_source = if major >= 16 {
        let extends =
            "backend_type=\"client backend\",object=\"relation\",context=\"normal\",op=\"extend\"";
        let ops = sample(
            m,
            &format!("pgstorage_pg_io_operations_total{{cluster=\"c\",{extends}}}"),
        )
        .unwrap_or(0.0);
        assert!(ops > 0.0, "{v}: relation extends by pgbench: {io:?}");
        let bytes = sample(
            m,
            &format!("pgstorage_pg_io_bytes_total{{cluster=\"c\",{extends}}}"),
        )
        .unwrap();
        if major >= 18 {
            // extend_bytes: one extend may add several blocks at once.
            assert!(
                bytes >= ops * 8192.0 && bytes % 8192.0 == 0.0,
                "{v}: extend_bytes {bytes} for {ops} extends"
            );
        } else {
            // 16, 17: extends count blocks, each op_bytes (BLCKSZ).
            assert_eq!(bytes, ops * 8192.0, "{v}: extend bytes = extends × BLCKSZ");
        }
        assert!(!io_seconds.is_empty(), "{v}: track_io_timing is on");
        let wal_rows = io.iter().any(|(s, _)| s.contains("object=\"wal\""));
        assert_eq!(wal_rows, major >= 18, "{v}: object=wal rows");
        format!("pg_stat_io {} series", io.len())
    } else {
        assert!(
            io.is_empty() && io_bytes.is_empty() && io_seconds.is_empty(),
            "{v}: no pg_stat_io before 16: {io:?}"
        );
        "pg_stat_io absent".to_string()
    };

    // Settings: the same query everywhere; io_method exists from 18.
    for name in ["wal_sync_method", "synchronous_commit", "wal_buffers"] {
        assert!(
            has(
                m,
                "pgstorage_pg_setting_info",
                &[&format!("name=\"{name}\"")]
            ),
            "{v}: setting {name}"
        );
    }
    assert_eq!(
        has(m, "pgstorage_pg_setting_info", &["name=\"io_method\""]),
        major >= 18,
        "{v}: io_method"
    );
    for setting in ["track_io_timing", "track_wal_io_timing"] {
        assert_eq!(
            sample(
                m,
                &format!("pgstorage_pg_io_timing_enabled{{cluster=\"c\",setting=\"{setting}\"}}")
            ),
            Some(1.0),
            "{v}: {setting}"
        );
    }

    // Wait events pass through as the server names them. 17 renamed the IO
    // events (IO:WALWrite became IO:WalWrite) but not the LWLocks
    // (LWLock:WALWrite kept its name): an IO event spelt "WAL..." is only
    // seen up to 16, "Wal..." only from 17.
    let waits = samples_with(
        m,
        "pgstorage_pg_wait_event_seconds_total",
        &["cluster=\"c\""],
    );
    assert!(!waits.is_empty(), "{v}: no wait events");
    let event = |s: &str| -> (String, String) {
        let label = |k: &str| {
            let start = s.find(&format!("{k}=\"")).unwrap() + k.len() + 2;
            s[start..].split('"').next().unwrap().to_string()
        };
        (label("wait_event_type"), label("wait_event"))
    };
    let mut storage_waits: Vec<String> = Vec::new();
    for (s, _) in &waits {
        let (ty, name) = event(s);
        if ty == "IO" && name.to_ascii_lowercase().starts_with("wal") {
            if major >= 17 {
                assert!(!name.starts_with("WAL"), "{v}: old IO name {name}");
            } else {
                assert!(!name.starts_with("Wal"), "{v}: new IO name {name}");
            }
        }
        if ty == "IO" || (ty == "LWLock" && name.starts_with("WAL")) {
            storage_waits.push(format!("{ty}:{name}"));
        }
    }
    storage_waits.sort();
    storage_waits.dedup();
    if major >= 17 {
        // pg_wait_events (17+) lists every event the server knows.
        let known = pg.psql(
            "SELECT string_agg(type || ':' || name, ' ' ORDER BY type, name) FROM pg_wait_events \
             WHERE name IN ('WalWrite', 'WALWrite', 'WalSync', 'WALSync')",
        );
        assert_eq!(known, "IO:WalSync IO:WalWrite LWLock:WALWrite", "{v}");
    }

    vec![
        format!("{} series", series_of_c(m).len()),
        format!("wal syncs via {wal_source}"),
        format!("checkpoints via {checkpoint_source}"),
        io_source,
        format!(
            "storage waits seen: {}",
            if storage_waits.is_empty() {
                "none".to_string()
            } else {
                storage_waits.join(" ")
            }
        ),
    ]
}

fn counters_track_postgres(kind: PgKind) {
    let Some(stack) = watched(kind).start() else {
        return;
    };
    let (pg, ex) = (&stack.pg, &stack.ex);
    // Let statistics settle, then read both sides.
    std::thread::sleep(Duration::from_millis(1500));
    let p0 = (own_wal_syncs(pg), own_commits(pg));
    std::thread::sleep(Duration::from_millis(1200));
    let m0 = ex.metrics();
    let e0 = (
        value(&m0, "pgstorage_pg_wal_syncs_total{cluster=\"c\"}").unwrap(),
        value(&m0, "pgstorage_pg_commits_total{cluster=\"c\"}").unwrap(),
    );
    let out = pg.pgbench_inserts(4, PGBENCH_SECONDS);
    assert!(out.contains("tps"), "{out}");
    std::thread::sleep(Duration::from_millis(2000));
    let p1 = (own_wal_syncs(pg), own_commits(pg));
    std::thread::sleep(Duration::from_millis(1200));
    let m1 = ex.metrics();
    let e1 = (
        value(&m1, "pgstorage_pg_wal_syncs_total{cluster=\"c\"}").unwrap(),
        value(&m1, "pgstorage_pg_commits_total{cluster=\"c\"}").unwrap(),
    );
    let (dsyncs_e, dsyncs_p) = (e1.0 - e0.0, p1.0 - p0.0);
    let (dcommits_e, dcommits_p) = (e1.1 - e0.1, p1.1 - p0.1);
    eprintln!(
        "PostgreSQL {}: WAL syncs exporter {dsyncs_e} / postgres {dsyncs_p}; commits exporter {dcommits_e} / postgres {dcommits_p}",
        pg.version()
    );
    assert!(
        dsyncs_p > 1000.0,
        "pgbench should cause many WAL syncs: {dsyncs_p}"
    );
    assert!(
        within(dsyncs_e, dsyncs_p, 0.10),
        "WAL syncs {dsyncs_e} vs {dsyncs_p}"
    );
    assert!(
        within(dcommits_e, dcommits_p, 0.10),
        "commits {dcommits_e} vs {dcommits_p}"
    );

    // Times are there (timing is on in the harness), and PostgreSQL's own
    // mean sync is plausible.
    let mean = value(&m1, "pgstorage_pg_wal_sync_mean_seconds{cluster=\"c\"}").unwrap();
    assert!(mean > 0.0 && mean < 10.0, "{mean}");
    // The exporter reaches the server over loopback, so the fastest
    // SELECT 1 round trip is measured: a positive figure far below the
    // statement timeout (tens of µs here).
    let rt = value(&m1, "pgstorage_pg_round_trip_seconds{cluster=\"c\"}").unwrap();
    assert!(rt > 0.0 && rt < 0.5, "{rt}");
    let named = pg.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg-storage-exporter'",
    );
    assert!(
        named.parse::<u32>().unwrap() >= 1,
        "application_name is set"
    );

    // A checkpoint, then the whole version table on the next scrape.
    pg.psql("CHECKPOINT");
    let m2 = ex.wait_for("the CHECKPOINT counted", Duration::from_secs(20), |m| {
        value(
            m,
            "pgstorage_pg_checkpoints_total{cluster=\"c\",kind=\"requested\"}",
        )
        .unwrap_or(0.0)
            >= 1.0
    });
    let parts = check_version_table(pg, &m2);
    let log = ex.log();
    for bad in ["level=ERROR", "level=WARN"] {
        assert!(
            !log.contains(bad),
            "PostgreSQL {}: {bad} in log:\n{log}",
            pg.version()
        );
    }
    pg::report(&format!(
        "postgres {}: collector ok, {}, {dsyncs_e} WAL syncs / {dcommits_e} commits under pgbench (postgres {dsyncs_p} / {dcommits_p})",
        pg.version(),
        parts.join(", ")
    ));
}

/// How long pgbench runs in [`counters_track_postgres`]: long enough for
/// well over 1,000 WAL syncs here, short enough for five versions in CI.
const PGBENCH_SECONDS: u32 = 10;

#[test]
fn counters_track_postgres_14() {
    counters_track_postgres(PgKind::V14);
}

#[test]
fn counters_track_postgres_15() {
    counters_track_postgres(PgKind::V15);
}

#[test]
fn counters_track_postgres_16() {
    counters_track_postgres(PgKind::V16);
}

#[test]
fn counters_track_postgres_17() {
    counters_track_postgres(PgKind::V17);
}

#[test]
fn counters_track_postgres_18() {
    counters_track_postgres(PgKind::V18);
}

fn survives_restart(kind: PgKind) {
    let Some(stack) = watched(kind).start() else {
        return;
    };
    let (pg, ex) = (&stack.pg, &stack.ex);

    let stopped = Instant::now();
    pg.stop();
    let m = ex.wait_for("pg_up 0", Duration::from_secs(10), |m| {
        pg_up(m) == Some(0.0)
    });
    let took = stopped.elapsed();
    // Two scrape intervals (2 × 500 ms) plus the time pg_ctl took to return.
    assert!(
        took < Duration::from_secs(3),
        "pg_up went to 0 after {took:?}"
    );
    assert!(
        value(&m, "pgstorage_pg_wal_syncs_total{cluster=\"c\"}").is_none(),
        "no stale values while down"
    );
    // Probes and /metrics go on while PostgreSQL is down.
    let c0 = count(&m, "t", "commit");
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(ex.get("/metrics").0);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert!(
        count(&ex.metrics(), "t", "commit") > c0,
        "probes kept running"
    );

    pg.start_again();
    ex.wait_for("pg_up back to 1", Duration::from_secs(40), |m| {
        pg_up(m) == Some(1.0)
    });
    assert!(
        ex.log().contains("cannot connect to PostgreSQL")
            || ex.log().contains("lost the PostgreSQL connection")
    );
    pg::report(&format!(
        "postgres {}: restart ok, pg_up 0 after {took:?}, back to 1 after start",
        pg.version()
    ));
}

#[test]
fn survives_restart_14() {
    survives_restart(PgKind::V14);
}

#[test]
fn survives_restart_15() {
    survives_restart(PgKind::V15);
}

#[test]
fn survives_restart_16() {
    survives_restart(PgKind::V16);
}

#[test]
fn survives_restart_17() {
    survives_restart(PgKind::V17);
}

#[test]
fn survives_restart_18() {
    survives_restart(PgKind::V18);
}

#[test]
fn wrong_password_is_a_clear_error_without_the_password() {
    let wrong = "Wr0ng-Secret-xyzzy";
    let Some(stack) = Stack::builder()
        .password(MON_PASSWORD)
        .role("mon", true)
        .cli(|pg, work| {
            [
                "--pg.dsn",
                &format!("c={}", pg.dsn("mon", wrong)),
                "--pg.scrape-interval",
                "500ms",
                "--no-pg.discover-volumes",
                "--probe.path",
                &format!("t={}", work.display()),
                "--probe.free-space-reserve",
                "0",
            ]
            .map(String::from)
            .to_vec()
        })
        .ready("a connect error", Duration::from_secs(30), |m| {
            value(
                m,
                "pgstorage_pg_scrape_errors_total{cluster=\"c\",query=\"connect\",cause=\"auth\"}",
            )
            .unwrap_or(0.0)
                >= 1.0
        })
        .start()
    else {
        return;
    };
    let (ex, m) = (&stack.ex, stack.ready.clone());
    assert_eq!(pg_up(&m), Some(0.0));
    let log = ex.wait_log(
        "password authentication failed for user",
        Duration::from_secs(10),
    );
    assert!(
        log.contains("password authentication failed for user"),
        "{log}"
    );
    assert!(log.contains("user=mon"), "the target is named: {log}");
    assert!(!log.contains(wrong), "password leaked into the log:\n{log}");
    assert!(!m.contains(wrong), "password leaked into metrics");
}

/// A multi-host DSN whose first host is dead: as libpq does, the hosts are
/// tried in turn, each on its own port, so the exporter reaches the second
/// one (and before this, the first port served both hosts: never up).
#[test]
fn multi_host_dsn_skips_a_dead_first_host() {
    let Some(pg) = PgServer::start(PgKind::V15, None) else {
        return;
    };
    pg.create_role("mon", MON_PASSWORD, true);
    // A port nothing listens on once the listener is dropped: connecting to
    // it is refused at once.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1 port={dead},{} user=mon password={MON_PASSWORD} \
         dbname=postgres sslmode=disable connect_timeout=3",
        pg.port()
    );
    let dir = tempfile::tempdir().unwrap();
    let ex = Exporter::start(&[
        "--pg.dsn",
        &format!("c={dsn}"),
        "--pg.scrape-interval",
        "500ms",
        "--no-pg.discover-volumes",
        "--probe.path",
        &format!("t={}", dir.path().display()),
        "--probe.free-space-reserve",
        "0",
    ]);
    let m = ex.wait_for(
        "pg_up 1 through the second host",
        Duration::from_secs(30),
        |m| pg_up(m) == Some(1.0),
    );
    // The dead host is skipped within one connection attempt, which is not
    // a failed one.
    let failed: Vec<&str> = m
        .lines()
        .filter(|l| {
            l.starts_with("pgstorage_pg_scrape_errors_total{cluster=\"c\",query=\"connect\"")
        })
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    let log = ex.log();
    assert!(
        !log.contains("cannot connect to PostgreSQL"),
        "no failed attempt is logged:\n{log}"
    );
    assert!(!log.contains(MON_PASSWORD) && !m.contains(MON_PASSWORD));
}

#[test]
fn discovers_data_and_symlinked_wal_volumes_with_a_pg_monitor_role() {
    if !loopdev::can_run("the discovery test", false) {
        return;
    }
    let lm = loopdev::LoopVolume::new(256 << 20, true);
    let waldir = lm.mnt.join("pg_wal");
    let Some(mut stack) = Stack::builder()
        .waldir(&waldir)
        .password(MON_PASSWORD)
        .role("mon", true)
        .setup(|pg| {
            assert!(
                std::fs::symlink_metadata(pg.data_dir().join("pg_wal"))
                    .unwrap()
                    .file_type()
                    .is_symlink()
            );
            // The WAL probe must follow the cluster's wal_sync_method.
            pg.psql("ALTER SYSTEM SET wal_sync_method = 'fsync'");
            pg.psql("SELECT pg_reload_conf()");
            std::thread::sleep(Duration::from_millis(500));
        })
        .cli(|pg, _| {
            [
                "--pg.dsn",
                &format!("c18={}", pg.dsn("mon", MON_PASSWORD)),
                "--pg.scrape-interval",
                "500ms",
                "--probe.interval",
                "200ms",
                "--probe.busy-every",
                "5s",
                "--probe.read-file-size",
                "4MiB",
                "--probe.free-space-reserve",
                "0",
            ]
            .map(String::from)
            .to_vec()
        })
        .ready(
            "probes on both discovered volumes",
            Duration::from_secs(60),
            |m| count(m, "c18/wal", "commit") >= 2.0 && count(m, "c18/data", "read") >= 2.0,
        )
        .start()
    else {
        return;
    };
    let m = stack.ready.clone();
    let (pg, ex) = (&stack.pg, &mut stack.ex);
    let loopname = lm.name();
    let info = samples_with(&m, "pgstorage_volume_info", &["volume=\"c18/wal\""]);
    assert_eq!(info.len(), 1, "{m}");
    assert!(
        info[0].0.contains(&format!("device=\"{loopname}\"")),
        "{}",
        info[0].0
    );
    assert!(info[0].0.contains("sync_method=\"fsync\""), "{}", info[0].0);
    assert!(info[0].0.contains(&format!(
        "path=\"{}\"",
        waldir.canonicalize().unwrap().display()
    )));
    // The data volume reads; the WAL volume commits; neither does the other.
    assert_eq!(count(&m, "c18/data", "commit"), 0.0);
    assert_eq!(count(&m, "c18/wal", "read"), 0.0);
    for role in ["data", "wal"] {
        assert!(
            m.contains(&format!("pgstorage_cluster_volume_info{{cluster=\"c18\",volume=\"c18/{role}\",role=\"{role}\"}} 1")),
            "{role}: {m}"
        );
    }
    // PostgreSQL's own WAL syncs give the third ceiling basis, on the WAL
    // volume, and the ratio to the probe's syncs (once the probe's window
    // holds three bursts, 5 s apart here). The basis counts only
    // intervals in which each sync was one small commit's: a bulk load
    // first (its flushes are megabytes, tens of times one commit's time),
    // then one client's single-row INSERTs, whose rate the basis must not
    // fall below.
    let postgres_basis =
        "pgstorage_commit_ceiling_per_second{volume=\"c18/wal\",basis=\"postgres\"}";
    let load = pg
        .command("pgbench")
        .arg("-h")
        .arg(pg.socket_dir())
        .arg("-p")
        .arg(pg.port().to_string())
        .args(["-U", pg::SUPERUSER, "-i", "-s", "5", "-q", "postgres"])
        .output()
        .unwrap();
    assert!(
        load.status.success(),
        "pgbench -i: {}",
        kit::output_text(&load)
    );
    // The load's last syncs reach the statistics, and the exporter's
    // interval that holds them (collection intervals are joined into
    // intervals of at least 5 s) ends before the client starts.
    std::thread::sleep(Duration::from_secs(6));
    let m = ex.metrics();
    assert_eq!(
        value(&m, postgres_basis),
        None,
        "a bulk load's flushes are not one client's commits; sync mean {:?} s",
        value(&m, "pgstorage_pg_wal_sync_mean_seconds{cluster=\"c18\"}")
    );
    let out = pg.pgbench_inserts(1, 5);
    let tps: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no tps in pgbench's output: {out}"));
    // The exporter's interval holding the client's last commits ends
    // before the basis is read, so that it covers all of them: pgbench's
    // TPS is their mean rate, and a ceiling from part of them could fall
    // on a slower part of the run.
    std::thread::sleep(Duration::from_secs(7));
    let m = ex.wait_for("basis=postgres", Duration::from_secs(60), |m| {
        value(m, postgres_basis).is_some()
            && value(
                m,
                "pgstorage_pg_wal_sync_probe_ratio{cluster=\"c18\",volume=\"c18/wal\"}",
            )
            .is_some()
    });
    let ceiling = value(&m, postgres_basis).unwrap();
    // The window's sync mean still holds the bulk load's flushes.
    let mean = value(&m, "pgstorage_pg_wal_sync_mean_seconds{cluster=\"c18\"}").unwrap();
    let rt = value(&m, "pgstorage_pg_round_trip_seconds{cluster=\"c18\"}").unwrap();
    // The WAL part of the basis: this debug build's own SELECT 1 round
    // trip (over TCP loopback) runs tens of µs slower than a release
    // build's, and next to syncs of 100-200 µs it can reach what
    // pgbench's whole INSERT over a Unix socket costs beyond the WAL.
    let wal_only = 1.0 / (1.0 / ceiling - rt);
    eprintln!(
        "basis=postgres after pgbench -i -s 5 and 1 client's INSERTs: ceiling {ceiling:.0}/s \
         ({:.2}x the client's {tps:.0} TPS), {wal_only:.0}/s ({:.2}x) without the round trip \
         of {:.0} us; the window's mean sync over every sync {:.0} us",
        ceiling / tps,
        wal_only / tps,
        rt * 1e6,
        mean * 1e6,
    );
    assert!(
        wal_only >= tps,
        "the postgres basis' WAL time, {wal_only}/s, is below one client's {tps} TPS"
    );
    let ratio = value(
        &m,
        "pgstorage_pg_wal_sync_probe_ratio{cluster=\"c18\",volume=\"c18/wal\"}",
    )
    .unwrap();
    assert!(ratio > 0.0 && ratio < 1000.0, "{ratio}");

    // Probe directories beside PostgreSQL's, never inside.
    let wal_probe = lm.mnt.join("pg-storage-exporter-probe-c18");
    assert!(wal_probe.join("wal.probe").exists());
    let data_parent = pg
        .data_dir()
        .canonicalize()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let data_probe = data_parent.join("pg-storage-exporter-probe-c18");
    assert!(data_probe.join("read.probe").exists());
    assert!(
        !dir_entries(&pg.data_dir().join("pg_wal"))
            .iter()
            .any(|e| e.contains("probe"))
    );
    assert!(
        !dir_entries(pg.data_dir())
            .iter()
            .any(|e| e.contains("probe"))
    );

    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(Duration::from_secs(15)).success());
    assert!(
        !wal_probe.exists() && !data_probe.exists(),
        "probe dirs removed at shutdown"
    );
    drop(stack);
}

#[test]
fn tls_follows_sslmode() {
    // Debian's PostgreSQL 15 is built with OpenSSL; the PyPI 18 build is not.
    let Some(pg) = Stack::builder()
        .pg_version(PgKind::V15)
        .password(MON_PASSWORD)
        .role("mon", true)
        .start_postgres()
    else {
        return;
    };
    // A CA and a server certificate it signed, for localhost only.
    let certs = tempfile::tempdir().unwrap();
    let p = |n: &str| certs.path().join(n).to_str().unwrap().to_string();
    let (ca, crt, key) = (
        certs.path().join("ca.crt"),
        certs.path().join("server.crt"),
        certs.path().join("server.key"),
    );
    std::fs::write(
        certs.path().join("ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let steps: [Vec<String>; 3] = [
        [
            "req",
            "-new",
            "-x509",
            "-days",
            "2",
            "-nodes",
            "-subj",
            "/CN=test-ca",
            "-keyout",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([p("ca.key"), "-out".into(), p("ca.crt")])
        .collect(),
        ["req", "-new", "-nodes", "-subj", "/CN=localhost", "-keyout"]
            .iter()
            .map(|s| s.to_string())
            .chain([p("server.key"), "-out".into(), p("server.csr")])
            .collect(),
        ["x509", "-req", "-days", "2", "-CAcreateserial", "-in"]
            .iter()
            .map(|s| s.to_string())
            .chain([
                p("server.csr"),
                "-CA".into(),
                p("ca.crt"),
                "-CAkey".into(),
                p("ca.key"),
                "-extfile".into(),
                p("ext"),
                "-out".into(),
                p("server.crt"),
            ])
            .collect(),
    ];
    for args in steps {
        let ok = Command::new("openssl").args(&args).output().unwrap();
        assert!(
            ok.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&ok.stderr)
        );
    }
    for (src, name) in [(&crt, "server.crt"), (&key, "server.key")] {
        let dst = pg.data_dir().join(name);
        std::fs::copy(src, &dst).unwrap();
        assert!(
            Command::new("chown")
                .args(["postgres:postgres", dst.to_str().unwrap()])
                .status()
                .unwrap()
                .success()
        );
        assert!(
            Command::new("chmod")
                .args(["600", dst.to_str().unwrap()])
                .status()
                .unwrap()
                .success()
        );
    }
    pg.psql("ALTER SYSTEM SET ssl = on");
    pg.psql("SELECT pg_reload_conf()");
    std::thread::sleep(Duration::from_millis(500));
    let port = pg.port();
    let base = format!("port={port} user=mon password={MON_PASSWORD} dbname=postgres");
    let crt = ca.display();
    // (DSN, connects?)
    let cases = [
        (format!("host=127.0.0.1 {base} sslmode=require"), true),
        (
            format!("host=localhost {base} sslmode=verify-full sslrootcert={crt}"),
            true,
        ),
        (
            format!("host=127.0.0.1 {base} sslmode=verify-ca sslrootcert={crt}"),
            true,
        ),
        // The certificate names localhost, not 127.0.0.1.
        (
            format!("host=127.0.0.1 {base} sslmode=verify-full sslrootcert={crt}"),
            false,
        ),
    ];
    for (dsn, connects) in cases {
        let ex = Exporter::start(&[
            "--pg.dsn",
            &format!("c={dsn}"),
            "--pg.scrape-interval",
            "300ms",
            "--no-pg.discover-volumes",
        ]);
        if connects {
            ex.wait_for("pg_up 1", Duration::from_secs(20), |m| {
                pg_up(m) == Some(1.0)
            });
            let encrypted = pg.psql(
                "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
                 WHERE ssl AND application_name = 'pg-storage-exporter'",
            );
            assert!(
                encrypted.parse::<u32>().unwrap() >= 1,
                "{dsn}: not encrypted"
            );
        } else {
            ex.wait_for("a connect error", Duration::from_secs(20), |m| {
                value(
                    m,
                    "pgstorage_pg_scrape_errors_total{cluster=\"c\",query=\"connect\",cause=\"tls\"}",
                )
                .unwrap_or(0.0)
                    >= 1.0
            });
            ex.wait_log("not valid for name", Duration::from_secs(10));
            assert_eq!(pg_up(&ex.metrics()), Some(0.0));
        }
        assert!(!ex.log().contains(MON_PASSWORD));
    }
}

#[test]
fn survives_sigkill_of_the_postmaster() {
    let Some(stack) = watched(PgKind::V18).start() else {
        return;
    };
    let (pg, ex) = (&stack.pg, &stack.ex);
    let pid: i32 = std::fs::read_to_string(pg.data_dir().join("postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill(2) on the postmaster this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    ex.wait_for("pg_up 0", Duration::from_secs(10), |m| {
        pg_up(m) == Some(0.0)
    });
    assert_eq!(ex.get("/metrics").0, 200);
    // Backends notice the postmaster's death and exit; then it can start.
    std::thread::sleep(Duration::from_secs(3));
    let m = ex.metrics();
    let errors: Vec<(String, f64)> =
        samples_with(&m, "pgstorage_pg_scrape_errors_total", &["cluster=\"c\""]);
    eprintln!("while down: {errors:?}");
    assert!(
        errors
            .iter()
            .any(|(s, v)| s.contains("cause=\"connection\"") && *v >= 1.0),
        "the outage is counted with its cause: {errors:?}"
    );
    assert!(
        value(&m, "pgstorage_pg_commits_total{cluster=\"c\"}").is_none(),
        "no stale figures"
    );
    pg.start_again_after_crash(Duration::from_secs(30));
    ex.wait_for("pg_up back to 1", Duration::from_secs(40), |m| {
        pg_up(m) == Some(1.0)
    });
    let log = ex.log();
    assert!(!log.contains("panicked"));
    // One incident: a warning when the connection is lost and none per
    // failed reconnect attempt; an info line when it is back.
    let warns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("level=WARN") && l.contains("cluster=c"))
        .collect();
    eprintln!("warnings: {warns:#?}");
    assert!(!warns.is_empty() && warns.len() <= 2, "{warns:#?}");
    assert!(log.contains("reconnected to PostgreSQL"), "{log}");
}

/// A cluster with track_wal_io_timing off: one warning line saying what is
/// missing, once, not once per scrape or reconnection; track_io_timing
/// (on here) is not warned about.
#[test]
fn track_wal_io_timing_off_is_warned_about_once() {
    let Some(stack) = watched(PgKind::V18)
        .setup(|pg| {
            pg.psql("ALTER SYSTEM SET track_wal_io_timing = off");
            pg.psql("SELECT pg_reload_conf()");
        })
        .start()
    else {
        return;
    };
    let ex = &stack.ex;
    ex.wait_log("track_wal_io_timing is off", Duration::from_secs(30));
    // Six more scrapes (every 500 ms) must not repeat it.
    std::thread::sleep(Duration::from_secs(3));
    let log = ex.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("code=track_wal_io_timing_off"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].contains("level=WARN"), "{}", lines[0]);
    assert!(lines[0].contains("cluster=c"), "{}", lines[0]);
    assert!(
        lines[0].contains("WAL write and sync seconds are absent"),
        "{}",
        lines[0]
    );
    assert!(!log.contains("code=track_io_timing_off"), "{log}");
}
