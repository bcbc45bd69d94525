//! Helpers for the operator-kit tests (tests/suite/rules.rs, tests/suite/dashboards.rs,
//! tests/suite/e2e_prometheus.rs, tests/suite/manifests.rs): where the kit's files are,
//! the PromQL expressions of the Grafana dashboards with their template
//! variables substituted, the metric and label names an expression uses,
//! URL encoding, and running external tools with a clear message when they
//! are missing.
//!
//! It depends only on std and serde_json.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A path inside the repository.
pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The Prometheus rule files, in load order.
pub const RULE_FILES: &[&str] = &[
    "deploy/prometheus/recording.rules.yml",
    "deploy/prometheus/alerts.rules.yml",
];

/// The Grafana dashboards: (file name, parsed JSON), sorted by name.
pub fn dashboards() -> Vec<(String, serde_json::Value)> {
    let dir = repo("dashboards");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&p).unwrap();
            let v: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", p.display()));
            out.push((p.file_name().unwrap().to_string_lossy().into_owned(), v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!out.is_empty(), "no dashboards in {}", dir.display());
    out
}

/// Every panel of a dashboard, rows' nested panels included.
pub fn panels(dash: &serde_json::Value) -> Vec<&serde_json::Value> {
    fn walk<'a>(list: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            if let Some(inner) = p.get("panels") {
                walk(inner, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

/// One PromQL expression of a dashboard.
#[derive(Debug, Clone)]
pub struct DashQuery {
    pub dashboard: String,
    /// Panel title, or `variable <name>` for a template variable.
    pub title: String,
    pub ref_id: String,
    /// As written in the dashboard, with template variables.
    pub raw: String,
}

/// The expressions of every panel target, and of every query variable
/// (`label_values(EXPR, label)` gives `EXPR`).
pub fn dashboard_queries(file: &str, dash: &serde_json::Value) -> Vec<DashQuery> {
    let mut out = Vec::new();
    for p in panels(dash) {
        let title = p["title"].as_str().unwrap_or("").to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push(DashQuery {
                    dashboard: file.to_string(),
                    title: title.clone(),
                    ref_id: t["refId"].as_str().unwrap_or("").to_string(),
                    raw: expr.to_string(),
                });
            }
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = match &v["query"] {
            serde_json::Value::String(s) => s.clone(),
            other => other["query"].as_str().unwrap_or("").to_string(),
        };
        if let Some(expr) = label_values_expr(&q) {
            out.push(DashQuery {
                dashboard: file.to_string(),
                title: format!("variable {}", v["name"].as_str().unwrap_or("")),
                ref_id: String::new(),
                raw: expr,
            });
        }
    }
    out
}

/// `label_values(EXPR, label)` → `EXPR`; `None` for `label_values(label)`.
pub fn label_values_expr(q: &str) -> Option<String> {
    let inner = q.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (expr, _label) = inner.rsplit_once(',')?;
    Some(expr.trim().to_string())
}

/// Template variables and the concrete values they get for evaluation:
/// regexes that match everything for the dashboard variables (they are
/// always used with `=~`), durations for Grafana's interval variables.
pub const SUBSTITUTIONS: &[(&str, &str)] = &[
    ("__rate_interval", "1m"),
    ("__interval_ms", "15000"),
    ("__interval", "15s"),
    ("__range", "5m"),
    ("datasource", "prometheus"),
    ("instance", ".*"),
    ("cluster", ".*"),
    ("volume", ".*"),
    ("job", ".*"),
];

/// The expression with every template variable (`$name`, `${name}`)
/// replaced by a concrete value. Panics on a variable it does not know.
pub fn substitute(raw: &str) -> String {
    let mut s = raw.to_string();
    for (name, value) in SUBSTITUTIONS {
        s = s.replace(&format!("${{{name}}}"), value);
        s = s.replace(&format!("${name}"), value);
    }
    if let Some(i) = s.find('$') {
        panic!("unknown template variable at {:?} in {raw:?}", &s[i..]);
    }
    s
}

/// Percent-encoding of a query-string value (everything but RFC 3986's
/// unreserved characters).
pub fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// PromQL keywords and functions that look like identifiers.
const PROMQL_WORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "offset",
    "bool",
    "inf",
    "nan",
];

/// Names of the `pgstorage_*` metrics an expression reads (recorded series,
/// which contain `:`, are left out).
pub fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (start, word) in identifiers(expr) {
        let next = expr[start + word.len()..].chars().next();
        if word.starts_with("pgstorage_") && next != Some(':') && !word.contains(':') {
            let prev = expr[..start].chars().last();
            if prev != Some(':') {
                out.push(word.to_string());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Label names an expression uses: in selectors (`name=~"..."`) and in
/// `by`, `without`, `on`, `ignoring`, `group_left` and `group_right` lists.
pub fn label_names(expr: &str) -> Vec<String> {
    let blanked = blank_strings(expr);
    let expr = blanked.as_str();
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    // Selector matchers: an identifier followed by =, !=, =~ or !~ (but not ==).
    for (start, word) in identifiers(expr) {
        let rest = expr[start + word.len()..].trim_start();
        let is_matcher = (rest.starts_with('=') && !rest.starts_with("=="))
            || rest.starts_with("!=")
            || rest.starts_with("!~");
        if is_matcher && !PROMQL_WORDS.contains(&word) {
            out.push(word.to_string());
        }
    }
    // Grouping lists.
    for kw in [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ] {
        let mut from = 0;
        while let Some(i) = expr[from..].find(kw) {
            let at = from + i;
            from = at + kw.len();
            let before_ok = at == 0 || !is_ident_byte(bytes[at - 1]);
            let after = &expr[at + kw.len()..];
            let after_ok = after.chars().next().is_some_and(|c| !is_ident_char(c));
            if !(before_ok && after_ok) {
                continue;
            }
            let after = after.trim_start();
            if let Some(list) = after.strip_prefix('(') {
                let list = &list[..list.find(')').unwrap_or(list.len())];
                for l in list.split(',') {
                    let l = l.trim();
                    if !l.is_empty() {
                        out.push(l.to_string());
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The expression with the contents of its string literals replaced by
/// spaces (same length, so offsets still match).
fn blank_strings(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in expr.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                    out.push_str(&" ".repeat(c.len_utf8()));
                } else if c == '\\' {
                    escaped = true;
                    out.push(' ');
                } else if c == q {
                    quote = None;
                    out.push(c);
                } else {
                    out.push_str(&" ".repeat(c.len_utf8()));
                }
            }
            None => {
                if c == '"' || c == '\'' || c == '`' {
                    quote = Some(c);
                }
                out.push(c);
            }
        }
    }
    out
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// (byte offset, identifier) of every identifier outside string literals.
fn identifiers(expr: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'"' || b == b'\'' || b == b'`' {
            // Skip the string literal.
            i += 1;
            while i < bytes.len() && bytes[i] != b {
                if bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if b.is_ascii_alphabetic() || b == b'_' {
            let start = i;
            while i < bytes.len() && is_ident_byte(bytes[i]) {
                i += 1;
            }
            out.push((start, &expr[start..i]));
        } else {
            i += 1;
        }
    }
    out
}

/// The probe families whose series carry `phase` (busy | after_idle).
pub const PHASED_FAMILIES: &[&str] = &[
    "pgstorage_probe_seconds",
    "pgstorage_probe_window_seconds",
    "pgstorage_probe_window_samples",
];

/// Selectors on the phased probe families, and on series recorded from
/// them (`instance_volume_op:pgstorage_probe_seconds:*`), that have no
/// `phase` matcher, as written (`name{...}`), and how many selectors on them
/// the expression has in all. Without a phase matcher a query returns both
/// phases, and a sum over buckets mixes them into a distribution that
/// describes neither.
pub fn selectors_without_phase(expr: &str) -> (Vec<String>, usize) {
    let (mut missing, mut seen) = (Vec::new(), 0);
    for (start, name) in identifiers(expr) {
        let phased = name.split(':').any(|part| {
            PHASED_FAMILIES.iter().any(|f| {
                part.strip_prefix(f)
                    .is_some_and(|s| matches!(s, "" | "_bucket" | "_sum" | "_count"))
            })
        });
        if !phased {
            continue;
        }
        seen += 1;
        let rest = expr[start + name.len()..].trim_start();
        let sel = if rest.starts_with('{') {
            &rest[..rest.find('}').map_or(rest.len(), |j| j + 1)]
        } else {
            ""
        };
        if !["phase=", "phase!=", "phase!~"]
            .iter()
            .any(|m| sel.contains(m))
        {
            missing.push(format!("{name}{sel}"));
        }
    }
    (missing, seen)
}

/// Metric names in the catalogue tables of docs/metrics.md.
pub fn documented_metrics() -> Vec<String> {
    let text = std::fs::read_to_string(repo("docs/metrics.md")).unwrap();
    let mut out: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("| `pgstorage_"))
        .filter_map(|l| l.split('`').nth(1).map(str::to_string))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Label names in the catalogue tables of docs/metrics.md.
pub fn documented_labels() -> Vec<String> {
    let text = std::fs::read_to_string(repo("docs/metrics.md")).unwrap();
    let mut out = Vec::new();
    for l in text.lines().filter(|l| l.starts_with("| `pgstorage_")) {
        if let Some(col) = l.split('|').nth(3) {
            for part in col.split('`').skip(1).step_by(2) {
                out.push(part.to_string());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Runs a program; panics with a clear message when it is not installed.
pub fn run_tool(program: &str, args: &[&str], install_hint: &str) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(repo("."))
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{program}` ({e}): {install_hint}"))
}

/// stdout and stderr of a finished program, for messages.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
