//! cgroup v2 limits read from a fixture tree (`cgroup_root`) for a volume
//! with a configured cgroup path, on this machine's real disk, plus
//! provisioned limits: no root needed.

use crate::common;

use std::time::Duration;

use common::*;

#[test]
fn configured_cgroup_and_provisioned_limits() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    let disk = disk_of(&vol);
    let cg = dir.path().join("cgroup");
    std::fs::create_dir_all(cg.join("system.slice/postgresql.service")).unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "cpu io memory").unwrap();
    std::fs::write(
        cg.join("system.slice/io.max"),
        format!("{disk} rbps=max wbps=104857600 riops=3000 wiops=max\n"),
    )
    .unwrap();
    std::fs::write(
        cg.join("system.slice/postgresql.service/io.max"),
        format!("{disk} rbps=max wbps=max riops=max wiops=500\n"),
    )
    .unwrap();
    std::fs::write(
        cg.join("system.slice/postgresql.service/io.stat"),
        format!("{disk} rbytes=0 wbytes=0 rios=0 wios=0\n"),
    )
    .unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "limits_interval = \"500ms\"\ncgroup_root = \"{}\"\n\
             [[volume]]\nname = \"v\"\npath = \"{}\"\ninterval = \"200ms\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n\
             cgroup = \"/system.slice/postgresql.service\"\nprovisioned_iops = 3000\nprovisioned_throughput = \"125MiB\"\n",
            cg.display(),
            vol.display()
        ),
    )
    .unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    let m = ex.wait_for("limits with utilization", Duration::from_secs(30), |m| {
        sample(m, "pgstorage_io_limit_utilization_ratio{volume=\"v\",source=\"provisioned\",resource=\"iops\"}").is_some()
    });
    let want = [
        ("cgroup", "read_iops", 3000.0),
        ("cgroup", "write_iops", 500.0),
        ("cgroup", "write_bytes_per_second", 104_857_600.0),
        ("provisioned", "iops", 3000.0),
        ("provisioned", "bytes_per_second", 131_072_000.0),
    ];
    for (source, resource, v) in want {
        let got = sample(
            &m,
            &format!(
                "pgstorage_io_limit{{volume=\"v\",source=\"{source}\",resource=\"{resource}\"}}"
            ),
        );
        assert_eq!(got, Some(v), "{source} {resource}:\n{m}");
    }
    assert!(
        sample(
            &m,
            "pgstorage_io_limit{volume=\"v\",source=\"cgroup\",resource=\"read_bytes_per_second\"}"
        )
        .is_none(),
        "max is no limit"
    );
    assert!(m.contains("pgstorage_io_limit_cgroup_info{volume=\"v\",scope=\"configured\",cgroup=\"/system.slice/postgresql.service\",version=\"v2\""), "{m}");
    // The 500 write-IOPS cap is PostgreSQL's cgroup's alone and 3000 IOPS
    // provisioned dwarf the probes' 11.2 planned writes/s: no stretch.
    assert_eq!(
        sample(&m, "pgstorage_probe_slowdown_ratio{volume=\"v\"}"),
        Some(1.0),
        "{m}"
    );
    // The cap basis: the configured cgroup's 500 write IOPS bind before
    // the provisioned 3,000 IOPS, over the default 2 device writes per
    // commit (the exporter's own count is not attributable here).
    assert_eq!(
        sample(
            &m,
            "pgstorage_commit_ceiling_per_second{volume=\"v\",basis=\"cap\"}"
        ),
        Some(250.0),
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            "pgstorage_commit_ceiling_cap_info{volume=\"v\",source=\"cgroup\",resource=\"write_iops\",writes_per_commit=\"default\"}"
        ),
        Some(1.0),
        "{m}"
    );
    let u = sample(&m, "pgstorage_io_limit_utilization_ratio{volume=\"v\",source=\"cgroup\",resource=\"write_iops\"}").unwrap();
    assert_eq!(u, 0.0, "the fixture's io.stat does not move");
    // Every file the pass needed was read: the collector succeeded.
    assert_eq!(
        sample(&m, "pgstorage_collector_success{collector=\"limits\"}"),
        Some(1.0),
        "{m}"
    );
    assert!(
        !m.contains("pgstorage_limits_read_errors_total{"),
        "no failed reads: {m}"
    );
    let info = samples_with(&m, "pgstorage_volume_info", &["volume=\"v\""]);
    assert!(
        info[0].0.contains("disk=\"") && !info[0].0.contains("disk=\"unknown\""),
        "{}",
        info[0].0
    );
}

/// A write-IOPS cap given only in the configuration (a cloud volume's
/// provisioned figure, which the guest cannot read) sets the cap commit
/// ceiling; a combined `iops` cap takes part as well, and the tighter one
/// binds. cgroup reading is off.
#[test]
fn a_provisioned_write_iops_cap_sets_the_cap_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    let empty = dir.path().join("no-cgroups");
    std::fs::create_dir(&empty).unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "limits_interval = \"500ms\"\ncgroup_root = \"{}\"\n\
             [[volume]]\nname = \"v\"\npath = \"{}\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n\
             provisioned_write_iops = 400\nprovisioned_iops = 3000\n",
            empty.display(),
            vol.display()
        ),
    )
    .unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    let m = ex.wait_for("the cap ceiling", Duration::from_secs(30), |m| {
        sample(
            m,
            "pgstorage_commit_ceiling_per_second{volume=\"v\",basis=\"cap\"}",
        )
        .is_some()
    });
    assert_eq!(
        sample(
            &m,
            "pgstorage_commit_ceiling_per_second{volume=\"v\",basis=\"cap\"}"
        ),
        Some(200.0),
        "{m}"
    );
    let info = samples_with(&m, "pgstorage_commit_ceiling_cap_info", &[]);
    assert_eq!(
        info,
        vec![(
            "pgstorage_commit_ceiling_cap_info{volume=\"v\",source=\"provisioned\",resource=\"write_iops\",writes_per_commit=\"default\"}".to_string(),
            1.0
        )],
        "{m}"
    );
}

/// A cgroup whose io.max cannot be parsed and whose io.stat is a
/// directory: its limits are unknown, not absent. The collector says so in
/// its health gauge and error counter, and the log warns once per file,
/// not once per pass.
#[test]
fn unreadable_cgroup_files_fail_the_collector_and_warn_once() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    let disk = disk_of(&vol);
    let cg = dir.path().join("cgroup");
    let svc = cg.join("system.slice/postgresql.service");
    std::fs::create_dir_all(&svc).unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "cpu io memory").unwrap();
    std::fs::write(
        svc.join("io.max"),
        format!("{disk} rbps=max wbps=max riops=max wiops=a-hundred\n"),
    )
    .unwrap();
    // Tests run as root, so permission bits would not stop the read: a
    // directory where the file belongs fails it (EISDIR).
    std::fs::create_dir(svc.join("io.stat")).unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "limits_interval = \"300ms\"\ncgroup_root = \"{}\"\n\
             [[volume]]\nname = \"v\"\npath = \"{}\"\nprobes = [\"read\"]\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n\
             cgroup = \"/system.slice/postgresql.service\"\nprovisioned_iops = 3000\n",
            cg.display(),
            vol.display()
        ),
    )
    .unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    let parse = "pgstorage_limits_read_errors_total{kind=\"cgroup_limits\",cause=\"parse\"}";
    let eisdir = "pgstorage_limits_read_errors_total{kind=\"cgroup_counters\",cause=\"EISDIR\"}";
    // Several passes.
    let m = ex.wait_for("five failing limits passes", Duration::from_secs(30), |m| {
        sample(m, parse).is_some_and(|n| n >= 5.0)
    });
    assert_eq!(
        sample(&m, "pgstorage_collector_success{collector=\"limits\"}"),
        Some(0.0),
        "{m}"
    );
    assert!(sample(&m, eisdir).is_some_and(|n| n >= 4.0), "{m}");
    // Unknown, so no cgroup limit series; the provisioned one stays.
    assert!(!m.contains("source=\"cgroup\""), "{m}");
    assert_eq!(
        sample(
            &m,
            "pgstorage_io_limit{volume=\"v\",source=\"provisioned\",resource=\"iops\"}"
        ),
        Some(3000.0)
    );
    let log = ex.log();
    let warnings = |file: &str| {
        log.lines()
            .filter(|l| l.contains("cannot read a file the limits depend on"))
            .filter(|l| l.contains(&svc.join(file).display().to_string()))
            .count()
    };
    assert_eq!(warnings("io.max"), 1, "{log}");
    assert_eq!(warnings("io.stat"), 1, "{log}");

    // Fixed: the collector recovers, the limits come back and the log
    // says so.
    std::fs::write(
        svc.join("io.max"),
        format!("{disk} rbps=max wbps=max riops=max wiops=100\n"),
    )
    .unwrap();
    std::fs::remove_dir(svc.join("io.stat")).unwrap();
    let m = ex.wait_for(
        "the limits collector recovered",
        Duration::from_secs(30),
        |m| sample(m, "pgstorage_collector_success{collector=\"limits\"}") == Some(1.0),
    );
    assert_eq!(
        sample(
            &m,
            "pgstorage_io_limit{volume=\"v\",source=\"cgroup\",resource=\"write_iops\"}"
        ),
        Some(100.0),
        "{m}"
    );
    // The counter is cumulative: it keeps what failed.
    assert!(sample(&m, parse).is_some_and(|n| n >= 5.0));
    ex.wait_log("the file reads again", Duration::from_secs(10));
}

#[test]
fn bad_cgroup_path_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[volume]]\nname = \"v\"\npath = \"{}\"\ncgroup = \"system.slice\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["--config.file", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(":4: volume[0].cgroup: \"system.slice\" is not a cgroup path"),
        "{err}"
    );
}

/// A provisioned write-IOPS cap counts the exporter's own writes too: the
/// probe schedule is stretched to keep them under 2 % of it, said in a log
/// line and a gauge, and the lone probes really come less often.
#[test]
fn a_cap_that_counts_the_probes_stretches_their_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    let cfg = dir.path().join("c.toml");
    // 1 lone commit per 200 ms + 24 per 40 s = 5.6 commits/s; at 2 device
    // writes each (the assumption until measured) 11.2 writes/s, 11.2 % of
    // 100 write IOPS: stretched 5.6 times to reach 2 %.
    std::fs::write(
        &cfg,
        format!(
            "limits_interval = \"500ms\"\n\
             [[volume]]\nname = \"v\"\npath = \"{}\"\ninterval = \"200ms\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n\
             provisioned_write_iops = 100\n",
            vol.display()
        ),
    )
    .unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    let m = ex.wait_for("a stretched schedule", Duration::from_secs(30), |m| {
        sample(m, "pgstorage_probe_slowdown_ratio{volume=\"v\"}").is_some_and(|r| r > 1.0)
    });
    let r = sample(&m, "pgstorage_probe_slowdown_ratio{volume=\"v\"}").unwrap();
    // 5.6 with the assumed 2 writes per commit; the measured figure (when
    // the exporter has a cgroup of its own) moves it, within reason.
    assert!((2.0..30.0).contains(&r), "slowdown {r}");
    ex.wait_log("probe schedule stretched", Duration::from_secs(10));
    // Lone commits now come every 200 ms x r (at least 0.4 s): over 4 s at
    // most 11, where the configured schedule would make 20.
    let lone = |m: &str| {
        sample(
            m,
            "pgstorage_probe_seconds_count{volume=\"v\",op=\"commit\",phase=\"after_idle\"}",
        )
        .unwrap_or(0.0)
    };
    let before = lone(&ex.metrics());
    std::thread::sleep(Duration::from_secs(4));
    let after = lone(&ex.metrics());
    assert!(
        after - before <= 11.0 && after > before,
        "lone commits in 4 s: {before} -> {after} at slowdown {r}"
    );
}
