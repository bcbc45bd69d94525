//! Fault matrix, on real filesystems (ext4 on loop devices): each fault
//! gives an error metric with a cause label and a log line, the exporter
//! keeps serving, and it recovers when the fault clears, leaving nothing
//! behind.

// Test code: a panic is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
#[path = "common/loopdev.rs"]
mod loopdev;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

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

fn stop_clean(mut ex: Exporter, vol: &Path) {
    ex.signal(libc::SIGTERM);
    assert!(
        ex.wait_exit(Duration::from_secs(15)).success(),
        "{}",
        ex.log()
    );
    assert!(
        !vol.join("pg-storage-exporter-probe").exists(),
        "left behind: {:?}",
        dir_entries(&vol.join("pg-storage-exporter-probe"))
    );
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
    assert!(
        Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&lv.mnt)
            .status()
            .unwrap()
            .success()
    );
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
    assert!(
        Command::new("mount")
            .args(["-o", "remount,rw"])
            .arg(&lv.mnt)
            .status()
            .unwrap()
            .success()
    );
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
    stop_clean(ex, &vol);
    assert_eq!(dir_entries(&vol), Vec::<String>::new());
}
