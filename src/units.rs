//! Human-written sizes and durations ("64MiB", "500ms") for the config file
//! and flags. Parsing lives in serde `Deserialize` impls so a bad value is
//! reported by the TOML parser with its line, like any other type error.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A byte count: an integer, or a string with a unit (B, KiB, MiB, GiB, TiB,
/// or the decimal kB, MB, GB, TB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ByteSize(pub(crate) u64);

/// A duration written with a unit: ms, s, m or h ("250ms", "1s", "15m").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct HumanDuration(pub(crate) Duration);

pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let mult: u64 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "invalid size {s:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)"
            ));
        }
    };
    let value: f64 = num.parse().map_err(|_| {
        format!("invalid size {s:?}: expected a number followed by a unit, e.g. \"64MiB\"")
    })?;
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("invalid size {s:?}: out of range"));
    }
    Ok(bytes.round() as u64)
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let secs_per_unit = match unit.trim() {
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "" => {
            return Err(format!(
                "invalid duration {s:?}: a unit is required (us, ms, s, m or h), e.g. \"1s\""
            ));
        }
        other => {
            return Err(format!(
                "invalid duration {s:?}: unknown unit {other:?} (use us, ms, s, m or h)"
            ));
        }
    };
    let value: f64 = num.parse().map_err(|_| {
        format!("invalid duration {s:?}: expected a number followed by a unit, e.g. \"500ms\"")
    })?;
    let secs = value * secs_per_unit;
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("invalid duration {s:?}: out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Formats a byte count the way the config file accepts it back.
pub fn fmt_bytes(b: u64) -> String {
    for (unit, mult) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if b >= mult && b % mult == 0 {
            return format!("{}{unit}", b / mult);
        }
    }
    format!("{b}B")
}

/// Formats a duration the way the config file accepts it back, in the
/// largest unit that divides it: `1h`, `5m`, `10s`, `100ms`, `5µs`.
pub fn fmt_duration(d: Duration) -> String {
    let n = d.as_nanos();
    for (unit, mult) in [
        ("h", 3_600_000_000_000u128),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("µs", 1_000),
    ] {
        if n >= mult && n % mult == 0 {
            return format!("{}{unit}", n / mult);
        }
    }
    format!("{n}ns")
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"64MiB\" or a number of bytes")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("invalid size {v}: must not be negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_bytes(v).map(ByteSize).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"1s\" or \"500ms\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                parse_duration(v).map(HumanDuration).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HumanDuration, E> {
                Err(E::custom(format!(
                    "invalid duration {v}: write it as a string with a unit, e.g. \"{v}s\""
                )))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HumanDuration, E> {
                self.visit_i64(v as i64)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<HumanDuration, E> {
                Err(E::custom(format!(
                    "invalid duration {v}: write it as a string with a unit, e.g. \"{v}s\""
                )))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_table() {
        let ok = [
            ("8192", 8192),
            ("8KiB", 8192),
            ("64MiB", 64 << 20),
            ("1GiB", 1 << 30),
            ("1.5GiB", 3 << 29),
            ("10MB", 10_000_000),
            (" 16 MiB ", 16 << 20),
        ];
        for (s, want) in ok {
            assert_eq!(parse_bytes(s), Ok(want), "{s}");
        }
        for bad in ["", "MiB", "12 parsecs", "-1MiB", "1e400GiB"] {
            let e = parse_bytes(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn durations_table() {
        let ok = [
            ("1s", Duration::from_secs(1)),
            ("250ms", Duration::from_millis(250)),
            ("15m", Duration::from_secs(900)),
            ("1h", Duration::from_secs(3600)),
            ("0.5s", Duration::from_millis(500)),
            ("100us", Duration::from_micros(100)),
        ];
        for (s, want) in ok {
            assert_eq!(parse_duration(s), Ok(want), "{s}");
        }
        assert!(
            parse_duration("10")
                .unwrap_err()
                .contains("a unit is required")
        );
        assert!(
            parse_duration("1 sec")
                .unwrap_err()
                .contains("unknown unit \"sec\"")
        );
        assert!(
            parse_duration("s")
                .unwrap_err()
                .contains("expected a number")
        );
    }

    #[test]
    fn formats_bytes() {
        assert_eq!(fmt_bytes(16 << 20), "16MiB");
        assert_eq!(fmt_bytes(1 << 30), "1GiB");
        assert_eq!(fmt_bytes(1000), "1000B");
    }
}
