//! `check` on real directories: output, JSON, engines, sync methods,
//! warnings, refusal, cleanup.

// Test code: a panic is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;

use common::{BIN, dir_entries};

fn check(dir: &std::path::Path, extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("check")
        .arg(dir)
        .args([
            "--duration",
            "2s",
            "--read-file-size",
            "8MiB",
            "--free-space-reserve",
            "0",
        ])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(dir: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--format", "json"];
    args.extend_from_slice(extra);
    let (code, out, err) = check(dir, &args);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn plausible(v: &serde_json::Value, what: &str) -> f64 {
    let x = v.as_f64().unwrap_or_else(|| panic!("{what} missing"));
    assert!(x > 0.0 && x < 10.0, "{what} = {x}");
    x
}

#[test]
fn text_report_has_quantiles_ceiling_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = check(dir.path(), &[]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "sync method  8 KiB write, then fdatasync",
        "engine       ",
        "p50",
        "p90",
        "p99",
        "p99.9",
        "max",
        "\n  write  ",
        "\n  sync   ",
        "\n  commit ",
        "\n  read   ",
        "commit ceiling, one client: ",
        "commits/s at p50 latency",
        "verdict: ",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert_eq!(
        dir_entries(dir.path()),
        Vec::<String>::new(),
        "check left files behind"
    );
}

#[test]
fn json_report_is_plausible_for_both_engines() {
    let dir = tempfile::tempdir().unwrap();
    for engine in ["io_uring", "sync"] {
        let r = json(dir.path(), &["--engine", engine]);
        assert_eq!(r["engine"], engine);
        assert_eq!(r["sync_method"], "fdatasync");
        for op in ["write", "sync", "commit", "read"] {
            for q in ["p50", "p90", "p99", "p999", "max"] {
                plausible(&r[op][q], &format!("{engine} {op}.{q}"));
            }
            assert!(r[op]["count"].as_u64().unwrap() > 0);
        }
        let c = r["commit_ceiling_p50_per_second"].as_f64().unwrap();
        let p50 = r["commit"]["p50"].as_f64().unwrap();
        assert!((c * p50 - 1.0).abs() < 1e-9);
        assert!(r["commit"]["p50"].as_f64() >= r["sync"]["p50"].as_f64());
    }
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
}

#[test]
fn open_datasync_has_no_separate_sync() {
    let dir = tempfile::tempdir().unwrap();
    for method in ["open_datasync", "open_sync", "fsync"] {
        let r = json(dir.path(), &["--sync-method", method, "--no-read"]);
        assert_eq!(r["sync_method"], method);
        plausible(&r["commit"]["p50"], method);
        if method == "fsync" {
            plausible(&r["sync"]["p50"], method);
        } else {
            assert!(r["sync"].is_null(), "{method}: {}", r["sync"]);
        }
        assert!(r["read"].is_null());
    }
}

#[test]
fn memory_filesystem_is_called_out() {
    // /dev/shm is tmpfs on Linux: sync there proves nothing.
    let shm = std::path::Path::new("/dev/shm");
    let fstype = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/dev/shm"))
        .and_then(|l| {
            l.split(" - ")
                .nth(1)
                .map(|r| r.split(' ').next().unwrap_or("").to_string())
        });
    assert_eq!(
        fstype.as_deref(),
        Some("tmpfs"),
        "/dev/shm must be tmpfs for this test"
    );
    let dir = tempfile::tempdir_in(shm).unwrap();
    let r = json(dir.path(), &[]);
    let codes: Vec<&str> = r["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, vec!["memory_filesystem"]);
    assert_eq!(r["fstype"], "tmpfs");
}

#[test]
fn refuses_a_data_directory_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pgdata = dir.path().join("pgdata");
    std::fs::create_dir_all(pgdata.join("global")).unwrap();
    std::fs::write(pgdata.join("PG_VERSION"), "18\n").unwrap();
    let (code, _, err) = check(&pgdata, &[]);
    assert_eq!(code, 1);
    assert!(err.contains("the exporter never writes there"), "{err}");
    assert_eq!(dir_entries(&pgdata), vec!["PG_VERSION", "global"]);
}

#[test]
fn refuses_a_missing_path() {
    let (code, _, err) = check(std::path::Path::new("/does/not/exist"), &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("/does/not/exist: No such file or directory"),
        "{err}"
    );
}

#[test]
fn unwritable_directory_says_permission_denied_once_with_the_path() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    // root writes anywhere: run the check as nobody then.
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = if root {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
        c
    } else {
        Command::new(BIN)
    };
    let out = cmd
        .arg("check")
        .arg(&ro)
        .args(["--duration", "1s", "--free-space-reserve", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("Permission denied").count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "pg-storage-exporter check: creating probe directory {}/pg-storage-exporter-check: \
             Permission denied (os error 13); run check as a user that may write to {}, \
             or give --probe-dir",
            ro.display(),
            ro.display()
        )),
        "{err}"
    );
    assert_eq!(dir_entries(&ro), Vec::<String>::new());
}

#[test]
fn sigint_ends_a_long_check_early_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(BIN)
        .arg("check")
        .arg(dir.path())
        .args([
            "--duration",
            "60s",
            "--read-file-size",
            "8MiB",
            "--free-space-reserve",
            "0",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(130), "{stdout}");
    assert!(stdout.contains("interrupted"), "{stdout}");
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
}

#[test]
fn sweep_prints_the_four_depth_tables() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = check(dir.path(), &["--no-commit", "--sweep", "2s"]);
    assert_eq!(code, 0, "{err}");
    for (title, depths, column) in [
        (
            "8 KiB O_DIRECT random reads",
            &["1", "4", "16", "64"][..],
            "IOPS",
        ),
        (
            "256 KiB O_DIRECT sequential reads",
            &["1", "4", "16"][..],
            "MiB/s",
        ),
        (
            "8 KiB O_DIRECT random writes",
            &["1", "4", "16", "64"][..],
            "IOPS",
        ),
        (
            "256 KiB O_DIRECT sequential writes",
            &["1", "4", "16"][..],
            "MiB/s",
        ),
    ] {
        let head = format!("queue-depth sweep, {title}:");
        let table: Vec<&str> = out
            .split(&head)
            .nth(1)
            .unwrap_or_else(|| panic!("no {head:?} in:\n{out}"))
            .lines()
            .skip(1)
            .take(depths.len() + 3)
            .collect();
        assert!(table[0].contains(column), "{table:?}");
        // A depth that ended on its write budget is starred, with a
        // footnote before the verdict.
        let mut starred = false;
        for (row, depth) in table[1..].iter().zip(depths) {
            let first = row.split_whitespace().next().unwrap_or_default();
            starred |= first.ends_with('*');
            assert_eq!(first.trim_end_matches('*'), *depth, "{table:?}");
        }
        let mut verdict = table[depths.len() + 1];
        if starred {
            assert!(verdict.contains("* ended early"), "{table:?}");
            verdict = table[depths.len() + 2];
        }
        assert!(
            verdict.contains("plateau at") || verdict.contains("cap within these depths"),
            "{table:?}"
        );
    }
    let r = json(dir.path(), &["--no-commit", "--sweep", "2s"]);
    assert_eq!(r["sweep"].as_array().unwrap().len(), 4);
    let tables = r["sweep_tables"].as_array().unwrap();
    let resources: Vec<&str> = tables
        .iter()
        .map(|t| t["resource"].as_str().unwrap())
        .collect();
    assert_eq!(
        resources,
        [
            "read_iops",
            "read_bytes_per_second",
            "write_iops",
            "write_bytes_per_second"
        ]
    );
    assert_eq!(tables[3]["block_bytes"], 262_144);
    assert_eq!(tables[3]["pattern"], "sequential");
    assert_eq!(tables[3]["points"].as_array().unwrap().len(), 3);
    for t in tables {
        for p in t["points"].as_array().unwrap() {
            let cut = p["cut_short"].as_bool().unwrap();
            // Only writes have a byte budget.
            assert!(
                !cut || t["resource"].as_str().unwrap().starts_with("write"),
                "{t}"
            );
        }
    }
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
}

/// Under a terminal, `check` shows one updating progress line on stderr
/// with its phase, the time elapsed and the time left. `script` (util-linux)
/// gives it a pseudo-terminal; what it records is everything the terminal
/// got, stdout and stderr together.
#[test]
fn progress_line_under_a_terminal_names_the_phases() {
    let dir = tempfile::tempdir().unwrap();
    let cmd = format!(
        "{BIN} check {} --duration 3s --read-file-size 8MiB --free-space-reserve 0 --sweep 1s",
        dir.path().display()
    );
    let out = Command::new("script")
        .args(["-qfec", &cmd, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script (util-linux) runs");
    let tty = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{tty}");
    for want in [
        "check: commits",
        "check: pauses",
        "check: reads",
        "check: sweep",
        "elapsed ",
        "remaining ",
    ] {
        assert!(
            tty.contains(want),
            "no {want:?} in the terminal output:\n{tty}"
        );
    }
    // The line is erased before the report, which is then as when piped.
    assert!(tty.contains("\x1b[2K"), "{tty}");
    assert!(tty.contains("verdict: "), "{tty}");
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
}

#[test]
fn no_progress_text_when_stderr_is_piped() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = check(dir.path(), &["--sweep", "1s"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(err, "", "stderr must stay empty when piped");
    assert!(!out.contains("remaining") && !out.contains('\r'), "{out}");
    assert!(out.starts_with("pg-storage-exporter check "), "{out}");
}
