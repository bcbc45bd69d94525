//! Configuration: what the user wrote (TOML file and flags), validated into
//! typed settings before anything is opened, bound or probed.
//!
//! Two phases, as in ripgrep: [`raw`] mirrors the file exactly (serde with
//! `deny_unknown_fields`, every value spanned so errors can name the line),
//! then [`build`] merges defaults, checks values and the filesystem facts a
//! volume depends on, and returns [`Config`] or one [`ConfigError`].

pub mod raw;
pub mod units;

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

use crate::types::{EngineChoice, SyncMethod};
use raw::{RawConfig, RawVolume, RawVolumeDefaults, Sp};

/// Probe directory created inside a volume path when none is configured.
pub const PROBE_DIR_NAME: &str = "pg-storage-exporter-probe";
/// Where the exporter probes when given no volume at all: /var/tmp is on
/// persistent storage on common distributions (unlike /tmp, often tmpfs),
/// writable by any user, and not cleaned at boot.
pub const DEFAULT_VOLUME_PATH: &str = "/var/tmp";
pub const DEFAULT_VOLUME_NAME: &str = "default";

pub const DEFAULT_WINDOW: Duration = Duration::from_secs(15 * 60);
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// How often a volume runs a burst for the busy figure. With a burst of
/// [`BURST_COMMITS`] commits this adds 0.6 commits per second to the lone
/// probe's one. On the build machine's ext4 a commit probe cost 2.27 device
/// writes (two of its own, and a share of the journal thread's commits), so
/// 1.6 commits per second are 3.6 device writes per second per volume, under
/// the budget of 4; a burst every 30 s measured 4.08.
pub const DEFAULT_BUSY_EVERY: Duration = Duration::from_secs(40);
/// Commit probes in one burst. The first half warms the device path up and
/// is not recorded: on the build machine a burst's commits after a 1 s
/// pause took about 530, 190, 170, 140, 130 µs, and reached the back-to-back
/// figure (±10 %) only after about eight.
pub const BURST_COMMITS: u32 = 24;
/// Read probes in one burst, after its commits. Reads cost no device
/// write, and need longer to converge (about 30 reads on the build machine).
pub const BURST_READS: u32 = 64;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Big enough that random 8 KiB reads rarely hit the same block twice in a
/// window, small enough to write at start on any volume.
pub const DEFAULT_READ_FILE_SIZE: u64 = 64 << 20;
/// A WAL segment is 16 MiB by default; the WAL probe cycles through one.
pub const WAL_FILE_SIZE: u64 = 16 << 20;
/// Never let the probe files push a PostgreSQL volume into its last GiB.
pub const DEFAULT_FREE_SPACE_RESERVE: u64 = 1 << 30;
/// Reads answered faster than this did not reach a device (published figures
/// in docs/storage-facts.md: flash needs tens of µs, a hypervisor cache
/// answered in 668 ns).
pub const DEFAULT_CACHE_SERVED_THRESHOLD: Duration = Duration::from_micros(5);
/// Samples one window may hold per op; bounds memory at ~1.6 MiB per op.
pub const MAX_WINDOW_SAMPLES: u64 = 100_000;
/// The IO size PostgreSQL uses for WAL and heap pages (BLCKSZ).
pub const BLOCK_SIZE: usize = 8192;

/// Validated configuration of the daemon.
#[derive(Debug, Clone)]
pub struct Config {
    pub window: Duration,
    pub shutdown_timeout: Duration,
    pub volumes: Vec<VolumeConfig>,
    pub clusters: Vec<ClusterConfig>,
    /// Settings for volumes discovered at run time.
    pub volume_defaults: VolumeDefaults,
    pub limits: LimitsConfig,
}

/// Where and how often IO limits are read.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitsConfig {
    pub interval: Duration,
    pub cgroup_root: PathBuf,
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
}

pub const DEFAULT_SWEEP_DURATION: Duration = Duration::from_secs(8);
pub const DEFAULT_LIMITS_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_SCRAPE_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_WAIT_SAMPLING_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// A PostgreSQL cluster to watch, with its connection target resolved.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub collector: crate::collectors::postgres::ClusterConfig,
    pub target: crate::collectors::postgres::dsn::Target,
}

/// The `[defaults]` settings, kept for volumes discovered at run time.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeDefaults {
    pub interval: Duration,
    pub timeout: Duration,
    pub read_file_size: u64,
    pub free_space_reserve: u64,
    pub engine: EngineChoice,
    pub cache_served_threshold: Duration,
    pub sweep_every: Duration,
    pub sweep_duration: Duration,
    pub busy_every: Duration,
}

impl VolumeDefaults {
    /// A discovered volume with these settings.
    pub fn volume(
        &self,
        name: String,
        path: PathBuf,
        probe_dir: PathBuf,
        commit_probe: bool,
        read_probe: bool,
        sync_method: SyncMethod,
    ) -> VolumeConfig {
        VolumeConfig {
            name,
            path,
            probe_dir,
            commit_probe,
            read_probe,
            interval: self.interval,
            timeout: self.timeout,
            read_file_size: self.read_file_size,
            sync_method,
            free_space_reserve: self.free_space_reserve,
            engine: self.engine,
            cache_served_threshold: self.cache_served_threshold,
            sweep_every: self.sweep_every,
            sweep_duration: self.sweep_duration,
            busy_every: self.busy_every,
            provisioned: Vec::new(),
            cgroup: None,
        }
    }
}

/// One volume to probe, fully resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeConfig {
    pub name: String,
    /// The directory whose storage is measured.
    pub path: PathBuf,
    /// Where probe files live: on the same filesystem as `path`.
    pub probe_dir: PathBuf,
    pub commit_probe: bool,
    pub read_probe: bool,
    pub interval: Duration,
    pub timeout: Duration,
    pub read_file_size: u64,
    pub sync_method: SyncMethod,
    pub free_space_reserve: u64,
    pub engine: EngineChoice,
    pub cache_served_threshold: Duration,
    /// Queue-depth sweep period; zero = off.
    pub sweep_every: Duration,
    pub sweep_duration: Duration,
    /// How often a burst runs for the busy figure; zero = no bursts (no
    /// busy figure).
    pub busy_every: Duration,
    /// Provisioned (cloud) limits: (resource label, value).
    pub provisioned: Vec<(&'static str, u64)>,
    /// A configured cgroup path whose limits apply (see `RawVolume::cgroup`).
    pub cgroup: Option<String>,
}

/// Where a setting came from, so an error can point at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A config file; `line` is 1-based.
    File { file: PathBuf, line: usize },
    /// A command-line flag.
    Flag(&'static str),
    /// The built-in default.
    Default,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::File { file, line } => write!(f, "{}:{line}", file.display()),
            Origin::Flag(flag) => write!(f, "flag {flag}"),
            Origin::Default => f.write_str("built-in default"),
        }
    }
}

/// Why a configuration was refused. Each variant names what to fix.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}:{column}: {key}: {message}", file.display())]
    Syntax {
        file: PathBuf,
        line: usize,
        column: usize,
        key: String,
        message: String,
    },
    #[error("{origin}: {key}: {message}")]
    Invalid {
        origin: Origin,
        key: String,
        message: String,
    },
}

impl ConfigError {
    /// The `cause` label of `pgstorage_config_reload_errors_total`.
    pub fn cause(&self) -> &'static str {
        match self {
            ConfigError::Read { .. } => "unreadable",
            ConfigError::Syntax { .. } => "syntax",
            ConfigError::Invalid { .. } => "invalid",
        }
    }
}

/// A volume that insists on io_uring on a host that forbids it is a
/// configuration problem, found before anything is started: the message
/// names the volume (or the discovered volumes' defaults).
pub fn engine_problem(cfg: &Config) -> Option<String> {
    let discovered = (!cfg.clusters.is_empty()).then(|| {
        (
            "volumes discovered from PostgreSQL".to_string(),
            cfg.volume_defaults.engine,
        )
    });
    cfg.volumes
        .iter()
        .map(|v| (format!("volume {:?}", v.name), v.engine))
        .chain(discovered)
        .find_map(|(what, engine)| {
            crate::probe::engine::require(engine)
                .err()
                .map(|e| format!("{what} sets engine = \"io_uring\": {e}"))
        })
}

/// Settings given on the command line that shape volumes.
#[derive(Debug, Clone, Default)]
pub struct FlagOverrides {
    /// `--probe.path [NAME=]PATH`, in order.
    pub probe_paths: Vec<String>,
    pub engine: Option<EngineChoice>,
    pub sync_method: Option<SyncMethod>,
    pub interval: Option<Duration>,
    pub busy_every: Option<Duration>,
    pub read_file_size: Option<u64>,
    pub free_space_reserve: Option<u64>,
    /// `--pg.dsn [NAME=]DSN`, in order (DATA_SOURCE_NAME is added by the caller).
    pub pg_dsns: Vec<String>,
    /// `--pg.scrape-interval` for clusters from flags.
    pub pg_scrape_interval: Option<Duration>,
    /// `--no-pg.discover-volumes`.
    pub pg_no_discovery: bool,
}

/// Loads and validates the configuration from an optional file plus flags.
pub fn load(file: Option<&Path>, flags: &FlagOverrides) -> Result<Config, ConfigError> {
    let raw = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                file: path.to_path_buf(),
                source,
            })?;
            Some((path.to_path_buf(), text))
        }
        None => None,
    };
    match raw {
        Some((path, text)) => {
            let parsed = raw::parse(&path, &text)?;
            build(Some((&path, &text)), parsed, flags)
        }
        None => build(None, RawConfig::default(), flags),
    }
}

/// Turns a parsed file and flags into a validated [`Config`].
pub fn build(
    file: Option<(&Path, &str)>,
    raw: RawConfig,
    flags: &FlagOverrides,
) -> Result<Config, ConfigError> {
    let at = |span: Option<std::ops::Range<usize>>| -> Origin {
        match (file, span) {
            (Some((f, text)), Some(s)) => Origin::File {
                file: f.to_path_buf(),
                line: raw::line_of(text, s.start),
            },
            _ => Origin::Default,
        }
    };
    let invalid = |origin: Origin, key: &str, message: String| ConfigError::Invalid {
        origin,
        key: key.to_string(),
        message,
    };

    let window = match &raw.window {
        Some(w) => {
            let d = w.get_ref().0;
            if d < Duration::from_secs(10) || d > Duration::from_secs(24 * 3600) {
                return Err(invalid(
                    at(Some(w.span())),
                    "window",
                    format!("{d:?} is out of range: use 10s to 24h"),
                ));
            }
            d
        }
        None => DEFAULT_WINDOW,
    };
    let shutdown_timeout = match &raw.shutdown_timeout {
        Some(w) => {
            let d = w.get_ref().0;
            if d < Duration::from_millis(100) || d > Duration::from_secs(300) {
                return Err(invalid(
                    at(Some(w.span())),
                    "shutdown_timeout",
                    format!("{d:?} is out of range: use 100ms to 5m"),
                ));
            }
            d
        }
        None => DEFAULT_SHUTDOWN_TIMEOUT,
    };

    let defaults = raw.defaults.unwrap_or_default();
    let env = |k: &str| std::env::var(k).ok();
    let clusters = clusters(&raw.cluster, flags, &at, &env)?;
    let mut volumes = Vec::new();
    for (i, v) in raw.volume.iter().enumerate() {
        volumes.push(volume_from_file(i, v, &defaults, &at)?);
    }
    // One validated "[defaults] + --probe.* flags" for --probe.path volumes
    // and discovered volumes alike, so a bad flag is refused whichever of
    // them it would reach.
    let flagged = flag_settings(&defaults, flags, &at)?;
    for spec in &flags.probe_paths {
        volumes.push(volume_from_flag(spec, &flagged)?);
    }
    // The embedded default volume only when nothing else says what to probe:
    // with clusters, discovery does.
    if volumes.is_empty() && clusters.is_empty() {
        let mut v = volume_from_flag(
            &format!("{DEFAULT_VOLUME_NAME}={DEFAULT_VOLUME_PATH}"),
            &flagged,
        )?;
        v.name = DEFAULT_VOLUME_NAME.to_string();
        volumes.push(v);
    }

    let mut names = HashSet::new();
    let mut probe_dirs = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let origin = raw
            .volume
            .get(i)
            .map(|r| at(Some(r.name.span())))
            .unwrap_or(Origin::Flag("--probe.path"));
        if !names.insert(v.name.clone()) {
            return Err(invalid(
                origin,
                "volume.name",
                format!(
                    "duplicate volume name {:?}: names label every metric and must be unique",
                    v.name
                ),
            ));
        }
        if !probe_dirs.insert(v.probe_dir.clone()) {
            return Err(invalid(
                origin,
                "volume.probe_dir",
                format!(
                    "probe directory {} is used by two volumes; give each its own",
                    v.probe_dir.display()
                ),
            ));
        }
        let samples = window_samples(window, v.interval, v.busy_every);
        if samples > MAX_WINDOW_SAMPLES as f64 {
            return Err(invalid(
                origin,
                "window",
                format!(
                    "a {:?} window at a {:?} interval keeps {samples:.0} samples per op on volume {:?}; \
                     the maximum is {MAX_WINDOW_SAMPLES}: shorten the window or lengthen the interval",
                    window, v.interval, v.name
                ),
            ));
        }
    }

    // Discovered volumes take [defaults], then the --probe.* flags, like
    // --probe.path volumes (their sync method follows the cluster instead).
    let volume_defaults = VolumeDefaults {
        interval: flagged.interval,
        timeout: flagged.timeout,
        read_file_size: flagged.read_file_size,
        free_space_reserve: flagged.free_space_reserve,
        engine: flagged.engine,
        cache_served_threshold: flagged.cache_served_threshold,
        sweep_every: flagged.sweep_every,
        sweep_duration: flagged.sweep_duration,
        busy_every: flagged.busy_every,
    };
    if !clusters.is_empty() {
        let samples = window_samples(window, volume_defaults.interval, volume_defaults.busy_every);
        if samples > MAX_WINDOW_SAMPLES as f64 {
            return Err(invalid(
                at(raw.window.as_ref().map(|w| w.span())),
                "window",
                format!(
                    "a {window:?} window at the discovered volumes' {:?} interval keeps {samples:.0} samples per op; \
                     the maximum is {MAX_WINDOW_SAMPLES}: shorten the window or lengthen the interval",
                    volume_defaults.interval
                ),
            ));
        }
    }
    let limits = LimitsConfig {
        interval: match &raw.limits_interval {
            Some(x) => {
                let d = x.get_ref().0;
                if d < Duration::from_millis(200) || d > Duration::from_secs(600) {
                    return Err(invalid(
                        at(Some(x.span())),
                        "limits_interval",
                        format!("{d:?} is out of range: use 200ms to 10m"),
                    ));
                }
                d
            }
            None => DEFAULT_LIMITS_INTERVAL,
        },
        cgroup_root: raw
            .cgroup_root
            .as_ref()
            .map(|p| absolute(p.get_ref()))
            .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup")),
        proc_root: raw
            .proc_root
            .as_ref()
            .map(|p| absolute(p.get_ref()))
            .unwrap_or_else(|| PathBuf::from("/proc")),
        sys_root: raw
            .sys_root
            .as_ref()
            .map(|p| absolute(p.get_ref()))
            .unwrap_or_else(|| PathBuf::from("/sys")),
    };
    Ok(Config {
        window,
        shutdown_timeout,
        volumes,
        clusters,
        volume_defaults,
        limits,
    })
}

/// Cluster names label every PostgreSQL series and prefix discovered
/// volume names (`<cluster>/wal`): same rules as volume names, minus `/`.
pub fn validate_cluster_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 48 {
        return Err(format!(
            "invalid cluster name {name:?}: use 1 to 48 characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "invalid cluster name {name:?}: character {c:?} not allowed (use letters, digits, _ - .)"
        ));
    }
    Ok(())
}

fn clusters(
    raw: &[raw::RawCluster],
    flags: &FlagOverrides,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
    env: crate::collectors::postgres::dsn::Env<'_>,
) -> Result<Vec<ClusterConfig>, ConfigError> {
    use crate::collectors::postgres::{ClusterConfig as Collector, dsn};
    let mut out: Vec<ClusterConfig> = Vec::new();
    for (i, c) in raw.iter().enumerate() {
        let key = |k: &str| format!("cluster[{i}].{k}");
        let invalid =
            |span: std::ops::Range<usize>, k: &str, message: String| ConfigError::Invalid {
                origin: at(Some(span)),
                key: key(k),
                message,
            };
        let name = c.name.get_ref().clone();
        validate_cluster_name(&name).map_err(|m| invalid(c.name.span(), "name", m))?;
        let password_file = c.password_file.as_ref().map(|p| absolute(p.get_ref()));
        let target = dsn::target(c.dsn.get_ref(), env, password_file.as_deref())
            .map_err(|e| invalid(c.dsn.span(), "dsn", e.to_string()))?;
        let dur =
            |v: &Option<Sp<units::HumanDuration>>, k: &str, default: Duration, min: Duration| {
                match v {
                    Some(x) => {
                        let d = x.get_ref().0;
                        if d < min || d > Duration::from_secs(3600) {
                            Err(invalid(
                                x.span(),
                                k,
                                format!("{d:?} is out of range: use {min:?} to 1h"),
                            ))
                        } else {
                            Ok(d)
                        }
                    }
                    None => Ok(default),
                }
            };
        out.push(ClusterConfig {
            collector: Collector {
                name,
                dsn: c.dsn.get_ref().clone(),
                password_file,
                scrape_interval: dur(
                    &c.scrape_interval,
                    "scrape_interval",
                    DEFAULT_SCRAPE_INTERVAL,
                    Duration::from_millis(100),
                )?,
                wait_sampling_interval: dur(
                    &c.wait_sampling_interval,
                    "wait_sampling_interval",
                    DEFAULT_WAIT_SAMPLING_INTERVAL,
                    Duration::from_millis(100),
                )?,
                statement_timeout: dur(
                    &c.statement_timeout,
                    "statement_timeout",
                    DEFAULT_STATEMENT_TIMEOUT,
                    Duration::from_millis(100),
                )?,
                discover_volumes: c
                    .discover_volumes
                    .as_ref()
                    .map(|b| *b.get_ref())
                    .unwrap_or(true),
            },
            target,
        });
    }
    if let Some(i) = flags.pg_scrape_interval
        && (i < Duration::from_millis(100) || i > Duration::from_secs(3600))
    {
        return Err(ConfigError::Invalid {
            origin: Origin::Flag("--pg.scrape-interval"),
            key: format!("{i:?}"),
            message: "out of range: use 100ms to 1h".to_string(),
        });
    }
    for spec in &flags.pg_dsns {
        let (name, text) = dsn::split_name(spec);
        let flag_err = |message: String| ConfigError::Invalid {
            origin: Origin::Flag("--pg.dsn"),
            key: name
                .map(str::to_string)
                .unwrap_or_else(|| "DSN".to_string()),
            message,
        };
        let target = dsn::target(text, env, None).map_err(|e| flag_err(e.to_string()))?;
        let name = name
            .map(str::to_string)
            .unwrap_or_else(|| format!("pg{}", target.port));
        validate_cluster_name(&name).map_err(flag_err)?;
        out.push(ClusterConfig {
            collector: Collector {
                name,
                dsn: text.to_string(),
                password_file: None,
                scrape_interval: flags.pg_scrape_interval.unwrap_or(DEFAULT_SCRAPE_INTERVAL),
                wait_sampling_interval: DEFAULT_WAIT_SAMPLING_INTERVAL,
                statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
                discover_volumes: !flags.pg_no_discovery,
            },
            target,
        });
    }
    let mut seen = HashSet::new();
    for c in &out {
        if !seen.insert(c.collector.name.clone()) {
            return Err(ConfigError::Invalid {
                origin: Origin::Default,
                key: "cluster.name".into(),
                message: format!(
                    "duplicate cluster name {:?}: name each cluster (NAME=DSN on the command line)",
                    c.collector.name
                ),
            });
        }
    }
    Ok(out)
}

/// Settings a volume takes from `[defaults]` unless it sets its own.
#[derive(Debug, Clone)]
struct Settings {
    commit_probe: bool,
    read_probe: bool,
    interval: Duration,
    timeout: Duration,
    read_file_size: u64,
    sync_method: SyncMethod,
    free_space_reserve: u64,
    engine: EngineChoice,
    cache_served_threshold: Duration,
    sweep_every: Duration,
    sweep_duration: Duration,
    busy_every: Duration,
}

fn volume_from_file(
    i: usize,
    v: &RawVolume,
    d: &RawVolumeDefaults,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
) -> Result<VolumeConfig, ConfigError> {
    let key = |k: &str| format!("volume[{i}].{k}");
    let name = v.name.get_ref().clone();
    validate_name(&name).map_err(|message| ConfigError::Invalid {
        origin: at(Some(v.name.span())),
        key: key("name"),
        message,
    })?;
    let s = settings(
        &|field, from_volume, span, message| ConfigError::Invalid {
            origin: at(span),
            key: if from_volume {
                key(field)
            } else {
                format!("defaults.{field}")
            },
            message,
        },
        &v.settings(),
        d,
    )?;
    let path_origin = at(Some(v.path.span()));
    let path = resolve_dir(v.path.get_ref()).map_err(|message| ConfigError::Invalid {
        origin: path_origin.clone(),
        key: key("path"),
        message,
    })?;
    let (probe_dir, pd_origin, pd_key) = match &v.probe_dir {
        Some(pd) => (
            absolute(pd.get_ref()),
            at(Some(pd.span())),
            key("probe_dir"),
        ),
        None => (path.join(PROBE_DIR_NAME), path_origin, key("path")),
    };
    check_probe_dir(&path, &probe_dir).map_err(|message| ConfigError::Invalid {
        origin: pd_origin,
        key: pd_key,
        message,
    })?;
    let mut vc = finish(name, path, probe_dir, s);
    vc.provisioned = [
        ("iops", v.provisioned_iops.as_ref().map(|x| *x.get_ref())),
        (
            "read_iops",
            v.provisioned_read_iops.as_ref().map(|x| *x.get_ref()),
        ),
        (
            "write_iops",
            v.provisioned_write_iops.as_ref().map(|x| *x.get_ref()),
        ),
        (
            "bytes_per_second",
            v.provisioned_throughput.as_ref().map(|x| x.get_ref().0),
        ),
        (
            "read_bytes_per_second",
            v.provisioned_read_throughput
                .as_ref()
                .map(|x| x.get_ref().0),
        ),
        (
            "write_bytes_per_second",
            v.provisioned_write_throughput
                .as_ref()
                .map(|x| x.get_ref().0),
        ),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.filter(|&x| x > 0).map(|x| (k, x)))
    .collect();
    if let Some(cg) = &v.cgroup {
        if !cg.get_ref().starts_with('/') {
            return Err(ConfigError::Invalid {
                origin: at(Some(cg.span())),
                key: key("cgroup"),
                message: format!(
                    "{:?} is not a cgroup path: write it as /proc/<pid>/cgroup shows it, starting with /",
                    cg.get_ref()
                ),
            });
        }
        vc.cgroup = Some(cg.get_ref().clone());
    }
    Ok(vc)
}

/// Reports a bad setting: field name, whether the volume (not `[defaults]`)
/// set it, where, and why.
type SettingError<'a> =
    dyn Fn(&str, bool, Option<std::ops::Range<usize>>, String) -> ConfigError + 'a;

fn settings(
    err: &SettingError<'_>,
    v: &RawVolumeDefaults,
    d: &RawVolumeDefaults,
) -> Result<Settings, ConfigError> {
    // Pick the volume's value, else the default's, keeping the span of
    // whichever was written so errors point at the right line.
    fn pick<'a, T>(a: &'a Option<Sp<T>>, b: &'a Option<Sp<T>>) -> Option<(&'a Sp<T>, bool)> {
        match (a, b) {
            (Some(x), _) => Some((x, true)),
            (None, Some(x)) => Some((x, false)),
            (None, None) => None,
        }
    }
    let probes = pick(&v.probes, &d.probes);
    let (commit_probe, read_probe) = match probes {
        Some((p, vol)) => {
            let list = p.get_ref();
            if list.is_empty() {
                return Err(err(
                    "probes",
                    vol,
                    Some(p.span()),
                    "empty list: give at least one of \"commit\", \"read\"".to_string(),
                ));
            }
            (
                list.contains(&crate::types::ProbeKind::Commit),
                list.contains(&crate::types::ProbeKind::Read),
            )
        }
        None => (true, true),
    };
    let interval = match pick(&v.interval, &d.interval) {
        Some((x, vol)) => {
            let i = x.get_ref().0;
            if i < Duration::from_millis(1) || i > Duration::from_secs(3600) {
                return Err(err(
                    "interval",
                    vol,
                    Some(x.span()),
                    format!("{i:?} is out of range: use 1ms to 1h"),
                ));
            }
            i
        }
        None => DEFAULT_INTERVAL,
    };
    let timeout = match pick(&v.timeout, &d.timeout) {
        Some((x, vol)) => {
            let t = x.get_ref().0;
            if t < Duration::from_millis(10) {
                return Err(err(
                    "timeout",
                    vol,
                    Some(x.span()),
                    format!("{t:?} is too short: a healthy network volume can take 10 ms"),
                ));
            }
            t
        }
        None => DEFAULT_TIMEOUT,
    };
    let read_file_size = match pick(&v.read_file_size, &d.read_file_size) {
        Some((x, vol)) => {
            let b = x.get_ref().0;
            validate_read_file_size(b)
                .map_err(|m| err("read_file_size", vol, Some(x.span()), m))?;
            b
        }
        None => DEFAULT_READ_FILE_SIZE,
    };
    let sync_method = pick(&v.sync_method, &d.sync_method)
        .map(|(x, _)| *x.get_ref())
        .unwrap_or_default();
    let free_space_reserve = pick(&v.free_space_reserve, &d.free_space_reserve)
        .map(|(x, _)| x.get_ref().0)
        .unwrap_or(DEFAULT_FREE_SPACE_RESERVE);
    let engine = pick(&v.engine, &d.engine)
        .map(|(x, _)| *x.get_ref())
        .unwrap_or_default();
    let cache_served_threshold = match pick(&v.cache_served_threshold, &d.cache_served_threshold) {
        Some((x, vol)) => {
            let t = x.get_ref().0;
            if t > Duration::from_millis(1) {
                return Err(err(
                    "cache_served_threshold",
                    vol,
                    Some(x.span()),
                    format!(
                        "{t:?} is too long: devices answer 8 KiB reads in tens of µs; use at most 1ms"
                    ),
                ));
            }
            t
        }
        None => DEFAULT_CACHE_SERVED_THRESHOLD,
    };
    let sweep_every = match pick(&v.sweep_every, &d.sweep_every) {
        Some((x, vol)) => {
            let t = x.get_ref().0;
            if !t.is_zero() && t < Duration::from_secs(60) {
                return Err(err(
                    "sweep_every",
                    vol,
                    Some(x.span()),
                    format!(
                        "{t:?} is too often: a sweep loads the device; use 0s (off) or at least 1m"
                    ),
                ));
            }
            t
        }
        None => Duration::ZERO,
    };
    let sweep_duration = match pick(&v.sweep_duration, &d.sweep_duration) {
        Some((x, vol)) => {
            let t = x.get_ref().0;
            if t < Duration::from_secs(1) || t > Duration::from_secs(300) {
                return Err(err(
                    "sweep_duration",
                    vol,
                    Some(x.span()),
                    format!("{t:?} is out of range: use 1s to 5m"),
                ));
            }
            t
        }
        None => DEFAULT_SWEEP_DURATION,
    };
    let busy_every = match pick(&v.busy_every, &d.busy_every) {
        Some((x, vol)) => {
            let t = x.get_ref().0;
            validate_busy_every(t).map_err(|m| err("busy_every", vol, Some(x.span()), m))?;
            t
        }
        None => DEFAULT_BUSY_EVERY,
    };
    Ok(Settings {
        commit_probe,
        read_probe,
        interval,
        timeout,
        read_file_size,
        sync_method,
        free_space_reserve,
        engine,
        cache_served_threshold,
        sweep_every,
        sweep_duration,
        busy_every,
    })
}

fn finish(name: String, path: PathBuf, probe_dir: PathBuf, s: Settings) -> VolumeConfig {
    VolumeConfig {
        name,
        path,
        probe_dir,
        commit_probe: s.commit_probe,
        read_probe: s.read_probe,
        interval: s.interval,
        timeout: s.timeout,
        read_file_size: s.read_file_size,
        sync_method: s.sync_method,
        free_space_reserve: s.free_space_reserve,
        engine: s.engine,
        cache_served_threshold: s.cache_served_threshold,
        sweep_every: s.sweep_every,
        sweep_duration: s.sweep_duration,
        busy_every: s.busy_every,
        provisioned: Vec::new(),
        cgroup: None,
    }
}

/// `[defaults]` with the `--probe.*` flags on top, each flag checked.
fn flag_settings(
    d: &RawVolumeDefaults,
    flags: &FlagOverrides,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
) -> Result<Settings, ConfigError> {
    let empty = RawVolumeDefaults::default();
    let mut s = settings(
        &|field, _vol, span, message| ConfigError::Invalid {
            origin: at(span),
            key: format!("defaults.{field}"),
            message,
        },
        &empty,
        d,
    )?;
    if let Some(e) = flags.engine {
        s.engine = e;
    }
    if let Some(m) = flags.sync_method {
        s.sync_method = m;
    }
    if let Some(i) = flags.interval {
        if i < Duration::from_millis(1) || i > Duration::from_secs(3600) {
            return Err(ConfigError::Invalid {
                origin: Origin::Flag("--probe.interval"),
                key: format!("{i:?}"),
                message: "out of range: use 1ms to 1h".to_string(),
            });
        }
        s.interval = i;
    }
    if let Some(t) = flags.busy_every {
        validate_busy_every(t).map_err(|message| ConfigError::Invalid {
            origin: Origin::Flag("--probe.busy-every"),
            key: format!("{t:?}"),
            message,
        })?;
        s.busy_every = t;
    }
    if let Some(b) = flags.read_file_size {
        validate_read_file_size(b).map_err(|message| ConfigError::Invalid {
            origin: Origin::Flag("--probe.read-file-size"),
            key: b.to_string(),
            message,
        })?;
        s.read_file_size = b;
    }
    if let Some(b) = flags.free_space_reserve {
        s.free_space_reserve = b;
    }
    Ok(s)
}

fn volume_from_flag(spec: &str, s: &Settings) -> Result<VolumeConfig, ConfigError> {
    const FLAG: &str = "--probe.path";
    let flag_err = |message: String| ConfigError::Invalid {
        origin: Origin::Flag(FLAG),
        key: spec.to_string(),
        message,
    };
    let (name, path) = split_name(spec);
    let path = resolve_dir(Path::new(path)).map_err(&flag_err)?;
    let name = match name {
        Some(n) => n.to_string(),
        None => default_name(&path),
    };
    validate_name(&name).map_err(|m| flag_err(format!("{m} (write NAME=PATH to choose one)")))?;
    let probe_dir = path.join(PROBE_DIR_NAME);
    check_probe_dir(&path, &probe_dir).map_err(flag_err)?;
    Ok(finish(name, path, probe_dir, s.clone()))
}

/// Splits `NAME=PATH`. A prefix counts as a name only when it contains no
/// `/`, so a path that happens to contain `=` still works.
pub fn split_name(spec: &str) -> (Option<&str>, &str) {
    match spec.split_once('=') {
        Some((n, p)) if !n.is_empty() && !n.contains('/') => (Some(n), p),
        _ => (None, spec),
    }
}

/// A volume named after its directory: `/srv/pgwal` → `pgwal`.
fn default_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".to_string())
}

/// Volume names become label values in every series: keep them short and
/// free of characters that need escaping in PromQL.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!(
            "invalid volume name {name:?}: use 1 to 64 characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')))
    {
        return Err(format!(
            "invalid volume name {name:?}: character {c:?} not allowed (use letters, digits, _ - . /)"
        ));
    }
    Ok(())
}

fn validate_read_file_size(b: u64) -> Result<(), String> {
    if !((1 << 20)..=(1 << 40)).contains(&b) {
        return Err(format!(
            "{} is out of range: use 1MiB to 1TiB",
            units::fmt_bytes(b)
        ));
    }
    if b % BLOCK_SIZE as u64 != 0 {
        return Err(format!(
            "{b} bytes is not a multiple of 8KiB, the read size"
        ));
    }
    Ok(())
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|c| c.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

/// Resolves a volume path to an existing directory (symlinks followed: a
/// `pg_wal` symlink to another disk must be measured where it points).
fn resolve_dir(p: &Path) -> Result<PathBuf, String> {
    let canonical = std::fs::canonicalize(p).map_err(|e| format!("path {}: {e}", p.display()))?;
    let meta =
        std::fs::metadata(&canonical).map_err(|e| format!("path {}: {e}", canonical.display()))?;
    if !meta.is_dir() {
        return Err(format!("path {} is not a directory", canonical.display()));
    }
    Ok(canonical)
}

/// Refuses probe directories that PostgreSQL owns or that would measure a
/// different filesystem than the volume.
pub fn check_probe_dir(volume: &Path, probe_dir: &Path) -> Result<(), String> {
    if let Some(owner) = postgres_owned_ancestor(probe_dir) {
        return Err(format!(
            "probe directory {} would be inside PostgreSQL's {}: the exporter never writes there. \
             Set probe_dir to a directory beside it on the same filesystem",
            probe_dir.display(),
            owner.display()
        ));
    }
    // The probe directory itself may not exist yet: compare its parent.
    let existing = if probe_dir.exists() {
        probe_dir.to_path_buf()
    } else {
        match probe_dir.parent() {
            Some(p) => p.to_path_buf(),
            None => {
                return Err(format!(
                    "probe directory {} has no parent",
                    probe_dir.display()
                ));
            }
        }
    };
    let pd = std::fs::metadata(&existing)
        .map_err(|e| format!("probe directory parent {}: {e}", existing.display()))?;
    let vol = std::fs::metadata(volume).map_err(|e| format!("path {}: {e}", volume.display()))?;
    if pd.dev() != vol.dev() {
        return Err(format!(
            "probe directory {} is on a different filesystem than {}: it would measure the wrong device",
            probe_dir.display(),
            volume.display()
        ));
    }
    Ok(())
}

/// The PostgreSQL-owned directory that contains `p`, if any:
/// - a data directory: `PG_VERSION` next to `global/`;
/// - a WAL directory: named `pg_wal` (`pg_xlog` before 10), or holding
///   `archive_status/`, which PostgreSQL creates in every WAL directory,
///   so a `pg_wal` symlinked elsewhere (`initdb --waldir`) is caught by
///   content whatever its name;
/// - a tablespace location: holding a `PG_<major>_<catversion>` directory.
pub fn postgres_owned_ancestor(p: &Path) -> Option<PathBuf> {
    let mut cur = PathBuf::new();
    for comp in p.components() {
        cur.push(comp);
        if let Component::Normal(n) = comp
            && (n == "pg_wal" || n == "pg_xlog")
        {
            return Some(cur);
        }
        if matches!(comp, Component::RootDir) {
            continue;
        }
        if cur.join("PG_VERSION").is_file() && cur.join("global").is_dir() {
            return Some(cur);
        }
        if cur.join("archive_status").is_dir() {
            return Some(cur);
        }
        if is_tablespace_location(&cur) {
            return Some(cur);
        }
    }
    None
}

fn is_tablespace_location(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.filter_map(Result::ok).any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let mut parts = name.splitn(3, '_');
        parts.next() == Some("PG")
            && parts
                .next()
                .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
            && parts
                .next()
                .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
            && e.file_type().is_ok_and(|t| t.is_dir())
    })
}

#[cfg(test)]
mod tests;

/// `busy_every`: zero turns bursts off; otherwise often enough to fill the
/// window, rarely enough that bursts stay a small part of the probe IO.
fn validate_busy_every(t: Duration) -> Result<(), String> {
    if !t.is_zero() && (t < Duration::from_secs(5) || t > Duration::from_secs(3600)) {
        return Err(format!(
            "{t:?} is out of range: use 0s (no bursts, no busy figure) or 5s to 1h"
        ));
    }
    Ok(())
}

/// The most samples one (op, phase) window holds: the lone probes' or, for
/// the busy phase, the recorded half of each burst's reads.
fn window_samples(window: Duration, interval: Duration, busy_every: Duration) -> f64 {
    let w = window.as_secs_f64();
    let lone = w / interval.as_secs_f64().max(1e-9);
    let busy = if busy_every.is_zero() {
        0.0
    } else {
        w / busy_every.as_secs_f64() * f64::from(BURST_READS / 2)
    };
    lone.max(busy)
}
