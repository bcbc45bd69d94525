//! Small helpers for the hand-encoded metric families: the syntax shared by
//! the Prometheus text format and OpenMetrics, which differ only in how a
//! counter's family is named in HELP/TYPE lines.

use std::borrow::Cow;
use std::fmt::Write;

use super::Format;

/// Escapes a label value (backslash, double quote, newline); borrowed when
/// there is nothing to escape, as for almost every value.
pub fn escape(v: &str) -> Cow<'_, str> {
    if !v.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        return Cow::Borrowed(v);
    }
    let mut out = String::with_capacity(v.len() + 8);
    escape_into(&mut out, v);
    Cow::Owned(out)
}

/// Appends `v` to `out`, escaped as a label value.
fn escape_into(out: &mut String, v: &str) {
    let mut rest = v;
    while let Some(i) = rest.bytes().position(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(&rest[..i]);
        out.push_str(match rest.as_bytes()[i] {
            b'\\' => "\\\\",
            b'"' => "\\\"",
            _ => "\\n",
        });
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
}

/// `{k="v",...}` with escaped values.
pub fn labels(pairs: &[(&str, &str)]) -> String {
    let len: usize = pairs.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
    let mut s = String::with_capacity(len + 2);
    s.push('{');
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(k);
        s.push_str("=\"");
        escape_into(&mut s, v);
        s.push('"');
    }
    s.push('}');
    s
}

pub fn gauge_header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
}

/// HELP/TYPE of a summary (same in both formats).
pub fn summary_header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} summary");
}

/// HELP/TYPE of a counter whose samples are `<base>_total`.
pub fn counter_header(out: &mut String, format: Format, base: &str, help: &str) {
    let family = match format {
        Format::OpenMetrics => base.to_string(),
        Format::Prometheus => format!("{base}_total"),
    };
    let _ = writeln!(out, "# HELP {family} {help}");
    let _ = writeln!(out, "# TYPE {family} counter");
}

pub fn sample(out: &mut String, name: &str, labels: &str, value: f64) {
    out.push_str(name);
    out.push_str(labels);
    let _ = writeln!(out, " {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_label_values() {
        assert_eq!(escape(r#"/srv/a"b\c"#), r#"/srv/a\"b\\c"#);
        assert_eq!(escape("x\ny"), "x\\ny");
        assert_eq!(escape("\\\"\n"), r#"\\\"\n"#);
        assert!(matches!(escape("/srv/pg ü"), Cow::Borrowed("/srv/pg ü")));
        assert_eq!(labels(&[]), "{}");
        assert_eq!(labels(&[("a", "1"), ("b", "x\"y")]), r#"{a="1",b="x\"y"}"#);
    }

    #[test]
    fn counter_family_names_differ_by_format() {
        let mut a = String::new();
        counter_header(&mut a, Format::OpenMetrics, "x", "h");
        assert_eq!(a, "# HELP x h\n# TYPE x counter\n");
        let mut b = String::new();
        counter_header(&mut b, Format::Prometheus, "x", "h");
        assert_eq!(b, "# HELP x_total h\n# TYPE x_total counter\n");
    }
}
