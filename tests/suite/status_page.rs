//! The status page `/` as a browser renders it: headless Chromium loads
//! the page from the real exporter, the test reads the DOM's text and
//! saves a screenshot under `target/test-artifacts/` for a human to look
//! at. Without Chromium the tests fail unless tool tests are left out.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::stack::Stack;
use common::*;

const MON_PASSWORD: &str = "Status-Pa55word-4-tests";

/// The Chromium binary, or `None` (test skips) when there is none.
fn chromium(test: &str) -> Option<&'static str> {
    for name in ["chromium", "chromium-browser"] {
        let ok = Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(name);
        }
    }
    cannot_run(
        Part::Tools,
        test,
        "chromium is not installed (apt-get install chromium, or run scripts/test)",
    );
    None
}

/// Runs headless Chromium on `url` with `args` in a profile of its own
/// (tests run in parallel) and returns its stdout; killed after 90 s.
fn run_chromium(bin: &str, url: &str, args: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .stdout(out.reopen().unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "chromium {args:?} {url}: {status}");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium {args:?} {url} did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::read_to_string(out.path()).unwrap()
}

/// The DOM as Chromium built it.
fn dump_dom(bin: &str, url: &str) -> String {
    let dom = run_chromium(bin, url, &["--dump-dom"]);
    assert!(dom.contains("</html>"), "no DOM from chromium: {dom}");
    dom
}

/// `target/test-artifacts/<name>`: a screenshot of the page, 1280 pixels
/// wide and `height` high.
fn screenshot(bin: &str, url: &str, name: &str, height: u32) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join(name);
    let _ = std::fs::remove_file(&png);
    run_chromium(
        bin,
        url,
        &[
            &format!("--screenshot={}", png.display()),
            &format!("--window-size=1280,{height}"),
            "--hide-scrollbars",
        ],
    );
    let len = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(len > 1000, "no screenshot at {}", png.display());
    eprintln!("screenshot: {}", png.display());
    png
}

/// The text of an HTML fragment: tags become spaces, entities are decoded,
/// runs of whitespace become one space.
fn text(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    let mut in_style = false;
    let lower = html.to_ascii_lowercase();
    let mut i = 0;
    for (at, c) in html.char_indices() {
        if at < i {
            continue;
        }
        if in_style {
            if lower[at..].starts_with("</style>") {
                in_style = false;
                i = at + "</style>".len();
                out.push(' ');
            }
            continue;
        }
        match c {
            '<' => {
                in_tag = true;
                if lower[at..].starts_with("<style") {
                    in_style = true;
                }
            }
            '>' if in_tag => {
                in_tag = false;
                out.push(' ');
            }
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    let out = out
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&");
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The text of the section starting at `<h2 id="{id}"`, up to the next h2.
fn section(dom: &str, id: &str) -> String {
    let start = dom
        .find(&format!("<h2 id=\"{id}\""))
        .unwrap_or_else(|| panic!("no section {id}: {dom}"));
    let rest = &dom[start..];
    let end = rest[4..].find("<h2").map_or(rest.len(), |e| e + 4);
    text(&rest[..end])
}

/// "Ceiling in force: N commits/s for one client, set by BASIS." → (N, BASIS).
fn in_force(volume_text: &str) -> (f64, String) {
    let after = volume_text
        .split_once("Ceiling in force: ")
        .unwrap_or_else(|| panic!("no ceiling in force: {volume_text}"))
        .1;
    let (n, rest) = after
        .split_once(" commits/s for one client, set by ")
        .unwrap_or_else(|| panic!("the ceiling in force has no value and basis: {volume_text}"));
    let basis = rest.split_once('.').unwrap().0.trim().to_string();
    (n.parse().unwrap(), basis)
}

/// Commit and read probes on `t` (busy bursts every 5 s) and a second
/// volume `blocked` whose probe files cannot be set up: its free-space
/// reserve is more than any disk here has.
#[test]
fn volumes_and_a_setup_error_as_the_browser_shows_them() {
    let Some(bin) = chromium("the status page test") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (vol, blocked) = (dir.path().join("vol"), dir.path().join("blocked"));
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::create_dir_all(&blocked).unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "window = \"1m\"\n\
             [defaults]\ninterval = \"100ms\"\nread_file_size = \"4MiB\"\nbusy_every = \"5s\"\n\
             [[volume]]\nname = \"t\"\npath = \"{}\"\nfree_space_reserve = \"0\"\n\
             [[volume]]\nname = \"blocked\"\npath = \"{}\"\nfree_space_reserve = \"1000TiB\"\n",
            vol.display(),
            blocked.display()
        ),
    )
    .unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    // The probe's ceilings wait for three bursts, 5 s apart on a quiet
    // host; a burst that ran on through a loaded host's stalls puts the
    // next off by as many times its usual length (up to about 10).
    ex.wait_for("the probe ceiling and a setup error", Duration::from_secs(150), |m| {
        sample(
            m,
            "pgstorage_commit_ceiling_per_second{volume=\"t\",basis=\"probe_mean\"}",
        )
        .is_some()
            && sample(
                m,
                "pgstorage_probe_window_samples{volume=\"t\",op=\"read\",phase=\"busy\"}",
            )
            .is_some_and(|n| n >= 1.0)
            && m.contains(
                "pgstorage_probe_errors_total{volume=\"blocked\",op=\"setup\",error=\"free_space_reserve\"}",
            )
    });
    let url = format!("http://{}/", ex.addr);
    let dom = dump_dom(bin, &url);
    screenshot(bin, &url, "status-setup-error.png", 2000);

    let t = section(&dom, "volume-t");
    for want in [
        "Volume t",
        "busy p50",
        "busy p99",
        "after idle p50",
        "after idle p99",
        "engine",
        "sync method fdatasync",
        "commit, read",
        "No probe errors since start.",
    ] {
        assert!(t.contains(want), "{want:?} missing from volume t: {t}");
    }
    // Each probed op has a busy and an after-idle p50 with a unit.
    let latency = t
        .split_once("samples (busy / after idle) ")
        .unwrap()
        .1
        .split_once("Commit ceiling")
        .unwrap()
        .0;
    for op in ["commit", "sync", "read"] {
        let row = latency
            .split_once(&format!("{op} "))
            .unwrap_or_else(|| panic!("no {op} row: {latency}"))
            .1;
        // p50 unit, p99 unit, p50 unit, p99 unit
        let cells: Vec<&str> = row.split(' ').take(8).collect();
        for (i, what) in [(1, "busy p50"), (5, "after idle p50")] {
            assert!(
                ["ns", "µs", "ms", "s"].contains(&cells[i]),
                "{op}: {what} in {cells:?}"
            );
        }
    }
    let (ceiling, basis) = in_force(&t);
    assert!(ceiling > 0.0, "{t}");
    assert_eq!(basis, "probe_mean", "{t}");
    assert!(t.contains("probe_mean"), "{t}");

    let b = section(&dom, "volume-blocked");
    assert!(
        b.contains("Setup error (free_space_reserve): not creating")
            && b.contains("must stay free (free_space_reserve)"),
        "{b}"
    );
    assert!(
        b.contains("The probe directory cannot be set up (free_space_reserve)"),
        "{b}"
    );
    assert!(b.contains("setup free_space_reserve"), "{b}");
    assert!(b.contains("(probe files not set up)"), "{b}");
    assert!(b.contains("Ceiling in force: unknown"), "{b}");

    let clusters = section(&dom, "clusters");
    assert!(
        clusters.contains("No PostgreSQL cluster is watched."),
        "{clusters}"
    );
    let collectors = section(&dom, "collectors");
    assert!(
        collectors.contains("probe:t ok") && collectors.contains("probe:blocked failed"),
        "{collectors}"
    );
}

/// PostgreSQL 18 with its WAL on the probed volume (found by discovery),
/// a provisioned IOPS cap, and some commits: the cluster's row and the
/// postgres basis of the commit ceiling.
#[test]
fn postgres_cluster_and_ceiling_bases_as_the_browser_shows_them() {
    let Some(bin) = chromium("the status page test with PostgreSQL") else {
        return;
    };
    let Some(stack) = Stack::builder()
        .password(MON_PASSWORD)
        .role("mon", true)
        .config_head(
            "window = \"1m\"\n\
             limits_interval = \"1s\"\n\
             [defaults]\n\
             interval = \"200ms\"\n\
             busy_every = \"5s\"\n\
             read_file_size = \"4MiB\"\n\
             free_space_reserve = \"0\"\n",
        )
        .volume("provisioned_iops = 100000")
        .cluster(
            "c",
            "mon",
            // The exporter's own queries are read-only transactions, which
            // leave the postgres basis out once they pass a tenth of the
            // writes: every 2 s they stay well under that also when a
            // loaded host slows pgbench's one client down.
            "scrape_interval = \"2s\"\n\
             wait_sampling_interval = \"2s\"\n\
             discover_volumes = true\n",
        )
        .ready("pg_up and the WAL on t", Duration::from_secs(60), |m| {
            m.contains("pgstorage_cluster_volume_info{cluster=\"c\",volume=\"t\",role=\"wal\"} 1")
                && sample(m, "pgstorage_pg_up{cluster=\"c\"}") == Some(1.0)
                && count(m, "t", "commit") >= 2.0
        })
        .start()
    else {
        return;
    };
    stack.pg.pgbench_inserts(1, 6);
    stack
        .ex
        .wait_for("basis=postgres", Duration::from_secs(30), |m| {
            m.contains("pgstorage_commit_ceiling_per_second{volume=\"t\",basis=\"postgres\"}")
        });
    // The audit looks at a cluster 10 s after its collector first read it.
    stack
        .ex
        .wait_for("the audit of cluster c", Duration::from_secs(60), |m| {
            sample(m, "pgstorage_audit_evaluated_checks{cluster=\"c\"}").is_some_and(|n| n > 0.0)
        });
    let url = stack.url("/");
    let (dom, m) = dom_of_one_audit_pass(bin, &url, &stack.ex);
    screenshot(bin, &url, "status.png", 2000);

    let t = section(&dom, "volume-t");
    for want in ["Volume t", "busy p50", "after idle p50", "provisioned iops"] {
        assert!(t.contains(want), "{want:?} missing from volume t: {t}");
    }
    let (ceiling, basis) = in_force(&t);
    assert!(ceiling > 0.0, "{t}");
    assert!(
        ["probe_mean", "postgres", "cap"].contains(&basis.as_str()),
        "{t}"
    );
    // The basis in force is the one marked in the table, and PostgreSQL's
    // own WAL syncs are a basis.
    assert!(t.contains(&format!("{basis} ")), "{t}");
    assert!(
        t.contains("postgres ")
            && t.contains(
                "1 / (PostgreSQL's own mean WAL write + sync time per sync, over the intervals \
                 of one commit per sync, + the fastest SELECT 1 round trip)"
            ),
        "{t}"
    );
    assert_eq!(t.matches(" yes").count(), 1, "{t}");

    let clusters = section(&dom, "clusters");
    let row = clusters
        .split_once(" c up 18")
        .unwrap_or_else(|| panic!("cluster c is not shown up on 18: {clusters}"))
        .1;
    // track_io_timing, track_wal_io_timing (the harness turns both on),
    // then the WAL volume.
    assert!(row.contains(" on on t "), "{clusters}");
    // The WAL figures name the cluster's window beside the alert's; the
    // cluster's audit cell counts what /metrics has for it.
    assert!(
        clusters.contains(
            "WAL sync mean last 1 min WAL sync time share last 1 min \
             (the PgStorageWalSyncSaturated alert: 5 min)"
        ),
        "{clusters}"
    );
    let c_row = table_row(&dom, "clusters", "c");
    let own = audit_findings(&m, &["cluster=\"c\""], false);
    assert_eq!(cell_count(&c_row, "audit"), own, "{c_row}\n{m}");
    assert_eq!(
        cell_count(&c_row, "host-wide"),
        audit_findings(&m, &[], true),
        "{c_row}\n{m}"
    );
    assert!(!c_row.contains("not checked"), "{c_row}");
    let audit = section(&dom, "audit");
    assert!(audit.contains("Cluster c "), "{audit}");
    // What each basis of the ceiling and the cap's utilization are over.
    assert!(
        t.contains("the last 1 min (the window) of cluster c")
            && t.contains("the cap as the latest limits pass read it")
            && t.contains("utilization over the last "),
        "{t}"
    );
    let collectors = section(&dom, "collectors");
    assert!(
        collectors.contains("postgres:c ok") && collectors.contains("probe:t ok"),
        "{collectors}"
    );
}

/// The `pgstorage_audit_finding` series of a scrape whose labels hold
/// every `k="v"` of `labels`; host-wide ones (neither `volume` nor
/// `cluster`) with `host_wide`.
fn audit_findings(m: &str, labels: &[&str], host_wide: bool) -> usize {
    samples_with(m, "pgstorage_audit_finding", labels)
        .iter()
        .filter(|(s, _)| !host_wide || !(s.contains("volume=") || s.contains("cluster=")))
        .count()
}

/// The DOM of `url` together with a scrape of the same audit pass: the
/// page is rendered between two scrapes that show the same latest pass.
fn dom_of_one_audit_pass(bin: &str, url: &str, ex: &Exporter) -> (String, String) {
    let last = |m: &str| sample(m, "pgstorage_audit_last_run_timestamp_seconds");
    for _ in 0..5 {
        let before = ex.metrics();
        let dom = dump_dom(bin, url);
        let after = ex.metrics();
        if last(&before).is_some() && last(&before) == last(&after) {
            return (dom, after);
        }
    }
    panic!("an audit pass ran during each of 5 page loads");
}

/// The text of the summary row of `volume` (or of the clusters table's
/// row of a cluster): the text of the `<tr>` whose first cell is `name`.
fn table_row(dom: &str, table: &str, name: &str) -> String {
    let start = dom
        .find(&format!("<table class=\"{table}\""))
        .unwrap_or_else(|| panic!("no table {table}: {dom}"));
    let t = &dom[start..start + dom[start..].find("</table>").unwrap()];
    let tr = t
        .split("<tr>")
        .find(|r| r.starts_with(&format!("<td>{name}</td>")))
        .unwrap_or_else(|| panic!("no row {name} in {table}: {t}"));
    text(tr.split("</tr>").next().unwrap())
}

/// The count before `what` in a findings cell ("1 probe, 2 audit, 3
/// host-wide (1 ignored)"), 0 when the cell has none of it.
fn cell_count(cell: &str, what: &str) -> usize {
    let words: Vec<&str> = cell
        .split(|c: char| c == ',' || c == '(' || c == ')' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .find(|w| w[1] == what)
        .map_or(0, |w| w[0].parse().unwrap())
}

/// Two volumes in memory (a tmpfs under /dev/shm): the audit reports
/// `memory_filesystem` (critical) on `mem`, and `scratch` silences it with
/// `audit.ignore`. The page's audit section lists the finding with its
/// evidence and fix; `mem`'s findings cell is not "none" and counts the
/// audit findings /metrics has for it, and the host-wide ones as /metrics
/// has them; `scratch` says one is ignored; each windowed figure names its
/// window (1 min here).
#[test]
fn audit_findings_and_the_windows_as_the_browser_shows_them() {
    let Some(bin) = chromium("the status page audit test") else {
        return;
    };
    let shm_tmpfs = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.contains(" /dev/shm ") && l.contains(" - tmpfs "));
    if !shm_tmpfs {
        cannot_run(
            Part::Root,
            "audit_findings_and_the_windows_as_the_browser_shows_them",
            "/dev/shm is not a tmpfs here",
        );
        return;
    }
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let (mem, scratch) = (shm.path().join("mem"), shm.path().join("scratch"));
    std::fs::create_dir_all(&mem).unwrap();
    std::fs::create_dir_all(&scratch).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    // audit_interval an hour: after the pass at start and the one 10 s
    // later, the findings stay as they are while the page is compared
    // with /metrics.
    std::fs::write(
        &cfg,
        format!(
            "window = \"1m\"\naudit_interval = \"1h\"\n\
             [defaults]\ninterval = \"100ms\"\nread_file_size = \"1MiB\"\nbusy_every = \"5s\"\n\
             free_space_reserve = \"0\"\n\
             [[volume]]\nname = \"mem\"\npath = \"{}\"\n\
             [[volume]]\nname = \"scratch\"\npath = \"{}\"\n\
             audit.ignore = [\"memory_filesystem\"]\n",
            mem.display(),
            scratch.display()
        ),
    )
    .unwrap();
    let ex = Exporter::start(&["--config.file", cfg.to_str().unwrap()]);
    ex.wait_for(
        "memory_filesystem on mem and the probe ceiling",
        Duration::from_secs(60),
        |m| {
            sample(m, "pgstorage_audit_runs_total").is_some_and(|r| r >= 2.0)
                && sample(
                    m,
                    "pgstorage_audit_finding{code=\"memory_filesystem\",severity=\"critical\",volume=\"mem\"}",
                ) == Some(1.0)
                && sample(
                    m,
                    "pgstorage_commit_ceiling_per_second{volume=\"mem\",basis=\"probe_mean\"}",
                )
                .is_some()
        },
    );
    let url = format!("http://{}/", ex.addr);
    let (dom, m) = dom_of_one_audit_pass(bin, &url, &ex);
    // Tall enough for the audit section below the volumes.
    screenshot(bin, &url, "status-audit.png", 4000);
    assert!(
        !m.contains("code=\"memory_filesystem\",severity=\"critical\",volume=\"scratch\""),
        "{m}"
    );

    // The audit section: the finding with its evidence, meaning and fix,
    // and as many findings in all as /metrics has.
    let audit = section(&dom, "audit");
    let group = |title: &str| {
        let g = audit
            .split_once(title)
            .unwrap_or_else(|| panic!("no group {title:?}: {audit}"))
            .1;
        ["Volume ", "Cluster "]
            .iter()
            .filter_map(|next| g.find(next))
            .min()
            .map_or(g, |end| &g[..end])
            .to_string()
    };
    assert!(audit.contains("Host (kernel settings"), "{audit}");
    let mem_group = group("Volume mem ");
    for want in [
        "critical memory_filesystem mountinfo fstype = tmpfs The volume lives in memory",
        "put the data and WAL on a disk-backed filesystem (ext4 or XFS)",
    ] {
        assert!(
            mem_group.contains(want),
            "{want:?} missing from mem's audit: {mem_group}"
        );
    }
    let scratch_group = group("Volume scratch ");
    assert!(
        scratch_group
            .contains("Silenced by audit.ignore, not counted as findings: 1 (memory_filesystem).")
            && !scratch_group.contains("critical"),
        "{scratch_group}"
    );
    let total = audit_findings(&m, &[], false);
    let stated = audit
        .split_once(" ago: ")
        .and_then(|(_, r)| r.split_once(" finding"))
        .map(|(n, _)| n.parse::<usize>().unwrap())
        .unwrap_or_else(|| panic!("no count of findings: {audit}"));
    assert_eq!(stated, total, "{audit}\n{m}");

    // Each volume's findings cell agrees with /metrics, and mem's is not
    // "none".
    let host_wide = audit_findings(&m, &[], true);
    for (volume, ignored) in [("mem", 0), ("scratch", 1)] {
        let r = table_row(&dom, "summary", volume);
        let own = audit_findings(&m, &[&format!("volume=\"{volume}\"")], false);
        assert_eq!(cell_count(&r, "audit"), own, "{volume}: {r}\n{m}");
        assert_eq!(cell_count(&r, "host-wide"), host_wide, "{volume}: {r}\n{m}");
        assert_eq!(cell_count(&r, "ignored"), ignored, "{volume}: {r}");
        eprintln!("{volume}: {own} audit, {host_wide} host-wide in /metrics; row: {r}");
    }
    let mem_row = table_row(&dom, "summary", "mem");
    assert!(!mem_row.contains("none"), "{mem_row}");
    assert!(cell_count(&mem_row, "audit") >= 1, "{mem_row}");
    let v = section(&dom, "volume-mem");
    assert!(
        v.contains("Audit, critical memory_filesystem : The volume lives in memory"),
        "{v}"
    );

    // The windows, beside the figures.
    let summary = section(&dom, "summary");
    for want in [
        "commit p50 busy last 1 min",
        "read p50 after idle last 1 min",
        "probe_mean last 1 min",
    ] {
        assert!(summary.contains(want), "{want:?} missing: {summary}");
    }
    for want in [
        "Latency, last 1 min (the window)",
        "the last 1 min (the window), busy bursts",
        "Probe errors since start",
    ] {
        assert!(v.contains(want), "{want:?} missing from volume mem: {v}");
    }
}
