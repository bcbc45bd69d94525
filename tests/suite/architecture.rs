//! The invariants ARCHITECTURE.md states, checked on the source text (as
//! rust-analyzer's tidy tests do): which top-level module may use which,
//! no module cycle, no cycle between source files (outside the modules
//! `FILE_CYCLES_LEFT` names), `unsafe` only in `src/sys.rs`, and no blocking
//! filesystem call in async code outside `spawn_blocking`.
//!
//! Each check is a pure function over (path, text) pairs, so the unit
//! tests at the bottom show that a forbidden import does fail it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level module → the top-level modules it may use. Leaves first.
/// ARCHITECTURE.md has the same table in prose; change both together.
const ALLOWED: &[(&str, &[&str])] = &[
    ("units", &[]),
    ("types", &[]),
    ("errno", &[]),
    ("families", &[]),
    ("sys", &[]),
    ("events", &[]),
    ("input", &[]),
    ("audit", &[]),
    ("model", &["types", "units"]),
    ("ebpf", &["model"]),
    (
        "probe",
        &["model", "types", "units", "events", "sys", "errno"],
    ),
    (
        "postgres",
        &[
            "model", "types", "units", "events", "families", "sys", "input",
        ],
    ),
    (
        "limits",
        &[
            "model", "types", "units", "events", "families", "sys", "input", "errno",
        ],
    ),
    (
        "exposition",
        &[
            "families", "model", "types", "units", "probe", "postgres", "limits", "audit", "ebpf",
        ],
    ),
    (
        "http",
        &[
            "exposition",
            "events",
            "families",
            "model",
            "types",
            "units",
            "probe",
            "postgres",
            "limits",
            "input",
            "errno",
            "ebpf",
            "audit",
        ],
    ),
    (
        "config",
        &[
            "model", "types", "units", "probe", "postgres", "limits", "audit", "input",
        ],
    ),
    (
        "check",
        &["model", "types", "units", "probe", "sys", "audit", "limits"],
    ),
    ("cli", &["types", "units"]),
    ("logging", &["cli"]),
    (
        "app",
        &[
            "audit",
            "config",
            "ebpf",
            "exposition",
            "families",
            "http",
            "limits",
            "model",
            "postgres",
            "probe",
            "sys",
            "types",
            "units",
        ],
    ),
    (
        "entry",
        &[
            "app", "audit", "check", "cli", "config", "http", "logging", "model", "postgres", "sys",
        ],
    ),
];

/// Blocking filesystem calls that must not run on an async worker: on a
/// hung network volume each one can block a worker thread for minutes.
const BLOCKING_FS: &[&str] = &[
    "std::fs::",
    "fs::read",
    "fs::metadata",
    "fs::canonicalize",
    "fs::write",
    "fs::create_dir",
    "fs::remove",
    "File::open",
    "File::create",
    "OpenOptions::new",
    ".canonicalize()",
    ".metadata()",
    ".read_dir()",
    ".exists()",
    ".is_dir()",
    ".is_file()",
];

fn sources() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                out.push((p, text));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    walk(&root, &mut out);
    out.into_iter()
        .map(|(p, t)| (p.strip_prefix(&root).unwrap().to_path_buf(), t))
        .collect()
}

/// `probe/runner.rs` → `probe`; `check.rs` → `check`.
fn top_module(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The text without comments and string literals, so neither a doc
/// comment nor a help text counts as a use.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if b[i] == b'"' {
            // Raw strings (r"..", r#".."#) have no escapes; plain ones do.
            let raw = i > 0 && (b[i - 1] == b'r' || b[i - 1] == b'#');
            let hashes = if raw {
                let mut h = 0;
                let mut j = i;
                while j > 0 && b[j - 1] == b'#' {
                    h += 1;
                    j -= 1;
                }
                h
            } else {
                0
            };
            i += 1;
            while i < b.len() {
                if !raw && b[i] == b'\\' {
                    i += 2;
                    continue;
                }
                if b[i] == b'"' && b[i + 1..].iter().take(hashes).all(|c| *c == b'#') {
                    i += 1 + hashes;
                    break;
                }
                if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
            continue;
        }
        // A char literal such as '"' would otherwise open a string.
        if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            out.push_str("' '");
            i += 3;
            continue;
        }
        if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') && b.get(i + 3) == Some(&b'\'') {
            out.push_str("' '");
            i += 4;
            continue;
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// Top-level modules a file uses through `crate::` paths, with the line
/// the path starts on (a `use crate::{...}` group may span several lines).
fn uses(text: &str) -> Vec<(String, usize)> {
    fn ident(s: &str) -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    }
    let code = code_only(text);
    let mut out = Vec::new();
    let (mut line, mut counted) = (1, 0);
    for (i, _) in code.match_indices("crate::") {
        line += code[counted..i].matches('\n').count();
        counted = i;
        let after = &code[i + "crate::".len()..];
        let names: Vec<String> = match after.strip_prefix('{') {
            Some(group) => group[..group.find('}').unwrap_or(group.len())]
                .split(',')
                .map(ident)
                .filter(|n| n != "self")
                .collect(),
            None => vec![ident(after)],
        };
        out.extend(
            names
                .into_iter()
                .filter(|n| !n.is_empty())
                .map(|n| (n, line)),
        );
    }
    out
}

/// Every forbidden use: (file, line, from, to).
fn forbidden(files: &[(PathBuf, String)]) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut bad = Vec::new();
    for (path, text) in files {
        let from = top_module(path);
        if from == "lib" || from == "main" {
            continue;
        }
        let Some(ok) = allowed.get(from.as_str()) else {
            bad.push(format!(
                "{}: module `{from}` is not in the dependency table (tests/suite/architecture.rs ALLOWED, ARCHITECTURE.md)",
                path.display()
            ));
            continue;
        };
        for (to, line) in uses(text) {
            if to != from && !ok.contains(&to.as_str()) {
                bad.push(format!(
                    "{}:{line}: `{from}` uses `crate::{to}`; {from} may use only {ok:?}",
                    path.display()
                ));
            }
        }
    }
    bad
}

/// The module graph as used (not as allowed), for the cycle check.
fn graph(files: &[(PathBuf, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in files {
        let from = top_module(path);
        if from == "lib" || from == "main" {
            continue;
        }
        let e = g.entry(from.clone()).or_default();
        for (to, _) in uses(text) {
            if to != from {
                e.insert(to);
            }
        }
    }
    g
}

/// A cycle in the graph, if any, as a path `a → b → a`.
fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut c = stack[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

/// `probe/engine/mod.rs` → `["probe", "engine"]`, `check.rs` → `["check"]`,
/// `lib.rs` → `[]`: the module a file holds.
fn module_of(rel: &Path) -> Vec<String> {
    let mut m: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = m.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (m.is_empty() && stem == "lib")) {
        m.push(stem.to_string());
    }
    m
}

/// The code without its `#[cfg(test)]` items: test code may reach
/// anywhere, and an inline `mod tests`'s `super` is its own file.
fn without_tests(code: &str) -> String {
    let mut out = code.to_string();
    while let Some(i) = out.find("#[cfg(test)]") {
        let after = i + "#[cfg(test)]".len();
        let semi = out[after..].find(';').map(|j| after + j);
        let brace = out[after..].find('{').map(|j| after + j);
        let end = match (semi, brace) {
            (Some(s), Some(b)) if s < b => s + 1,
            (_, Some(b)) => body(&out, b).map_or(out.len(), |(_, e)| e),
            (Some(s), None) => s + 1,
            (None, None) => out.len(),
        };
        out.replace_range(i..end, &" ".repeat(end - i));
    }
    out
}

/// The paths of a use tree or expression path starting at `at` (just
/// after its first `::`): `a::b`, `{a, b::{c, self}}`, `X as Y`. Each is
/// the list of its segments; a trailing `self` adds none.
fn use_tree(code: &str, at: usize) -> Vec<Vec<String>> {
    fn tree(b: &[u8], i: &mut usize) -> Vec<Vec<String>> {
        let skip_ws = |i: &mut usize| {
            while *i < b.len() && b[*i].is_ascii_whitespace() {
                *i += 1;
            }
        };
        let mut prefix = Vec::new();
        loop {
            skip_ws(i);
            if *i < b.len() && b[*i] == b'{' {
                *i += 1;
                let mut all = Vec::new();
                loop {
                    skip_ws(i);
                    if *i >= b.len() || b[*i] == b'}' {
                        *i += 1;
                        break;
                    }
                    for p in tree(b, i) {
                        let mut full = prefix.clone();
                        full.extend(p);
                        all.push(full);
                    }
                    // Past an `as` alias to the next item of the group.
                    while *i < b.len() && b[*i] != b',' && b[*i] != b'}' {
                        *i += 1;
                    }
                    if *i < b.len() && b[*i] == b',' {
                        *i += 1;
                    }
                }
                return all;
            }
            let start = *i;
            while *i < b.len() && (b[*i].is_ascii_alphanumeric() || b[*i] == b'_') {
                *i += 1;
            }
            let seg = String::from_utf8_lossy(&b[start..*i]).into_owned();
            if !seg.is_empty() && seg != "self" && seg != "*" {
                prefix.push(seg);
            }
            if b[*i..].starts_with(b"::") {
                *i += 2;
            } else {
                return vec![prefix];
            }
        }
    }
    let mut i = at;
    tree(code.as_bytes(), &mut i)
}

/// The source-file graph: a file → the files whose items it names through
/// `crate::`, `super::`, `self::` or a child module's name (declaring a
/// module is not a use). Test code does not count.
fn file_graph(files: &[(PathBuf, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let by_module: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|(p, _)| (module_of(p), p.display().to_string()))
        .collect();
    // The file of the longest prefix of `path` that is a module.
    let resolve = |path: &[String]| -> Option<&String> {
        (0..=path.len())
            .rev()
            .find_map(|n| by_module.get(&path[..n]))
    };
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in files {
        let from = path.display().to_string();
        if from == "main.rs" {
            continue;
        }
        let me = module_of(path);
        let code = without_tests(&code_only(text));
        let b = code.as_bytes();
        let mut children = Vec::new();
        for line in code.lines() {
            let l = line.trim_start();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            if let Some(name) = l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                children.push(name.trim().to_string());
            }
        }
        let e = g.entry(from.clone()).or_default();
        let mut i = 0;
        while i < b.len() {
            let starts_word = b[i].is_ascii_alphabetic()
                && (i == 0
                    || !(b[i - 1].is_ascii_alphanumeric()
                        || matches!(b[i - 1], b'_' | b':' | b'$')));
            if !starts_word {
                i += 1;
                continue;
            }
            let end = i + code[i..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(code.len() - i);
            let word = &code[i..end];
            if !code[end..].starts_with("::") {
                i = end;
                continue;
            }
            let mut base = match word {
                "crate" => Vec::new(),
                "self" => me.clone(),
                "super" => me[..me.len().saturating_sub(1)].to_vec(),
                w if children.iter().any(|c| c == w) => {
                    let mut m = me.clone();
                    m.push(w.to_string());
                    m
                }
                _ => {
                    i = end;
                    continue;
                }
            };
            let mut at = end + 2;
            while word == "super" && code[at..].starts_with("super::") {
                base.pop();
                at += "super::".len();
            }
            for p in use_tree(&code, at) {
                let mut full = base.clone();
                full.extend(p);
                if let Some(to) = resolve(&full)
                    && *to != from
                {
                    e.insert(to.clone());
                }
            }
            i = end;
        }
    }
    g
}

/// The `{ ... }` body starting at the first `{` at or after `from`.
fn body(code: &str, from: usize) -> Option<(usize, usize)> {
    let start = from + code[from..].find('{')?;
    let mut depth = 0;
    for (i, c) in code[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((start, start + i + 1));
                }
            }
            _ => {}
        }
    }
    None
}

/// Blocking filesystem calls inside `async fn` bodies and `async` blocks,
/// not counting what is handed to `spawn_blocking(...)`.
fn blocking_in_async(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (path, text) in files {
        let code = code_only(text);
        let mut regions = Vec::new();
        for pat in ["async fn ", "async move {", "async {"] {
            let mut at = 0;
            while let Some(i) = code[at..].find(pat) {
                let i = at + i;
                if let Some(r) = body(&code, i) {
                    regions.push(r);
                }
                at = i + pat.len();
            }
        }
        for (s, e) in regions {
            let mut region = code[s..e].to_string();
            // Blank out spawn_blocking(...) arguments: that is where
            // blocking work belongs.
            while let Some(i) = region.find("spawn_blocking(") {
                let open = i + "spawn_blocking".len();
                let mut depth = 0;
                let mut end = region.len();
                for (j, c) in region[open..].char_indices() {
                    match c {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                end = open + j + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                region.replace_range(i..end, &" ".repeat(end - i));
            }
            for call in BLOCKING_FS {
                if let Some(k) = region.find(call) {
                    let line = code[..s + k].matches('\n').count() + 1;
                    bad.push(format!(
                        "{}:{line}: `{call}` in async code: move it into spawn_blocking",
                        path.display()
                    ));
                }
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

#[test]
fn modules_use_only_what_the_dependency_table_allows() {
    let bad = forbidden(&sources());
    assert!(bad.is_empty(), "forbidden uses:\n{}", bad.join("\n"));
}

/// Files with the `unsafe` keyword in code (comments, strings and the
/// `unsafe_code` lint attributes do not count).
fn unsafe_outside_sys(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (path, text) in files {
        if path == Path::new("sys.rs") {
            continue;
        }
        for (n, line) in code_only(text).lines().enumerate() {
            let words = line.split(|c: char| !(c.is_alphanumeric() || c == '_'));
            if words.into_iter().any(|w| w == "unsafe") {
                bad.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    bad
}

#[test]
fn unsafe_only_in_sys() {
    let bad = unsafe_outside_sys(&sources());
    assert!(
        bad.is_empty(),
        "`unsafe` outside src/sys.rs:\n{}",
        bad.join("\n")
    );
}

#[test]
fn unsafe_elsewhere_is_found() {
    let files = fake(&[
        ("sys.rs", "pub fn f() { unsafe { g() } }"),
        (
            "probe/files.rs",
            "// unsafe in a comment\nconst L: &str = \"unsafe_dir\";\nfn h() { unsafe { g() } }\n",
        ),
        (
            "lib.rs",
            "#![deny(unsafe_code)]\n#[allow(unsafe_code)]\npub mod sys;\n",
        ),
    ]);
    let bad = unsafe_outside_sys(&files);
    assert_eq!(bad, ["probe/files.rs:3: fn h() { unsafe { g() } }"]);
}

#[test]
fn no_module_cycle() {
    let g = graph(&sources());
    assert!(g.len() >= 10, "{g:?}");
    if let Some(c) = cycle(&g) {
        panic!("module cycle: {}", c.join(" → "));
    }
}

/// Top-level modules whose files still use each other in a cycle: a
/// parent `mod.rs` that uses a child whose code uses the parent's types
/// back. Every other module keeps its files acyclic, so a shared type
/// lives in the file the others depend on.
const FILE_CYCLES_LEFT: &[&str] = &[];

/// The file graph of the modules `keep` says yes to.
fn file_graph_of(
    files: &[(PathBuf, String)],
    keep: impl Fn(&str) -> bool,
) -> BTreeMap<String, BTreeSet<String>> {
    file_graph(files)
        .into_iter()
        .filter(|(f, _)| keep(&top_module(Path::new(f))))
        .collect()
}

#[test]
fn no_file_cycle() {
    let files = sources();
    let g = file_graph_of(&files, |m| !FILE_CYCLES_LEFT.contains(&m));
    assert!(g.contains_key("probe/engine/syscall.rs"), "{g:?}");
    if let Some(c) = cycle(&g) {
        panic!("source files use each other: {}", c.join(" → "));
    }
    // A module freed of its cycles leaves the list.
    for m in FILE_CYCLES_LEFT {
        assert!(
            cycle(&file_graph_of(&files, |t| t == *m)).is_some(),
            "`{m}` has no file cycle left: remove it from FILE_CYCLES_LEFT"
        );
    }
}

#[test]
fn no_blocking_filesystem_call_in_async_code() {
    let bad = blocking_in_async(&sources());
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

// The checks themselves, on made-up sources: each must catch what it is for.

fn fake(files: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
    files
        .iter()
        .map(|(p, t)| (PathBuf::from(p), t.to_string()))
        .collect()
}

#[test]
fn a_forbidden_import_fails() {
    let files = fake(&[
        ("probe/runner.rs", "use crate::config::Config;\nfn f() {}\n"),
        (
            "postgres/mod.rs",
            "use crate::{model::ceiling, probe::set::VolumeSet};\n",
        ),
        (
            "model/window.rs",
            "// crate::probe is only named in a comment\nconst S: &str = \"crate::http\";\n",
        ),
    ]);
    let bad = forbidden(&files);
    assert_eq!(bad.len(), 2, "{bad:#?}");
    assert!(bad[0].starts_with("probe/runner.rs:1: `probe` uses `crate::config`"));
    assert!(bad[1].starts_with("postgres/mod.rs:1: `postgres` uses `crate::probe`"));
}

#[test]
fn a_cycle_is_found() {
    let files = fake(&[
        ("a.rs", "use crate::b::X;"),
        ("b.rs", "use crate::c::Y;"),
        ("c.rs", "fn f() { crate::a::z(); }"),
    ]);
    let c = cycle(&graph(&files)).unwrap();
    assert_eq!(c, ["a", "b", "c", "a"]);
    assert!(cycle(&graph(&fake(&[("a.rs", "use crate::b::X;")]))).is_none());
}

#[test]
fn a_file_cycle_is_found() {
    // The probe engine as it was: files.rs held the engines' buffer type
    // and used engine/mod.rs, which uses syscall.rs, which used files.rs.
    let mut files = fake(&[
        (
            "probe/mod.rs",
            "pub mod engine;\npub mod files;\npub struct IoFailure;\n",
        ),
        (
            "probe/files.rs",
            "pub enum SetupError { Engine(#[from] crate::probe::engine::EngineUnavailable) }\n\
             pub type AlignedBuf = crate::sys::AlignedBuf<8192>;\n",
        ),
        (
            "probe/engine/mod.rs",
            "pub mod syscall;\nuse crate::probe::IoFailure;\npub struct EngineUnavailable;\n\
             fn f() { let c = syscall::Committer::new(); }\n",
        ),
        (
            "probe/engine/syscall.rs",
            "use crate::probe::files::AlignedBuf;\nuse crate::probe::{Cause, IoFailure};\n\
             #[cfg(test)]\nmod tests { use super::*; }\n",
        ),
        ("sys.rs", "pub struct AlignedBuf<const N: usize>;\n"),
    ]);
    let c = cycle(&file_graph(&files)).unwrap();
    assert_eq!(
        c,
        [
            "probe/engine/mod.rs",
            "probe/engine/syscall.rs",
            "probe/files.rs",
            "probe/engine/mod.rs"
        ]
    );
    // With the buffer type in syscall.rs the files form a line. A child
    // using its parent's item through `super::` is an edge too.
    files[1].1 = "pub enum SetupError { Engine(crate::probe::engine::EngineUnavailable) }\n".into();
    files[3].1 =
        "use crate::probe::{Cause, IoFailure};\ntype AlignedBuf = crate::sys::AlignedBuf<8192>;\n"
            .into();
    let g = file_graph(&files);
    assert!(cycle(&g).is_none(), "{g:?}");
    files[3]
        .1
        .push_str("fn g() -> super::EngineUnavailable { todo!() }\n");
    let c = cycle(&file_graph(&files)).unwrap();
    assert_eq!(
        c,
        [
            "probe/engine/mod.rs",
            "probe/engine/syscall.rs",
            "probe/engine/mod.rs"
        ]
    );
}

#[test]
fn blocking_calls_in_async_code_are_found_unless_in_spawn_blocking() {
    let files = fake(&[(
        "app/x.rs",
        "async fn bad(p: &Path) { let m = std::fs::metadata(p); }\n\
         async fn good(p: PathBuf) { tokio::task::spawn_blocking(move || std::fs::metadata(&p)).await; }\n\
         fn sync_is_fine(p: &Path) { let _ = p.canonicalize(); }\n\
         fn spawn() { tokio::spawn(async move { let _ = File::open(\"x\"); }); }\n",
    )]);
    let bad = blocking_in_async(&files);
    assert_eq!(bad.len(), 3, "{bad:#?}");
    assert!(bad[0].starts_with("app/x.rs:1: `fs::metadata`"), "{bad:#?}");
    assert!(
        bad.iter()
            .any(|b| b.starts_with("app/x.rs:4: `File::open`"))
    );
}

/// Every `src/…` path the documentation names exists, so a move cannot
/// leave ARCHITECTURE.md or the docs pointing at nothing.
#[test]
fn documented_source_paths_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("BENCHMARKS.md"),
        root.join("CONTRIBUTING.md"),
    ];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    let mut missing = Vec::new();
    for doc in docs {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (i, _) in text.match_indices("src/") {
            // Only whole paths: preceded by a backtick, space, ( or [.
            if i > 0 && !matches!(text.as_bytes()[i - 1], b'`' | b' ' | b'(' | b'[' | b'\n') {
                continue;
            }
            let path: String = text[i..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '_' | '.' | '-'))
                .collect();
            let path = path.trim_end_matches('.');
            if (path.ends_with(".rs") || path.ends_with('/')) && !root.join(path).exists() {
                missing.push(format!("{}: {path}", doc.display()));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The code map of ARCHITECTURE.md names every source file, by its path
/// in backticks (`src/probe/runner.rs`), so a new file cannot be left off
/// the map.
#[test]
fn code_map_names_every_source_file() {
    let map =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
            .unwrap();
    let files = sources();
    assert!(files.len() >= 50, "{} source files", files.len());
    let missing: Vec<String> = files
        .iter()
        .map(|(p, _)| p.display().to_string())
        .filter(|p| !map.contains(&format!("`src/{p}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "source files missing from ARCHITECTURE.md's code map (add one line each):\n{}",
        missing.join("\n")
    );
}
