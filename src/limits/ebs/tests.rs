// Test code: a panic is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Mutex;
use std::time::Duration;

use super::page::{self, Bin, Counters, PageError};
use super::*;
use crate::limits::inputs::{DiskInput, VolumeInput};

fn bins(spec: &[(u64, u64, u32)]) -> Vec<Bin> {
    spec.iter()
        .map(|&(lower_us, upper_us, count)| Bin {
            lower_us,
            upper_us,
            count,
        })
        .collect()
}

fn counters() -> Counters {
    Counters {
        read_ops: 1_000,
        write_ops: 2_000,
        read_bytes: 8_192_000,
        write_bytes: 16_384_000,
        read_time_us: 500_000,
        write_time_us: 1_500_000,
        volume_exceeded_iops_us: 250_000,
        volume_exceeded_tp_us: 10,
        instance_exceeded_iops_us: 20,
        instance_exceeded_tp_us: 30,
        queue_length: 7,
    }
}

fn read_bins() -> Vec<Bin> {
    bins(&[
        (0, 256, 100),
        (256, 512, 600),
        (512, 1024, 290),
        (1024, 8192, 10),
    ])
}

fn write_bins() -> Vec<Bin> {
    bins(&[(0, 512, 1500), (512, 2048, 499), (2048, 1_000_000, 1)])
}

fn good_page() -> Vec<u8> {
    page::build(0, &counters(), &read_bins(), &write_bins())
}

/// The page written byte by byte from the layout (not with `build`), so
/// the offsets themselves are checked.
fn hand_page() -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
    put(0, &0x3C23_B510u32.to_le_bytes());
    put(4, &1u32.to_le_bytes());
    for (i, v) in [11u64, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
        .iter()
        .enumerate()
    {
        put(8 + 8 * i, &v.to_le_bytes());
    }
    put(512, &2u64.to_le_bytes());
    put(520, &0u64.to_le_bytes());
    put(528, &100u64.to_le_bytes());
    put(536, &5u32.to_le_bytes());
    put(544, &100u64.to_le_bytes());
    put(552, &200u64.to_le_bytes());
    put(560, &6u32.to_le_bytes());
    put(2056, &1u64.to_le_bytes());
    put(2064, &0u64.to_le_bytes());
    put(2072, &4000u64.to_le_bytes());
    put(2080, &9u32.to_le_bytes());
    b
}

#[test]
fn a_page_parses_to_exactly_its_figures() {
    let p = page::parse(&hand_page()).unwrap();
    assert_eq!(p.version, 1);
    let c = p.counters;
    assert_eq!(
        [
            c.read_ops,
            c.write_ops,
            c.read_bytes,
            c.write_bytes,
            c.read_time_us,
            c.write_time_us,
            c.volume_exceeded_iops_us,
            c.volume_exceeded_tp_us,
            c.instance_exceeded_iops_us,
            c.instance_exceeded_tp_us,
            c.queue_length
        ],
        [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    );
    assert_eq!(p.read_latency, bins(&[(0, 100, 5), (100, 200, 6)]));
    assert_eq!(p.write_latency, bins(&[(0, 4000, 9)]));
    // build() is parse()'s inverse.
    let p = page::parse(&good_page()).unwrap();
    assert_eq!(p.counters, counters());
    assert_eq!(p.read_latency, read_bins());
    assert_eq!(p.write_latency, write_bins());
    // 64 bins, the most that fit, are fine.
    let many: Vec<Bin> = (0..64)
        .map(|i| Bin {
            lower_us: i,
            upper_us: i + 1,
            count: 1,
        })
        .collect();
    let p = page::parse(&page::build(0, &counters(), &many, &many)).unwrap();
    assert_eq!(p.write_latency.len(), 64);
}

#[test]
fn bad_pages_are_refused_with_the_reason() {
    let mut wrong_magic = good_page();
    wrong_magic[0..4].copy_from_slice(&0xEC2C_0D7Eu32.to_le_bytes());
    assert_eq!(
        page::parse(&wrong_magic),
        Err(PageError::Magic { found: 0xEC2C_0D7E })
    );
    assert_eq!(
        page::parse(&good_page()[..3599]),
        Err(PageError::Short { len: 3599 })
    );
    assert_eq!(page::parse(&[]), Err(PageError::Short { len: 0 }));
    // The whole page minus its trailing reserved bytes is enough.
    assert!(page::parse(&good_page()[..page::MIN_LEN]).is_ok());
    let mut too_many = good_page();
    too_many[512..520].copy_from_slice(&65u64.to_le_bytes());
    assert_eq!(
        page::parse(&too_many),
        Err(PageError::TooManyBins {
            histogram: "read",
            num_bins: 65
        })
    );
    // A bin count with its upper half (the reserved u32) set.
    let mut reserved = good_page();
    reserved[2064 + 24 + 20..2064 + 24 + 24].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(
        page::parse(&reserved),
        Err(PageError::Reserved {
            histogram: "write",
            bin: 1,
            reserved: 1
        })
    );
    // num_bins itself using the upper half of its u64.
    let mut huge = good_page();
    huge[2056..2064].copy_from_slice(&(1u64 << 32 | 3).to_le_bytes());
    assert!(matches!(
        page::parse(&huge),
        Err(PageError::TooManyBins {
            histogram: "write",
            ..
        })
    ));
    let unordered = page::build(0, &counters(), &bins(&[(0, 10, 1), (10, 10, 1)]), &[]);
    assert_eq!(
        page::parse(&unordered),
        Err(PageError::Bounds {
            histogram: "read",
            bin: 1
        })
    );
}

#[test]
fn volume_ids_from_serials() {
    assert_eq!(
        volume_id("vol0123456789abcdef0   ").as_deref(),
        Some("vol-0123456789abcdef0")
    );
    assert_eq!(volume_id("vol-0abc").as_deref(), Some("vol-0abc"));
    assert_eq!(volume_id("AWS1234"), None);
    assert_eq!(volume_id("vol"), None);
    assert_eq!(volume_id("vol12/../x"), None);
}

#[test]
fn namespaces_of_a_controller() {
    assert!(is_namespace("nvme1", "nvme1n1"));
    assert!(is_namespace("nvme1", "nvme1c1n1"));
    assert!(!is_namespace("nvme1", "nvme10n1"), "another controller's");
    assert!(!is_namespace("nvme1", "nvme1n"));
    assert!(!is_namespace("nvme1", "power"));
    assert!(!is_namespace("nvme1", "nvme1n1p1"), "a partition");
}

#[test]
fn monotonic_totals_survive_a_reset() {
    let mut m = Monotonic::default();
    assert_eq!(m.update(100), 100);
    assert_eq!(m.update(150), 150);
    // The controller reset: 150 before, 20 since.
    assert_eq!(m.update(20), 170);
    assert_eq!(m.update(30), 180);
}

/// A sysfs tree with two EBS controllers (nvme1, nvme2), an instance
/// store controller (nvme0) and no other device.
fn sysfs(root: &Path) {
    let ctrl = |name: &str, model: &str, serial: &str, ns: &str, dev: &str| {
        let d = root.join("class/nvme").join(name);
        std::fs::create_dir_all(d.join(ns)).unwrap();
        // sysfs pads the model and serial with spaces to their field size.
        std::fs::write(d.join("model"), format!("{model:<40}\n")).unwrap();
        std::fs::write(d.join("serial"), format!("{serial:<20}\n")).unwrap();
        std::fs::write(d.join(ns).join("dev"), format!("{dev}\n")).unwrap();
    };
    ctrl(
        "nvme0",
        "Amazon EC2 NVMe Instance Storage",
        "AWS1A2B3C4D",
        "nvme0n1",
        "259:0",
    );
    ctrl(
        "nvme1",
        EBS_MODEL,
        "vol0aaaaaaaaaaaaaaaa1",
        "nvme1n1",
        "259:1",
    );
    ctrl(
        "nvme2",
        EBS_MODEL,
        "vol0bbbbbbbbbbbbbbbb2",
        "nvme2n1",
        "259:2",
    );
}

fn vol(name: &str, majmin: Option<&str>) -> VolumeInput {
    VolumeInput {
        name: name.into(),
        disk: match majmin {
            Some(mm) => Ok(DiskInput {
                name: "x".into(),
                majmin: mm.into(),
            }),
            None => Err(None),
        },
        provisioned: Vec::new(),
        cgroup: None,
        commit_probe: true,
        interval: Duration::from_secs(1),
        busy_every: Duration::ZERO,
        burst_commits: 0,
        commit_probes: 0,
        detected: Vec::new(),
        throttled_write_iops: None,
    }
}

#[test]
fn controllers_and_the_join_to_volumes() {
    let dir = tempfile::tempdir().unwrap();
    sysfs(dir.path());
    let c = controllers(dir.path());
    assert_eq!(
        c,
        vec![
            Controller {
                name: "nvme1".into(),
                volume_id: "vol-0aaaaaaaaaaaaaaaa1".into(),
                namespaces: vec![("nvme1n1".into(), "259:1".into())],
            },
            Controller {
                name: "nvme2".into(),
                volume_id: "vol-0bbbbbbbbbbbbbbbb2".into(),
                namespaces: vec![("nvme2n1".into(), "259:2".into())],
            },
        ]
    );
    let vols = [
        vol("wal", Some("259:2")),
        vol("data", Some("259:1")),
        vol("scratch", Some("259:0")),
        vol("tmp", None),
    ];
    let j = join(&vols, &c);
    let got: Vec<(&str, &str, &str)> = j
        .iter()
        .map(|j| (j.volume.as_str(), j.controller.as_str(), j.device.as_str()))
        .collect();
    assert_eq!(
        got,
        [("wal", "nvme2", "nvme2n1"), ("data", "nvme1", "nvme1n1")]
    );
    assert!(controllers(&dir.path().join("nothing")).is_empty());
}

/// What a fake controller answers: a page, or a negative errno or a
/// positive NVMe status.
type Answer = Result<Vec<u8>, i32>;

/// Pages or failures per controller, changed between passes.
#[derive(Debug, Default)]
struct Fake(Mutex<BTreeMap<String, Answer>>);

/// The fixture sysfs, and a source whose controller nvme1 answers with
/// [`good_page`].
fn nvme1_answering() -> (tempfile::TempDir, Fake) {
    let dir = tempfile::tempdir().unwrap();
    sysfs(dir.path());
    let src = Fake::default();
    src.set("nvme1", Ok(good_page()));
    (dir, src)
}

impl Fake {
    fn set(&self, ctrl: &str, r: Answer) {
        self.0.lock().unwrap().insert(ctrl.into(), r);
    }
}

impl LogPageSource for Fake {
    fn read(&self, ctrl: &str) -> Result<Vec<u8>, ReadFailure> {
        match self.0.lock().unwrap().get(ctrl) {
            Some(Ok(b)) => Ok(b.clone()),
            // Negative: an errno; positive: an NVMe status.
            Some(Err(n)) if *n < 0 => Err(ReadFailure::Os(io::Error::from_raw_os_error(-n))),
            Some(Err(n)) => Err(ReadFailure::Status(*n as u32)),
            None => Err(ReadFailure::Os(io::Error::from_raw_os_error(libc::ENOENT))),
        }
    }
}

/// Runs `passes` reads a second apart and returns the last snapshot and
/// every log line.
fn passes(
    r: &mut Reader,
    root: &Path,
    src: &Fake,
    vols: &[VolumeInput],
    t0: Instant,
    from: u64,
    n: u64,
) -> (EbsSnapshot, Vec<Log>) {
    let mut logs = Vec::new();
    let mut last = None;
    for i in from..from + n {
        let (s, l) = r.pass(root, src, vols, t0 + Duration::from_secs(i));
        logs.extend(l);
        last = Some(s);
    }
    (last.unwrap(), logs)
}

#[test]
fn the_figures_of_each_volume_in_exported_form() {
    let (dir, src) = nvme1_answering();
    let mut c2 = counters();
    c2.read_ops = 5;
    src.set(
        "nvme2",
        Ok(page::build(0, &c2, &read_bins(), &write_bins())),
    );
    let vols = [vol("data", Some("259:1")), vol("wal", Some("259:2"))];
    let mut r = Reader::default();
    let t0 = Instant::now();
    let (s, logs) = passes(&mut r, dir.path(), &src, &vols, t0, 0, 1);
    assert_eq!(logs, []);
    assert_eq!(s.reason, Reason::Ok);
    assert_eq!(s.volumes.len(), 2);
    let d = &s.volumes[0];
    assert_eq!(
        (
            d.volume.as_str(),
            d.ebs_volume_id.as_str(),
            d.device.as_str()
        ),
        ("data", "vol-0aaaaaaaaaaaaaaaa1", "nvme1n1")
    );
    assert_eq!(d.totals, counters().totals());
    assert_eq!(d.queue_length, 7);
    assert_eq!(s.volumes[1].totals[0], 5);
    // Per-bin counts by upper bound in seconds, +Inf last with nothing
    // beyond the device's last bin; the encoder makes them cumulative.
    assert_eq!(
        d.read_latency,
        Histogram {
            buckets: vec![
                (0.000256, 100),
                (0.000512, 600),
                (0.001024, 290),
                (0.008192, 10),
                (f64::INFINITY, 0)
            ],
            count: 1000,
            sum_seconds: 0.5,
        }
    );
    assert_eq!(d.write_latency.count, 2000);
    assert_eq!(d.write_latency.buckets[2], (1.0, 1));
}

#[test]
fn a_device_reset_never_takes_a_counter_backwards() {
    let (dir, src) = nvme1_answering();
    let vols = [vol("data", Some("259:1"))];
    let mut r = Reader::default();
    let t0 = Instant::now();
    passes(&mut r, dir.path(), &src, &vols, t0, 0, 1);
    let mut c = counters();
    c.read_ops = 3;
    c.volume_exceeded_iops_us = 1;
    src.set(
        "nvme1",
        Ok(page::build(
            0,
            &c,
            &bins(&[(0, 256, 4), (256, 512, 0), (512, 1024, 0), (1024, 8192, 0)]),
            &write_bins(),
        )),
    );
    let (s, _) = passes(&mut r, dir.path(), &src, &vols, t0, 1, 1);
    let v = &s.volumes[0];
    assert_eq!(v.totals[0], 1_003);
    assert_eq!(v.totals[6], 250_001);
    assert_eq!(v.read_latency.buckets[0], (0.000256, 104));
    assert_eq!(v.read_latency.count, 1_004);
}

#[test]
fn reads_happen_at_most_once_a_second() {
    let (dir, src) = nvme1_answering();
    let vols = [vol("data", Some("259:1"))];
    let mut r = Reader::default();
    let t0 = Instant::now();
    let (a, _) = r.pass(dir.path(), &src, &vols, t0);
    let mut c = counters();
    c.read_ops += 1;
    src.set("nvme1", Ok(page::build(0, &c, &read_bins(), &write_bins())));
    let (b, _) = r.pass(dir.path(), &src, &vols, t0 + Duration::from_millis(300));
    assert_eq!(a, b, "within a second: the last reading");
    let (b, _) = r.pass(dir.path(), &src, &vols, t0 + Duration::from_secs(1));
    assert_eq!(b.volumes[0].totals[0], 1_001);
}

/// Each failure: `available 0` with its reason, no figures, and exactly
/// one log line over ten passes naming the device and the cause; its end
/// logged once.
#[test]
fn each_failure_gives_one_log_line_and_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    sysfs(dir.path());
    let vols = [vol("data", Some("259:1"))];
    let mut wrong_magic = good_page();
    wrong_magic[0] = 0;
    let mut too_many = good_page();
    too_many[512] = 65;
    let mut reserved = good_page();
    reserved[520 + 20] = 1;
    let cases: [(&str, Answer, Reason, &str); 7] = [
        (
            "wrong magic",
            Ok(wrong_magic),
            Reason::BadLogPage,
            "magic is 0x3c23b500",
        ),
        (
            "short",
            Ok(vec![0; 512]),
            Reason::BadLogPage,
            "log page is 512 bytes",
        ),
        (
            "65 bins",
            Ok(too_many),
            Reason::BadLogPage,
            "claims 65 bins",
        ),
        (
            "reserved half",
            Ok(reserved),
            Reason::BadLogPage,
            "reserved half",
        ),
        (
            "EACCES",
            Err(-libc::EACCES),
            Reason::PermissionDenied,
            "CAP_SYS_ADMIN",
        ),
        (
            "EPERM",
            Err(-libc::EPERM),
            Reason::PermissionDenied,
            "CAP_SYS_ADMIN",
        ),
        (
            "status",
            Err(0x4109),
            Reason::NvmeStatus,
            "NVMe status 0x109 (invalid log page",
        ),
    ];
    for (what, r, reason, cause) in cases {
        let src = Fake::default();
        src.set("nvme1", r);
        let mut rd = Reader::default();
        let t0 = Instant::now();
        let (s, logs) = passes(&mut rd, dir.path(), &src, &vols, t0, 0, 10);
        assert_eq!(s.reason, reason, "{what}");
        assert!(s.volumes.is_empty(), "{what}: no figures");
        assert_eq!(logs.len(), 1, "{what}: {logs:?}");
        let Log::Warn(line) = &logs[0] else {
            panic!("{what}: {logs:?}")
        };
        assert!(
            line.contains("/dev/nvme1")
                && line.contains("vol-0aaaaaaaaaaaaaaaa1")
                && line.contains(cause),
            "{what}: {line}"
        );
        src.set("nvme1", Ok(good_page()));
        let (s, logs) = passes(&mut rd, dir.path(), &src, &vols, t0, 10, 3);
        assert_eq!(s.reason, Reason::Ok, "{what}");
        assert_eq!(logs.len(), 1, "{what}: the end, once: {logs:?}");
    }
}

#[test]
fn without_an_ebs_device_one_line_and_no_ebs_device() {
    let dir = tempfile::tempdir().unwrap();
    sysfs(dir.path());
    let src = Fake::default();
    let mut r = Reader::default();
    // A volume on the instance store controller, one on no disk.
    let vols = [vol("scratch", Some("259:0")), vol("tmp", None)];
    let (s, logs) = passes(&mut r, dir.path(), &src, &vols, Instant::now(), 0, 10);
    assert_eq!(s.reason, Reason::NoEbsDevice);
    assert!(s.volumes.is_empty());
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert!(matches!(&logs[0], Log::Info(l) if l.contains("no watched volume is on an AWS EBS")));
}

#[test]
fn one_failing_controller_of_two_sets_the_reason_and_keeps_the_other() {
    let (dir, src) = nvme1_answering();
    src.set("nvme2", Err(-libc::EACCES));
    let vols = [vol("data", Some("259:1")), vol("wal", Some("259:2"))];
    let mut r = Reader::default();
    let (s, logs) = passes(&mut r, dir.path(), &src, &vols, Instant::now(), 0, 1);
    assert_eq!(s.reason, Reason::PermissionDenied);
    assert_eq!(s.volumes.len(), 1);
    assert_eq!(s.volumes[0].volume, "data");
    assert_eq!(logs.len(), 1);
}

/// Two volumes on one disk: one read of its controller, the same figures
/// on both, and a second pass advances them once, not twice.
#[test]
fn a_controller_backing_two_volumes_is_read_once() {
    #[derive(Debug, Default)]
    struct Counting(Fake, std::sync::atomic::AtomicU32);
    impl LogPageSource for Counting {
        fn read(&self, ctrl: &str) -> Result<Vec<u8>, ReadFailure> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.0.read(ctrl)
        }
    }
    let dir = tempfile::tempdir().unwrap();
    sysfs(dir.path());
    let src = Counting::default();
    src.0.set("nvme1", Ok(good_page()));
    let vols = [vol("data", Some("259:1")), vol("wal", Some("259:1"))];
    let mut r = Reader::default();
    let t0 = Instant::now();
    let (s, _) = r.pass(dir.path(), &src, &vols, t0);
    assert_eq!(src.1.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(s.volumes.len(), 2);
    assert_eq!(s.volumes[0].totals, s.volumes[1].totals);
    assert_eq!(
        (s.volumes[0].volume.as_str(), s.volumes[1].volume.as_str()),
        ("data", "wal")
    );
    src.0.set(
        "nvme1",
        Ok(page::build(
            0,
            &Counters {
                read_ops: 10,
                ..counters()
            },
            &read_bins(),
            &write_bins(),
        )),
    );
    let (s, _) = r.pass(dir.path(), &src, &vols, t0 + Duration::from_secs(1));
    assert_eq!(s.volumes[0].totals[0], 1_010, "a reset seen once");
    assert_eq!(s.volumes[1].totals[0], 1_010);
}
