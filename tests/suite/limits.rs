//! IO caps for real: PostgreSQL 18 with its WAL on a loop device, inside a
//! cgroup v1 blkio group with write and read IOPS limits on that device; the
//! exporter in a group of its own (so its IO counters are its own).

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::loopdev;
use common::stack::Stack;
use common::*;

/// The postmaster and every process it started.
fn postgres_pids(data_dir: &Path) -> Vec<String> {
    let pm = std::fs::read_to_string(data_dir.join("postmaster.pid")).unwrap();
    let pm = pm.lines().next().unwrap().trim().to_string();
    let mut pids = vec![pm.clone()];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Ok(stat) = std::fs::read_to_string(e.path().join("stat"))
            && let Some(rest) = stat.rsplit_once(") ")
            && rest.1.split_whitespace().nth(1) == Some(pm.as_str())
        {
            pids.push(name);
        }
    }
    pids
}

fn tps(pgbench_out: &str) -> f64 {
    pgbench_out
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no tps in {pgbench_out}"))
}

#[test]
fn write_iops_cap_on_the_wal_device_is_the_commit_ceiling() {
    if !loopdev::can_run("the IO-cap tests", true) {
        return;
    }
    let mut fx = loopdev::LoopVolume::new(512 << 20, true);
    let waldir = fx.mnt.join("pg_wal");
    // The groups exist before PostgreSQL starts; nothing is in them until
    // the setup moves PostgreSQL's processes and the test the exporter.
    let pg_group = fx.group(
        "pgse-pg",
        &[("write_iops_device", 100), ("read_iops_device", 2000)],
    );
    let exp_group = fx.group("pgse-exp", &[]);
    let Some(stack) = Stack::builder()
        .waldir(&waldir)
        .password("Mon-Pa55")
        .role("mon", true)
        .setup(|pg| {
            for (i, pid) in postgres_pids(pg.data_dir()).into_iter().enumerate() {
                match std::fs::write(pg_group.join("cgroup.procs"), &pid) {
                    Ok(()) => {}
                    // A short-lived child (a backend that just ended) is gone: fine.
                    // The postmaster (first) must move.
                    Err(e) if i > 0 && e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) => panic!("moving pid {pid}: {e}"),
                }
            }
        })
        .config_head(
            "window = \"1m\"\nlimits_interval = \"1s\"\n\
             [defaults]\ninterval = \"200ms\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n",
        )
        .cluster("c", "mon", "scrape_interval = \"500ms\"")
        .start()
    else {
        return;
    };
    let (pg, ex) = (&stack.pg, &stack.ex);
    std::fs::write(exp_group.join("cgroup.procs"), ex.child.id().to_string()).unwrap();

    let m = ex.wait_for(
        "both cgroup limits and a measured writes-per-probe on c/wal",
        Duration::from_secs(60),
        |m| {
            sample(
                m,
                "pgstorage_io_limit{volume=\"c/wal\",source=\"cgroup\",resource=\"write_iops\"}",
            ) == Some(100.0)
                && sample(
                    m,
                    "pgstorage_io_limit{volume=\"c/wal\",source=\"cgroup\",resource=\"read_iops\"}",
                ) == Some(2000.0)
                && sample(
                    m,
                    "pgstorage_probe_device_writes_per_commit{volume=\"c/wal\"}",
                )
                .is_some()
        },
    );
    assert!(
        m.contains(&format!("pgstorage_io_limit_cgroup_info{{volume=\"c/wal\",scope=\"postgres:c\",cgroup=\"/{}\",version=\"v1\"", pg_group.file_name().unwrap().to_string_lossy())),
        "{m}"
    );
    // The data directory's filesystem has no cap.
    assert!(
        sample(
            &m,
            "pgstorage_io_limit{volume=\"c/data\",source=\"cgroup\",resource=\"write_iops\"}"
        )
        .is_none()
    );

    // The utilization is over the last limits pass (1 s): read while
    // pgbench runs, from its 3rd second to its 14th, not after it, when the
    // last pass may hold the end of the load or none of it.
    let util_series = "pgstorage_io_limit_utilization_ratio{volume=\"c/wal\",source=\"cgroup\",resource=\"write_iops\"}";
    let done = std::sync::atomic::AtomicBool::new(false);
    let (out, mut utils) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let start = std::time::Instant::now();
            let mut utils = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let t = start.elapsed();
                if t > Duration::from_secs(3) && t < Duration::from_secs(14) {
                    utils.push(sample(&ex.metrics(), util_series).unwrap_or(0.0));
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            utils
        });
        let out = pg.pgbench_inserts(1, 15);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (out, sampler.join().unwrap())
    });
    let measured = tps(&out);
    let m = ex.metrics();
    utils.sort_by(f64::total_cmp);
    // The median of the readings during the run.
    let util = utils.get(utils.len() / 2).copied();
    let wpp = sample(
        &m,
        "pgstorage_probe_device_writes_per_commit{volume=\"c/wal\"}",
    )
    .unwrap();
    let cap = sample(
        &m,
        "pgstorage_commit_ceiling_per_second{volume=\"c/wal\",basis=\"cap\"}",
    )
    .unwrap();
    // PostgreSQL's cgroup throttle, over the writes the exporter's own
    // cgroup counted per probe.
    assert_eq!(
        sample(
            &m,
            "pgstorage_commit_ceiling_cap_info{volume=\"c/wal\",source=\"cgroup\",resource=\"write_iops\",writes_per_commit=\"measured\"}"
        ),
        Some(1.0),
        "{m}"
    );
    assert!(
        (cap - 100.0 / wpp).abs() < 1e-9,
        "cap ceiling {cap}, {wpp} writes per probe"
    );
    let postgres = sample(
        &m,
        "pgstorage_commit_ceiling_per_second{volume=\"c/wal\",basis=\"postgres\"}",
    );
    let in_force = sample(
        &m,
        "pgstorage_commit_ceiling_in_force_per_second{volume=\"c/wal\"}",
    )
    .unwrap();
    eprintln!(
        "pgbench 1 client: {measured:.1} TPS; writes/probe {wpp:.2}; cap ceiling {cap:.1}; postgres ceiling {postgres:?}; \
         in force {in_force:.1}; write_iops utilization {util:?} (median of {utils:.2?})"
    );
    assert!(
        util.unwrap_or(0.0) > 0.8,
        "utilization under pgbench: {util:?} (median of {utils:?})"
    );
    assert!(
        ((in_force - measured) / measured).abs() <= 0.25,
        "ceiling in force {in_force} vs {measured} TPS"
    );
}
