//! AWS EBS statistics read from a real EBS NVMe controller with the real
//! ioctl: the only hardware-gated test. It runs where `/sys/class/nvme`
//! lists an "Amazon Elastic Block Store" controller (a Nitro EC2 instance)
//! and is marked ignored, so the test command lists it as not run: unlike
//! the loop device and cgroup tests, which CI can always run as root, no CI
//! host can conjure an EBS volume, and no emulated device answers log page
//! 0xD0. On a Nitro instance, as root:
//! `cargo test --test suite ebs_hardware -- --ignored`.
//! The parser, the join and the metrics are covered on fixtures by the
//! unit tests of `src/limits/ebs` and by `tests/suite/ebs_fixture.rs`.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use pg_storage_exporter::limits::ebs::{self, LogPageSource};

#[test]
#[ignore = "needs an AWS EBS NVMe controller (a Nitro EC2 instance) and root"]
fn real_ebs_controllers_answer_the_statistics_page() {
    let ctrls = ebs::controllers(Path::new("/sys"));
    assert!(
        !ctrls.is_empty(),
        "no AWS EBS NVMe controller in /sys/class/nvme"
    );
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "the Get Log Page ioctl needs root (CAP_SYS_ADMIN)"
    );
    for c in &ctrls {
        let page = ebs::classify(ebs::DeviceSource.read(&c.name))
            .unwrap_or_else(|f| panic!("{} ({}): {:?}", c.name, c.volume_id, f));
        let n = &page.counters;
        eprintln!(
            "{} {}: version {}, {} reads, {} writes, {} read bins, {} write bins, volume over IOPS cap {} us",
            c.name,
            c.volume_id,
            page.version,
            n.read_ops,
            n.write_ops,
            page.read_latency.len(),
            page.write_latency.len(),
            n.volume_exceeded_iops_us
        );
        // Plausibility only: a volume with reads has read bytes and time.
        if n.read_ops > 0 {
            assert!(n.read_bytes >= 512 * n.read_ops / 2, "{n:?}");
            assert!(n.read_time_us > 0, "{n:?}");
        }
    }

    // The daemon on a volume under the temp dir, when that is on EBS.
    let dir = tempfile::tempdir().unwrap();
    let mm = disk_of(dir.path());
    let Some(c) = ctrls
        .iter()
        .find(|c| c.namespaces.iter().any(|(_, m)| *m == mm))
    else {
        eprintln!("the temp dir ({mm}) is not on an EBS volume: daemon part skipped");
        return;
    };
    let ex = Exporter::start(&[
        "--probe.path",
        dir.path().to_str().unwrap(),
        "--probe.interval",
        "1s",
    ]);
    let m = ex.wait_for("EBS series", Duration::from_secs(60), |m| {
        m.contains("pgstorage_ebs_info{")
    });
    assert!(
        m.contains(&format!("ebs_volume_id=\"{}\"", c.volume_id)),
        "{m}"
    );
    assert_eq!(
        sample(&m, "pgstorage_ebs_available{reason=\"ok\"}"),
        Some(1.0),
        "{m}"
    );
    promtool_check_metrics(&m);
}
