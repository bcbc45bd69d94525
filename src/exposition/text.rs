//! Small helpers for the hand-encoded metric families: the syntax shared by
//! the Prometheus text format and OpenMetrics, which differ only in how a
//! counter's family is named in HELP/TYPE lines.

use std::fmt::Write;

use super::Format;

/// Escapes a label value (backslash, double quote, newline).
pub fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// `{k="v",...}` with escaped values.
pub fn labels(pairs: &[(&str, &str)]) -> String {
    let mut s = String::from("{");
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{k}=\"{}\"", escape(v));
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
    let _ = writeln!(out, "{name}{labels} {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_label_values() {
        assert_eq!(escape(r#"/srv/a"b\c"#), r#"/srv/a\"b\\c"#);
        assert_eq!(escape("x\ny"), "x\\ny");
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
