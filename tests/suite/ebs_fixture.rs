//! AWS EBS statistics through the real daemon, on a host without EBS: a
//! fixture sysfs tree (`sys_root`) with two EBS controllers whose
//! namespaces carry the MAJ:MIN that mountinfo gives the volumes'
//! filesystems (one on this machine's disk, one on a loop device), so the
//! exporter takes those disks for `nvme1n1` and `nvme2n1`, and fixture log
//! pages in place of the ioctl through the testing-only
//! `PGSE_TEST_EBS_LOG_PAGES` directory.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::loopdev::{LoopVolume, can_run};
use common::*;
use pg_storage_exporter::limits::ebs::page::{Bin, Counters, build};

const EBS: &str = "Amazon Elastic Block Store";

/// An NVMe controller `name` in the fixture tree, laid out as sysfs has
/// it: the device under `devices/`, `class/nvme/<name>` and
/// `dev/block/<MAJ:MIN>` of its one namespace `<name>n1` as symlinks, so
/// the exporter resolves a volume on `majmin` to the disk `<name>n1`.
/// Model and serial are space-padded as the kernel pads them.
fn controller(sys: &Path, name: &str, model: &str, serial: &str, majmin: &str) {
    use std::os::unix::fs::symlink;
    let d = sys.join("devices/pci0000:00/nvme").join(name);
    let ns = d.join(format!("{name}n1"));
    std::fs::create_dir_all(&ns).unwrap();
    std::fs::write(d.join("model"), format!("{model:<40}\n")).unwrap();
    std::fs::write(d.join("serial"), format!("{serial:<20}\n")).unwrap();
    std::fs::write(ns.join("dev"), format!("{majmin}\n")).unwrap();
    for dir in ["class/nvme", "dev/block"] {
        std::fs::create_dir_all(sys.join(dir)).unwrap();
    }
    symlink(&d, sys.join("class/nvme").join(name)).unwrap();
    symlink(&ns, sys.join("dev/block").join(majmin)).unwrap();
}

fn counters(read_ops: u64, exceeded_iops_us: u64) -> Counters {
    Counters {
        read_ops,
        write_ops: 2 * read_ops,
        read_bytes: 8192 * read_ops,
        write_bytes: 16384 * read_ops,
        read_time_us: 250 * read_ops,
        write_time_us: 500 * read_ops,
        volume_exceeded_iops_us: exceeded_iops_us,
        volume_exceeded_tp_us: 1_000,
        instance_exceeded_iops_us: 2_000,
        instance_exceeded_tp_us: 3_000,
        queue_length: 4,
    }
}

fn bins(counts: &[u32]) -> Vec<Bin> {
    // Doubling bounds from 128 µs, as the device's own would be read.
    counts
        .iter()
        .enumerate()
        .map(|(i, c)| Bin {
            lower_us: if i == 0 { 0 } else { 64 << i },
            upper_us: 128 << i,
            count: *c,
        })
        .collect()
}

fn config(dir: &Path, sys: &Path, volumes: &[(&str, &Path)]) -> String {
    let mut c = format!(
        "limits_interval = \"500ms\"\nsys_root = \"{}\"\n",
        sys.display()
    );
    for (name, path) in volumes {
        c.push_str(&format!(
            "[[volume]]\nname = \"{name}\"\npath = \"{}\"\nprobes = [\"read\"]\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n",
            path.display()
        ));
    }
    let p = dir.join("c.toml");
    std::fs::write(&p, c).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn two_ebs_controllers_show_on_their_volumes() {
    if !can_run("two_ebs_controllers_show_on_their_volumes", false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let lv = LoopVolume::new(64 << 20, false);
    let wal = lv.mnt.join("wal");
    std::fs::create_dir(&wal).unwrap();
    let sys = dir.path().join("sys");
    // An instance store controller on a MAJ:MIN no volume has: never read.
    controller(
        &sys,
        "nvme0",
        "Amazon EC2 NVMe Instance Storage",
        "AWS12345",
        "259:99",
    );
    controller(&sys, "nvme1", EBS, "vol0aaaaaaaaaaaaaaaa1", &disk_of(&data));
    controller(&sys, "nvme2", EBS, "vol0bbbbbbbbbbbbbbbb2", &lv.majmin);
    let pages = dir.path().join("pages");
    std::fs::create_dir(&pages).unwrap();
    std::fs::write(
        pages.join("nvme1.bin"),
        build(
            0,
            &counters(1_000, 0),
            &bins(&[10, 900, 80, 10]),
            &bins(&[1_990, 10]),
        ),
    )
    .unwrap();
    std::fs::write(
        pages.join("nvme2.bin"),
        build(
            0,
            &counters(50, 2_500_000),
            &bins(&[50]),
            &bins(&[60, 30, 10]),
        ),
    )
    .unwrap();
    let cfg = config(dir.path(), &sys, &[("data", &data), ("wal", &wal)]);
    let ex = Exporter::start_env(
        &["--config.file", &cfg],
        &[("PGSE_TEST_EBS_LOG_PAGES", pages.to_str().unwrap())],
    );
    let m = ex.wait_for("EBS series on both volumes", Duration::from_secs(30), |m| {
        sample(m, "pgstorage_ebs_read_ops_total{volume=\"wal\"}").is_some()
            && sample(m, "pgstorage_ebs_read_ops_total{volume=\"data\"}").is_some()
    });
    assert_eq!(
        sample(&m, "pgstorage_ebs_available{reason=\"ok\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            "pgstorage_ebs_info{volume=\"data\",ebs_volume_id=\"vol-0aaaaaaaaaaaaaaaa1\",device=\"nvme1n1\"}"
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            "pgstorage_ebs_info{volume=\"wal\",ebs_volume_id=\"vol-0bbbbbbbbbbbbbbbb2\",device=\"nvme2n1\"}"
        ),
        Some(1.0),
        "{m}"
    );
    let want = [
        ("read_ops_total", "data", 1_000.0),
        ("write_ops_total", "data", 2_000.0),
        ("read_bytes_total", "data", 8_192_000.0),
        ("write_bytes_total", "data", 16_384_000.0),
        ("read_seconds_total", "data", 0.25),
        ("write_seconds_total", "data", 0.5),
        (
            "volume_performance_exceeded_iops_seconds_total",
            "data",
            0.0,
        ),
        ("read_ops_total", "wal", 50.0),
        ("volume_performance_exceeded_iops_seconds_total", "wal", 2.5),
        ("volume_performance_exceeded_tp_seconds_total", "wal", 0.001),
        (
            "instance_performance_exceeded_iops_seconds_total",
            "wal",
            0.002,
        ),
        (
            "instance_performance_exceeded_tp_seconds_total",
            "wal",
            0.003,
        ),
        ("volume_queue_length", "wal", 4.0),
    ];
    for (name, vol, v) in want {
        assert_eq!(
            sample(&m, &format!("pgstorage_ebs_{name}{{volume=\"{vol}\"}}")),
            Some(v),
            "{name} {vol}:\n{m}"
        );
    }
    // The device's own bounds, cumulative, +Inf = the total.
    let buckets = [
        ("0.000128", 10.0),
        ("0.000256", 910.0),
        ("0.000512", 990.0),
        ("0.001024", 1_000.0),
        ("+Inf", 1_000.0),
    ];
    for (le, n) in buckets {
        assert_eq!(
            sample(
                &m,
                &format!(
                    "pgstorage_ebs_read_io_latency_seconds_bucket{{volume=\"data\",le=\"{le}\"}}"
                )
            ),
            Some(n),
            "le {le}:\n{m}"
        );
    }
    assert_eq!(
        sample(
            &m,
            "pgstorage_ebs_write_io_latency_seconds_count{volume=\"wal\"}"
        ),
        Some(100.0)
    );
    assert_eq!(
        sample(
            &m,
            "pgstorage_ebs_read_io_latency_seconds_sum{volume=\"data\"}"
        ),
        Some(0.25)
    );
    assert!(!m.contains("nvme0"), "instance store is not EBS: {m}");
    promtool_check_metrics(&m);
    // The EBS series of a passing run, for the log.
    for l in m.lines().filter(|l| l.starts_with("pgstorage_ebs_")) {
        eprintln!("{l}");
    }
    let (_, _, om) = http_get(ex.addr, "/metrics", Some("application/openmetrics-text"));
    assert!(
        om.contains("pgstorage_ebs_read_ops_total{volume=\"data\"} 1000"),
        "{om}"
    );
}

/// A controller that answers "invalid log page" (as instance store does
/// when taken for EBS): available 0 with reason nvme_status, one warning
/// naming the device, no per-volume series; with the collector off, no
/// EBS series at all. Needs no root.
#[test]
fn a_refused_page_is_one_line_and_available_zero() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let sys = dir.path().join("sys");
    controller(
        &sys,
        "nvme3",
        EBS,
        "vol0ccccccccccccccccc3",
        &disk_of(&data),
    );
    let pages = dir.path().join("pages");
    std::fs::create_dir(&pages).unwrap();
    std::fs::write(pages.join("nvme3.status"), "0x109\n").unwrap();
    let cfg = config(dir.path(), &sys, &[("data", &data)]);
    let env = [("PGSE_TEST_EBS_LOG_PAGES", pages.to_str().unwrap())];
    let ex = Exporter::start_env(&["--config.file", &cfg], &env);
    let m = ex.wait_for("available 0", Duration::from_secs(30), |m| {
        sample(m, "pgstorage_ebs_available{reason=\"nvme_status\"}").is_some()
    });
    assert_eq!(
        sample(&m, "pgstorage_ebs_available{reason=\"nvme_status\"}"),
        Some(0.0)
    );
    // Several more passes (500 ms apart, reads at most once a second).
    std::thread::sleep(Duration::from_secs(4));
    let m = ex.metrics();
    let series: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("pgstorage_ebs_"))
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s))
        .collect();
    assert_eq!(
        series,
        ["pgstorage_ebs_available{reason=\"nvme_status\"}"],
        "nothing else"
    );
    let log = ex.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("EBS statistics"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains("/dev/nvme3")
            && lines[0].contains("vol-0ccccccccccccccccc3")
            && lines[0].contains("NVMe status 0x109"),
        "{}",
        lines[0]
    );
    promtool_check_metrics(&m);
    drop(ex);

    let ex = Exporter::start_env(&["--config.file", &cfg, "--no-collector.limits.ebs"], &env);
    let m = ex.wait_for("a limits pass", Duration::from_secs(30), |m| {
        sample(m, "pgstorage_collector_success{collector=\"limits\"}").is_some()
    });
    std::thread::sleep(Duration::from_secs(1));
    let m2 = ex.metrics();
    assert!(
        !m.contains("pgstorage_ebs_") && !m2.contains("pgstorage_ebs_"),
        "{m2}"
    );
}
