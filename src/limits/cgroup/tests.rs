use super::*;

/// A fixture hierarchy: cgroup path → limits on device "259:0".
fn spec() -> Vec<(&'static str, Limits)> {
    vec![
        ("", Limits::default()),
        (
            "system.slice",
            Limits {
                read_iops: Some(2000),
                ..Default::default()
            },
        ),
        (
            "system.slice/postgresql.service",
            Limits {
                write_iops: Some(100),
                read_iops: Some(5000),
                ..Default::default()
            },
        ),
    ]
}

fn v2_tree(root: &Path, controllers: &str) {
    std::fs::write(root.join("cgroup.controllers"), controllers).unwrap();
    for (p, l) in spec() {
        let d = root.join(p);
        std::fs::create_dir_all(&d).unwrap();
        let f = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_else(|| "max".into());
        std::fs::write(
            d.join("io.max"),
            format!(
                "259:0 rbps={} wbps={} riops={} wiops={}\n8:0 rbps=max wbps=max riops=7 wiops=max\n",
                f(l.read_bps),
                f(l.write_bps),
                f(l.read_iops),
                f(l.write_iops)
            ),
        )
        .unwrap();
    }
    std::fs::write(
        root.join("system.slice/postgresql.service/io.stat"),
        "259:0 rbytes=8192 wbytes=16384 rios=1 wios=2 dbytes=0 dios=0\n",
    )
    .unwrap();
    std::fs::write(
        root.join("system.slice/postgresql.service/io.pressure"),
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=2500000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=1000000\n",
    )
    .unwrap();
}

fn v1_tree(blkio: &Path) {
    for (p, l) in spec() {
        let d = blkio.join(p);
        std::fs::create_dir_all(&d).unwrap();
        // v1 files list only devices with a limit; 0 means none.
        let w = |f: &str, v: Option<u64>| {
            let body = match v {
                Some(x) => format!("259:0 {x}\n8:0 0\n"),
                None => String::new(),
            };
            std::fs::write(d.join(f), body).unwrap();
        };
        w("blkio.throttle.read_iops_device", l.read_iops);
        w("blkio.throttle.write_iops_device", l.write_iops);
        w("blkio.throttle.read_bps_device", l.read_bps);
        w("blkio.throttle.write_bps_device", l.write_bps);
    }
    let d = blkio.join("system.slice/postgresql.service");
    std::fs::write(
        d.join("blkio.throttle.io_serviced"),
        "259:0 Read 1\n259:0 Write 2\n259:0 Sync 2\n259:0 Total 3\nTotal 3\n",
    )
    .unwrap();
    std::fs::write(
        d.join("blkio.throttle.io_service_bytes"),
        "259:0 Read 8192\n259:0 Write 16384\n259:0 Total 24576\nTotal 24576\n",
    )
    .unwrap();
}

const WANT: Limits = Limits {
    read_iops: Some(2000),
    write_iops: Some(100),
    read_bps: None,
    write_bps: None,
};

const COUNTS: Counters = Counters {
    read_ios: 1,
    write_ios: 2,
    read_bytes: 8192,
    write_bytes: 16384,
};

#[test]
fn same_fixture_same_limits_through_v1_and_v2() {
    let pg = ProcCgroups {
        v2: Some("/system.slice/postgresql.service".into()),
        blkio: Some("/system.slice/postgresql.service".into()),
    };

    let v2 = tempfile::tempdir().unwrap();
    v2_tree(v2.path(), "cpuset cpu io memory pids");
    let loc = locate(v2.path(), &pg).unwrap().unwrap();
    assert_eq!(loc.version, Version::V2);
    assert_eq!(loc.dirs.len(), 3, "{:?}", loc.dirs);
    assert_eq!(effective_limits(&loc, "259:0").unwrap(), WANT);
    assert_eq!(counters(&loc, "259:0").unwrap(), Some(COUNTS));
    assert_eq!(pressure(&loc).unwrap().get("some"), Some(&2.5));

    let v1 = tempfile::tempdir().unwrap();
    v1_tree(&v1.path().join("blkio"));
    let loc1 = locate(v1.path(), &pg).unwrap().unwrap();
    assert_eq!(loc1.version, Version::V1);
    assert_eq!(effective_limits(&loc1, "259:0").unwrap(), WANT);
    assert_eq!(counters(&loc1, "259:0").unwrap(), Some(COUNTS));
    // 8:0 has "0" in v1 (no limit) and riops=7 only in the v2 fixture.
    assert_eq!(effective_limits(&loc1, "8:0").unwrap(), Limits::default());
    assert_eq!(effective_limits(&loc, "8:0").unwrap().read_iops, Some(7));
}

#[test]
fn hybrid_without_the_v2_io_controller_reads_v1() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("unified")).unwrap();
    std::fs::write(
        root.path().join("unified/cgroup.controllers"),
        "cpu memory pids",
    )
    .unwrap();
    v1_tree(&root.path().join("blkio"));
    let pg = ProcCgroups {
        v2: Some("/system.slice/postgresql.service".into()),
        blkio: Some("/system.slice/postgresql.service".into()),
    };
    let loc = locate(root.path(), &pg).unwrap().unwrap();
    assert_eq!(loc.version, Version::V1);
    assert_eq!(effective_limits(&loc, "259:0").unwrap(), WANT);

    // With the io controller in the unified tree, v2 wins.
    v2_tree(&root.path().join("unified"), "cpu io memory");
    assert_eq!(
        locate(root.path(), &pg).unwrap().unwrap().version,
        Version::V2
    );
}

#[test]
fn root_and_unlimited_cgroups_have_no_limits() {
    let root = tempfile::tempdir().unwrap();
    v2_tree(root.path(), "io");
    let at_root = ProcCgroups {
        v2: Some("/".into()),
        blkio: None,
    };
    let loc = locate(root.path(), &at_root).unwrap().unwrap();
    assert_eq!(loc.dirs, vec![root.path().to_path_buf()]);
    assert_eq!(effective_limits(&loc, "259:0").unwrap(), Limits::default());
    // An empty root (cgroup reading disabled) locates nothing.
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(locate(empty.path(), &at_root).unwrap(), None);
}

#[test]
fn parsers() {
    let m = parse_io_max("259:1 rbps=max wbps=max riops=2000 wiops=100\n").unwrap();
    assert_eq!(
        m["259:1"],
        Limits {
            read_iops: Some(2000),
            write_iops: Some(100),
            read_bps: None,
            write_bps: None
        }
    );
    assert_eq!(
        m["259:1"].resources(),
        vec![(Resource::ReadIops, 2000), (Resource::WriteIops, 100)]
    );
    let cg = parse_proc_cgroup(
        "12:blkio:/docker/abc\n11:cpu,cpuacct:/docker/abc\n0::/system.slice/docker-abc.scope\n",
    )
    .unwrap();
    assert_eq!(cg.blkio.as_deref(), Some("/docker/abc"));
    assert_eq!(cg.v2.as_deref(), Some("/system.slice/docker-abc.scope"));
    assert_eq!(parse_proc_cgroup("7:blkio:/\n").unwrap().v2, None);
}

#[test]
fn a_cgroup_that_does_not_exist_is_not_read_from_its_parent() {
    let root = tempfile::tempdir().unwrap();
    v2_tree(root.path(), "io");
    let typo = ProcCgroups {
        v2: Some("/system.slice/postgresql.servic".into()),
        blkio: None,
    };
    assert_eq!(locate(root.path(), &typo).unwrap(), None);
}

fn pg() -> ProcCgroups {
    ProcCgroups {
        v2: Some("/system.slice/postgresql.service".into()),
        blkio: Some("/system.slice/postgresql.service".into()),
    }
}

#[test]
fn an_absent_limit_file_is_no_limit_an_unreadable_one_is_an_error() {
    let root = tempfile::tempdir().unwrap();
    v2_tree(root.path(), "io");
    // The root cgroup has no io.max on a real host: no limit at that level.
    std::fs::remove_file(root.path().join("io.max")).unwrap();
    let loc = locate(root.path(), &pg()).unwrap().unwrap();
    assert_eq!(effective_limits(&loc, "259:0").unwrap(), WANT);

    // Malformed at one level: the whole answer is unknown, not the looser
    // limit of the other levels.
    let slice = root.path().join("system.slice/io.max");
    std::fs::write(&slice, "259:0 rbps=max wbps=max riops=lots wiops=max\n").unwrap();
    let e = effective_limits(&loc, "259:0").unwrap_err();
    assert_eq!((e.kind, e.cause.label()), (Kind::CgroupLimits, "parse"));
    assert_eq!(e.path, slice);

    // A directory where the file should be: EISDIR.
    std::fs::remove_file(&slice).unwrap();
    std::fs::create_dir(&slice).unwrap();
    let e = effective_limits(&loc, "259:0").unwrap_err();
    assert_eq!(e.cause.label(), "EISDIR");

    // v1: a kernel without blkio throttling has no throttle files at all.
    let v1 = tempfile::tempdir().unwrap();
    v1_tree(&v1.path().join("blkio"));
    let loc1 = locate(v1.path(), &pg()).unwrap().unwrap();
    for d in &loc1.dirs {
        std::fs::remove_file(d.join("blkio.throttle.read_iops_device")).unwrap();
    }
    assert_eq!(effective_limits(&loc1, "259:0").unwrap().read_iops, None);
    std::fs::write(
        loc1.dirs[0].join("blkio.throttle.write_iops_device"),
        "259:0\n",
    )
    .unwrap();
    assert_eq!(
        effective_limits(&loc1, "259:0").unwrap_err().cause.label(),
        "parse"
    );
}

#[test]
fn counters_and_pressure_absent_or_broken() {
    let root = tempfile::tempdir().unwrap();
    v2_tree(root.path(), "io");
    let loc = locate(root.path(), &pg()).unwrap().unwrap();
    let d = root.path().join("system.slice/postgresql.service");
    // Other controllers' fields (io.cost's cost.vrate=...) are skipped.
    std::fs::write(
        d.join("io.stat"),
        "259:0 rbytes=8192 wbytes=16384 rios=1 wios=2 dbytes=0 dios=0 cost.vrate=100.00 cost.usage=3\n",
    )
    .unwrap();
    assert_eq!(counters(&loc, "259:0").unwrap(), Some(COUNTS));
    // A disk the cgroup never touched has no line: no figure.
    assert_eq!(counters(&loc, "8:16").unwrap(), None);
    std::fs::write(d.join("io.stat"), "259:0 rbytes=x wbytes=0 rios=0 wios=0\n").unwrap();
    let e = counters(&loc, "259:0").unwrap_err();
    assert_eq!((e.kind, e.cause.label()), (Kind::CgroupCounters, "parse"));
    // io.stat absent: the io controller is not enabled for this cgroup.
    std::fs::remove_file(d.join("io.stat")).unwrap();
    assert_eq!(counters(&loc, "259:0").unwrap(), None);

    std::fs::write(d.join("io.pressure"), "some avg10=0.00 total=abc\n").unwrap();
    let e = pressure(&loc).unwrap_err();
    assert_eq!((e.kind, e.cause.label()), (Kind::CgroupPressure, "parse"));
    // A kernel without PSI has no io.pressure.
    std::fs::remove_file(d.join("io.pressure")).unwrap();
    assert!(pressure(&loc).unwrap().is_empty());
}

#[test]
fn cgroup_root_off_missing_or_not_a_hierarchy() {
    let dir = tempfile::tempdir().unwrap();
    // Empty: cgroup reading is off, not an error.
    assert_eq!(detect(dir.path()).unwrap(), None);
    // Missing, a file: errors with the errno.
    let e = detect(&dir.path().join("nope")).unwrap_err();
    assert_eq!((e.kind, e.cause.label()), (Kind::CgroupLimits, "ENOENT"));
    std::fs::write(dir.path().join("f"), "").unwrap();
    assert_eq!(
        detect(&dir.path().join("f")).unwrap_err().cause.label(),
        "ENOTDIR"
    );
    // Files but no hierarchy: a wrong cgroup_root, not a host without caps.
    let e = detect(dir.path()).unwrap_err();
    assert!(matches!(e.cause, Cause::NotCgroup), "{e}");
    // A v2 tree without the io controller and no blkio: no caps can exist.
    let v2 = tempfile::tempdir().unwrap();
    std::fs::write(v2.path().join("cgroup.controllers"), "cpu memory").unwrap();
    let l = detect(v2.path()).unwrap().unwrap();
    assert_eq!(l.locate(&pg()), None);
    // cgroup.controllers that cannot be read is an error.
    let bad = tempfile::tempdir().unwrap();
    std::fs::create_dir(bad.path().join("cgroup.controllers")).unwrap();
    assert_eq!(detect(bad.path()).unwrap_err().cause.label(), "EISDIR");
}

#[test]
fn strict_parsers() {
    assert!(parse_io_max("259:0 riops=2000 wiops=100\n").is_ok());
    assert!(parse_io_max("259:0 riops=2k\n").is_err());
    assert!(parse_io_max("sda riops=2000\n").is_err());
    assert!(parse_io_max("259:0 riops\n").is_err());
    // Keys a newer kernel might add are not errors.
    assert!(parse_io_max("259:0 riops=5 newkey=1.5\n").is_ok());
    assert!(parse_io_max("").unwrap().is_empty());
    assert!(parse_v1_throttle("8:0 0\n259:0 100\n").is_ok());
    assert!(parse_v1_throttle("8:0 x\n").is_err());
    let s = parse_v1_serviced("259:0 Read 1\n259:0 Write 2\nTotal 3\n").unwrap();
    assert_eq!(s["259:0"], (1, 2));
    assert!(parse_v1_serviced("259:0 Read many\n").is_err());
    assert!(parse_pressure("some avg10=0.00 total=5\nfull total=1\n").is_ok());
    assert!(parse_pressure("full avg10=0.00\n").is_err());
    assert!(parse_proc_cgroup("garbage\n").is_err());
    assert!(parse_proc_cgroup("x:blkio:/a\n").is_err());
}

#[test]
fn alone_means_no_other_process_is_counted() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("pgse");
    std::fs::create_dir_all(d.join("child")).unwrap();
    let loc = |version| Located {
        version,
        path: "/pgse".into(),
        dirs: vec![d.clone(), t.path().to_path_buf()],
    };
    // Unreadable: not attributable.
    assert!(!alone(&loc(Version::V1), 42));
    std::fs::write(d.join("cgroup.procs"), "42\n").unwrap();
    assert!(alone(&loc(Version::V1), 42));
    assert!(!alone(&loc(Version::V1), 7));
    // v2 counts descendants: a process below makes the figure shared; v1
    // counts the cgroup alone.
    std::fs::write(d.join("child/cgroup.procs"), "99\n").unwrap();
    assert!(!alone(&loc(Version::V2), 42));
    assert!(alone(&loc(Version::V1), 42));
    std::fs::write(d.join("child/cgroup.procs"), "").unwrap();
    assert!(alone(&loc(Version::V2), 42));
    std::fs::write(d.join("cgroup.procs"), "42\n4242\n").unwrap();
    assert!(!alone(&loc(Version::V1), 42));
}
