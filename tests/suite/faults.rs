//! Fault matrix, on real filesystems (ext4 on loop devices): each fault
//! gives an error metric with a cause label and a log line, the exporter
//! keeps serving, and it recovers when the fault clears, leaving nothing
//! behind.

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::loopdev;
use common::*;

fn setup_errors(m: &str, error: &str) -> f64 {
    sample(
        m,
        &format!("pgstorage_probe_errors_total{{volume=\"t\",op=\"setup\",error=\"{error}\"}}"),
    )
    .unwrap_or(0.0)
}

fn config(dir: &Path, vol: &Path) -> std::path::PathBuf {
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[volume]]\nname = \"t\"\npath = \"{}\"\ninterval = \"100ms\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"1MiB\"\n",
            vol.display()
        ),
    )
    .unwrap();
    cfg
}

fn stop_clean(ex: Exporter, vol: &Path) {
    stop(ex);
    assert!(
        !vol.join("pg-storage-exporter-probe").exists(),
        "left behind: {:?}",
        dir_entries(&vol.join("pg-storage-exporter-probe"))
    );
}

/// SIGTERM, a clean exit; returns the log.
fn stop(mut ex: Exporter) -> String {
    ex.signal(libc::SIGTERM);
    assert!(
        ex.wait_exit(Duration::from_secs(15)).success(),
        "{}",
        ex.log()
    );
    ex.log()
}

#[test]
fn full_volume_at_start_then_space_freed() {
    if !loopdev::can_run("the full-volume fault test", false) {
        return;
    }
    let lv = loopdev::LoopVolume::new(48 << 20, false);
    // Leave ~8 MiB: less than the 16 MiB WAL probe file plus the reserve.
    let filler = lv.mnt.join("filler");
    let free = {
        let out = Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(&lv.mnt)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    std::fs::File::create(&filler).unwrap().set_len(0).unwrap();
    let ok = Command::new("fallocate")
        .args(["-l", &(free - (8 << 20)).to_string()])
        .arg(&filler)
        .status()
        .unwrap();
    assert!(ok.success());
    let tmp = tempfile::tempdir().unwrap();
    let ex = Exporter::start(&[
        "--config.file",
        config(tmp.path(), &lv.mnt).to_str().unwrap(),
    ]);
    let m = ex.wait_for("a free-space setup error", Duration::from_secs(20), |m| {
        setup_errors(m, "free_space_reserve") >= 1.0
    });
    assert_eq!(count(&m, "t", "commit"), 0.0);
    ex.wait_log(
        "must stay free (free_space_reserve)",
        Duration::from_secs(10),
    );
    assert!(
        !lv.mnt.join("pg-storage-exporter-probe/wal.probe").exists(),
        "nothing created"
    );
    std::fs::remove_file(&filler).unwrap();
    // The retry (5 s backoff) succeeds once there is room.
    ex.wait_for(
        "probes after space was freed",
        Duration::from_secs(30),
        |m| count(m, "t", "commit") >= 2.0 && count(m, "t", "read") >= 2.0,
    );
    // Filling the disk now does not matter: probe files never grow.
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", filler.display()))
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    let avail = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(&lv.mnt)
        .output()
        .unwrap();
    let avail: u64 = String::from_utf8_lossy(&avail.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(avail < (1 << 20), "the volume is full: {avail} bytes left");
    let before = count(&ex.metrics(), "t", "commit");
    std::thread::sleep(Duration::from_millis(800));
    let m = ex.metrics();
    assert!(
        count(&m, "t", "commit") > before,
        "probes go on when the volume is full"
    );
    assert!(
        !m.contains("error=\"ENOSPC\"} 1"),
        "no ENOSPC from overwriting preallocated blocks"
    );
    stop_clean(ex, &lv.mnt);
}

#[test]
fn read_only_filesystem_then_remounted_read_write() {
    if !loopdev::can_run("the read-only fault test", false) {
        return;
    }
    let lv = loopdev::LoopVolume::new(64 << 20, false);
    sh("mount", &["-o", "remount,ro", lv.mnt.to_str().unwrap()]);
    let tmp = tempfile::tempdir().unwrap();
    let ex = Exporter::start(&[
        "--config.file",
        config(tmp.path(), &lv.mnt).to_str().unwrap(),
    ]);
    ex.wait_for("an EROFS setup error", Duration::from_secs(20), |m| {
        setup_errors(m, "EROFS") >= 1.0
    });
    ex.wait_log("Read-only file system", Duration::from_secs(10));
    assert_eq!(ex.get("/metrics").0, 200);
    sh("mount", &["-o", "remount,rw", lv.mnt.to_str().unwrap()]);
    ex.wait_for("probes after remount", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 2.0
    });
    stop_clean(ex, &lv.mnt);
}

#[test]
fn permission_denied_then_granted() {
    if !loopdev::can_run("the permission fault test", false) {
        return;
    }
    // The exporter runs as the postgres user on a directory root owns.
    let pw = Command::new("id")
        .args(["-u", "postgres"])
        .output()
        .unwrap();
    let uid: u32 = String::from_utf8_lossy(&pw.stdout).trim().parse().unwrap();
    let gid: u32 = String::from_utf8_lossy(
        &Command::new("id")
            .args(["-g", "postgres"])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .parse()
    .unwrap();
    let lv = loopdev::LoopVolume::new(64 << 20, true);
    let vol = lv.mnt.join("vol");
    std::fs::create_dir(&vol).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    assert!(
        Command::new("chmod")
            .args(["755", tmp.path().to_str().unwrap()])
            .status()
            .unwrap()
            .success()
    );
    let cfg = config(tmp.path(), &vol);
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--web.listen-address",
        "127.0.0.1:0",
        "--config.file",
        cfg.to_str().unwrap(),
    ]);
    cmd.uid(uid).gid(gid);
    let ex = Exporter::spawn(cmd);
    ex.wait_for("an EACCES setup error", Duration::from_secs(20), |m| {
        setup_errors(m, "EACCES") >= 1.0
    });
    ex.wait_log("Permission denied", Duration::from_secs(10));
    assert!(
        Command::new("chown")
            .args(["postgres:postgres", vol.to_str().unwrap()])
            .status()
            .unwrap()
            .success()
    );
    ex.wait_for("probes once permitted", Duration::from_secs(30), |m| {
        count(m, "t", "commit") >= 2.0
    });
    stop_clean(ex, &vol);
}

fn file_errors(m: &str, op: &str, error: &str) -> f64 {
    sample(
        m,
        &format!("pgstorage_probe_errors_total{{volume=\"t\",op=\"{op}\",error=\"{error}\"}}"),
    )
    .unwrap_or(0.0)
}

/// Log lines containing `needle`.
fn log_lines(ex: &Exporter, needle: &str) -> usize {
    ex.log().lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn probe_directory_deleted_mid_run() {
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    let ex = Exporter::start(&["--config.file", config(tmp.path(), &vol).to_str().unwrap()]);
    ex.wait_for("probes", Duration::from_secs(20), |m| {
        count(m, "t", "commit") >= 2.0
    });
    std::fs::remove_dir_all(vol.join("pg-storage-exporter-probe")).unwrap();
    // The probe files stay open: probing goes on (their blocks are freed at
    // exit), and nothing is recreated behind the operator's back.
    let before = count(&ex.metrics(), "t", "commit");
    std::thread::sleep(Duration::from_millis(800));
    let m = ex.metrics();
    assert!(count(&m, "t", "commit") > before);
    assert!(!vol.join("pg-storage-exporter-probe").exists());
    // Noticed by the periodic name check (every 5 s): counted once per
    // held file and said once, not on every check after.
    ex.wait_for("the removal counted", Duration::from_secs(15), |m| {
        file_errors(m, "commit", "removed") == 1.0 && file_errors(m, "read", "removed") == 1.0
    });
    ex.wait_log(
        "probe directory was removed or moved",
        Duration::from_secs(10),
    );
    std::thread::sleep(Duration::from_secs(6));
    let m = ex.metrics();
    assert_eq!(file_errors(&m, "commit", "removed"), 1.0);
    assert_eq!(log_lines(&ex, "probe directory was removed or moved"), 1);
    assert!(count(&m, "t", "commit") > before + 10.0, "still probing");
    assert!(!vol.join("pg-storage-exporter-probe").exists());
    stop_clean(ex, &vol);
    assert_eq!(dir_entries(&vol), Vec::<String>::new());
}

/// Row: a symlink planted at a probe file's name before the exporter
/// starts. Setup refuses it (ELOOP) without following or removing it, and
/// goes ahead once an operator removes it.
#[test]
fn symlink_planted_before_start_is_refused_never_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("vol");
    let probe = vol.join("pg-storage-exporter-probe");
    std::fs::create_dir_all(&probe).unwrap();
    std::fs::set_permissions(&probe, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let victim = Victim::precious(tmp.path().join("victim"));
    std::os::unix::fs::symlink(&victim.path, probe.join("wal.probe")).unwrap();
    let ex = Exporter::start(&["--config.file", config(tmp.path(), &vol).to_str().unwrap()]);
    let m = ex.wait_for("an ELOOP setup error", Duration::from_secs(20), |m| {
        setup_errors(m, "ELOOP") >= 1.0
    });
    assert_eq!(count(&m, "t", "commit"), 0.0);
    assert_eq!(count(&m, "t", "read"), 0.0);
    ex.wait_log("wal.probe is a symlink to", Duration::from_secs(10));
    assert!(
        probe.join("wal.probe").is_symlink(),
        "left for the operator to see"
    );
    victim.assert_untouched("while refused");

    std::fs::remove_file(probe.join("wal.probe")).unwrap();
    // The retry (5 s backoff) succeeds once the link is gone.
    ex.wait_for(
        "probes after the link was removed",
        Duration::from_secs(30),
        |m| count(m, "t", "commit") >= 2.0 && count(m, "t", "read") >= 2.0,
    );
    assert!(
        std::fs::symlink_metadata(probe.join("wal.probe"))
            .unwrap()
            .is_file()
    );
    victim.assert_untouched("while probing");
    stop(ex);
    // The directory the test made (under the exporter's default name) is
    // not the exporter's to remove: emptied of its own files, it stays.
    assert_eq!(dir_entries(&probe), Vec::<String>::new());
    assert_eq!(dir_entries(&vol), ["pg-storage-exporter-probe"]);
    assert_eq!(dir_entries(tmp.path()), ["c.toml", "victim", "vol"]);
    victim.assert_untouched("after SIGTERM");
}

/// Row: mid-run, a probe file renamed over by a symlink to a file
/// elsewhere. The held descriptor would keep writing to the unlisted old
/// inode without any error, so only the periodic name check notices: one
/// `replaced` error and one log line, the files are closed and set up
/// again, which refuses the link (ELOOP) until it is removed, then probing
/// resumes. A link planted right before SIGTERM is unlinked, not followed.
#[test]
fn probe_file_replaced_by_symlink_mid_run() {
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    let probe = vol.join("pg-storage-exporter-probe");
    let victim = Victim::precious(tmp.path().join("victim"));
    let ex = Exporter::start(&["--config.file", config(tmp.path(), &vol).to_str().unwrap()]);
    ex.wait_for("probes", Duration::from_secs(20), |m| {
        count(m, "t", "commit") >= 2.0
    });
    let plant = |name: &str| {
        let tmp_link = probe.join("planted");
        std::os::unix::fs::symlink(&victim.path, &tmp_link).unwrap();
        // rename(2) replaces the name atomically: there is no moment without
        // a wal.probe for an open by name to fail on.
        std::fs::rename(&tmp_link, probe.join(name)).unwrap();
    };
    plant("wal.probe");
    let m = ex.wait_for("the replacement counted", Duration::from_secs(15), |m| {
        file_errors(m, "commit", "replaced") >= 1.0
    });
    assert_eq!(file_errors(&m, "commit", "replaced"), 1.0);
    assert_eq!(
        file_errors(&m, "read", "replaced"),
        0.0,
        "read.probe was not touched"
    );
    ex.wait_log("probe file removed or replaced", Duration::from_secs(10));
    ex.wait_for(
        "the new setup refusing the link",
        Duration::from_secs(10),
        |m| setup_errors(m, "ELOOP") >= 1.0,
    );
    // No probe while the link is there: nothing writes through it, and
    // nothing keeps probing the unlisted old file.
    let stalled = count(&ex.metrics(), "t", "commit");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(count(&ex.metrics(), "t", "commit"), stalled);
    assert!(probe.join("wal.probe").is_symlink());
    victim.assert_untouched("while refused");

    std::fs::remove_file(probe.join("wal.probe")).unwrap();
    ex.wait_log("probe files set up again", Duration::from_secs(20));
    let m = ex.wait_for(
        "probes after the link was removed",
        Duration::from_secs(10),
        |m| count(m, "t", "commit") >= stalled + 2.0,
    );
    assert_eq!(file_errors(&m, "commit", "replaced"), 1.0, "counted once");
    assert_eq!(
        log_lines(&ex, "probe file removed or replaced"),
        1,
        "said once"
    );
    assert!(
        std::fs::symlink_metadata(probe.join("wal.probe"))
            .unwrap()
            .is_file()
    );
    victim.assert_untouched("while probing again");

    // A link renamed over a probe file right before SIGTERM is not the
    // exporter's: left in place (said in the log), its target untouched,
    // and the directory stays with it.
    plant("read.probe");
    let log = stop(ex);
    assert!(
        log.contains("left in place: files this exporter did not create")
            && log.contains("files=read.probe"),
        "{log}"
    );
    assert_eq!(dir_entries(&probe), ["read.probe"]);
    assert!(probe.join("read.probe").is_symlink());
    assert_eq!(dir_entries(tmp.path()), ["c.toml", "victim", "vol"]);
    victim.assert_untouched("after SIGTERM");
}

/// Setup that creates the WAL probe file and then fails on the read probe
/// file (here: the free-space reserve) must not trip over its own WAL file
/// on the retry (`O_EXCL` creation gave EEXIST on every retry).
#[test]
fn setup_failing_after_the_first_file_recovers() {
    if !loopdev::can_run("the partial-setup fault test", false) {
        return;
    }
    let lv = loopdev::LoopVolume::new(48 << 20, false);
    let avail = || -> u64 {
        let out = Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(&lv.mnt)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // Room for the 16 MiB WAL file and the 1 MiB reserve, not for the
    // 4 MiB read file after it.
    let filler = lv.mnt.join("filler");
    std::fs::File::create(&filler).unwrap();
    let ok = Command::new("fallocate")
        .args(["-l", &(avail() - (19 << 20)).to_string()])
        .arg(&filler)
        .status()
        .unwrap();
    assert!(ok.success());
    let tmp = tempfile::tempdir().unwrap();
    let ex = Exporter::start(&[
        "--config.file",
        config(tmp.path(), &lv.mnt).to_str().unwrap(),
    ]);
    ex.wait_for("a free-space setup error", Duration::from_secs(20), |m| {
        setup_errors(m, "free_space_reserve") >= 1.0
    });
    ex.wait_log("read.probe", Duration::from_secs(10));
    std::fs::remove_file(&filler).unwrap();
    let m = ex.wait_for(
        "probes after space was freed",
        Duration::from_secs(30),
        |m| count(m, "t", "commit") >= 2.0 && count(m, "t", "read") >= 2.0,
    );
    assert_eq!(setup_errors(&m, "EEXIST"), 0.0);
    stop_clean(ex, &lv.mnt);
}

/// What ext4 does after an error with `errors=remount-ro` (the Debian and
/// RHEL default for the root filesystem): the filesystem turns read-only
/// under the running exporter, with its probe files open. Commit probes
/// fail with EROFS (counted, logged once), read probes go on, scrapes are
/// unaffected; the probe files cannot be removed at exit (said so), and once
/// the filesystem is repaired the next start removes them.
#[test]
fn filesystem_turned_read_only_by_an_error_mid_run() {
    if !loopdev::can_run("the emergency read-only test", false) {
        return;
    }
    let lv = loopdev::LoopVolume::new(64 << 20, false);
    let mnt = lv.mnt.to_str().unwrap().to_string();
    sh("mount", &["-o", "remount,errors=remount-ro", &mnt]);
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), &lv.mnt);
    let mut ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    ex.wait_for("probes", Duration::from_secs(20), |m| {
        count(m, "t", "commit") >= 2.0 && count(m, "t", "read") >= 2.0
    });
    // ext4's own test hook: records an error exactly as a failed metadata
    // read would, and errors=remount-ro turns the filesystem read-only.
    std::fs::write(format!("/sys/fs/ext4/{}/trigger_fs_error", lv.name()), "1").unwrap();
    let erofs = |m: &str| -> f64 {
        samples_with(
            m,
            "pgstorage_probe_errors_total",
            &["volume=\"t\"", "error=\"EROFS\""],
        )
        .iter()
        .map(|(_, v)| v)
        .sum()
    };
    let m = ex.wait_for("EROFS errors", Duration::from_secs(20), |m| erofs(m) >= 5.0);
    let reads = count(&m, "t", "read");
    let m = ex.wait_for("read probes going on", Duration::from_secs(20), |m| {
        count(m, "t", "read") > reads + 5.0
    });
    assert_eq!(ex.get("/metrics").0, 200);
    let log = ex.log();
    let lines = log
        .lines()
        .filter(|l| l.contains("probe failed") && l.contains("Read-only file system"))
        .count();
    eprintln!(
        "{} EROFS failures, {lines} log line(s): {:?}",
        erofs(&m),
        samples_with(&m, "pgstorage_probe_errors_total", &["error=\"EROFS\""])
    );
    assert_eq!(lines, 1, "one line per incident, not per probe:\n{log}");

    ex.signal(libc::SIGTERM);
    assert!(
        ex.wait_exit(Duration::from_secs(15)).success(),
        "{}",
        ex.log()
    );
    let log = ex.log();
    assert!(
        log.contains("could not remove probe file"),
        "the files left behind are named: {log}"
    );
    assert!(lv.mnt.join("pg-storage-exporter-probe").exists());

    // Repair as an operator would: unmount, fsck, mount. The next start
    // removes what the last one could not.
    // A test running meanwhile in its own mount namespace (`unshare -m`)
    // holds a copy of this mount until it ends, and e2fsck refuses a
    // device still in use (exit 8): wait for that copy to go.
    sh("umount", &[&mnt]);
    let t0 = std::time::Instant::now();
    loop {
        let fsck = Command::new("e2fsck")
            .args(["-fy", &lv.dev])
            .output()
            .unwrap();
        let code = fsck.status.code().unwrap_or(8);
        let err = format!(
            "{}{}",
            String::from_utf8_lossy(&fsck.stdout),
            String::from_utf8_lossy(&fsck.stderr)
        );
        if code < 4 {
            break;
        }
        assert!(
            code == 8 && err.contains("in use") && t0.elapsed() < Duration::from_secs(120),
            "e2fsck exited {code}: {err}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    sh("mount", &[&lv.dev, &mnt]);
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    ex.wait_for("probes after the repair", Duration::from_secs(20), |m| {
        count(m, "t", "commit") >= 2.0 && erofs(m) == 0.0
    });
    stop_clean(ex, &lv.mnt);
    assert_eq!(dir_entries(&lv.mnt), vec!["lost+found".to_string()]);
}

/// The names the exporter uses in a probe directory.
const PROBE_DIR_NAMES: [&str; 4] = ["lock", "wal.probe", "read.probe", "sweep.probe"];

/// Row: a configured probe directory that already holds files with the
/// exporter's names, not created by it (an administrator's directory with
/// a `lock` of its own, files of another program). Volume `a`'s directory
/// holds all four names, volume `b`'s the three probe names without a
/// lock. Nothing of them is opened for writing, truncated or removed: each
/// setup attempt (the first and the retry 5 s later) is refused and counted,
/// the log names the files, and after SIGTERM nothing but them is left.
#[test]
fn foreign_files_in_a_configured_probe_dir_are_left_untouched() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let vol = tmp.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    let mut planted = Vec::new();
    for (d, names) in [("a", &PROBE_DIR_NAMES[..]), ("b", &PROBE_DIR_NAMES[1..])] {
        let dir = vol.join(d);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        for (i, n) in names.iter().enumerate() {
            planted.push(Victim::random(dir.join(n), 1000 + 4096 * i));
        }
    }
    let cfg = tmp.path().join("c.toml");
    let volume = |name: &str| {
        format!(
            "[[volume]]\nname = \"{name}\"\npath = \"{}\"\nprobe_dir = \"{}\"\ninterval = \"100ms\"\n\
             read_file_size = \"4MiB\"\nfree_space_reserve = \"1MiB\"\n",
            vol.display(),
            vol.join(name).display()
        )
    };
    std::fs::write(&cfg, volume("a") + &volume("b")).unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    let foreign = |m: &str, v: &str| {
        sample(
            m,
            &format!(
                "pgstorage_probe_errors_total{{volume=\"{v}\",op=\"setup\",error=\"foreign_file\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    // Two attempts each (the retry comes 5 s after the first), or any
    // probe at all: probing would mean the files were taken over.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let m = loop {
        let m = ex.metrics();
        let probed = count(&m, "a", "commit") + count(&m, "b", "commit") > 0.0;
        if probed
            || (foreign(&m, "a") >= 2.0 && foreign(&m, "b") >= 2.0)
            || std::time::Instant::now() > deadline
        {
            break m;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = stop(ex);
    for p in &planted {
        p.assert_untouched(&format!(
            "after two setup attempts and SIGTERM; log:\n{log}"
        ));
    }
    assert_eq!(dir_entries(&vol.join("a")), sorted(&PROBE_DIR_NAMES));
    assert_eq!(dir_entries(&vol.join("b")), sorted(&PROBE_DIR_NAMES[1..]));
    assert_eq!(dir_entries(&vol), ["a", "b"]);
    assert_eq!(count(&m, "a", "commit") + count(&m, "b", "commit"), 0.0);
    assert!(foreign(&m, "a") >= 2.0 && foreign(&m, "b") >= 2.0, "{m}");
    let line = |v: &str| {
        log.lines()
            .find(|l| {
                l.contains("cannot set up probe files") && l.contains(&format!("volume={v} "))
            })
            .unwrap_or_else(|| panic!("no setup error for {v}:\n{log}"))
            .to_string()
    };
    eprintln!(
        "foreign_file setup errors: a {}, b {}",
        foreign(&m, "a"),
        foreign(&m, "b")
    );
    let a = line("a");
    for n in PROBE_DIR_NAMES {
        assert!(a.contains(n), "{n} named: {a}");
    }
    assert!(a.contains("did not create"), "{a}");
    let b = line("b");
    for n in &PROBE_DIR_NAMES[1..] {
        assert!(b.contains(n), "{n} named: {b}");
    }
    eprintln!("{a}\n{b}");
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

/// Row: the volume lazily unmounted (`umount -l`) under a running
/// exporter. Its path now names the empty mount point, but the exporter's
/// descriptors still reach the detached filesystem: at exit it removes its
/// files and its own directory there, so the next mount of the volume
/// shows nothing of it.
#[test]
fn lazily_unmounted_volume_keeps_no_probe_directory() {
    if !loopdev::can_run("the lazy-unmount test", false) {
        return;
    }
    let lv = loopdev::LoopVolume::new(64 << 20, false);
    let mnt = lv.mnt.to_str().unwrap().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), &lv.mnt);
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    ex.wait_for("probes", Duration::from_secs(20), |m| {
        count(m, "t", "commit") >= 2.0 && count(m, "t", "read") >= 2.0
    });
    sh("umount", &["-l", &mnt]);
    assert_eq!(dir_entries(&lv.mnt), Vec::<String>::new(), "detached");
    let log = stop(ex);
    sh("mount", &[&lv.dev, &mnt]);
    assert_eq!(
        dir_entries(&lv.mnt),
        ["lost+found"],
        "left on the volume; log:\n{log}"
    );
    assert!(!log.contains("could not remove"), "{log}");
}
