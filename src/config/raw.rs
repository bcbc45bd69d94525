//! The config file exactly as written. Every value is wrapped in [`Sp`] so
//! that validation errors can point at the line the user has to fix.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ConfigError;
use crate::types::{EngineChoice, ProbeKind, SyncMethod};
use crate::units::{ByteSize, HumanDuration};

/// A value with its byte span in the file.
pub type Sp<T> = toml::Spanned<T>;

/// Top level of the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Length of the sliding window for exact quantiles.
    pub window: Option<Sp<HumanDuration>>,
    /// How long shutdown waits for a probe in flight before abandoning it.
    pub shutdown_timeout: Option<Sp<HumanDuration>>,
    /// Settings every `[[volume]]` inherits unless it sets its own.
    pub defaults: Option<RawVolumeDefaults>,
    /// Volumes to probe.
    #[serde(default)]
    pub volume: Vec<RawVolume>,
    /// PostgreSQL clusters to watch.
    #[serde(default)]
    pub cluster: Vec<RawCluster>,
    /// How often IO limits and counters are read.
    pub limits_interval: Option<Sp<HumanDuration>>,
    /// Where cgroup hierarchies are mounted (tests point it at fixtures; an
    /// empty directory turns cgroup reading off).
    pub cgroup_root: Option<Sp<PathBuf>>,
    /// procfs mount point.
    pub proc_root: Option<Sp<PathBuf>>,
    /// sysfs mount point.
    pub sys_root: Option<Sp<PathBuf>>,
}

/// One `[[cluster]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    /// Label value of `cluster` on every series of this cluster.
    pub name: Sp<String>,
    /// libpq connection string or postgresql:// URL.
    pub dsn: Sp<String>,
    /// File holding the password (one line), instead of one in the DSN.
    pub password_file: Option<Sp<PathBuf>>,
    pub scrape_interval: Option<Sp<HumanDuration>>,
    pub wait_sampling_interval: Option<Sp<HumanDuration>>,
    pub statement_timeout: Option<Sp<HumanDuration>>,
    pub discover_volumes: Option<Sp<bool>>,
}

/// `[defaults]`: the per-volume settings, without identity.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVolumeDefaults {
    pub probes: Option<Sp<Vec<ProbeKind>>>,
    pub interval: Option<Sp<HumanDuration>>,
    pub timeout: Option<Sp<HumanDuration>>,
    pub read_file_size: Option<Sp<ByteSize>>,
    pub sync_method: Option<Sp<SyncMethod>>,
    pub free_space_reserve: Option<Sp<ByteSize>>,
    pub engine: Option<Sp<EngineChoice>>,
    pub cache_served_threshold: Option<Sp<HumanDuration>>,
    pub sweep_every: Option<Sp<HumanDuration>>,
    pub sweep_duration: Option<Sp<HumanDuration>>,
    pub busy_every: Option<Sp<HumanDuration>>,
}

/// One `[[volume]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVolume {
    /// Label value of `volume` on every series of this volume.
    pub name: Sp<String>,
    /// Directory on the filesystem to measure.
    pub path: Sp<PathBuf>,
    /// Where probe files go; default `<path>/pg-storage-exporter-probe`.
    pub probe_dir: Option<Sp<PathBuf>>,
    pub probes: Option<Sp<Vec<ProbeKind>>>,
    pub interval: Option<Sp<HumanDuration>>,
    pub timeout: Option<Sp<HumanDuration>>,
    pub read_file_size: Option<Sp<ByteSize>>,
    pub sync_method: Option<Sp<SyncMethod>>,
    pub free_space_reserve: Option<Sp<ByteSize>>,
    pub engine: Option<Sp<EngineChoice>>,
    pub cache_served_threshold: Option<Sp<HumanDuration>>,
    pub sweep_every: Option<Sp<HumanDuration>>,
    pub sweep_duration: Option<Sp<HumanDuration>>,
    pub busy_every: Option<Sp<HumanDuration>>,
    /// cgroup whose IO limits bind this volume's users, as /proc/<pid>/cgroup
    /// names it ("/system.slice/postgresql@16-main.service"); default: the
    /// PostgreSQL postmaster's for discovered volumes, else the exporter's.
    pub cgroup: Option<Sp<String>>,
    /// Provisioned (cloud) limits of the volume's disk.
    pub provisioned_iops: Option<Sp<u64>>,
    pub provisioned_read_iops: Option<Sp<u64>>,
    pub provisioned_write_iops: Option<Sp<u64>>,
    pub provisioned_throughput: Option<Sp<ByteSize>>,
    pub provisioned_read_throughput: Option<Sp<ByteSize>>,
    pub provisioned_write_throughput: Option<Sp<ByteSize>>,
}

impl RawVolume {
    /// The settings this volume sets itself (a `[defaults]`-shaped view).
    pub fn settings(&self) -> RawVolumeDefaults {
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
pub fn parse(file: &Path, text: &str) -> Result<RawConfig, ConfigError> {
    let syntax = |e: &toml::de::Error, key: String| {
        let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
        ConfigError::Syntax {
            file: file.to_path_buf(),
            line,
            column,
            key,
            message: e.message().to_string(),
        }
    };
    let de = toml::Deserializer::parse(text).map_err(|e| syntax(&e, "(syntax)".to_string()))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        // Spanned<T> shows up as an internal struct in the path; users wrote
        // only the key.
        let key = e
            .path()
            .to_string()
            .replace(".$__serde_spanned_private_value", "");
        syntax(
            e.inner(),
            if key == "." {
                "(top level)".to_string()
            } else {
                key
            },
        )
    })
}

/// 1-based line of a byte offset.
pub fn line_of(text: &str, offset: usize) -> usize {
    line_col(text, offset).0
}

/// 1-based (line, column) of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let col = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
    (line, col)
}
