//! The repository cites only what it contains: no tracked text file may
//! point a reader at planning notes kept outside it (the facts, design and
//! style notes the project started from) or at a path of the machine it was
//! written on. What the project relies on from those lives in its own docs
//! (docs/design.md, docs/storage-facts.md), where it can be reviewed and
//! kept true to the code.

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

/// The Markdown files a reader follows: the root ones and `docs/`, plus
/// any other tracked `README.md` (deploy/kubernetes).
fn markdown(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = tracked(root)
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "md"))
        .filter(|f| {
            let rel = f.strip_prefix(root).unwrap_or(f);
            rel.components().count() == 1
                || rel.starts_with("docs")
                || rel.file_name().is_some_and(|n| n == "README.md")
        })
        .filter(|f| f.exists())
        .collect();
    docs.sort();
    docs
}

/// GitHub's anchor for a heading: lower case, punctuation dropped
/// (letters, digits, `_`, `-` and spaces kept), spaces made `-`; a repeated
/// heading gets `-1`, `-2`, ...
fn anchors(text: &str) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.iter().filter(|s| **s == slug).count();
        seen.push(slug.clone());
        out.push(if n == 0 { slug } else { format!("{slug}-{n}") });
    }
    out
}

/// Relative link targets of a Markdown text, outside code: `](target)`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

/// Every relative link in the docs resolves to a tracked file or
/// directory, and every `#anchor` to a heading of the file it names.
#[test]
fn doc_links_and_anchors_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = markdown(root);
    assert!(docs.len() >= 8, "{docs:?}");
    let mut bad = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let rel = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match link.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            checked += 1;
            if !target.exists() {
                bad.push(format!("{rel}: link to a missing path: {link}"));
                continue;
            }
            if let Some(anchor) = anchor {
                let t = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&t).iter().any(|a| a == anchor) {
                    bad.push(format!("{rel}: no heading for #{anchor} in {link}"));
                }
            }
        }
    }
    assert!(checked >= 50, "only {checked} links found");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Every repository path the docs name, in backticks or in a code block
/// (`scripts/test`, `deploy/systemd/config.toml`, `bench/run --sections 2`),
/// exists: a command a reader copies runs a file that is there. Globs and
/// placeholders (`*`, `<name>`, `$TMP`, `…`) are not paths, and neither is
/// a quoted value (`volume="bench/data"`).
#[test]
fn doc_paths_exist() {
    const TOP: &[&str] = &[
        "bench/",
        "config/",
        "dashboards/",
        "deploy/",
        "docs/",
        "examples/",
        "scripts/",
        "src/",
        "tests/",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = Vec::new();
    let mut checked = 0;
    for doc in markdown(root) {
        let text = std::fs::read_to_string(&doc).unwrap();
        let rel = doc.strip_prefix(root).unwrap_or(&doc).display().to_string();
        // Code spans and code-block lines: where commands and paths are.
        let mut spans: Vec<&str> = Vec::new();
        let mut in_code = false;
        for line in text.lines() {
            if line.starts_with("```") {
                in_code = !in_code;
                continue;
            }
            if in_code {
                spans.push(line);
            } else {
                spans.extend(line.split('`').skip(1).step_by(2));
            }
        }
        for span in spans {
            for word in span.split(|c: char| {
                c.is_whitespace() || matches!(c, '(' | ')' | '[' | ']' | ',' | ';' | '|')
            }) {
                let word = word.strip_prefix("./").unwrap_or(word);
                if !TOP.iter().any(|t| word.starts_with(t)) {
                    continue;
                }
                if word.contains(['*', '<', '$', '{', '…']) || word.contains("...") {
                    continue;
                }
                // `file.rs:125` (a log line's source), `file.md#anchor`.
                let path = word.split(['#', ':']).next().unwrap_or(word);
                let path = path.trim_end_matches(['.', ',']);
                checked += 1;
                if !root.join(path).exists() {
                    bad.push(format!("{rel}: {path}"));
                }
            }
        }
    }
    assert!(checked >= 100, "only {checked} paths found");
    bad.sort();
    bad.dedup();
    assert!(
        bad.is_empty(),
        "paths named in the docs that do not exist:\n{}",
        bad.join("\n")
    );
}

#[test]
fn anchors_follow_githubs_rules() {
    let text = "# Title\n## Busy and after idle: two true answers\n```\n## not a heading\n```\n\
                ### `pgstorage_probe_seconds` (histogram)\n## Install: systemd (VMs, bare metal)\n## Title\n";
    assert_eq!(
        anchors(text),
        [
            "title",
            "busy-and-after-idle-two-true-answers",
            "pgstorage_probe_seconds-histogram",
            "install-systemd-vms-bare-metal",
            "title-1",
        ]
    );
    assert_eq!(
        links("see [a](docs/a.md#x) and [b](b.md)\n```\n[c](not-a-link)\n```\n"),
        ["docs/a.md#x", "b.md"]
    );
}
