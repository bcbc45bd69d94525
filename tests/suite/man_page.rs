//! The manual page is generated from the same clap definitions as
//! `--help`, so every flag `--help` lists is in it, and `man` renders it.

use crate::common;

use std::process::Command;

use common::BIN;

#[test]
fn man_page_has_every_flag_of_help_and_renders() {
    let out = Command::new(BIN).arg("man").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.contains(".TH pg-storage-exporter 1"), "{page}");
    assert!(page.contains("CHECK SUBCOMMAND"), "{page}");
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let flags: Vec<&str> = help
        .split_whitespace()
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.trim_end_matches(|c: char| !c.is_alphanumeric()))
        .collect();
    assert!(flags.len() >= 15, "{flags:?}");
    for f in &flags {
        // roff escapes '-' as '\-'.
        let roff = f.replace('-', "\\-");
        assert!(page.contains(&roff), "{f} missing from the man page");
    }
    // `check`'s own options are in the same page.
    for f in [
        "\\-\\-sweep",
        "\\-\\-duration",
        "\\-\\-format",
        "\\-\\-fail\\-on",
    ] {
        assert!(page.contains(f), "{f} missing from the man page");
    }
    // check's exit statuses, --fail-on's 3 among them.
    assert!(page.contains("Exit status: 0 after a run"), "{page}");
    assert!(page.contains("3 when \\-\\-fail\\-on is given"), "{page}");
    // man(1) renders it when installed (Debian's man-db); a roff error
    // would show as a warning on stderr.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pg-storage-exporter.1");
    std::fs::write(&file, &page).unwrap();
    if let Ok(r) = Command::new("man")
        .arg("-l")
        .arg(&file)
        .env("MANWIDTH", "80")
        .output()
    {
        let text = String::from_utf8_lossy(&r.stdout);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        assert!(text.contains("--probe.interval"), "{text}");
    }
}
