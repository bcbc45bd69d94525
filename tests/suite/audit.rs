//! The storage-configuration audit in the running daemon: fixture /proc,
//! /sys and boot-configuration trees (`proc_root`, `sys_root`,
//! `host_root`) under which every host and volume check fires, and one
//! under which none does, scraped (`every_check_has_a_daemon_test` keeps
//! the list complete); `audit.ignore` per volume and per cluster;
//! re-evaluation on SIGHUP; tmpfs and `nobarrier` volumes on the real
//! roots; and real PostgreSQL 15 and 18 with settings set and reset, on a
//! host whose disk and huge pages the fixture roots describe.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::pg::PgKind;
use common::stack::Stack;
use common::*;
use pg_storage_exporter::audit::{CHECKS, Scope};

/// Probe settings every test volume uses: fast, small, no reserve.
const PROBE_KEYS: &str =
    "interval = \"200ms\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"\n";

/// What the fixture mountinfo says about one volume's filesystem.
struct Mount {
    fstype: &'static str,
    mount_opts: &'static str,
    super_opts: &'static str,
}

const fn mount(fstype: &'static str, mount_opts: &'static str, super_opts: &'static str) -> Mount {
    Mount {
        fstype,
        mount_opts,
        super_opts,
    }
}

/// The fixture volumes: (name, under /dev/shm). A volume in memory syncs
/// in about a microsecond, really, whatever the fixture says its
/// filesystem is: that is the probe's honest `sync_too_fast` evidence
/// behind `volatile_write_cache`. The other lives on the disk under the
/// temp directory, whose syncs take a real round trip. `Fixture::mounts`
/// follows this order.
const VOLUMES: [(&str, bool); 3] = [("v", false), ("w", true), ("m", true)];

/// One state of the host as the fixture roots show it, and the host and
/// volume codes the audit must report for it, in any scope.
struct Fixture {
    /// /proc/sys/vm values (64 GiB of RAM in /proc/meminfo).
    vm: [(&'static str, u32); 7],
    /// HugePages_Total in /proc/meminfo.
    hugepages_total: u32,
    thp: &'static str,
    /// `host_root`/etc/sysctl.d/90-postgresql.conf.
    boot_conf: &'static str,
    /// The queue/ of the one disk under every volume.
    scheduler: &'static str,
    rotational: u32,
    write_cache: &'static str,
    read_ahead_kb: u32,
    mounts: [Mount; 3],
    expect: &'static [&'static str],
}

const GOOD_VM: [(&str, u32); 7] = [
    ("swappiness", 1),
    ("overcommit_memory", 2),
    ("zone_reclaim_mode", 0),
    ("dirty_ratio", 5),
    ("dirty_bytes", 0),
    ("dirty_background_ratio", 1),
    ("dirty_background_bytes", 0),
];

const GOOD_BOOT: &str = "vm.swappiness = 1\nvm.overcommit_memory = 2\n\
                         vm.dirty_ratio = 5\nvm.dirty_background_ratio = 1\n";

const GOOD_MOUNTS: [Mount; 3] = [
    mount("ext4", "rw,noatime", "rw,data=ordered"),
    mount("xfs", "rw,noatime", "rw"),
    mount("xfs", "rw,noatime", "rw"),
];

/// Every host and volume check fires but the reboot one: running values
/// that are all bad have nothing a reboot could undo.
const BAD: Fixture = Fixture {
    vm: [
        ("swappiness", 60),
        ("overcommit_memory", 0),
        ("zone_reclaim_mode", 1),
        ("dirty_ratio", 20),
        ("dirty_bytes", 0),
        ("dirty_background_ratio", 10),
        ("dirty_background_bytes", 0),
    ],
    hugepages_total: 0,
    thp: "[always] madvise never",
    boot_conf: "",
    scheduler: "mq-deadline kyber [bfq] none",
    rotational: 0,
    write_cache: "write back",
    read_ahead_kb: 4096,
    mounts: [
        mount("ext4", "rw,relatime", "rw,nobarrier,data=writeback"),
        // atime is silenced for w in the configuration.
        mount("btrfs", "rw,relatime", "rw"),
        mount("tmpfs", "rw,noatime", "rw"),
    ],
    expect: &[
        "thp_always",
        "dirty_ratio_large",
        "dirty_background_ratio_large",
        "swappiness_high",
        "zone_reclaim_on",
        "overcommit_not_strict",
        "memory_filesystem",
        "barriers_off",
        "volatile_write_cache",
        "ext4_data_writeback",
        "scheduler_on_ssd",
        "read_ahead_large",
        "atime",
        "filesystem_choice",
    ],
};

/// Tuned by hand, and the boot configuration says nothing.
const HAND_TUNED: Fixture = Fixture {
    vm: GOOD_VM,
    hugepages_total: 0,
    thp: "always [madvise] never",
    boot_conf: "# nothing for vm.*\nkernel.panic = 10\n",
    scheduler: "[none] mq-deadline",
    rotational: 0,
    write_cache: "write through",
    read_ahead_kb: 128,
    mounts: GOOD_MOUNTS,
    expect: &["sysctl_not_persistent"],
};

/// Tuned, and made at boot too.
const GOOD: Fixture = Fixture {
    boot_conf: GOOD_BOOT,
    expect: &[],
    ..HAND_TUNED
};

/// The host of the PostgreSQL tests as the fixture roots show it: tuned,
/// its disk non-rotational, no huge pages reserved, so that the servers'
/// default `huge_pages = try` would run on small pages.
const SSD: Fixture = GOOD;

/// Huge pages the fixture reserves: the test servers, with 32 MB of
/// shared buffers, need about 20 of 2 MiB (the test reads their
/// `shared_memory_size_in_huge_pages` and fails when it is more).
const RESERVED_HUGE_PAGES: u32 = 1024;

/// [`SSD`] with huge pages reserved.
const SSD_HUGE_PAGES: Fixture = Fixture {
    hugepages_total: RESERVED_HUGE_PAGES,
    ..GOOD
};

/// [`SSD`] on a spinning disk.
const SPINNING: Fixture = Fixture {
    rotational: 1,
    ..GOOD
};

/// The triggering fixtures: together they must show every host and
/// volume code (see `every_check_has_a_daemon_test`).
const TRIGGERING: [&Fixture; 2] = [&BAD, &HAND_TUNED];

/// The fixture volumes' directories: one in the temp directory, the
/// others in a temp directory under /dev/shm.
struct Dirs {
    _disk: tempfile::TempDir,
    _shm: tempfile::TempDir,
    vols: Vec<std::path::PathBuf>,
    root: std::path::PathBuf,
}

fn shm_is_tmpfs() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.contains(" /dev/shm ") && l.contains(" - tmpfs "))
}

fn dirs() -> Dirs {
    assert!(
        shm_is_tmpfs(),
        "/dev/shm is not a tmpfs: the fixture needs a volume whose syncs are really instant"
    );
    let disk = tempfile::tempdir().unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let vols = VOLUMES
        .iter()
        .map(|(name, in_memory)| {
            let d = if *in_memory { shm.path() } else { disk.path() }.join(name);
            std::fs::create_dir(&d).unwrap();
            d
        })
        .collect();
    let root = disk.path().join("roots");
    Dirs {
        _disk: disk,
        _shm: shm,
        vols,
        root,
    }
}

/// Writes `text` to `path` whole: a running daemon's audit pass never
/// reads a file half rewritten (which would make a finding vanish for a
/// pass and a wait for "gone" pass early).
fn put(path: &Path, text: &str) {
    let dir = path.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let tmp = dir.join(format!(
        ".{}.new",
        path.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Writes proc/, sys/ and host/ under `root`. Each directory of `mounted`
/// is the mount point of a filesystem of `f.mounts`, in order; all but
/// tmpfs have the disk under the first one as their source, as btrfs or a
/// bind mount would (the exporter then finds that disk through
/// `sys_root`).
fn write_fixture(root: &Path, mounted: &[std::path::PathBuf], f: &Fixture) {
    let (disk_mm, disk_dir) = fs_and_disk_dir(&mounted[0]);
    let disk = disk_dir.file_name().unwrap().to_string_lossy().into_owned();
    let node = Path::new("/dev").join(&disk);
    assert!(
        std::fs::metadata(&node)
            .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
            .unwrap_or(false),
        "{} is not a block device node: the fixture needs it as a mount source",
        node.display()
    );
    for (k, v) in f.vm {
        put(&root.join("proc/sys/vm").join(k), &format!("{v}\n"));
    }
    put(
        &root.join("proc/meminfo"),
        &format!(
            "MemTotal:       67108864 kB\nHugePages_Total: {:>7}\n",
            f.hugepages_total
        ),
    );
    put(&root.join("proc/cmdline"), "BOOT_IMAGE=/vmlinuz ro quiet\n");
    let mut mountinfo = String::new();
    for (i, (vol, m)) in mounted.iter().zip(&f.mounts).enumerate() {
        let mm = majmin_of(vol);
        let source = if m.fstype == "tmpfs" {
            "tmpfs".to_string()
        } else {
            node.display().to_string()
        };
        mountinfo += &format!(
            "{} 1 {mm} / {} {} shared:1 - {} {source} {}\n",
            30 + i,
            vol.display(),
            m.mount_opts,
            m.fstype,
            m.super_opts
        );
    }
    put(&root.join("proc/self/mountinfo"), &mountinfo);
    put(
        &root.join("sys/kernel/mm/transparent_hugepage/enabled"),
        &format!("{}\n", f.thp),
    );
    let block = root.join("sys/block").join(&disk);
    let disk_majmin = std::fs::read_to_string(disk_dir.join("dev")).unwrap();
    for (file, text) in [
        ("dev", disk_majmin.trim().to_string()),
        ("queue/scheduler", f.scheduler.to_string()),
        ("queue/rotational", f.rotational.to_string()),
        ("queue/write_cache", f.write_cache.to_string()),
        ("queue/read_ahead_kb", f.read_ahead_kb.to_string()),
    ] {
        put(&block.join(file), &format!("{text}\n"));
    }
    // The exporter resolves a MAJ:MIN to its disk through sys_root too.
    let links = root.join("sys/dev/block");
    std::fs::create_dir_all(&links).unwrap();
    for mm in [disk_mm.as_str(), disk_majmin.trim()] {
        let link = links.join(mm);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("../../block/{disk}"), &link).unwrap();
        }
    }
    put(
        &root.join("host/etc/sysctl.d/90-postgresql.conf"),
        f.boot_conf,
    );
}

/// The configuration keys that point the exporter at the fixture under
/// `root`.
fn roots_config(root: &Path) -> String {
    format!(
        "proc_root = \"{}\"\nsys_root = \"{}\"\nhost_root = \"{}\"\n",
        root.join("proc").display(),
        root.join("sys").display(),
        root.join("host").display(),
    )
}

/// `audit_interval` short: the pass at start has no probe samples (nor
/// does the one 10 s later if the probes are slow to start), and the
/// findings that need them must not wait an hour.
fn fixture_config(d: &Dirs, audit_interval: &str) -> String {
    let mut c = format!(
        "audit_interval = \"{audit_interval}\"\n{}",
        roots_config(&d.root)
    );
    for ((name, _), dir) in VOLUMES.iter().zip(&d.vols) {
        c += &format!(
            "[[volume]]\nname = \"{name}\"\npath = \"{}\"\n{PROBE_KEYS}",
            dir.display()
        );
        if *name == "w" {
            c += "audit.ignore = [\"atime\"]\n";
        }
    }
    c
}

fn findings(m: &str) -> Vec<String> {
    let mut v: Vec<String> = m
        .lines()
        .filter(|l| l.starts_with("pgstorage_audit_finding{"))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// The distinct codes of the audit's findings in a scrape.
fn codes(m: &str) -> std::collections::BTreeSet<String> {
    samples_with(m, "pgstorage_audit_finding", &[])
        .iter()
        .filter_map(|(labels, _)| {
            let rest = labels.split("code=\"").nth(1)?;
            Some(rest.split('"').next()?.to_string())
        })
        .collect()
}

fn audited(m: &str) -> bool {
    sample(m, "pgstorage_audit_runs_total").is_some_and(|r| r >= 1.0)
}

/// The daemon's scrape once its findings are exactly the fixture's.
fn wait_for_codes(ex: &Exporter, f: &Fixture, what: &str) -> String {
    let want: std::collections::BTreeSet<String> = f.expect.iter().map(|c| c.to_string()).collect();
    // volatile_write_cache needs the probe's first samples: the pass at
    // start has none, a later one has them (every 2 s with the fixture's
    // short audit_interval; after a SIGHUP, the pass at once does).
    let m = ex.wait_for(what, Duration::from_secs(40), |m| {
        audited(m) && codes(m) == want
    });
    eprintln!("{what}:\n{}", findings(&m).join("\n"));
    m
}

#[test]
fn fixture_roots_trigger_every_host_and_volume_check_and_sighup_reevaluates() {
    let d = dirs();
    write_fixture(&d.root, &d.vols, &BAD);
    let cfg = d.root.with_file_name("c.toml");
    std::fs::write(&cfg, fixture_config(&d, "2s")).unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    let m = wait_for_codes(
        &ex,
        &BAD,
        "every host and volume finding but the reboot one",
    );
    // Where the memory filesystem and the fast syncs are.
    for series in [
        "{code=\"memory_filesystem\",severity=\"critical\",volume=\"m\"}",
        "{code=\"volatile_write_cache\",severity=\"critical\",volume=\"w\"}",
        "{code=\"filesystem_choice\",severity=\"info\",volume=\"w\"}",
        "{code=\"atime\",severity=\"info\",volume=\"v\"}",
    ] {
        let s = format!("pgstorage_audit_finding{series}");
        assert_eq!(sample(&m, &s), Some(1.0), "missing {s}:\n{m}");
    }
    // The disk under v syncs at disk speed; atime is silenced for w.
    assert!(!m.contains("code=\"volatile_write_cache\",severity=\"critical\",volume=\"v\""));
    assert!(
        !m.contains("code=\"atime\",severity=\"info\",volume=\"w\""),
        "{m}"
    );
    assert_eq!(sample(&m, "pgstorage_audit_errors_total"), Some(0.0));
    promtool_check_metrics(&m);

    // From here audit_interval is an hour (a reload, the host unchanged):
    // only a reload can make the audit look again. Once it is applied the
    // audit task runs with the new interval; the next SIGHUP restarts it
    // before its settle pass 10 s later.
    std::fs::write(&cfg, fixture_config(&d, "1h")).unwrap();
    ex.signal(libc::SIGHUP);
    let m = ex.wait_for(
        "the reload to audit_interval 1h",
        Duration::from_secs(20),
        |m| sample(m, "pgstorage_config_reloads_total{result=\"success\"}") == Some(1.0),
    );
    assert_eq!(
        sample(&m, "pgstorage_config_last_reload_successful"),
        Some(1.0),
        "{m}"
    );
    let runs_before = sample(&m, "pgstorage_audit_runs_total").unwrap();

    // Fixed by hand: a reload re-runs the audit at once, although
    // audit_interval is an hour, and only the reboot finding is left.
    write_fixture(&d.root, &d.vols, &HAND_TUNED);
    ex.signal(libc::SIGHUP);
    let m = wait_for_codes(&ex, &HAND_TUNED, "after SIGHUP, tuned by hand");
    assert_eq!(
        sample(
            &m,
            "pgstorage_audit_finding{code=\"sysctl_not_persistent\",severity=\"info\"}"
        ),
        Some(1.0),
        "{m}"
    );
    promtool_check_metrics(&m);

    // And written down for the next boot.
    write_fixture(&d.root, &d.vols, &GOOD);
    ex.signal(libc::SIGHUP);
    let m = wait_for_codes(&ex, &GOOD, "after SIGHUP, persistent");
    // Each SIGHUP's pass counted.
    assert!(
        sample(&m, "pgstorage_audit_runs_total").unwrap() >= runs_before + 2.0,
        "{runs_before} runs before the two SIGHUPs\n{m}"
    );
}

#[test]
fn a_quiet_fixture_has_no_finding_but_counts_its_checks() {
    let d = dirs();
    write_fixture(&d.root, &d.vols, &GOOD);
    let cfg = d.root.with_file_name("c.toml");
    std::fs::write(&cfg, fixture_config(&d, "2s")).unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    // "No finding" is not "not checked": every host and volume check ran
    // (m is tmpfs-free here, so its disk checks ran as well).
    let host_volume = CHECKS.iter().filter(|c| c.scope != Scope::Cluster).count();
    let per_volume = CHECKS.iter().filter(|c| c.scope == Scope::Volume).count();
    // Past a pass that has the probe's samples, so the fast syncs of the
    // volumes in memory were judged (and the cache is write through):
    // volatile_write_cache counts as evaluated only then.
    let m = ex.wait_for(
        "an audit pass with every volume check evaluated",
        Duration::from_secs(40),
        |m| {
            sample(m, "pgstorage_audit_runs_total").is_some_and(|r| r >= 2.0)
                && VOLUMES.iter().all(|(name, _)| {
                    sample(
                        m,
                        &format!("pgstorage_audit_evaluated_checks{{volume=\"{name}\"}}"),
                    ) == Some(per_volume as f64)
                })
        },
    );
    assert!(findings(&m).is_empty(), "{m}");
    assert_eq!(
        sample(&m, "pgstorage_audit_evaluated_checks "),
        Some((host_volume - per_volume) as f64),
        "{m}"
    );
    for (name, _) in VOLUMES {
        assert_eq!(
            sample(
                &m,
                &format!("pgstorage_audit_evaluated_checks{{volume=\"{name}\"}}")
            ),
            Some(per_volume as f64),
            "{m}"
        );
    }
    assert!(m.contains("# TYPE pgstorage_audit_finding gauge"), "{m}");
    promtool_check_metrics(&m);
}

#[test]
fn a_tmpfs_volume_is_a_critical_finding() {
    let shm = Path::new("/dev/shm");
    if !shm_is_tmpfs() {
        cannot_run(
            Part::Root,
            "a_tmpfs_volume_is_a_critical_finding",
            "/dev/shm is not a tmpfs here",
        );
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[volume]]\nname = \"scratch\"\npath = \"{}\"\n{PROBE_KEYS}",
            dir.path().display()
        ),
    )
    .unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    let m = ex.wait_for("an audit pass", Duration::from_secs(30), audited);
    assert_eq!(
        sample(
            &m,
            "pgstorage_audit_finding{code=\"memory_filesystem\",severity=\"critical\",volume=\"scratch\"}"
        ),
        Some(1.0),
        "{m}"
    );
    // And check --audit-only says the same, without probing.
    let out = std::process::Command::new(BIN)
        .args(["check", "--audit-only", "--format", "json"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let codes: Vec<&str> = j["volume"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    assert!(codes.contains(&"memory_filesystem"), "{j}");
    assert!(!dir_entries(dir.path()).iter().any(|e| e.contains("check")));
}

#[test]
fn an_unknown_code_in_an_ignore_list_is_refused_with_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[volume]]\nname = \"v\"\npath = \"{}\"\naudit.ignore = [\"atme\"]\n",
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
        err.contains(":4: volume[0].audit.ignore: unknown audit code \"atme\""),
        "{err}"
    );
    // A key the audit table does not have is named too.
    std::fs::write(
        &cfg,
        format!(
            "[[volume]]\nname = \"v\"\npath = \"{}\"\naudit.ignored = [\"atime\"]\n",
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
    assert!(err.contains("ignored"), "{err}");
}

const MON_PASSWORD: &str = "Mon-Pa55word-4-tests";

/// The probed volume of the PostgreSQL tests.
const PG_VOLUME: &str =
    "interval = \"100ms\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"";

/// One change on the server, or on the host as the fixture roots show it.
enum Step {
    /// A statement run as the server's superuser.
    Sql(&'static str),
    /// The fixture roots rewritten to show this host; the next audit pass
    /// reads them.
    Host(&'static Fixture),
}

use Step::{Host, Sql};

/// The steps for the test's log.
fn describe(steps: &[Step]) -> String {
    let one = |s: &Step| match s {
        Sql(s) => s.to_string(),
        Host(f) => format!(
            "fixture rotational = {}, HugePages_Total = {}",
            f.rotational, f.hugepages_total
        ),
    };
    steps.iter().map(one).collect::<Vec<_>>().join("; ")
}

/// One setting (or host fact) the audit judges: the steps that make the
/// finding appear, the ones that make it go, and its series.
struct PgCase {
    code: &'static str,
    severity: &'static str,
    set: &'static [Step],
    reset: &'static [Step],
}

const PG_CASES: &[PgCase] = &[
    PgCase {
        code: "fsync_off",
        severity: "critical",
        set: &[Sql("ALTER SYSTEM SET fsync = off")],
        reset: &[Sql("ALTER SYSTEM RESET fsync")],
    },
    PgCase {
        code: "full_page_writes_off",
        severity: "critical",
        set: &[Sql("ALTER SYSTEM SET full_page_writes = off")],
        reset: &[Sql("ALTER SYSTEM RESET full_page_writes")],
    },
    PgCase {
        code: "synchronous_commit_off",
        severity: "warning",
        set: &[Sql("ALTER SYSTEM SET synchronous_commit = off")],
        reset: &[Sql("ALTER SYSTEM RESET synchronous_commit")],
    },
    PgCase {
        // Off by default: the finding is there from the start, and goes
        // once compression is on.
        code: "wal_compression_off",
        severity: "info",
        set: &[Sql("ALTER SYSTEM SET wal_compression = off")],
        reset: &[Sql("ALTER SYSTEM SET wal_compression = pglz")],
    },
    PgCase {
        // CHECKPOINT counts as a requested checkpoint; with a tiny
        // max_wal_size they are more than 20 % of all. A max_wal_size of
        // 4 GB or more is a sized choice, not a finding.
        code: "checkpoints_requested",
        severity: "warning",
        set: &[
            Sql("ALTER SYSTEM SET max_wal_size = '32MB'"),
            Sql("SELECT pg_reload_conf()"),
            Sql("CHECKPOINT"),
            Sql("CHECKPOINT"),
            Sql("CHECKPOINT"),
        ],
        reset: &[Sql("ALTER SYSTEM SET max_wal_size = '8GB'")],
    },
    PgCase {
        code: "pending_restart",
        severity: "info",
        set: &[Sql("ALTER SYSTEM SET shared_buffers = '200MB'")],
        reset: &[Sql("ALTER SYSTEM RESET shared_buffers")],
    },
    PgCase {
        // The default of 4 prices a random read like a seek of a spinning
        // disk: a finding on an SSD, gone once lowered...
        code: "random_page_cost_default",
        severity: "info",
        set: &[Host(&SSD), Sql("ALTER SYSTEM RESET random_page_cost")],
        reset: &[Sql("ALTER SYSTEM SET random_page_cost = 1.1")],
    },
    PgCase {
        // ... and right where the data directory's disk does seek.
        code: "random_page_cost_default",
        severity: "info",
        set: &[Host(&SSD), Sql("ALTER SYSTEM RESET random_page_cost")],
        reset: &[Host(&SPINNING)],
    },
    PgCase {
        // 16 by default from PostgreSQL 18 on, 1 before: 15 starts with
        // the finding on an SSD.
        code: "effective_io_concurrency_low",
        severity: "info",
        set: &[
            Host(&SSD),
            Sql("ALTER SYSTEM SET effective_io_concurrency = 1"),
        ],
        reset: &[Sql("ALTER SYSTEM SET effective_io_concurrency = 200")],
    },
    PgCase {
        // One page at a time is what a single spindle can serve.
        code: "effective_io_concurrency_low",
        severity: "info",
        set: &[
            Host(&SSD),
            Sql("ALTER SYSTEM SET effective_io_concurrency = 1"),
        ],
        reset: &[Host(&SPINNING)],
    },
    PgCase {
        // huge_pages = try (the default) needs a restart to change; the
        // host's reserve is what the fixture's /proc/meminfo says, which
        // the test checks against the server's own
        // shared_memory_size_in_huge_pages.
        code: "huge_pages_shortfall",
        severity: "info",
        set: &[Host(&SSD)],
        reset: &[Host(&SSD_HUGE_PAGES)],
    },
];

/// Every code of the audit's table is triggered through a scraped daemon
/// somewhere in this file: a new check without a daemon test fails here.
#[test]
fn every_check_has_a_daemon_test() {
    let mut covered: Vec<&str> = TRIGGERING
        .iter()
        .flat_map(|f| f.expect.iter().copied())
        .collect();
    // The host and volume codes come from the fixtures...
    for c in CHECKS.iter().filter(|c| c.scope != Scope::Cluster) {
        assert!(
            covered.contains(&c.code),
            "{}: no triggering fixture expects it",
            c.code
        );
    }
    assert!(GOOD.expect.is_empty());
    // ... the cluster codes from real PostgreSQL.
    covered.extend(PG_CASES.iter().map(|c| c.code));
    covered.push("wal_shares_data_volume");
    for c in CHECKS.iter().filter(|c| c.scope == Scope::Cluster) {
        assert!(
            covered.contains(&c.code),
            "{}: no PostgreSQL test triggers it",
            c.code
        );
    }
}

/// Each case: absent (or reset first), set + reload → present within a
/// few audit intervals, reset + reload → gone. The exporter's role is
/// read-only (pg_monitor); the statements run as the server's superuser.
/// The exporter reads /proc and /sys from fixture roots: their one
/// filesystem is the one under the temp directory, which holds the data
/// directory and the probed volume, on the disk under it as the fixture
/// describes it.
fn settings_appear_and_go(kind: PgKind) {
    let tmp = std::env::temp_dir();
    let host = tempfile::tempdir().unwrap();
    let mounted = [tmp.clone()];
    write_fixture(host.path(), &mounted, &SSD);
    let Some(stack) = Stack::builder()
        .pg_version(kind)
        .password(MON_PASSWORD)
        .role("mon", true)
        .config_head(&format!(
            "window = \"1m\"\naudit_interval = \"1s\"\n{}",
            roots_config(host.path())
        ))
        .volume(PG_VOLUME)
        .cluster("c", "mon", "scrape_interval = \"500ms\"")
        .ready_pg_up("c")
        .start()
    else {
        return;
    };
    for d in [stack.pg.data_dir(), stack.work.path()] {
        assert_eq!(
            majmin_of(d),
            majmin_of(&tmp),
            "{} is not on the filesystem of {}, which the fixture describes",
            d.display(),
            tmp.display()
        );
    }
    let need: u32 = stack
        .pg
        .psql("SHOW shared_memory_size_in_huge_pages")
        .trim()
        .parse()
        .unwrap();
    assert!(
        (1..=RESERVED_HUGE_PAGES).contains(&need),
        "PostgreSQL {} needs {need} huge pages: the fixture reserves {RESERVED_HUGE_PAGES}",
        kind.major()
    );
    eprintln!(
        "PostgreSQL {}: huge_pages = {}, shared_memory_size_in_huge_pages = {need}",
        kind.major(),
        stack.pg.psql("SHOW huge_pages")
    );
    let m = stack
        .ex
        .wait_for("the cluster audited", Duration::from_secs(30), |m| {
            sample(m, "pgstorage_audit_evaluated_checks{cluster=\"c\"}").is_some_and(|n| n >= 8.0)
        });
    eprintln!(
        "PostgreSQL {} at start:\n{}",
        kind.major(),
        findings(&m).join("\n")
    );
    // Discovery found the data directory and pg_wal on the configured
    // volume's filesystem (all in one temp dir).
    assert!(
        m.contains(
            "pgstorage_audit_finding{code=\"wal_shares_data_volume\",severity=\"warning\",cluster=\"c\"} 1"
        ),
        "{m}"
    );
    let run = |steps: &[Step]| {
        for s in steps {
            match s {
                // ALTER SYSTEM cannot run in a transaction block: one each.
                Sql(s) => {
                    stack.pg.psql(s);
                }
                Host(f) => write_fixture(host.path(), &mounted, f),
            }
        }
        stack.pg.psql("SELECT pg_reload_conf()");
    };
    for c in PG_CASES {
        let series = format!(
            "pgstorage_audit_finding{{code=\"{}\",severity=\"{}\",cluster=\"c\"}}",
            c.code, c.severity
        );
        run(c.reset);
        stack.ex.wait_for(
            &format!("{} absent", c.code),
            Duration::from_secs(30),
            |m| audited(m) && sample(m, &series).is_none(),
        );
        run(c.set);
        // One scrape interval for the collector, one audit interval.
        stack
            .ex
            .wait_for(&format!("{} found", c.code), Duration::from_secs(30), |m| {
                sample(m, &series) == Some(1.0)
            });
        run(c.reset);
        stack
            .ex
            .wait_for(&format!("{} gone", c.code), Duration::from_secs(30), |m| {
                sample(m, &series).is_none()
            });
        eprintln!(
            "{series}: present after {}; absent after {}",
            describe(c.set),
            describe(c.reset)
        );
    }
}

#[test]
fn postgres_18_settings_findings_appear_and_go_within_an_audit_interval() {
    settings_appear_and_go(PgKind::V18);
}

#[test]
fn postgres_15_settings_findings_appear_and_go_within_an_audit_interval() {
    settings_appear_and_go(PgKind::V15);
}

/// An ext4 loop device remounted with `nobarrier` (root, losetup, mkfs.ext4;
/// a failure where it cannot run unless root tests are left out): a critical finding
/// in the daemon on the real roots and in `check --audit-only`.
#[test]
fn an_ext4_loop_device_without_barriers_is_a_critical_finding() {
    if !common::loopdev::can_run("the nobarrier audit test", false) {
        return;
    }
    let lv = common::loopdev::LoopVolume::new(64 << 20, false);
    let mnt = lv.mnt.to_str().unwrap();
    sh("mount", &["-o", "remount,nobarrier", mnt]);
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.contains(&format!(" {mnt} ")))
        .unwrap();
    eprintln!("{line}");
    assert!(
        line.contains("nobarrier") || line.contains("barrier=0"),
        "{line}"
    );

    let out = std::process::Command::new(BIN)
        .args(["check", "--audit-only", mnt])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(out.status.success());
    assert!(text.contains("CRITICAL [barriers_off] (volume)"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!("[[volume]]\nname = \"nb\"\npath = \"{mnt}\"\n{PROBE_KEYS}"),
    )
    .unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    let m = ex.wait_for("an audit pass", Duration::from_secs(30), audited);
    assert_eq!(
        sample(
            &m,
            "pgstorage_audit_finding{code=\"barriers_off\",severity=\"critical\",volume=\"nb\"}"
        ),
        Some(1.0),
        "{m}"
    );
    drop(ex);
}

/// WAL symlinked onto its own (loop device) filesystem: discovery gives
/// the data directory and pg_wal different volumes, and the shared-volume
/// finding the other PostgreSQL tests see is absent. The cluster's
/// `audit.ignore` silences the volumes of its directories, the discovered
/// WAL volume included.
#[test]
fn wal_on_its_own_filesystem_has_no_shared_volume_finding() {
    if !common::loopdev::can_run("the WAL volume audit test", false) {
        return;
    }
    let lv = common::loopdev::LoopVolume::new(256 << 20, true);
    // Mounted relatime, as ext4 is by default: an atime finding without
    // the cluster's ignore list.
    let out = std::process::Command::new(BIN)
        .args(["check", "--audit-only"])
        .arg(&lv.mnt)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[atime] (volume)"), "{text}");
    let waldir = lv.mnt.join("pg_wal");
    let Some(stack) = Stack::builder()
        .waldir(&waldir)
        .password(MON_PASSWORD)
        .role("mon", true)
        .config_head("window = \"1m\"\naudit_interval = \"1s\"\n")
        .volume(PG_VOLUME)
        .cluster(
            "c",
            "mon",
            "scrape_interval = \"500ms\"\naudit.ignore = [\"atime\"]",
        )
        .ready_pg_up("c")
        .start()
    else {
        return;
    };
    // Wait until discovery has added the WAL volume and a pass saw it.
    let m = stack.ex.wait_for(
        "the cluster and its WAL volume audited",
        Duration::from_secs(30),
        |m| {
            m.contains("pgstorage_cluster_volume_info{cluster=\"c\"")
                && m.contains("role=\"wal\"")
                && sample(m, "pgstorage_audit_evaluated_checks{cluster=\"c\"}")
                    .is_some_and(|n| n >= 9.0)
        },
    );
    // The pass in that scrape may predate discovery: two more intervals.
    let runs = sample(&m, "pgstorage_audit_runs_total").unwrap();
    let m = stack
        .ex
        .wait_for("two more audit passes", Duration::from_secs(15), |m| {
            sample(m, "pgstorage_audit_runs_total").is_some_and(|r| r >= runs + 2.0)
        });
    eprintln!("{}", findings(&m).join("\n"));
    assert!(!m.contains("code=\"wal_shares_data_volume\""), "{m}");
    assert!(
        sample(&m, "pgstorage_audit_evaluated_checks{cluster=\"c\"}").unwrap() >= 10.0,
        "the shared-volume check was evaluated, not skipped:\n{m}"
    );
    let wal = samples_with(&m, "pgstorage_cluster_volume_info", &["role=\"wal\""]);
    let wal_volume = wal[0]
        .0
        .split("volume=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert!(
        sample(
            &m,
            &format!("pgstorage_audit_evaluated_checks{{volume=\"{wal_volume}\"}}")
        )
        .is_some_and(|n| n > 0.0),
        "the discovered WAL volume {wal_volume} was audited:\n{m}"
    );
    assert!(
        !m.contains("code=\"atime\""),
        "silenced by cluster c's list:\n{m}"
    );
    // PostgreSQL first: its WAL is on the loop device, which cannot be
    // unmounted while the server runs (the device would be left mounted).
    drop(stack);
    drop(lv);
}

/// `check --audit-only --pg.dsn DSN PATH` adds the cluster's findings,
/// read over a read-only session as a pg_monitor role.
#[test]
fn check_audit_only_with_a_dsn_adds_the_cluster_findings() {
    let Some(stack) = Stack::builder()
        .pg_version(PgKind::V18)
        .password(MON_PASSWORD)
        .role("mon", true)
        .setup(|pg| {
            pg.psql("ALTER SYSTEM SET fsync = off");
            pg.psql("SELECT pg_reload_conf()");
        })
        .volume(PG_VOLUME)
        .start()
    else {
        return;
    };
    let dsn = stack.dsn("mon");
    let run = |format: &str| {
        let out = std::process::Command::new(BIN)
            .args([
                "check",
                "--audit-only",
                "--format",
                format,
                "--pg.dsn",
                &dsn,
            ])
            .arg(stack.work.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let text = run("text");
    eprintln!("{text}");
    assert!(text.contains("CRITICAL [fsync_off] (cluster)"), "{text}");
    assert!(
        text.contains("fix: ALTER SYSTEM SET fsync = 'on'"),
        "{text}"
    );
    let j: serde_json::Value = serde_json::from_str(&run("json")).unwrap();
    let codes: Vec<&str> = j["cluster"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    assert!(codes.contains(&"fsync_off"), "{j}");
    // The data directory is local here: the shared-volume check ran.
    assert!(codes.contains(&"wal_shares_data_volume"), "{j}");
    assert!(!dsn.is_empty() && !text.contains(MON_PASSWORD));
}

/// With a long `audit_interval` the first pass runs before the cluster is
/// connected; the audit looks again within seconds rather than an hour.
#[test]
fn a_cluster_connecting_after_the_first_pass_is_audited_soon() {
    let Some(stack) = Stack::builder()
        .pg_version(PgKind::V18)
        .password(MON_PASSWORD)
        .role("mon", true)
        .config_head("window = \"1m\"\naudit_interval = \"1h\"\n")
        .volume(PG_VOLUME)
        .cluster("c", "mon", "scrape_interval = \"500ms\"")
        .ready_pg_up("c")
        .start()
    else {
        return;
    };
    // A pass after the first one has audited the cluster (the first may
    // have had it already when the collector connected quickly; the
    // settle pass then comes 10 s later).
    stack.ex.wait_for(
        "the cluster audited, in a later pass than the first",
        Duration::from_secs(40),
        |m| {
            sample(m, "pgstorage_audit_evaluated_checks{cluster=\"c\"}").is_some_and(|n| n >= 8.0)
                && sample(m, "pgstorage_audit_runs_total").is_some_and(|r| r >= 2.0)
        },
    );
}

/// The `max_wal_size` a fix names, in bytes (PostgreSQL's MB and GB are
/// 1024-based), and the figure its evidence computed (`= 1.7 GiB`).
fn sized_max_wal(fix: &str, evidence: &str) -> (f64, f64) {
    let value = fix
        .split("max_wal_size = '")
        .nth(1)
        .and_then(|r| r.split('\'').next())
        .unwrap_or_else(|| panic!("no max_wal_size in {fix:?}"));
    let unit = |u: &str| match u {
        "MB" | "MiB" => 1024.0 * 1024.0,
        "GB" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => panic!("unit {u:?} in {fix:?} / {evidence:?}"),
    };
    let n = value.trim_end_matches(char::is_alphabetic);
    let bytes = n.parse::<f64>().unwrap() * unit(&value[n.len()..]);
    let computed = evidence
        .split("headroom = ")
        .nth(1)
        .unwrap_or_else(|| panic!("no computed size in {evidence:?}"));
    let mut words = computed.split([' ', ',', ';']);
    let figure: f64 = words.next().unwrap().parse().unwrap();
    (bytes, figure * unit(words.next().unwrap()))
}

/// Checkpoints forced by WAL volume (a 32 MB max_wal_size, then a table
/// of 500,000 rows written): the fix names a max_wal_size sized from the cluster's WAL rate,
/// not a constant. The daemon's status page shows it with the rate over
/// the exporter's window (or the mean since pg_stat_wal's reset, when
/// busier), and `check --pg.dsn`, which reads the counters once, with the
/// mean since the reset. Each is the evidence's figure rounded up (256 MB
/// steps under 1 GB, whole GB above) and above the current 32 MB.
#[test]
fn checkpoints_requested_fix_is_sized_from_the_wal_rate() {
    let Some(stack) = Stack::builder()
        .pg_version(PgKind::V18)
        .password(MON_PASSWORD)
        .role("mon", true)
        .setup(|pg| {
            pg.psql("ALTER SYSTEM SET max_wal_size = '32MB'");
            pg.psql("SELECT pg_reload_conf()");
        })
        .config_head("window = \"5m\"\naudit_interval = \"2s\"\n")
        .volume(PG_VOLUME)
        .cluster("c", "mon", "scrape_interval = \"1s\"")
        .ready_pg_up("c")
        .start()
    else {
        return;
    };
    stack.pg.psql(
        "CREATE TABLE w AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 500000) g",
    );
    let requested = stack
        .pg
        .psql("SELECT num_requested FROM pg_stat_checkpointer");
    eprintln!("requested checkpoints: {}", requested.trim());
    // The audit section's row: severity, code, evidence, what it means, fix.
    let fix_and_evidence = |html: &str| -> Option<(String, String)> {
        let row = html
            .split("<tr>")
            .find(|r| r.contains("<code>checkpoints_requested</code>"))?;
        let cell = |class: &str| {
            let from = row.split(&format!("<td class=\"{class}\">")).nth(1)?;
            Some(from.split("</td>").next()?.replace("&#39;", "'"))
        };
        Some((cell("fix")?, cell("evidence")?))
    };
    // The window's rate needs a minute of readings.
    let deadline = std::time::Instant::now() + Duration::from_secs(150);
    let (fix, evidence) = loop {
        let (_, _, html) = stack.ex.get("/");
        if let Some((fix, evidence)) = fix_and_evidence(&html)
            && evidence.contains("MiB/s")
        {
            break (fix, evidence);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no sized checkpoints_requested finding on the status page:\n{html}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("status page: evidence {evidence}\n  fix {fix}");
    let check_sized = |fix: &str, evidence: &str| {
        let (bytes, figure) = sized_max_wal(fix, evidence);
        let gib = 1024.0 * 1024.0 * 1024.0;
        let step = if figure < gib { gib / 4.0 } else { gib };
        assert!(
            // The evidence's figure is rounded to 0.1 GiB or 1 MiB.
            bytes >= figure - gib / 20.0
                && bytes - figure < step + gib / 20.0
                && bytes > 32.0 * 1024.0 * 1024.0,
            "{fix} from {evidence}"
        );
    };
    check_sized(&fix, &evidence);

    let out = std::process::Command::new(BIN)
        .args(["check", "--audit-only", "--format", "json", "--pg.dsn"])
        .arg(stack.dsn("mon"))
        .arg(stack.work.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = j["cluster"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["code"] == "checkpoints_requested")
        .unwrap_or_else(|| panic!("{j}"));
    let (fix, evidence) = (f["fix"].as_str().unwrap(), f["evidence"].as_str().unwrap());
    eprintln!("check: evidence {evidence}\n  fix {fix}");
    assert!(
        evidence.contains(" MiB/s since the statistics reset "),
        "{evidence}"
    );
    check_sized(fix, evidence);
}
