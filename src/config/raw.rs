//! The config file exactly as written. Every value is wrapped in `Sp` so
//! that validation errors can point at the line the user has to fix.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::ConfigError;
use crate::types::{EngineChoice, ProbeKind, SyncMethod};
use crate::units::{ByteSize, HumanDuration};

/// A value with its byte span in the file.
pub(crate) type Sp<T> = toml::Spanned<T>;

/// Top level of the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Length of the sliding window for exact quantiles.
    pub(crate) window: Option<Sp<HumanDuration>>,
    /// How long shutdown waits for a probe in flight before abandoning it.
    pub(crate) shutdown_timeout: Option<Sp<HumanDuration>>,
    /// Settings every `[[volume]]` inherits unless it sets its own.
    pub(crate) defaults: Option<RawVolumeDefaults>,
    /// Volumes to probe.
    #[serde(default)]
    pub(crate) volume: Vec<RawVolume>,
    /// PostgreSQL clusters to watch.
    #[serde(default)]
    pub(crate) cluster: Vec<RawCluster>,
    /// How often IO limits and counters are read.
    pub(crate) limits_interval: Option<Sp<HumanDuration>>,
    /// Where cgroup hierarchies are mounted (tests point it at fixtures; an
    /// empty directory turns cgroup reading off).
    pub(crate) cgroup_root: Option<Sp<PathBuf>>,
    /// procfs mount point.
    pub(crate) proc_root: Option<Sp<PathBuf>>,
    /// sysfs mount point.
    pub(crate) sys_root: Option<Sp<PathBuf>>,
    /// Where the host's root filesystem is mounted (the audit reads its
    /// boot-time sysctl configuration there).
    pub(crate) host_root: Option<Sp<PathBuf>>,
    /// How often the storage-configuration audit runs.
    pub(crate) audit_interval: Option<Sp<HumanDuration>>,
    /// `[audit]`: audit codes silenced everywhere (host findings included).
    pub(crate) audit: Option<RawAudit>,
}

/// `audit.ignore = ["code", ...]` at the top, in a volume or a cluster.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAudit {
    #[serde(default)]
    pub(crate) ignore: Vec<Sp<String>>,
}

/// One `[[cluster]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    /// Label value of `cluster` on every series of this cluster.
    pub(crate) name: Sp<String>,
    /// libpq connection string or postgresql:// URL.
    pub(crate) dsn: Sp<String>,
    /// File holding the password (one line), instead of one in the DSN.
    pub(crate) password_file: Option<Sp<PathBuf>>,
    pub(crate) scrape_interval: Option<Sp<HumanDuration>>,
    pub(crate) wait_sampling_interval: Option<Sp<HumanDuration>>,
    pub(crate) statement_timeout: Option<Sp<HumanDuration>>,
    pub(crate) discover_volumes: Option<Sp<bool>>,
    /// Audit codes silenced for this cluster.
    pub(crate) audit: Option<RawAudit>,
}

/// `[defaults]`: the per-volume settings, without identity.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawVolumeDefaults {
    pub(crate) probes: Option<Sp<Vec<ProbeKind>>>,
    pub(crate) interval: Option<Sp<HumanDuration>>,
    pub(crate) timeout: Option<Sp<HumanDuration>>,
    pub(crate) read_file_size: Option<Sp<ByteSize>>,
    pub(crate) sync_method: Option<Sp<SyncMethod>>,
    pub(crate) free_space_reserve: Option<Sp<ByteSize>>,
    pub(crate) engine: Option<Sp<EngineChoice>>,
    pub(crate) cache_served_threshold: Option<Sp<HumanDuration>>,
    pub(crate) sweep_every: Option<Sp<HumanDuration>>,
    pub(crate) sweep_duration: Option<Sp<HumanDuration>>,
    pub(crate) busy_every: Option<Sp<HumanDuration>>,
}

/// One `[[volume]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawVolume {
    /// Label value of `volume` on every series of this volume.
    pub(crate) name: Sp<String>,
    /// Directory on the filesystem to measure.
    pub(crate) path: Sp<PathBuf>,
    /// Where probe files go; default `<path>/pg-storage-exporter-probe`.
    pub(crate) probe_dir: Option<Sp<PathBuf>>,
    pub(crate) probes: Option<Sp<Vec<ProbeKind>>>,
    pub(crate) interval: Option<Sp<HumanDuration>>,
    pub(crate) timeout: Option<Sp<HumanDuration>>,
    pub(crate) read_file_size: Option<Sp<ByteSize>>,
    pub(crate) sync_method: Option<Sp<SyncMethod>>,
    pub(crate) free_space_reserve: Option<Sp<ByteSize>>,
    pub(crate) engine: Option<Sp<EngineChoice>>,
    pub(crate) cache_served_threshold: Option<Sp<HumanDuration>>,
    pub(crate) sweep_every: Option<Sp<HumanDuration>>,
    pub(crate) sweep_duration: Option<Sp<HumanDuration>>,
    pub(crate) busy_every: Option<Sp<HumanDuration>>,
    /// cgroup whose IO limits bind this volume's users, as /proc/<pid>/cgroup
    /// names it ("/system.slice/postgresql@16-main.service"); default: the
    /// PostgreSQL postmaster's for discovered volumes, else the exporter's.
    pub(crate) cgroup: Option<Sp<String>>,
    /// Provisioned (cloud) limits of the volume's disk.
    pub(crate) provisioned_iops: Option<Sp<u64>>,
    pub(crate) provisioned_read_iops: Option<Sp<u64>>,
    pub(crate) provisioned_write_iops: Option<Sp<u64>>,
    pub(crate) provisioned_throughput: Option<Sp<ByteSize>>,
    pub(crate) provisioned_read_throughput: Option<Sp<ByteSize>>,
    pub(crate) provisioned_write_throughput: Option<Sp<ByteSize>>,
    /// Audit codes silenced for this volume.
    pub(crate) audit: Option<RawAudit>,
}

impl RawVolume {
    /// The settings this volume sets itself (a `[defaults]`-shaped view).
    pub(crate) fn settings(&self) -> RawVolumeDefaults {
        RawVolumeDefaults {
            probes: self.probes.clone(),
            interval: self.interval.clone(),
            timeout: self.timeout.clone(),
            read_file_size: self.read_file_size.clone(),
            sync_method: self.sync_method.clone(),
            free_space_reserve: self.free_space_reserve.clone(),
            engine: self.engine.clone(),
            cache_served_threshold: self.cache_served_threshold.clone(),
            sweep_every: self.sweep_every.clone(),
            sweep_duration: self.sweep_duration.clone(),
            busy_every: self.busy_every.clone(),
        }
    }
}

/// Parses the file text. Errors carry the file, line, column and the dotted
/// key path (`volume[0].intervall`) of what was wrong.
///
/// TOML that does not parse, and keys that are unknown or missing, are
/// [`ConfigError::Syntax`]; a value of the wrong type or not allowed (valid
/// TOML, wrong for its key) is [`ConfigError::Value`], which counts as
/// `invalid`.
pub fn parse(file: &Path, text: &str) -> Result<RawConfig, ConfigError> {
    let position =
        |e: &toml::de::Error| e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
    let de = toml::Deserializer::parse(text).map_err(|e| {
        let (line, column) = position(&e);
        ConfigError::Syntax {
            file: file.to_path_buf(),
            line,
            column,
            key: "(syntax)".to_string(),
            message: e.message().to_string(),
        }
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        // Spanned<T> shows up as an internal struct in the path; users wrote
        // only the key.
        let key = e
            .path()
            .to_string()
            .replace(".$__serde_spanned_private_value", "");
        let key = if key == "." {
            "(top level)".to_string()
        } else {
            key
        };
        let (line, column) = position(e.inner());
        let message = e.inner().message();
        if is_key_problem(message) {
            ConfigError::Syntax {
                file: file.to_path_buf(),
                line,
                column,
                key,
                message: message.to_string(),
            }
        } else {
            ConfigError::Value {
                file: file.to_path_buf(),
                line,
                column,
                key,
                message: plain_type_error(message),
            }
        }
    })
}

/// A key that is not known, missing or given twice: the shape of the file
/// is wrong, not a value.
fn is_key_problem(message: &str) -> bool {
    [
        "unknown field",
        "missing field",
        "duplicate field",
        "duplicate key",
    ]
    .iter()
    .any(|p| message.starts_with(p))
}

/// What serde calls the type a key wants, as a user would say it.
fn expected_in_words(expected: &str) -> Option<&'static str> {
    Some(match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" | "i8" | "i16" | "i32" | "i64" | "i128"
        | "isize" => "a whole number (e.g. 3000)",
        "f32" | "f64" => "a number (e.g. 0.5)",
        "a boolean" => "true or false (without quotes)",
        "a string" => "a string in double quotes (e.g. \"main\")",
        "path string" => "a path in double quotes (e.g. \"/var/lib/postgresql\")",
        "a sequence" => "a list in square brackets (e.g. [\"commit\", \"read\"])",
        e if e.starts_with("a duration") => {
            "a duration in double quotes (e.g. \"1s\" or \"500ms\")"
        }
        e if e.starts_with("a size") => "a size (e.g. \"64MiB\") or a whole number of bytes",
        e if e.starts_with("struct ") => "a table",
        _ => return None,
    })
}

/// What serde calls the value found, as a user would say it: `string
/// "3000"` stays, `integer `5`` becomes `5`.
fn found_in_words(found: &str) -> String {
    let literal = |prefix: &str| {
        found
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix('`'))
            .and_then(|r| r.strip_suffix('`'))
            .map(str::to_string)
    };
    if let Some(v) = literal("integer ").or_else(|| literal("floating point ")) {
        return format!("the number {v}");
    }
    if let Some(v) = literal("boolean ") {
        return v;
    }
    if let Some(v) = found.strip_prefix("string ") {
        return format!("the string {v}");
    }
    match found {
        "sequence" => "a list".to_string(),
        "map" => "a table".to_string(),
        other => other.to_string(),
    }
}

/// Rewrites serde's "invalid type: string \"3000\", expected u64" as
/// "expected a whole number (e.g. 3000), found the string \"3000\"", for
/// the types a user meets in this file; other messages are kept.
pub(crate) fn plain_type_error(message: &str) -> String {
    let Some(rest) = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))
    else {
        return message.to_string();
    };
    let Some((found, expected)) = rest.rsplit_once(", expected ") else {
        return message.to_string();
    };
    let Some(words) = expected_in_words(expected) else {
        return message.to_string();
    };
    // A number or boolean written in quotes: say what to change.
    let quoted = found
        .strip_prefix("string \"")
        .and_then(|r| r.strip_suffix('"'));
    let unquote = quoted.is_some_and(|q| {
        (words.starts_with("a whole number") && q.parse::<u64>().is_ok())
            || (words.starts_with("true or false") && (q == "true" || q == "false"))
    });
    let found = found_in_words(found);
    if unquote {
        format!("expected {words}, found {found}: write it without quotes")
    } else {
        format!("expected {words}, found {found}")
    }
}

/// 1-based line of a byte offset.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    line_col(text, offset).0
}

/// 1-based (line, column) of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let col = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
    (line, col)
}
