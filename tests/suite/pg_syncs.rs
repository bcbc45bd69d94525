//! The `postgres.syncs` collector on real PostgreSQL 15 and 18 servers: its
//! WAL histogram against the server's own WAL sync count and mean time
//! (`track_wal_io_timing = on` in the harness), its data-file histogram
//! against a forced checkpoint's fsyncs, two clusters and a foreign
//! process told apart, and the exporter without the privileges.
//!
//! Needs root, tracefs and a kernel with BTF, and the binary built with
//! the `bpf` feature (scripts/test builds it so).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::pg::{PgKind, PgServer};
use crate::common::stack::{Stack, StackBuilder};
use crate::common::{Part, cannot_run_current, sample};

const PASSWORD: &str = "Sync-Pa55word-4-tests";

/// Whether this machine and build can trace; a failure (or a listed skip)
/// saying why not otherwise. Mounts tracefs when it is not (the kernel's
/// syscall tracepoint ids are read there).
fn can_trace() -> bool {
    if !cfg!(feature = "bpf") {
        cannot_run_current(
            Part::Root,
            "the test binary was built without the bpf feature",
        );
        return false;
    }
    if !rustix::process::geteuid().is_root() {
        cannot_run_current(Part::Root, "loading BPF programs needs root");
        return false;
    }
    if !Path::new("/sys/kernel/tracing/events/syscalls").is_dir() {
        let _ = std::process::Command::new("mount")
            .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
            .status();
    }
    true
}

fn watched(kind: PgKind) -> StackBuilder<'static> {
    Stack::builder()
        .pg_version(kind)
        .password(PASSWORD)
        .role("mon", true)
        .setup(|pg| {
            // No autovacuum or timed checkpoint in the measured windows.
            pg.psql("ALTER SYSTEM SET autovacuum = off");
            pg.psql("ALTER SYSTEM SET checkpoint_timeout = '1h'");
            pg.psql("ALTER SYSTEM SET log_checkpoints = on");
            pg.psql("SELECT pg_reload_conf()");
        })
        .cluster(
            "c",
            "mon",
            "scrape_interval = \"500ms\"\ndiscover_volumes = false",
        )
        .ready("cluster c traced", Duration::from_secs(30), |m| {
            sample(m, "pgstorage_pg_sync_traced{cluster=\"c\",reason=\"ok\"}") == Some(1.0)
        })
}

/// (count, sum) of `kind`'s histogram for `cluster`.
fn hist(m: &str, cluster: &str, kind: &str) -> (f64, f64) {
    let sel = format!("{{cluster=\"{cluster}\",kind=\"{kind}\"}}");
    (
        sample(m, &format!("pgstorage_pg_sync_seconds_count{sel}")).unwrap_or(0.0),
        sample(m, &format!("pgstorage_pg_sync_seconds_sum{sel}")).unwrap_or(0.0),
    )
}

/// PostgreSQL's own WAL syncs: (count, seconds).
fn own_wal_syncs(pg: &PgServer) -> (f64, f64) {
    let sql = if pg.major() >= 18 {
        "SELECT sum(fsyncs) || ' ' || sum(fsync_time) FROM pg_stat_io \
         WHERE object = 'wal' AND context = 'normal'"
    } else {
        "SELECT wal_sync || ' ' || wal_sync_time FROM pg_stat_wal"
    };
    let out = pg.psql(sql);
    let mut it = out.split_whitespace().map(|v| v.parse::<f64>().unwrap());
    let (n, ms) = (it.next().unwrap(), it.next().unwrap());
    (n, ms / 1000.0)
}

/// Polls `read` until two readings [`SETTLE`] apart are equal (the server's
/// statistics are flushed a moment after the work, the exporter reads the
/// kernel maps every 5 seconds).
fn settled<T: PartialEq + std::fmt::Debug>(what: &str, read: impl Fn() -> T) -> T {
    let settle = SETTLE;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = read();
    loop {
        std::thread::sleep(settle);
        let now = read();
        if now == last {
            return now;
        }
        assert!(Instant::now() < deadline, "{what} never settled: {now:?}");
        last = now;
    }
}

/// Longer than the exporter's round of reading the kernel maps (5 s), so
/// that two equal readings mean the counts stopped moving, not that the
/// exporter has not read the maps again yet.
const SETTLE: Duration = Duration::from_millis(5500);

fn wal_and_checkpoint(kind: PgKind) {
    if !can_trace() {
        return;
    }
    let Some(stack) = watched(kind).start() else {
        return;
    };
    let (pg, ex) = (&stack.pg, &stack.ex);
    let v = pg.version().to_string();
    pg.psql("CREATE TABLE IF NOT EXISTS ins(id bigserial PRIMARY KEY, v int)");
    let both = || {
        let m = ex.metrics();
        (own_wal_syncs(pg).0 as u64, hist(&m, "c", "wal").0 as u64)
    };
    settled("WAL syncs before", both);
    let (p0, s0) = own_wal_syncs(pg);
    let (e0, es0) = hist(&ex.metrics(), "c", "wal");

    // 12 s here; PGSE_SYNCS_PGBENCH_SECONDS=60 for the longer run.
    let seconds = std::env::var("PGSE_SYNCS_PGBENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let out = pg.pgbench_inserts(4, seconds);
    assert!(out.contains("tps"), "{out}");
    settled("WAL syncs after", both);
    let (p1, s1) = own_wal_syncs(pg);
    let m1 = ex.metrics();
    let (e1, es1) = hist(&m1, "c", "wal");
    let (dp, de) = (p1 - p0, e1 - e0);
    let (mean_p, mean_e) = ((s1 - s0) / dp, (es1 - es0) / de);
    crate::common::pg::report(&format!(
        "PostgreSQL {v}, pgbench -c 4 for {seconds} s: WAL syncs traced {de} / server {dp} \
         ({:+.2} %); mean traced {:.1} us / server {:.1} us ({:+.1} %)",
        (de - dp) / dp * 100.0,
        mean_e * 1e6,
        mean_p * 1e6,
        (mean_e - mean_p) / mean_p * 100.0
    ));
    assert!(dp > 1000.0, "{v}: pgbench should make many WAL syncs: {dp}");
    assert!(
        ((de - dp) / dp).abs() <= 0.02,
        "{v}: WAL syncs {de} vs {dp}"
    );
    assert!(
        ((mean_e - mean_p) / mean_p).abs() <= 0.10,
        "{v}: mean WAL sync {mean_e} vs {mean_p}"
    );

    // A forced checkpoint with the table's pages dirty: the checkpointer
    // fsyncs each relation segment it wrote. The server reports them in
    // pg_stat_io (16+) and, SLRU segments included, in the checkpoint log
    // line's "sync files=N".
    let own_relation_fsyncs = || {
        (pg.major() >= 16).then(|| {
            pg.psql(
                "SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE backend_type = \
                 'checkpointer' AND object = 'relation'",
            )
            .parse::<f64>()
            .unwrap()
        })
    };
    let data = || hist(&ex.metrics(), "c", "data").0 as u64;
    let d0 = settled("data syncs before", data);
    let r0 = own_relation_fsyncs();
    let log_before = pg.log().len();
    pg.psql("UPDATE ins SET v = v + 1");
    pg.psql("CHECKPOINT");
    let d1 = settled("data syncs after", data);
    let dd = (d1 - d0) as f64;
    let log = pg.log();
    let line = log[log_before..]
        .lines()
        .find(|l| l.contains("checkpoint complete"))
        .unwrap_or_else(|| panic!("{v}: no checkpoint log line:\n{}", &log[log_before..]));
    let sync_files: f64 = line
        .split("sync files=")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{v}: no sync files= in {line}"));
    let own = if let Some(r0) = r0 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r1 = own_relation_fsyncs().unwrap();
            if r1 > r0 || Instant::now() > deadline {
                break Some(r1 - r0);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    } else {
        None
    };
    crate::common::pg::report(&format!(
        "PostgreSQL {v}: checkpoint data fsyncs traced {dd}; server: pg_stat_io {}, log sync \
         files={sync_files}",
        own.map_or("n/a".to_string(), |o| o.to_string())
    ));
    assert!(
        dd >= 2.0,
        "{v}: the checkpoint synced the table and its index: {dd}"
    );
    match own {
        Some(o) => assert!(((dd - o) / o).abs() <= 0.02, "{v}: data fsyncs {dd} vs {o}"),
        // Before 16 only the log counts them, with the SLRU segments
        // (pg_xact, pg_multixact, pg_commit_ts, pg_serial), which are
        // kind="other": at most a few more.
        None => assert!(
            dd <= sync_files && sync_files - dd <= 4.0,
            "{v}: data fsyncs {dd} vs sync files={sync_files}"
        ),
    }
}

#[test]
fn pg_syncs_match_postgresql_15() {
    wal_and_checkpoint(PgKind::V15);
}

#[test]
fn pg_syncs_match_postgresql_18() {
    wal_and_checkpoint(PgKind::V18);
}

/// Docker's default capability set: no CAP_SYS_ADMIN, CAP_BPF or
/// CAP_PERFMON.
const DOCKER_DEFAULT_CAPS: &str = "-all,+chown,+dac_override,+fowner,+fsetid,+kill,+setgid,\
    +setuid,+setpcap,+net_bind_service,+net_raw,+sys_chroot,+mknod,+audit_write,+setfcap";

/// Without the privileges (a user other than root; root with a container
/// runtime's default capabilities) the exporter starts, says once why the
/// collector is off, and probes and watches PostgreSQL as ever.
#[test]
fn pg_syncs_off_without_privileges_and_nothing_else_changes() {
    use std::os::unix::fs::PermissionsExt;
    if !rustix::process::geteuid().is_root() {
        cannot_run_current(Part::Root, "switching to an unprivileged user needs root");
        return;
    }
    let Some(pg) = Stack::builder()
        .password(PASSWORD)
        .role("mon", true)
        .start_postgres()
    else {
        return;
    };
    // Without the bpf feature the reason is that instead.
    let reason = if cfg!(feature = "bpf") {
        "permission"
    } else {
        "not_built"
    };
    let tracing_off = format!("pgstorage_pg_sync_tracing{{reason=\"{reason}\"}}");
    let work = tempfile::Builder::new()
        .prefix("pgse-syncs-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for (who, setpriv) in [
        (
            "nobody",
            vec!["--reuid=65534", "--regid=65534", "--clear-groups"],
        ),
        (
            "root with a container's default capabilities",
            vec!["--bounding-set", DOCKER_DEFAULT_CAPS, "--inh-caps=-all"],
        ),
    ] {
        let vol = work.path().join(format!("vol-{}", who.len()));
        std::fs::create_dir(&vol).unwrap();
        std::fs::set_permissions(&vol, std::fs::Permissions::from_mode(0o777)).unwrap();
        let cfg = work.path().join(format!("c-{}.toml", who.len()));
        std::fs::write(
            &cfg,
            format!(
                "window = \"1m\"\n[[volume]]\nname = \"t\"\npath = \"{}\"\ninterval = \"100ms\"\n\
                 read_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n[[cluster]]\nname = \"c\"\n\
                 dsn = \"{}\"\nscrape_interval = \"500ms\"\ndiscover_volumes = false\n",
                vol.display(),
                pg.dsn("mon", PASSWORD)
            ),
        )
        .unwrap();
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut cmd = std::process::Command::new("setpriv");
        cmd.args(&setpriv).arg(crate::common::BIN).args([
            "--web.listen-address",
            "127.0.0.1:0",
            "--config.file",
        ]);
        cmd.arg(&cfg);
        let ex = crate::common::Exporter::spawn(cmd);
        let m = ex.wait_for(
            "probes, PostgreSQL and the reason",
            Duration::from_secs(30),
            |m| {
                sample(m, "pgstorage_pg_up{cluster=\"c\"}") == Some(1.0)
                    && sample(m, "pgstorage_collector_success{collector=\"probe:t\"}") == Some(1.0)
                    && sample(m, &tracing_off) == Some(0.0)
            },
        );
        assert_eq!(
            sample(
                &m,
                "pgstorage_collector_success{collector=\"postgres.syncs\"}"
            ),
            Some(0.0),
            "{who}"
        );
        assert_eq!(
            sample(&m, "pgstorage_collector_success{collector=\"postgres:c\"}"),
            Some(1.0),
            "{who}"
        );
        assert!(!m.contains("pgstorage_pg_sync_seconds_count"), "{who}: {m}");
        let log = ex.log();
        let off: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("sync tracing is off"))
            .collect();
        assert_eq!(off.len(), 1, "{who}: {log}");
        assert!(
            off[0].contains(&format!("reason={reason}")),
            "{who}: {}",
            off[0]
        );
        crate::common::pg::report(&format!("as {who}: {}", off[0]));
    }
}

/// Two clusters watched by one exporter are told apart by their process
/// trees, and fio doing fdatasync in a cluster's own pg_wal directory is
/// not counted: it is no descendant of the postmaster.
#[test]
fn pg_syncs_tell_two_clusters_and_a_foreign_process_apart() {
    if !can_trace() {
        return;
    }
    let start = |kind| {
        Stack::builder()
            .pg_version(kind)
            .password(PASSWORD)
            .role("mon", true)
            .start_postgres()
    };
    let (Some(a), Some(b)) = (start(PgKind::V18), start(PgKind::V15)) else {
        return;
    };
    let work = tempfile::Builder::new()
        .prefix("pgse-syncs-")
        .tempdir()
        .unwrap();
    let cfg = work.path().join("c.toml");
    let cluster = |name: &str, pg: &PgServer| {
        format!(
            "[[cluster]]\nname = \"{name}\"\ndsn = \"{}\"\nscrape_interval = \"500ms\"\n\
             discover_volumes = false\n",
            pg.dsn("mon", PASSWORD)
        )
    };
    std::fs::write(
        &cfg,
        format!("window = \"1m\"\n{}{}", cluster("a", &a), cluster("b", &b)),
    )
    .unwrap();
    let ex = crate::common::Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    ex.wait_for("both clusters traced", Duration::from_secs(30), |m| {
        ["a", "b"].iter().all(|c| {
            sample(
                m,
                &format!("pgstorage_pg_sync_traced{{cluster=\"{c}\",reason=\"ok\"}}"),
            ) == Some(1.0)
        })
    });
    a.psql("CREATE TABLE ins(id bigserial PRIMARY KEY, v int)");
    let read = || {
        let m = ex.metrics();
        (
            own_wal_syncs(&a).0 as u64,
            hist(&m, "a", "wal").0 as u64,
            own_wal_syncs(&b).0 as u64,
            hist(&m, "b", "wal").0 as u64,
        )
    };
    let before = settled("WAL syncs before", read);

    // fio in b's pg_wal (a name PostgreSQL ignores there), at the same
    // time as pgbench on a.
    let walb = b.data_dir().join("pg_wal");
    let fio = std::process::Command::new("fio")
        .args([
            "--name=foreign",
            "--rw=write",
            "--bs=8k",
            "--size=4M",
            "--fdatasync=1",
            "--ioengine=psync",
        ])
        .arg(format!("--directory={}", walb.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run fio (scripts/test installs it)");
    a.pgbench_inserts(4, 5);
    let out = fio.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for e in std::fs::read_dir(&walb).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("foreign") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    let after = settled("WAL syncs after", read);
    let (pa, ea, pb, eb) = (
        after.0 - before.0,
        after.1 - before.1,
        after.2 - before.2,
        after.3 - before.3,
    );
    crate::common::pg::report(&format!(
        "cluster a (pgbench): traced {ea} / server {pa}; cluster b (idle, fio's 512 \
         fdatasyncs in its pg_wal): traced {eb} / server {pb}"
    ));
    assert!(pa > 500, "{pa}");
    assert!(
        ea.abs_diff(pa) as f64 <= pa as f64 * 0.02,
        "a: {ea} vs {pa}"
    );
    // b's own WAL syncs (a background record now and then), none of fio's.
    assert!(eb <= pb + 2, "b: traced {eb}, server {pb}: fio counted?");
}

/// `check --pg.dsn` shows a few seconds of the server's own syncs, by
/// kind, in its text and JSON reports.
#[test]
fn check_shows_the_servers_own_syncs() {
    if !can_trace() {
        return;
    }
    let Some(pg) = Stack::builder()
        .password(PASSWORD)
        .role("mon", true)
        .start_postgres()
    else {
        return;
    };
    pg.psql("CREATE TABLE ins(id bigserial PRIMARY KEY, v int)");
    let dir = tempfile::tempdir().unwrap();
    let dsn = pg.dsn("mon", PASSWORD);
    let load = std::thread::scope(|s| {
        let bench = s.spawn(|| pg.pgbench_inserts(2, 12));
        std::thread::sleep(Duration::from_secs(2));
        let run = |format: &str| {
            let out = std::process::Command::new(crate::common::BIN)
                .arg("check")
                .arg(dir.path())
                .args(["--audit-only", "--format", format, "--pg.dsn", &dsn])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let text = run("text");
        let json = run("json");
        bench.join().unwrap();
        (text, json)
    });
    let (text, json) = load;
    crate::common::pg::report(&format!(
        "check --pg.dsn: {}",
        text.lines()
            .skip_while(|l| !l.starts_with("server's own syncs"))
            .collect::<Vec<_>>()
            .join(" | ")
    ));
    let wal = text
        .lines()
        .find(|l| l.trim_start().starts_with("wal "))
        .unwrap_or_else(|| panic!("{text}"));
    let n: u64 = wal.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(n > 100, "{wal}");
    assert!(
        text.contains("server's own syncs over 5 s (traced in the kernel):"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let kinds = v["server_syncs"]["kinds"]
        .as_array()
        .unwrap_or_else(|| panic!("{json}"));
    assert_eq!(kinds[0]["kind"], "wal", "{json}");
    assert!(kinds[0]["count"].as_u64().unwrap() > 100, "{json}");
    assert!(kinds[0]["p99_le_seconds"].as_f64().unwrap() > 0.0, "{json}");
}

/// wal_sync_method = open_datasync: the WAL file is opened with O_DSYNC and
/// each write is the sync, so the WAL histogram counts those writes: as
/// many as PostgreSQL's own WAL writes (pg_stat_io, 18).
#[test]
fn pg_syncs_count_the_o_dsync_wal_writes_of_open_datasync() {
    if !can_trace() {
        return;
    }
    let Some(stack) = Stack::builder()
        .password(PASSWORD)
        .role("mon", true)
        .setup(|pg| {
            pg.psql("ALTER SYSTEM SET wal_sync_method = 'open_datasync'");
            pg.psql("SELECT pg_reload_conf()");
        })
        .cluster(
            "c",
            "mon",
            "scrape_interval = \"500ms\"\ndiscover_volumes = false",
        )
        .ready("cluster c traced", Duration::from_secs(30), |m| {
            sample(m, "pgstorage_pg_sync_traced{cluster=\"c\",reason=\"ok\"}") == Some(1.0)
        })
        .start()
    else {
        return;
    };
    let (pg, ex) = (&stack.pg, &stack.ex);
    assert_eq!(pg.psql("SHOW wal_sync_method"), "open_datasync");
    pg.psql("CREATE TABLE ins(id bigserial PRIMARY KEY, v int)");
    let writes = || -> u64 {
        pg.psql("SELECT sum(writes) FROM pg_stat_io WHERE object = 'wal' AND context = 'normal'")
            .parse::<f64>()
            .unwrap() as u64
    };
    let both = || (writes(), hist(&ex.metrics(), "c", "wal").0 as u64);
    let before = settled("WAL writes before", both);
    pg.pgbench_inserts(4, 8);
    let after = settled("WAL writes after", both);
    let (dp, de) = (after.0 - before.0, after.1 - before.1);
    crate::common::pg::report(&format!(
        "open_datasync: O_DSYNC WAL writes traced {de} / server's WAL writes {dp}"
    ));
    assert!(dp > 500, "{dp}");
    assert!(de.abs_diff(dp) as f64 <= dp as f64 * 0.02, "{de} vs {dp}");
}
