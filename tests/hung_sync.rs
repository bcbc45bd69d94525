//! A sync that never returns: a real loop device whose writes are throttled
//! to 1 byte/s by the cgroup v1 blkio controller. The probe must show up as
//! in flight and timed out, scrapes must keep working, and SIGTERM must
//! remove the probe files within the shutdown timeout although the thread is
//! stuck in the kernel. Needs root, losetup, mkfs.ext4 and the v1 blkio
//! controller (all present on the CI machine); elsewhere it says why and
//! does nothing.

// Test code: a panic is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const BLKIO: &str = "/sys/fs/cgroup/blkio";

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A small ext4 filesystem on a loop device, plus a throttling cgroup.
struct SlowVolume {
    _tmp: tempfile::TempDir,
    mnt: PathBuf,
    loopdev: String,
    majmin: String,
    cgroup: PathBuf,
}

impl SlowVolume {
    fn new(tag: &str) -> SlowVolume {
        let tmp = tempfile::tempdir().unwrap();
        let img = tmp.path().join("img");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&img)
            .unwrap()
            .set_len(128 << 20)
            .unwrap();
        let loopdev = run("losetup", &["-f", "--show", img.to_str().unwrap()]);
        run("mkfs.ext4", &["-q", &loopdev]);
        run("mount", &[&loopdev, mnt.to_str().unwrap()]);
        let majmin = run("lsblk", &["-dno", "MAJ:MIN", &loopdev]).replace(' ', "");
        let cgroup = Path::new(BLKIO).join(format!("pgse-test-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&cgroup).unwrap();
        SlowVolume {
            _tmp: tmp,
            mnt,
            loopdev,
            majmin,
            cgroup,
        }
    }

    fn throttle_writes(&self, bytes_per_second: u64) {
        std::fs::write(
            self.cgroup.join("blkio.throttle.write_bps_device"),
            format!("{} {bytes_per_second}", self.majmin),
        )
        .unwrap();
    }

    fn enter(&self, pid: u32) {
        std::fs::write(self.cgroup.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for SlowVolume {
    fn drop(&mut self) {
        // Never panic in drop (it may run while unwinding).
        let _ = std::fs::write(
            self.cgroup.join("blkio.throttle.write_bps_device"),
            format!("{} 0", self.majmin),
        );
        for line in std::fs::read_to_string(self.cgroup.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
        {
            let _ = std::fs::write(Path::new(BLKIO).join("cgroup.procs"), line);
        }
        let _ = std::fs::remove_dir(&self.cgroup);
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("losetup").args(["-d", &self.loopdev]).status();
    }
}

fn can_run() -> Result<(), String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    if !Path::new(BLKIO)
        .join("blkio.throttle.write_bps_device")
        .exists()
    {
        return Err(format!("no cgroup v1 blkio throttling at {BLKIO}"));
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "lsblk"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            return Err(format!("{tool} not found"));
        }
    }
    Ok(())
}

#[test]
fn hung_sync_is_visible_and_shutdown_still_removes_files() {
    if let Err(why) = can_run() {
        eprintln!("SKIPPED hung_sync test: {why}");
        if std::env::var_os("CI").is_some() {
            panic!("CI must be able to run the hung-sync test: {why}");
        }
        return;
    }
    for engine in ["io_uring", "sync"] {
        let vol = SlowVolume::new(engine);
        let cfg = vol.mnt.join("..").join("c.toml");
        std::fs::write(
            &cfg,
            format!(
                "shutdown_timeout = \"1s\"\n[[volume]]\nname = \"slow\"\npath = \"{}\"\n\
                 interval = \"100ms\"\ntimeout = \"1s\"\nread_file_size = \"4MiB\"\n\
                 free_space_reserve = \"0\"\nengine = \"{engine}\"\n",
                vol.mnt.display()
            ),
        )
        .unwrap();
        let mut ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
        ex.wait_for("probes", Duration::from_secs(30), |m| {
            count(m, "slow", "commit") >= 2.0
        });
        let probe_dir = vol.mnt.join("pg-storage-exporter-probe");
        assert!(probe_dir.join("wal.probe").exists());

        vol.throttle_writes(1);
        vol.enter(ex.child.id());

        // The stuck commit shows as a growing in-flight age and one timeout.
        let m = ex.wait_for("a timed-out commit", Duration::from_secs(20), |m| {
            sample(
                m,
                "pgstorage_probe_errors_total{volume=\"slow\",op=\"commit\",error=\"timeout\"}",
            ) == Some(1.0)
        });
        let age = sample(&m, "pgstorage_probe_in_flight_seconds{volume=\"slow\"}").unwrap();
        assert!(age > 1.0, "in flight {age}");
        // Scrapes never wait on the disk.
        let t = Instant::now();
        let again = ex.metrics();
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "scrape took {:?}",
            t.elapsed()
        );
        assert!(
            sample(&again, "pgstorage_probe_in_flight_seconds{volume=\"slow\"}").unwrap() >= age
        );
        assert_eq!(
            count(&again, "slow", "commit"),
            count(&m, "slow", "commit"),
            "no second probe while one is in flight"
        );

        ex.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while probe_dir.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            !probe_dir.exists(),
            "{engine}: probe files not removed: {:?}\n{}",
            dir_entries(&probe_dir),
            ex.log()
        );
        assert!(
            ex.log().contains("abandoning probe thread stuck in IO"),
            "{}",
            ex.log()
        );

        // The kernel holds the process until the IO completes; lift the cap
        // and it exits cleanly.
        vol.throttle_writes(0);
        let status = ex.wait_exit(Duration::from_secs(30));
        assert!(status.success(), "{engine}: {status:?}\n{}", ex.log());
    }
}
