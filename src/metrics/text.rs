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
    out.push(' ');
    push_f64(out, value);
    out.push('\n');
}

/// Appends `v` exactly as `{v}` (Display) would, but whole numbers below
/// 2^53 (most counters: operations, bytes) through the integer formatter,
/// several times cheaper than the float one. The digits are the same: below
/// 2^53 the neighbours of a whole number are at most 1 apart, so its
/// shortest round-trip digits are all of its digits. -0 keeps the float
/// path (it prints "-0").
fn push_f64(out: &mut String, v: f64) {
    const EXACT: f64 = (1u64 << 53) as f64;
    if v.fract() == 0.0 && v.abs() < EXACT && !(v == 0.0 && v.is_sign_negative()) {
        let _ = write!(out, "{}", v as i64);
    } else {
        let _ = write!(out, "{v}");
    }
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
    fn whole_numbers_print_as_display_does() {
        let exact = (1u64 << 53) as f64;
        let mut vs = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            1e-7,
            123.456,
            1e15,
            1e15 + 1.0,
            exact - 1.0,
            exact,
            exact + 2.0,
            1e16,
            1e21,
            1e300,
            -(exact - 1.0),
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            vs.push((x >> (x % 64)) as f64);
            vs.push(-((x >> 11) as f64));
            vs.push(f64::from_bits(x));
        }
        for v in vs {
            let mut got = String::new();
            push_f64(&mut got, v);
            assert_eq!(got, format!("{v}"), "{v:e}");
        }
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
