//! A sync that never returns: a real loop device whose writes are throttled
//! to 1 byte/s by the cgroup v1 blkio controller. The probe must show up as
//! in flight and timed out, scrapes must keep working, and SIGTERM must
//! remove the probe files within the shutdown timeout although the thread is
//! stuck in the kernel. Needs root, losetup, mkfs.ext4 and the v1 blkio
//! controller (all present on the CI machine); elsewhere it says why and
//! does nothing.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::loopdev;
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

/// fio's queue depth: how many writes other writers keep queued on the
/// slow disk. blk-throttle dispatches a group's writes in arrival order at
/// the capped rate, so each of the probe's IOs waits behind about this many
/// seconds of them at 1 IOPS. A commit probe costs two throttled IOs (the
/// data write at fdatasync and the cache flush), so a commit takes about
/// 2 × (depth + 1) s, and a SIGTERM sent at its 10th second waits for the
/// rest. Measured on the 2-core test VM (SIGTERM at an age of 10.0-10.5 s):
/// depth 4, commits of about 10 s, the age barely passes 10 s; depth 6,
/// exit 3.4 s after SIGTERM; depth 8, commits of 18-20 s and exit 7.4-7.9 s.
/// 8 leaves about as much room above the 10 s age (8 s) as below the 15 s
/// exit (7 s).
const OTHER_WRITERS_DEPTH: u32 = 8;

/// The issue's acceptance row: "During the 1-write-IOPS fault, /metrics
/// answers in under 1 s and the in-flight age passes 10 s; SIGTERM then
/// exits within 15 s and leaves no probe file." A disk that slow also has
/// other writers queued on it (PostgreSQL's own): fio keeps
/// OTHER_WRITERS_DEPTH 8 KiB direct random writes queued in the same
/// throttled group, so the probe's IO queues behind theirs, as it would
/// behind PostgreSQL's. Every sync crawls but does finish, so the process
/// can exit once its last IO completes; fio keeps writing until the
/// exporter has exited, then the throttle is lifted and fio killed.
#[test]
fn one_write_iops_keeps_metrics_fast_and_shutdown_bounded() {
    if !loopdev::can_run_with("the 1-IOPS test", true, &["fio"]) {
        return;
    }
    let mut vol = loopdev::LoopVolume::new(128 << 20, false);
    let group = vol.group("pgse-1iops", &[]);
    // The other writers' file, written in full and synced before the
    // fault: their direct writes then overwrite allocated blocks, like
    // PostgreSQL's writes into existing relation files, instead of
    // converting unwritten extents (journal work outside the group).
    let data = vol.mnt.join("other-writers.dat");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&data).unwrap();
        let chunk = vec![0x5au8; 1 << 20];
        for _ in 0..32 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
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
    let pid = ex.child.id();
    let (mut before_min, mut before_max) = (u32::MAX, 0);
    let (mut before_iou, mut during_iou) = (0, 0);
    for _ in 0..5 {
        let (n, iou) = own_threads(pid);
        before_min = before_min.min(n);
        before_max = before_max.max(n);
        before_iou = before_iou.max(iou);
        std::thread::sleep(Duration::from_millis(200));
    }

    // Declared after the exporter: dropped first, so a failing assertion
    // lifts the throttle before the exporter is killed.
    let mut fault = vol.fault(&group);
    fault.throttle("write_iops_device", 1);
    std::fs::write(group.join("cgroup.procs"), pid.to_string()).unwrap();
    let mut fio = Command::new("fio");
    fio.args([
        "--name=other-writers",
        // One process: by default fio forks its jobs into their own
        // sessions, which outlive a kill of the process we started.
        "--thread",
        "--ioengine=libaio",
        "--direct=1",
        "--rw=randwrite",
        "--bs=8k",
        "--size=32M",
        "--time_based",
        "--runtime=300",
    ])
    .arg(format!("--iodepth={OTHER_WRITERS_DEPTH}"))
    .arg(format!("--filename={}", data.display()))
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    fault.spawn("fio", fio);

    let commits_at_start = count(&ex.metrics(), "slow", "commit");
    let t0 = Instant::now();
    let mut max_age = 0.0f64;
    let mut prev_age = 0.0f64;
    // In-flight periods seen to end: the age only grows while one
    // operation is in flight, so a drop between two scrapes means at
    // least one ended.
    let mut periods_ended = 0u32;
    let mut slowest = Duration::ZERO;
    let (mut during_min, mut during_max) = (u32::MAX, 0);
    let mut m = String::new();
    // SIGTERM goes out once a commit that started during the fault is more
    // than 10 s in flight. The commit in flight when the fault began may
    // have had its write dispatched before the queue filled and take only
    // one queue wait (about 9-10 s): sent at its 10th second, SIGTERM can
    // arrive just after it completed and the next commit started, and the
    // exit then waits for all of that one, which is not the case the row
    // is about.
    while !(periods_ended >= 1 && prev_age > 10.0) && t0.elapsed() < Duration::from_secs(45) {
        let t = Instant::now();
        m = ex.metrics();
        slowest = slowest.max(t.elapsed());
        let age = sample(&m, "pgstorage_probe_in_flight_seconds{volume=\"slow\"}").unwrap();
        if age < prev_age {
            periods_ended += 1;
        }
        prev_age = age;
        max_age = max_age.max(age);
        let (n, iou) = own_threads(pid);
        during_min = during_min.min(n);
        during_max = during_max.max(n);
        during_iou = during_iou.max(iou);
        if let Err(e) = fault.running() {
            panic!("{e}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let commits = count(&m, "slow", "commit") - commits_at_start;
    let timeouts = sample(
        &m,
        "pgstorage_probe_errors_total{volume=\"slow\",op=\"commit\",error=\"timeout\"}",
    )
    .unwrap();
    eprintln!(
        "1 write IOPS behind {OTHER_WRITERS_DEPTH} queued writes, {:.1} s of fault: slowest scrape {slowest:?}, \
         largest in-flight age {max_age:.1} s, {commits} commits in {periods_ended} in-flight periods ended, \
         {timeouts} timeouts, threads {before_min}-{before_max} before and {during_min}-{during_max} during \
         (besides io_uring workers: at most {before_iou} before, {during_iou} during)",
        t0.elapsed().as_secs_f64()
    );
    // Right away, while the commit is in flight (the checks below do not
    // need the process).
    let stopped = Instant::now();
    ex.signal(libc::SIGTERM);
    let status = ex.wait_exit(Duration::from_secs(30));
    let took = stopped.elapsed();
    eprintln!("SIGTERM at in-flight age {prev_age:.1} s, exit after {took:?}");
    assert!(slowest < Duration::from_secs(1), "scrape took {slowest:?}");
    assert!(
        periods_ended >= 1 && prev_age > 10.0,
        "no commit started during the fault stayed in flight past 10 s (largest age {max_age:.1} s)\n{}",
        ex.log()
    );
    // No probe starts while one is in flight, and none is made up for
    // afterwards: at most one more commit per in-flight period ended (the
    // one in flight when the fault began may finish unthrottled).
    assert!(
        commits <= f64::from(periods_ended) + 1.0,
        "{commits} commits for {periods_ended} in-flight periods"
    );
    // Each stuck commit is counted (timeout 5 s) and said once, not once
    // per watchdog tick.
    assert!(timeouts >= 1.0, "the stuck commit counts a timeout");
    assert!(
        timeouts <= f64::from(periods_ended) + 1.0,
        "{timeouts} timeouts"
    );
    let said = ex
        .wait_log(
            "probe still in flight after its timeout",
            Duration::from_secs(5),
        )
        .lines()
        .filter(|l| l.contains("probe still in flight after its timeout"))
        .count();
    assert!(
        said as f64 <= timeouts,
        "{said} log lines for {timeouts} timeouts"
    );
    // Nothing piles up while the disk crawls: no thread per stuck probe.
    // The process's own threads, without the kernel's io_uring workers
    // (`iou-wrk-*`: io-wq starts them for blocked requests and ends them
    // after 5 s idle, whatever the exporter does; that no commit starts
    // while one is in flight is checked above). Slack of 2 for tokio's
    // blocking threads, which come and go (the limits collector's and the
    // audit's passes; each lingers 10 s idle).
    assert!(
        during_max <= before_max + 2,
        "threads grew from {before_max} to {during_max} during the fault"
    );

    assert!(status.success(), "{status:?}\n{}", ex.log());
    assert!(took < Duration::from_secs(15), "exit took {took:?}");
    assert!(
        !vol.mnt.join("pg-storage-exporter-probe").exists(),
        "left behind: {:?}",
        dir_entries(&vol.mnt.join("pg-storage-exporter-probe"))
    );
    // fio was still writing until here: the exit was measured on a disk
    // that stayed slow.
    if let Err(e) = fault.running() {
        panic!("{e}");
    }
    fault.stop();
}

/// Threads of process `pid`: those of the process itself, and the io_uring
/// workers (`iou-wrk-*`) the kernel runs in it. A thread that ends while
/// the list is read is not counted.
fn own_threads(pid: u32) -> (u32, u32) {
    let (mut own, mut iou) = (0, 0);
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(comm) = std::fs::read_to_string(task.unwrap().path().join("comm")) else {
            continue;
        };
        if comm.starts_with("iou-wrk") {
            iou += 1;
        } else {
            own += 1;
        }
    }
    (own, iou)
}
