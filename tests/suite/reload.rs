//! SIGHUP reload, end to end on the real binary: a valid configuration is
//! applied (volumes and clusters added, changed, removed, their files and
//! series gone), an invalid one is refused with the running configuration
//! kept, and both are logged and counted. A cluster added and removed by a
//! reload, with the volume its discovery found, on every supported
//! PostgreSQL version (14 to 18: discovery checks the data directory's
//! PG_VERSION against the server's).

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::loopdev;
use common::pg::{self, PgKind};
use common::stack::Stack;
use common::*;

const WAIT: Duration = Duration::from_secs(30);
const MON_PASSWORD: &str = "Mon-Pa55word-4-reload";

fn volume(name: &str, path: &Path, interval: &str) -> String {
    format!(
        "[[volume]]\nname = \"{name}\"\npath = \"{}\"\ninterval = \"{interval}\"\n\
         read_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n",
        path.display()
    )
}

fn reload_counter(m: &str, result: &str) -> f64 {
    sample(
        m,
        &format!("pgstorage_config_reloads_total{{result=\"{result}\"}}"),
    )
    .unwrap_or(-1.0)
}

fn reload_errors(m: &str, cause: &str) -> f64 {
    sample(
        m,
        &format!("pgstorage_config_reload_errors_total{{cause=\"{cause}\"}}"),
    )
    .unwrap_or(-1.0)
}

fn last_ok(m: &str) -> f64 {
    sample(m, "pgstorage_config_last_reload_successful").unwrap_or(-1.0)
}

fn occurrences(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn sighup_applies_a_valid_configuration_and_keeps_the_old_one_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, volume("a", &a, "100ms")).unwrap();
    let mut ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    let m = ex.wait_for("volume a probing", WAIT, |m| count(m, "a", "commit") >= 2.0);
    assert_eq!(last_ok(&m), 1.0);
    assert_eq!(reload_counter(&m, "success"), 0.0);
    assert!(sample(&m, "pgstorage_config_last_reload_success_timestamp_seconds").unwrap() > 1.7e9);

    // 1. A valid change: add volume b.
    std::fs::write(&cfg, volume("a", &a, "100ms") + &volume("b", &b, "100ms")).unwrap();
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("volume b added by the reload", WAIT, |m| {
        count(m, "b", "commit") >= 2.0
    });
    assert_eq!(reload_counter(&m, "success"), 1.0);
    assert_eq!(last_ok(&m), 1.0);
    let log = ex.wait_log("configuration reloaded", WAIT);
    assert!(log.contains("volumes_added=\"[\\\"b\\\"]\""), "{log}");

    // 2. An unknown key: refused, named with its line; a and b keep probing.
    std::fs::write(
        &cfg,
        volume("a", &a, "100ms") + "intervall = \"1s\"\n" + &volume("b", &b, "100ms"),
    )
    .unwrap();
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("the syntax error counted", WAIT, |m| {
        reload_errors(m, "syntax") == 1.0
    });
    assert_eq!(last_ok(&m), 0.0);
    assert_eq!(reload_counter(&m, "failure"), 1.0);
    let log = ex.wait_log("configuration reload refused", WAIT);
    assert!(
        log.contains("c.toml:7:1: volume[0].intervall: unknown field `intervall`"),
        "{log}"
    );
    let (ca, cb) = (count(&m, "a", "commit"), count(&m, "b", "commit"));
    let m = ex.wait_for("both volumes still probing", WAIT, |m| {
        count(m, "a", "commit") > ca + 2.0 && count(m, "b", "commit") > cb + 2.0
    });
    assert_eq!(last_ok(&m), 0.0);

    // 3. A bad value (a volume path that does not exist): refused as invalid.
    std::fs::write(
        &cfg,
        volume("a", &a, "100ms") + &volume("b", &dir.path().join("missing"), "100ms"),
    )
    .unwrap();
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("the invalid value counted", WAIT, |m| {
        reload_errors(m, "invalid") == 1.0
    });
    assert_eq!(reload_counter(&m, "failure"), 2.0);
    assert!(
        samples_with(&m, "pgstorage_volume_info", &["volume=\"b\""]).len() == 1,
        "b must still run: {m}"
    );

    // 4. Remove a, change b's interval: a's files and series go, b restarts.
    std::fs::write(&cfg, volume("b", &b, "200ms")).unwrap();
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("a removed, the reload applied", WAIT, |m| {
        reload_counter(m, "success") == 2.0
            && samples_with(m, "pgstorage_volume_info", &["volume=\"a\""]).is_empty()
    });
    assert_eq!(last_ok(&m), 1.0);
    assert!(
        !m.contains("volume=\"a\""),
        "every series of a must be gone: {}",
        m.lines()
            .filter(|l| l.contains("volume=\"a\""))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        !a.join("pg-storage-exporter-probe").exists(),
        "a's probe files are left: {:?}",
        dir_entries(&a.join("pg-storage-exporter-probe"))
    );
    ex.wait_for("b probing again", WAIT, |m| count(m, "b", "commit") >= 2.0);
    let log = ex.wait_log("volumes_changed=\"[\\\"b\\\"]\"", WAIT);
    assert!(log.contains("volumes_removed=\"[\\\"a\\\"]\""), "{log}");
    assert!(log.contains("interval=200ms"), "{log}");

    // 5. Nothing changed: said so.
    ex.signal(libc::SIGHUP);
    ex.wait_log("configuration reloaded: nothing changed", WAIT);

    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(WAIT).success(), "{}", ex.log());
    assert!(!b.join("pg-storage-exporter-probe").exists());
    let log = ex.log();
    assert_eq!(
        occurrences(&log, "configuration reload refused"),
        2,
        "{log}"
    );
    assert!(!log.contains("level=WARN"), "{log}");
}

fn window_samples(m: &str, volume: &str) -> f64 {
    samples_with(
        m,
        "pgstorage_probe_window_samples",
        &[&format!("volume=\"{volume}\""), "op=\"commit\""],
    )
    .iter()
    .map(|(_, v)| v)
    .sum()
}

fn provisioned_iops(m: &str, volume: &str) -> Option<f64> {
    samples_with(
        m,
        "pgstorage_io_limit",
        &[
            &format!("volume=\"{volume}\""),
            "source=\"provisioned\"",
            "resource=\"iops\"",
        ],
    )
    .first()
    .map(|(_, v)| *v)
}

/// A reload that changes only a volume's provisioned limits updates them in
/// place: the probe thread, its window and its counters go on, and the new
/// limit is exported after the next limits pass. A change of `interval`
/// still restarts the volume (its counts start over).
#[test]
fn sighup_keeps_the_window_when_only_limits_change() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    std::fs::create_dir_all(&a).unwrap();
    let cfg = dir.path().join("c.toml");
    let write = |interval: &str, iops: u32| {
        let text = format!(
            "limits_interval = \"200ms\"\n{}provisioned_iops = {iops}\n",
            volume("a", &a, interval)
        );
        std::fs::write(&cfg, text).unwrap();
    };
    write("100ms", 1000);
    let mut ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    let m = ex.wait_for("a probing with its limit exported", WAIT, |m| {
        count(m, "a", "commit") >= 20.0 && provisioned_iops(m, "a") == Some(1000.0)
    });
    let (count_before, window_before) = (count(&m, "a", "commit"), window_samples(&m, "a"));
    assert!(window_before >= 20.0, "{m}");

    // 1. Only provisioned_iops changes: kept, the new limit shown.
    write("100ms", 3000);
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("the new provisioned limit exported", WAIT, |m| {
        provisioned_iops(m, "a") == Some(3000.0)
    });
    let (count_after, window_after) = (count(&m, "a", "commit"), window_samples(&m, "a"));
    println!(
        "limits-only reload: commit count {count_before} -> {count_after}, \
         window samples {window_before} -> {window_after}"
    );
    assert!(count_after >= count_before, "the counters restarted:\n{m}");
    assert!(
        window_after >= window_before,
        "the window was dropped:\n{m}"
    );
    assert_eq!(reload_counter(&m, "success"), 1.0);
    ex.wait_for("the count still growing from its old value", WAIT, |m| {
        count(m, "a", "commit") > count_after + 2.0
    });
    let log = ex.wait_log("volume limits updated in place", WAIT);
    assert!(
        log.contains("changed=\"provisioned_iops 1000 -> 3000\""),
        "{log}"
    );
    assert!(
        log.contains("volumes_limits_updated=\"[\\\"a\\\"]\""),
        "{log}"
    );
    assert!(log.contains("volumes_changed=[]"), "{log}");
    assert_eq!(
        occurrences(&log, "volume stopped by the reload"),
        0,
        "{log}"
    );

    // 2. interval changes: restarted as before, the counts start over.
    let m = ex.metrics();
    let count_before = count(&m, "a", "commit");
    write("200ms", 3000);
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("a restarted by the reload", WAIT, |m| {
        reload_counter(m, "success") == 2.0
            && count(m, "a", "commit") < count_before
            && count(m, "a", "commit") >= 1.0
    });
    println!(
        "interval reload: commit count {count_before} -> {}, window samples -> {}",
        count(&m, "a", "commit"),
        window_samples(&m, "a")
    );
    assert!(window_samples(&m, "a") < window_before, "{m}");
    let log = ex.wait_log("volumes_changed=\"[\\\"a\\\"]\"", WAIT);
    assert_eq!(
        occurrences(&log, "volume stopped by the reload"),
        1,
        "{log}"
    );
    assert_eq!(provisioned_iops(&m, "a"), Some(3000.0), "{m}");

    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(WAIT).success(), "{}", ex.log());
    assert!(!ex.log().contains("level=WARN"), "{}", ex.log());
}

/// A cluster added by a reload is watched and its filesystem discovered; a
/// reload that drops it closes the connection and removes the volume its
/// discovery added, files and series. The PostgreSQL server is untouched.
fn sighup_adds_and_removes_a_cluster_with_its_discovered_volume(kind: PgKind) {
    // The configured volume is on tmpfs, a different filesystem from the
    // cluster's, so discovery has a filesystem of its own to add.
    let shm = tempfile::Builder::new()
        .prefix("pgse-reload-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let base = format!(
        "window = \"1m\"\n[[volume]]\nname = \"t\"\npath = \"{}\"\nprobes = [\"commit\"]\n\
         interval = \"100ms\"\nfree_space_reserve = \"0\"\n",
        shm.path().display()
    );
    // No cluster yet: the reload adds it.
    let Some(mut stack) = Stack::builder()
        .pg_version(kind)
        .password(MON_PASSWORD)
        .role("mon", true)
        .config(&base)
        .args(&[
            "--probe.read-file-size",
            "4MiB",
            "--probe.free-space-reserve",
            "0",
        ])
        .ready("volume t probing", WAIT, |m| count(m, "t", "commit") >= 2.0)
        .start()
    else {
        return;
    };
    let (cfg, m) = (stack.config_path(), stack.ready.clone());
    let (pg, ex) = (&stack.pg, &mut stack.ex);
    assert!(sample(&m, "pgstorage_pg_up{cluster=\"c\"}").is_none());

    let with_cluster = format!(
        "{base}[[cluster]]\nname = \"c\"\ndsn = \"{}\"\nscrape_interval = \"500ms\"\n",
        pg.dsn("mon", MON_PASSWORD)
    );
    std::fs::write(&cfg, &with_cluster).unwrap();
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("cluster c up and its data volume probed", WAIT, |m| {
        sample(m, "pgstorage_pg_up{cluster=\"c\"}") == Some(1.0)
            && count(m, "c/data", "read") >= 2.0
    });
    let probe_dir = pg
        .data_dir()
        .parent()
        .unwrap()
        .join("pg-storage-exporter-probe-c");
    assert!(probe_dir.exists(), "{m}");
    let connections = || {
        pg.psql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg-storage-exporter'",
        )
    };
    assert_eq!(connections(), "1");
    let log = ex.wait_log("configuration reloaded", WAIT);
    assert!(log.contains("clusters_added=\"[\\\"c\\\"]\""), "{log}");

    std::fs::write(&cfg, &base).unwrap();
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("cluster c and its volume gone", WAIT, |m| {
        reload_counter(m, "success") == 2.0
    });
    for gone in ["cluster=\"c\"", "volume=\"c/data\""] {
        assert!(
            !m.contains(gone),
            "{gone} is still exported: {}",
            m.lines()
                .filter(|l| l.contains(gone))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(
        !probe_dir.exists(),
        "discovered volume's probe files are left: {:?}",
        dir_entries(&probe_dir)
    );
    let log = ex.log();
    assert!(
        log.contains("discovered_volumes_removed=\"[\\\"c/data\\\"]\""),
        "{log}"
    );
    // The connection is closed by the reload, not at exit.
    let mut closed = false;
    for _ in 0..50 {
        if connections() == "0" {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(closed, "the exporter still holds a connection");
    let (_, t_count) = (0, count(&m, "t", "commit"));
    ex.wait_for("t still probing", WAIT, |m| {
        count(m, "t", "commit") > t_count
    });

    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(WAIT).success(), "{}", ex.log());
    assert!(!shm.path().join("pg-storage-exporter-probe").exists());
    pg::report(&format!(
        "postgres {}: reload ok, cluster added with its discovered volume c/data, removed with its files",
        pg.version()
    ));
}

#[test]
fn sighup_adds_and_removes_a_cluster_with_its_discovered_volume_14() {
    sighup_adds_and_removes_a_cluster_with_its_discovered_volume(PgKind::V14);
}

#[test]
fn sighup_adds_and_removes_a_cluster_with_its_discovered_volume_15() {
    sighup_adds_and_removes_a_cluster_with_its_discovered_volume(PgKind::V15);
}

#[test]
fn sighup_adds_and_removes_a_cluster_with_its_discovered_volume_16() {
    sighup_adds_and_removes_a_cluster_with_its_discovered_volume(PgKind::V16);
}

#[test]
fn sighup_adds_and_removes_a_cluster_with_its_discovered_volume_17() {
    sighup_adds_and_removes_a_cluster_with_its_discovered_volume(PgKind::V17);
}

#[test]
fn sighup_adds_and_removes_a_cluster_with_its_discovered_volume_18() {
    sighup_adds_and_removes_a_cluster_with_its_discovered_volume(PgKind::V18);
}

fn auth_errors(m: &str) -> f64 {
    sample(
        m,
        "pgstorage_pg_scrape_errors_total{cluster=\"c\",query=\"connect\",cause=\"auth\"}",
    )
    .unwrap_or(0.0)
}

/// A `password_file` is read at start and again on every reload, not in
/// between: a password fixed in the file is not used by the reconnects
/// that follow (each fails again), and is by the reload, which reconnects
/// the cluster whose password changed. Never logged.
#[test]
fn sighup_rereads_a_changed_password_file() {
    const WRONG: &str = "Wrong-Pa55word-4-reload";
    let Some(mut stack) = Stack::builder()
        .password(MON_PASSWORD)
        .role("mon", true)
        .cli(|pg, work| {
            let pw = work.join("mon.password");
            std::fs::write(&pw, format!("{WRONG}\n")).unwrap();
            let cfg = work.join("password-reload.toml");
            std::fs::write(
                &cfg,
                format!(
                    "window = \"1m\"\n[[cluster]]\nname = \"c\"\n\
                     dsn = \"host=127.0.0.1 port={} user=mon dbname=postgres sslmode=disable\"\n\
                     password_file = \"{}\"\nscrape_interval = \"500ms\"\ndiscover_volumes = false\n",
                    pg.port(),
                    pw.display()
                ),
            )
            .unwrap();
            vec!["--config.file".to_string(), cfg.display().to_string()]
        })
        .ready("the wrong password refused twice", WAIT, |m| {
            auth_errors(m) >= 2.0
        })
        .start()
    else {
        return;
    };
    let pw = stack.work.path().join("mon.password");
    std::fs::write(&pw, format!("{MON_PASSWORD}\n")).unwrap();
    let before = auth_errors(&stack.ready);
    let ex = &mut stack.ex;
    // The reconnects after the fix still send the password read at start.
    let m = ex.wait_for("another refused reconnect", WAIT, |m| {
        auth_errors(m) > before
    });
    assert_eq!(
        sample(&m, "pgstorage_pg_up{cluster=\"c\"}"),
        Some(0.0),
        "{m}"
    );

    ex.signal(libc::SIGHUP);
    ex.wait_for("cluster c up with the new password", WAIT, |m| {
        sample(m, "pgstorage_pg_up{cluster=\"c\"}") == Some(1.0)
    });
    let log = ex.wait_log("configuration reloaded", WAIT);
    assert!(log.contains("clusters_changed=\"[\\\"c\\\"]\""), "{log}");
    for secret in [WRONG, MON_PASSWORD] {
        assert!(!log.contains(secret), "a password in the log:\n{log}");
    }
    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(WAIT).success(), "{}", ex.log());
}

/// A `[[volume]]` plus a `[[cluster]]` whose password comes from
/// `password_file`; the cluster is never reached (no server listens at
/// that socket directory): only the file's reading matters here.
fn with_password_file(vol: &Path, password_file: &Path) -> String {
    volume("v", vol, "100ms")
        + &format!(
            "[[cluster]]\nname = \"main\"\ndsn = \"host=/nonexistent user=u dbname=d\"\n\
             password_file = \"{}\"\ndiscover_volumes = false\n",
            password_file.display()
        )
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// SIGHUP with a `password_file` that is /dev/zero, then a FIFO, then
/// with the configuration file itself replaced by a symlink to /dev/zero:
/// each reload is refused at once, counted and logged with the key, the
/// path and what the file is, memory stays small, and the next SIGHUP with
/// good files applies. The exporter used to read /dev/zero into memory
/// until it ran out, and to wait for ever on the FIFO, which left every
/// later reload queued behind it without a log line or a metric.
#[test]
fn device_and_fifo_files_are_refused_on_reload_and_the_next_good_one_applies() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("v");
    std::fs::create_dir(&vol).unwrap();
    let (pw, pw2, fifo) = (
        dir.path().join("pw"),
        dir.path().join("pw2"),
        dir.path().join("fifo"),
    );
    std::fs::write(&pw, "first-Pa55word\n").unwrap();
    std::fs::write(&pw2, "second-Pa55word\n").unwrap();
    let out = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, with_password_file(&vol, &pw)).unwrap();
    let mut ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    ex.wait_for("volume v probing", WAIT, |m| count(m, "v", "commit") >= 1.0);
    let pid = ex.child.id();

    let refused = |ex: &Exporter, cause: &str, n: f64, needle: &str| {
        let t0 = std::time::Instant::now();
        ex.signal(libc::SIGHUP);
        let m = ex.wait_for(&format!("refused reload {n} ({cause})"), WAIT, |m| {
            reload_errors(m, cause) == n
        });
        let took = t0.elapsed();
        assert_eq!(last_ok(&m), 0.0);
        let log = ex.wait_log(needle, WAIT);
        assert!(
            log.lines()
                .any(|l| l.contains("configuration reload refused")
                    && l.contains(needle)
                    && l.contains(&format!("cause={cause}"))),
            "{log}"
        );
        let rss = rss_kib(pid);
        assert!(rss < 200 << 10, "RSS {rss} KiB after: {needle}");
        println!("{needle}: refused and counted after {took:?}, RSS {rss} KiB");
    };

    std::fs::write(&cfg, with_password_file(&vol, Path::new("/dev/zero"))).unwrap();
    refused(
        &ex,
        "invalid",
        1.0,
        "cluster[0].password_file: password file /dev/zero: is a character device, not a \
         regular file",
    );
    std::fs::write(&cfg, with_password_file(&vol, &fifo)).unwrap();
    refused(
        &ex,
        "invalid",
        2.0,
        &format!(
            "cluster[0].password_file: password file {}: is a FIFO (named pipe), not a \
             regular file",
            fifo.display()
        ),
    );
    std::fs::remove_file(&cfg).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &cfg).unwrap();
    refused(
        &ex,
        "unreadable",
        1.0,
        &format!(
            "cannot read config file {}: is a character device, not a regular file",
            cfg.display()
        ),
    );

    // Good files again, with another password: applied, the cluster
    // reconnects with it, the volume probed throughout.
    std::fs::remove_file(&cfg).unwrap();
    std::fs::write(&cfg, with_password_file(&vol, &pw2)).unwrap();
    let before = count(&ex.metrics(), "v", "commit");
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("the good reload applied", WAIT, |m| {
        reload_counter(m, "success") == 1.0
    });
    assert_eq!(last_ok(&m), 1.0);
    assert_eq!(reload_counter(&m, "failure"), 3.0);
    let log = ex.wait_log("clusters_changed=", WAIT);
    assert!(log.contains("clusters_changed=\"[\\\"main\\\"]\""), "{log}");
    assert!(!log.contains("Pa55word"), "a password in the log:\n{log}");
    ex.wait_for("probing throughout", WAIT, |m| {
        count(m, "v", "commit") > before
    });
    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(WAIT).success(), "{}", ex.log());
    assert!(dir_entries(&vol).is_empty(), "{:?}", dir_entries(&vol));
}

/// Drops the page cache of a file's data (written back first), so that the
/// next read goes to the disk.
fn evict(p: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(p).unwrap();
    f.sync_all().unwrap();
    // SAFETY: posix_fadvise on a descriptor we hold; it only drops clean
    // cached pages of that file.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0);
}

/// A reload that cannot finish: the `password_file` lies on a disk that
/// stopped answering (a loop device whose reads the exporter's blkio group
/// may do at 1 byte/s, the file's pages evicted), so reading it waits in
/// the kernel, where nothing can interrupt it. The reload stops waiting
/// after `RELOAD_TIMEOUT` (10 s): refused, counted as `timeout`, logged;
/// and the next SIGHUP, with the password file moved to a healthy disk,
/// applies while the first read is still stuck. The exporter used to wait
/// for that read for ever, and every later SIGHUP with it.
#[test]
fn a_reload_stuck_on_a_disk_that_stopped_answering_times_out_and_the_next_applies() {
    if !loopdev::can_run("the stuck-reload test", true) {
        return;
    }
    let mut disk = loopdev::LoopVolume::new(64 << 20, false);
    let group = disk.group("pgse-stuck-reload", &[]);
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("v");
    std::fs::create_dir(&vol).unwrap();
    let (stuck_pw, good_pw) = (disk.mnt.join("pw"), dir.path().join("pw"));
    std::fs::write(&stuck_pw, "first-Pa55word\n").unwrap();
    std::fs::write(&good_pw, "second-Pa55word\n").unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, with_password_file(&vol, &stuck_pw)).unwrap();
    let mut ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    ex.wait_for("volume v probing", WAIT, |m| count(m, "v", "commit") >= 1.0);

    std::fs::write(group.join("cgroup.procs"), ex.child.id().to_string()).unwrap();
    let mut fault = disk.fault(&group);
    fault.throttle("read_bps_device", 1);
    evict(&stuck_pw);
    let t0 = std::time::Instant::now();
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("the reload timed out", Duration::from_secs(60), |m| {
        reload_errors(m, "timeout") == 1.0
    });
    let took = t0.elapsed();
    assert_eq!(last_ok(&m), 0.0);
    assert_eq!(reload_counter(&m, "failure"), 1.0);
    assert!(
        took >= Duration::from_secs(10),
        "timed out after {took:?}, before the 10 s limit: was the file read at all?"
    );
    let log = ex.wait_log("cause=timeout", WAIT);
    assert!(
        log.lines()
            .any(|l| l.contains("configuration reload refused")
                && l.contains("reading and checking the files did not finish within 10s")),
        "{log}"
    );

    // The stuck read goes on; the next reload does not wait for it.
    std::fs::write(&cfg, with_password_file(&vol, &good_pw)).unwrap();
    let t1 = std::time::Instant::now();
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("the next reload applied", WAIT, |m| {
        reload_counter(m, "success") == 1.0
    });
    assert_eq!(last_ok(&m), 1.0);
    println!(
        "stuck reload refused as timeout after {took:?}; the next one applied after {:?}",
        t1.elapsed()
    );
    let log = ex.wait_log("clusters_changed=", WAIT);
    assert!(log.contains("clusters_changed=\"[\\\"main\\\"]\""), "{log}");

    // Lift the throttle so the stuck read ends and the process can exit.
    fault.stop();
    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(WAIT).success(), "{}", ex.log());
    assert!(dir_entries(&vol).is_empty(), "{:?}", dir_entries(&vol));
}

/// A new password (a rotated `password_file`, the server's role changed
/// with it) reconnects the cluster and keeps the volume its discovery
/// added: the probe thread, its window and counters go on. Before, the
/// reload stopped the discovered volume and discovery created it again,
/// its window and counts starting over.
#[test]
fn sighup_with_a_new_password_keeps_the_discovered_volume() {
    let old_pw = "Old-Pa55word-reload";
    let new_pw = "New-Pa55word-reload";
    // The configured volume is on tmpfs, so the cluster's filesystem is
    // one discovery adds.
    let shm = tempfile::Builder::new()
        .prefix("pgse-reload-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let pw_file = secrets.path().join("mon.password");
    std::fs::write(&pw_file, format!("{old_pw}\n")).unwrap();
    let base = format!(
        "window = \"1m\"\n[[volume]]\nname = \"t\"\npath = \"{}\"\nprobes = [\"commit\"]\n\
         interval = \"100ms\"\nfree_space_reserve = \"0\"\n",
        shm.path().display()
    );
    let Some(mut stack) = Stack::builder()
        .pg_version(PgKind::V16)
        .password(old_pw)
        .role("mon", true)
        .config(&base)
        .args(&[
            "--probe.read-file-size",
            "4MiB",
            "--probe.free-space-reserve",
            "0",
        ])
        .ready("volume t probing", WAIT, |m| count(m, "t", "commit") >= 2.0)
        .start()
    else {
        return;
    };
    let cfg = stack.config_path();
    let (pg, ex) = (&stack.pg, &mut stack.ex);
    let cluster = |extra: &str| {
        format!(
            "{base}[[cluster]]\nname = \"c\"\ndsn = \"host=127.0.0.1 port={} user=mon \
             dbname=postgres sslmode=disable\"\npassword_file = \"{}\"\n\
             scrape_interval = \"500ms\"\n{extra}",
            pg.port(),
            pw_file.display()
        )
    };
    std::fs::write(&cfg, cluster("")).unwrap();
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for("cluster c up and c/data probed for a while", WAIT, |m| {
        sample(m, "pgstorage_pg_up{cluster=\"c\"}") == Some(1.0)
            && count(m, "c/data", "read") >= 5.0
    });
    let before = count(&m, "c/data", "read");

    // The password rotates: the server's first, then the file, then SIGHUP.
    pg.psql(&format!("ALTER ROLE mon PASSWORD '{new_pw}'"));
    std::fs::write(&pw_file, format!("{new_pw}\n")).unwrap();
    ex.signal(libc::SIGHUP);
    ex.wait_for("the reload applied and c up again", WAIT, |m| {
        reload_counter(m, "success") == 2.0
            && sample(m, "pgstorage_pg_up{cluster=\"c\"}") == Some(1.0)
    });
    // Discovery has run again once c/data counts past where it was, or
    // once it was configured a second time (its count then restarts).
    let configured = |log: &str| {
        log.lines()
            .filter(|l| l.contains("volume configured") && l.contains("c/data"))
            .count()
    };
    let m = ex.wait_for("c/data counting on, or created again", WAIT, |m| {
        count(m, "c/data", "read") > before || configured(&ex.log()) > 1
    });
    let after = count(&m, "c/data", "read");
    let log = ex.log();
    println!(
        "password reload: c/data read count {before} -> {after}, configured {} time(s)",
        configured(&log)
    );
    assert!(after > before, "c/data started over: {before} -> {after}");
    assert_eq!(
        configured(&log),
        1,
        "c/data was configured again by the reload:\n{log}"
    );
    assert!(
        log.contains("discovered volume kept across the reload"),
        "{log}"
    );
    assert!(log.contains("clusters_changed=\"[\\\"c\\\"]\""), "{log}");
    assert!(
        log.contains("discovered_volumes_kept=\"[\\\"c/data\\\"]\""),
        "{log}"
    );
    assert!(log.contains("discovered_volumes_removed=[]"), "{log}");
    assert_eq!(
        occurrences(&log, "volume stopped by the reload"),
        0,
        "{log}"
    );
    ex.wait_for("c/data still counting from where it was", WAIT, |m| {
        count(m, "c/data", "read") > after
    });
    // The new password is in use, the old one refused.
    assert!(pg.psql_tcp("mon", new_pw, "SELECT 1").is_ok());
    assert!(pg.psql_tcp("mon", old_pw, "SELECT 1").is_err());

    // A change that moves the volume (here: discovery turned off) still
    // stops it.
    std::fs::write(&cfg, cluster("discover_volumes = false\n")).unwrap();
    ex.signal(libc::SIGHUP);
    ex.wait_for("c/data gone", WAIT, |m| {
        reload_counter(m, "success") == 3.0 && !m.contains("volume=\"c/data\"")
    });
    let log = ex.log();
    assert!(
        log.contains("discovered_volumes_removed=\"[\\\"c/data\\\"]\""),
        "{log}"
    );
    assert!(!log.contains(old_pw) && !log.contains(new_pw), "{log}");
    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(WAIT).success(), "{}", ex.log());
}
