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
#[path = "common/loopdev.rs"]
mod loopdev;

use std::time::{Duration, Instant};

use common::*;

#[test]
fn hung_sync_is_visible_and_shutdown_still_removes_files() {
    if !loopdev::can_run("the hung-sync test", true) {
        return;
    }
    for engine in ["io_uring", "sync"] {
        let mut vol = loopdev::LoopVolume::new(128 << 20, false);
        let group = vol.group(&format!("pgse-hung-{engine}"), &[]);
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

        vol.throttle(&group, "write_bps_device", 1);
        std::fs::write(group.join("cgroup.procs"), ex.child.id().to_string()).unwrap();

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
        ex.wait_log(
            "abandoning probe thread stuck in IO",
            Duration::from_secs(10),
        );

        // The kernel holds the process until the IO completes; lift the cap
        // and it exits cleanly.
        vol.throttle(&group, "write_bps_device", 0);
        let status = ex.wait_exit(Duration::from_secs(30));
        assert!(status.success(), "{engine}: {status:?}\n{}", ex.log());
    }
}

/// One write IOPS: every sync crawls but does finish, so the process can
/// also exit promptly once told to.
#[test]
fn one_write_iops_keeps_metrics_fast_and_shutdown_bounded() {
    if !loopdev::can_run("the 1-IOPS test", true) {
        return;
    }
    let mut vol = loopdev::LoopVolume::new(128 << 20, false);
    let group = vol.group("pgse-1iops", &[]);
    let cfg = vol.mnt.join("..").join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "shutdown_timeout = \"2s\"\n[[volume]]\nname = \"slow\"\npath = \"{}\"\n\
             interval = \"100ms\"\ntimeout = \"5s\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n",
            vol.mnt.display()
        ),
    )
    .unwrap();
    let mut ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    ex.wait_for("probes", Duration::from_secs(30), |m| {
        count(m, "slow", "commit") >= 2.0
    });
    vol.throttle(&group, "write_iops_device", 1);
    std::fs::write(group.join("cgroup.procs"), ex.child.id().to_string()).unwrap();
    let t0 = Instant::now();
    let mut max_age = 0.0f64;
    let mut slowest = Duration::ZERO;
    while t0.elapsed() < Duration::from_secs(20) {
        let t = Instant::now();
        let m = ex.metrics();
        slowest = slowest.max(t.elapsed());
        max_age = max_age
            .max(sample(&m, "pgstorage_probe_in_flight_seconds{volume=\"slow\"}").unwrap_or(0.0));
        std::thread::sleep(Duration::from_millis(200));
    }
    let m = ex.metrics();
    let commits = count(&m, "slow", "commit");
    eprintln!(
        "1 write IOPS: slowest scrape {slowest:?}, largest in-flight age {max_age:.1} s, {commits} commits"
    );
    assert!(slowest < Duration::from_secs(1), "scrape took {slowest:?}");
    assert!(
        max_age > 0.5,
        "the throttle shows as in-flight time: {max_age}"
    );
    let stopped = Instant::now();
    ex.signal(libc::SIGTERM);
    let status = ex.wait_exit(Duration::from_secs(30));
    let took = stopped.elapsed();
    eprintln!("SIGTERM to exit: {took:?}");
    assert!(status.success(), "{status:?}\n{}", ex.log());
    assert!(took < Duration::from_secs(15), "exit took {took:?}");
    assert!(!vol.mnt.join("pg-storage-exporter-probe").exists());
}
