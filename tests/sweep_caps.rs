//! The queue-depth sweep finds write-IOPS and bandwidth caps nobody told the
//! exporter about: the exporter runs in a cgroup v1 blkio group with
//! `read_iops_device` 2,000, `write_iops_device` 300, `read_bps_device`
//! 20 MiB/s and `write_bps_device` 10 MiB/s on an ext4 loop device, with
//! cgroup reading
//! turned off (`cgroup_root` an empty directory), and must report each cap
//! within 20 % as `source="detected"`; on the same device without the
//! throttles it must claim no plateau at all. Needs root, loop devices and
//! v1 blkio (skips with the reason otherwise, fails under CI). About 60 s.

// Test code: a panic is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::loopdev;
use common::*;

const MIB: u64 = 1 << 20;

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
