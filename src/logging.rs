//! Log setup: logfmt (default) or JSON, to stderr, so stdout stays free for
//! `check` output.
//!
//! Lines carry the keys the Prometheus exporters print through promslog (Go's
//! log/slog with `AddSource`): `time`, `level`, `source`, `msg`, then the
//! event's own fields.
//!
//! ```text
//! time=2026-12-03T09:18:02.123Z level=INFO source=src/app/daemon.rs:57 msg=listening address=127.0.0.1:9847
//! {"time":"2026-12-03T09:18:02.123456789Z","level":"INFO","source":"src/app/daemon.rs:57","msg":"listening","address":"127.0.0.1:9847"}
//! ```
//!
//! As slog prints them: the level in capitals (DEBUG, INFO, WARN, ERROR);
//! the logfmt time with exactly three decimals, the JSON time with up to
//! nine (RFC 3339 with nanoseconds, trailing zeros cut); a value quoted only
//! when it needs it (empty, or with a space, `=`, `"` or a control
//! character). Times are UTC. `source` is the file in this repository (the
//! file name alone for a dependency's, whose full path is the build host's)
//! and its line; promslog cuts it to the file name, which would leave a
//! dozen `mod.rs` apart only by line. An event field named like one of the
//! four keys is printed as `logged_<key>`, as promslog does.
//!
//! Neither tracing-logfmt nor tracing-subscriber's JSON format can rename
//! their keys (`ts`, `message`, `timestamp`, `filename`/`line_number`) or
//! print `file:line` as one value, hence this small formatter.

use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::cli::{LogFormat, LogLevel};

pub(crate) fn init(level: LogLevel, format: LogFormat) {
    let level = match level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error => "error",
    };
    // Our own crate at the chosen level; dependencies one notch quieter.
    let filter = EnvFilter::new(format!("warn,pg_storage_exporter={level}"));
    let result = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .event_format(Promslog {
                    json: format == LogFormat::Json,
                })
                .with_writer(std::io::stderr),
        )
        .try_init();
    if let Err(e) = result {
        eprintln!("logging already initialised: {e}");
    }
}

/// The event formatter: promslog's keys, in logfmt or JSON.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Promslog {
    pub(crate) json: bool,
}

impl<S, N> FormatEvent<S, N> for Promslog
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let line = render(self.json, SystemTime::now(), event.metadata(), &fields)?;
        writer.write_str(&line)
    }
}

#[derive(Debug)]
enum Value {
    Str(String),
    I64(i64),
    U64(u64),
    I128(i128),
    U128(u128),
    F64(f64),
    Bool(bool),
}

/// An event's message and other fields, in the order they were given.
#[derive(Debug, Default)]
struct Fields {
    msg: String,
    rest: Vec<(&'static str, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, v: Value) {
        if field.name() == "message" {
            self.msg = match v {
                Value::Str(s) => s,
                other => text(&other),
            };
        } else {
            self.rest.push((field.name(), v));
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%x` fields arrive here too, wrapped so that Debug prints Display.
        self.put(field, Value::Str(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Str(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::I64(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::U64(value));
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        self.put(field, Value::I128(value));
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        self.put(field, Value::U128(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::F64(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::Str(value.to_string()));
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::Str(s) => s.clone(),
        Value::I64(x) => x.to_string(),
        Value::U64(x) => x.to_string(),
        Value::I128(x) => x.to_string(),
        Value::U128(x) => x.to_string(),
        Value::F64(x) => x.to_string(),
        Value::Bool(x) => x.to_string(),
    }
}

const KEYS: [&str; 4] = ["time", "level", "source", "msg"];

fn level_name(l: &Level) -> &'static str {
    match *l {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        // slog has no trace level; the filter never lets one through.
        Level::DEBUG | Level::TRACE => "DEBUG",
    }
}

fn source(meta: &Metadata<'_>) -> String {
    let file = meta.file().unwrap_or("?");
    // Cargo names this crate's files relative to it and a dependency's by
    // its absolute path on the build host: of those, the name is enough.
    let file = if file.starts_with('/') {
        file.rsplit('/').next().unwrap_or(file)
    } else {
        file
    };
    format!("{file}:{}", meta.line().unwrap_or(0))
}

fn render(
    json: bool,
    now: SystemTime,
    meta: &Metadata<'_>,
    f: &Fields,
) -> Result<String, fmt::Error> {
    let mut time = String::new();
    write_time(&mut time, now, json)?;
    // The four keys first, then the event's own: one list, written in
    // either format.
    let head = [
        ("time", Value::Str(time)),
        ("level", Value::Str(level_name(meta.level()).to_string())),
        ("source", Value::Str(source(meta))),
    ];
    let msg = Value::Str(f.msg.clone());
    let fields = head
        .iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(std::iter::once(("msg".to_string(), &msg)))
        .chain(f.rest.iter().map(|(k, v)| {
            let k = if KEYS.contains(k) {
                format!("logged_{k}")
            } else {
                k.to_string()
            };
            (k, v)
        }));
    let mut out = String::with_capacity(160 + 32 * f.rest.len());
    if json {
        out.push('{');
    }
    for (i, (k, v)) in fields.enumerate() {
        if json {
            if i > 0 {
                out.push(',');
            }
            json_str(&mut out, &k);
            out.push(':');
            match v {
                Value::Str(s) => json_str(&mut out, s),
                Value::F64(x) if !x.is_finite() => json_str(&mut out, &x.to_string()),
                other => out.push_str(&text(other)),
            }
        } else {
            if i > 0 {
                out.push(' ');
            }
            logfmt_value(&mut out, &k);
            out.push('=');
            logfmt_value(&mut out, &text(v));
        }
    }
    out.push_str(if json { "}\n" } else { "\n" });
    Ok(out)
}

/// As slog's text handler decides: quoted when empty or when it holds a
/// space, `=`, `"`, a control character or a Unicode space.
fn needs_quoting(s: &str) -> bool {
    s.is_empty()
        || s.chars()
            .any(|c| c == ' ' || c == '=' || c == '"' || c.is_control() || c.is_whitespace())
}

fn logfmt_value(out: &mut String, s: &str) {
    if !needs_quoting(s) {
        out.push_str(s);
        return;
    }
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// RFC 3339 in UTC: milliseconds for logfmt (slog's text handler), up to
/// nanoseconds with trailing zeros cut for JSON (Go's RFC3339Nano).
fn write_time(out: &mut String, t: SystemTime, nanos: bool) -> fmt::Result {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    write!(
        out,
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )?;
    if nanos {
        let ns = d.subsec_nanos();
        if ns != 0 {
            let digits = format!("{ns:09}");
            write!(out, ".{}", digits.trim_end_matches('0'))?;
        }
    } else {
        write!(out, ".{:03}", d.subsec_millis())?;
    }
    out.push('Z');
    Ok(())
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_818), (2026, 12, 31));
        let t = UNIX_EPOCH + Duration::new(1_796_289_482, 120_000_000);
        let mut s = String::new();
        write_time(&mut s, t, false).unwrap();
        assert_eq!(s, "2026-12-03T09:18:02.120Z");
        s.clear();
        write_time(&mut s, t, true).unwrap();
        assert_eq!(s, "2026-12-03T09:18:02.12Z");
        s.clear();
        write_time(&mut s, UNIX_EPOCH + Duration::from_secs(1), true).unwrap();
        assert_eq!(s, "1970-01-01T00:00:01Z");
    }

    #[test]
    fn quoting() {
        let q = |s: &str| {
            let mut o = String::new();
            logfmt_value(&mut o, s);
            o
        };
        assert_eq!(q("listening"), "listening");
        assert_eq!(q("/var/tmp"), "/var/tmp");
        assert_eq!(q(""), "\"\"");
        assert_eq!(q("a b"), "\"a b\"");
        assert_eq!(q("k=v"), "\"k=v\"");
        assert_eq!(q("say \"x\"\n"), "\"say \\\"x\\\"\\n\"");
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn capture(json: bool, f: impl FnOnce()) -> String {
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .event_format(Promslog { json })
                .with_writer(move || w.clone()),
        );
        tracing::subscriber::with_default(sub, f);
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn logfmt_line() {
        let line = capture(false, || {
            tracing::warn!(volume = "wal", n = 3, ok = true, error = %"no space left", source = "x", "probe failed");
        });
        let re_time = line.split(' ').next().unwrap();
        assert!(
            re_time.starts_with("time=20") && re_time.ends_with('Z'),
            "{line}"
        );
        assert_eq!(
            re_time.len(),
            "time=2026-12-03T09:18:02.123Z".len(),
            "{line}"
        );
        let rest = line.split_once(' ').unwrap().1;
        assert!(
            rest.starts_with("level=WARN source=src/logging.rs:"),
            "{line}"
        );
        assert!(
            rest.ends_with(
                " msg=\"probe failed\" volume=wal n=3 ok=true error=\"no space left\" logged_source=x\n"
            ),
            "{line}"
        );
    }

    #[test]
    fn json_line() {
        let line = capture(true, || {
            tracing::info!(
                volume = "wal",
                n = 3,
                ratio = 0.5,
                ok = false,
                msg = "m",
                "listening"
            );
        });
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "INFO", "{line}");
        assert_eq!(v["msg"], "listening", "{line}");
        assert_eq!(v["volume"], "wal", "{line}");
        assert_eq!(v["n"], 3, "{line}");
        assert_eq!(v["ratio"], 0.5, "{line}");
        assert_eq!(v["ok"], false, "{line}");
        assert_eq!(v["logged_msg"], "m", "{line}");
        assert!(
            v["source"].as_str().unwrap().starts_with("src/logging.rs:"),
            "{line}"
        );
        let t = v["time"].as_str().unwrap();
        assert!(
            t.starts_with("20") && t.ends_with('Z') && t.contains('T'),
            "{line}"
        );
        // Keys in promslog's order.
        assert!(line.starts_with("{\"time\":"), "{line}");
        let order: Vec<usize> = ["\"level\"", "\"source\"", "\"msg\"", "\"volume\""]
            .iter()
            .map(|k| line.find(k).unwrap())
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{line}");
    }
}
