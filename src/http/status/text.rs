//! Text the status page writes: HTML escaping, ages and spans. A file of
//! its own so the page and its audit section share it without using each
//! other.

use crate::model::verdict::fmt_seconds;

/// HTML-escapes text for element content and quoted attributes.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// "3 min ago" style age of a unix time.
pub(super) fn ago(then: f64, now: f64) -> String {
    let d = (now - then).max(0.0);
    if d < 120.0 {
        format!("{d:.0} s ago")
    } else if d < 7200.0 {
        format!("{:.0} min ago", d / 60.0)
    } else {
        format!("{:.1} h ago", d / 3600.0)
    }
}

/// A span in the largest unit that writes it whole: `15 min`, `90 s`, `1 h`.
pub(super) fn span(seconds: f64) -> String {
    let s = seconds.round().max(0.0);
    if s >= 3600.0 && s % 3600.0 == 0.0 {
        format!("{:.0} h", s / 3600.0)
    } else if s >= 60.0 && s % 60.0 == 0.0 {
        format!("{:.0} min", s / 60.0)
    } else if s >= 1.0 || seconds == 0.0 {
        format!("{s:.0} s")
    } else {
        fmt_seconds(seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn spans_in_the_largest_whole_unit() {
        for (secs, want) in [
            (900.0, "15 min"),
            (60.0, "1 min"),
            (90.0, "90 s"),
            (3600.0, "1 h"),
            (5400.0, "90 min"),
            (10.02, "10 s"),
            (0.0, "0 s"),
        ] {
            assert_eq!(span(secs), want, "{secs}");
        }
    }
}
