//! Whole passes over fixture trees with a fake daemon: which reads count
//! as failures and which absences are facts.

use std::time::Duration;

use super::*;

#[derive(Debug, Default)]
struct Fake {
    volumes: Vec<VolumeInput>,
    clusters: Vec<ClusterInput>,
    /// The latest factor set per volume.
    slowdowns: Mutex<BTreeMap<String, f64>>,
}

impl Inputs for Fake {
    fn volumes(&self) -> Vec<VolumeInput> {
        self.volumes.clone()
    }
    fn clusters(&self) -> Vec<ClusterInput> {
        self.clusters.clone()
    }
    fn set_slowdown(&self, volume: &str, factor: f64) -> f64 {
        if let Ok(mut m) = self.slowdowns.lock() {
            m.insert(volume.to_string(), factor);
        }
        factor
    }
}

fn volume(name: &str) -> VolumeInput {
    VolumeInput {
        name: name.into(),
        disk: Ok(DiskInput {
            name: "vda".into(),
            majmin: "254:0".into(),
        }),
        provisioned: vec![(Resource::Iops, 3000)],
        cgroup: None,
        commit_probe: false,
        interval: Duration::from_secs(1),
        busy_every: Duration::ZERO,
        burst_commits: 24,
        commit_probes: 0,
        detected: Vec::new(),
        throttled_write_iops: None,
    }
}

/// A v2 host: the exporter in /exporter, PostgreSQL (pid 4242) in
/// /system.slice/postgresql.service with a write-IOPS cap on vda.
struct Host {
    _dir: tempfile::TempDir,
    cfg: LimitsSettings,
    data: PathBuf,
}

fn host() -> Host {
    let dir = tempfile::tempdir().unwrap();
    let cg = dir.path().join("cgroup");
    let proc = dir.path().join("proc");
    let data = dir.path().join("data");
    let pg = cg.join("system.slice/postgresql.service");
    std::fs::create_dir_all(&pg).unwrap();
    std::fs::create_dir_all(cg.join("exporter")).unwrap();
    std::fs::create_dir_all(proc.join("self")).unwrap();
    std::fs::create_dir_all(proc.join("4242")).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "cpu io memory").unwrap();
    std::fs::write(
        pg.join("io.max"),
        "254:0 rbps=max wbps=max riops=max wiops=100\n",
    )
    .unwrap();
    std::fs::write(proc.join("self/cgroup"), "0::/exporter\n").unwrap();
    std::fs::write(
        proc.join("4242/cgroup"),
        "0::/system.slice/postgresql.service\n",
    )
    .unwrap();
    std::fs::write(
        proc.join("diskstats"),
        " 254       0 vda 874 12 51234 100 542 30 9000 200 0 300 400 0 0 0 0 10 5\n",
    )
    .unwrap();
    std::fs::write(data.join("postmaster.pid"), "4242\n/data\n").unwrap();
    Host {
        cfg: LimitsSettings {
            interval: Duration::from_secs(1),
            cgroup_root: cg,
            proc_root: proc,
            sys_root: dir.path().join("sys"),
        },
        _dir: dir,
        data,
    }
}

fn inputs(h: &Host) -> Fake {
    Fake {
        volumes: vec![volume("c/wal")],
        clusters: vec![ClusterInput {
            name: "c".into(),
            data_directory: Some(h.data.clone()),
            volumes: vec![("c/wal".into(), "wal".into())],
        }],
        ..Default::default()
    }
}

/// The write-IOPS cgroup limit of a volume, if any.
fn write_iops_limit(s: &LimitsSnapshot, volume: &str) -> Option<f64> {
    s.rows
        .iter()
        .filter(|r| r.volume == volume && r.resource == Resource::WriteIops && r.source == "cgroup")
        .map(|r| r.value)
        .reduce(f64::min)
}

fn run(h: &Host, f: &Fake, prev: &mut Prev) -> LimitsSnapshot {
    pass(&h.cfg, f, None, prev, Instant::now())
}

#[test]
fn a_healthy_host_has_no_failed_reads() {
    let h = host();
    let mut prev = Prev::default();
    let s = run(&h, &inputs(&h), &mut prev);
    assert_eq!(s.last_run.map(|r| r.failed_reads), Some(0));
    assert!(s.read_errors.is_empty());
    assert_eq!(write_iops_limit(&s, "c/wal"), Some(100.0));
    assert_eq!(s.cgroups[0].scope, "postgres:c");
}

#[test]
fn postgres_down_or_gone_is_not_a_failure() {
    let h = host();
    let f = inputs(&h);
    let mut prev = Prev::default();
    // A clean shutdown removes postmaster.pid: the exporter's cgroup is used.
    std::fs::remove_file(h.data.join("postmaster.pid")).unwrap();
    let s = run(&h, &f, &mut prev);
    assert_eq!(s.last_run.map(|r| r.failed_reads), Some(0));
    assert_eq!(s.cgroups[0].scope, "exporter");
    // A crash leaves it behind, naming a pid that no longer runs.
    std::fs::write(h.data.join("postmaster.pid"), "9999\n").unwrap();
    let s = run(&h, &f, &mut prev);
    assert_eq!(s.last_run.map(|r| r.failed_reads), Some(0));
    // A data directory on another host does not exist here.
    let mut remote = f;
    remote.clusters[0].data_directory = Some("/nonexistent/remote".into());
    let s = run(&h, &remote, &mut prev);
    assert_eq!(s.last_run.map(|r| r.failed_reads), Some(0));
    assert!(s.read_errors.is_empty());
}

#[test]
fn unreadable_files_are_counted_per_pass_and_since_start() {
    let h = host();
    let f = inputs(&h);
    let mut prev = Prev::default();
    let io_max = h
        .cfg
        .cgroup_root
        .join("system.slice/postgresql.service/io.max");
    std::fs::write(&io_max, "254:0 wiops=a-hundred\n").unwrap();
    std::fs::write(h.data.join("postmaster.pid"), "not a pid\n").unwrap();
    for n in 1..=3u64 {
        let s = run(&h, &f, &mut prev);
        // postmaster.pid unparsable: the volume falls back to the
        // exporter's cgroup, whose limits read fine. One failure.
        assert_eq!(s.last_run.map(|r| r.failed_reads), Some(1));
        assert_eq!(s.read_errors.get(&("postmaster_pid", "parse")), Some(&n));
    }
    // The pid readable again, io.max still broken: no cgroup limit rows
    // (unknown), not an absent limit.
    std::fs::write(h.data.join("postmaster.pid"), "4242\n").unwrap();
    let s = run(&h, &f, &mut prev);
    assert_eq!(s.last_run.map(|r| r.failed_reads), Some(1));
    assert_eq!(s.read_errors.get(&("cgroup_limits", "parse")), Some(&1));
    assert_eq!(s.read_errors.get(&("postmaster_pid", "parse")), Some(&3));
    assert_eq!(write_iops_limit(&s, "c/wal"), None);
    assert!(s.rows.iter().all(|r| r.source != "cgroup"));

    // /proc/diskstats as a directory and /proc/self/cgroup missing: a
    // wrong proc_root.
    std::fs::write(&io_max, "254:0 wiops=100\n").unwrap();
    std::fs::remove_file(h.cfg.proc_root.join("diskstats")).unwrap();
    std::fs::create_dir(h.cfg.proc_root.join("diskstats")).unwrap();
    std::fs::remove_file(h.cfg.proc_root.join("self/cgroup")).unwrap();
    let s = run(&h, &f, &mut prev);
    assert_eq!(s.last_run.map(|r| r.failed_reads), Some(2));
    assert_eq!(s.read_errors.get(&("diskstats", "EISDIR")), Some(&1));
    assert_eq!(s.read_errors.get(&("proc_cgroup", "ENOENT")), Some(&1));
}

#[test]
fn a_cgroup_root_that_is_not_a_hierarchy_fails_an_empty_one_is_off() {
    let mut h = host();
    let f = inputs(&h);
    let mut prev = Prev::default();
    let not_cg = h.cfg.proc_root.clone();
    h.cfg.cgroup_root = not_cg;
    let s = run(&h, &f, &mut prev);
    assert_eq!(s.last_run.map(|r| r.failed_reads), Some(1));
    assert_eq!(s.read_errors.get(&("cgroup_limits", "ENOENT")), Some(&1));
    assert!(s.cgroups.is_empty());
    let empty = tempfile::tempdir().unwrap();
    h.cfg.cgroup_root = empty.path().to_path_buf();
    let s = run(&h, &f, &mut prev);
    assert_eq!(s.last_run.map(|r| r.failed_reads), Some(0));
    assert!(s.cgroups.is_empty());
    // Provisioned limits do not depend on cgroups.
    assert!(s.rows.iter().any(|r| r.source == "provisioned"));
}

#[test]
fn sweep_plateaus_are_detected_rows_with_the_disks_utilization() {
    let h = host();
    let mut f = inputs(&h);
    f.volumes[0].detected = vec![
        (Resource::WriteIops, 300.0),
        (Resource::WriteBytesPerSecond, 10.0 * 1048576.0),
    ];
    let mut prev = Prev::default();
    let t0 = Instant::now();
    let s = pass(&h.cfg, &f, None, &mut prev, t0);
    let detected: Vec<_> = s.rows.iter().filter(|r| r.source == "detected").collect();
    assert_eq!(detected.len(), 2, "{detected:?}");
    assert!(
        detected.iter().all(|r| r.utilization.is_none()),
        "one reading: no rate yet"
    );
    // Then 300 more writes and 40,960 more sectors written (20 MiB), over
    // an interval the pass measures itself: write_iops runs at 300/dt of
    // 300, write bandwidth at 20 MiB/dt of 10 MiB/s, twice that share.
    std::fs::write(
        h.cfg.proc_root.join("diskstats"),
        " 254       0 vda 874 12 51234 100 842 30 49960 200 0 300 400 0 0 0 0 10 5\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let s = pass(&h.cfg, &f, None, &mut prev, t0);
    let ratio = |res: Resource| {
        s.rows
            .iter()
            .find(|r| r.source == "detected" && r.resource == res)
            .and_then(|r| r.utilization)
            .unwrap()
    };
    let iops = ratio(Resource::WriteIops);
    assert!(iops > 0.0);
    assert!((ratio(Resource::WriteBytesPerSecond) / iops - 2.0).abs() < 1e-9);
    // The provisioned row is computed the same way: 300 IOs of 3000.
    let prov = s.rows.iter().find(|r| r.source == "provisioned").unwrap();
    assert!((prov.utilization.unwrap() / iops - 0.1).abs() < 1e-9);
}

/// The cap basis takes every known cap on writes: PostgreSQL's cgroup
/// throttle (100 write IOPS in the fixture), the provisioned 3,000 IOPS,
/// and a sweep's plateau when it is tighter. Without the exporter's own
/// count of writes per probe the divisor is the default 2.
#[test]
fn the_cap_basis_is_the_tightest_known_cap_over_writes_per_commit() {
    let h = host();
    let mut f = inputs(&h);
    f.volumes[0].commit_probe = true;
    let mut prev = Prev::default();
    let s = run(&h, &f, &mut prev);
    let b = s.cap_basis("c/wal").unwrap();
    assert_eq!(
        (b.cap.source, b.cap.resource),
        ("cgroup", Resource::WriteIops)
    );
    assert_eq!(b.writes_source, caps::WritesPerCommit::Default);
    assert_eq!(b.ceiling, 50.0);

    f.volumes[0].detected = vec![(Resource::WriteIops, 60.0)];
    let s = run(&h, &f, &mut prev);
    let b = s.cap_basis("c/wal").unwrap();
    // 60 / 2 with a measured plateau's headroom.
    assert_eq!(b.cap.source, "detected");
    assert!((b.ceiling - 33.0).abs() < 1e-9, "{}", b.ceiling);

    // Nothing that caps writes: no basis.
    f.volumes[0].detected = vec![(Resource::ReadIops, 2000.0)];
    f.volumes[0].provisioned = vec![(Resource::ReadIops, 3000)];
    std::fs::write(
        h.cfg
            .cgroup_root
            .join("system.slice/postgresql.service/io.max"),
        "254:0 rbps=max wbps=max riops=500 wiops=max\n",
    )
    .unwrap();
    let s = run(&h, &f, &mut prev);
    assert!(s.cap_basis("c/wal").is_none(), "{:?}", s.rows);
}

/// The probes' 2 % share of a cap counts a detected write plateau too: it
/// was found with the exporter's own writes, so whatever enforces it
/// counts the probes. At a 1 s interval and a 24-commit burst every 10 s,
/// 3.4 commits/s of 2 writes are 6.8 writes/s: 2 % of a 100-IOPS plateau
/// is 2, a 3.4x stretch; 2 % of the provisioned 3,000 is 60, none.
#[test]
fn a_detected_write_plateau_stretches_the_probe_schedule() {
    let h = host();
    let mut f = inputs(&h);
    // No cluster: the exporter's own cgroup (no cap in the fixture).
    f.clusters.clear();
    f.volumes[0].commit_probe = true;
    f.volumes[0].busy_every = Duration::from_secs(10);
    let mut prev = Prev::default();
    run(&h, &f, &mut prev);
    assert_eq!(f.slowdowns.lock().unwrap().get("c/wal"), Some(&1.0));
    f.volumes[0].detected = vec![(Resource::WriteIops, 100.0)];
    run(&h, &f, &mut prev);
    let got = *f.slowdowns.lock().unwrap().get("c/wal").unwrap();
    assert!((got - 3.4).abs() < 1e-9, "slowdown {got}");
    // A throttle the probe's bursts met counts the same way: 50 commits/s
    // over its whole cycles at 2 writes each is a 100-IOPS cap. It feeds
    // no cap basis (the probe's own basis has it).
    f.volumes[0].detected.clear();
    f.volumes[0].throttled_write_iops = Some(100.0);
    let s = run(&h, &f, &mut prev);
    let got = *f.slowdowns.lock().unwrap().get("c/wal").unwrap();
    assert!((got - 3.4).abs() < 1e-9, "slowdown {got}");
    let b = s.cap_basis("c/wal").unwrap();
    assert_eq!(b.cap.source, "provisioned", "{:?}", s.rows);
    f.volumes[0].throttled_write_iops = None;
    run(&h, &f, &mut prev);
    assert_eq!(f.slowdowns.lock().unwrap().get("c/wal"), Some(&1.0));
}
