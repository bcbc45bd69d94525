//! The queue-depth sweep finds write-IOPS and bandwidth caps nobody told the
//! exporter about: the exporter runs in a cgroup v1 blkio group with
//! `read_iops_device` 2,000, `write_iops_device` 300, `read_bps_device`
//! 20 MiB/s and `write_bps_device` 10 MiB/s on an ext4 loop device, with
//! cgroup reading
//! turned off (`cgroup_root` an empty directory), and must report each cap
//! within 20 % as `source="detected"`; on the same device without the
//! throttles it must claim no plateau at all. Needs root, loop devices and
//! v1 blkio (skips with the reason otherwise, fails under CI). About 60 s.
//!
//! A write-IOPS cap found that way is the `cap` commit ceiling: the
//! exporter and a committing client in one throttled group, cgroup reading
//! off, and the ceiling from the sweep's plateau over the default two
//! device writes per commit, checked against fio's back-to-back commits in
//! the same group. About 60 s more; needs fio too.

// Test code: a panic is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use common::loopdev;
use common::*;

const MIB: u64 = 1 << 20;

/// One sweep at a time: two at once on a 2-core machine would measure each
/// other's CPU use as much as the throttles.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Starts the exporter on `mnt` with one sweeping volume `t` and cgroup
/// reading off, inside `group` when given; returns the scrape once the
/// first sweep has finished and the limits collector has the utilization
/// of each of `resources` (its detected cap; none given: a few limits
/// passes later, for rows that should not appear).
fn swept(mnt: &Path, group: Option<&Path>, sweep_duration: &str, resources: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("no-cgroups");
    std::fs::create_dir(&empty).unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "limits_interval = \"1s\"\ncgroup_root = \"{}\"\n\
             [[volume]]\nname = \"t\"\npath = \"{}\"\nprobes = [\"read\"]\nread_file_size = \"16MiB\"\n\
             free_space_reserve = \"0\"\nsweep_every = \"1h\"\nsweep_duration = \"{sweep_duration}\"\n",
            empty.display(),
            mnt.display()
        ),
    )
    .unwrap();
    let procs = group.map(|g| g.join("cgroup.procs"));
    let ex = Exporter::start_with(
        &[
            "--web.listen-address",
            "127.0.0.1:0",
            "--config.file",
            cfg.to_str().unwrap(),
        ],
        &[],
        procs.as_deref(),
    );
    // The limits collector turns the sweep into pgstorage_io_limit rows
    // within a limits_interval of it; wait for that pass too.
    let finished = ex.wait_for(
        "the first queue-depth sweep",
        Duration::from_secs(90),
        |m| m.contains("pgstorage_sweep_last_timestamp_seconds{volume=\"t\"}"),
    );
    assert!(
        !finished.contains("source=\"cgroup\""),
        "cgroup reading was off"
    );
    let m = if resources.is_empty() {
        // Nothing to wait for: rows that should not exist would come
        // within a limits_interval (1 s) of the sweep.
        std::thread::sleep(Duration::from_millis(2500));
        ex.metrics()
    } else {
        // The ratio exists once the limits collector has two readings
        // around the sweep's row: usually 2 s, more on a busy machine.
        ex.wait_for(
            "the detected caps' utilization",
            Duration::from_secs(15),
            |m| {
                resources.iter().all(|r| {
                    m.contains(&format!(
                        "pgstorage_io_limit_utilization_ratio{{volume=\"t\",source=\"detected\",resource=\"{r}\"}}"
                    ))
                })
            },
        )
    };
    // The sweep file lives only while a sweep runs.
    let probe_dir = mnt.join("pg-storage-exporter-probe");
    assert!(probe_dir.join("read.probe").exists());
    assert!(!probe_dir.join("sweep.probe").exists());
    for family in [
        "pgstorage_sweep_read_iops",
        "pgstorage_sweep_write_iops",
        "pgstorage_sweep_read_bytes_per_second",
        "pgstorage_sweep_write_bytes_per_second",
    ] {
        eprintln!(
            "{family}: {:?}",
            samples_with(&m, family, &["volume=\"t\""])
        );
    }
    assert_eq!(
        sample(
            &m,
            "pgstorage_probe_errors_total{volume=\"t\",op=\"sweep\",error=\"sweep_failed\"}"
        )
        .unwrap_or(0.0),
        0.0,
        "{m}"
    );
    m
}

fn detected(m: &str, resource: &str) -> Option<f64> {
    sample(
        m,
        &format!("pgstorage_io_limit{{volume=\"t\",source=\"detected\",resource=\"{resource}\"}}"),
    )
}

#[test]
fn sweep_detects_write_iops_and_bandwidth_throttles_and_nothing_without_them() {
    if !loopdev::can_run("the sweep cap test", true) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut fx = loopdev::LoopVolume::new(256 << 20, false);
    let group = fx.group(
        "pgse-sweep-caps",
        &[
            ("read_iops_device", 2000),
            ("write_iops_device", 300),
            ("read_bps_device", 20 * MIB),
            ("write_bps_device", 10 * MIB),
        ],
    );
    // 2 s per depth: a v1 throttle releases IO in 100 ms slices.
    let caps = [
        ("write_iops", 300.0),
        ("read_bytes_per_second", (20 * MIB) as f64),
        ("write_bytes_per_second", (10 * MIB) as f64),
        // 20 MiB/s would allow 2,560 reads of 8 KiB; the IOPS throttle
        // is the tighter one. (256 KiB reads at 2,000/s would be 500
        // MiB/s: the bandwidth cap binds there.)
        ("read_iops", 2000.0),
    ];
    let m = swept(&fx.mnt, Some(&group), "28s", &caps.map(|(r, _)| r));
    for (resource, cap) in caps {
        let got = detected(&m, resource).unwrap_or_else(|| panic!("no {resource} plateau:\n{m}"));
        eprintln!("{resource}: cap {cap:.0}, detected {got:.0}");
        assert!(
            (got - cap).abs() / cap <= 0.20,
            "{resource}: detected {got}, cap {cap}"
        );
        // The ratio exists once the limits collector has two readings
        // around the sweep's row (it is the disk's own rate over the cap).
        assert!(
            sample(
                &m,
                &format!(
                    "pgstorage_io_limit_utilization_ratio{{volume=\"t\",source=\"detected\",resource=\"{resource}\"}}"
                )
            )
            .is_some(),
            "{resource} utilization missing:\n{m}"
        );
    }

    // Same device, no throttle: nothing claimed. 1 s per depth is enough
    // for a device that is not rationing its IO. (Unthrottled, the loop
    // device's rates grow 2-3x from depth 1 to 4: far from the two flat
    // steps a plateau needs.)
    for f in [
        "read_iops_device",
        "write_iops_device",
        "read_bps_device",
        "write_bps_device",
    ] {
        fx.throttle(&group, f, 0);
    }
    let m = swept(&fx.mnt, None, "14s", &[]);
    let claimed: Vec<_> = m
        .lines()
        .filter(|l| l.starts_with("pgstorage_io_limit{") && l.contains("source=\"detected\""))
        .collect();
    assert!(
        claimed.is_empty(),
        "plateaus claimed unthrottled: {claimed:?}"
    );
}

/// One client's back-to-back commits in `group` as fio does them: 8 KiB
/// sequential writes, each followed by fdatasync, for `seconds`; commits
/// per second. The file is written in full and synced first, as
/// PostgreSQL fills a WAL segment with zeros before using it: an overwrite
/// costs the data write and the cache flush fdatasync sends, both from the
/// client and so both throttled. (Into a file fio created itself it did
/// 100 commits/s under a 100-IOPS cap: writes into new blocks change
/// metadata, and ext4's journal thread, outside the group, sends the
/// flush with its commit.)
fn fio_commits_per_second(dir: &Path, group: &Path, seconds: u32) -> f64 {
    let file = dir.join("fio-commits.dat");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&file).unwrap();
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..16 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    let mut fio = Command::new("fio");
    fio.args([
        "--name=one-client",
        "--thread",
        "--ioengine=psync",
        "--rw=write",
        "--bs=8k",
        "--size=16M",
        "--fdatasync=1",
        "--time_based",
        &format!("--runtime={seconds}"),
        "--output-format=json",
        &format!("--filename={}", file.display()),
    ]);
    join_cgroup_before_exec(&mut fio, &group.join("cgroup.procs"));
    let out = fio.output().unwrap();
    assert!(
        out.status.success(),
        "fio: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let w = &j["jobs"][0]["write"];
    let ios = w["total_ios"].as_f64().unwrap();
    let ms = w["runtime"].as_f64().unwrap();
    ios / (ms / 1000.0)
}

/// A cap the exporter cannot read (cgroup reading off, as inside a private
/// mount namespace or a VM whose host throttles its disk) feeds the `cap`
/// commit ceiling through the sweep's plateau: about cap / 2, the default
/// two device writes per commit, since no count of the probes' writes can
/// be attributed either. It must not fall below what one client really
/// commits in the same group, and stays close above it.
#[test]
fn a_write_cap_found_by_the_sweep_is_the_cap_commit_ceiling() {
    if !loopdev::can_run_with("the detected cap ceiling test", true, &["fio"]) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const CAP: u64 = 100;
    let mut fx = loopdev::LoopVolume::new(256 << 20, false);
    let group = fx.group("pgse-sweep-ceiling", &[("write_iops_device", CAP)]);
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("no-cgroups");
    std::fs::create_dir(&empty).unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "limits_interval = \"1s\"\ncgroup_root = \"{}\"\n\
             [[volume]]\nname = \"t\"\npath = \"{}\"\nprobes = [\"commit\", \"read\"]\n\
             read_file_size = \"16MiB\"\nfree_space_reserve = \"0\"\n\
             sweep_every = \"1h\"\nsweep_duration = \"28s\"\n",
            empty.display(),
            fx.mnt.display()
        ),
    )
    .unwrap();
    let ex = Exporter::start_with(
        &[
            "--web.listen-address",
            "127.0.0.1:0",
            "--config.file",
            cfg.to_str().unwrap(),
        ],
        &[],
        Some(&group.join("cgroup.procs")),
    );
    let m = ex.wait_for(
        "the cap ceiling from the sweep's plateau",
        Duration::from_secs(120),
        |m| {
            sample(
                m,
                "pgstorage_commit_ceiling_per_second{volume=\"t\",basis=\"cap\"}",
            )
            .is_some()
        },
    );
    let plateau = detected(&m, "write_iops").unwrap_or_else(|| panic!("no plateau:\n{m}"));
    let ceiling = sample(
        &m,
        "pgstorage_commit_ceiling_per_second{volume=\"t\",basis=\"cap\"}",
    )
    .unwrap();
    assert!(
        !m.contains("source=\"cgroup\"")
            && !m.contains("pgstorage_probe_device_writes_per_commit{"),
        "cgroup reading was off: {m}"
    );
    assert_eq!(
        sample(
            &m,
            "pgstorage_commit_ceiling_cap_info{volume=\"t\",source=\"detected\",resource=\"write_iops\",writes_per_commit=\"default\"}"
        ),
        Some(1.0),
        "{m}"
    );
    assert!(
        (ceiling - plateau / 2.0).abs() < 1e-9,
        "{ceiling} vs plateau {plateau}"
    );
    // The probes keep their writes under 2 % of the cap the sweep found.
    let slowdown = sample(&m, "pgstorage_probe_slowdown_ratio{volume=\"t\"}").unwrap();
    drop(ex);
    let fio = fio_commits_per_second(&fx.mnt, &group, 10);
    eprintln!(
        "write cap {CAP}: plateau {plateau:.1}, cap ceiling {ceiling:.1}/s, slowdown {slowdown:.2}; \
         fio one client {fio:.1} commits/s; ceiling / fio {:.3}",
        ceiling / fio
    );
    assert!(
        (0.85..=1.2).contains(&(ceiling / (CAP as f64 / 2.0))),
        "cap ceiling {ceiling} for a {CAP}-IOPS cap"
    );
    // Both figures are one throttle's rate, read over a few seconds in
    // 100 ms slices: up to about 1 % apart either way by reading alone
    // (1.003-1.015 in five runs, the plateau 100.4-101.6, fio 50.0-50.1).
    assert!(
        (0.98..=1.35).contains(&(ceiling / fio)),
        "cap ceiling {ceiling} vs fio's one client {fio}"
    );
    assert!(slowdown > 1.0, "probes not stretched under a {plateau} cap");
}
