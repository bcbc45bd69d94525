//! The repository cites only what it contains: no tracked text file may
//! point a reader at planning notes kept outside it (the facts, design and
//! style notes the project started from) or at a path of the machine it was
//! written on. What the project relies on from those lives in its own docs
//! (docs/design.md, docs/storage-facts.md), where it can be reviewed and
//! kept true to the code.

// Test code: a panic is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The forbidden citations. Spelt in pieces so that this file, which is
/// itself tracked and scanned, does not contain them.
fn forbidden() -> Vec<String> {
    let md = ".md";
    vec![
        ["FAC", "TS", md].concat(),
        ["DES", "IGN", md].concat(),
        ["STY", "LE", md].concat(),
        ["../", "shared"].concat(),
        ["/work", "/"].concat(),
    ]
}

/// Tracked files, from git; without git (a source tarball), every file
/// under the crate root except build output and git's own.
fn tracked(root: &Path) -> Vec<PathBuf> {
    if let Ok(out) = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
        && out.status.success()
    {
        return out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| root.join(String::from_utf8_lossy(p).as_ref()))
            .collect();
    }
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap_or_default();
            if name == "target" || name == ".git" {
                continue;
            }
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    files
}

#[test]
fn no_file_cites_notes_or_paths_outside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = tracked(root);
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "no files found under {}",
        root.display()
    );
    let needles = forbidden();
    let mut found = Vec::new();
    for file in &files {
        // Binary files (and files deleted but not yet committed) are skipped:
        // only text can cite.
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for needle in &needles {
                if line.contains(needle.as_str()) {
                    let rel = file.strip_prefix(root).unwrap_or(file);
                    found.push(format!(
                        "{}:{}: {needle}: {}",
                        rel.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "cite the repository's own docs (docs/design.md, docs/storage-facts.md) instead:\n{}",
        found.join("\n")
    );
}
